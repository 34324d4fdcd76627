"""The lexer's reading of comments and literals, confirmed by a real Lean (skipped, with the
reason, where there is none). Each proof below passes the pre-scan because the lexer says the
tricky part is a string, a nested comment or a name; Lean must agree by accepting it. Where the
lexer says a would-be comment is code (`//-`), Lean must reject the text as code. Core Lean only.
"""

from __future__ import annotations

import pytest

from leanrl.errors import LeanNotFoundError
from leanrl.runtime import RuntimeConfig
from leanrl.runtimes.local import LocalRuntime
from leanrl.verdict import Attempt, Reason, VerificationPolicy

SYMM = "theorem t (a b : Nat) (h : a = b) : b = a := by"

# (id, preamble, proof, expected reason)
CASES: list[tuple[str, str, str, Reason]] = [
    ("string holding a comment opener", "", 'have s := "/-"\n  exact h.symm', Reason.OK),
    ("line comment holding a block opener", "", "-- /-\n  exact h.symm", Reason.OK),
    ("nested block comment", "", "/- a /- b -/ exact nothing -/\n  exact h.symm", Reason.OK),
    ("char literal holding a quote", "", "have c := '\"'\n  exact h.symm", Reason.OK),
    ("string gap", "", 'have s : String := "a\\\n    b"\n  exact h.symm', Reason.OK),
    ("interpolated string", "", 'have s := s!"{1 + 1}"\n  exact h.symm', Reason.OK),
    (
        "escaped names",
        "theorem «helper two» (x y : Nat) (e : x = y) : y = x := e.symm",
        "exact «helper two» a b h",
        Reason.OK,
    ),
    (
        "doc comment in the preamble",
        "/-- doc /- nested -/ -/\ndef d := 1",
        "exact h.symm",
        Reason.OK,
    ),
    # `//` is a token: `//-` opens no comment, so Lean reads `- c -/` as (broken) code
    (
        "no comment after //",
        "",
        "have : {n : Nat //- c -/ n = n} := ⟨0, rfl⟩\n  exact h.symm",
        Reason.ERROR,
    ),
]


@pytest.mark.lean
async def test_lean_reads_comments_and_literals_as_the_lexer_does() -> None:
    rt = LocalRuntime(RuntimeConfig(mode="oneshot", workers=2, timeout_s=300))  # type: ignore[arg-type]
    try:
        await rt.start()
    except LeanNotFoundError as e:
        pytest.skip(f"no usable Lean: {e}")
    try:
        attempts = [
            Attempt(name="t", header="", formal_statement=SYMM, preamble=pre, proof=p, id=i)
            for i, pre, p, _ in CASES
        ]
        verdicts = await rt.check(attempts)
    finally:
        await rt.close()
    wrong = [
        (case[0], v.reason.value, v.detail)
        for case, v in zip(CASES, verdicts, strict=True)
        if v.reason is not case[3]
    ]
    assert not wrong, wrong


def test_the_pre_scan_passes_every_case() -> None:
    # Runs without Lean: the cases above reach Lean only because the pre-scan lets them through.
    from leanrl.lean.trust.rules import judge_prescan

    for i, pre, p, _ in CASES:
        a = Attempt(name="t", header="", formal_statement=SYMM, preamble=pre, proof=p)
        assert judge_prescan(a) is None, i
    assert VerificationPolicy().forbid_tokens
