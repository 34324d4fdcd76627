"""One-shot mode: fresh ``lean`` processes per attempt, for users without a REPL build.

Each attempt costs two Lean processes, and the rules are the same as in REPL mode:

1. ``lean -o Attempt.olean Attempt.lean`` elaborates header + preamble + statement + proof in the
   attempt's own private folder and writes the compiled module. Its messages (from ``--json``
   where the installed Lean supports it, else the plain ``file:line:col: severity: message``
   output) can only reject. Its whole process group is killed as soon as it exits, so nothing
   it started can touch the ``.olean`` afterwards.
   Both steps share the attempt's time limit (the check gets at least a few seconds).
2. The ``.olean`` is copied, as data, into a judge folder made only now (:func:`take_pickle`),
   and ``lean Check.lean`` runs there in a second, fresh process whose file the model never
   touched: the header's imports, the trusted checker, the header's options, the reference
   statement with ``sorry``, and ``#eval LeanrlCheck.run "<copy>" ...`` with a nonce made after
   step 1. The checker reads the constants as data and replays them through the kernel; only this
   process's output is read for the report.

What it guarantees: the same statement/axiom/native/replay rules as REPL mode, decided from the
compiled constants. It is slower (the header is loaded twice per attempt).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import shutil
import signal
import time
from collections.abc import Sequence
from pathlib import Path

from leanrl.lean.messages import cut_tagged, parse_json_output, parse_plain_output, shift
from leanrl.lean.protocol import ReplMessage, ReplPos
from leanrl.lean.source import assemble, split_header
from leanrl.lean.trust.containment import (
    ScratchRoot,
    bwrap_argv,
    child_setup,
    kill_group,
    minimal_env,
    process_needs,
)
from leanrl.lean.trust.judge import CHECK_FLOOR_S, take_pickle
from leanrl.lean.trust.report import (
    CHECK_TAG,
    check_command,
    check_file_command,
    checker_source,
    parse_report,
    reference_command,
)
from leanrl.lean.trust.rules import judge_prescan, judge_report
from leanrl.verdict import Attempt, Message, Reason, Verdict

__all__ = ["OneShotChecker"]


class _Run:
    def __init__(self, code: int | None, out: str, timed_out: bool, flooded: bool = False) -> None:
        self.code = code
        self.out = out
        self.timed_out = timed_out
        self.flooded = flooded


_DIED = "Lean died (signal "
"""How the detail of a verdict for a Lean killed by a signal starts (see ``crash_retries``)."""


class OneShotChecker:
    """Checks attempts with fresh ``lean`` processes (``workers`` attempts at a time)."""

    def __init__(
        self,
        lean: Sequence[str],
        *,
        cwd: Path | None = None,
        workers: int = 1,
        timeout_s: float = 60.0,
        memory_mb: int | None = None,
        isolate: bool = False,
        json_output: bool | None = None,
        env: dict[str, str] | None = None,
        max_output_mb: float = 64.0,
        max_olean_mb: int = 1024,
        scratch_parent: Path | None = None,
        crash_retries: int = 1,
    ) -> None:
        self.lean = list(lean)
        self.crash_retries = crash_retries
        """Runs again of an attempt whose Lean died of a signal (as ``PoolConfig.crash_retries``:
        a kill from outside is not the attempt's answer; a death that repeats is)."""
        self.env = env
        self.cwd = cwd
        self.workers = workers
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.isolate = isolate
        self.json_output = json_output
        self.max_output_bytes = int(max_output_mb * 1024 * 1024)
        self.max_olean_bytes = max_olean_mb << 20
        self._root = ScratchRoot("oneshot", scratch_parent)
        self._sem: asyncio.Semaphore | None = None

    async def start(self) -> None:
        """Make the scratch root; find out whether this Lean prints ``--json`` messages."""
        self._sem = asyncio.Semaphore(self.workers)
        await asyncio.to_thread(self._root.create)
        if self.json_output is None:
            home = self._root.folder("probe")
            r = await self._run([*self.lean, "--help"], 30.0, None, home)
            self.json_output = "--json" in r.out

    async def check(self, attempts: Sequence[Attempt]) -> list[Verdict]:
        """One verdict per attempt, in order."""
        if self._sem is None:
            await self.start()
        return list(await asyncio.gather(*(self.check_one(a) for a in attempts)))

    async def check_one(self, attempt: Attempt) -> Verdict:
        """Check one attempt; never raises for anything the attempt or Lean did."""
        t0 = time.monotonic()
        try:
            v = await asyncio.to_thread(judge_prescan, attempt)
            if v is None:
                assert self._sem is not None
                async with self._sem:
                    runs = 0
                    while True:
                        v = await self._check(attempt)
                        runs += 1
                        if not v.detail.startswith(_DIED) or runs > self.crash_retries:
                            break
                    if runs > 1 and v.detail.startswith(_DIED):
                        v = v.model_copy(update={"detail": f"{v.detail} ({runs} runs)"})
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - an attempt must always get a verdict
            v = Verdict.reject(Reason.INFRA, f"internal error: {type(e).__name__}: {e}")
        return v.model_copy(update={"id": attempt.id, "time_s": time.monotonic() - t0})

    async def _check(self, attempt: Attempt) -> Verdict:
        deadline = time.monotonic() + self.timeout_s
        imports, rest = split_header(attempt.header)
        asm = assemble(attempt)
        head = "\n".join(imports) + "\n" + (rest + "\n" if rest.strip() else "")
        offset = head.count("\n")
        work = self._root.folder("attempt")
        judge_dir: Path | None = None
        try:
            src, olean = work / "Attempt.lean", work / "Attempt.olean"
            src.write_text(head + asm.text, encoding="utf-8")
            r = await self._lean(src, ["-o", str(olean)], self.timeout_s, work)
            if r.timed_out:
                return Verdict.reject(
                    Reason.TIMEOUT, f"time limit of {self.timeout_s:g} s exceeded"
                )
            if r.flooded:
                return Verdict.reject(Reason.MEMORY, "Lean printed more than its output cap")
            messages = shift(self._messages(r.out, src.name), offset)
            errors = [m for m in messages if m.severity == "error"]
            if r.code is not None and r.code < 0:
                return self._died(r.code, messages)
            if errors or r.code != 0:
                e = errors[0] if errors else Message(severity="error", data=r.out[-300:])
                where = f" at line {e.pos.line}:{e.pos.column}" if e.pos else ""
                first = e.data.strip().splitlines()[0] if e.data.strip() else "Lean failed"
                return Verdict.reject(
                    Reason.ERROR, f"Lean error{where}: {first}", messages=messages
                )
            # The attempt's process group is dead (see _run): nothing writes the .olean now.
            judge_dir = self._root.folder("judge")
            copy = await asyncio.to_thread(take_pickle, olean, judge_dir, self.max_olean_bytes)
            if not isinstance(copy, Path):
                return Verdict.reject(Reason.CRASH, copy, messages=messages)
            nonce = secrets.token_hex(16)
            check_src = judge_dir / "Check.lean"
            check_src.write_text(
                "\n".join(imports)
                + "\n\n"
                + checker_source()
                + "\n\n"
                + (rest + "\n\n" if rest.strip() else "")
                + _check_text(attempt, str(copy), nonce),
                encoding="utf-8",
            )
            left = max(deadline - time.monotonic(), CHECK_FLOOR_S)
            r2 = await self._lean(check_src, [], left, judge_dir)
            if r2.timed_out:
                return Verdict.reject(
                    Reason.TIMEOUT,
                    f"time limit of {self.timeout_s:g} s exceeded in the trusted check",
                    messages=messages,
                )
            if r2.flooded:
                return Verdict.reject(
                    Reason.MEMORY, "the trusted check printed more than its output cap"
                )
            repl_like = self._check_messages(r2.out, check_src.name)
            return judge_report(attempt, parse_report(repl_like, nonce), messages)
        finally:
            shutil.rmtree(work, ignore_errors=True)
            if judge_dir is not None:
                shutil.rmtree(judge_dir, ignore_errors=True)

    def _messages(self, out: str, file_name: str) -> tuple[Message, ...]:
        if self.json_output:
            msgs = parse_json_output(out)
            if msgs or not out.strip():
                return msgs
        return parse_plain_output(out, file_name)

    def _check_messages(self, out: str, file_name: str) -> list[ReplMessage]:
        """The check step's errors and tagged reports (nothing else in Check.lean may speak).

        With ``--json`` every message is a whole object, so the report is one message's data.
        Plain output from older Lean prints the report (an info message) without a position
        and without a newline before it, so it can be glued to the previous message's text or
        stand alone where the plain parser would take it for an error: there the report is cut
        out of the raw output wherever it is (it carries the check's nonce), and only the rest
        is parsed for errors.
        """
        if self.json_output:
            msgs = parse_json_output(out)
            if msgs or not out.strip():
                return [
                    _as_repl(m)
                    for m in msgs
                    if m.severity == "error" or m.data.startswith(CHECK_TAG)
                ]
        reports, rest = cut_tagged(out, CHECK_TAG)
        errors = [_as_repl(m) for m in parse_plain_output(rest, file_name) if m.severity == "error"]
        return errors + [ReplMessage(severity="info", data=r) for r in reports]

    def _died(self, code: int, messages: tuple[Message, ...]) -> Verdict:
        if code in (-signal.SIGKILL, -signal.SIGSEGV, -signal.SIGABRT) and self.memory_mb:
            return Verdict.reject(
                Reason.MEMORY,
                f"{_DIED}{-code}), most likely at its memory cap of {self.memory_mb} MiB",
                messages=messages,
            )
        return Verdict.reject(Reason.CRASH, f"{_DIED}{-code})", messages=messages)

    async def _lean(self, src: Path, extra: list[str], timeout: float, folder: Path) -> _Run:
        argv = [*self.lean, *(["--json"] if self.json_output else []), *extra, str(src)]
        if self.isolate:
            assert self._root.path is not None
            env = self.env if self.env is not None else os.environ
            needs = process_needs(self.lean, self.cwd, env)
            argv = bwrap_argv([folder], hide=[self._root.path], needs=needs) + argv
        return await self._run(argv, timeout, self.memory_mb, folder)

    async def _run(
        self, argv: list[str], timeout: float, memory_mb: int | None, home: Path
    ) -> _Run:
        env = minimal_env(self.env if self.env is not None else os.environ, home)
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            cwd=str(self.cwd) if self.cwd else None,
            env=env,
            start_new_session=True,
            preexec_fn=child_setup(memory_mb),
        )
        self._root.register(proc.pid)
        try:
            out, flooded = await asyncio.wait_for(self._read_capped(proc), timeout)
        except asyncio.TimeoutError:
            return _Run(None, "", True)
        finally:
            # Always, not only on timeout: a child it left running could rewrite its output.
            kill_group(proc.pid)
            with contextlib.suppress(asyncio.TimeoutError, ProcessLookupError):
                await asyncio.wait_for(proc.wait(), 5.0)
        text = out.decode("utf-8", errors="replace")
        if flooded:
            return _Run(None, text, False, flooded=True)
        if re.search(r"out of memory|std::bad_alloc", text, re.IGNORECASE) and memory_mb:
            return _Run(-signal.SIGKILL, text, False)
        return _Run(proc.returncode, text, False)

    async def _read_capped(self, proc: asyncio.subprocess.Process) -> tuple[bytes, bool]:
        """The process's output until it exits (True: it passed the cap, reading stopped).

        The exit is watched too: a child that kept the output pipe open after Lean exited
        must not turn a finished run into a timeout.
        """
        assert proc.stdout is not None
        stdout = proc.stdout
        chunks: list[bytes] = []
        size = [0]

        async def read() -> bool:
            while True:
                chunk = await stdout.read(1 << 16)
                if not chunk:
                    return False
                size[0] += len(chunk)
                if size[0] > self.max_output_bytes:
                    return True
                chunks.append(chunk)

        async def exit_code() -> int:
            # Not proc.wait(): it also waits for the pipes, which a leftover child may hold.
            while proc.returncode is None:
                await asyncio.sleep(0.05)
            return proc.returncode

        reader = asyncio.ensure_future(read())
        exited = asyncio.ensure_future(exit_code())
        try:
            done, _ = await asyncio.wait({reader, exited}, return_when=asyncio.FIRST_COMPLETED)
            if reader not in done:
                # Lean has exited but something it started still holds the pipe: kill it now,
                # before it can touch the output files, then take what is left in the pipe.
                kill_group(proc.pid)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(reader), 0.5)
            flooded = reader.done() and reader.result()
            if not flooded:
                await exited
            return b"".join(chunks), flooded
        finally:
            for t in (reader, exited):
                if not t.done():
                    t.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await t

    async def close(self) -> None:
        """Remove the scratch root (every process is dead by the time its attempt returns)."""
        await asyncio.to_thread(self._root.remove)


def _check_text(attempt: Attempt, olean: str, nonce: str) -> str:
    """The end of ``Check.lean``: the reference statement and the check of the attempt's
    theorem, or for a file check (no reference) the check of every constant of the file."""
    replay = attempt.policy.kernel_replay
    if attempt.check == "file":
        return check_file_command(olean, nonce, olean=True, replay=replay)
    return (
        reference_command(attempt.formal_statement)
        + "\n"
        + check_command(olean, attempt.name, nonce, olean=True, replay=replay)
    )


def _as_repl(m: Message) -> ReplMessage:
    pos = ReplPos(line=m.pos.line, column=m.pos.column) if m.pos else None
    return ReplMessage(severity=m.severity, data=m.data, pos=pos)
