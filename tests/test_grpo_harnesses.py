"""GRPO through the built-in harnesses (whole-proof, tactic-loop) on the scripted TEST runtime.

The scripted runtime judges proofs by a rule (see tests/_scripted_runtime.py), not by Lean; here
it only has to produce Verdicts and multi-turn feedback so that the trainer's plumbing is
exercised: environment tokens carry no loss, pass rates come from Verdicts, a step trains.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from leanrl import Environment, HarnessConfig, Runtime, RuntimeConfig, Taskset
from leanrl.environment import EnvironmentConfig
from leanrl.policy import PolicyConfig, SamplingConfig
from leanrl.taskset import RawRow
from leanrl.train.common import RunDir
from tests._scripted_runtime import ScriptedRuntime

STATEMENTS = [f"theorem s{i} (n : Nat) : n + {i} = {i} + n := by" for i in range(4)]


class Statements(Taskset):
    name = "test-statements"

    def load_rows(self) -> list[RawRow]:
        return [
            RawRow(origin="test", index=i + 1, data={"name": f"s{i}", "formal_statement": s})
            for i, s in enumerate(STATEMENTS)
        ]


class ScriptedEnv(Environment):
    taskset_class = Statements

    def make_runtime(self) -> Runtime:
        return ScriptedRuntime(RuntimeConfig(name="scripted", options={"accept": "omega"}))


def _env(harness: str) -> ScriptedEnv:
    cfg = EnvironmentConfig(
        id="test-scripted",
        harness=HarnessConfig(name=harness, prompt_format="deepseek", max_turns=3),
    )
    return ScriptedEnv(cfg)


def _config(model: Path, out: Path, **kw: Any) -> Any:
    from leanrl.train.grpo import GRPOConfig

    base: dict[str, Any] = dict(
        policy=PolicyConfig(model=str(model)),
        sampling=SamplingConfig(max_tokens=12, top_p=1.0, seed=0),
        out=out,
        steps=2,
        tasks_per_step=2,
        group_size=2,
        lr=1e-3,
        save_every=2,
        dynamic_sampling="off",
        mask_truncated=False,
    )
    base.update(kw)
    return GRPOConfig(**base)


def test_tactic_loop_feedback_tokens_are_masked(tiny_model_dir: Path, tmp_path: Path) -> None:
    from leanrl.train.grpo_engine import GRPOEngine

    cfg = _config(tiny_model_dir, tmp_path / "run")
    engine = GRPOEngine(cfg, RunDir(tmp_path / "run"))
    engine.load(resumed=False)
    policy = asyncio.run(engine.make_generation_policy())
    env = _env("tactic-loop")

    async def go() -> Any:
        async with env:
            return await env.rollout(
                env.tasks()[:2], policy, cfg.sampling.model_copy(update={"n": 2})
            )

    groups = asyncio.run(go())
    rollouts = [r for g in groups for r in g]
    multi = [r for r in rollouts if len(r.turns) > 1]
    assert multi, "the random model's tactics fail, so episodes must run several turns"
    samples = engine.make_samples(groups)
    for r, s in zip(rollouts, samples, strict=True):
        expect: list[int] = []
        for t in r.turns:
            expect += [1] * len(t.completion_ids) + [0] * len(t.feedback_ids)
        assert s.mask == expect
    assert any(0 in s.mask for s in samples)  # Lean's feedback is context, never loss


@pytest.mark.parametrize("harness", ["whole-proof", "tactic-loop"])
def test_grpo_steps_through_builtin_harness(
    tiny_model_dir: Path, tmp_path: Path, harness: str
) -> None:
    from leanrl.train.grpo import GRPOTrainer

    trainer = GRPOTrainer(_config(tiny_model_dir, tmp_path / "run"), env=_env(harness))
    trainer.train_sync()
    rows = trainer.run.metrics()
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["pass_rate"] is not None and 0.0 <= row["pass_rate"] <= 1.0  # from Verdicts
        assert row["loss_tokens"] > 0
        assert row["time_generate"] > 0.0
    assert RunDir(tmp_path / "run").latest_checkpoint() is not None
