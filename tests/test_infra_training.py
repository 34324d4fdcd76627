"""GRPO and ES on attempts the checker could not judge (verdict ``infra``).

Lean is the scripted TEST runtime (a rule, not Lean): through the tactic loop every tactic the
random toy model writes closes the goal (``accept = ""``), so every judged attempt is accepted
with reward 1; the samples numbered in ``infra_samples`` come back ``infra`` instead. Counted as
failures, those would pull the rewards down and (in GRPO) make groups look informative; left out,
the figures are those of the judged attempts and the infra share is reported and warned about.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from leanrl.environment import EnvironmentConfig
from leanrl.policy import PolicyConfig, SamplingConfig

TOY = Path(__file__).parent / "fixtures" / "toy_tasks.jsonl"


def _env(infra_samples: list[int]) -> EnvironmentConfig:
    return EnvironmentConfig(
        id="dataset",
        taskset={"path": TOY, "split": "train"},
        harness={"name": "tactic-loop", "max_turns": 3},
        runtime={
            "name": "tests._scripted_runtime:ScriptedRuntime",
            "options": {"accept": "", "infra_samples": infra_samples},
        },
    )


def _rows(run: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "could not be checked" in r.getMessage()]


@pytest.mark.parametrize("infra_samples", [[0], [0, 1]])
def test_grpo_leaves_infra_attempts_out_of_groups_and_rewards(
    toy_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, infra_samples: list[int]
) -> None:
    from leanrl.train.grpo import GRPOConfig, GRPOTrainer

    cfg = GRPOConfig(
        policy=PolicyConfig(model=str(toy_model_dir)),
        env=_env(infra_samples),
        sampling=SamplingConfig(max_tokens=6, top_p=1.0, seed=0),
        out=tmp_path / "run",
        steps=2,
        tasks_per_step=2,
        group_size=3,
        save_every=2,
        dynamic_sampling="drop",
    )
    with caplog.at_level(logging.WARNING, logger="leanrl.train"):
        GRPOTrainer(cfg).train_sync()
    run = tmp_path / "run"
    rows = _rows(run)
    n_infra = len(infra_samples) * 2  # per step: those samples of each of the 2 groups
    for row in rows:
        assert row["infra"] == n_infra
        assert row["infra_frac"] == pytest.approx(n_infra / 6)
        # the judged attempts were all accepted: infra ones do not count as failures
        assert row["reward_mean"] == 1.0 and row["pass_rate"] == 1.0
        # the judged rewards of a group are equal (all 1): no group carries a signal, although
        # counting infra as reward 0 would have made every group look informative
        assert row["groups_kept"] == 0 and row["skipped"] is True
    summary = json.loads((run / "summary.json").read_text())
    assert summary["infra"] == 2 * n_infra
    mostly = len(infra_samples) == 2  # 4 of each step's 6 attempts
    assert summary["mostly_infra"] is mostly
    assert summary["mostly_infra_steps"] == ([1, 2] if mostly else [])
    warned = _warnings(caplog)
    assert len(warned) == (2 if mostly else 0)
    if mostly:
        assert warned[0].startswith("step 1: 4 of its attempts (67%) could not be checked")


def test_es_leaves_infra_attempts_out_of_member_rewards(
    toy_model_dir: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from leanrl.train.common import RunDir, print_run_summary
    from leanrl.train.es import ESConfig, ESTrainer

    def run(name: str, infra_samples: list[int]) -> list[dict[str, Any]]:
        cfg = ESConfig(
            policy=PolicyConfig(model=str(toy_model_dir)),
            env=_env(infra_samples),
            sampling=SamplingConfig(max_tokens=6, seed=0),
            out=tmp_path / name,
            steps=1,
            tasks_per_step=2,
            population=2,
            samples_per_task=2,
            greedy=False,  # greedy, the random model writes only newlines: no tactic at all
            save_every=1,
        )
        ESTrainer(cfg).train_sync()
        return _rows(tmp_path / name)

    with caplog.at_level(logging.WARNING, logger="leanrl.train"):
        half = run("half", [1])
    # sample 1 of each task was infra: each member's reward is its judged attempts' mean
    (row,) = half
    assert (row["infra"], row["infra_frac"]) == (4, 0.5)  # 2 members x 2 tasks; not most
    assert row["reward_mean"] == 1.0 and row["pass_rate"] == 1.0 and row["members_judged"] == 2
    assert not _warnings(caplog)

    with caplog.at_level(logging.WARNING, logger="leanrl.train"):
        none = run("none", [0, 1])
    (row,) = none
    assert (row["infra"], row["infra_frac"]) == (8, 1.0)
    assert row["members_judged"] == 0 and row["reward_mean"] is None and row["pass_rate"] is None
    assert row["skipped"] is True and row["update_norm"] == 0.0  # nothing judged: no update
    assert _warnings(caplog) == [
        "iteration 1: 8 of its attempts (100%) could not be checked (`infra`: the checker did "
        "not run); they carry no weight, so this iteration learned from the rest only. Check "
        "the runtime (`leanrl doctor`)"
    ]
    summary = json.loads((tmp_path / "none" / "summary.json").read_text())
    assert (summary["infra"], summary["mostly_infra_steps"]) == (8, [1])
    print_run_summary(RunDir(tmp_path / "none"), ("reward_mean",))
    assert "WARNING: most attempts of 1 step(s) could not be checked" in capsys.readouterr().out
    print_run_summary(RunDir(tmp_path / "half"), ("reward_mean",))
    assert "WARNING" not in capsys.readouterr().out
