"""Shaped rewards (issue 25): format checks and DAPO's soft overlong punishment.

Each format rule and the overlong formula are checked against values worked out by hand; the
shaping adds to the reward and never touches a Verdict; the defaults change nothing; the options
parse from TOML and flags; a tiny GRPO run reports the shaping and keeps its pass rate Lean's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from leanrl.errors import ConfigError
from leanrl.policy import PolicyConfig, SamplingConfig
from leanrl.rollout import Rollout, Turn
from leanrl.train.shaping import (
    FormatRewardConfig,
    OverlongConfig,
    check_shaping,
    format_penalty,
    format_violations,
    overlong_penalty,
    shape_groups,
    shaping_metrics,
)
from leanrl.verdict import Reason, Verdict

ON = FormatRewardConfig(enabled=True)
GOOD = (
    "<think>\nTry induction on n.\n```lean4\n  induction n\n```\nthen simp closes it.\n</think>\n"
    "```lean4\ntheorem t (n : Nat) : n + 0 = n := by\n  induction n <;> simp\n```"
)


def test_a_well_formed_attempt_breaks_no_rule() -> None:
    assert format_violations(GOOD, ON) == [] and format_penalty(GOOD, ON) == 0.0


@pytest.mark.parametrize(
    ("text", "broken"),
    [
        ("```lean4\n  simp\n```", ["reasoning"]),  # no reasoning block
        ("<think>a</think><think>b</think>\n```lean4\n  simp\n```", ["reasoning"]),  # two
        # closed before opened; what follows the open tag is (unclosed) reasoning
        ("</think> x <think>\n```lean4\n  simp\n```", ["reasoning", "lean_block"]),
        ("</think>\n```lean4\n  simp\n```\n<think>", ["reasoning"]),
        ("<think>never closed\n```lean4\n  simp\n```", ["reasoning", "lean_block"]),
        ("<think>plan</think>\nno code at all", ["lean_block"]),
        ("<think>plan</think>\n```lean4\n  simp\n```\n```lean\n  rfl\n```", ["lean_block"]),
        # a Lean snippet inside the reasoning does not count as the Lean block
        ("<think>\n```lean4\n  simp\n```\n</think>\nthe end", ["lean_block"]),
    ],
)
def test_reasoning_and_lean_block_rules(text: str, broken: list[str]) -> None:
    assert format_violations(text, ON) == broken


def test_repeated_lines_are_found_per_section_and_short_lines_ignored() -> None:
    looping = "<think>\n" + "I will now apply simp.\n" * 3 + "</think>\n```lean4\n  simp\n```"
    assert format_violations(looping, ON) == ["repeated_lines"]
    # the reasoning's snippet line again in the final block: different sections, no repeat
    assert "repeated_lines" not in format_violations(GOOD, ON)
    short = "<think>\nok\nok\nok\n</think>\n```lean4\n  simp\n  simp\n```"  # < 8 chars
    assert format_violations(short, ON) == []
    twice = "<think>\nlinarith [sq_nonneg x]\nlinarith [sq_nonneg x]\n</think>\n```lean4\nx\n```"
    assert format_violations(twice, ON) == ["repeated_lines"]
    assert format_violations(twice, ON.model_copy(update={"repeat_limit": 2})) == []


def test_penalties_add_up_and_a_zero_penalty_turns_its_rule_off() -> None:
    bad = "just text\njust text\njust text"  # no reasoning, no Lean block, repeated lines
    cfg = FormatRewardConfig(
        enabled=True, reasoning_penalty=0.5, lean_block_penalty=0.25, repeated_line_penalty=2.0
    )
    assert format_penalty(bad, cfg) == pytest.approx(-2.75)
    off = cfg.model_copy(update={"lean_block_penalty": 0.0})
    assert format_violations(bad, off) == ["reasoning", "repeated_lines"]
    assert format_penalty(bad, off) == pytest.approx(-2.5)
    assert format_penalty(bad, FormatRewardConfig()) == 0.0  # off by default


@pytest.mark.parametrize(
    ("length", "expected"),
    [(0, 0.0), (80, 0.0), (81, -1 / 20), (90, -0.5), (99, -19 / 20), (100, -1.0), (101, -1.0)],
)
def test_overlong_penalty_is_daposs_formula(length: int, expected: float) -> None:
    # L_max = 100, L_cache = 20: 0 up to 80, then ((100 - 20) - L) / 20, and -1 past 100
    assert overlong_penalty(length, 100, 20) == pytest.approx(expected)


def test_overlong_defaults_follow_the_sampling_limit() -> None:
    assert OverlongConfig().resolved(512) == (512, 102)  # L_cache = L_max // 5
    assert OverlongConfig(max_tokens=64, buffer_tokens=8).resolved(512) == (64, 8)
    assert OverlongConfig().resolved(3) == (3, 1)  # at least one token of buffer
    with pytest.raises(ValueError, match="larger than L_max"):
        OverlongConfig(max_tokens=10, buffer_tokens=20)
    with pytest.raises(ValueError, match="larger than L_max"):
        OverlongConfig(buffer_tokens=20).resolved(10)


def _rollout(text: str, n_ids: int, verdict: Verdict, reward: float) -> Rollout:
    turn = Turn(completion=text, completion_ids=list(range(n_ids)), finish_reason="stop")
    return Rollout(task_id="t", prompt="p", turns=[turn], verdict=verdict, reward=reward)


def test_shaping_adds_to_the_reward_and_never_touches_the_verdict() -> None:
    ok = Verdict(accepted=True, reason=Reason.OK)
    wrong = Verdict.reject(Reason.ERROR, "e")
    infra = Verdict.reject(Reason.INFRA, "down")
    group = [
        _rollout(GOOD, 10, ok, 1.0),  # fine format, short
        _rollout("```lean4\n  simp\n```", 90, ok, 1.0),  # no reasoning, in the buffer
        _rollout(GOOD, 100, wrong, 0.0),  # at L_max
        _rollout("x", 100, infra, 0.0),  # not judged: never shaped
    ]
    fmt = FormatRewardConfig(enabled=True, reasoning_penalty=0.3)
    over = OverlongConfig(enabled=True, buffer_tokens=20, penalty=0.5)
    shape_groups([group], fmt, over, max_tokens=100)
    assert [r.reward for r in group] == pytest.approx([1.0, 1.0 - 0.3 - 0.25, -0.5, 0.0])
    assert [r.verdict for r in group] == [ok, ok, wrong, infra]  # the pass stays Lean's
    assert "shaping" not in group[3].meta
    assert group[1].meta["shaping"] == {"format": pytest.approx(-0.3), "overlong": -0.25}
    m = shaping_metrics([group], fmt, over)
    assert m["shaping_format"] == pytest.approx(-0.1)
    assert m["shaping_overlong"] == pytest.approx((0 - 0.25 - 0.5) / 3)


def test_multi_turn_attempts_count_their_worst_turn() -> None:
    turns = [
        Turn(completion=GOOD, completion_ids=[0] * 95, finish_reason="stop"),
        Turn(completion="no format", completion_ids=[0] * 10, finish_reason="stop"),
    ]
    r = Rollout(task_id="t", prompt="p", turns=turns, verdict=Verdict.reject(Reason.ERROR, "e"))
    shape_groups([[r]], ON, OverlongConfig(enabled=True, buffer_tokens=10), max_tokens=100)
    assert r.meta["shaping"] == {"format": -2.0, "overlong": -0.5}  # 2 rules; longest turn 95


def test_defaults_change_nothing() -> None:
    from leanrl.train.grpo import GRPOConfig

    cfg = GRPOConfig(policy=PolicyConfig(model="m"))
    assert not cfg.format_reward.enabled and not cfg.overlong.enabled
    r = _rollout("anything", 10_000, Verdict.reject(Reason.ERROR, "e"), 0.25)
    before = r.model_copy(deep=True)
    shape_groups([[r]], cfg.format_reward, cfg.overlong, cfg.sampling.max_tokens)
    assert r == before  # reward and meta untouched
    assert shaping_metrics([[r]], cfg.format_reward, cfg.overlong) == {}  # no new columns


def test_options_from_toml_and_flags(tmp_path: Path) -> None:
    from leanrl.cli import parse_command
    from leanrl.config import merge
    from leanrl.train.grpo.cli import GRPOCommand

    toml = tmp_path / "s.toml"
    toml.write_text(
        "[format_reward]\nenabled = true\nrepeated_line_penalty = 0.5\n"
        "[overlong]\nenabled = true\nbuffer_tokens = 64\n[sampling]\nmax_tokens = 256\n"
    )
    cfg = merge(GRPOCommand, toml, {"model": "m"}).to_grpo_config()
    assert cfg.format_reward.enabled and cfg.format_reward.repeated_line_penalty == 0.5
    assert cfg.overlong.resolved(cfg.sampling.max_tokens) == (256, 64)
    flags = ["--model", "m", "--format-reward.enabled", "--format-reward.think-open",
             "<reasoning>", "--overlong.enabled", "--overlong.penalty", "0.5"]  # fmt: skip
    cfg = parse_command(GRPOCommand, flags).to_grpo_config()
    assert cfg.format_reward.think_open == "<reasoning>" and cfg.overlong.penalty == 0.5
    bad = ["--model", "m", "--sampling.max-tokens", "16", "--overlong.enabled",
           "--overlong.buffer-tokens", "32"]  # fmt: skip
    with pytest.raises(ConfigError, match="larger than L_max"):
        parse_command(GRPOCommand, bad).to_grpo_config()


def test_format_rewards_are_refused_for_the_tactic_loop() -> None:
    check_shaping(ON, "whole-proof")
    check_shaping(FormatRewardConfig(), "tactic-loop")
    with pytest.raises(ConfigError, match="tactic-loop"):
        check_shaping(ON, "tactic-loop")


def test_a_grpo_step_reports_the_shaping_and_keeps_lean_s_pass_rate(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A random tiny model never finishes within max_tokens: every attempt is at L_max, so
    its overlong shaping is -penalty, and the reward drops by exactly that much."""
    from leanrl.train.grpo import GRPOConfig, GRPOTrainer
    from tests.test_grpo_harnesses import _env

    cfg = GRPOConfig(
        policy=PolicyConfig(model=str(tiny_model_dir)),
        sampling=SamplingConfig(max_tokens=8, top_p=1.0, seed=0),
        out=tmp_path / "run", steps=1, tasks_per_step=2, group_size=2, lr=1e-3,
        dynamic_sampling="off", mask_truncated=False,
        overlong=OverlongConfig(enabled=True, buffer_tokens=4, penalty=0.5),
    )  # fmt: skip
    trainer = GRPOTrainer(cfg, env=_env("whole-proof"))
    trainer.train_sync()
    (row,) = trainer.run.metrics()
    assert row["shaping_overlong"] == pytest.approx(-0.5)
    assert row["pass_rate"] == 0.0  # Lean's verdicts (nothing passes), shaping aside
    assert row["reward_mean"] == pytest.approx(-0.5)  # taskset reward 0, plus the shaping
    assert "shaping_format" not in row and "replay_groups" not in row
    assert not (tmp_path / "run" / "replay").exists()  # replay off: no buffer written
