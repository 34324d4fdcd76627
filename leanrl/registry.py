"""Finding environments, harnesses and runtimes: entry points, or an import name.

One mechanism: Python entry points. A package (leanrl itself included) registers its classes in
its ``pyproject.toml``::

    [project.entry-points."leanrl.environments"]
    my-env = "my_package:MyEnvironment"

Once installed, ``load_environment("my-env")`` and ``leanrl envs`` find it. Anything can also be
named directly by import path, ``"my_package.module:MyEnvironment"``, without registering.
"""

from __future__ import annotations

import importlib
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Literal

from leanrl.errors import ConfigError

__all__ = ["GROUPS", "Kind", "available", "describe", "resolve"]

Kind = Literal["environments", "harnesses", "runtimes"]
GROUPS: dict[Kind, str] = {
    "environments": "leanrl.environments",
    "harnesses": "leanrl.harnesses",
    "runtimes": "leanrl.runtimes",
}
_SINGULAR = {"environments": "environment", "harnesses": "harness", "runtimes": "runtime"}
_HOW = {
    "environments": "--env",
    "harnesses": "--env.harness.name",
    "runtimes": "--env.runtime.name",
}


def available(kind: Kind) -> dict[str, EntryPoint]:
    """Every registered entry of ``kind``, by id (built-in and third-party)."""
    return {ep.name: ep for ep in sorted(entry_points(group=GROUPS[kind]), key=lambda e: e.name)}


def resolve(kind: Kind, name: str) -> Any:
    """The class registered as ``name``, or the object at import path ``module:attr``."""
    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            obj: Any = importlib.import_module(module)
            for part in attr.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as e:
            raise ConfigError(
                f"cannot import {_SINGULAR[kind]} {name!r}: {e}. Use 'package.module:Class' "
                "with the package installed in this Python."
            ) from e
        return obj
    found = available(kind)
    if name not in found:
        from leanrl._cli_help import suggest
        from leanrl._dist import foreign_distribution

        known = ", ".join(found) or "(none installed)"
        close = suggest(name, found)
        problem = foreign_distribution()
        raise ConfigError(
            f"unknown {_SINGULAR[kind]} {name!r}"
            + (f" (did you mean {close!r}?)" if close else "")
            + f". Known: {known}. Install the package that provides it, or pass an import path "
            f"'package.module:Class' to {_HOW[kind]}." + (f" Note: {problem}" if problem else "")
        )
    try:
        return found[name].load()
    except Exception as e:
        raise ConfigError(
            f"{_SINGULAR[kind]} {name!r} is registered by {found[name].value!r} but failed to "
            f"import: {type(e).__name__}: {e}"
        ) from e


def describe(kind: Kind) -> list[tuple[str, str, str]]:
    """(id, one-line description, where it comes from) for every registered entry."""
    rows = []
    for name, ep in available(kind).items():
        dist = ep.dist.name if ep.dist is not None else "?"
        try:
            obj = ep.load()
            doc = getattr(obj, "description", "") or (obj.__doc__ or "").strip().split("\n")[0]
        except Exception as e:  # noqa: BLE001 - a broken plugin must not hide the others
            doc = f"(failed to import: {type(e).__name__}: {e})"
        rows.append((name, doc, dist))
    return rows
