"""One Lean REPL child process: spawn it, talk the JSON protocol, watch its memory, kill it.

This is transport only (no policy). Failures are exceptions of this module (:class:`ReplDied`,
:class:`ReplTimeout`, :class:`ReplMemory`, :class:`ProtocolError`); the worker above turns each
into the one verdict it costs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import resource
import shutil
import signal
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import psutil

from leanrl.lean.protocol import ProtocolError, Request, Response, encode_request, parse_response

__all__ = ["ReplDied", "ReplMemory", "ReplProcess", "ReplTimeout", "bwrap_prefix"]

_LIMIT = 1 << 26  # longest line we accept from the REPL (64 MiB; goals can be long)
_OOM = re.compile(r"out of memory|MemoryError|bad_alloc|Cannot allocate memory", re.IGNORECASE)


class ReplDied(RuntimeError):
    """The process exited or closed its output while we waited for an answer."""


class ReplTimeout(RuntimeError):
    """No answer within the time limit (the process has been killed)."""


class ReplMemory(RuntimeError):
    """The process went over its memory cap (it has been killed)."""


def bwrap_prefix(writable: Sequence[Path]) -> list[str]:
    """A bubblewrap command prefix: read-only file system, no network, own namespaces.

    ``writable`` folders stay writable (the worker's scratch folder for pickles).
    """
    exe = shutil.which("bwrap")
    if exe is None:
        raise FileNotFoundError("bubblewrap (`bwrap`) is not installed: apt-get install bubblewrap")
    argv = [exe, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    for w in writable:
        argv += ["--bind", str(w), str(w)]
    return [*argv, "--unshare-all", "--die-with-parent", "--new-session"]


def _limit_memory(mb: int) -> None:  # runs in the child before exec
    # RLIMIT_DATA caps the heap (brk + private anonymous maps) but not the read-only mapped
    # .olean files, so importing Mathlib is not charged against it the way RLIMIT_AS would be.
    # It is a backstop set above the cap: the RSS watch normally kills first, which tells a
    # memory overrun apart from a crash.
    b = int(mb * 1.5 + 64) * 1024 * 1024
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_DATA, (b, b))


class ReplProcess:
    """A REPL child process speaking the JSON protocol on stdin/stdout."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        memory_mb: int | None = None,
        isolate: bool = False,
        scratch: Path | None = None,
    ) -> None:
        self.argv = list(argv)
        self.cwd = cwd
        self.env = env
        self.memory_mb = memory_mb
        self.isolate = isolate
        self.scratch = scratch
        self.proc: asyncio.subprocess.Process | None = None
        self.peak_rss_mb = 0.0
        self._stderr: IO[bytes] | None = None

    @property
    def alive(self) -> bool:
        """True while the child runs."""
        return self.proc is not None and self.proc.returncode is None

    async def start(self) -> None:
        """Spawn the child (does not wait for it to load anything)."""
        argv = self.argv
        if self.isolate:
            # Only the scratch folder (pickles) is writable; the project stays read-only.
            argv = bwrap_prefix([self.scratch] if self.scratch else []) + argv
        mb = self.memory_mb
        # stderr goes to an unlinked temporary file: it never blocks the child, and its tail
        # says why a process died ("out of memory", an uncaught exception).
        self._stderr = tempfile.TemporaryFile()
        self.proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=self._stderr,
            cwd=str(self.cwd) if self.cwd else None,
            env=self.env,
            limit=_LIMIT,
            start_new_session=True,
            preexec_fn=(lambda: _limit_memory(mb)) if mb else None,
        )

    def rss_mb(self) -> float:
        """Private resident memory of the child and its descendants (bwrap, lake env), in MiB.

        File-backed resident pages are left out: the memory-mapped ``.olean`` files of
        ``import Mathlib`` are shared by every process and can be dropped by the kernel at any
        time, so they say nothing about a runaway proof.
        """
        if not self.alive or self.proc is None:
            return 0.0
        try:
            p = psutil.Process(self.proc.pid)
            procs = [p, *p.children(recursive=True)]
            total = 0
            for q in procs:
                with contextlib.suppress(psutil.Error):
                    info = q.memory_info()
                    total += info.rss - getattr(info, "shared", 0)
        except psutil.Error:
            return 0.0
        mb = total / (1024 * 1024)
        self.peak_rss_mb = max(self.peak_rss_mb, mb)
        return mb

    async def request(self, req: Request, timeout: float) -> Response:
        """Send one request and wait for its answer, watching time and memory."""
        if not self.alive or self.proc is None or self.proc.stdin is None:
            raise ReplDied("the REPL process is not running")
        try:
            self.proc.stdin.write(encode_request(req))
            await self.proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError) as e:
            raise ReplDied(f"the REPL process closed its input: {e}") from e
        reader = asyncio.ensure_future(self._read_answer())
        watcher = asyncio.ensure_future(self._watch_memory()) if self.memory_mb else None
        try:
            waiting = {reader} | ({watcher} if watcher else set())
            done, _ = await asyncio.wait(
                waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if reader in done:
                return reader.result()
            if watcher is not None and watcher in done:
                await self.kill()
                raise ReplMemory(
                    f"the Lean process went over its memory cap of {self.memory_mb} MiB "
                    f"(peak {self.peak_rss_mb:.0f} MiB)"
                )
            await self.kill()
            raise ReplTimeout(f"no answer within {timeout:g} s")
        finally:
            for t in (reader, watcher):
                if t is not None and not t.done():
                    t.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await t

    async def _watch_memory(self) -> None:
        assert self.memory_mb
        while self.alive:
            if self.rss_mb() > self.memory_mb:
                return
            await asyncio.sleep(0.05)
        await asyncio.sleep(3600)  # died: let the reader report it

    async def _read_answer(self) -> Response:
        assert self.proc is not None and self.proc.stdout is not None
        lines: list[str] = []
        while True:
            raw = await self.proc.stdout.readline()
            if not raw:
                await self._reap()
                code = self.proc.returncode
                tail = self.stderr_tail(300).strip().replace("\n", " | ")
                said = f": {tail}" if tail else ""
                raise ReplDied(f"the REPL process exited (code {code}) before answering{said}")
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            if line.strip():
                lines.append(line)
                continue
            if not lines:
                continue
            if not any(ln.lstrip().startswith("{") for ln in lines):
                lines = []  # a block of debug output, not an answer: skip it
                continue
            obj = _decode_block(lines)
            if obj is None:
                # The REPL never puts a blank line inside an answer, so this is garbage.
                raise ProtocolError(f"the REPL answered with invalid JSON: {lines[0][:200]!r}")
            return parse_response(obj)

    async def _reap(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(asyncio.TimeoutError, ProcessLookupError):
                await asyncio.wait_for(self.proc.wait(), 2.0)

    async def kill(self) -> None:
        """Kill the child and everything it started (its own process group)."""
        if self.proc is None:
            return
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        await self._reap()
        self._close_pipes()

    async def close(self) -> None:
        """Ask the REPL to exit (EOF on stdin), then kill it if it does not."""
        if self.proc is None:
            return
        if self.proc.returncode is None and self.proc.stdin is not None:
            with contextlib.suppress(Exception):
                self.proc.stdin.close()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.proc.wait(), 1.0)
        await self.kill()

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

    def out_of_memory(self) -> bool:
        """Whether the child's last words say it ran out of memory."""
        return bool(_OOM.search(self.stderr_tail()))

    def _close_pipes(self) -> None:
        if self.proc is not None and self.proc.stdin is not None:
            with contextlib.suppress(Exception):
                self.proc.stdin.close()
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


__all__ += ["ProtocolError"]
