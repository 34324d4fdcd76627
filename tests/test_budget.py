"""The budget stops a run at the step boundary nearest it, not a whole step past it."""

from __future__ import annotations

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
