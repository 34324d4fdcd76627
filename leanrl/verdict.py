"""What Lean said about one attempt: :class:`Attempt` in, :class:`Verdict` out.

These models mirror what the verification layer needs on the wire (they are also the JSON the
verification service speaks), so they are frozen pydantic models. A bad proof is never an
exception: it is a :class:`Verdict` with ``accepted=False`` and a :class:`Reason`.
"""

from __future__ import annotations

import warnings
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "STANDARD_AXIOMS",
    "Attempt",
    "Message",
    "Position",
    "Reason",
    "Verdict",
    "VerificationPolicy",
]

#: The axioms every classical Mathlib proof may use. Anything else (``sorryAx``,
#: ``Lean.ofReduceBool`` from ``native_decide``, a user ``axiom``) is rejected by default.
STANDARD_AXIOMS: tuple[str, ...] = ("propext", "Classical.choice", "Quot.sound")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class Position(_Frozen):
    """A position in Lean source, as the REPL reports it (``{"line": 3, "column": 2}``)."""

    line: int
    """1-based line number."""
    column: int
    """0-based column (in codepoints), as Lean reports it."""


class Message(_Frozen):
    """One message Lean emitted (an error, a warning or info output)."""

    severity: str
    """``"error"``, ``"warning"`` or ``"info"`` (Lean's own spelling)."""
    data: str
    """The message text exactly as Lean printed it."""
    pos: Position | None = None
    """Start of the range the message is about, relative to the checked text."""
    end_pos: Position | None = None
    """End of that range, when Lean gives one (the REPL's ``endPos``)."""


class Reason(str, Enum):
    """Why an attempt was (not) accepted. One value per soundness rule."""

    OK = "ok"
    """Accepted: every rule of the :class:`VerificationPolicy` held."""
    NO_PROOF = "no_proof"
    """No proof could be extracted from the model's output (empty, or no code at all)."""
    TRUNCATED = "truncated"
    """The model's output was cut off by the token limit before the proof ended."""
    ERROR = "error"
    """Lean reported at least one error."""
    SORRY = "sorry"
    """The proof, or something it depends on, uses ``sorry`` (``sorryAx``)."""
    AXIOM = "axiom"
    """The proof depends on an axiom outside the allowed set."""
    NATIVE = "native"
    """The proof trusts compiled code (``native_decide``, ``decide +native``,
    ``Lean.ofReduceBool``) and the policy does not allow it."""
    STATEMENT_CHANGED = "statement_changed"
    """The theorem with the expected name is missing, is not a theorem, or its type differs
    from the reference statement elaborated in a clean environment."""
    FORBIDDEN = "forbidden"
    """The proof text uses something the pre-scan does not allow (code that runs inside Lean,
    new syntax, kernel-skipping options, ...), or the trusted checker found the attempt's
    declarations tampered with (the kernel rejected their replay)."""
    TIMEOUT = "timeout"
    """The attempt ran past its time limit; the Lean process was killed and replaced."""
    MEMORY = "memory"
    """The attempt went over its memory limit; the Lean process was killed and replaced."""
    CRASH = "crash"
    """The Lean process died or answered garbage; it was replaced."""
    JUDGE_LIMIT = "judge_limit"
    """The trusted check of this attempt went past its own bounds: the judge's heartbeat limit on
    a restated statement, the judge's wall-clock limit or memory cap, or it killed the judge
    process (a GMP abort, a panic). The attempt's own terms did it, so it is rejected and never
    retried; the judge is replaced and the rest of the batch is checked as usual."""
    TOO_LARGE = "too_large"
    """The model's text is longer than the policy's ``max_proof_chars``; nothing ran."""
    INFRA = "infra"
    """Infrastructure failure outside Lean (a sandbox died twice, the service was
    unreachable). The attempt is not the model's fault but still costs one attempt."""


