"""GRPO runs end to end on CPU: dynamic sampling, the async staleness bound, early config errors,
a failed start that leaves the run folder reusable, the per-step log line.

Uses the digit-reward test environment of ``tests/test_grpo_trainer.py`` (no Lean).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from leanrl import Rollout, Task
from leanrl.errors import ConfigError, PolicyError
from leanrl.policy import PolicyConfig, SamplingConfig
from tests.test_grpo_trainer import DigitEnv, DigitTaskset, _config, _train


class FlatTaskset(DigitTaskset):
    """Every attempt gets the same reward: every group is all-equal, none is informative."""

    def group_rewards(self, task: Task, rollouts: Sequence[Rollout]) -> list[float]:
        return [0.5] * len(rollouts)


class FlatEnv(DigitEnv):
    taskset_class = FlatTaskset


class HalfFlatTaskset(DigitTaskset):
    """Tasks t0-t3: reward 0 always (all-equal groups); t4-t7: 1, 0, 1, 0 by sample index."""

    def group_rewards(self, task: Task, rollouts: Sequence[Rollout]) -> list[float]:
        if int(task.name[1:]) < 4:
            return [0.0] * len(rollouts)
        return [float(r.sample % 2 == 0) for r in rollouts]


class HalfFlatEnv(DigitEnv):
    taskset_class = HalfFlatTaskset


def test_batch_scale_divides_by_the_std_of_the_whole_step(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """scale_rewards = batch with dropped groups: every kept advantage is ±0.5 / (std + 1e-4)
    where std is over all the step's rewards (logged as reward_std), dropped groups included."""
    cfg = _config(
        tiny_model_dir,
        tmp_path / "run",
        steps=2,
        dynamic_sampling="drop",
        scale_rewards="batch",
        sampling=SamplingConfig(max_tokens=4, top_p=1.0, seed=0),
    )
    rows = _train(cfg, env=HalfFlatEnv())
    mixed = [r for r in rows if 0 < r["groups_kept"] < r["groups"]]
    assert mixed, rows  # some step dropped a group and kept another
    for row in mixed:
        assert row["adv_max"] == pytest.approx(0.5 / (row["reward_std"] + 1e-4), rel=1e-5)


@pytest.mark.parametrize(
    ("mode", "groups", "kept"),
    [("drop", 4, 0), ("refill", 12, 0), ("off", 4, 4)],
)
def test_all_equal_groups_are_dropped_or_refilled(
    tiny_model_dir: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    mode: str,
    groups: int,
    kept: int,
) -> None:
    cfg = _config(
        tiny_model_dir,
        tmp_path / "run",
        steps=1,
        dynamic_sampling=mode,
        max_refill_rounds=2,
        sampling=SamplingConfig(max_tokens=4, top_p=1.0, seed=0),
    )
    with caplog.at_level(logging.INFO, logger="leanrl.train.grpo"):
        [row] = _train(cfg, env=FlatEnv())
    # refill: the step's 4 groups and 2 extra rounds of 4, none informative
    assert (row["groups"], row["groups_kept"]) == (groups, kept)
    if kept == 0:
        assert row["skipped"] is True and row["loss"] is None
        assert row["optimizer_steps"] == 0  # the same keys as a trained step's row
    else:
        assert row["skipped"] is False and row["optimizer_steps"] == 1
    assert any(
        "step 1/1: reward 0.500" in r.getMessage() and f"groups {kept}/{groups}" in r.getMessage()
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]


