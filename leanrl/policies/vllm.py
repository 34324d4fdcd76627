"""``vllm`` policy: in-process vLLM on a GPU (the ``vllm`` extra), imported lazily."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from leanrl._dist import install_hint
from leanrl.errors import PolicyError
from leanrl.policies._common import LoopLock, resolve_model, to_messages
from leanrl.policy import (
    Completion,
    Policy,
    PolicyConfig,
    Prompt,
    SamplingConfig,
    StreamCompletion,
    StreamRequest,
    closing_stream,
)

__all__ = ["VLLMPolicy", "completions_from_vllm", "import_vllm", "stream_llm"]


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

    async def stream(self, requests: Sequence[StreamRequest]) -> AsyncIterator[StreamCompletion]:
        """Every completion, each yielded when its request ends: all requests go to the engine
        at once (``llm_engine.add_request``) and its scheduler batches them continuously; the
        engine is stepped in a worker thread and each finished request is handed over at once.
        Each request keeps its own ``sampling.seed``, so its samples are those ``generate``
        gives it."""
        await self.start()
        if not requests:
            return
        inputs: list[Any] = []
        for r in requests:
            if r.prompt_ids is not None:
                if not r.prompt_ids:
                    raise PolicyError("stream got an empty prompt_ids; give at least one token id")
                inputs.append({"prompt_token_ids": [int(t) for t in r.prompt_ids]})
            else:
                inputs.append(self._inputs([r.prompt or ""])[0])
        # aclosing: a consumer that stops early stops (and aborts) the engine's stream at once
        async with (
            self._lock.get(),
            closing_stream(
                stream_llm(self._llm, requests, inputs, _params, self.tokens_generated)
            ) as items,
        ):
            async for item in items:
                self.completed(1)
                yield item

    def _generate_sync(
        self, prompts: list[Prompt], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        return self._run_sync(self._inputs(prompts), sampling)

    def _inputs(self, prompts: Sequence[Prompt]) -> list[Any]:
        """The engine inputs of ``prompts``: text as it is, chat rendered to token ids."""
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
        return texts

    def _run_sync(self, texts: list[Any], sampling: SamplingConfig) -> list[list[Completion]]:
        return completions_from_vllm(self._llm.generate(texts, _params(sampling), use_tqdm=False))


def _params(sampling: SamplingConfig) -> Any:
    """vLLM ``SamplingParams`` of ``sampling`` (with the sampled tokens' logprobs)."""
    vllm = import_vllm()
    return vllm.SamplingParams(
        n=sampling.n,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        max_tokens=sampling.max_tokens,
        seed=sampling.seed,
        stop=list(sampling.stop) or None,
        logprobs=0,  # the sampled token's logprob
    )


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


async def stream_llm(
    llm: Any,
    requests: Sequence[StreamRequest],
    inputs: Sequence[Any],
    params_of: Callable[[SamplingConfig], Any],
    on_tokens: Callable[[int], None] | None = None,
) -> AsyncIterator[StreamCompletion]:
    """Stream ``requests`` through an in-process ``vllm.LLM``: every request goes to its engine
    at once (``llm_engine.add_request``, ``inputs[k]`` the engine input of request k and
    ``params_of`` its ``SamplingParams``), so its scheduler batches them continuously; the
    engine is stepped in a worker thread and each finished request's completions are yielded at
    once. A consumer that stops early aborts what the engine still holds. The caller holds
    whatever lock guards the engine. ``on_tokens`` (a progress display) is called from the
    worker thread with the tokens each engine step generated."""
    if not requests:
        return
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[StreamCompletion | BaseException | None] = asyncio.Queue()
    stop = threading.Event()

    def emit(c: StreamCompletion) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, c)

    def work() -> None:
        try:
            _step_engine(llm.llm_engine, requests, inputs, params_of, emit, stop, on_tokens)
        except BaseException as e:  # noqa: BLE001 - re-raised in the consumer
            loop.call_soon_threadsafe(queue.put_nowait, e)
        else:
            loop.call_soon_threadsafe(queue.put_nowait, None)

    job = asyncio.ensure_future(asyncio.to_thread(work))
    try:
        while (item := await queue.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        await asyncio.shield(job)


def _step_engine(
    engine: Any,
    requests: Sequence[StreamRequest],
    inputs: Sequence[Any],
    params_of: Callable[[SamplingConfig], Any],
    emit: Callable[[StreamCompletion], None],
    stop: threading.Event,
    on_tokens: Callable[[int], None] | None = None,
) -> None:
    tag = uuid.uuid4().hex[:8]
    seen: dict[str, int] = {}  # tokens of each request so far (outputs are cumulative)
    ids = {f"leanrl-{tag}-{k}": k for k in range(len(requests))}
    t0 = time.perf_counter()
    for rid, k in ids.items():
        engine.add_request(rid, inputs[k], params_of(requests[k].sampling))
    left = set(ids)
    try:
        while left and engine.has_unfinished_requests():
            if stop.is_set():
                return
            for out in engine.step():
                if on_tokens is not None and out.request_id in left:
                    now = sum(len(o.token_ids) for o in out.outputs)
                    on_tokens(max(0, now - seen.get(out.request_id, 0)))
                    seen[out.request_id] = now
                if not getattr(out, "finished", False) or out.request_id not in left:
                    continue
                left.discard(out.request_id)
                r = requests[ids[out.request_id]]
                comps = completions_from_vllm([out])[0]
                each = time.perf_counter() - t0
                for k, c in enumerate(comps):
                    emit(StreamCompletion(r.key, k, c, each))
    finally:
        if left:  # stopped early: free the engine of what is still queued
            engine.abort_request(list(left))
