"""The exception tree. Every error leanrl raises on purpose derives from :class:`LeanrlError`.

A bad *proof* is never an exception (it is a :class:`~leanrl.Verdict`); these are for bad input,
bad configuration and missing infrastructure, and each message says how to fix the problem.

::

    LeanrlError
    ├── ConfigError          bad config values, unknown ids, files that do not exist
    ├── DiskFullError        a write failed because the disk (or quota) is full
    ├── DatasetError         a taskset could not be loaded, or a row is malformed
    ├── LeanNotFoundError    no Lean toolchain / project / REPL where one is needed
    ├── PolicyError          the model could not be loaded or did not answer
    └── RuntimeUnavailable   a runtime could not start (Docker, Modal, service unreachable)
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "ConfigError",
    "DatasetError",
    "DiskFullError",
    "LeanNotFoundError",
    "LeanrlError",
    "PolicyError",
    "RuntimeUnavailable",
    "disk_errors",
]


class LeanrlError(Exception):
    """Base class of every error leanrl raises on purpose."""


class ConfigError(LeanrlError, ValueError):
    """A configuration value, id or path is wrong. The message says which and how to fix it."""


class DatasetError(LeanrlError, ValueError):
    """A taskset could not be loaded, or one of its rows is malformed (file, row and field)."""


class LeanNotFoundError(LeanrlError, FileNotFoundError):
    """Lean, lake, the REPL or a Lean project is missing where one is needed."""


class PolicyError(LeanrlError, RuntimeError):
    """The model could not be loaded, or its server did not answer."""


class RuntimeUnavailable(LeanrlError, RuntimeError):
    """A runtime could not start or lost its backend (Docker, Modal, the verification service)."""


class DiskFullError(LeanrlError, OSError):
    """A write failed because the disk or the user's quota is full (``ENOSPC``/``EDQUOT``)."""


_FULL = {errno.ENOSPC, errno.EDQUOT}


@contextlib.contextmanager
def disk_errors(path: str | Path, what: str) -> Iterator[None]:
    """Turn "no space left on device" while writing ``what`` at ``path`` into a
    :class:`DiskFullError` that says what was being written and what to do. Other errors pass.

    leanrl writes durably (append + fsync, or write aside + rename), so what was recorded before
    the failed write is intact and a rerun of the same command continues from it.
    """
    try:
        yield
    except OSError as e:
        if e.errno not in _FULL or isinstance(e, DiskFullError):
            raise
        err = DiskFullError(
            f"no space left on the device (or quota) while writing {what} ({path}): "
            f"{e.strerror}. Free some space there (or choose an output folder on another disk), "
            "then rerun the same command: what was written before this point is kept and the "
            "run continues from it."
        )
        err.errno = e.errno
        raise err from None
