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
    "disk_full_error",
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
    except DiskFullError:
        raise
    except OSError as e:
        if e.errno not in _FULL:
            raise
        raise disk_full_error(path, what, e.strerror or "no space left on device") from None
    except Exception as e:
        # Libraries that write for us (torch.save, safetensors) report a full disk as their own
        # error, sometimes without saying why ("unexpected pos 576 vs 534"): a file system
        # with (almost) no room left right after the failure is the cause.
        if not _nearly_full(Path(path)):
            raise
        raise disk_full_error(path, what, f"{type(e).__name__}: {e}") from e


def disk_full_error(path: str | Path, what: str, why: str) -> DiskFullError:
    """The :class:`DiskFullError` for a failed write of ``what`` at ``path``."""
    err = DiskFullError(
        f"no space left on the device (or quota) while writing {what} ({path}): {why}. Free "
        "some space there (or choose an output folder on another disk), then rerun the same "
        "command: what was written before this point is kept and the run continues from it."
    )
    err.errno = errno.ENOSPC
    return err


def _nearly_full(path: Path, margin: int = 16 * 2**20) -> bool:
    """True when the file system holding ``path`` has less than ``margin`` bytes free."""
    import shutil

    for p in (path, *path.parents):
        if p.exists():
            try:
                return shutil.disk_usage(p).free < margin
            except OSError:
                return False
    return False
