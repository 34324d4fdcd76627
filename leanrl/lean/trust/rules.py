"""The verification policy as pure functions: Lean's answers in, a :class:`~leanrl.Verdict` out.

Every rule of :class:`~leanrl.VerificationPolicy` is decided here, from three inputs that the
runtimes collect in order:

1. the pre-scan of the model's text (:mod:`leanrl.lean.trust.syntax`), before Lean runs;
2. the elaborating process's answer (errors, ``sorries``). That process may have run the
   attempt's code, so its answer can only ever *reject*: a clean answer from it proves nothing;
3. the trusted checker's report (:class:`~leanrl.lean.trust.report.CheckReport`), produced by a
   judge process that never ran model text. Only this report can accept.

Nothing here depends on the wording of Lean's messages: errors are recognised by severity, sorries
by the REPL's structured ``sorries`` list and by the ``sorryAx`` axiom, native code by the axioms
the checker classified. Keeping this pure makes every rule testable without Lean.
"""

from __future__ import annotations

from leanrl.lean.messages import from_repl
from leanrl.lean.protocol import CommandResponse, ReplError
from leanrl.lean.source import Assembled, model_text
from leanrl.lean.trust.lexer import MAX_TOKENS, tokenize, too_many_tokens
from leanrl.lean.trust.report import CheckReport
from leanrl.lean.trust.syntax import scan
from leanrl.verdict import Attempt, Message, Reason, Verdict

__all__ = [
    "KERNEL_BUG_SHAPES",
    "NATIVE_AXIOMS",
    "SORRY_AXIOM",
    "judge_elaboration",
    "judge_prescan",
    "judge_report",
]

SORRY_AXIOM = "sorryAx"
#: Axioms of Lean's core that mean "trust the compiler". Recent versions of ``native_decide``
#: leave auxiliary axioms of their own instead; the checker reports those in ``native``.
NATIVE_AXIOMS = frozenset({"Lean.ofReduceBool", "Lean.ofReduceNat", "Lean.trustCompiler"})

#: Shapes of term the checker refuses before the kernel sees them, because they reach kernel
#: soundness bugs of Lean versions leanrl supports: status -> why it is refused.
KERNEL_BUG_SHAPES: dict[str, str] = {
    "free_variable": (
        "a closed declaration never needs a free variable, and the kernel's checks of them have "
        "had holes (lean4#14484)"
    ),
    "metavariable": "a finished declaration never holds a metavariable; the kernel must not see one",
    "loose_bvar": (
        "a closed term never has a loose bound variable; one can make the kernel read a "
        "term other than the one written"
    ),
    "bad_projection": (
        "a projection must name a structure with that many fields; the kernel has accepted "
        "out-of-range and aliased projection indices (lean4#12746, lean4#14631)"
    ),
    "not_safe": (
        "a theorem never needs an unsafe or partial declaration, and the kernel's checks of "
        "them have had holes (lean4#14608, lean4#14609)"
    ),
    "kernel_internal_name": (
        "the kernel keeps `_nested` names for its own auxiliary types; declaring one gives "
        "`False` without an axiom (lean4#14616)"
    ),
    "too_deep": (
        "Lean before v4.21 silently zeroes a term's cached flags past these sizes "
        "(lean4#8554), so the kernel would not see its free variables or universe parameters"
    ),
}
_STATEMENT = {"missing", "wrong_kind", "type_mismatch", "helper_mismatch"}
_TAMPER = {"missing_dependency", "replay_failed"}
_PRIORITY = [Reason.FORBIDDEN, Reason.AXIOM, Reason.NATIVE, Reason.SORRY]


