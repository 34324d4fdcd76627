"""``vllm`` policy: in-process vLLM on a GPU (the ``vllm`` extra), imported lazily."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from leanrl._dist import install_hint
from leanrl.errors import PolicyError
from leanrl.policies._common import LoopLock, resolve_model, to_messages
from leanrl.policy import Completion, Policy, PolicyConfig, Prompt, SamplingConfig

__all__ = ["VLLMPolicy", "completions_from_vllm", "import_vllm"]


def import_vllm() -> Any:
    """The ``vllm`` module, or a :class:`PolicyError` saying how to install it."""
    try:
        import vllm
    except ImportError as e:
        raise PolicyError(
            f"the vllm backend needs the optional vLLM package ({e}). Install it with "
            f"`{install_hint('vllm')}` on a machine with a CUDA GPU, or use --backend hf "
            "(transformers) or --backend openai (a running server)."
        ) from e
    return vllm


class VLLMPolicy(Policy):
    """A vLLM engine in this process. Generation runs in a worker thread."""

    name = "vllm"

    def __init__(self, config: PolicyConfig) -> None:
        super().__init__(config)
        self._llm: Any = None
        self._lock = LoopLock()

    async def start(self) -> None:
        if self._llm is not None:
            return
        vllm = import_vllm()
        source = resolve_model(self.config.model)
        kw: dict[str, Any] = {
            "model": source,
            "gpu_memory_utilization": self.config.gpu_memory_utilization,
            "dtype": self.config.dtype,
        }
        kw.update(self.config.options)
        self._llm = await asyncio.to_thread(vllm.LLM, **kw)

    async def close(self) -> None:
        self._llm = None

    def tokenize(self, text: str) -> list[int]:
        if self._llm is None:
            raise PolicyError("call `await policy.start()` before tokenize()")
        return list(self._llm.get_tokenizer().encode(text, add_special_tokens=False))

    @property
    def tokenizer(self) -> Any:
        """The engine's Hugging Face tokenizer (multi-turn harnesses build id contexts with it)."""
        return None if self._llm is None else self._llm.get_tokenizer()

    async def generate(
        self, prompts: Sequence[Prompt], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        await self.start()
        async with self._lock.get():
            return await asyncio.to_thread(self._generate_sync, list(prompts), sampling)

    async def generate_from_ids(
        self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        """Generate from exact token ids (vLLM's ``{"prompt_token_ids": ...}`` inputs)."""
        await self.start()
        inputs: list[Any] = [{"prompt_token_ids": [int(t) for t in ids]} for ids in prompt_ids]
        if any(not x["prompt_token_ids"] for x in inputs):
            raise PolicyError("generate_from_ids got an empty prompt; give at least one token id")
        async with self._lock.get():
            return await asyncio.to_thread(self._run_sync, inputs, sampling)

    def _generate_sync(
        self, prompts: list[Prompt], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        tok = self._llm.get_tokenizer()
        texts: list[Any] = []
        for p in prompts:
            chat = self.config.chat if self.config.chat is not None else not isinstance(p, str)
            if chat:
                text = tok.apply_chat_template(
                    to_messages(p), tokenize=False, add_generation_prompt=True
                )
                # The rendered template already holds its special tokens (BOS for DeepSeek- or
                # Llama-style templates); a text prompt would get a second BOS from vLLM's
                # tokenizer, so pass the ids.
                texts.append({"prompt_token_ids": list(tok.encode(text, add_special_tokens=False))})
            else:
                texts.append(p)
        return self._run_sync(texts, sampling)

    def _run_sync(self, texts: list[Any], sampling: SamplingConfig) -> list[list[Completion]]:
        vllm = import_vllm()
        params = vllm.SamplingParams(
            n=sampling.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_tokens,
            seed=sampling.seed,
            stop=list(sampling.stop) or None,
            logprobs=0,  # the sampled token's logprob
        )
        return completions_from_vllm(self._llm.generate(texts, params, use_tqdm=False))


def completions_from_vllm(results: Any) -> list[list[Completion]]:
    """vLLM ``RequestOutput``s as Completions (with the sampled tokens' logprobs, when the
    request asked for ``logprobs=0``)."""
    out: list[list[Completion]] = []
    for res in results:
        row = []
        for o in res.outputs:
            lps = None
            if o.logprobs is not None:
                lps = tuple(
                    float(d[t].logprob) for d, t in zip(o.logprobs, o.token_ids, strict=False)
                )
            row.append(
                Completion(
                    text=o.text,
                    token_ids=tuple(o.token_ids),
                    logprobs=lps,
                    prompt_token_ids=tuple(res.prompt_token_ids or ()),
                    finish_reason="length" if o.finish_reason == "length" else "stop",
                )
            )
        out.append(row)
    return out
