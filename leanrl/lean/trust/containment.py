"""Keeping Lean processes contained: what they can see, what they inherit, and when they die.

Every Lean process leanrl starts runs model-written code in the worst case (elaborating a proof
can run simprocs, tactics and extensions), so it is treated as hostile:

- **Minimal environment.** The child gets an explicit environment built from an allow-list of
  variable names (``PATH``, ``LEAN_PATH``, ...), with ``HOME`` and ``TMPDIR`` pointing at its
  private folder. API keys and tokens of the parent (``OPENAI_API_KEY``, ``HF_TOKEN``, ...) are
  never passed on.
- **Private scratch folders.** One :class:`ScratchRoot` per pool (or one-shot checker) holds one
  private folder per process. Under bubblewrap a process sees only its own folder: the root is
  covered by an empty tmpfs, so it can neither read another attempt's files nor write where the
  trusted checker reads.
- **Bubblewrap** (when available): read-only file system, no network, own PID/IPC/UTS
  namespaces, killed with its parent. :func:`isolation_problem` says why it cannot be used here.
- **Death with the owner.** Children get ``PR_SET_PDEATHSIG``; a process group per child lets
  the owner kill grandchildren too. If the owner is killed with ``kill -9`` anyway, the root's
  ``owner.json`` names the owner and its children's process groups, and the next leanrl that
  starts (:func:`sweep_stale`) kills what is left and removes the folder.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from pathlib import Path

import psutil

__all__ = [
    "ENV_KEYS",
    "ScratchRoot",
    "bwrap_argv",
    "child_setup",
    "isolation_problem",
    "kill_group",
    "minimal_env",
    "process_needs",
    "sweep_stale",
]

log = logging.getLogger("leanrl.lean")

ENV_KEYS: tuple[str, ...] = (
    "PATH",
    "LEAN_PATH",
    "LEAN_SRC_PATH",
    "LEAN_SYSROOT",
    "LEAN_CC",
    "LEAN_AR",
    "LEAN_GITHASH",
    "LAKE",
    "LAKE_HOME",
    "LAKE_OVERRIDE_LEAN",
    "ELAN_HOME",
    "ELAN_TOOLCHAIN",
    "LD_LIBRARY_PATH",
    "DYLD_LIBRARY_PATH",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
)
"""The only variables a Lean process inherits (what ``lake env`` sets, plus locale)."""

_PREFIX = "leanrl-"
_OWNER = "owner.json"


def minimal_env(source: Mapping[str, str], home: Path) -> dict[str, str]:
    """``source`` cut down to :data:`ENV_KEYS`, with ``HOME``/``TMPDIR`` set to ``home``."""
    env = {k: source[k] for k in ENV_KEYS if k in source}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env["HOME"] = env["TMPDIR"] = str(home)
    return env


# -- bubblewrap ---------------------------------------------------------------------------------

TMPFS_MB = 512
"""Size of a sandbox's private ``/tmp`` and ``/dev/shm`` (files there are memory)."""


