"""One Lean REPL child process: spawn it, talk the JSON protocol, watch it, kill it.

This is transport only (no policy). Failures are exceptions of this module (:class:`ReplDied`,
:class:`ReplTimeout`, :class:`ReplMemory`, :class:`ReplFlood`, ``ProtocolError``); the pool
above turns each into the one verdict it costs and replaces the process.

A reader task owns the child's stdout from start to end and queues each answer as it arrives.
That is what makes three failure modes visible at once instead of poisoning later attempts:

- an answer nobody asked for (a duplicated or late answer puts the process out of step): the
  next request finds the queue non-empty and raises ``ProtocolError``;
- a flood of output: more than ``max_output_mb`` for one request kills the process
  (:class:`ReplFlood`), so a child printing without end cannot grow the parent's memory;
- a dead process whose child still holds the output pipe open: the process's own exit is
  watched too, so a crash is reported at once, not after the time limit.

Answers are also checked against what the REPL must say: it numbers environments in order
(each command or unpickle makes the next one; ``pickleTo`` echoes its ``env``), so an answer to
a command must name exactly the next environment. Text an attempt prints on the REPL's stdout
(old ``#eval`` does not capture it) therefore cannot pass for an answer -- for example to make
the pool pickle an earlier attempt's environment instead of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

import psutil

from leanrl.lean.protocol import (
    CommandRequest,
    CommandResponse,
    PickleEnvRequest,
    ProtocolError,
    Request,
    Response,
    UnpickleEnvRequest,
    encode_request,
    parse_response,
)
from leanrl.lean.trust.containment import child_setup, kill_group

__all__ = [
    "ProtocolError",
    "ReplDied",
    "ReplFlood",
    "ReplGone",
    "ReplMemory",
    "ReplProcess",
    "ReplTimeout",
]

_LINE_LIMIT = 1 << 26  # longest line the stream reader buffers (64 MiB; goals can be long)
_OOM = re.compile(r"out of memory|MemoryError|bad_alloc|Cannot allocate memory", re.IGNORECASE)
_EXIT_GRACE_S = 0.5  # after the process exits, how long its last answer may take to arrive
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_OUTSIDE_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
"""Signals only something outside sends (an operator, the kernel's OOM killer, a dying
sandbox); Lean's own failures (an abort, a panic, a crash) end it otherwise."""


class ReplDied(RuntimeError):
    """The process exited or closed its output while we waited for an answer."""


class ReplGone(ReplDied):
    """The process was already dead (or had closed its input) when a request was to be sent:
    it never saw the request, so whatever killed it was not that request."""


class ReplTimeout(RuntimeError):
    """No answer within the time limit (the process has been killed)."""


class ReplMemory(RuntimeError):
    """The process went over its memory cap (it has been killed)."""


class ReplFlood(ReplMemory):
    """The process printed more than its output cap for one request (it has been killed)."""


class _Eof:
    """Queued by the reader when stdout closes."""