def judge_prescan(attempt: Attempt) -> Verdict | None:
    """Reject before Lean runs: empty or oversized proof, or a construct the pre-scan does not
    allow in the model's text. CPU-bound: call it off the event loop for large batches."""
    if not attempt.proof.strip():
        return Verdict.reject(Reason.NO_PROOF, "the proof is empty", id=attempt.id)
    text = model_text(attempt)
    limit = attempt.policy.max_proof_chars
    if len(text) > limit:
        return Verdict.reject(
            Reason.TOO_LARGE,
            f"the model's text is {len(text):,} characters, over the limit of {limit:,} "
            "(VerificationPolicy.max_proof_chars)",
            id=attempt.id,
        )
    if too_many_tokens(tokenize(text)):
        return Verdict.reject(
            Reason.TOO_LARGE,
            f"the model's text has more than {MAX_TOKENS:,} Lean tokens; the pre-scan reads no "
            "more (leanrl.lean.trust.lexer.MAX_TOKENS; the longest published proof we know has "
            "11,694)",
            id=attempt.id,
        )
    if not attempt.policy.forbid_tokens:
        return None
    findings = scan(text, attempt.policy)
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
    if report.status == "judge_limit":
        return Verdict.reject(
            Reason.JUDGE_LIMIT,
            f"the trusted check went past its bounds: {report.detail}",
            **kw,
        )
    if report.status == "reserved_name":
        return Verdict.reject(
            Reason.FORBIDDEN,
            f"refused by the checker (reserved_name): {report.detail}; names under "
            "`LeanrlCheck` belong to the checker, and a proof never needs one",
            **kw,
        )
    if attempt.check == "file" and report.status in _STATEMENT:
        # A file check has no statement to change. A constant the file shares with the clean
        # environment but declares differently is tampering; the others cannot happen.
        if report.status == "helper_mismatch":
            return Verdict.reject(
                Reason.FORBIDDEN,
                f"environment check failed (helper_mismatch): {report.detail}",
                **kw,
            )
        return Verdict.reject(Reason.INFRA, f"checker: {report.status}: {report.detail}", **kw)
    if report.status in _STATEMENT:
        return Verdict.reject(
            Reason.STATEMENT_CHANGED,
            f"statement check failed ({report.status}): {report.detail}",
            **kw,
        )
    if report.status == "replay_failed" and report.uses_reduce:
        return Verdict.reject(
            Reason.NATIVE,
            "the proof needs compiled code to check (`Lean.reduceBool`/`Lean.reduceNat`, as "
            "`native_decide` used them before Lean's auxiliary-axiom scheme); the clean checker "
            "never runs the attempt's code, so it cannot be replayed: " + report.detail,
            **kw,
        )
    if report.status in KERNEL_BUG_SHAPES:
        return Verdict.reject(
            Reason.FORBIDDEN,
            f"refused before the kernel ({report.status}): {report.detail}; "
            + KERNEL_BUG_SHAPES[report.status],
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
    if (attempt.check == "file") != (report.kind == "file"):
        # A report of the other kind of check (a checker without file checks, or one that
        # checked a file where a theorem was asked for) decides nothing.
        return Verdict.reject(
            Reason.INFRA,
            f"the checker reported a {report.kind!r} check for a {attempt.check} check",
            **kw,
        )
    if report.kind != report.ref_kind:  # the checker says ok only when they agree; be sure
        return Verdict.reject(Reason.STATEMENT_CHANGED, f"{attempt.name} is a {report.kind}", **kw)
    if SORRY_AXIOM in axioms:
        return Verdict.reject(Reason.SORRY, "depends on `sorry` (sorryAx)", **kw)
    if report.inductives and not policy.allow_new_inductives:
        return Verdict.reject(
            Reason.FORBIDDEN,
            f"the proof depends on inductive types it declares ({', '.join(report.inductives)}); "
            "the kernel of this Lean version has known soundness bugs in inductive declarations "
            "(lean4#14576, lean4#14807), so they are refused unless the taskset sets "
            "allow_new_inductives",
            **kw,
        )
    native = sorted(set(report.native) | {a for a in axioms if a in NATIVE_AXIOMS})
    if native and not policy.allow_native_decide:
        return Verdict.reject(
            Reason.NATIVE,
            f"trusts compiled code ({', '.join(native)}); the policy does not allow it",
            **kw,
        )
    # An axiom the attempt declares is refused by what it is, not by its name: the checker
    # looked it up in the clean environment (with every hash rebuilt) and did not find it there,
    # so it is new however it is spelled, `propext` included.
    own = [a for a in report.new_axioms if not (policy.allow_native_decide and a in report.native)]
    if own:
        return Verdict.reject(
            Reason.AXIOM,
            f"declares its own axiom{'s' if len(own) > 1 else ''} ({', '.join(own)}); a proof may "
            "only use axioms the clean environment already has "
            f"(allowed: {', '.join(sorted(policy.allowed_axioms))})",
            **kw,
        )
    allowed = set(policy.allowed_axioms) | (set(native) if policy.allow_native_decide else set())
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
