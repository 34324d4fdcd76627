"""A warm REPL process that elaborates attempts (or runs tactic sessions) for one set of imports.

This process runs model text, so nothing it says can accept a proof. It is started with the
header's imports only -- never the trusted checker -- and per attempt::

    {"cmd": <header rest: options, open>, "env": E_imp}      -> env0  (once per header)
    {"cmd": preamble + statement + proof, "env": env0}       -> envK, messages, sorries
    {"pickleTo": "<its private folder>/attempt.olean", "env": envK}

Its errors and ``sorries`` can reject the attempt at once (a clean answer proves nothing: the
attempt's code may have written it). The pickle is then handed, as data, to a judge process
(:mod:`leanrl.lean.trust.judge`), which alone can accept.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from leanrl.lean.messages import from_repl
from leanrl.lean.protocol import (
    CommandRequest,
    CommandResponse,
    PickleEnvRequest,
    ProtocolError,
    ReplError,
    Request,
    Response,
    TacticRequest,
    TacticResponse,
)
from leanrl.lean.repl import ReplProcess
from leanrl.lean.source import assemble, split_header
from leanrl.lean.tactic_input import as_one_tactic, relocate_positions
from leanrl.lean.trust.rules import judge_elaboration
from leanrl.runtime import TacticState
from leanrl.verdict import Attempt, Message, Reason, Verdict

__all__ = ["Elaboration", "ReplWorker", "WorkerStartError"]

PICKLE_NAME = "attempt.olean"


class WorkerStartError(RuntimeError):
    """A process could not be warmed up. ``header_fault`` is True when the header itself does
    not elaborate (retrying will not help), False for process-level trouble."""

    def __init__(self, detail: str, *, header_fault: bool) -> None:
        super().__init__(detail)
        self.detail = detail
        self.header_fault = header_fault


@dataclass(frozen=True)
class Elaboration:
    """What elaborating one attempt gave: a rejection, or the pickle for the judge."""

    verdict: Verdict | None
    """A rejection decided from the elaborating process's own answer (errors, sorries)."""
    messages: tuple[Message, ...]
    """Lean's messages about the attempt (for the verdict; they decide nothing else)."""
    pickle: Path | None
    """Where the process wrote the attempt's environment (inside its private folder)."""


