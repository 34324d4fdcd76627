"""Fast-subset guards for breaks planted for issue 42 (the list in the issue's note).

Dropping the generation prompt from the chat prompts that training tokenizes
(``leanrl.train.prompt_ids.prompt_token_ids`` rendering with ``add_generation_prompt=False``) was
caught only by ``tests/test_sft.py``, a module that is slow as a whole, so ``pytest -m "not slow"``
passed with it. This checks the same thing with the tokenizer alone: the ids a chat prompt becomes
in training end with the assistant's turn opener and are the ids ``leanrl eval``'s ``hf`` policy
renders for it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from leanrl import HarnessConfig, Task
from leanrl.harnesses.whole_proof.prompts import build_prompt
from leanrl.train.prompt_ids import prompt_token_ids

TASK = Task(name="t0", header="", formal_statement="theorem t0 (n : Nat) : n + 0 = 0 + n := by")


@pytest.mark.parametrize("fmt", ["chat", "kimina"])
def test_chat_prompt_ids_end_with_the_generation_prompt(toy_model_dir: Path, fmt: str) -> None:
    from transformers import AutoTokenizer

    from leanrl.policies.hf import HFPolicy
    from leanrl.policy import PolicyConfig

    tok: Any = AutoTokenizer.from_pretrained(toy_model_dir)
    prompt = build_prompt(TASK, HarnessConfig(prompt_format=fmt))
    assert not isinstance(prompt, str)  # a chat prompt: it goes through the chat template
    ids = prompt_token_ids(tok, prompt)
    opener = list(tok("<|im_start|>assistant\n", add_special_tokens=False).input_ids)
    assert ids[-len(opener) :] == opener, tok.decode(ids[-8:])
    # and they are what `leanrl eval`'s hf policy feeds the model (the toy model loads in ms)
    pol = HFPolicy(PolicyConfig(model=str(toy_model_dir)))
    asyncio.run(pol.start())
    try:
        text, has_specials = pol.render(prompt)
        assert ids == list(pol.tokenizer(text, add_special_tokens=not has_specials).input_ids)
    finally:
        asyncio.run(pol.close())
