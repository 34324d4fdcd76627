"""GRPO with vLLM on a GPU: weights pushed into the running engine, in place, after each step.

Marked ``gpu``: skipped without CUDA, and skipped without the vllm package.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from leanrl.policy import PolicyConfig, SamplingConfig

pytestmark = pytest.mark.gpu

PROMPTS = [f"theorem v{i} (n : Nat) : n + {i} = {i} + n := by" for i in range(4)]


@pytest.fixture(scope="module")
def vllm_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("vllm")
    from leanrl.testing import make_tiny_model

    # head_dim 64: the GPU attention kernels do not take the default tiny model's 16
    return make_tiny_model(
        tmp_path_factory.mktemp("vllm-tiny"), [*PROMPTS, "0123456789 omega"] * 4, hidden_size=256
    )


def _policy(model: Path) -> object:
    from leanrl.train.vllm_sync import VLLMTrainPolicy

    return VLLMTrainPolicy(
        PolicyConfig(
            model=str(model),
            backend="vllm",
            dtype="float32",
            gpu_memory_utilization=0.2,
            options={"enforce_eager": True, "max_model_len": 256},
        )
    )


def test_push_weights_changes_the_running_engine_in_place(vllm_model: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from leanrl.train.vllm_sync import engine_model

    pol = _policy(vllm_model)
    greedy = SamplingConfig(n=1, temperature=0.0, max_tokens=6, seed=0)

    async def go() -> None:
        await pol.start()  # type: ignore[attr-defined]
        llm = pol._llm  # type: ignore[attr-defined]
        before = await pol.generate(PROMPTS[:1], greedy)  # type: ignore[attr-defined]
        hf = AutoModelForCausalLM.from_pretrained(vllm_model)
        with torch.no_grad():
            for p in hf.parameters():
                p.add_(torch.randn_like(p) * 0.5)
        n = pol.push_weights(iter(hf.to("cuda").named_parameters()))  # type: ignore[attr-defined]
        assert n == len(list(hf.parameters()))
        assert pol._llm is llm  # same engine object: no restart  # type: ignore[attr-defined]
        after = (await pol.generate(PROMPTS[:1], greedy))[0][0]  # type: ignore[attr-defined]
        # the engine now computes what the new weights compute
        ids = torch.tensor([list(after.prompt_token_ids) + list(after.token_ids)], device="cuda")
        with torch.no_grad():
            logits = hf(ids).logits[0].float()
        plen = len(after.prompt_token_ids)
        want = torch.log_softmax(logits[plen - 1 : -1], -1)
        want_ids = want.argmax(-1).tolist()
        assert list(after.token_ids) == want_ids[: len(after.token_ids)]
        assert after.token_ids != before[0][0].token_ids or after.logprobs != before[0][0].logprobs
        assert engine_model(llm) is not None
        await pol.close()  # type: ignore[attr-defined]

    asyncio.run(go())


def test_grpo_trains_through_vllm(vllm_model: Path, tmp_path: Path) -> None:
    from leanrl.train.grpo import GRPOConfig, GRPOTrainer
    from tests.test_grpo_trainer import DigitEnv

    cfg = GRPOConfig(
        policy=PolicyConfig(
            model=str(vllm_model),
            backend="vllm",
            dtype="float32",
            gpu_memory_utilization=0.2,
            options={"enforce_eager": True, "max_model_len": 256},
        ),
        sampling=SamplingConfig(max_tokens=16, top_p=1.0, seed=0),
        out=tmp_path / "run",
        steps=3,
        tasks_per_step=4,
        group_size=4,
        lr=3e-3,
        precision="fp32",
        mask_truncated=False,
        save_every=3,
    )
    rows = GRPOTrainer(cfg, env=DigitEnv()).train_sync()
    assert [r["step"] for r in rows] == [1, 2, 3]
    # the sampler's log-probs match the trainer's forward: clipping stays rare on fresh data
    assert all(r["clip_frac"] is None or r["clip_frac"] < 0.05 for r in rows)