class ReplProcess:
    """A REPL child process speaking the JSON protocol on stdin/stdout.

    ``argv`` is the whole command line (a sandbox prefix included); ``env`` the child's whole
    environment (see :func:`leanrl.lean.trust.containment.minimal_env`). ``on_spawn`` is called
    with the child's pid (which leads its own process group) right after it starts.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        memory_mb: int | None = None,
        max_output_mb: float = 64.0,
        on_spawn: Callable[[int], None] | None = None,
    ) -> None:
        self.argv = list(argv)
        self.cwd = cwd
        self.env = env
        self.memory_mb = memory_mb
        self.max_output_bytes = int(max_output_mb * 1024 * 1024)
        self.on_spawn = on_spawn
        self.proc: asyncio.subprocess.Process | None = None
        self.peak_rss_mb = 0.0
        self.exit_code: int | None = None
        """The return code the child ended with on its own, before this class killed it (None:
        alive, or killed here first). Negative: the signal that ended it."""
        self._stderr: IO[bytes] | None = None
        self._answers: asyncio.Queue[Response | Exception | _Eof] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._budget = self.max_output_bytes
        self._next_env = 0  # the REPL numbers environments in order
        self._spine: set[int] = set()

    @property
    def pid(self) -> int | None:
        """The child's pid (None before :meth:`start`)."""
        return self.proc.pid if self.proc is not None else None

    @property
    def alive(self) -> bool:
        """True while the child runs."""
        return self.proc is not None and self.proc.returncode is None

    async def start(self) -> None:
        """Spawn the child (does not wait for it to load anything)."""
        # stderr goes to an unlinked temporary file: it never blocks the child, and its tail
        # says why a process died ("out of memory", an uncaught exception).
        self._stderr = tempfile.TemporaryFile()
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=self._stderr,
            cwd=str(self.cwd) if self.cwd else None,
            env=self.env,
            limit=_LINE_LIMIT,
            start_new_session=True,
            preexec_fn=child_setup(self.memory_mb),
        )
        if self.on_spawn is not None:
            self.on_spawn(self.proc.pid)
        self._answers = asyncio.Queue()
        self._reader = asyncio.ensure_future(self._read_loop())

    # -- memory -----------------------------------------------------------------------------------

    def rss_mb(self) -> float:
        """Private resident memory of the child and its descendants (a sandbox's init), in MiB.

        File-backed resident pages are left out: the memory-mapped ``.olean`` files of
        ``import Mathlib`` are shared by every process and can be dropped by the kernel at any
        time, so they say nothing about a runaway proof. Only this process tree is read (from
        ``/proc`` on Linux), never the whole process table.
        """
        if not self.alive or self.proc is None:
            return 0.0
        total = 0
        for pid in _tree(self.proc.pid):
            total += _private_bytes(pid)
        mb = total / (1024 * 1024)
        self.peak_rss_mb = max(self.peak_rss_mb, mb)
        return mb

    def mark_spine(self) -> None:
        """Remember the processes that make up this REPL now (it, a sandbox's init): any other
        descendant that appears later was started by an attempt (see :meth:`kill_strays`)."""
        if self.alive and self.proc is not None:
            self._spine = set(_tree(self.proc.pid))

    def kill_strays(self) -> int:
        """Kill every descendant that is not part of the REPL itself: what an attempt's code
        started must not outlive the attempt (it could rewrite files or disturb the next one).
        Returns how many were killed. Cheap: it reads only this process tree."""
        if not self.alive or self.proc is None or not self._spine:
            return 0
        strays = [p for p in _tree(self.proc.pid) if p not in self._spine and not _zombie(p)]
        for pid in strays:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        return len(strays)

    # -- requests ---------------------------------------------------------------------------------

    async def request(self, req: Request, timeout: float) -> Response:
        """Send one request and wait for its answer, watching time, memory and output."""
        if not self.alive or self.proc is None or self.proc.stdin is None:
            raise ReplGone("the REPL process is not running")
        if _zombie(self.proc.pid):  # dead, and not reaped yet: the request would find it dead
            raise ReplGone("the REPL process has exited")
        assert self._answers is not None
        if not self._answers.empty():
            stray = self._answers.get_nowait()
            if isinstance(stray, _Eof):
                raise ReplDied("the REPL process closed its output")
            raise ProtocolError(
                "the REPL sent an answer nobody asked for (it is out of step with its requests)"
            )
        self._budget = self.max_output_bytes
        try:
            self.proc.stdin.write(encode_request(req))
            await self.proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError) as e:
            raise ReplGone(f"the REPL process closed its input: {e}") from e
        answer = asyncio.ensure_future(self._answers.get())
        watcher = asyncio.ensure_future(self._watch())
        try:
            done, _ = await asyncio.wait(
                {answer, watcher}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            why = watcher.result() if watcher in done else None
            if answer not in done and why == "exited":
                # The process is gone; its last words may still be in the pipe.
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(answer), _EXIT_GRACE_S)
            if answer.done():
                return self._in_step(req, await self._take(answer.result()))
            if why == "exited":
                await self.kill()
                raise ReplDied(self._death_note())
            if why == "memory":
                await self.kill()
                raise ReplMemory(
                    f"the Lean process went over its memory cap of {self.memory_mb} MiB "
                    f"(peak {self.peak_rss_mb:.0f} MiB)"
                )
            await self.kill()
            raise ReplTimeout(f"no answer within {timeout:g} s")
        finally:
            for t in (answer, watcher):
                if not t.done():
                    t.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await t

    def _in_step(self, req: Request, ans: Response) -> Response:
        """``ans`` if it names the environment the REPL must have made, else ProtocolError."""
        if not isinstance(ans, CommandResponse):
            return ans
        if isinstance(req, (CommandRequest, UnpickleEnvRequest)):
            if ans.env != self._next_env:
                raise ProtocolError(
                    f"the REPL answered with environment {ans.env}, not the new environment "
                    f"{self._next_env} (an answer it did not make, or it is out of step)"
                )
            self._next_env += 1
        elif isinstance(req, PickleEnvRequest) and ans.env != req.env:
            raise ProtocolError(f"the REPL answered a pickle of {req.env} with {ans.env}")
        return ans

    async def _take(self, item: Response | Exception | _Eof) -> Response:
        if isinstance(item, _Eof):
            # Its output closed: it is exiting. Let it finish, so its own exit status (an
            # abort, or a kill from outside) is what is recorded, not the kill that follows.
            for _ in range(int(_EXIT_GRACE_S / 0.01)):
                if self.proc is None or self.proc.returncode is not None:
                    break
                await asyncio.sleep(0.01)
            await self.kill()
            raise ReplDied(self._death_note())
        if isinstance(item, ReplFlood):
            await self.kill()
            raise item
        if isinstance(item, Exception):
            raise item
        return item

    def _death_note(self) -> str:
        code = self.proc.returncode if self.proc is not None else None
        tail = self.stderr_tail(300).strip().replace("\n", " | ")
        said = f": {tail}" if tail else ""
        return f"the REPL process exited (code {code}) before answering{said}"

    async def _watch(self) -> str:
        """``"exited"`` once the child has exited, ``"memory"`` once it is over its cap.

        The exit is read from the child watcher's return code, not from ``proc.wait()``, which
        also waits for the pipes to close -- and a child the process left behind may hold them.
        """
        assert self.proc is not None
        while True:
            if self.proc.returncode is not None:
                return "exited"
            if self.memory_mb and self.rss_mb() > self.memory_mb:
                return "memory"
            await asyncio.sleep(0.05)

    async def _read_loop(self) -> None:
        """Read answers for the life of the process and queue them (see the module docstring)."""
        assert self.proc is not None and self.proc.stdout is not None
        assert self._answers is not None
        out, queue = self.proc.stdout, self._answers
        lines: list[str] = []
        try:
            while True:
                try:
                    raw = await out.readline()
                except ValueError:  # a line past the stream limit
                    queue.put_nowait(ReplFlood("the REPL printed a line longer than 64 MiB"))
                    return
                if not raw:
                    queue.put_nowait(_Eof())
                    return
                self._budget -= len(raw)
                if self._budget < 0:
                    mb = self.max_output_bytes / (1024 * 1024)
                    queue.put_nowait(
                        ReplFlood(f"the Lean process printed more than {mb:g} MiB for one request")
                    )
                    return  # stop reading: the request that sees this kills the process
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                if line.strip():
                    lines.append(line)
                    continue
                if not lines:
                    continue
                block, lines = lines, []
                if not any(ln.lstrip().startswith("{") for ln in block):
                    continue  # a block of debug output, not an answer
                obj = _decode_block(block)
                if obj is None:
                    # The REPL never puts a blank line inside an answer, so this is garbage.
                    queue.put_nowait(
                        ProtocolError(f"the REPL answered with invalid JSON: {block[0][:200]!r}")
                    )
                    continue
                try:
                    queue.put_nowait(parse_response(obj))
                except ProtocolError as e:
                    queue.put_nowait(e)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - any read failure ends the process's usefulness
            queue.put_nowait(ReplDied(f"reading the REPL's output failed: {e}"))

    # -- ending -----------------------------------------------------------------------------------

    async def _reap(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(asyncio.TimeoutError, ProcessLookupError):
                await asyncio.wait_for(self.proc.wait(), 2.0)

    async def kill(self) -> None:
        """Kill the child and everything it started (its whole process group, also when the
        child itself has already exited)."""
        if self.proc is None:
            return
        if self.exit_code is None and self.proc.returncode is not None:
            self.exit_code = self.proc.returncode  # it ended on its own first
        kill_group(self.proc.pid)
        if self.proc.returncode is None and not _exited(self.proc.pid):
            # os.kill, not proc.kill(): Popen.send_signal polls first, and when the group kill
            # above has just ended the child that waitpid reaps it behind asyncio's child
            # watcher, which then logs "Unknown child process pid N, will report returncode
            # 255" (on stderr of a plain `leanrl verify`) and reports 255 as its exit code.
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
        await self._reap()
        await self._stop_tasks()
        self._close_pipes()

    async def close(self) -> None:
        """Ask the REPL to exit (EOF on stdin), then kill what is left."""
        if self.proc is None:
            return
        if self.proc.returncode is None and self.proc.stdin is not None:
            with contextlib.suppress(Exception):
                self.proc.stdin.close()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.proc.wait(), 1.0)
        await self.kill()

    async def _stop_tasks(self) -> None:
        for t in (self._reader,):
            if t is not None and not t.done():
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t

    def stderr_tail(self, n: int = 2000) -> str:
        """The last ``n`` bytes the child wrote to stderr."""
        if self._stderr is None:
            return ""
        try:
            self._stderr.seek(0, os.SEEK_END)
            size = self._stderr.tell()
            self._stderr.seek(max(0, size - n))
            return self._stderr.read().decode("utf-8", errors="replace")
        except (OSError, ValueError):
            return ""

    def killed_from_outside(self) -> bool:
        """Whether the child ended on its own by a signal only something outside sends (SIGKILL,
        SIGTERM, SIGINT, SIGHUP; or a sandbox's exit code ``128 + signal`` for one) -- as
        opposed to exiting, aborting or crashing, which only its own work does."""
        code = self.exit_code
        if code is None:
            return False
        sig = -code if code < 0 else code - 128 if code > 128 else 0
        return sig in _OUTSIDE_SIGNALS

    def out_of_memory(self) -> bool:
        """Whether the child's last words say it ran out of memory."""
        return bool(_OOM.search(self.stderr_tail()))

    def _close_pipes(self) -> None:
        if self.proc is not None and self.proc.stdin is not None:
            with contextlib.suppress(Exception):
                self.proc.stdin.close()
        if self.proc is not None and self.proc.returncode is not None:
            # Release the pipes now that the child is reaped (closing the transport earlier
            # would make it reap the child itself, behind the child watcher's back).
            transport = getattr(self.proc, "_transport", None)
            if transport is not None:
                with contextlib.suppress(Exception):
                    transport.close()
        if self._stderr is not None:
            with contextlib.suppress(OSError):
                self._stderr.close()
            self._stderr = None