@cache
def isolation_problem() -> str | None:
    """None when bubblewrap works on this machine, else why not (checked once per process)."""
    exe = shutil.which("bwrap")
    if exe is None:
        return "bubblewrap (`bwrap`) is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    try:
        r = subprocess.run(
            [*bwrap_argv([], exe=exe), "true"], capture_output=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bubblewrap does not run here: {e}"
    if r.returncode != 0:
        why = r.stderr.decode(errors="replace").strip().splitlines()
        return "bubblewrap does not run here: " + (why[-1] if why else f"exit {r.returncode}")
    return None


def bwrap_argv(
    writable: Sequence[Path],
    readable: Sequence[Path] = (),
    hide: Sequence[Path] = (),
    *,
    needs: Sequence[Path] = (),
    exe: str | None = None,
    tmpfs_mb: int = TMPFS_MB,
) -> list[str]:
    """A bubblewrap command prefix: the file system read-only, no network, own namespaces, a
    private ``/tmp`` and ``/dev/shm`` of bounded size, and this user's home folder hidden.

    ``/tmp``, the home folder and the ``hide`` folders (scratch roots) are covered with an empty
    tmpfs. What the process must still read there -- ``needs``: its program, its project, its
    toolchain -- is bound back read-only, exactly those folders and never a parent: a checkout
    under ``/tmp/X`` or ``~`` shows its REPL project, not the project's siblings (``~/.cache``
    may hold tokens, a folder next to the project another user's files). Then ``readable`` folders are bound read-only and ``writable``
    folders read-write, so a process sees exactly the scratch folders it is given.
    """
    exe = exe or shutil.which("bwrap")
    if exe is None:
        raise FileNotFoundError("bubblewrap (`bwrap`) is not installed: apt-get install bubblewrap")
    size = ["--size", str(tmpfs_mb << 20)] if _bwrap_has_size(exe) else []
    argv = [exe, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    argv += [*size, "--tmpfs", "/tmp", *size, "--tmpfs", "/dev/shm"]
    home = _home()
    if home is not None:
        argv += ["--tmpfs", str(home)]
    # Exactly what is needed, never a parent of it: binding a checkout's top folder under /tmp
    # (/tmp/X for /tmp/X/repl) showed Lean processes every sibling of the project there.
    for hidden in (Path("/tmp"), home):
        for p in _exact_under(hidden, needs, avoid=hide) if hidden is not None else ():
            argv += ["--ro-bind", str(p), str(p)]
    for h in hide:
        argv += ["--tmpfs", str(h)]
    for r in readable:
        argv += ["--ro-bind", str(r), str(r)]
    for w in writable:
        argv += ["--bind", str(w), str(w)]
    return [*argv, "--unshare-all", "--die-with-parent", "--new-session"]


@cache
def _bwrap_has_size(exe: str) -> bool:
    try:
        out = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--size" in out


def _home() -> Path | None:
    """This user's home folder, when it is one that can be hidden (not ``/``)."""
    try:
        home = Path.home().resolve()
    except (RuntimeError, OSError):
        return None
    return home if home != Path("/") and home.is_dir() else None


def _exact_under(hidden: Path, paths: Sequence[Path], avoid: Sequence[Path]) -> list[Path]:
    """The folders to bind back under ``hidden`` for ``paths``: a program's folder above its
    ``bin``, a file's folder, a folder itself."""
    out: set[Path] = set()
    avoided = {a.resolve() for a in avoid}
    for p in paths:
        for q in {p.absolute(), p.resolve()}:
            if q == hidden or not q.is_relative_to(hidden) or not q.exists():
                continue
            d = q if q.is_dir() else q.parent
            if d.name == "bin" and d.parent != hidden:
                d = d.parent
            if d != hidden and not any(d == a or d.is_relative_to(a) for a in avoided):
                out.add(d)
    # Nested ones are covered by their parents.
    return sorted(d for d in out if not any(d != o and d.is_relative_to(o) for o in out))


def process_needs(argv: Sequence[str], cwd: Path | None, env: Mapping[str, str]) -> list[Path]:
    """Paths a Lean process must be able to read: its working folder, the files its command
    line names, and the folders of its path-like variables (``PATH``, ``LEAN_PATH``, ...)."""
    out = [cwd] if cwd is not None else []
    out += [Path(a) for a in argv if a.startswith("/") and os.path.exists(a)]
    for key in ("PATH", "LEAN_PATH", "LEAN_SRC_PATH", "LEAN_SYSROOT", "LD_LIBRARY_PATH"):
        out += [Path(x) for x in env.get(key, "").split(os.pathsep) if x.startswith("/")]
    return [p for p in out if p is not None]


# -- the child's own set-up (runs between fork and exec) -----------------------------------------

_PR_SET_PDEATHSIG = 1
FILE_LIMIT = 2 << 30
"""Largest file a Lean process may write (``RLIMIT_FSIZE``), in bytes."""


def _pdeathsig() -> None:
    # Linux only; elsewhere the owner's process-group kill and the stale sweep remain.
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _limit_data(mb: int) -> None:
    # RLIMIT_DATA caps the heap (brk + private anonymous maps) but not the read-only mapped
    # .olean files, so importing Mathlib is not charged against it the way RLIMIT_AS would be.
    # It is a backstop set above the cap: the RSS watch normally kills first, which tells a
    # memory overrun apart from a crash.
    b = int(mb * 1.5 + 64) * 1024 * 1024
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_DATA, (b, b))


def child_setup(memory_mb: int | None) -> Callable[[], None]:
    """The ``preexec_fn`` for a Lean child: die with the owner, and the memory backstop.

    The death signal is tied to the thread that starts the child (the event loop's thread), so a
    pool must not outlive the loop it was started on -- which asyncio requires anyway.
    """

    def setup() -> None:
        _pdeathsig()
        if memory_mb:
            _limit_data(memory_mb)
        # No file it writes (a pickle, its stderr, a file an attempt's code writes in its
        # folder) may grow past this: the host's disk is not the attempt's.
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))

    return setup


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` (every child is started in its own session).

    Also called after the leader has exited: what it left behind in its group (a child holding
    the output pipe open) must die too. A group id is not reused while any member lives.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


# -- scratch folders ----------------------------------------------------------------------------


class ScratchRoot:
    """A folder of private per-process folders, marked with its owner so it can be cleaned up.

    Call :meth:`create` before use (it sweeps stale roots of dead owners first) and
    :meth:`remove` at the end.
    """

    def __init__(self, purpose: str, parent: Path | None = None) -> None:
        self.purpose = purpose
        self.parent = parent
        self.path: Path | None = None
        self._groups: list[tuple[int, float]] = []
        self._count = 0

    def create(self) -> Path:
        """Make the root (mode 0700) and write ``owner.json``."""
        if self.path is None:
            parent = self.parent or Path(tempfile.gettempdir())
            sweep_stale(parent)
            self.path = Path(
                tempfile.mkdtemp(prefix=f"{_PREFIX}{self.purpose}-{os.getpid()}-", dir=parent)
            )
            self._write_owner()
        return self.path

    def folder(self, kind: str) -> Path:
        """A new private folder (mode 0700) for one process or attempt, e.g. ``elab-3``."""
        root = self.create()
        self._count += 1
        p = root / f"{kind}-{self._count}"
        p.mkdir(mode=0o700)
        return p

    def register(self, pid: int) -> None:
        """Record a child's process group (it leads one), so a later sweep can kill it."""
        try:
            created = psutil.Process(pid).create_time()
        except psutil.Error:
            return
        # Forget groups that are gone, so the file stays small in a long run.
        self._groups = [(g, t) for g, t in self._groups if _group_alive(g)] + [(pid, created)]
        self._write_owner()

    def _write_owner(self) -> None:
        assert self.path is not None
        me = psutil.Process()
        data = {"pid": me.pid, "created": me.create_time(), "groups": self._groups}
        tmp = self.path / (_OWNER + ".tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        tmp.replace(self.path / _OWNER)

    def remove(self) -> None:
        """Delete the root and everything in it (the processes must be stopped first)."""
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = None


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner_alive(info: Mapping[str, object]) -> bool:
    pid, created = info.get("pid"), info.get("created")
    if not isinstance(pid, int) or not isinstance(created, (int, float)):
        return False
    try:
        return abs(psutil.Process(pid).create_time() - float(created)) < 1.0
    except psutil.Error:
        return False


def _kill_leftovers(groups: object, root: Path) -> int:
    """Kill the members of recorded process groups that were started by the dead owner: only
    processes whose ``HOME`` lies in the dead owner's scratch root (every Lean process leanrl
    starts has one there), so a group id reused by an unrelated process is left alone."""
    if not isinstance(groups, list):
        return 0
    killed = 0
    wanted: dict[int, float] = {}
    for g in groups:
        if isinstance(g, list) and len(g) == 2 and isinstance(g[0], int):
            wanted[g[0]] = float(g[1])
    if not wanted:
        return 0
    for p in psutil.process_iter(["pid", "create_time"]):
        try:
            pgid = os.getpgid(p.pid)
        except (ProcessLookupError, PermissionError):
            continue
        # A member of the group that started no earlier than its leader: not a reused id.
        if pgid in wanted and (p.info["create_time"] or 0) >= wanted[pgid] - 1.0:
            with contextlib.suppress(psutil.Error):
                if not p.environ().get("HOME", "").startswith(str(root) + os.sep):
                    continue
                p.kill()
                killed += 1
    return killed


def sweep_stale(parent: Path | None = None, *, legacy_age_s: float = 86400.0) -> list[Path]:
    """Remove the scratch roots whose owner is dead, killing the Lean processes they name.

    Roots without ``owner.json`` (made by older leanrl versions) are removed once they are
    older than ``legacy_age_s``. Returns the folders removed.
    """
    parent = parent or Path(tempfile.gettempdir())
    removed: list[Path] = []
    try:
        candidates = [p for p in parent.iterdir() if p.name.startswith(_PREFIX) and p.is_dir()]
    except OSError:
        return removed
    for root in candidates:
        marker = root / _OWNER
        try:
            if marker.is_file():
                info = json.loads(marker.read_text(encoding="utf-8"))
                if not isinstance(info, dict) or _owner_alive(info):
                    continue
                n = _kill_leftovers(info.get("groups"), root)
                if n:
                    log.warning("killed %d Lean process(es) left behind by a dead leanrl", n)
            elif time.time() - root.stat().st_mtime < legacy_age_s:
                continue
            elif not root.name.startswith((f"{_PREFIX}pool-", f"{_PREFIX}oneshot-")):
                continue
        except (OSError, ValueError):
            continue
        shutil.rmtree(root, ignore_errors=True)
        removed.append(root)
    return removed
