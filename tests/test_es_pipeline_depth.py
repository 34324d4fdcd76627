"""ES pipeline depth from measurement (``scorer.pipeline = "auto"``): the rule, its cap by the
checker's capacity, the running measurement, the scorer switching depth after its first
iteration, and the trainer logging ``pipeline_depth``."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pydantic import ValidationError
from test_es_pipeline import MEMBERS, EchoEnv, FakeEngine, _state

from leanrl.runtime import RuntimeConfig, run_sync
from leanrl.train.es.pipeline import (
    AUTO_FIRST_DEPTH,
    PipelineDepth,
    PipelinedScorer,
    check_capacity,
    depth_for,
)


@pytest.mark.parametrize(
    ("check_s", "gen_s", "want"),
    [
        (2.66, 1.0, 4),  # the seed workflow's ratio: one generating, three being checked
        (1.0, 1.0, 2),  # checks as long as generation: depth 2 hides them exactly
        (1.0000001, 1.0, 2),  # measurement noise does not ask for one more
        (0.3, 1.0, 2),
        (0.0, 1.0, 1),  # nothing to overlap
        (5.0, 0.0, 30),  # generation free: as many as there are (capped below)
    ],
)
def test_depth_rule(check_s: float, gen_s: float, want: int) -> None:
    assert depth_for(check_s, gen_s, None, 30) == want


def test_depth_capped_by_capacity_and_members() -> None:
    assert depth_for(10.0, 1.0, None, 30) == 11
    assert depth_for(10.0, 1.0, 3, 30) == 3  # the checker serves two members at once
    assert depth_for(10.0, 1.0, None, 5) == 5  # no more in flight than members
    with pytest.raises(ValueError, match="items, capacity >= 1"):
        depth_for(1.0, 1.0, 0, 5)


def test_check_capacity_of_a_local_pool() -> None:
    from runtimes.local import LocalRuntime

    rt = LocalRuntime(RuntimeConfig(name="local", workers=8))
    assert check_capacity(rt, 4) == 3  # 8 Lean processes: two members of 4 attempts, + 1
    assert check_capacity(rt, 100) == 2  # at least one member checking beside the generating one
    assert check_capacity(EchoEnv().runtime, 4) is None  # a checker of the user's own: unbounded


def test_fixed_depth_never_moves_and_auto_follows_a_running_mean(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fixed = PipelineDepth(2)
    fixed.observe(gen_s=1.0, check_s=9.0, items=30, capacity=None)
    assert fixed.depth == 2
    auto = PipelineDepth("auto")
    assert auto.depth == AUTO_FIRST_DEPTH
    with caplog.at_level(logging.INFO, logger="leanrl.train"):
        auto.observe(gen_s=1.0, check_s=2.66, items=30, capacity=None)
    assert auto.depth == 4
    assert "ES pipeline depth 2 -> 4" in caplog.text and "ratio 2.66" in caplog.text
    auto.observe(gen_s=1.0, check_s=0.66, items=30, capacity=None)  # mean of 2.66 and 0.66
    assert (auto.check_s, auto.depth) == (pytest.approx(1.66), 3)
    with pytest.raises(ValueError, match="whole number >= 1 or 'auto'"):
        PipelineDepth(0)


def test_auto_scorer_measures_its_first_iteration_then_deepens() -> None:
    """Checking 2.5x generation: the first iteration runs at depth 2, the next at 4; rewards
    are those of a fixed depth (the weights are switched exactly per generate call)."""
    env = EchoEnv()
    env.config.runtime.options["check_s"] = 0.125
    scorer = PipelinedScorer(env, FakeEngine(gen_s=0.05), "auto")
    first = run_sync(scorer.score(_state(), MEMBERS))
    assert scorer.last_depth == 2
    assert len(scorer.check_s) == len(MEMBERS)
    # 2.5 = 0.125 / 0.05: generous margins either side of the (2, 3] band that gives 4
    assert scorer.control.gen_s is not None and scorer.control.check_s is not None
    assert 2.0 < scorer.control.check_s / scorer.control.gen_s <= 3.0
    assert scorer.depth == 4
    second = run_sync(scorer.score(_state(), MEMBERS))
    assert scorer.last_depth == 4
    fixed = run_sync(PipelinedScorer(env, FakeEngine(gen_s=0.0), 3).score(_state(), MEMBERS))
    assert [s.reward for s in first] == [s.reward for s in second] == [s.reward for s in fixed]


def test_config_accepts_auto_and_refuses_nonsense() -> None:
    from leanrl.train.es.config import ESScorerConfig

    assert ESScorerConfig().pipeline == "auto"
    assert ESScorerConfig(pipeline=3).pipeline == 3
    for bad in (0, "fast"):
        with pytest.raises(ValidationError):
            ESScorerConfig(pipeline=bad)  # type: ignore[arg-type]


def test_trainer_logs_the_depth_of_each_iteration(toy_model_dir: Path, tmp_path: Path) -> None:
    from test_es_learning import toy_config

    from leanrl.train.es import ESTrainer

    rows = ESTrainer(
        toy_config(toy_model_dir, tmp_path / "auto", steps=2, population=4)
    ).train_sync()
    assert rows[0]["pipeline_depth"] == AUTO_FIRST_DEPTH  # before anything was measured
    assert all(1 <= r["pipeline_depth"] <= 4 for r in rows)  # never more than the members
    fixed = toy_config(
        toy_model_dir, tmp_path / "d3", steps=1, population=4, scorer={"pipeline": 3}
    )
    assert ESTrainer(fixed).train_sync()[0]["pipeline_depth"] == 3


class _RecordingFunctions:
    def __init__(self) -> None:
        self.concurrency: list[tuple[str, int]] = []

    def with_concurrency(self, name: str, max_inputs: int) -> None:
        self.concurrency.append((name, max_inputs))


def test_modal_members_per_container_follow_the_containers_measurements() -> None:
    """The fan-out scorer takes G and V from what each container reported and, when an
    ``auto`` depth changes, asks the functions for the new concurrency (and only then)."""
    from leanrl.environment import EnvironmentConfig
    from leanrl.launch.es_map import MapScorer
    from leanrl.policy import PolicyConfig

    fns = _RecordingFunctions()
    sc = MapScorer(
        fns,  # type: ignore[arg-type]  # only with_concurrency is reached here
        EnvironmentConfig(id="toy"),
        PolicyConfig(model="m"),
        device="cpu",
        members_per_container="auto",
    )
    assert sc.control.depth == 2
    sc._follow(gen=[1.0] * 30, check=[2.66] * 30)
    assert (sc.control.depth, fns.concurrency) == (4, [("es_member", 4)])
    sc._follow(gen=[1.0] * 30, check=[2.66] * 30)  # the same figures: no new Function
    assert fns.concurrency == [("es_member", 4)]
    sc._follow(gen=[0.0] * 30, check=[0.0] * 30)  # older containers report nothing: keep it
    assert sc.control.depth == 4
    fixed = MapScorer(fns, EnvironmentConfig(id="toy"), PolicyConfig(model="m"), device="cpu")  # type: ignore[arg-type]
    fixed._follow(gen=[1.0] * 30, check=[9.0] * 30)
    assert fixed.control.depth == 2 and len(fns.concurrency) == 1


def test_local_functions_take_a_new_concurrency() -> None:
    from leanrl.launch.local_functions import FunctionSpec, LocalFunctions

    fns = LocalFunctions({"f": FunctionSpec("x:y", 2, 2)}, "/tmp/unused-volume")
    fns.with_concurrency("f", 5)
    assert fns.specs["f"].concurrency == 5 and fns.specs["f"].max_containers == 2
    with pytest.raises(ValueError, match="at least 1"):
        fns.with_concurrency("f", 0)


def test_dry_run_plans_auto_members_per_container() -> None:
    from leanrl.launch.plan import plan_for
    from leanrl.train.es import ESConfig
    from leanrl.train.es.pipeline import depth_for

    base = {"launcher": {"name": "modal"}, "env": {"runtime": {"name": "modal"}}}
    auto = plan_for("es", ESConfig(population=30, tasks_per_step=128, **base))
    text = "\n".join(auto.lines)
    assert "auto: 2 in the first iteration, then measured" in text
    cfg = ESConfig(population=30, tasks_per_step=128, **base)
    cfg.launcher.modal.members_per_container = 2
    two = plan_for("es", cfg)
    assert "members_per_container = " in "\n".join(two.lines)  # the advice the rule gives
    # the estimate's own rule decides the auto plan: never more GPU-seconds than a fixed 2
    assert auto.estimate["gpu_s"] <= two.estimate["gpu_s"]
    assert depth_for(0.0, 1.0, None, 30) == 1
