"""The pre-scan's table of code-running tactics, read from the sources (issue 19, item 5).

One case per entry of `TACTICS`, `TACTIC_WORDS` and the configuration tactics added from the
sources: a minimal proof that uses it, which the pre-scan must refuse for the reason of the
entry, and near misses that must still pass (the words as ordinary names). The pre-scan is a
first filter; the judge stands behind it (tests/test_trust_checker_source.py, the lean tests).
"""

from __future__ import annotations

import pytest

from leanrl.lean.trust.allowlist import CONFIG_TACTICS, TACTIC_WORDS, TACTICS, WHY
from leanrl.lean.trust.rules import judge_prescan
from leanrl.lean.trust.syntax import scan
from leanrl.verdict import Attempt, Reason, VerificationPolicy

STRICT = VerificationPolicy()

# (entry, proof text as a model writes it after the statement, token reported)
REFUSED: list[tuple[str, str, str]] = [
    ("run_tac", "theorem t : True := by\n  run_tac pure ()\n  trivial", "run_tac"),
    ("by_elab", "theorem t : True := by_elab pure (Lean.mkConst ``True.intro)", "by_elab"),
    ("run_conv", "theorem t : 1 + 1 = 2 := by\n  conv => run_conv pure ()\n  rfl", "run_conv"),
    (
        "run_conv",
        'theorem t : 1 + 1 = 2 := by\n  conv_lhs => run_conv Lean.logInfo "x"\n  rfl',
        "run_conv",
    ),
    (
        "success_if_fail_with_msg",
        'theorem t : True := by\n  success_if_fail_with_msg (toString 1) fail "1"\n  trivial',
        "success_if_fail_with_msg",
    ),
    (
        "from_lrat",
        "example : ∀ (a b : Prop), (¬a ∧ ¬b ∨ a ∧ ¬b) ∨ ¬a ∧ b ∨ a ∧ b := from_lrat\n"
        '  ("p cnf 2 4  1 2 0  -1 2 0  1 -2 0  -1 -2 0" ++ "")\n'
        '  "5 -2 0 4 3 0  5 d 3 4 0  6 1 0 5 1 0  6 d 1 0  7 0 5 2 6 0"',
        "from_lrat",
    ),
    (
        "include_str",
        'theorem t : (include_str (".." ++ "/solution.lean")).length ≥ 0 := Nat.zero_le _',
        "include_str",
    ),
    (
        "with_panel_widgets",
        "theorem t : True := by\n"
        "  with_panel_widgets [ProofWidgets.SelectionPanel with (toString 1)]\n    trivial",
        "with_panel_widgets",
    ),
    ("polyrith", "example (x : Int) (h : x = 1) : x * x = 1 := by polyrith", "polyrith"),
    ("plausible", "theorem t : True := by\n  plausible", "plausible"),
    ("slim_check", "theorem t : True := by\n  slim_check", "slim_check"),
    (
        "trace",
        "def f (n : Nat) : String := toString (n * n)\ntheorem t : True := by\n  trace f 12\n"
        "  trivial",
        "trace",
    ),
    ("trace", 'theorem t : True := by\n  trace "a" ++ f 1\n  trivial', "trace"),
    ("trace", "theorem t : True := by trace (toString 1); trivial", "trace"),
    *[
        (
            f"config of {tac}",
            f"def n : Nat := 5\nexample (x : Nat) (h : x < 3) : x < 4 := by {tac} (splits := n)",
            "(splits :=",
        )
        for tac in ("lia", "cutsat", "grobner", "try?", "mvcgen")
    ],
]


@pytest.mark.parametrize(
    ("entry", "text", "token"), REFUSED, ids=[f"{c[0]}-{i}" for i, c in enumerate(REFUSED)]
)
def test_each_code_running_construct_is_refused_for_its_reason(
    entry: str, text: str, token: str
) -> None:
    findings = scan(text, STRICT)
    assert findings, f"{entry}: not refused"
    tokens = {f.token for f in findings}
    assert token in tokens or any(token in t for t in tokens), (entry, findings)
    for f in findings:
        assert f.reason is Reason.FORBIDDEN, (entry, f)
    word = entry.removeprefix("config of ")
    kind = TACTICS.get(word) or TACTIC_WORDS.get(word)
    if kind is not None:
        assert any(f.why == WHY[kind] for f in findings), (entry, findings)


def test_every_table_entry_has_a_case() -> None:
    cased = {c[0] for c in REFUSED}
    missing = (set(TACTICS) | set(TACTIC_WORDS)) - cased - {"implemented_by"}
    assert not missing, f"add a refused case for {sorted(missing)}"
    for tac in ("lia", "cutsat", "grobner", "try", "mvcgen", "mvcgen_no_trivial"):
        assert tac in CONFIG_TACTICS, tac


ALLOWED: list[str] = [
    # the words as ordinary names, and harmless forms
    "theorem t (A : Matrix (Fin 2) (Fin 2) Int) : Matrix.trace A = Matrix.trace A := by\n"
    "  simp [Matrix.trace]",
    "theorem t (A : Matrix (Fin 2) (Fin 2) Int) : trace A = trace A := by\n  rfl",
    "theorem t (A : Matrix (Fin 2) (Fin 2) Int) (h : trace A = 0) : trace A = 0 := by\n  exact h",
    'theorem t : True := by\n  trace "checking"\n  trivial',
    "theorem t : True := by\n  try trivial",
    "theorem t (x : Nat) (h : x < 3) : x < 4 := by\n  lia",
    "theorem t (x : Nat) (h : x < 3) : x < 4 := by\n  omega",
    "theorem t : True := by\n  try (exact trivial)",
]


@pytest.mark.parametrize("text", ALLOWED)
def test_near_misses_still_pass(text: str) -> None:
    assert scan(text, STRICT) == []


def test_a_refused_tactic_is_a_verdict_with_the_reason() -> None:
    a = Attempt(
        name="t",
        header="import Mathlib\n",
        formal_statement="theorem t : 1 + 1 = 2 := by",
        proof="conv => run_conv pure ()\n  rfl",
    )
    v = judge_prescan(a)
    assert v is not None and v.reason is Reason.FORBIDDEN and "`run_conv`" in v.detail
