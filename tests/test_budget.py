"""The budget stops a run at the step boundary nearest it, not a whole step past it."""

from __future__ import annotations

from pathlib import Path

import pytest

from leanrl.train.budget import BudgetConfig, BudgetTracker


def run(budget: int, step_tokens: list[int]) -> tuple[BudgetTracker, list[dict[str, object]]]:
    tracker = BudgetTracker(BudgetConfig(tokens=budget))
    rows: list[dict[str, object]] = []
    for tokens in step_tokens:
        row: dict[str, object] = {"tokens": tokens}
        tracker.update(row)
        rows.append(row)
        if tracker.spent:
            break
    return tracker, rows


def test_stops_short_when_one_more_step_would_overshoot_more() -> None:
    # Steps of 100 against 240: after 200 (40 short) a step would end 60 past: stop at 200.
    tracker, rows = run(240, [100] * 10)
    assert [r["total_tokens"] for r in rows] == [100, 200]
    assert rows[-1].get("budget_spent") is True and tracker.early
    line = tracker.spent_line(2)
    assert line == (
        "budget spent: 200 generated tokens of 240 (one more step would have ended further "
        "past it); stopping after step 2"
    )


def test_goes_on_when_one_more_step_ends_nearer() -> None:
    # Against 260: after 200 (60 short) a step ends 40 past: take it.
    tracker, rows = run(260, [100] * 10)
    assert [r["total_tokens"] for r in rows] == [100, 200, 300]
    assert not tracker.early
    assert (
        tracker.spent_line(3) == "budget spent: 300 generated tokens of 260; stopping after step 3"
    )


def test_a_run_ends_within_half_a_step_of_its_budget() -> None:
    for budget in range(65, 2000, 37):  # (a run takes at least one step)
        _, rows = run(budget, [130] * 100)
        assert abs(int(rows[-1]["total_tokens"]) - budget) <= 65  # type: ignore[call-overload]


def test_resume_counts_the_steps_before_it() -> None:
    tracker = BudgetTracker(BudgetConfig(tokens=240))
    tracker.resume([{"tokens": 100, "total_tokens": 100}, {"tokens": 100, "total_tokens": 200}])
    assert tracker.steps == 2 and tracker.spent and tracker.early


def test_log_lines_show_the_budget_share_not_the_step_cap() -> None:
    from leanrl.train.es.trainer import _iteration_line
    from leanrl.train.grpo.trainer import _step_line

    tracker = BudgetTracker(BudgetConfig(tokens=1000))
    row: dict[str, object] = {"tokens": 410}
    tracker.update(row)
    assert tracker.counter(1, 10_000) == "step 1, 41% of the token budget"
    assert BudgetTracker(BudgetConfig()).counter(3, 20, "iteration") == "iteration 3/20"
    grpo = {"reward_mean": 0.5, "pass_rate": None, "groups_kept": 2, "groups": 4, "loss": 0.1}
    line = _step_line({**grpo, "time_step": 1.0}, tracker.counter(1, 10_000))
    assert line.startswith("step 1, 41% of the token budget: reward 0.500 groups 2/4")
    assert "pass" not in line and "10000" not in line  # reward-only: no pass rate, no cap
    assert " pass 0.250 " in _step_line({**grpo, "pass_rate": 0.25, "time_step": 1.0}, "step 1/2")
    es = {"reward_mean": 0.5, "reward_max": 1.0, "population": 4, "update_norm": 0.1}
    line = _iteration_line({**es, "pass_rate": None, "step_time_s": 2.0}, "iteration 1/2")
    assert line.startswith("iteration 1/2: reward 0.500 (max 1.000) population 4")
    line = _iteration_line({**es, "pass_rate": 0.5, "step_time_s": 2.0}, "iteration 1/2")
    assert "(max 1.000) pass 0.500 population 4" in line


async def test_a_reward_only_member_has_no_pass_rate() -> None:
    from typing import Any

    from leanrl.rollout import Rollout
    from leanrl.train.es.workers import score_rollouts
    from leanrl.verdict import Reason, Verdict

    class Env:  # rollout() is all score_rollouts asks of an environment
        def __init__(self, verdicts: bool) -> None:
            self.verdicts = verdicts

        async def rollout(self, tasks: Any, policy: Any, sampling: Any) -> list[list[Rollout]]:
            v = Verdict(accepted=True, reason=Reason.OK) if self.verdicts else None
            return [[Rollout(task_id="t", prompt="p", reward=0.5, verdict=v)]]

    got = await score_rollouts(Env(False), None, [], None)  # type: ignore[arg-type]
    assert got.pass_rate is None and got.reward == 0.5
    got = await score_rollouts(Env(True), None, [], None)  # type: ignore[arg-type]
    assert got.pass_rate == 1.0


def test_the_last_line_of_a_run_rounds_its_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from leanrl.train.common import RunDir, print_run_summary

    run = RunDir(tmp_path / "r")
    run.path.mkdir(parents=True)
    run.log({"step": 3, "loss": 0.123456789012, "tokens_per_s": 1234.5678, "skipped": None})
    print_run_summary(run, ("loss", "tokens_per_s", "skipped"))
    out = capsys.readouterr().out
    assert "step 3: loss=0.1235 tokens_per_s=1235 skipped=-" in out
