"""Continuous batching for the ``hf`` policy: a live batch of rows, each at its own length.

Rows that finish (EOS, a stop string, ``max_tokens``) leave the batch at once, and waiting
prompts are admitted into the freed places, so the model always works on up to ``batch_size``
sequences instead of waiting for the longest one of a static batch. Built on transformers'
``DynamicCache``:

* admission: the new prompts are prefilled together (left-padded) into their own cache, which
  is then joined to the live one along the batch dimension, the shorter of the two padded on the
  left of the sequence dimension (zeros under a 0 in the attention mask, so never attended to);
  every row's ``position_ids`` count only its real tokens, so RoPE sees the positions a lone
  sequence would;
* leaving: the finished rows are dropped from the cache (``index_select`` over the batch), and
  padding every remaining row has on its left is cut off.

Why not transformers' own continuous batching (``generate_batch``, paged attention): in the
pinned 5.24 it samples from one seed for the whole manager and one generation config, and knows
no stop strings, so a request's samples would depend on its neighbours and stop strings would
run to ``max_tokens``. Here each sample has its own ``torch.Generator`` seeded from
``(seed, slot, sample)``, logprobs are those of the distribution sampled from (temperature and
top-p applied, as the static path records them), and stop strings end a row when they appear.

Models whose cache has layers other than plain full-attention ``DynamicLayer`` (sliding-window
or hybrid models) cannot have caches joined: their rows are admitted in waves (a new batch once
the live one has emptied), still dropping finished rows.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from leanrl.policies._common import cut_at_stop
from leanrl.policy import Completion, SamplingConfig, StreamCompletion, sample_seed

__all__ = ["ContinuousSampler", "Row", "finish_completion"]

_STOP_WINDOW = 8
"""Tokens beyond a stop string's length decoded each step to look for it (a token is at least
one character here but for rare byte fragments; a stop string missed while generating is
still cut from the final text, only later)."""


@dataclass
class Row:
    """One sample being generated."""

    key: Any
    sample: int
    prompt: list[int]
    sampling: SamplingConfig
    slot: int = 0
    ids: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    gen: Any = None
    t0: float = 0.0


def finish_completion(
    tok: Any,
    eos: set[int],
    prompt: Sequence[int],
    ids: list[int],
    lp: list[float],
    sampling: SamplingConfig,
) -> Completion:
    """The Completion of generated ``ids`` (with their logprobs): cut after the first EOS and
    at the first stop string, the same way for the static and the continuous path."""
    finish = "length"
    end = len(ids)
    for t, tid in enumerate(ids):
        if tid in eos:
            end, finish = t + 1, "stop"
            break
    ids, lp = ids[:end], lp[:end]
    body = ids[:-1] if finish == "stop" else ids
    text = tok.decode(body, skip_special_tokens=True)
    if sampling.stop:
        cut = cut_at_stop(
            text, sampling.stop, ids, lambda x: tok.decode(x, skip_special_tokens=True)
        )
        if cut is not None:
            text, keep = cut
            ids, lp, finish = ids[:keep], lp[:keep], "stop"
    return Completion(
        text=text,
        token_ids=tuple(ids),
        logprobs=tuple(float(x) for x in lp),
        prompt_token_ids=tuple(prompt),
        finish_reason=finish,  # type: ignore[arg-type]
    )


class ContinuousSampler:
    """Generates rows with continuous batching (see the module docstring). Runs in one worker
    thread; :meth:`run` calls ``emit`` with each finished completion as it ends."""

    def __init__(self, model: Any, tok: Any, device: Any, batch_size: int, eos: set[int]) -> None:
        import inspect

        self.model, self.tok, self.device = model, tok, device
        self.batch_size = batch_size
        self.eos = eos
        self.busy_s = 0.0
        """Seconds spent in :meth:`run` (benchmarks read it)."""
        self.on_tokens: Callable[[int], None] | None = None
        """Called with the number of live rows after each decoding step (one token each), for
        a progress display."""
        params: Mapping[str, Any]
        try:
            params = inspect.signature(model.forward).parameters
        except (TypeError, ValueError):  # pragma: no cover - a forward without a signature
            params = {}
        # Only the last position's logits are needed after a prefill (a prompt's worth of
        # vocab-sized rows otherwise).
        self._keep = "logits_to_keep" in params
        self._positions = "position_ids" in params
        # transformers 5.x renames ``past_key_values`` to ``cache`` (the old name warns).
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    def run(
        self,
        rows: Iterable[Row],
        emit: Callable[[StreamCompletion], None],
        stop: threading.Event | None = None,
    ) -> None:
        """Generate every row; ``emit`` each completion as it finishes. Returns when all are
        done, or early once ``stop`` is set."""
        import torch

        t_start = time.perf_counter()
        waiting = deque(rows)
        for r in waiting:
            if r.sampling.temperature > 0 and r.sampling.seed is not None:
                r.gen = torch.Generator(device=self.device)
                r.gen.manual_seed(sample_seed(r.sampling.seed, r.slot, r.sample))
        live: list[Row] = []
        cache: Any = None
        mask: Any = None  # [rows, cache length] 1 for real tokens
        logits: Any = None  # [rows, vocab] the scores of each live row's next token
        joinable = True
        try:
            with torch.no_grad():
                while waiting or live:
                    if stop is not None and stop.is_set():
                        return
                    free = self.batch_size - len(live)
                    if waiting and (
                        not live
                        or (joinable and free >= min(len(waiting), max(1, self.batch_size // 8)))
                    ):
                        new = [waiting.popleft() for _ in range(min(free, len(waiting)))]
                        n_logits, n_cache, n_mask = self._prefill(new)
                        if live:
                            cache, mask = self._join(cache, mask, n_cache, n_mask)
                            logits = torch.cat([logits, n_logits], 0)
                        else:
                            cache, mask, logits = n_cache, n_mask, n_logits
                        live += new
                        joinable = joinable and _joinable(cache)
                    nxt = self._choose(live, logits)
                    if self.on_tokens is not None:
                        self.on_tokens(len(live))
                    keep: list[int] = []
                    for i, (r, t) in enumerate(zip(live, nxt, strict=True)):
                        if self._done(r, t):
                            c = finish_completion(
                                self.tok, self.eos, r.prompt, r.ids, r.lps, r.sampling
                            )
                            emit(StreamCompletion(r.key, r.sample, c, time.perf_counter() - r.t0))
                        else:
                            keep.append(i)
                    if len(keep) < len(live):
                        live = [live[i] for i in keep]
                        if not live:
                            cache = mask = logits = None
                            continue
                        idx = torch.tensor(keep, device=self.device)
                        cache.batch_select_indices(idx)
                        mask = mask.index_select(0, idx)
                        nxt = [nxt[i] for i in keep]
                        if joinable:
                            cache, mask = _trim(cache, mask)
                    step = torch.tensor([[t] for t in nxt], device=self.device)
                    mask = torch.cat([mask, mask.new_ones(len(live), 1)], 1)
                    pos = torch.tensor(
                        [[len(r.prompt) + len(r.ids) - 1] for r in live], device=self.device
                    )
                    logits, cache = self._forward(step, mask, pos, cache)
        finally:
            self.busy_s += time.perf_counter() - t_start

    def _forward(self, ids: Any, mask: Any, pos: Any, cache: Any) -> tuple[Any, Any]:
        kw: dict[str, Any] = {"attention_mask": mask, self._cache_kw: cache, "use_cache": True}
        if self._positions:
            kw["position_ids"] = pos
        if self._keep:
            kw["logits_to_keep"] = 1
        out = self.model(input_ids=ids, **kw)
        new = getattr(out, "cache", None)
        if new is None:
            new = out.past_key_values
        return out.logits[:, -1, :].float(), new

    def _prefill(self, new: list[Row]) -> tuple[Any, Any, Any]:
        import torch

        width = max(len(r.prompt) for r in new)
        pad = self.tok.pad_token_id
        ids = torch.tensor([[pad] * (width - len(r.prompt)) + r.prompt for r in new])
        mask = torch.tensor([[0] * (width - len(r.prompt)) + [1] * len(r.prompt) for r in new])
        ids, mask = ids.to(self.device), mask.to(self.device)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        now = time.perf_counter()
        for r in new:
            r.t0 = now
        logits, cache = self._forward(ids, mask, pos, None)
        return logits, cache, mask

    def _join(self, a: Any, ma: Any, b: Any, mb: Any) -> tuple[Any, Any]:
        """Cache ``b`` (new rows) appended to cache ``a`` along the batch, left-padded alike."""
        import torch
        import torch.nn.functional as F

        width = max(ma.shape[1], mb.shape[1])

        def left(t: Any, n: int) -> Any:  # pad the sequence dimension (-2) on the left
            return F.pad(t, (0, 0, n, 0)) if n else t

        da, db = width - ma.shape[1], width - mb.shape[1]
        for la, lb in zip(a.layers, b.layers, strict=True):
            la.keys = torch.cat([left(la.keys, da), left(lb.keys, db)], 0)
            la.values = torch.cat([left(la.values, da), left(lb.values, db)], 0)
        mask = torch.cat([F.pad(ma, (da, 0)), F.pad(mb, (db, 0))], 0)
        return a, mask

    def _choose(self, live: list[Row], logits: Any) -> list[int]:
        """Each row's next token, its logprob recorded on the row (under the distribution it
        was drawn from: temperature and top-p applied, as the static path records it)."""
        import torch
        from transformers.generation.logits_process import (
            TemperatureLogitsWarper,
            TopPLogitsWarper,
        )

        out: list[int] = [0] * len(live)
        groups: dict[tuple[float, float], list[int]] = {}
        for i, r in enumerate(live):
            s = r.sampling
            groups.setdefault((s.temperature, s.top_p if s.temperature > 0 else 1.0), []).append(i)
        for (temp, top_p), rows in groups.items():
            idx = torch.tensor(rows, device=logits.device)
            scores = logits.index_select(0, idx)
            if temp == 0:
                logp = torch.log_softmax(scores, dim=-1)
                toks = scores.argmax(-1).tolist()
            else:
                if temp != 1.0:
                    scores = TemperatureLogitsWarper(temp)(None, scores)
                if top_p < 1.0:
                    scores = TopPLogitsWarper(top_p=top_p)(None, scores)
                logp = torch.log_softmax(scores, dim=-1)
                probs = logp.exp()
                toks = [
                    int(torch.multinomial(probs[j], 1, generator=live[i].gen).item())
                    for j, i in enumerate(rows)
                ]
            picked = logp.gather(1, torch.tensor([[t] for t in toks], device=logp.device))
            for j, i in enumerate(rows):
                out[i] = toks[j]
                live[i].lps.append(float(picked[j, 0]))
        return out

    def _done(self, r: Row, t: int) -> bool:
        r.ids.append(t)
        if t in self.eos or len(r.ids) >= r.sampling.max_tokens:
            return True
        stops = r.sampling.stop
        if stops:
            w = max(len(s) for s in stops) + _STOP_WINDOW
            tail = self.tok.decode(r.ids[-w:], skip_special_tokens=True)
            return any(s and s in tail for s in stops)
        return False


def _joinable(cache: Any) -> bool:
    """Whether every layer of ``cache`` is a plain full-attention ``DynamicLayer``."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None) or []
    return bool(layers) and all(type(la) is DynamicLayer for la in layers)


def _trim(cache: Any, mask: Any) -> tuple[Any, Any]:
    """Cut the cache columns that are padding in every row (left by rows that finished)."""
    real = mask.any(0).nonzero()
    first = int(real[0, 0]) if real.numel() else 0
    if first == 0:
        return cache, mask
    for la in cache.layers:
        la.keys = la.keys[:, :, first:]
        la.values = la.values[:, :, first:]
    return cache, mask[:, first:]
