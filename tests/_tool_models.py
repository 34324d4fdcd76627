"""Test stand-ins for the tool-calling harnesses: a tiny tokenizer/model with a chat template
that offers tools (made on the spot), and a TEST policy that answers each turn from a script
(real token ids of the tiny tokenizer, fixed log-probs). Not a model; never used outside tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from leanrl.harnesses.tool_use import HERMES_TOOL_TEMPLATE
from leanrl.policy import Completion, Policy, PolicyConfig, Prompt, SamplingConfig

__all__ = ["ScriptedTextPolicy", "ScriptedToolPolicy", "call", "make_tool_model"]

TEXTS = [
    '<tool_call>\n{"name": "calc", "arguments": {"expr": "1 + 2"}}\n</tool_call>',
    '<tool_call>\n{"name": "submit", "arguments": {"proof": "omega"}}\n</tool_call>',
    "goals check search submit calc omega intro simp theorem := by",
    "<tool_response>\n= 3\n</tool_response>",
]


def make_tool_model(out: Path, texts: Sequence[str] = ()) -> Path:
    """A tiny random model whose tokenizer's chat template offers tools (Hermes layout)."""
    from transformers import AutoTokenizer

    from leanrl.testing import make_tiny_model

    make_tiny_model(out, [*TEXTS, *texts] * 3)
    tok = AutoTokenizer.from_pretrained(out)
    tok.chat_template = HERMES_TOOL_TEMPLATE
    tok.save_pretrained(out)
    return out


def call(name: str, **args: Any) -> str:
    """A Hermes tool call as a model would write it."""
    import json

    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


class ScriptedToolPolicy(Policy):
    """Answers turn k of an episode with ``script[k]`` (the last entry repeats), tokenized by
    the tiny tokenizer and closed with ``<|im_end|>``. The turn is read off the prompt: the
    number of assistant headers in it. ``pick(turn, prompt_text)`` chooses instead, when given."""

    name = "scripted-tools"

    def __init__(
        self,
        tokenizer: Any,
        script: Sequence[str],
        *,
        pick: Callable[[int, str], str] | None = None,
        delay_s: float = 0.0,
    ) -> None:
        super().__init__(PolicyConfig(model="scripted-tools"))
        self.tokenizer = tokenizer
        self.tok = tokenizer  # what it tokenizes with (tokenizer may be hidden: see below)
        self.script = list(script)
        self.pick = pick
        self.delay_s = delay_s
        self.calls = 0
        self.spans: list[tuple[float, float]] = []

    def _answer(self, prompt_text: str) -> str:
        turn = prompt_text.count("<|im_start|>assistant") - 1
        if self.pick is not None:
            return self.pick(turn, prompt_text)
        return self.script[min(turn, len(self.script) - 1)]

    def _completion(self, ids: list[int], text: str) -> Completion:
        tok = self.tok
        out = list(tok(text, add_special_tokens=False).input_ids)
        out.append(tok.convert_tokens_to_ids("<|im_end|>"))
        return Completion(
            text=text,
            token_ids=tuple(out),
            logprobs=tuple(-0.25 for _ in out),
            prompt_token_ids=tuple(ids),
        )

    async def _wait(self) -> None:
        import time

        t0 = time.perf_counter()
        self.calls += 1
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        self.spans.append((t0, time.perf_counter()))

    async def generate(
        self, prompts: Sequence[Prompt], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        await self._wait()
        out = []
        for p in prompts:
            assert isinstance(p, str), "the text mode sends rendered text"
            ids = list(self.tok(p, add_special_tokens=False).input_ids)
            out.append([self._completion(ids, self._answer(p)) for _ in range(sampling.n)])
        return out

    async def generate_from_ids(  # type: ignore[override]
        self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        await self._wait()
        out = []
        for ids in prompt_ids:
            text = str(self.tok.decode(list(ids)))
            out.append([self._completion(list(ids), self._answer(text)) for _ in range(sampling.n)])
        return out


class ScriptedTextPolicy(ScriptedToolPolicy):
    """The same, unable to take token ids (what the harness's ``text`` mode serves)."""

    name = "scripted-tools-text"
    generate_from_ids = Policy.generate_from_ids  # type: ignore[assignment]
