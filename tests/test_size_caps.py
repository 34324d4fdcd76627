"""Size caps before any scan (issue 35, item 3): every entry point that reads model text bounds
it before reading it token by token, and reports ``too_large`` (not ``forbidden``, not a hang).

The time these bounds buy is measured in ``benchmarks/prescan_scaling.py --at-cap``; here only
outcomes are asserted: the bound is reached, and what is refused and why."""

from __future__ import annotations

from leanrl.harnesses.whole_proof.extract import MAX_TEXT_CHARS, extract_proof
from leanrl.lean.tactic_input import prescan_tactic
from leanrl.lean.trust.lexer import MAX_TOKENS, Kind, tokenize, too_many_tokens
from leanrl.lean.trust.rules import judge_prescan
from leanrl.task import Task
from leanrl.verdict import Attempt, Reason, VerificationPolicy

TASK = Task(id="t", name="t", header="import Mathlib\n", formal_statement="theorem t : True := by")
DENSE = "x.1"  # three tokens in three characters: the densest ordinary shape


def _dense(tokens: int) -> str:
    return DENSE * (tokens // 3 + 1)


def test_the_lexer_stops_at_its_token_bound_and_says_so() -> None:
    toks = tokenize(_dense(MAX_TOKENS + 10))
    assert len(toks) == MAX_TOKENS + 1
    assert toks[-1].kind is Kind.ERROR and too_many_tokens(toks)
    assert "token bound" in toks[-1].error
    # below the bound: no error token, and a Lean error is not a bound
    assert not too_many_tokens(tokenize(_dense(MAX_TOKENS - 10)))
    assert not too_many_tokens(tokenize('"unterminated'))
    # an explicit, smaller bound
    small = tokenize(_dense(100), max_tokens=10)
    assert len(small) == 11 and too_many_tokens(small)


def test_a_string_gap_error_is_not_taken_for_the_bound() -> None:
    # "more than one newline in a string gap" is a Lean error, not the token bound
    toks = tokenize('theorem t : True := by\n  have s := "a\\\n\n b"\n  trivial')
    assert toks[-1].kind is Kind.ERROR and not too_many_tokens(toks)


def test_judge_prescan_refuses_text_past_the_token_bound_under_the_char_cap() -> None:
    proof = _dense(MAX_TOKENS + 10)
    assert len(proof) < VerificationPolicy().max_proof_chars  # the char cap alone lets it by
    attempt = Attempt(name="t", header="", formal_statement="theorem t : True := by", proof=proof)
    v = judge_prescan(attempt)
    assert v is not None and v.reason is Reason.TOO_LARGE and "tokens" in v.detail
    # with the pre-scan switched off the bound still holds: it is a size cap, not a rule
    off = attempt.model_copy(update={"policy": VerificationPolicy(forbid_tokens=False)})
    v = judge_prescan(off)
    assert v is not None and v.reason is Reason.TOO_LARGE


def test_prescan_tactic_caps_characters_then_tokens() -> None:
    policy = VerificationPolicy()
    why = prescan_tactic(DENSE * 400_000, policy)  # 1.2M characters
    assert why is not None and "too_large" in why and "characters" in why
    why = prescan_tactic(_dense(MAX_TOKENS + 10), policy)
    assert why is not None and "too_large" in why and "tokens" in why
    # the bounds hold with the pre-scan off too
    off = VerificationPolicy(forbid_tokens=False)
    assert prescan_tactic(_dense(MAX_TOKENS + 10), off) is not None
    assert prescan_tactic("simp", off) is None and prescan_tactic("simp", policy) is None


def test_extraction_refuses_an_oversized_output_before_reading_it() -> None:
    ex = extract_proof("a" * (MAX_TEXT_CHARS + 1), TASK)
    assert ex.proof is None and ex.reason is Reason.TOO_LARGE and "characters" in ex.detail


def test_extraction_refuses_a_code_block_past_the_token_bound() -> None:
    ends = "end\n" * (MAX_TOKENS + 10)
    ex = extract_proof(f"```lean4\n{ends}theorem t : True := by\n  trivial\n```", TASK)
    assert ex.reason is Reason.TOO_LARGE and "tokens" in ex.detail
    # completion style (the output continues the statement) is bounded too
    ex = extract_proof(_dense(MAX_TOKENS + 10), TASK, completion_style=True)
    assert ex.reason is Reason.TOO_LARGE
    # an ordinary proof is untouched
    ok = extract_proof("```lean4\ntheorem t : True := by\n  trivial\n```", TASK)
    assert ok.reason is None and ok.proof is not None and "trivial" in ok.proof
