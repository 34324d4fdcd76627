"""Tactic-mode input: a model's block of tactics becomes ONE tactic the REPL can parse, and model
tactics are pre-scanned. The stand-in REPL (tests/fake_repl.py) parses like the real one: one
tactic per request, "expected end of input" at the second (REPL issue #43)."""

from __future__ import annotations

import pytest

from leanrl.lean.tactic_input import as_one_tactic, prescan_tactic, relocate_positions
from leanrl.verdict import VerificationPolicy
from tests.fake_repl import split_tactics


@pytest.mark.parametrize(
    ("block", "tactics"),
    [
        ("intro x\nsimp", ["intro x", "simp"]),
        ("  intro x\n  simp\n\n", ["intro x", "simp"]),
        ("ext1 x; ext1 n", ["ext1 x", "ext1 n"]),
        (
            "-- first the intro\nintro x\n  -- then\nsimp -- closes it\n-- done\n",
            ["intro x", "simp"],
        ),
        ("have h : p := by\n  apply foo\n  trivial\nexact h", ["have h : p := by", "exact h"]),
        ("constructor\n· simp\n· rfl", ["constructor", "· simp", "· rfl"]),
    ],
)
def test_a_block_of_tactics_goes_as_one_parenthesised_sequence(
    block: str, tactics: list[str]
) -> None:
    assert isinstance(split_tactics(block), str)  # the raw block: "expected end of input"
    one = as_one_tactic(block)
    assert one.startswith("(\n") and one.endswith("\n)")
    assert split_tactics(one) == tactics


def test_a_single_tactic_is_sent_as_it_is() -> None:
    assert as_one_tactic("  simp [foo] <;> ring  \n\n-- ok\n") == "simp [foo] <;> ring"
    assert as_one_tactic("simp -- note; more") == "simp -- note; more"
    assert split_tactics(as_one_tactic("rfl")) == ["rfl"]


def test_nothing_but_comments_is_no_tactic() -> None:
    assert as_one_tactic("\n  -- nothing here\n\n") == ""


def test_the_stand_in_rejects_several_tactics_like_lean() -> None:
    # The message REPL issue #43 reports for `ext1 x; ext1 n` (position of the `;`).
    assert split_tactics("ext1 x; ext1 n") == "<input>:1:6: expected end of input"
    assert split_tactics("intro x\nsimp") == "<input>:2:0: expected end of input"


@pytest.mark.parametrize("tactic", ["run_tac do IO.println 1", "by_elab pure ()", "simp; #eval 1"])
def test_prescan_names_what_runs_code(tactic: str) -> None:
    why = prescan_tactic(tactic, VerificationPolicy())
    assert why is not None and "not allowed in tactic mode" in why and "arbitrary code" in why


def test_prescan_follows_the_policy() -> None:
    assert prescan_tactic("native_decide", VerificationPolicy()) is not None
    assert prescan_tactic("native_decide", VerificationPolicy(allow_native_decide=True)) is None
    assert prescan_tactic("run_tac pure ()", VerificationPolicy(forbid_tokens=False)) is None
    assert prescan_tactic("intro x\nsimp", VerificationPolicy()) is None


@pytest.mark.parametrize(
    ("block", "where"),
    [("intro x\n  -- c\nfail", "<input>:3:0:"), ("-- plan\n  intro x\n  fail\n", "<input>:3:2:")],
)
def test_parse_error_positions_point_into_the_block_as_written(block: str, where: str) -> None:
    wrapped = as_one_tactic(block)
    line = wrapped.split("\n").index("  fail") + 1
    err = f"Lean error:\n<input>:{line}:2: unknown tactic"
    assert relocate_positions(err, block) == f"Lean error:\n{where} unknown tactic"
    assert relocate_positions("<input>:1:4: x", "fail") == "<input>:1:4: x"  # not wrapped
