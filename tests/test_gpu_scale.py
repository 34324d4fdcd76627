"""The GPU side of scaling (issue 14): bf16 GRPO steps, FSDP2 with one rank (and two, with two
GPUs), LoRA, on the Hugging Face path. Marked ``gpu``: skipped without CUDA.

``benchmarks/gpu_check.sh`` runs these (and the other ``gpu`` tests of the trainers) as one
script on a machine with a GPU.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from leanrl.policy import PolicyConfig, SamplingConfig
from tests._ranks import run_ranks
from tests.test_grpo_trainer import DigitEnv

pytestmark = pytest.mark.gpu


def _config(model: Path, out: Path, **kw: Any) -> Any:
    from leanrl.train.grpo import GRPOConfig

    base: dict[str, Any] = dict(
        policy=PolicyConfig(model=str(model), device="cuda"),
        sampling=SamplingConfig(max_tokens=16, top_p=1.0, seed=0),
        out=out,
        steps=3,
        tasks_per_step=4,
        group_size=4,
        lr=3e-3,
        weight_decay=0.0,
        save_every=3,
        mask_truncated=False,
        precision="bf16-mixed",
    )
    base.update(kw)
    return GRPOConfig(**base)


def _train(cfg: Any) -> None:
    from leanrl.train.grpo import GRPOTrainer

    GRPOTrainer(cfg, env=DigitEnv()).train_sync()


def _rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _finite(rows: list[dict[str, Any]]) -> bool:
    return all(r["loss"] is None or math.isfinite(r["loss"]) for r in rows)


def test_bf16_mixed_grpo_steps(own_tiny_model: Path, tmp_path: Path) -> None:
    _train(_config(own_tiny_model, tmp_path / "run"))
    rows = _rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3] and _finite(rows)
    # ρ against the sampler's bf16 log-probs stays near 1 on fresh rollouts
    assert all(r["clip_frac"] is None or r["clip_frac"] < 0.05 for r in rows)


@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_one_rank_torchrun_launch_on_a_gpu(
    own_tiny_model: Path, tmp_path: Path, strategy: str
) -> None:
    out = tmp_path / "run"
    run_ranks(1, _train, _config(own_tiny_model, out, distributed={"strategy": strategy}))
    rows = _rows(out)
    assert [r["step"] for r in rows] == [1, 2, 3] and _finite(rows)
    assert (out / "checkpoint-3" / "model.safetensors").is_file()


def test_two_gpus_fsdp(own_tiny_model: Path, tmp_path: Path) -> None:
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    out = tmp_path / "run"
    run_ranks(2, _train, _config(own_tiny_model, out, distributed={"strategy": "fsdp"}))
    assert [r["step"] for r in _rows(out)] == [1, 2, 3]


def test_lora_bf16_on_a_gpu(own_tiny_model: Path, tmp_path: Path) -> None:
    pytest.importorskip("peft")
    out = tmp_path / "run"
    _train(_config(own_tiny_model, out, lora={"rank": 8, "save_merged": True}))
    assert _finite(_rows(out))
    assert (out / "checkpoint-3" / "adapter_model.safetensors").is_file()
    assert (out / "checkpoint-3" / "merged" / "model.safetensors").is_file()


def test_lora_with_fsdp_on_a_gpu(own_tiny_model: Path, tmp_path: Path) -> None:
    pytest.importorskip("peft")
    out = tmp_path / "run"
    cfg = _config(own_tiny_model, out, lora={"rank": 8}, distributed={"strategy": "fsdp"})
    run_ranks(1, _train, cfg)
    assert _finite(_rows(out))
    assert (out / "checkpoint-3" / "adapter_model.safetensors").is_file()
