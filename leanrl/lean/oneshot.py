"""One-shot mode: one ``lean`` run per attempt, for users without a REPL build.

Each attempt costs two Lean processes, and the rules are the same as in REPL mode:

1. ``lean -o Attempt.olean Attempt.lean`` elaborates header + preamble + statement + proof and
   writes the compiled module; Lean's messages come from ``--json`` where the installed Lean
   supports it, else from the plain ``file:line:col: severity: message`` output.
2. ``lean Check.lean`` runs in a second, fresh process whose file the model never touched: the
   header's imports, the trusted checker, the header's options, the reference statement with
   ``sorry``, and ``#eval LeanrlCheck.run "<Attempt.olean>" ...``. The checker reads the attempt's
   constants from the ``.olean`` as data, so nothing the attempt declared (macros, notation,
   ``#exit``, options, printed text) can reach the check, which reports with a per-check nonce.

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
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from leanrl.lean.checker import (
    CHECK_TAG,
    assemble,
    check_command,
    checker_source,
    parse_report,
    reference_command,
    split_header,
)
from leanrl.lean.judge import judge_prescan, judge_report
from leanrl.lean.messages import cut_tagged, parse_json_output, parse_plain_output, shift
from leanrl.lean.protocol import ReplMessage, ReplPos
from leanrl.lean.repl import _limit_memory, bwrap_prefix
from leanrl.verdict import Attempt, Message, Reason, Verdict

__all__ = ["OneShotChecker"]


class _Run:
    def __init__(self, code: int | None, out: str, timed_out: bool) -> None:
        self.code = code
        self.out = out
        self.timed_out = timed_out


class OneShotChecker:
    """Checks attempts with fresh ``lean`` processes (``workers`` at a time)."""

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
    ) -> None:
        self.lean = list(lean)
        self.env = env
        self.cwd = cwd
        self.workers = workers
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.isolate = isolate
        self.json_output = json_output
        self._sem: asyncio.Semaphore | None = None

    async def start(self) -> None:
        """Find out whether this Lean prints ``--json`` messages."""
        self._sem = asyncio.Semaphore(self.workers)
        if self.json_output is None:
            r = await self._run([*self.lean, "--help"], 30.0, None)
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
            v = judge_prescan(attempt)
            if v is None:
                assert self._sem is not None
                async with self._sem:
                    v = await self._check(attempt)
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
        work = Path(tempfile.mkdtemp(prefix="leanrl-oneshot-"))
        try:
            src, olean = work / "Attempt.lean", work / "Attempt.olean"
            src.write_text(head + asm.text, encoding="utf-8")
            r = await self._lean(src, ["-o", str(olean)], deadline, work)
            if r.timed_out:
                return Verdict.reject(
                    Reason.TIMEOUT, f"time limit of {self.timeout_s:g} s exceeded"
                )
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
            if not olean.is_file():
                return Verdict.reject(
                    Reason.INFRA, "Lean wrote no .olean for the attempt", messages=messages
                )
            nonce = secrets.token_hex(16)
            check_src = work / "Check.lean"
            check_src.write_text(
                "\n".join(imports)
                + "\n\n"
                + checker_source()
                + "\n\n"
                + (rest + "\n\n" if rest.strip() else "")
                + reference_command(attempt.formal_statement)
                + "\n"
                + check_command(
                    str(olean),
                    attempt.name,
                    nonce,
                    olean=True,
                    replay=attempt.policy.kernel_replay,
                ),
                encoding="utf-8",
            )
            r2 = await self._lean(check_src, [], deadline, work)
            if r2.timed_out:
                return Verdict.reject(
                    Reason.TIMEOUT, f"time limit of {self.timeout_s:g} s exceeded"
                )
            repl_like = self._check_messages(r2.out, check_src.name)
            return judge_report(attempt, parse_report(repl_like, nonce), messages)
        finally:
            shutil.rmtree(work, ignore_errors=True)

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
                f"Lean died (signal {-code}), most likely at its memory cap of {self.memory_mb} MiB",
                messages=messages,
            )
        return Verdict.reject(Reason.CRASH, f"Lean died (signal {-code})", messages=messages)

    async def _lean(self, src: Path, extra: list[str], deadline: float, work: Path) -> _Run:
        argv = [*self.lean, *(["--json"] if self.json_output else []), *extra, str(src)]
        if self.isolate:
            argv = bwrap_prefix([work]) + argv
        return await self._run(argv, max(0.001, deadline - time.monotonic()), self.memory_mb)

    async def _run(self, argv: list[str], timeout: float, memory_mb: int | None) -> _Run:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            cwd=str(self.cwd) if self.cwd else None,
            env=self.env,
            start_new_session=True,
            preexec_fn=(lambda: _limit_memory(memory_mb)) if memory_mb else None,
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout)
        except asyncio.TimeoutError:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(asyncio.TimeoutError, ProcessLookupError):
                await asyncio.wait_for(proc.wait(), 5.0)
            return _Run(None, "", True)
        text = out.decode("utf-8", errors="replace")
        if re.search(r"out of memory|std::bad_alloc", text, re.IGNORECASE) and memory_mb:
            return _Run(-signal.SIGKILL, text, False)
        return _Run(proc.returncode, text, False)

    async def close(self) -> None:
        """Nothing persistent to stop."""


def _as_repl(m: Message) -> ReplMessage:
    pos = ReplPos(line=m.pos.line, column=m.pos.column) if m.pos else None
    return ReplMessage(severity=m.severity, data=m.data, pos=pos)
