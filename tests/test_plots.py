"""The trainers' plots: a step axis with whole steps only (a 3-step run drew 0.5, 1.5, ...)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from leanrl.train.common import RunDir
from leanrl.train.inrun_eval import plot_eval

pytest.importorskip("matplotlib", reason="the plots need matplotlib (the train extra)")


@pytest.fixture
def ticks(monkeypatch: pytest.MonkeyPatch) -> list[list[float]]:
    """The x ticks of every figure the code closes."""
    import matplotlib.pyplot as plt

    seen: list[list[float]] = []
    close = plt.close

    def record(fig: Any = None) -> None:
        if fig is not None and hasattr(fig, "axes"):
            seen.extend([float(t) for t in ax.get_xticks()] for ax in fig.axes)
        close(fig)

    monkeypatch.setattr(plt, "close", record)
    return seen


def test_reward_and_eval_curves_tick_whole_steps(tmp_path: Path, ticks: list[list[float]]) -> None:
    run = RunDir(tmp_path / "r")
    run.path.mkdir()
    for step in (1, 2, 3):
        run.log({"step": step, "reward_mean": step / 10, "eval/pass@1": step / 5})
    assert run.plot() is not None and plot_eval(run) is not None
    assert len(ticks) == 2
    for axis in ticks:
        assert axis and all(t == int(t) for t in axis), axis
