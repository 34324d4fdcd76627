"""The trusted checker's Lean text, and reading its report.

The checker (``LeanrlCheck.lean``) runs in a judge process that never elaborated model text
(:mod:`leanrl.lean.trust.judge`). There, the reference statement is elaborated with ``sorry``
(:func:`reference_command`), and one ``#eval`` (:func:`check_command`) reads the attempt's
constants from a file as data and logs one ``LEANRL-CHECK <json>`` info message carrying a nonce
made after the attempt was elaborated. :func:`parse_report` accepts exactly one such message from
the judge's own answer, with no error beside it.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

from pydantic import BaseModel, ConfigDict, Field

from leanrl.lean.protocol import ReplMessage

__all__ = [
    "CHECKER_FILES",
    "CHECK_TAG",
    "RESTATE_HEARTBEATS",
    "CheckReport",
    "check_command",
    "check_file_command",
    "checker_source",
    "lean_string",
    "parse_report",
    "reference_command",
]

CHECK_TAG = "LEANRL-CHECK "
"""Prefix of the checker's one info message."""


CHECKER_FILES = ("LeanrlRestate.lean", "LeanrlCheck.lean")
"""The trusted checker's Lean files, in the order a judge elaborates them (one text)."""


@cache
def checker_source() -> str:
    """The trusted Lean checker (``LeanrlRestate.lean`` then ``LeanrlCheck.lean``, shipped with
    the package), as the one text a judge elaborates."""
    here = resources.files("leanrl.lean.trust")
    return "\n".join(here.joinpath(f).read_text(encoding="utf-8") for f in CHECKER_FILES)


def lean_string(s: str) -> str:
    """A Lean string literal for ``s``."""
    out = s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return f'"{out}"'


def reference_command(formal_statement: str) -> str:
    """The reference statement with a ``sorry`` proof, elaborated in the clean environment."""
    return formal_statement.rstrip() + "\n  sorry\n"


RESTATE_HEARTBEATS = 20_000
"""The bound, in thousands of heartbeats as ``maxHeartbeats`` counts them, on each of the two
checks of a restated statement in the judge (the elaborator's reducible ``isDefEq``, then the
kernel's): a tenth of the 200,000 Lean gives a whole command by default. Deciding that
``x > 0`` is ``0 < x`` costs a few; past the bound the attempt is ``judge_limit``."""


def check_command(
    path: str,
    name: str,
    nonce: str,
    *,
    olean: bool,
    replay: bool,
    restate_heartbeats: int = RESTATE_HEARTBEATS,
) -> str:
    """The ``#eval`` that runs the trusted check (in the judge's clean environment).

    ``LeanrlCheck.run`` is a ``CoreM`` action; it is lifted to ``CommandElabM`` because before
    Lean's ``#eval`` rewrite (lean4#5627) ``#eval`` ran a ``CoreM`` action on a fresh message log
    and dropped the report it logs, while a ``CommandElabM`` action logs into the command's own
    messages in every Lean version.
    """
    flag = {True: "true", False: "false"}
    return (
        f"#eval LeanrlCheck.run {lean_string(path)} {lean_string(name)} {lean_string(nonce)} "
        f"{flag[olean]} {flag[replay]} {int(restate_heartbeats)} |> Lean.Elab.Command.liftCoreM\n"
    )


def check_file_command(path: str, nonce: str, *, olean: bool, replay: bool) -> str:
    """The ``#eval`` that runs the trusted check of a whole file (``Attempt.check == "file"``),
    in the judge's clean environment after the header, with no reference statement:
    ``LeanrlCheck.runFile`` checks every constant the file adds (the rebuild, the kernel-bug
    shapes, the axiom walk and, with ``replay``, the kernel replay of each) and reports them in
    the same ``LEANRL-CHECK`` message (``kind``/``ref_kind`` ``file``). Lifted to
    ``CommandElabM`` for the reason :func:`check_command` gives."""
    flag = {True: "true", False: "false"}
    return (
        f"#eval LeanrlCheck.runFile {lean_string(path)} {lean_string(nonce)} "
        f"{flag[olean]} {flag[replay]} |> Lean.Elab.Command.liftCoreM\n"
    )