class ReplWorker:
    """One REPL process, warmed for one set of imports (header variants share it). It
    elaborates model text and never checks anything."""

    def __init__(self, proc: ReplProcess, imports: tuple[str, ...], folder: Path) -> None:
        self.proc = proc
        self.imports = imports
        self.folder = folder
        self.attempts = 0
        self._e_imp = -1
        self._headers: dict[str, int] = {}

    async def start(self, timeout: float) -> None:
        """Spawn and load the imports (the expensive part: ``import Mathlib``)."""
        deadline = time.monotonic() + timeout
        try:
            await self.proc.start()
            self._e_imp = await self._cmd("\n".join(self.imports), None, deadline, "the imports")
            self.proc.mark_spine()
        except (ProtocolError, OSError, RuntimeError) as e:
            if isinstance(e, WorkerStartError):
                raise
            raise WorkerStartError(f"the Lean REPL did not start: {e}", header_fault=False) from e

    async def _env0(self, header_rest: str, deadline: float) -> int:
        """The environment attempts under this header run in (elaborated once per process)."""
        if header_rest not in self._headers:
            self._headers[header_rest] = (
                await self._cmd(header_rest, self._e_imp, deadline, "the header")
                if header_rest.strip()
                else self._e_imp
            )
        return self._headers[header_rest]

    async def _cmd(
        self, text: str, env: int | None, deadline: float, what: str, header_fault: bool = True
    ) -> int:
        ans = await self.proc.request(CommandRequest(cmd=text, env=env), _left(deadline))
        if isinstance(ans, ReplError):
            raise WorkerStartError(
                f"loading {what} failed: {ans.message}", header_fault=header_fault
            )
        if not isinstance(ans, CommandResponse):
            raise WorkerStartError(f"unexpected answer while loading {what}", header_fault=False)
        if ans.errors:
            e = ans.errors[0]
            line = f" (line {e.pos.line})" if e.pos else ""
            raise WorkerStartError(
                f"{what} does not elaborate{line}: {e.data[:500]}", header_fault=header_fault
            )
        return ans.env

    async def _ask(self, req: Request, deadline: float) -> Response:
        return await self.proc.request(req, _left(deadline))

    async def elaborate(self, attempt: Attempt, timeout: float) -> Elaboration:
        """Elaborate the attempt and pickle its environment. Process failures propagate."""
        deadline = time.monotonic() + timeout
        self.attempts += 1
        path = self.folder / PICKLE_NAME
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # whatever an earlier attempt's code left there
        try:
            env0 = await self._env0(split_header(attempt.header)[1], deadline)
        except WorkerStartError as e:
            if not e.header_fault:
                raise ProtocolError(e.detail) from e
            bad = Verdict.reject(Reason.ERROR, f"taskset header problem: {e.detail}")
            return Elaboration(bad, (), None)
        asm = assemble(attempt)
        ans = await self.proc.request(CommandRequest(cmd=asm.text, env=env0), _left(deadline))
        if isinstance(ans, TacticResponse):
            raise ProtocolError("the REPL answered a command with a proof state")
        verdict, messages = judge_elaboration(attempt, asm, ans)
        if verdict is not None:
            return Elaboration(verdict, messages, None)
        assert isinstance(ans, CommandResponse)
        pick = await self.proc.request(
            PickleEnvRequest(pickleTo=str(path), env=ans.env), _left(deadline)
        )
        if isinstance(pick, ReplError):
            failed = Verdict.reject(
                Reason.INFRA, f"pickling the attempt failed: {pick.message}", messages=messages
            )
            return Elaboration(failed, messages, None)
        if not isinstance(pick, CommandResponse):
            raise ProtocolError("the REPL answered a pickle request with a proof state")
        return Elaboration(None, messages, path)

    def end_attempt(self) -> int:
        """Kill whatever the attempt's code started (see :meth:`ReplProcess.kill_strays`)."""
        return self.proc.kill_strays()

    # -- tactic mode ----------------------------------------------------------------------------

    async def tactic_start(
        self, header: str, formal_statement: str, preamble: str, timeout: float
    ) -> TacticState:
        """Elaborate the statement with a ``sorry`` hole; return the hole's proof state."""
        deadline = time.monotonic() + timeout
        self.attempts += 1  # a proof started counts towards ``recycle_after`` like a check
        try:
            env0 = await self._env0(split_header(header)[1], deadline)
        except WorkerStartError as e:
            if not e.header_fault:
                raise ProtocolError(e.detail) from e
            return TacticState(proof_state=None, error=e.detail)
        pre = preamble.rstrip() + "\n\n" if preamble.strip() else ""
        text = f"{pre}{formal_statement.rstrip()}\n  sorry\n"
        ans = await self._ask(CommandRequest(cmd=text, env=env0), deadline)
        if isinstance(ans, ReplError):
            return TacticState(proof_state=None, error=ans.message)
        if not isinstance(ans, CommandResponse):
            raise ProtocolError("unexpected answer to a tactic-mode start")
        messages = from_repl(ans.messages)
        if ans.errors:
            return TacticState(proof_state=None, messages=messages, error=ans.errors[0].data)
        holes = [s for s in ans.sorries if s.proof_state is not None]
        if not holes:
            return TacticState(proof_state=None, messages=messages, error="no goal to work on")
        # Our `sorry` is the last one in the text.
        hole = max(holes, key=lambda s: (s.pos.line, s.pos.column) if s.pos else (0, 0))
        return TacticState(proof_state=hole.proof_state, goals=(hole.goal,), messages=messages)

    async def tactic_apply(self, proof_state: int, tactic: str, timeout: float) -> TacticState:
        """Run a tactic block on a proof state (several tactics go as one ``(tacticSeq)``)."""
        deadline = time.monotonic() + timeout
        one = as_one_tactic(tactic)
        if not one:
            return TacticState(
                proof_state=None, error="no tactic to run (only blank lines or comments)"
            )
        ans = await self._ask(TacticRequest(tactic=one, proofState=proof_state), deadline)
        if isinstance(ans, ReplError):
            return TacticState(proof_state=None, error=relocate_positions(ans.message, tactic))
        if not isinstance(ans, TacticResponse):
            raise ProtocolError("the REPL answered a tactic with an environment")
        messages = from_repl(ans.messages)
        errors = [m for m in messages if m.severity == "error"]
        if errors:
            return TacticState(
                proof_state=None, goals=ans.goals, messages=messages, error=errors[0].data
            )
        status = ans.proof_status or ""
        if not ans.goals and status and not status.startswith("Completed"):
            # No goals left, but the proof is not sound (sorry, metavariables, kernel error).
            return TacticState(proof_state=None, messages=messages, error=status)
        return TacticState(proof_state=ans.proof_state, goals=ans.goals, messages=messages)

    async def close(self) -> None:
        """Stop the process and remove its folder."""
        await self.proc.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def _left(deadline: float) -> float:
    return max(0.001, deadline - time.monotonic())
