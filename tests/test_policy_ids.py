"""Policy.generate_from_ids: the optional entry point that takes prompts as token ids (the ids are
used as they are), on the hf policy and on GRPO's training policy, with the tiny model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from leanrl.errors import PolicyError
from leanrl.policy import Completion, Policy, PolicyConfig, SamplingConfig

PROMPT = "theorem t (x : ℕ) : x + 0 = x := by\n"
GREEDY = SamplingConfig(n=2, max_tokens=8, temperature=0.0)


class _TextOnly(Policy):
    name = "text-only"

    async def generate(self, prompts: Any, sampling: SamplingConfig) -> list[list[Completion]]:
        return [[Completion(text="")] for _ in prompts]


async def test_the_default_says_ids_are_not_supported() -> None:
    with pytest.raises(NotImplementedError, match="cannot generate from token ids"):
        await _TextOnly(PolicyConfig()).generate_from_ids([[1, 2]], GREEDY)


async def _policy(kind: str, model_dir: Path) -> Any:
    if kind == "hf":
        from leanrl.policies.hf import HFPolicy

        p = HFPolicy(PolicyConfig(model=str(model_dir), chat=False))
        await p.start()
        return p
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from leanrl.train.hf_policy import TrainPolicy

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    return TrainPolicy(PolicyConfig(model="tiny", chat=False), model, tok)


@pytest.mark.parametrize("kind", ["hf", "train"])
async def test_ids_in_give_the_same_samples_as_the_text_they_encode(
    tiny_model_dir: Path, kind: str
) -> None:
    policy = await _policy(kind, tiny_model_dir)
    (from_text,) = await policy.generate([PROMPT], GREEDY)
    ids = list(from_text[0].prompt_token_ids)
    assert ids
    # A context a harness grew: the prompt, then what the model wrote (ids, not re-tokenized).
    grown = ids + list(from_text[0].token_ids)
    a, b = await policy.generate_from_ids([ids, grown], GREEDY)
    assert [c.token_ids for c in a] == [c.token_ids for c in from_text]
    assert all(list(c.prompt_token_ids) == ids for c in a)
    assert all(list(c.prompt_token_ids) == grown for c in b) and len(b) == 2
    assert all(c.logprobs is not None and len(c.logprobs) == len(c.token_ids) for c in a + b)


@pytest.mark.parametrize("kind", ["hf", "train"])
async def test_bad_ids_are_a_clear_error(tiny_model_dir: Path, kind: str) -> None:
    policy = await _policy(kind, tiny_model_dir)
    with pytest.raises(PolicyError, match=r"prompt_ids\[1\] is empty"):
        await policy.generate_from_ids([[1, 2], []], GREEDY)
    with pytest.raises(PolicyError, match="outside this tokenizer's vocabulary"):
        await policy.generate_from_ids([[1, 10**9]], GREEDY)