class CheckReport(BaseModel):
    """What the trusted checker found (facts only; the policy is applied in Python)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    nonce: str
    """Echo of the per-check nonce."""
    status: str
    """``ok``, ``missing``, ``wrong_kind``, ``type_mismatch``, ``helper_mismatch``,
    ``missing_dependency``, ``no_reference``, ``replay_failed``, ``reserved_name`` (a constant
    under ``LeanrlCheck``, the checker's own namespace), ``judge_limit`` (a restated statement
    past the judge's bounds: literal arithmetic too big to evaluate, or a check past its
    heartbeats), or one of the shapes refused
    before the kernel sees them (:data:`~leanrl.lean.trust.rules.KERNEL_BUG_SHAPES`:
    ``free_variable``, ``metavariable``, ``loose_bvar``, ``bad_projection``, ``not_safe``,
    ``kernel_internal_name``, ``too_deep``)."""
    detail: str = ""
    """Why, when ``status`` is not ``ok``."""
    kind: str = "missing"
    """Kind of the attempt's declaration (``theorem``, ``def``, ... or ``missing``); ``file``
    for a file check (:func:`check_file_command`: no target, every constant checked)."""
    ref_kind: str = "missing"
    """Kind of the reference declaration (``file`` for a file check)."""
    axioms: tuple[str, ...] = ()
    """Axioms the attempt's declaration depends on (transitively)."""
    new_axioms: tuple[str, ...] = ()
    """Those of ``axioms`` that the attempt declares itself (constants of its file that the clean
    environment does not hold identically). The policy refuses each of them whatever it is
    called -- a name is only a spelling -- except ``native`` ones under ``allow_native_decide``."""
    native: tuple[str, ...] = ()
    """Those of ``new_axioms`` that stand for a compiled-code evaluation: the auxiliary axioms
    that ``native_decide`` and ``bv_decide`` leave on recent Lean, recognised by their shape
    (type ``@Eq Bool e true`` and a ``_native`` name part), not by their name alone. The core
    axioms ``Lean.ofReduceBool``/``Lean.ofReduceNat``/``Lean.trustCompiler`` are in ``axioms``
    and recognised by name (:data:`~leanrl.lean.trust.rules.NATIVE_AXIOMS`): they exist in the
    clean environment, which the attempt cannot change."""
    uses_reduce: bool = False
    """The proof mentions ``Lean.reduceBool``/``Lean.reduceNat``: the kernel would have to run
    compiled code to check it."""
    inductives: tuple[str, ...] = ()
    """New inductive types (``inductive``, ``structure``, ``class``) the theorem depends on."""
    constants: tuple[str, ...] = ()
    """Every constant the attempt added."""
    restated: bool = False
    """The attempt's statement of the target is not the reference's up to universe names; with
    ``status == "ok"`` the kernel found the two definitionally equal and checked the attempt's
    proof against the reference's statement."""
    replayed: bool = False
    """True when the kernel replay ran and accepted everything, the target included: the kernel
    checked the attempt's own proof term against the reference statement."""
    extra: dict[str, str] = Field(default_factory=dict)
    """Anything else the checker said (forward compatibility)."""


def parse_report(
    messages: tuple[ReplMessage, ...] | list[ReplMessage], nonce: str
) -> CheckReport | str:
    """The checker's report from the messages of the check step, or why there is none.

    Exactly one message must carry the tag and the right nonce, and the step must have produced
    no error: anything else means the check did not run as intended.
    """
    errors = [m.data for m in messages if m.severity == "error"]
    if errors:
        return "the trusted check failed to run: " + errors[0][:500]
    tagged = [m.data for m in messages if m.data.startswith(CHECK_TAG)]
    if len(tagged) != 1:
        return f"the trusted check produced {len(tagged)} reports (expected exactly 1)"
    try:
        obj = json.loads(tagged[0][len(CHECK_TAG) :])
        report = CheckReport.model_validate(obj)
    except (ValueError, TypeError) as e:
        return f"the trusted check's report is unreadable: {e}"
    if report.nonce != nonce:
        return "the trusted check's report carries the wrong nonce"
    return report
