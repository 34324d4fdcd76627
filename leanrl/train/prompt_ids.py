"""A prompt as token ids, exactly as ``leanrl eval``'s ``hf`` policy tokenizes it.

Shared by SFT (:mod:`leanrl.train.sft.data`: the prompt part of every example) and the in-run
eval of every trainer (:class:`leanrl.train.inrun_eval.LivePolicy`), so that what a model is
trained on and evaluated with during a run is what ``leanrl eval`` gives it later. Imports no
torch.
"""

from __future__ import annotations

from typing import Any

from leanrl.errors import ConfigError
from leanrl.policy import Prompt

__all__ = ["as_messages", "is_chat", "prompt_token_ids"]


def as_messages(prompt: Prompt) -> list[dict[str, str]]:
    """The prompt as chat-template messages (a text prompt is one user message)."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [{"role": m.role, "content": m.content} for m in prompt]


def is_chat(prompt: Prompt, chat: bool | None) -> bool:
    """Whether the prompt goes through the chat template (``policy.chat``; unset: chat prompts)."""
    return chat if chat is not None else not isinstance(prompt, str)


def prompt_token_ids(tokenizer: Any, prompt: Prompt, chat: bool | None = None) -> list[int]:
    """The ids a prompt becomes in ``leanrl eval``'s ``hf`` policy (``HFPolicy.render``): text
    prompts with the tokenizer's special tokens (BOS), chat prompts through the chat template
    with the generation prompt."""
    if not is_chat(prompt, chat):
        if not isinstance(prompt, str):
            raise ConfigError("a chat prompt needs policy.chat true (or unset)")
        return list(tokenizer(prompt, add_special_tokens=True).input_ids)
    if getattr(tokenizer, "chat_template", None) is None:
        raise ConfigError(
            "the model's tokenizer has no chat template, so it cannot take chat prompts; use a "
            "completion prompt format (--env.harness.prompt_format deepseek)"
        )
    text = tokenizer.apply_chat_template(
        as_messages(prompt), tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer(str(text), add_special_tokens=False).input_ids)
