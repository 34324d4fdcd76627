"""ES with LoRA: only the adapters are perturbed (the master is theirs, not the model's), the run
learns on the toy environment, replays bit for bit, and saves peft-loadable adapters."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_es_learning import toy_config

from leanrl.train.es import ESTrainer
from leanrl.train.es.history import replay

pytest.importorskip("peft", reason="LoRA needs peft (the lora extra)")


def test_es_lora_perturbs_only_adapters_learns_and_replays(
    own_tiny_model: Path, tmp_path: Path
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "run"
    cfg = toy_config(
        own_tiny_model, out, steps=12, population=8, mirrored=True, tasks_per_step=4,
        sigma=0.05, alpha=0.1, save_every=6, lora={"rank": 4, "save_merged": True},
    )  # fmt: skip
    trainer = ESTrainer(cfg)
    rows = trainer.train_sync()
    base = AutoModelForCausalLM.from_pretrained(own_tiny_model)
    n_model = sum(p.numel() for p in base.parameters())
    names = trainer.weights.names()
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    assert trainer.weights.numel() < n_model / 4  # no full fp32 master
    # the base weights are exactly the base model's: ES never touched them
    live = {n: p for n, p in trainer.model.named_parameters() if ".base_layer." in n}
    ref = dict(base.named_parameters())
    for n, p in live.items():
        want = ref[n.replace("base_model.model.", "").replace(".base_layer.", ".")]
        assert torch.equal(p.detach(), want.detach())
    means = [r["reward_mean"] for r in rows]
    assert sum(means[-3:]) / 3 > sum(means[:3]) / 3, means

    # replay (from the base model, and from the checkpoint) gives the live adapters bit for bit
    for use_ckpt in (False, True):
        _, _, w = replay(out, use_checkpoints=use_ckpt)
        assert w.equal(trainer.weights.master)
    ckpt = out / "checkpoint-12"
    assert (ckpt / "adapter_model.safetensors").is_file()
    adapted = PeftModel.from_pretrained(base, str(ckpt)).eval()
    merged = AutoModelForCausalLM.from_pretrained(ckpt / "merged").eval()
    ids = torch.tensor([[3, 14, 15, 9, 26]])
    with torch.no_grad():
        assert torch.allclose(
            adapted(input_ids=ids).logits, merged(input_ids=ids).logits, atol=1e-5
        )


def test_es_lora_refuses_the_vllm_scorer(own_tiny_model: Path, tmp_path: Path) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"lora\.rank > 0 with scorer\.backend = 'vllm'"):
        toy_config(
            own_tiny_model, tmp_path, lora={"rank": 4}, scorer={"backend": "vllm"},
            policy={"model": str(own_tiny_model), "backend": "vllm"},
        )  # fmt: skip
