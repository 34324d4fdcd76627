"""Running one agent program for one episode, bounded: wall time, output size, its processes.

The program is started without a shell, in a session of its own (so the whole process group
can be killed: children it started die with it), with the episode's environment. Its stdout and
stderr are read as they come, each kept up to a cap (the rest is counted, not stored), so a
program that floods its output costs memory it is allowed, no more. Past ``timeout_s`` the
group gets SIGTERM, then SIGKILL a second later; when the program exits on its own its group is
killed too (a straggler child must not outlive its episode). Nothing here raises for the
program's sake: a crash, a hang, a program that cannot start are a :class:`ProgramResult`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass

__all__ = ["ProgramResult", "run_program"]


@dataclass(frozen=True)
class ProgramResult:
    """How one run of the program went."""

    returncode: int | None
    """Its exit status (negative: killed by that signal; None: it never started)."""
    stdout: str
    """What it printed (up to the cap)."""
    stderr: str
    """The end of what it printed to stderr (up to the cap)."""
    timed_out: bool
    """It ran past the time limit and was killed."""
    seconds: float
    """Wall time from start to exit."""
    error: str = ""
    """Why it could not start ('' when it did)."""

    def describe(self) -> str:
        """One line: how it ended."""
        if self.error:
            return f"the agent program could not start: {self.error}"
        if self.timed_out:
            return (
                f"the agent program ran past its time limit ({self.seconds:.0f} s) and was killed"
            )
        if self.returncode:
            tail = self.stderr.strip().splitlines()[-1:] or [""]
            return f"the agent program exited with status {self.returncode}: {tail[0][:200]}"
        return "the agent program exited normally"


async def _read(stream: asyncio.StreamReader | None, cap: int, keep_end: bool) -> str:
    if stream is None:
        return ""
    kept = bytearray()
    while chunk := await stream.read(65536):
        kept += chunk
        if len(kept) > 2 * cap:  # keep memory bounded while reading on
            kept = kept[-cap:] if keep_end else kept[:cap]
    data = bytes(kept[-cap:] if keep_end else kept[:cap])
    return data.decode("utf-8", errors="replace")


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


async def run_program(
    argv: list[str],
    *,
    env: dict[str, str],
    stdin: bytes,
    timeout_s: float,
    cwd: str | None = None,
    max_output: int = 1 << 20,
) -> ProgramResult:
    """Run ``argv`` to its end or to ``timeout_s``, feeding it ``stdin``."""
    t0 = time.perf_counter()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
    except OSError as e:
        return ProgramResult(None, "", "", False, 0.0, error=f"{type(e).__name__}: {e}")
    out = asyncio.ensure_future(_read(proc.stdout, max_output, keep_end=False))
    err = asyncio.ensure_future(_read(proc.stderr, 64 * 1024, keep_end=True))
    timed_out = False
    try:
        if proc.stdin is not None:
            try:
                proc.stdin.write(stdin)
                await proc.stdin.drain()
                proc.stdin.close()
            except (BrokenPipeError, ConnectionResetError):
                pass  # a program that never reads its input
        try:
            await asyncio.wait_for(proc.wait(), timeout_s)
        except asyncio.TimeoutError:
            timed_out = True
            _kill_group(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 1.0)
            except asyncio.TimeoutError:
                pass
    finally:
        _kill_group(proc.pid, signal.SIGKILL)  # the program's leftovers (and it, if cancelled)
        if proc.returncode is None:
            await proc.wait()
    # A child that left the group (its own session) may hold the pipes open: wait a little.
    _, late = await asyncio.wait({out, err}, timeout=5.0)
    for job in late:
        job.cancel()
    stdout = out.result() if out.done() and not out.cancelled() else ""
    stderr = err.result() if err.done() and not err.cancelled() else ""
    return ProgramResult(proc.returncode, stdout, stderr, timed_out, time.perf_counter() - t0)
