"""The verification policy as pure functions: Lean's answers in, a :class:`~leanrl.Verdict` out.

Every rule of :class:`~leanrl.VerificationPolicy` is decided here, from three inputs that the
runtimes collect in order:

1. the pre-scan of the model's text (:func:`leanrl.lean.forbidden.scan`), before Lean runs;
2. Lean's answer to elaborating the attempt (errors, ``sorries``);
3. the trusted checker's report (:class:`~leanrl.lean.checker.CheckReport`), produced in a clean
   environment after the attempt.

Nothing here depends on the wording of Lean's messages: errors are recognised by severity, sorries
by the REPL's structured ``sorries`` list and by the ``sorryAx`` axiom, native code by the axioms
it leaves behind. Keeping this pure makes every rule testable without Lean.
"""

from __future__ import annotations

from leanrl.lean.checker import Assembled, CheckReport, model_text
from leanrl.lean.forbidden import scan
from leanrl.lean.messages import from_repl
from leanrl.lean.protocol import CommandResponse, ReplError
from leanrl.verdict import Attempt, Message, Reason, Verdict

__all__ = [
    "NATIVE_AXIOMS",
    "SORRY_AXIOM",
    "judge_elaboration",
    "judge_prescan",
    "judge_report",
]

SORRY_AXIOM = "sorryAx"
#: Axioms that mean "trust the compiler": `native_decide` and `Lean.ofReduceBool` leave these.
NATIVE_AXIOMS = frozenset({"Lean.ofReduceBool", "Lean.ofReduceNat", "Lean.trustCompiler"})

_STATEMENT = {"missing", "wrong_kind", "type_mismatch", "helper_mismatch"}
_TAMPER = {"missing_dependency", "replay_failed"}
_PRIORITY = [Reason.FORBIDDEN, Reason.AXIOM, Reason.NATIVE, Reason.SORRY]


def judge_prescan(attempt: Attempt) -> Verdict | None:
    """Reject before Lean runs: empty proof, or a forbidden construct in the model's text."""
    if not attempt.proof.strip():
        return Verdict.reject(Reason.NO_PROOF, "the proof is empty", id=attempt.id)
    if not attempt.policy.forbid_tokens:
        return None
    findings = scan(model_text(attempt), attempt.policy)
    if not findings:
        return None
    findings.sort(key=lambda f: _PRIORITY.index(f.reason))
    f = findings[0]
    return Verdict.reject(
        f.reason,
        f"pre-scan: `{f.token}` is not allowed in a proof: {f.why}",
        id=attempt.id,
    )


def judge_elaboration(
    attempt: Attempt, assembled: Assembled, answer: CommandResponse | ReplError
) -> tuple[Verdict | None, tuple[Message, ...]]:
    """Reject on Lean errors or sorries in the model's text; return the messages either way."""
    if isinstance(answer, ReplError):
        msg = Message(severity="error", data=answer.message)
        return Verdict.reject(
            Reason.ERROR, f"Lean error: {_first_line(answer.message)}", messages=(msg,)
        ), (msg,)
    messages = from_repl(answer.messages)
    errors = [m for m in messages if m.severity == "error"]
    if errors:
        e = errors[0]
        where = f" at line {e.pos.line}:{e.pos.column}" if e.pos else ""
        return Verdict.reject(
            Reason.ERROR, f"Lean error{where}: {_first_line(e.data)}", messages=messages
        ), messages
    # The statement's own `sorry`s (PutnamBench answer placeholders) are not the model's.
    own = [s for s in answer.sorries if s.pos is None or not assembled.in_statement(s.pos.line)]
    if own:
        s = own[0]
        where = f" at line {s.pos.line}:{s.pos.column}" if s.pos else ""
        return Verdict.reject(
            Reason.SORRY, f"the proof contains `sorry`{where}", messages=messages
        ), messages
    return None, messages


def judge_report(
    attempt: Attempt, report: CheckReport | str, messages: tuple[Message, ...] = ()
) -> Verdict:
    """Apply the statement, axiom, native-code and replay rules to the checker's report."""
    policy = attempt.policy
    if isinstance(report, str):
        return Verdict.reject(Reason.INFRA, report, messages=messages)
    axioms = tuple(report.axioms)
    kw: dict[str, object] = {"messages": messages, "axioms": axioms}
    if report.status in _STATEMENT:
        return Verdict.reject(
            Reason.STATEMENT_CHANGED,
            f"statement check failed ({report.status}): {report.detail}",
            **kw,
        )
    if report.status in _TAMPER:
        return Verdict.reject(
            Reason.FORBIDDEN,
            f"environment check failed ({report.status}): {report.detail}",
            **kw,
        )
    if report.status != "ok":
        return Verdict.reject(Reason.INFRA, f"checker: {report.status}: {report.detail}", **kw)
    if report.kind != report.ref_kind:  # the checker says ok only when they agree; be sure
        return Verdict.reject(Reason.STATEMENT_CHANGED, f"{attempt.name} is a {report.kind}", **kw)
    if SORRY_AXIOM in axioms:
        return Verdict.reject(Reason.SORRY, "depends on `sorry` (sorryAx)", **kw)
    native = [a for a in axioms if a in NATIVE_AXIOMS]
    if native and not policy.allow_native_decide:
        return Verdict.reject(
            Reason.NATIVE,
            f"trusts compiled code ({', '.join(native)}); the policy does not allow it",
            **kw,
        )
    allowed = set(policy.allowed_axioms) | (NATIVE_AXIOMS if policy.allow_native_decide else set())
    allowed.discard(SORRY_AXIOM)
    extra = [a for a in axioms if a not in allowed]
    if extra:
        return Verdict.reject(
            Reason.AXIOM, f"depends on axioms outside the allowed set: {', '.join(extra)}", **kw
        )
    if policy.kernel_replay and not report.replayed:
        return Verdict.reject(Reason.INFRA, "kernel replay was requested but did not run", **kw)
    return Verdict(accepted=True, reason=Reason.OK, detail="", messages=messages, axioms=axioms)


def _first_line(s: str) -> str:
    line = s.strip().splitlines()[0] if s.strip() else ""
    return line[:300]
