"""The report a run leaves behind: who was evaluated, a readable pass@k figure, and a runner that
refuses to record a chunk with attempts missing (TEST runtime and policy, not Lean)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from leanrl import EnvironmentConfig, PolicyError, RuntimeConfig, TasksetConfig
from leanrl.eval import EvalConfig, run_eval
from leanrl.eval.passk import pass_at_k_table
from leanrl.policy import Completion, Prompt, SamplingConfig
from tests._scripted_runtime import ScriptedPolicy

RT = "tests._scripted_runtime:ScriptedRuntime"
TEXTS = ["\n  omega\n", "\n  simp\n"]


def make(bench_data: Path, out: Path) -> EvalConfig:
    return EvalConfig(
        env=EnvironmentConfig(
            id="minif2f",
            taskset=TasksetConfig(path=bench_data, limit=3),
            runtime=RuntimeConfig(name=RT),
        ),
        samples=2,
        k=[1, 2],
        out=out,
        progress=False,
    )


async def test_report_names_the_model_of_a_policy_passed_in(
    bench_data: Path, tmp_path: Path
) -> None:
    cfg = make(bench_data, tmp_path / "run")
    assert cfg.policy.model == ""  # nothing in the config: the policy says which model it is
    s = await run_eval(cfg, policy=ScriptedPolicy(TEXTS))
    report = (tmp_path / "run" / "report.md").read_text()
    assert report.startswith("# Evaluation: minif2f with scripted\n")
    assert s["versions"]["model"] == "scripted"


def test_figure_has_a_title_plain_k_ticks_and_task_counts() -> None:
    from leanrl.eval.report import pass_at_k_figure

    counts = {"a": (8, 1), "b": (8, 0), "c": (8, 8)}
    curve = pass_at_k_table(counts, range(1, 9), {"a": "amc", "b": "amc", "c": "imo"})
    fig = pass_at_k_figure(curve, "minif2f: some/model")
    ax = fig.axes[0]
    assert ax.get_title() == "minif2f: some/model"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4", "8"]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["all (3 tasks)", "amc (2 tasks)", "imo (1 tasks)"]
    (line,) = [ln for ln in ax.get_lines() if ln.get_label() == "all (3 tasks)"]
    assert list(line.get_xdata()) == list(range(1, 9))
    assert line.get_ydata()[0] == pytest.approx(100 * (1 / 8 + 0 + 1) / 3)


class DroppingPolicy(ScriptedPolicy):
    """A broken backend that returns one sample fewer than asked for."""

    async def generate(
        self, prompts: Sequence[Prompt], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        rows = await super().generate(prompts, sampling)
        return [row[:-1] for row in rows]


async def test_a_chunk_with_missing_samples_is_not_recorded(
    bench_data: Path, tmp_path: Path
) -> None:
    cfg = make(bench_data, tmp_path / "run")
    cfg.stream = False  # the chunked path's own check
    with pytest.raises(PolicyError, match=r"returned samples \[0\] .* expected 0\.\.1"):
        await run_eval(cfg, policy=DroppingPolicy(TEXTS))
    results = tmp_path / "run" / "results.jsonl"
    assert not results.exists() or results.read_text() == ""
