"""Issue 38: the one-step pipeline (``async_generation``; for ``hf`` on a copy of the weights).
Batch s is made on exactly version max(s - k, start) whatever the timing, so an asynchronous run
repeats, and one killed with SIGKILL resumes to what a run resumed there on purpose gives."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from leanrl.runtime import run_sync
from leanrl.train.common import RunDir
from leanrl.train.grpo.data import _Batch
from leanrl.train.grpo.pipeline import Pipeline


class _Engine:
    """The engine's part the pipeline sees: a version counter, a generation copy and updates
    that take random, overlapping times (threads)."""

    def __init__(self, start: int, seed: int) -> None:
        self.step = start
        self.gen_version = start
        self.rng = random.Random(seed)
        self.trained: list[tuple[int, int]] = []  # (step, version its batch was made on)

    def sync_generation_weights(self) -> None:
        time.sleep(self.rng.random() * 0.004)
        self.gen_version = self.step

    def train_step(self, batch: _Batch) -> dict[str, Any]:
        time.sleep(self.rng.random() * 0.006)
        self.trained.append((batch.step, batch.version))
        self.step += 1
        return {}


@pytest.mark.parametrize("lag", [None, 1, 2])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_batch_is_made_on_a_fixed_version(lag: int | None, seed: int) -> None:
    start, steps = 3, 12
    engine = _Engine(start, seed)
    rng = random.Random(100 + seed)

    async def collect(s: int) -> _Batch:
        version = engine.gen_version  # taken before the generation (which takes a while)
        await asyncio.sleep(rng.random() * 0.006)
        return _Batch(step=s, groups=[], kept=[], samples=[], version=version, t_rollout=0.0,
                      t_generate=0.0)  # fmt: skip

    async def run() -> None:
        async with Pipeline(engine, collect, start, steps, lag) as p:
            for s in range(start, steps):
                await p.train(await p.batch(s))

    run_sync(run())
    k = lag or 0
    assert engine.trained == [(s, max(s - k, start)) for s in range(start, steps)]


def test_a_failing_producer_fails_the_run() -> None:
    engine = _Engine(0, 0)

    async def collect(s: int) -> _Batch:
        if s == 2:
            raise RuntimeError("lean fell over")
        return _Batch(step=s, groups=[], kept=[], samples=[], version=engine.gen_version,
                      t_rollout=0.0, t_generate=0.0)  # fmt: skip

    async def run() -> None:
        async with Pipeline(engine, collect, 0, 5, 1) as p:
            for s in range(5):
                await p.train(await p.batch(s))

    with pytest.raises(RuntimeError, match="lean fell over"):
        run_sync(run())
    assert [s for s, _ in engine.trained] == [0, 1]


# -- the trainer, end to end (tiny model) -------------------------------------------------------


def _weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_an_async_hf_run_repeats_exactly(tiny_model_dir: Path, tmp_path: Path) -> None:
    from test_grpo_trainer import _config, _train

    kw: dict[str, Any] = dict(steps=4, tasks_per_step=2, group_size=2, micro_batch_size=4,
                              async_generation=True, save_every=4)  # fmt: skip
    a = _train(_config(tiny_model_dir, tmp_path / "a", **kw))
    b = _train(_config(tiny_model_dir, tmp_path / "b", **kw))
    assert [r["staleness"] for r in a] == [0, 1, 1, 1]  # step 2 on, one step stale
    assert [r["reward_mean"] for r in a] == [r["reward_mean"] for r in b]
    assert [r["loss"] for r in a] == [r["loss"] for r in b]
    wa, wb = _weights(tmp_path / "a" / "checkpoint-4"), _weights(tmp_path / "b" / "checkpoint-4")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_sigkill_of_an_async_run_resumes(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A real kill -9 of `leanrl train grpo` with the pipeline on (hf: a generation copy of the
    weights); the same command finishes the run from the last checkpoint, each step once, and
    ends exactly where a run stopped at that checkpoint and resumed on purpose ends."""
    cfg = tmp_path / "train-grpo-async.toml"
    cfg.write_text(
        'env = { id = "test_grpo_trainer:DigitEnv", harness = { options = { delay_s = 0.2 } } }\n'
        "steps = 6\ntasks_per_step = 2\ngroup_size = 2\nsave_every = 2\nkeep_checkpoints = 8\n"
        "lr = 1e-3\nmask_truncated = false\nasync_generation = true\n"
        "[sampling]\nmax_tokens = 8\ntop_p = 1.0\n"
    )
    out = tmp_path / "killed"
    argv = [sys.executable, "-m", "leanrl.cli", "train", "grpo", "--config", str(cfg)]
    argv += ["--model", str(tiny_model_dir), "--out", str(out)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), *sys.path]))
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while proc.poll() is None and not (out / "checkpoint-2" / "trainer_state.json").exists():
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    # the newest checkpoint when it died (2, unless a loaded machine let it run on)
    k = max(s for s, _ in RunDir(out).checkpoints())

    from leanrl.cli import main

    assert main(argv[3:]) == 0  # the same command, in this process this time
    rows = RunDir(out).metrics()
    assert [r["step"] for r in rows] == list(range(1, 7))
    fresh = [0] + [1] * (6 - k - 1) if k < 6 else []  # a fresh pipeline at step k + 1
    assert [r["staleness"] for r in rows] == [0] + [1] * (k - 1) + fresh

    # on purpose: k steps, then the same command with steps = 6 (a resume)
    planned = tmp_path / "planned"
    assert main([*argv[3:-1], str(planned), "--steps", str(k)]) == 0
    assert main([*argv[3:-1], str(planned)]) == 0
    want = RunDir(planned).metrics()
    assert [r["reward_mean"] for r in rows] == [r["reward_mean"] for r in want]
    wa, wb = _weights(planned / "checkpoint-6"), _weights(out / "checkpoint-6")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