def _decode_block(lines: list[str]) -> object | None:
    """The JSON object in a blank-line-terminated block, skipping non-JSON lines before it."""
    for i, ln in enumerate(lines):
        if ln.lstrip().startswith("{"):
            try:
                return json.loads("\n".join(lines[i:]))
            except json.JSONDecodeError:
                return None
    return None


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants, read from ``/proc/PID/task/TID/children`` (Linux), or with
    psutil where that file does not exist."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        kids = _children(p)
        if kids is None:
            try:
                return [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
            except psutil.Error:
                return [pid]
        todo.extend(kids)
    return out


def _children(pid: int) -> list[int] | None:
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return [] if os.path.isdir("/proc/self/task") else None
    except OSError:
        return None
    kids: list[int] = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as f:
                kids.extend(int(x) for x in f.read().split())
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue  # the thread ended meanwhile
            return None  # the kernel has no children file: use psutil
        except (OSError, ValueError):
            continue
    return kids


def _exited(pid: int) -> bool:
    """Whether the child ``pid`` has exited (reaped or not), asked without reaping it: only
    asyncio's child watcher may reap the children it waits for."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped already
        return True
    except OSError:
        return False


def _zombie(pid: int) -> bool:
    """Whether ``pid`` has exited and waits to be reaped (killing it again does nothing)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def _private_bytes(pid: int) -> int:
    """Resident minus shared (file-backed) memory of one process."""
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as f:
            fields = f.read().split()
        return max(0, int(fields[1]) - int(fields[2])) * _PAGE
    except (OSError, ValueError, IndexError):
        pass
    try:
        info = psutil.Process(pid).memory_info()
        return max(0, info.rss - getattr(info, "shared", 0))
    except psutil.Error:
        return 0