class VerificationPolicy(_Frozen):
    """The soundness rules for accepting a proof. The defaults are the strict ones.

    See docs/verification.md for what each rule stops and what turning it off gives up.
    """

    allowed_axioms: tuple[str, ...] = STANDARD_AXIOMS
    """Axioms a proof may depend on. ``sorryAx`` is never allowed, whatever this says."""
    allow_native_decide: bool = False
    """Trust compiled code (``native_decide``, ``decide +native``, ``Lean.ofReduceBool``,
    ``Lean.trustCompiler``). Off by default: it trusts the whole compiler, and the evaluation
    behind such a proof happened in the process that ran the attempt's code, so with it on an
    attempt that runs code during elaboration can forge a native proof."""
    trust_elaboration: bool = False
    """Skip the kernel replay in the clean checker, i.e. trust that the process which elaborated
    the attempt sent every declaration through the kernel. Off by default. With it on, an attempt
    that runs code during elaboration (a construct the pre-scan missed) can add a theorem without
    the kernel (``addDeclWithoutChecking``, ``debug.skipKernelTC``) and have it accepted: use it
    only for proofs from a trusted source, to check them faster."""
    allow_new_inductives: bool = False
    """Accept proofs that depend on inductive types the attempt declares itself (``inductive``,
    ``structure``, ``class``). Off by default: the kernels of the Lean versions the benchmarks pin
    have known soundness bugs in checking inductive declarations (lean4#14576, lean4#14807), which
    the clean checker's replay, run by the same kernel, cannot catch."""
    allow_notation: bool = False
    """Let the pre-scan accept ``notation``/``infix``/``prefix``/``postfix`` in the model's text.
    Off by default: they change how the rest of the text is parsed. Each notation's tokens are
    checked and taught to the pre-scan's lexer first (docs/prescan.md)."""
    prescan_allow: tuple[str, ...] = ()
    """Constructs the pre-scan lets through although its tables refuse them, named exactly as
    its findings name them (``"@[my_attr]"``, ``"set_option hygiene"``, ``"#synth"``).
    Unreadable text, ``sorry``, ``axiom`` and native code are never waived this way."""
    forbid_tokens: bool = True
    """Run the syntax pre-scan (deny by default: only declarations, ``open``, sections, safe
    options and attributes, and term/tactic syntax pass) before Lean runs. A cheap first filter
    with clear messages; the trusted checker does not depend on it."""
    max_proof_chars: int = Field(default=200_000, ge=1)
    """Longest model text (preamble + restated statement + proof) accepted, in characters; a
    longer one is rejected as ``too_large`` before anything runs."""

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        # ``kernel_replay`` (an opt-in before the replay became the default) is still read.
        if isinstance(data, dict) and "kernel_replay" in data:
            data = dict(data)
            replay = data.pop("kernel_replay")
            if not replay:
                warnings.warn(
                    "VerificationPolicy.kernel_replay is gone (the replay is on by default); "
                    "kernel_replay=false now means trust_elaboration=true, which lets attempts "
                    "that run code forge theorems",
                    DeprecationWarning,
                    stacklevel=2,
                )
                data.setdefault("trust_elaboration", True)
        return data

    @property
    def kernel_replay(self) -> bool:
        """Whether the clean checker replays the attempt's declarations through the kernel."""
        return not self.trust_elaboration


class Attempt(_Frozen):
    """One proof to check: the model's proof placed under the reference statement."""

    name: str
    """The theorem name that must exist afterwards (the task's ``name``)."""
    header: str
    """Imports, options and ``open`` lines that go before the statement."""
    formal_statement: str
    """The reference statement, ending in ``:= by``."""
    proof: str
    """The tactic block the model wrote (what goes after ``:= by``)."""
    preamble: str = ""
    """Helper lemmas/definitions the model wrote before the theorem (placed between header and
    statement; they can never change what the statement means, the checker makes sure)."""
    restated_statement: str = ""
    """The model's own copy of the statement (ending in ``:= by``), used in the Lean text in place
    of ``formal_statement`` when the model restated the theorem in a way a text comparison cannot
    match (extra parentheses, a different cast placement). It is model text: pre-scanned like the
    proof, and it decides nothing. The trusted checker compares the type it elaborates to with
    ``formal_statement`` elaborated in a clean environment, and rejects any difference."""
    policy: VerificationPolicy = Field(default_factory=VerificationPolicy)
    """The rules this attempt is judged by (from the taskset)."""
    id: str | None = None
    """Caller's id for the attempt (for example ``"task/sample"``), echoed in the Verdict."""
    check: Literal["theorem", "file"] = "theorem"
    """What is checked. ``theorem`` (every taskset's check): the theorem ``name`` exists with
    exactly the reference type ``formal_statement`` and is proved soundly. ``file`` (the Kimina
    endpoints' check of a snippet that is not one theorem against a reference, docs/interop.md):
    ``proof`` is a whole Lean text after ``header`` (any declarations and ``#check``-like
    queries), elaborated as it is, with no target; the trusted checker replays every constant it
    adds through the kernel and walks their axioms, and the verdict lists them. ``name``,
    ``formal_statement``, ``preamble`` and ``restated_statement`` are then empty."""

    @model_validator(mode="after")
    def _file_has_no_target(self) -> Attempt:
        if self.check == "file" and (
            self.name or self.formal_statement or self.preamble or self.restated_statement
        ):
            raise ValueError(
                "a file check has no target: leave name, formal_statement, preamble and "
                "restated_statement empty and put the whole text in proof"
            )
        return self


class Verdict(_Frozen):
    """What Lean said about one attempt."""

    accepted: bool
    """True only when every rule of the policy held."""
    reason: Reason
    """Which rule decided (``ok`` when accepted)."""
    detail: str = ""
    """One human-readable line that says what went wrong, for logs and reports."""
    messages: tuple[Message, ...] = ()
    """Lean's messages, with positions relative to the checked text."""
    axioms: tuple[str, ...] = ()
    """Axioms the theorem depends on, as Lean printed them (when the check got that far)."""
    time_s: float = 0.0
    """Wall time spent checking this attempt, in seconds."""
    id: str | None = None
    """The attempt's ``id``, echoed back."""

    @classmethod
    def reject(cls, reason: Reason, detail: str, **kw: object) -> Verdict:
        """A rejected verdict with the given reason and one-line detail."""
        return cls(accepted=False, reason=reason, detail=detail, **kw)  # type: ignore[arg-type]
