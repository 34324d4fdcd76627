"""An in-process policy over the very torch model a trainer optimises.

The trainer owns the model; this policy only borrows it to sample. Each completion carries its
token ids and the log-probability of each sampled token under the distribution it was sampled
from, ``log softmax(logits / temperature)`` (before top-p truncation, which the trainer's
recomputation cannot see either; use ``top_p = 1`` for an exact importance ratio). Greedy
decoding (temperature 0) reports ``log softmax(logits)``.

Decoding is a plain KV-cached loop (no ``generate``): prompts are left-padded, position ids come
from the attention mask (the trainer uses the same convention), and sampling uses a private
``torch.Generator`` seeded from ``SamplingConfig.seed`` and a per-seed call counter, so the same
seed, config and call order give the same samples. A row that ends (EOS or a stop string)
leaves the batch, KV cache rows included, and nothing new joins mid-decode: later decode steps
cost what their live rows cost, with the same samples as a decode that keeps every row.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, ClassVar

import torch

from leanrl.policies.hf import check_prompt_ids
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

__all__ = ["MIN_ROWS", "TrainPolicy"]

#: Finished rows leave the decode batch only down to this many rows (finished ones kept as
#: filler below it). A matrix product's rows come out bit for bit the same whatever the batch
#: from 4 rows up on the CPU's BLAS (MKL: measured for widths 64 to 2048 and outputs up to a
#: 152k vocabulary), but not with 1-3 rows, which take another kernel; with the floor a live
#: row's logits, hence its samples and log-probs, are those of the full-batch decode exactly.
MIN_ROWS = 4


class TrainPolicy(Policy):
    """Samples from ``model`` (a transformers causal LM) with ``tokenizer``. ``start`` is a no-op:
    the model is already loaded by the trainer, which may swap it (``model`` attribute)."""

    name: ClassVar[str] = "train-hf"

    def __init__(
        self,
        config: PolicyConfig,
        model: Any,
        tokenizer: Any,
        *,
        autocast_dtype: torch.dtype | None = None,
        seed_salt: int = 0,
        drop_finished: bool = True,
    ) -> None:
        super().__init__(config)
        # Rows that end leave the decode batch (same samples, fewer rows per step); False keeps
        # every row to the end, as before (the reference the tests compare with).
        self.drop_finished = drop_finished
        #: While a decode runs: the row of the decode's batch (prompt i's sample s is row
        #: i * n + s of its ``batch_size`` chunk) that each row of the model's input is, for
        #: forward hooks that follow rows (a benchmark's logits processor).
        self.decode_rows: torch.Tensor | None = None
        # Mixed into every generator seed: ranks of a distributed run get the same sampling seed
        # (so a run's seeds do not depend on the number of ranks) but must not draw the same noise.
        self.seed_salt = seed_salt
        self.model = model
        self.tokenizer = tokenizer
        self.autocast_dtype = autocast_dtype
        self.lock = threading.Lock()  # one decode at a time; the trainer takes it to swap weights
        self._calls: dict[int, int] = {}

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        """Token ids of a prompt: chat prompts go through the chat template."""
        if isinstance(prompt, str) and not self.config.chat:
            return self.tokenize(prompt)
        msgs = (
            [{"role": "user", "content": prompt}]
            if isinstance(prompt, str)
            else [m.model_dump() for m in prompt]
        )
        ids = self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # BatchEncoding in transformers 5
            ids = ids["input_ids"]
        return list(ids)

    async def generate(
        self, prompts: Sequence[Prompt], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        # The decode is blocking torch work: run it in a thread so the event loop keeps
        # verifying finished attempts meanwhile.
        return await asyncio.to_thread(self.generate_sync, prompts, sampling)

    async def generate_from_ids(
        self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        """``sampling.n`` completions for each prompt given as token ids (used as they are)."""
        encoded = check_prompt_ids(prompt_ids, len(self.tokenizer))
        return await asyncio.to_thread(self.generate_ids_sync, encoded, sampling)

    def stream_replays(self, sampling: SamplingConfig) -> bool:
        # the stream is the very decode generate runs, handing each row over as it ends
        return True

    async def stream(self, requests: Sequence[StreamRequest]) -> AsyncIterator[StreamCompletion]:
        """Each completion as soon as its row of the batch ends (EOS or a stop string), while
        the other rows go on decoding. Requests with the same sampling are decoded as one
        :meth:`generate` call of their prompts in request order would decode them (the same
        batches, seeds and call counter), so a stream gives exactly ``generate``'s completions;
        it only hands them over earlier, so that their checks overlap the rest of the decode."""
        groups: list[tuple[SamplingConfig, list[StreamRequest]]] = []
        for r in requests:  # consecutive requests of one sampling: one generate call
            if groups and groups[-1][0] == r.sampling:
                groups[-1][1].append(r)
            else:
                groups.append((r.sampling, [r]))
        for sampling, group in groups:
            async with closing_stream(self._stream_group(sampling, group)) as items:
                async for item in items:
                    yield item

    async def _stream_group(
        self, sampling: SamplingConfig, group: list[StreamRequest]
    ) -> AsyncIterator[StreamCompletion]:
        """One generate call's worth of requests, streamed."""
        encoded = [
            list(r.prompt_ids) if r.prompt_ids is not None else self.prompt_ids(r.prompt or "")
            for r in group
        ]
        if any(r.prompt_ids is not None for r in group):
            encoded = check_prompt_ids(encoded, len(self.tokenizer))
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[StreamCompletion | BaseException | None] = asyncio.Queue()
        t0 = time.perf_counter()

        def emit(i: int, s: int, c: Completion) -> None:
            sc = StreamCompletion(group[i].key, s, c, time.perf_counter() - t0)
            loop.call_soon_threadsafe(queue.put_nowait, sc)

        def work() -> None:
            try:
                self.generate_ids_sync(encoded, sampling, emit)
            except BaseException as e:  # noqa: BLE001 - re-raised in the consumer
                loop.call_soon_threadsafe(queue.put_nowait, e)
            else:
                loop.call_soon_threadsafe(queue.put_nowait, None)

        job = asyncio.ensure_future(asyncio.to_thread(work))
        try:
            while (item := await queue.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                self.completed(1)
                yield item
        finally:
            # The decode is not stopped part-way (its generator and call counter must stay
            # those of a whole generate call): a consumer that stops early waits for its end.
            await asyncio.shield(job)

    def generate_sync(
        self, prompts: Sequence[Prompt], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        """Blocking :meth:`generate`."""
        return self.generate_ids_sync([self.prompt_ids(p) for p in prompts], sampling)

    def generate_ids_sync(
        self,
        encoded: Sequence[Sequence[int]],
        sampling: SamplingConfig,
        on_done: Callable[[int, int, Completion], None] | None = None,
    ) -> list[list[Completion]]:
        """Blocking :meth:`generate_from_ids` (no checks on the ids). ``on_done(i, s, c)`` is
        called as soon as sample s of prompt i is done (see :meth:`_decode`)."""
        with self.lock:
            gen = torch.Generator(device="cpu")
            if sampling.seed is not None:
                k = self._calls.get(sampling.seed, 0)
                self._calls[sampling.seed] = k + 1
                salt = self.seed_salt * 0x9E3779B97F4A7C15
                gen.manual_seed((sampling.seed * 1_000_003 + k + salt) % (2**63))
            else:
                gen.seed()
            flat = [(i, list(ids)) for i, ids in enumerate(encoded) for _ in range(sampling.n)]
            out: list[list[Completion]] = [[] for _ in encoded]
            bs = self.config.batch_size
            for lo in range(0, len(flat), bs):
                chunk = flat[lo : lo + bs]
                done = None
                if on_done is not None:

                    def done(k: int, c: Completion, lo: int = lo) -> None:
                        # flat row lo + k is sample (lo + k) % n of prompt (lo + k) // n
                        on_done((lo + k) // sampling.n, (lo + k) % sampling.n, c)

                for (i, _ids), c in zip(
                    chunk, self._decode([ids for _, ids in chunk], sampling, gen, done), strict=True
                ):
                    out[i].append(c)
            return out

    @torch.no_grad()
    def _decode(
        self,
        prompts: list[list[int]],
        sampling: SamplingConfig,
        gen: torch.Generator,
        on_done: Callable[[int, Completion], None] | None = None,
    ) -> list[Completion]:
        """Decode ``prompts`` as one batch. ``on_done(k, completion)`` is called as soon as
        row k finishes (EOS or a stop string; at the end for rows that reach ``max_tokens``),
        while the other rows go on decoding: the stream's hand-over. It changes nothing in the
        decode, so the completions are the same with or without it."""
        model = self.model
        device = next(model.parameters()).device
        pad = self.tokenizer.pad_token_id
        if pad is None:
            pad = self.tokenizer.eos_token_id or 0
        eos = _eos_ids(self.tokenizer, model)
        n = len(prompts)
        width = max(len(p) for p in prompts)
        ids = torch.full((n, width), pad, dtype=torch.long)
        attn = torch.zeros((n, width), dtype=torch.long)
        for k, p in enumerate(prompts):  # left padding: every prompt ends at the same column
            ids[k, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            attn[k, width - len(p) :] = 1
        ids, attn = ids.to(device), attn.to(device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)  # [n, width]
        # The mask only hides left padding. Rows that finished leave the batch (below; where the
        # cache cannot drop rows they keep attending to what they are fed, their outputs
        # discarded; rows never see each other), and without padding no mask is passed at all,
        # which spares the model building one every step.
        mask: torch.Tensor | None = attn if bool((attn == 0).any()) else None
        temp = sampling.temperature
        steps = sampling.max_tokens
        out_tok = torch.full((n, steps), pad, dtype=torch.long)  # [n, max_tokens]
        out_lp = torch.zeros((n, steps), dtype=torch.float32)
        lengths = torch.zeros(n, dtype=torch.long)  # tokens kept per sequence (EOS included)
        alive = torch.ones(n, dtype=torch.bool)
        eos_t = torch.tensor(sorted(eos), dtype=torch.long)
        stopped_by_text = [False] * n
        window = stop_window(sampling.stop)

        def row(k: int, finished: bool) -> Completion:
            toks = out_tok[k, : int(lengths[k])].tolist()
            lps = out_lp[k, : int(lengths[k])].tolist()
            body = toks[:-1] if finished and not stopped_by_text[k] else toks
            text = self.tokenizer.decode(body, skip_special_tokens=True)  # as vLLM does
            if stopped_by_text[k]:
                text = _cut_at_stop(text, sampling.stop)
            return Completion(
                text=text,
                token_ids=tuple(toks),
                logprobs=tuple(lps),
                prompt_token_ids=tuple(prompts[k]),
                finish_reason="stop" if finished else "length",
            )

        was_training = model.training
        model.eval()
        cache: Any = None
        step_ids, step_pos = ids, pos
        # Original row of each row of the batch being decoded. Rows that end leave the batch
        # (their KV cache rows are dropped), so a decode step costs what its live rows cost;
        # nothing joins mid-decode (the batch is the caller's). Each live row sees exactly what
        # it saw in the full batch, and the sampling noise is still drawn for all n rows, so the
        # samples are those of a decode that keeps every row to the end.
        live = torch.arange(n)
        compact = self.drop_finished
        self.decode_rows = live
        try:
            for i in range(steps):
                with _autocast(device, self.autocast_dtype):
                    res = model(
                        input_ids=step_ids,
                        attention_mask=mask,
                        position_ids=step_pos,
                        use_cache=True,
                        logits_to_keep=1,
                        **{_cache_kwarg(model): cache},
                    )
                cache = _cache_of(res)
                logits = res.logits[:, -1, :].float()  # [m, V], m = len(live)
                logp_all = torch.log_softmax(logits / temp if temp > 0 else logits, dim=-1)
                if temp > 0:
                    tok = _sample(logp_all, sampling.top_p, gen, live, n)  # [m]
                else:
                    tok = logp_all.argmax(-1)
                lp = logp_all.gather(-1, tok.unsqueeze(-1)).squeeze(-1)
                tok_c = tok.cpu()
                was_alive = alive.clone()
                on = was_alive[live]  # which rows of the batch still write (all, compacted)
                rows_on = live[on]
                out_tok[rows_on, i] = tok_c[on]
                out_lp[rows_on, i] = lp.cpu()[on]
                lengths[rows_on] += 1
                alive[live] &= ~torch.isin(tok_c, eos_t)
                if sampling.stop:  # stop strings need text: only then decode, only live rows
                    lo = max(0, i + 1 - window)  # the tail only: O(1) per step, not O(i)
                    for k in alive.nonzero().flatten().tolist():
                        if _hits_stop(
                            self.tokenizer, out_tok[k, lo : i + 1].tolist(), sampling.stop
                        ):
                            alive[k] = False
                            stopped_by_text[k] = True
                if on_done is not None:  # rows that ended at this step: final from here on
                    for k in (was_alive & ~alive).nonzero().flatten().tolist():
                        on_done(k, row(k, finished=True))
                if not bool(alive.any()):
                    break
                keep = alive[live].clone()  # rows of the batch that stay
                short = min(MIN_ROWS, len(live)) - int(keep.sum())
                if short > 0:  # finished rows stay as filler (outputs discarded; see MIN_ROWS)
                    keep[(~keep).nonzero().flatten()[:short]] = True
                if compact and not bool(keep.all()) and _can_drop_rows(cache):
                    idx = keep.nonzero().flatten()
                    idx_d = idx.to(device)
                    cache.batch_select_indices(idx_d)
                    tok = tok.index_select(0, idx_d)
                    step_pos = step_pos.index_select(0, idx_d)
                    if mask is not None:
                        mask = mask.index_select(0, idx_d)
                    live = live.index_select(0, idx)
                    self.decode_rows = live
                step_ids = tok.unsqueeze(-1)
                if mask is not None:
                    mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
                step_pos = step_pos[:, -1:] + 1
        finally:
            if was_training:
                model.train()
        comps = [row(k, finished=not bool(alive[k])) for k in range(n)]
        if on_done is not None:
            for k in alive.nonzero().flatten().tolist():  # cut off at max_tokens
                on_done(k, comps[k])
        return comps


def _can_drop_rows(cache: Any) -> bool:
    """Whether rows can leave ``cache`` (every layer a plain key/value ``DynamicLayer``, sliding
    windows included); other caches (recurrent states, static ones) keep every row."""
    from transformers.cache_utils import DynamicLayer

    layers: list[Any] = list(getattr(cache, "layers", None) or [])
    return bool(layers) and all(isinstance(la, DynamicLayer) for la in layers)


def _cache_kwarg(model: Any) -> str:
    """transformers 5.x renamed ``past_key_values`` to ``cache``; accept both."""
    params = inspect.signature(type(model).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _cache_of(res: Any) -> Any:
    cache = getattr(res, "cache", None)
    return cache if cache is not None else getattr(res, "past_key_values", None)


def _sample(
    logp: torch.Tensor,
    top_p: float,
    gen: torch.Generator,
    rows: torch.Tensor | None = None,
    n: int | None = None,
) -> torch.Tensor:
    """Sample one token per row from log-probs [m, V], keeping the top-p nucleus. With ``rows``:
    the batch's rows are rows ``rows`` of a batch of ``n``; the noise is drawn for all n (the
    generator moves as for the full batch) and each row takes its own."""
    n = logp.shape[0] if n is None else n
    probs = logp.exp()
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        cum = sorted_p.cumsum(-1)
        drop = cum - sorted_p > top_p  # tokens entirely outside the nucleus
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    # argmax(p / E) with E ~ Exp(1) is an exact categorical sample (the exponential race) and
    # much cheaper than multinomial; the noise comes from the CPU generator, so runs repeat on
    # any device.
    u = torch.rand((n, probs.shape[-1]), generator=gen)
    if rows is not None and len(rows) < n:
        u = u.index_select(0, rows)
    noise = -torch.log(u.clamp_(min=1e-20))  # Exp(1)
    return (probs / noise.to(probs.device)).argmax(-1)


def _eos_ids(tokenizer: Any, model: Any) -> set[int]:
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        e = getattr(src, "eos_token_id", None) if src is not None else None
        if isinstance(e, int):
            ids.add(e)
        elif isinstance(e, (list, tuple)):
            ids.update(int(x) for x in e)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids


def stop_window(stop: Sequence[str]) -> int:
    """Tokens at the end of a completion that can hold any of the stop strings.

    The check runs after every token, so a stop string can only newly appear ending at the
    newest token; every token is at least one byte, so a string of B bytes spans at most B + 1
    tokens (one more where it starts inside a token).
    """
    return max([16, *(len(s.encode()) + 1 for s in stop)])


def _hits_stop(tokenizer: Any, tail: list[int], stop: list[str]) -> bool:
    text = tokenizer.decode(tail, skip_special_tokens=False)
    return any(s in text for s in stop)


def _cut_at_stop(text: str, stop: list[str]) -> str:
    cut = min((i for s in stop if (i := text.find(s)) >= 0), default=len(text))
    return text[:cut]


class _autocast:
    """bf16 autocast on CUDA when asked; a no-op elsewhere."""

    def __init__(self, device: torch.device, dtype: torch.dtype | None) -> None:
        self.ctx: Any = (
            torch.autocast(device_type="cuda", dtype=dtype)
            if dtype is not None and device.type == "cuda"
            else None
        )

    def __enter__(self) -> None:
        if self.ctx is not None:
            self.ctx.__enter__()

    def __exit__(self, *exc: object) -> None:
        if self.ctx is not None:
            self.ctx.__exit__(*exc)
