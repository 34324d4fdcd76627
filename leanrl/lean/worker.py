"""A warm REPL process for one header, and the check of one attempt in it.

Start-up (once per process)::

    {"cmd": "import Lean\\nimport Mathlib"}                  -> E_imp  (the header's imports)
    {"cmd": <LeanrlCheck.lean>, "env": E_imp}                -> E_chk  (trusted checker)
    {"cmd": <header rest: options, open>, "env": E_imp}      -> env0   (where attempts run)
    {"cmd": <header rest>, "env": E_chk}                     -> envC   (clean, for checks)

Per attempt::

    {"cmd": preamble + statement + proof, "env": env0}       -> envK, messages, sorries
    {"pickleTo": "<scratch>/<nonce>.olean", "env": envK}
    {"cmd": statement + " sorry", "env": envC}               -> envR   (once per statement)
    {"cmd": "#eval LeanrlCheck.run ... <nonce>", "env": envR} -> one tagged report

The check command is parsed and run in ``envR``, which descends from ``envC`` and never saw the
attempt: the attempt's macros, notations, options and elaborators do not exist there, and its
constants are only read from the pickle file as data. A fresh random nonce per check is echoed in
the report, and the report must be the only tagged message of the check step's own answer.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from pathlib import Path

from leanrl.lean.checker import (
    assemble,
    check_command,
    checker_source,
    parse_report,
    reference_command,
    split_header,
)
from leanrl.lean.judge import judge_elaboration, judge_report
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
from leanrl.lean.tactic_input import as_one_tactic, relocate_positions
from leanrl.runtime import TacticState
from leanrl.verdict import Attempt, Reason, Verdict

__all__ = ["ReplWorker", "WorkerStartError"]


class WorkerStartError(RuntimeError):
    """A process could not be warmed up. ``header_fault`` is True when the header itself does
    not elaborate (retrying will not help), False for process-level trouble."""

    def __init__(self, detail: str, *, header_fault: bool) -> None:
        super().__init__(detail)
        self.detail = detail
        self.header_fault = header_fault


class ReplWorker:
    """One REPL process, warmed for one set of imports (header variants share it)."""

    def __init__(self, proc: ReplProcess, imports: tuple[str, ...], scratch: Path) -> None:
        self.proc = proc
        self.imports = imports
        self.scratch = scratch
        self.attempts = 0
        self._e_imp = -1
        self._e_chk = -1
        self._headers: dict[str, tuple[int, int]] = {}
        self._refs: dict[tuple[str, str], int] = {}

    async def start(self, timeout: float) -> None:
        """Spawn and load the imports (the expensive part: ``import Mathlib``) and the checker."""
        deadline = time.monotonic() + timeout
        try:
            await self.proc.start()
            self._e_imp = await self._cmd("\n".join(self.imports), None, deadline, "the imports")
            self._e_chk = await self._cmd(
                checker_source(), self._e_imp, deadline, "leanrl's checker", header_fault=False
            )
        except (ProtocolError, OSError, RuntimeError) as e:
            if isinstance(e, WorkerStartError):
                raise
            raise WorkerStartError(f"the Lean REPL did not start: {e}", header_fault=False) from e

    async def _envs(self, header_rest: str, deadline: float) -> tuple[int, int]:
        """(env0, envC) for a header's non-import part, elaborated once per process."""
        if header_rest not in self._headers:
            if header_rest.strip():
                env0 = await self._cmd(header_rest, self._e_imp, deadline, "the header")
                env_c = await self._cmd(header_rest, self._e_chk, deadline, "the header")
            else:
                env0, env_c = self._e_imp, self._e_chk
            self._headers[header_rest] = (env0, env_c)
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

    async def check(self, attempt: Attempt, timeout: float) -> Verdict:
        """Elaborate the attempt, then run the trusted check. Process failures propagate."""
        deadline = time.monotonic() + timeout
        self.attempts += 1
        try:
            env0, env_c = await self._envs(split_header(attempt.header)[1], deadline)
        except WorkerStartError as e:
            if not e.header_fault:
                raise ProtocolError(e.detail) from e
            return Verdict.reject(Reason.ERROR, f"taskset header problem: {e.detail}")
        asm = assemble(attempt)
        ans = await self._ask(CommandRequest(cmd=asm.text, env=env0), deadline)
        if isinstance(ans, TacticResponse):
            raise ProtocolError("the REPL answered a command with a proof state")
        verdict, messages = judge_elaboration(attempt, asm, ans)
        if verdict is not None:
            return verdict
        assert isinstance(ans, CommandResponse)
        nonce = secrets.token_hex(16)
        path = self.scratch / f"{nonce}.olean"
        try:
            pick = await self._ask(PickleEnvRequest(pickleTo=str(path), env=ans.env), deadline)
            if isinstance(pick, ReplError):
                return Verdict.reject(
                    Reason.INFRA, f"pickling the attempt failed: {pick.message}", messages=messages
                )
            env_ref = await self._reference(attempt.formal_statement, env_c, deadline)
            if isinstance(env_ref, str):
                return Verdict.reject(Reason.ERROR, env_ref, messages=messages)
            cmd = check_command(
                str(path), attempt.name, nonce, olean=False, replay=attempt.policy.kernel_replay
            )
            rep = await self._ask(CommandRequest(cmd=cmd, env=env_ref), deadline)
        finally:
            with contextlib.suppress(OSError):
                path.unlink()
        if isinstance(rep, ReplError):
            return judge_report(attempt, f"the trusted check failed: {rep.message}", messages)
        if not isinstance(rep, CommandResponse):
            raise ProtocolError("the REPL answered the check with a proof state")
        return judge_report(attempt, parse_report(rep.messages, nonce), messages)

    async def _reference(self, statement: str, env_c: int, deadline: float) -> int | str:
        """The clean environment holding the reference statement (cached per statement)."""
        key = (statement, str(env_c))
        if key in self._refs:
            return self._refs[key]
        ans = await self._ask(CommandRequest(cmd=reference_command(statement), env=env_c), deadline)
        if isinstance(ans, ReplError):
            return f"the reference statement could not be elaborated: {ans.message}"
        if not isinstance(ans, CommandResponse):
            raise ProtocolError("unexpected answer to the reference statement")
        if ans.errors:
            return (
                "the reference statement itself does not elaborate in a clean environment "
                f"(a taskset problem): {ans.errors[0].data[:300]}"
            )
        self._refs[key] = ans.env
        return ans.env

    # -- tactic mode ----------------------------------------------------------------------------

    async def tactic_start(
        self, header: str, formal_statement: str, preamble: str, timeout: float
    ) -> TacticState:
        """Elaborate the statement with a ``sorry`` hole; return the hole's proof state."""
        deadline = time.monotonic() + timeout
        self.attempts += 1  # a proof started counts towards ``recycle_after`` like a check
        try:
            env0, _ = await self._envs(split_header(header)[1], deadline)
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
        """Stop the process."""
        await self.proc.close()


def _left(deadline: float) -> float:
    return max(0.001, deadline - time.monotonic())
