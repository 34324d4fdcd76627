"""``hf`` policy: Hugging Face transformers on CPU or GPU, batched, seeded, with logprobs.

Generation runs in a worker thread (``asyncio.to_thread``) so the event loop keeps verifying
earlier samples meanwhile; a lock keeps one generation on the model at a time.
:meth:`HFPolicy.stream` generates with continuous batching instead of static batches
(:mod:`leanrl.policies._stream_hf`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from leanrl.errors import PolicyError
from leanrl.policies._common import LoopLock, resolve_model, to_messages
from leanrl.policies._stream_hf import ContinuousSampler, Row, finish_completion
from leanrl.policy import (
    Completion,
    Policy,
    PolicyConfig,
    Prompt,
    SamplingConfig,
    StreamCompletion,
    StreamRequest,
)

__all__ = ["HFPolicy"]


class HFPolicy(Policy):
    """A transformers causal LM. Same seed and config give the same samples."""

    name = "hf"

    def __init__(self, config: PolicyConfig) -> None:
        super().__init__(config)
        self._model: Any = None
        self._tok: Any = None
        self._device: Any = None
        self._lock = LoopLock()

    @property
    def model(self) -> Any:
        """The loaded transformers model (None before :meth:`start`); trainers update it."""
        return self._model

    @property
    def tokenizer(self) -> Any:
        """The loaded tokenizer (None before :meth:`start`)."""
        return self._tok

    async def start(self) -> None:
        if self._model is not None:
            return
        source = resolve_model(self.config.model)
        await asyncio.to_thread(self._load, source)

    def _load(self, source: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        cfg = self.config
        device = cfg.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if cfg.dtype == "auto":
            dtype = torch.bfloat16 if str(device).startswith("cuda") else torch.float32
        else:
            dtype = getattr(torch, cfg.dtype)
        try:
            tok = AutoTokenizer.from_pretrained(source)
            model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **cfg.options)
        except (OSError, ValueError) as e:
            raise PolicyError(f"cannot load model {source!r} with transformers: {e}") from e
        tok.padding_side = "left"
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        self._tok, self._device = tok, torch.device(device)
        self._model = model.to(self._device).eval()

    async def close(self) -> None:
        self._model = None
        self._tok = None

    def tokenize(self, text: str) -> list[int]:
        if self._tok is None:
            raise PolicyError("call `await policy.start()` before tokenize()")
        return list(self._tok(text, add_special_tokens=False).input_ids)

    def render(self, prompt: Prompt) -> tuple[str, bool]:
        """The prompt as model input text, and whether it already holds its special tokens."""
        chat = self.config.chat if self.config.chat is not None else not isinstance(prompt, str)
        if not chat:
            if not isinstance(prompt, str):
                raise PolicyError("a chat prompt needs --policy.chat true (or unset)")
            return prompt, False
        if getattr(self._tok, "chat_template", None) is None:
            raise PolicyError(
                f"model {self.config.model!r} has no chat template, so it cannot take chat "
                "prompts. Use a completion prompt format (--env.harness.prompt_format deepseek)."
            )
        text = self._tok.apply_chat_template(
            to_messages(prompt), tokenize=False, add_generation_prompt=True
        )
        return str(text), True

    async def generate(
        self, prompts: Sequence[Prompt], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        await self.start()
        async with self._lock.get():
            return await asyncio.to_thread(self._generate_sync, list(prompts), sampling)

    async def generate_from_ids(
        self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        """``sampling.n`` completions for each prompt given as token ids (used as they are)."""
        await self.start()
        encoded = check_prompt_ids(prompt_ids, len(self._tok))
        async with self._lock.get():
            return await asyncio.to_thread(self._generate_ids_sync, encoded, sampling)

    def stream_replays(self, sampling: SamplingConfig) -> bool:
        """Greedy only: the continuous batch gives greedy decoding's tokens exactly, but seeds
        sampled completions per (seed, slot, sample), where ``generate`` draws a whole chunk
        from one generator."""
        return sampling.temperature == 0

    async def stream(self, requests: Sequence[StreamRequest]) -> AsyncIterator[StreamCompletion]:
        """Every completion, each yielded when it ends, generated with continuous batching
        (:mod:`leanrl.policies._stream_hf`): up to ``batch_size`` sequences at once, a finished
        one replaced by a waiting prompt at once. Greedy output is the static path's; a sampled
        one is seeded per sample from ``(seed, slot, sample)``, whatever else is in flight."""
        await self.start()
        rows: list[Row] = []
        vocab = len(self._tok)
        for r in requests:
            if r.prompt_ids is not None:
                ids = check_prompt_ids([r.prompt_ids], vocab)[0]
            else:
                text, has_specials = self.render(r.prompt or "")
                ids = list(self._tok(text, add_special_tokens=not has_specials).input_ids)
            rows += [Row(r.key, s, ids, r.sampling, r.slot) for s in range(r.sampling.n)]
        if not rows:
            return
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[StreamCompletion | BaseException | None] = asyncio.Queue()
        stop = threading.Event()
        sampler = self.sampler()

        def emit(c: StreamCompletion) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, c)

        def work() -> None:
            try:
                sampler.run(rows, emit, stop)
            except BaseException as e:  # noqa: BLE001 - re-raised in the consumer
                loop.call_soon_threadsafe(queue.put_nowait, e)
            else:
                loop.call_soon_threadsafe(queue.put_nowait, None)

        async with self._lock.get():
            job = asyncio.ensure_future(asyncio.to_thread(work))
            try:
                while True:
                    item = await queue.get()
                    if item is None:
                        break
                    if isinstance(item, BaseException):
                        raise item
                    self.completed(1)
                    yield item
            finally:
                stop.set()  # a consumer that stops early (or fails) ends the generation
                await asyncio.shield(job)

    def sampler(self) -> ContinuousSampler:
        """The continuous-batching sampler over the loaded model (``batch_size`` rows)."""
        sampler = ContinuousSampler(
            self._model,
            self._tok,
            self._device,
            self.config.batch_size,
            _eos_ids(self._model, self._tok),
        )
        sampler.on_tokens = self.tokens_generated  # progress per decoding step
        return sampler

    def _generate_sync(
        self, prompts: list[Prompt], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        tok = self._tok
        encoded: list[list[int]] = []
        for p in prompts:
            text, has_specials = self.render(p)
            encoded.append(list(tok(text, add_special_tokens=not has_specials).input_ids))
        return self._generate_ids_sync(encoded, sampling)

    def _generate_ids_sync(
        self, encoded: list[list[int]], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        import torch

        rows = [i for i in range(len(encoded)) for _ in range(sampling.n)]
        out: list[list[Completion]] = [[] for _ in encoded]
        if sampling.seed is not None:
            # One seed per call: the same prompts, config and seed replay the same samples.
            torch.manual_seed(sampling.seed)
        bs = self.config.batch_size
        for start in range(0, len(rows), bs):
            batch = rows[start : start + bs]
            for i, c in zip(
                batch, self._generate_batch([encoded[i] for i in batch], sampling), strict=True
            ):
                out[i].append(c)
            self.completed(len(batch))  # a progress bar moves per batch, not per call
        return out

    def _generate_batch(self, batch: list[list[int]], sampling: SamplingConfig) -> list[Completion]:
        import torch
        from transformers import LogitsProcessorList
        from transformers.generation.logits_process import (
            TemperatureLogitsWarper,
            TopPLogitsWarper,
        )

        tok, dev = self._tok, self._device
        width = max(len(ids) for ids in batch)
        pad = tok.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in batch], device=dev)
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in batch], device=dev)
        recorder = _LogprobRecorder()
        greedy = sampling.temperature == 0
        procs: list[Any] = []
        if not greedy:
            # Our own warpers, placed before the recorder, so the recorded logprobs are those
            # of the distribution actually sampled from (transformers would add its warpers
            # after any custom processor).
            if sampling.temperature != 1.0:
                procs.append(TemperatureLogitsWarper(sampling.temperature))
            if sampling.top_p < 1.0:
                procs.append(TopPLogitsWarper(top_p=sampling.top_p))
        procs.append(recorder)
        kw: dict[str, Any] = {
            "max_new_tokens": sampling.max_tokens,
            "do_sample": not greedy,
            "pad_token_id": pad,
            "logits_processor": LogitsProcessorList(procs),
            "return_dict_in_generate": True,
        }
        if not greedy:
            kw.update(temperature=1.0, top_p=1.0, top_k=0)
        if sampling.stop:
            kw.update(stop_strings=list(sampling.stop), tokenizer=tok)
        if self.on_tokens is not None:  # someone shows progress: count tokens every step
            kw["streamer"] = _TokenCounter(self.tokens_generated, _eos_ids(self._model, tok), pad)
        with torch.no_grad():
            res = self._model.generate(input_ids=input_ids, attention_mask=mask, **kw)
        gen = res.sequences[:, width:]
        lps = recorder.finish(gen)
        eos = _eos_ids(self._model, tok)
        return [
            finish_completion(
                tok,
                eos,
                batch[b],
                gen[b].tolist(),
                lps[b].tolist() if lps is not None else [],
                sampling,
            )
            for b in range(gen.shape[0])
        ]


class _TokenCounter:
    """A transformers streamer that reports, each decoding step, how many rows generated a
    token (``generate`` hands it every step's new tokens). A row is done after its EOS; a row
    ended otherwise (a stop string) is fed padding from then on, so a padding token is only
    counted once the row goes on with a real one (a model may sample the padding token itself).
    Only a progress display reads the count."""

    def __init__(self, report: Callable[[int], None], eos: set[int], pad: int | None) -> None:
        self.report = report
        self.eos = eos
        self.pad = pad
        self.done: list[bool] = []
        self.held: list[int] = []  # padding tokens of each row not counted yet

    def put(self, value: Any) -> None:
        if value.dim() > 1:  # the prompt, handed over before the first step
            return
        tokens = value.tolist()
        if not self.done:
            self.done, self.held = [False] * len(tokens), [0] * len(tokens)
        n = 0
        for i, t in enumerate(tokens):
            if self.done[i]:
                continue
            if t == self.pad and t not in self.eos:
                self.held[i] += 1
                continue
            n += 1 + self.held[i]
            self.held[i] = 0
            self.done[i] = t in self.eos
        self.report(n)

    def end(self) -> None:
        pass


class _LogprobRecorder:
    """A logits processor placed last: keeps the log-softmax of the final scores of each step
    and, at the next step, picks out the token that was sampled (one step's scores in memory,
    not the whole generation's)."""

    def __init__(self) -> None:
        self.prev: Any = None
        self.steps: list[Any] = []

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        if self.prev is not None:
            self.steps.append(self.prev.gather(1, input_ids[:, -1:]).squeeze(1))
        self.prev = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, generated: Any) -> Any:
        import torch

        if self.prev is None or generated.shape[1] == 0:
            return None
        if len(self.steps) < generated.shape[1]:
            self.steps.append(self.prev.gather(1, generated[:, -1:]).squeeze(1))
        self.prev = None
        return torch.stack(self.steps, dim=1).cpu()


def check_prompt_ids(prompt_ids: Sequence[Sequence[int]], vocab: int) -> list[list[int]]:
    """The prompts as lists of ints, or a clear error for an empty prompt or an id out of range."""
    out: list[list[int]] = []
    for k, ids in enumerate(prompt_ids):
        row = [int(x) for x in ids]
        if not row:
            raise PolicyError(f"prompt_ids[{k}] is empty: a prompt needs at least one token")
        bad = [x for x in row if not 0 <= x < vocab]
        if bad:
            raise PolicyError(
                f"prompt_ids[{k}] holds token id {bad[0]}, outside this tokenizer's "
                f"vocabulary (0..{vocab - 1}): were the ids made with another tokenizer?"
            )
        out.append(row)
    return out


def _eos_ids(model: Any, tok: Any) -> set[int]:
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), tok):
        e = getattr(src, "eos_token_id", None)
        if isinstance(e, int):
            ids.add(e)
        elif isinstance(e, (list, tuple)):
            ids.update(int(x) for x in e)
    return ids
