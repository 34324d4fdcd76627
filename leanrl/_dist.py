"""Which installed distribution is this leanrl, and how to install a part of it.

The name ``leanrl`` on PyPI belongs to an unrelated package (an XBRL tool that also imports as
``leanrl``), so ``pip install leanrl`` does not install this project. This project is installed
from its repository or a wheel built from it. Two things follow:

- :func:`foreign_distribution` tells when the installed distribution named ``leanrl`` is not this
  project (or when this code runs from a source tree that was never installed), so that
  ``import leanrl``, ``leanrl --version`` and "unknown environment" errors can say so;
- :func:`install_hint` spells the command that adds an extra (``leanrl[serve]``) from wherever
  this leanrl was installed from (pip records it in ``direct_url.json``), and :func:`require`
  imports an optional dependency or raises an error with that command.
"""

from __future__ import annotations

import importlib
import json
from functools import lru_cache
from importlib.metadata import Distribution, distributions
from types import ModuleType
from urllib.parse import unquote, urlparse

from leanrl.errors import ConfigError

__all__ = ["INSTALL_FROM_REPO", "foreign_distribution", "install_hint", "require"]

INSTALL_FROM_REPO = (
    "install leanrl from its git repository, not from PyPI (the PyPI package named `leanrl` is "
    'an unrelated project): `pip install "leanrl @ git+REPO_URL"` (REPO_URL: the address of the '
    "leanrl repository), or `pip install .` in a clone of it"
)


def _ours(dist: Distribution) -> bool:
    """This project registers its built-in runtimes; the unrelated package does not."""
    return any(ep.group == "leanrl.runtimes" and ep.name == "local" for ep in dist.entry_points)


@lru_cache(maxsize=1)
def foreign_distribution() -> str | None:
    """Why the installed ``leanrl`` distribution is not this project, or None when it is."""
    # The first distribution of that name on the path is the one Python reports as installed.
    found = list(distributions(name="leanrl"))
    if found and _ours(found[0]):
        return None
    if not found:
        return (
            "this leanrl runs from a source tree that was never installed, so its built-in "
            "environments, harnesses and runtimes are not registered. Run `pip install -e .` in "
            "the repository."
        )
    dist = found[0]
    summary = dist.metadata["Summary"] or "no description"
    return (
        f"the installed Python distribution named 'leanrl' (version {dist.version}: {summary!r}) "
        "is not this project. Run `pip uninstall leanrl`, then " + INSTALL_FROM_REPO + "."
    )


def _direct_url() -> dict[str, object] | None:
    """Where pip installed leanrl from (PEP 610's ``direct_url.json``), if it recorded it."""
    for dist in distributions(name="leanrl"):
        text = dist.read_text("direct_url.json") if _ours(dist) else None
        try:
            data = json.loads(text) if text else None
        except ValueError:
            continue
        if isinstance(data, dict):
            return data
    return None


def install_hint(extra: str) -> str:
    """The command that installs leanrl with ``extra`` from where this leanrl came from."""
    info = _direct_url()
    url = str(info.get("url", "")) if info else ""
    if info and url.startswith("file://"):
        path = unquote(urlparse(url).path)
        dir_info = info.get("dir_info")
        editable = isinstance(dir_info, dict) and bool(dir_info.get("editable"))
        if editable:
            return f'pip install -e "{path}[{extra}]"'
        return f'pip install "leanrl[{extra}] @ {url}"'
    if info and "vcs_info" in info:
        vcs = info["vcs_info"]
        commit = vcs.get("commit_id") if isinstance(vcs, dict) else None
        at = f"@{commit}" if commit else ""
        return f'pip install "leanrl[{extra}] @ git+{url}{at}"'
    return (
        f'pip install "leanrl[{extra}] @ git+REPO_URL" (REPO_URL: the address of the leanrl '
        f'repository), or `pip install ".[{extra}]"` in a clone of it; not from PyPI, where '
        "`leanrl` is an unrelated project"
    )


def require(module: str, extra: str, purpose: str) -> ModuleType:
    """Import ``module`` (an optional dependency, in the ``extra`` extra) or raise a
    :class:`~leanrl.ConfigError` whose one line says what needs it and the install command."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(
            f"{purpose} needs {module!r}, which comes with the `{extra}` extra: "
            f"{install_hint(extra)}"
        ) from e
