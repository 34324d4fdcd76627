"""Synchronous GRPO overlaps generation and checking: chunk j+1 generates while chunk j's
attempts are in Lean; groups come back in task order; a run logs its GPU-idle fraction."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from pathlib import Path

import pytest
from test_es_pipeline import EVENTS, EchoEnv

from leanrl.policy import Completion, Policy, PolicyConfig, Prompt, SamplingConfig
from leanrl.runtime import run_sync
from leanrl.task import Task
from leanrl.train.grpo.overlap import chunked_rollout


class LockedPolicy(Policy):
    """One generate call at a time (like the trainer's policies); text = the first prompt."""

    name = "locked"

    def __init__(self) -> None:
        super().__init__(PolicyConfig(model="locked"))
        self.lock = asyncio.Lock()
        self.seeds: list[int | None] = []

    async def generate(
        self, prompts: Sequence[Prompt], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        async with self.lock:
            key = f"{prompts[0]}:0"
            self.seeds.append(sampling.seed)
            EVENTS.append(("gen-start", key, asyncio.get_running_loop().time()))
            await asyncio.sleep(0.02)
            EVENTS.append(("gen-end", key, asyncio.get_running_loop().time()))
            return [[Completion(text=f"{p}:0")] for p in prompts]


def _tasks(n: int) -> list[Task]:
    return [Task(name=f"t{i}", header="", formal_statement=f"{i}") for i in range(n)]


def test_chunks_overlap_and_keep_task_order() -> None:
    EVENTS.clear()
    env = EchoEnv()
    env.config.runtime.options["check_s"] = 0.05
    policy = LockedPolicy()
    tasks = _tasks(6)
    groups = run_sync(chunked_rollout(env, tasks, policy, SamplingConfig(seed=5), chunks=3))
    assert [g[0].task_id for g in groups] == [t.id for t in tasks]
    at = {(k, key): t for k, key, t in EVENTS}
    # chunks hold tasks 0-1, 2-3, 4-5; each chunk's check is keyed by its first task
    assert at[("gen-start", "2:0")] < at[("check-end", "0:0")]
    assert at[("gen-start", "4:0")] < at[("check-end", "2:0")]
    assert policy.seeds == [5, 5 + 104_729, 5 + 2 * 104_729]  # a seed per chunk, from the step's
    # one chunk: generate everything, then check (the old behaviour)
    EVENTS.clear()
    run_sync(chunked_rollout(env, tasks, LockedPolicy(), SamplingConfig(seed=5), chunks=1))
    assert [k for k, _, _ in EVENTS] == ["gen-start", "gen-end", "check-start", "check-end"]


def test_grpo_logs_gpu_idle(toy_model_dir: Path, tmp_path: Path) -> None:
    from test_grpo_trainer import DigitEnv, _config

    from leanrl.train.grpo import GRPOTrainer

    cfg = _config(toy_model_dir, tmp_path / "run", steps=2, rollout_chunks=2)
    trainer = GRPOTrainer(cfg, env=DigitEnv())
    rows = trainer.train_sync()
    assert all(0.0 <= r["gpu_idle_frac"] <= 1.0 for r in rows)
    assert rows[-1]["tokens"] > 0 and rows[-1]["total_tokens"] >= rows[-1]["tokens"]


def test_budget_stops_grpo_early(
    toy_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from test_grpo_trainer import DigitEnv, _config

    from leanrl.train.grpo import GRPOTrainer

    first = GRPOTrainer(_config(toy_model_dir, tmp_path / "one", steps=1), env=DigitEnv())
    per_step = first.train_sync()[0]["tokens"]
    budget = int(2.5 * per_step)  # spent during the third step
    cfg = _config(toy_model_dir, tmp_path / "run", steps=50, budget={"tokens": budget})
    with caplog.at_level(logging.INFO, logger="leanrl"):
        rows = GRPOTrainer(cfg, env=DigitEnv()).train_sync()
    assert len(rows) < 50

    def near(i: int) -> bool:  # the stopping rule: reached, or a mean step would overshoot more
        total = rows[i]["total_tokens"]
        return total >= budget or total + total / (i + 1) / 2 > budget

    assert near(len(rows) - 1) and not any(near(i) for i in range(len(rows) - 1))
    # it ends within half of its biggest step of the budget (it used to overshoot a whole step)
    assert abs(rows[-1]["total_tokens"] - budget) <= max(r["tokens"] for r in rows) / 2 + 1
    assert (tmp_path / "run" / f"checkpoint-{len(rows)}").is_dir()  # saved where it stopped
    # it says why it stopped, in one line, in the row that spent it and in summary.json
    spent = rows[-1]["total_tokens"]
    line = f"budget spent: {spent} generated tokens of {budget}"
    assert [m for m in caplog.messages if m.startswith(line)], caplog.messages
    assert any(m.endswith(f"stopping after step {len(rows)}") for m in caplog.messages)
    assert [r.get("budget_spent") for r in rows] == [None] * (len(rows) - 1) + [True]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["budget"] == {
        "tokens": budget, "gpu_s": None, "spent": True, "total_tokens": spent,
        "total_gpu_s": rows[-1]["cost/total_gpu_s"],
    }  # fmt: skip
    # rerun with the same budget: nothing to train, and it says so
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="leanrl"):
        assert GRPOTrainer(cfg, env=DigitEnv()).train_sync() == []
    said = f"budget already spent: {spent} generated tokens of {budget} at step {len(rows)}"
    assert [m for m in caplog.messages if m.startswith(said)], caplog.messages
    # a bigger budget continues the same run (the budget may change on resume)
    more = _config(toy_model_dir, tmp_path / "run", steps=50, budget={"tokens": 2 * budget})
    rows2 = GRPOTrainer(more, env=DigitEnv()).train_sync()
    assert rows2[0]["step"] == len(rows) + 1
    both = rows + rows2
    assert abs(both[-1]["total_tokens"] - 2 * budget) <= max(r["tokens"] for r in both) / 2 + 1
