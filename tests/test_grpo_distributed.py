"""GRPO on several ranks (torch.distributed, gloo, 2 real processes over loopback).

The rollouts here come from a scripted harness: the completion of sample j of a task is a pure
function of (task, j, the step's sampling seed), and its token log-probs are left for the trainer
to recompute. So the batch of a step is the same whatever the number of ranks, and a difference
between runs can only come from the training itself:

- a 2-rank step (DDP and FSDP2) ends at the weights of the 1-rank step on the same batch (to
  float tolerance: the ranks sum the same gradients in another order);
- a run saved with 2 ranks resumes with 1 and ends where the 1-rank run ends; with the same
  number of ranks a resumed run is bit-identical to an uninterrupted one;
- only rank 0 writes the run folder (``tests/_ranks.py`` makes every write on another rank fail).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from leanrl import Harness, Rollout, Runtime, Task, Taskset, Turn
from leanrl.policy import Completion, Policy, PolicyConfig, SamplingConfig
from tests._ranks import run_ranks
from tests.test_grpo_trainer import DigitEnv, digit_share

pytestmark = pytest.mark.slow

WORDS = ["1", "22", "x", "omega", "7 8", "simp", "303", "a", "9", "rfl"]


class ScriptedHarness(Harness):
    """Completions chosen by a seeded RNG from (task, sample, sampling seed); no log-probs."""

    name = "test-scripted"

    async def run(
        self,
        tasks: Sequence[Task],
        policy: Policy,
        runtime: Runtime,
        sampling: SamplingConfig,
        taskset: Taskset,
    ) -> list[list[Rollout]]:
        out = []
        for task in tasks:
            group = []
            for j in range(sampling.n):
                rng = random.Random(f"{task.id}:{j}:{sampling.seed}")
                text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6)))
                c = Completion(
                    text=text,
                    token_ids=tuple(policy.tokenize(text)),
                    prompt_token_ids=tuple(policy.tokenize(task.formal_statement)),
                    finish_reason="stop",
                )
                r = Rollout(
                    task_id=task.id,
                    sample=j,
                    prompt=task.formal_statement,
                    prompt_ids=list(c.prompt_token_ids),
                    turns=[Turn.from_completion(c)],
                )
                r.reward = digit_share(text)
                group.append(r)
            out.append(group)
        return out


class ScriptedEnv(DigitEnv):
    def make_harness(self) -> Harness:
        return ScriptedHarness(self.config.harness)


def _config(model: Path, out: Path, **kw: Any) -> Any:
    from leanrl.train.grpo import GRPOConfig

    base: dict[str, Any] = dict(
        policy=PolicyConfig(model=str(model)),
        sampling=SamplingConfig(max_tokens=16, top_p=1.0, seed=0),
        out=out,
        steps=2,
        tasks_per_step=3,
        group_size=3,  # 9 sequences: 5 on rank 0, 4 on rank 1
        micro_batch_size=2,  # so rank 1 runs a stand-in micro-batch to keep in step
        lr=3e-3,
        weight_decay=0.0,
        save_every=100,
        dynamic_sampling="off",
        # one rank would train each group as it is reported (stream_training), two cannot:
        # the same micro-batches on both sides, so only the ranks' summation order differs
        stream_training=False,
    )
    base.update(kw)
    return GRPOConfig(**base)


def _train(cfg: Any) -> None:
    from leanrl.train.grpo import GRPOTrainer

    GRPOTrainer(cfg, env=ScriptedEnv()).train_sync()


def _weights(ckpt: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors: the model's, or with LoRA the adapters'."""
    from safetensors.torch import load_file

    lora = (ckpt / "adapter_config.json").is_file()
    return load_file(str(ckpt / ("adapter_model.safetensors" if lora else "model.safetensors")))


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    "kw",
    [
        {"distributed": {"strategy": "ddp"}},
        {"distributed": {"strategy": "fsdp"}, "beta": 0.05, "minibatches": 3},
        {"distributed": {"strategy": "fsdp"}, "lora": {"rank": 4}, "beta": 0.05},
    ],
    ids=["ddp", "fsdp-kl-3minibatches", "fsdp-lora-kl"],
)
def test_two_rank_steps_equal_the_one_rank_steps(
    own_tiny_model: Path, tmp_path: Path, kw: dict[str, Any]
) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    _train(_config(own_tiny_model, one, **kw))
    run_ranks(2, _train, _config(own_tiny_model, two, **kw))
    base = _weights(own_tiny_model)
    w1, w2 = _weights(one / "checkpoint-2"), _weights(two / "checkpoint-2")
    if "lora" in kw:  # adapters only; B starts at zero
        moved = max(float(v.abs().max()) for k, v in w1.items() if "lora_B" in k)
    else:
        moved = _max_diff(w1, {k: v for k, v in base.items() if k in w1})
    assert moved > 1e-3  # the steps did change the weights
    assert _max_diff(w1, w2) < 1e-5 * max(1.0, moved)
    r1, r2 = _rows(one), _rows(two)
    assert [r["step"] for r in r2] == [1, 2]  # one line per step: rank 1 logged nothing
    for a, b in zip(r1, r2, strict=True):
        assert a["reward_mean"] == b["reward_mean"]  # the same batch
        for key in ("loss", "entropy", "clip_frac", "grad_norm", "kl"):
            if a[key] is None:
                assert b[key] is None
            else:
                assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-7), key
    state = json.loads((two / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["world_size"] == 2


def test_resume_with_another_number_of_ranks(own_tiny_model: Path, tmp_path: Path) -> None:
    """2 ranks (FSDP) to step 2, then 1 rank to step 4, ends where 1 rank all along ends; and 2
    ranks stopped at step 2 and resumed end bit-identical to 2 ranks all along."""
    kw: dict[str, Any] = {"save_every": 2, "distributed": {"strategy": "fsdp"}}
    ref = tmp_path / "one-rank"
    _train(_config(own_tiny_model, ref, steps=4, **kw))
    mixed = tmp_path / "two-then-one"
    run_ranks(2, _train, _config(own_tiny_model, mixed, steps=2, **kw))
    saved = torch.load(mixed / "checkpoint-2" / "optimizer.pt", weights_only=True)
    assert saved["format"] == "named"  # keyed by parameter name: any number of ranks loads it
    _train(_config(own_tiny_model, mixed, steps=4, **kw))
    assert _max_diff(_weights(ref / "checkpoint-4"), _weights(mixed / "checkpoint-4")) < 1e-5
    assert [r["step"] for r in _rows(mixed)] == [1, 2, 3, 4]

    whole, split = tmp_path / "two-whole", tmp_path / "two-split"
    run_ranks(2, _train, _config(own_tiny_model, whole, steps=4, **kw))
    run_ranks(2, _train, _config(own_tiny_model, split, steps=2, **kw))
    run_ranks(2, _train, _config(own_tiny_model, split, steps=4, **kw))
    a, b = _weights(whole / "checkpoint-4"), _weights(split / "checkpoint-4")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_refused_with_ranks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from leanrl.errors import ConfigError
    from leanrl.train.grpo import GRPOConfig, GRPOTrainer

    monkeypatch.setenv("WORLD_SIZE", "2")
    # "org/name" stands for a hub model in the local cache (the model check comes first)
    monkeypatch.setattr("leanrl.policies._common._cached", lambda repo_id: repo_id == "org/name")
    for kw, msg in [
        ({"async_generation": True}, "async_generation with 2 ranks"),
        ({"policy": {"model": "org/name", "backend": "vllm"}}, "run a vLLM server instead"),
    ]:
        cfg = GRPOConfig(**{"policy": {"model": "org/name"}, "out": tmp_path / "r", **kw})
        with pytest.raises(ConfigError, match=msg):
            GRPOTrainer(cfg).check()
    assert not (tmp_path / "r").exists()


def test_round_robin() -> None:
    from leanrl.train.distributed import round_robin

    assert round_robin(5, 2) == [[0, 2, 4], [1, 3]]
    assert round_robin(1, 3) == [[0], [], []]
    with pytest.raises(ValueError):
        round_robin(3, 0)


def test_a_one_rank_torchrun_launch_runs_sharded(own_tiny_model: Path, tmp_path: Path) -> None:
    """``torchrun --nproc_per_node 1`` takes the FSDP path with one rank (how the sharded code
    is checked on one GPU) and ends where the plain single process ends."""
    kw: dict[str, Any] = {"distributed": {"strategy": "fsdp"}}
    _train(_config(own_tiny_model, tmp_path / "plain", **kw))
    run_ranks(1, _train, _config(own_tiny_model, tmp_path / "fsdp1", **kw))
    a, b = (
        _weights(tmp_path / "plain" / "checkpoint-2"),
        _weights(tmp_path / "fsdp1" / "checkpoint-2"),
    )
    assert _max_diff(a, b) < 1e-5
    state = json.loads((tmp_path / "fsdp1" / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["world_size"] == 1
