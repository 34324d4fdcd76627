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
import os
import sys
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
            obj: Any = _import_here_too(module)
            for part in attr.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as e:
            top = module.split(".")[0]
            raise ConfigError(
                f"cannot import {_SINGULAR[kind]} {name!r}: {e}. leanrl imports "
                f"'package.module:Class' from the installed packages and from the current folder "
                f"({os.getcwd()}): run it from the folder that holds {top}/ (or {top}.py), add "
                "that folder to PYTHONPATH, or `pip install -e` your package."
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


def _import_here_too(module: str) -> Any:
    """``import_module(module)``, also finding a package that sits in the current folder, as
    ``python -m`` would: the ``leanrl`` console script's ``sys.path`` starts at its own bin
    folder, not at the folder it runs in (docs/custom-environments.md's walkthrough). The
    current folder goes to the end of ``sys.path``, and only when the package is found nowhere
    else, so a folder there never shadows an installed package (a ``vllm`` source checkout, a
    ``datasets`` folder) that leanrl imports later."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        top = module.split(".")[0]
        here = os.getcwd()
        local = os.path.isdir(os.path.join(here, top)) or os.path.isfile(
            os.path.join(here, top + ".py")
        )
        if e.name != top or not local or here in sys.path or "" in sys.path:
            raise
        sys.path.append(here)
        return importlib.import_module(module)


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