def test_async_never_trains_on_batches_staler_than_the_bound(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Training is made slow, so generation runs as far ahead as it is allowed: the logged
    staleness reaches the bound and never passes it."""
    from leanrl.train.grpo.engine import GRPOEngine

    slow = GRPOEngine.train_step

    def train_step(self: Any, batch: Any) -> dict[str, Any]:
        time.sleep(0.25)
        return slow(self, batch)

    monkeypatch.setattr(GRPOEngine, "train_step", train_step)
    cfg = _config(
        tiny_model_dir,
        tmp_path / "run",
        steps=6,
        tasks_per_step=2,
        group_size=2,
        async_generation=True,
        max_staleness=2,
        dynamic_sampling="off",
        sampling=SamplingConfig(max_tokens=4, top_p=1.0, seed=0),
    )
    assert cfg.dual_clip_c == 3.0  # on by default in async mode with staleness > 1
    rows = _train(cfg)
    stale = [r["staleness"] for r in rows]
    assert max(stale) == 2, stale


def test_dual_clip_defaults() -> None:
    from pydantic import ValidationError

    from leanrl.train.grpo import GRPOConfig

    assert GRPOConfig().dual_clip_c is None
    assert GRPOConfig(async_generation=True).dual_clip_c is None  # staleness 1: off
    assert GRPOConfig(async_generation=True, max_staleness=3).dual_clip_c == 3.0
    assert GRPOConfig(async_generation=True, max_staleness=3, dual_clip=0).dual_clip_c is None
    assert GRPOConfig(dual_clip=5).dual_clip_c == 5.0
    with pytest.raises(ValidationError, match="greater than 1"):
        GRPOConfig(dual_clip=0.5)


# -- config errors before anything loads ----------------------------------------------------------


@pytest.fixture
def no_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a model is a test failure: these errors must come first."""
    from leanrl.train.grpo.engine import GRPOEngine

    def load(self: Any, resumed: bool) -> None:
        raise AssertionError("the model was loaded before the config error was reported")

    monkeypatch.setattr(GRPOEngine, "load", load)
    # "org/name" in these tests stands for a hub model in the local cache (the check would
    # otherwise refuse an uncached id offline, as tests/test_hints.py shows).
    monkeypatch.setattr("leanrl.policies._common._cached", lambda repo_id: repo_id == "org/name")


def test_unusable_backends_fail_before_loading(
    tiny_model_dir: Path, tmp_path: Path, no_load: None
) -> None:
    import importlib.util

    from leanrl.train.grpo import GRPOTrainer

    out = tmp_path / "run"
    policy = PolicyConfig(model=str(tiny_model_dir), backend="openai")
    with pytest.raises(ConfigError, match="cannot train through the 'openai' backend"):
        GRPOTrainer(_config(tiny_model_dir, out, policy=policy), env=DigitEnv()).train_sync()
    assert not out.exists()
    if importlib.util.find_spec("vllm") is not None and torch.cuda.is_available():
        pytest.skip("vLLM and a GPU are here: the vllm backend is usable")
    policy = PolicyConfig(model=str(tiny_model_dir), backend="vllm")
    with pytest.raises(ConfigError, match=r"pip install -e .*\[vllm\]|needs a CUDA device"):
        GRPOTrainer(_config(tiny_model_dir, out, policy=policy), env=DigitEnv()).train_sync()
    assert not out.exists()


def test_missing_relative_model_path_fails_before_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_load: None
) -> None:
    from leanrl.train.grpo import GRPOConfig, GRPOTrainer

    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()

    def check(model: str) -> None:
        cfg = GRPOConfig(policy=PolicyConfig(model=model), out=tmp_path / "run")
        GRPOTrainer(cfg, env=DigitEnv()).check()

    with pytest.raises(ConfigError, match="model folder models/nonexistent does not exist"):
        check(os.path.join("models", "nonexistent"))
    # A hub id (no folder 'org' here): looked up in the hub cache, not taken as a path.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PolicyError, match="'org/other' is not in the local Hugging Face cache"):
        check("org/other")
    check("org/name")  # the same shape, cached: passes
    assert not (tmp_path / "run").exists()


def test_failed_start_leaves_the_run_folder_reusable(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A start that fails while loading the model has committed no step: the corrected command
    starts in the same folder instead of being refused as a different run."""
    from leanrl.errors import PolicyError

    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"model_type": "llama"}))  # no weights
    out = tmp_path / "run"
    with pytest.raises(PolicyError, match="cannot load model"):
        _train(_config(broken, out, steps=1))
    assert (out / "config.json").is_file()  # written before the load failed
    rows = _train(_config(tiny_model_dir, out, steps=1))  # the fixed command, same folder
    assert [r["step"] for r in rows] == [1]
    assert json.loads((out / "config.json").read_text())["policy"]["model"] == str(tiny_model_dir)


def test_greedy_sampling_is_refused_and_top_p_warned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, no_load: None
) -> None:
    from pydantic import ValidationError

    from leanrl.train.grpo import GRPOConfig, GRPOTrainer

    with pytest.raises(ValidationError, match=r"temperature around 1\.0"):
        GRPOConfig(sampling=SamplingConfig(temperature=0.0))
    cfg = GRPOConfig(policy=PolicyConfig(model="org/name"), sampling=SamplingConfig(top_p=0.9))
    trainer = GRPOTrainer(cfg.model_copy(update={"out": tmp_path / "r"}))
    with caplog.at_level(logging.WARNING, logger="leanrl.train.grpo"):
        trainer.check()
        trainer.check()  # the CLI checks, then train() checks again: one warning
    warned = [r for r in caplog.records if "top_p" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING
