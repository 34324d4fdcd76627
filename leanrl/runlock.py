"""One run per folder: an exclusive lock on ``FOLDER/.lock`` while a run writes there.

Two commands writing one folder at once corrupt it: two evals append the same attempts twice,
two GRPO runs log the same steps twice, two ES runs interleave ``es_history.bin``. Every command
that writes a folder (``leanrl eval``, ``train grpo``/``es``/``sft``/``expert-iteration``,
``leanrl compare``) therefore holds an ``flock`` on ``FOLDER/.lock`` while it runs, and a second
one is refused at once with a one-line :class:`~leanrl.errors.ConfigError`.

The kernel drops an ``flock`` when its process dies (a kill, even SIGKILL), so a dead run never
leaves its folder locked: there is no stale-lock cleanup to get wrong. The file's text (what
holds it and its process id) is only there for the refusal message; the lock is the ``flock``.

A compare's runs are folders under its own (``OUT/es-seed0/``) and lock their own ``.lock``, so
the compare's lock on ``OUT/.lock`` never meets theirs. On a file system without ``flock``
support the run goes ahead unlocked, with a warning.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from pathlib import Path
from types import TracebackType

from leanrl.errors import ConfigError, disk_errors

__all__ = ["LOCK_FILE", "FolderLock"]

LOCK_FILE = ".lock"
"""The lock's file name inside the folder it guards."""

log = logging.getLogger("leanrl")

#: flock's answers for "someone else holds it" (EWOULDBLOCK is EAGAIN on Linux).
_HELD_ELSEWHERE = {errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES}

# Re-entrant locks this process holds: lock file (resolved) -> [fd, number of holders].
_SHARED: dict[str, list[int]] = {}
_SHARED_GUARD = threading.RLock()  # re-entrant: a finalizer may release during an acquire


class FolderLock:
    """An exclusive lock on ``folder/.lock`` for a run of ``kind`` (``"eval"``, ``"GRPO run"``).

    ``reentrant``: other ``FolderLock`` s of this process on the same folder share the lock
    instead of being refused (a trainer that failed to start, then a corrected retry in the same
    Python process, or two trainers run one after the other in a notebook); the lock goes when
    the last of them releases it. Other processes are refused either way.
    """

    def __init__(self, folder: str | Path, kind: str, *, reentrant: bool = False) -> None:
        self.folder = Path(folder).expanduser()
        self.kind = kind
        self.reentrant = reentrant
        self.path = self.folder / LOCK_FILE
        self._fd: int | None = None
        self._key: str | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock now."""
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock (once: a second call is a no-op), or raise :class:`ConfigError` naming
        what holds it."""
        import fcntl

        if self._fd is not None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        key = os.path.realpath(self.path)
        with _SHARED_GUARD:
            if self.reentrant and key in _SHARED:
                _SHARED[key][1] += 1
                self._fd, self._key = _SHARED[key][0], key
                return
            with disk_errors(self.path, "the run folder's lock"):
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                holder = _holder(fd)
                os.close(fd)
                if e.errno not in _HELD_ELSEWHERE:  # no flock here (some network file systems)
                    log.warning(
                        "%s cannot be locked (%s): nothing stops a second run from writing %s "
                        "at the same time, so start only one",
                        self.path,
                        e.strerror,
                        self.folder,
                    )
                    return
                kind, pid = holder if holder is not None else (self.kind, None)
                who = f"; process {pid}" if pid else ""
                raise ConfigError(
                    f"another {kind} is running in {self.folder} (it holds {self.path}{who}). "
                    "Wait for it to finish, or give this one another --out."
                ) from None
            _describe(fd, self.kind)
            self._fd = fd
            if self.reentrant:
                self._key = key
                _SHARED[key] = [fd, 1]

    def release(self) -> None:
        """Let the lock go (a no-op when not held). Closing the file is what drops an flock."""
        with _SHARED_GUARD:
            fd, key = self._fd, self._key
            self._fd = self._key = None
            if fd is None:
                return
            if key is not None:
                entry = _SHARED.get(key)
                if entry is not None and entry[0] == fd:
                    entry[1] -= 1
                    if entry[1] > 0:
                        return  # another holder in this process still runs
                    del _SHARED[key]
            os.close(fd)

    def __enter__(self) -> FolderLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def _describe(fd: int, kind: str) -> None:
    """Write what holds the lock into its file, for a refused run's message (best effort)."""
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{kind}\n{os.getpid()}\n".encode(), 0)
    except OSError:
        pass  # the lock holds without its description


def _holder(fd: int) -> tuple[str, str] | None:
    """``(kind, pid)`` the holder wrote into the lock file; None when unreadable or empty."""
    try:
        lines = os.pread(fd, 256, 0).decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    if len(lines) < 2 or not lines[0].strip():
        return None
    return lines[0].strip(), lines[1].strip()
