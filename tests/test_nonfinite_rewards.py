"""A reward that is not a finite number (NaN, an infinity, a string) is refused, naming the
step or chunk, the task, the attempt and the value, in GRPO, ``leanrl eval`` and expert
iteration; nothing non-finite reaches a checkpoint or a JSON file (``allow_nan=False``).

The bad rewards come from small Taskset subclasses, as a user's reward function would give
them. GRPO uses the digit-reward test environment of ``tests/test_grpo_trainer.py`` (no Lean);
eval and expert iteration use the scripted TEST runtime (a rule, not Lean).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

from leanrl import EnvironmentConfig, Rollout, RuntimeConfig, Task, TasksetConfig
from leanrl.environments.dataset import Dataset, DatasetTaskset
from leanrl.errors import LeanrlError
from leanrl.eval import EvalConfig, run_eval
from leanrl.eval.report import write_report
from leanrl.rollout import RewardError, check_rewards
from leanrl.train.common import RunDir
from leanrl.verdict import Reason, Verdict
from tests._scripted_runtime import ScriptedPolicy
from tests.test_grpo_trainer import DigitEnv, DigitTaskset, PromptHarness, _config, _train

TOY = Path(__file__).parent / "fixtures" / "toy_tasks.jsonl"
RT = "tests._scripted_runtime:ScriptedRuntime"
BAD = [math.nan, math.inf, -math.inf, "1.0"]


def strict_json(text: str) -> Any:
    """``json.loads`` that fails on ``NaN``/``Infinity`` (Python's extension, not JSON)."""

    def refuse(name: str) -> Any:
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def strict_lines(path: Path) -> list[Any]:
    return [strict_json(line) for line in path.read_text(encoding="utf-8").splitlines()]


# -- GRPO ---------------------------------------------------------------------------------------


class _BadRewardTaskset(DigitTaskset):
    """The digit reward, except ``bad`` for sample 1 of every task."""

    bad: ClassVar[Any] = math.nan

    def group_rewards(self, task: Task, rollouts: Sequence[Rollout]) -> list[float]:
        good = super().group_rewards(task, rollouts)
        return [self.bad if r.sample == 1 else g for r, g in zip(rollouts, good, strict=True)]


def _bad_env(value: Any) -> DigitEnv:
    taskset = type("BadTaskset", (_BadRewardTaskset,), {"bad": value})
    env_cls = type("BadEnv", (DigitEnv,), {"taskset_class": taskset})
    return env_cls()


@pytest.mark.parametrize("value", BAD, ids=["nan", "inf", "-inf", "str"])
def test_grpo_refuses_a_non_finite_reward_and_writes_no_checkpoint(
    tiny_model_dir: Path, tmp_path: Path, value: Any
) -> None:
    out = tmp_path / "run"
    cfg = _config(tiny_model_dir, out, steps=2, save_every=1, sampling={"max_tokens": 4})
    with pytest.raises(RewardError) as got:
        _train(cfg, env=_bad_env(value))
    msg = str(got.value)
    assert "\n" not in msg
    assert "step 1, task 't" in msg and f"rollout 1 got reward {value!r}" in msg, msg
    assert "fix its reward function" in msg
    if isinstance(value, str):
        assert "not a number" in msg
    assert RunDir(out).checkpoints() == []  # nothing trained, nothing NaN saved


def test_grpo_async_refuses_it_too(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The async producer collects rollouts on its own task: its error still ends the run."""
    out = tmp_path / "run"
    cfg = _config(
        tiny_model_dir,
        out,
        steps=2,
        save_every=1,
        async_generation=True,
        sampling={"max_tokens": 4},
    )
    with pytest.raises(RewardError, match=r"step 1, task 't\d', rollout 1 got reward nan"):
        _train(cfg, env=_bad_env(math.nan))
    assert RunDir(out).checkpoints() == []


class _InfraHarness(PromptHarness):
    """Sample 0 of every task comes back ``infra`` with a NaN reward (a reward function that
    says "no reward" for an attempt nobody could judge)."""

    async def run(self, *args: Any, **kw: Any) -> list[list[Rollout]]:
        groups = await super().run(*args, **kw)
        for g in groups:
            g[0].verdict = Verdict.reject(Reason.INFRA, "sandbox died twice")
            g[0].reward = math.nan
        return groups


class _InfraEnv(DigitEnv):
    def make_harness(self) -> PromptHarness:
        return _InfraHarness(self.config.harness)


def test_grpo_exempts_infra_rollouts_and_their_nan_reaches_no_weight(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """An infra rollout's reward is no outcome: not refused, and never in a tensor (a NaN
    times a zero weight is still NaN, which made every advantage and weight NaN)."""
    import torch
    from safetensors.torch import load_file

    out = tmp_path / "run"
    cfg = _config(tiny_model_dir, out, steps=1, save_every=1, sampling={"max_tokens": 4})
    [row] = _train(cfg, env=_InfraEnv())
    assert row["infra"] == 4 and math.isfinite(row["reward_mean"])
    assert all(math.isfinite(a) for a in (row["adv_min"], row["adv_max"]))
    [(_, ck)] = RunDir(out).checkpoints()
    weights = load_file(str(next(ck.glob("*.safetensors"))))
    assert all(bool(torch.isfinite(t).all()) for t in weights.values())


def test_check_rewards_makes_numbers_plain_floats() -> None:
    import numpy as np

    rs = [Rollout(task_id="a", sample=i, prompt="p") for i in range(3)]
    rs[0].reward, rs[1].reward, rs[2].reward = np.float32(0.5), 1, True  # type: ignore[assignment]
    check_rewards(rs, "step 1", "why")
    assert [(r.reward, type(r.reward)) for r in rs] == [(0.5, float), (1.0, float), (1.0, float)]
    rs[1].reward = None  # type: ignore[assignment]
    with pytest.raises(RewardError, match=r"task 'a', rollout 1 got reward None \(a NoneType"):
        check_rewards(rs, "step 1", "why")


# -- eval ---------------------------------------------------------------------------------------


class _DatasetBad(DatasetTaskset):
    """Binary reward, except ``bad`` for sample 1 of the tasks after the first two."""

    bad: ClassVar[Any] = math.nan

    def group_rewards(self, task: Task, rollouts: Sequence[Rollout]) -> list[float]:
        good = super().group_rewards(task, rollouts)
        late = task.id not in ("toy_0", "toy_1")  # chunk 0 (two tasks) is fine
        return [
            self.bad if late and r.sample == 1 else g for r, g in zip(rollouts, good, strict=True)
        ]


class NanTaskset(_DatasetBad):
    bad = math.nan


class InfTaskset(_DatasetBad):
    bad = math.inf


class NegInfTaskset(_DatasetBad):
    bad = -math.inf


class StrTaskset(_DatasetBad):
    bad = "1.0"


class NanEnv(Dataset):
    taskset_class = NanTaskset


class InfEnv(Dataset):
    taskset_class = InfTaskset


class NegInfEnv(Dataset):
    taskset_class = NegInfTaskset


class StrEnv(Dataset):
    taskset_class = StrTaskset


ENVS = {"nan": "NanEnv", "inf": "InfEnv", "-inf": "NegInfEnv", "str": "StrEnv"}


def _env(name: str, split: str = "train") -> EnvironmentConfig:
    return EnvironmentConfig(
        id=f"tests.test_nonfinite_rewards:{name}",
        taskset=TasksetConfig(path=TOY, split=split, limit=4),
        runtime=RuntimeConfig(name=RT),
    )


TEXTS = ["\n  omega\n", "\n  simp\n"]


@pytest.mark.parametrize(("value", "kind"), list(zip(BAD, ENVS, strict=True)), ids=list(ENVS))
async def test_eval_refuses_a_non_finite_reward_and_its_files_stay_json(
    tmp_path: Path, value: Any, kind: str
) -> None:
    out = tmp_path / "run"
    cfg = EvalConfig(
        env=_env(ENVS[kind]),
        samples=2,
        out=out,
        chunk_tasks=2,
        pipeline_depth=1,  # chunk 0 is recorded before chunk 1 is rolled out
        progress=False,
    )
    with pytest.raises(RewardError) as got:
        await run_eval(cfg, policy=ScriptedPolicy(TEXTS))
    msg = str(got.value)
    assert "\n" not in msg and "chunk 1" in msg, msg
    assert f"task 'toy_2', attempt 1 got reward {value!r}" in msg, msg
    assert "fix its reward function" in msg
    recs = strict_lines(out / "results.jsonl")  # every line JSON, no bare NaN
    assert sorted((r["task_id"], r["sample"]) for r in recs) == [
        ("toy_0", 0),
        ("toy_0", 1),
        ("toy_1", 0),
        ("toy_1", 1),
    ]
    assert all(isinstance(r["reward"], float) for r in recs)
    strict_lines(out / "proofs.jsonl")
    assert not (out / "summary.json").exists()  # never written with a bad score in it


def test_summary_json_refuses_nan_and_names_where(tmp_path: Path) -> None:
    """The last line of defence: a NaN anywhere in the summary (a runtime's metric) is an
    error naming it, and summary.json is not written."""
    summary = {"results": {"pass_at_k_curve": {}}, "runtime": {"metrics": {"cost": math.nan}}}
    with pytest.raises(LeanrlError, match=r"summary\.json: runtime\.metrics\.cost is nan"):
        write_report(tmp_path, summary, plot=False)
    assert not (tmp_path / "summary.json").exists()


# -- expert iteration ---------------------------------------------------------------------------


def test_expert_iteration_refuses_a_non_finite_reward(toy_model_dir: Path, tmp_path: Path) -> None:
    from leanrl.policy import PolicyConfig, SamplingConfig
    from leanrl.train.sft.expert_iteration import ExpertIteration, ExpertIterationConfig

    run = tmp_path / "run"
    cfg = ExpertIterationConfig(
        policy=PolicyConfig(model=str(toy_model_dir)),
        env=_env("NanEnv"),
        out=run,
        rounds=1,
        samples=2,
        sampling=SamplingConfig(temperature=1.0, top_p=1.0, max_tokens=6, seed=0),
    )
    with pytest.raises(RewardError) as got:
        ExpertIteration(cfg).train_sync()
    msg = str(got.value)
    assert msg.startswith("expert iteration round 1: eval "), msg
    assert "attempt 1 got reward nan" in msg and "fix its reward function" in msg
    assert RunDir(run).checkpoints() == []  # no round was published
    sample = run / "round-1" / "sample"
    strict_lines(sample / "results.jsonl")
    assert not (sample / "summary.json").exists()
