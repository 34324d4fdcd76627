"""Batched population decoding: many low-rank ES members in one forward (EGGROLL, arXiv 2511.16652).

With ``perturbation = "lowrank"`` member k's weights are ``W + s_k·A_k·B_kᵀ/√r`` (``s_k`` =
sign·σ) for every 2-D parameter. A batch whose rows belong to different members can then run
through the *unperturbed* model if every layer that reads a 2-D parameter adds its row group's
low-rank term to its output:

- ``nn.Linear`` (W [m, n], y = x·Wᵀ):       y += s_k/√r · (x·B_k)·A_kᵀ
- GPT-2 ``Conv1D`` (W [m, n], y = x·W):     y += s_k/√r · (x·A_k)·B_kᵀ
- ``nn.Embedding`` (W [V, d], y = W[ids]): y += s_k/√r · A_k[ids]·B_kᵀ

which is the output of the materialised weights up to floating-point rounding; W_k itself never
exists, and the KV cache holds each row's own keys and values as usual. The terms are forward
hooks on the modules owning the parameters (a tied ``lm_head`` shares the embedding's parameter,
hence its factors), installed for one call by :meth:`LowRankPopulation.active` with the row
layout of that call. ``generate`` neither reorders nor expands rows for greedy or sampled decoding
without beams, so the layout holds for every step.

Only the 2-D parameters are covered: a run whose 1-D tensors are perturbed too
(``lowrank_other = "full"``) is refused, since norms and biases would need per-row-group hooks of
their own (norm layers differ per architecture). Modules whose forward is not the stock one
(a scaled embedding, a quantised linear) are refused too, as is a 2-D parameter no supported
module owns: the hook would not reproduce the materialised weights there.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from leanrl.errors import ConfigError
from leanrl.train.es.lowrank import factors, is_lowrank_target

__all__ = ["LowRankPopulation", "RowGroup", "generate_members"]


@dataclass(frozen=True)
class RowGroup:
    """``rows`` consecutive rows of a batch that decode with member ``member`` (an index into
    the members of the call)."""

    member: int
    rows: int


@dataclass
class _Target:
    module: Any
    name: str  # the parameter's name in ``named_parameters`` (what its factors are drawn for)
    kind: str  # "linear" | "conv1d" | "embedding"
    shape: tuple[int, int]


def _kind(module: Any) -> str | None:
    """The hook kind of ``module`` if its forward is the stock one we can reproduce."""
    from torch import nn

    if isinstance(module, nn.Linear) and type(module).forward is nn.Linear.forward:
        return "linear"
    if isinstance(module, nn.Embedding) and type(module).forward is nn.Embedding.forward:
        # max_norm renormalises rows in place on lookup: the materialised path would renormalise
        # the perturbed rows, the hook the clean ones.
        return "embedding" if module.max_norm is None else None
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # pragma: no cover - transformers is a dependency of this backend
        return None
    if isinstance(module, Conv1D) and type(module).forward is Conv1D.forward:
        return "conv1d"
    return None


class LowRankPopulation:
    """Per-row-group low-rank deltas on a Hugging Face model (see the module docstring).

    ``params`` are the perturbed parameters by name (``ESWeights.params``); their 2-D ones get
    the low-rank term, each drawn from (seed, name) exactly as the materialised path draws it.
    ``targets`` (``LowRankWeights.lowrank_names()`` under ``lowrank_targets = "linear"``): only
    these get it; the other 2-D parameters are frozen, as the materialised path leaves them.
    """

    def __init__(
        self,
        model: Any,
        params: Mapping[str, Any],
        rank: int,
        lowrank_other: str = "frozen",
        targets: Collection[str] | None = None,
    ) -> None:
        if rank < 1:
            raise ConfigError(f"rank must be at least 1, got {rank}")
        flat = [n for n, p in params.items() if not is_lowrank_target(n, tuple(p.shape))]
        if lowrank_other != "frozen" and flat:
            raise ConfigError(
                f"batched population decoding covers 2-D weights only, but lowrank_other = "
                f"{lowrank_other!r} perturbs {len(flat)} other tensor(s) too (e.g. {flat[0]!r}): "
                "set lowrank_other = 'frozen', or scorer.members_per_batch = 1 (one member per "
                "call, its weights materialised)"
            )
        self.model = model
        self.rank = rank
        owner: dict[int, list[tuple[Any, str | None]]] = {}
        for mod in model.modules():
            w = getattr(mod, "weight", None)
            if w is not None:
                owner.setdefault(id(w), []).append((mod, _kind(mod)))
        self.targets: list[_Target] = []
        for name, p in params.items():
            shape = tuple(p.shape)
            if not is_lowrank_target(name, shape) or (targets is not None and name not in targets):
                continue  # frozen: lowrank_targets = "linear" leaves embeddings and lm_head be
            mods = owner.get(id(p), [])
            bad = [type(m).__name__ for m, k in mods if k is None]
            if not mods or bad:
                why = f"module(s) {bad} with their own forward" if bad else "no module's .weight"
                raise ConfigError(
                    f"batched population decoding cannot perturb {name!r} (shape {shape}): it is "
                    f"{why}, and only nn.Linear, nn.Embedding and transformers' Conv1D are "
                    "supported. Use scorer.members_per_batch = 1 for this model"
                )
            for mod, kind in mods:
                self.targets.append(_Target(mod, name, str(kind), (shape[0], shape[1])))
        self._cache: dict[tuple[int, str], tuple[Any, Any]] = {}
        self.factor_s = 0.0
        """Seconds spent drawing factors (the batched path's counterpart of perturbing)."""

    # -- factors ----------------------------------------------------------------------------------

    def _factors(self, seed: int, t: _Target) -> tuple[Any, Any]:
        key = (seed, t.name)
        got = self._cache.get(key)
        if got is None:
            w = t.module.weight
            got = factors(seed, t.name, t.shape, self.rank, w.device)
            self._cache[key] = got
        return got

    def _stacks(self, seeds: Sequence[int]) -> dict[str, tuple[Any, Any]]:
        """A [K, m, r] and B [K, n, r] per target name, for the call's members (drawn once)."""
        import torch

        t0 = time.perf_counter()
        out: dict[str, tuple[Any, Any]] = {}
        for t in self.targets:
            if t.name in out:  # a tied parameter: one set of factors for all its modules
                continue
            pairs = [self._factors(s, t) for s in seeds]
            out[t.name] = (torch.stack([a for a, _ in pairs]), torch.stack([b for _, b in pairs]))
        self.factor_s += time.perf_counter() - t0
        return out

    def forget(self, seed: int | None = None) -> None:
        """Drop the cached factors of member seed ``seed`` (None: all), once it has generated
        for the last time: seeds are not reused across iterations."""
        if seed is None:
            self._cache.clear()
        else:
            for key in [k for k in self._cache if k[0] == seed]:
                del self._cache[key]

    # -- hooks ------------------------------------------------------------------------------------

    @contextmanager
    def active(
        self, members: Sequence[tuple[int, float]], groups: Sequence[RowGroup] | None = None
    ) -> Iterator[None]:
        """Within the block, forward passes run with member ``groups[g].member``'s weights on
        the rows of group g (groups cover the batch in order). ``groups=None``: one member,
        every row of any batch (``members`` must hold exactly one)."""
        import torch

        if not members:
            raise ValueError("no members")
        if groups is None and len(members) != 1:
            raise ValueError("groups=None needs exactly one member")
        seeds = [s for s, _ in members]
        stacks = self._stacks(seeds)
        dev = next(iter(stacks.values()))[0].device if stacks else torch.device("cpu")
        coef = torch.tensor(
            [sc / math.sqrt(self.rank) for _, sc in members], dtype=torch.float32, device=dev
        )  # [K]
        layout = _Layout.make(groups, len(members))
        handles = []
        try:
            for t in self.targets:
                a, b = stacks[t.name]
                handles.append(
                    t.module.register_forward_hook(_hook(t.module, t.kind, a, b, coef, layout))
                )
            yield
        finally:
            for h in handles:
                h.remove()


@dataclass
class _Layout:
    """The rows → members map of one call, in the form the hooks use."""

    total: int | None  # rows every batch must have (None: any, one member)
    segments: list[tuple[int, int, int]] | None
    """(first row, end row, member) per group when the groups are not one equal-sized block per
    member in order (None: member-major blocks, the common case, one batched matmul)."""

    @classmethod
    def make(cls, groups: Sequence[RowGroup] | None, k: int) -> _Layout:
        if groups is None:
            return cls(None, None)
        if any(g.rows < 0 or not 0 <= g.member < k for g in groups):
            raise ValueError(f"bad row groups {groups} for {k} member(s)")
        total = sum(g.rows for g in groups)
        if [g.member for g in groups] == list(range(k)) and len({g.rows for g in groups}) == 1:
            return cls(total, None)
        segments, at = [], 0
        for g in groups:
            if g.rows:
                segments.append((at, at + g.rows, g.member))
            at += g.rows
        return cls(total, segments)


def _hook(module: Any, kind: str, a: Any, b: Any, coef: Any, layout: _Layout) -> Any:
    """A forward hook adding ``coef_k·(low-rank term)`` to its module's output, per row group.

    ``a`` [K, m, r] and ``b`` [K, n, r] are the stacked factors of the module's parameter. The
    per-call work is done here, once: the factor the input meets first is pre-scaled by the
    members' coefficients and the second is transposed, so a forward costs two batched matmuls.
    """
    import torch

    # linear x·Wᵀ meets B first; Conv1D x·W meets A first; an embedding row looks up A
    first, second = (b, a) if kind == "linear" else (a, b)
    first = first * coef[:, None, None]  # [K, ·, r], s_k/√r folded in
    second_t = second.transpose(1, 2).contiguous()  # [K, r, out]
    # In the model's dtype: a bf16 model multiplies in bf16 (an fp32 copy of every layer's input
    # would cost more than the layer), and baddbmm_ accumulates in fp32 and rounds the sum
    # once, as cast(θ + δ) rounds once. Rounding the small term's factors to bf16 errs far less
    # than rounding θ + δ to bf16 does (the bf16 test compares both with fp32).
    dtype = getattr(getattr(module, "weight", None), "dtype", torch.float32)
    first, second_t = first.to(dtype), second_t.to(dtype)

    def add(x: Any, out: Any, f: Any, st: Any) -> Any:
        """``out`` [G·rows, ..., out] plus the terms of G member blocks (factors f, st)."""
        g = f.shape[0]
        if kind == "embedding":
            ids = x.reshape(g, -1)  # [G, rows·T]
            u = f[torch.arange(g, device=ids.device)[:, None], ids]  # [G, rows·T, r]
        else:
            xs = x.reshape(g, -1, x.shape[-1])  # [G, rows·T, in]
            u = torch.bmm(xs if xs.dtype == f.dtype else xs.to(f.dtype), f)  # [G, ·, r]
        if u.dtype != out.dtype:  # autocast: the output's dtype is not the weight's
            u, st = u.to(out.dtype), st.to(out.dtype)
        if not out.is_contiguous():
            out = out.contiguous()
        out.view(g, -1, out.shape[-1]).baddbmm_(u, st)  # out += u·st, in place, one rounding
        return out

    def hook(_mod: Any, args: tuple[Any, ...], out: Any) -> Any:
        x = args[0]
        bsz = x.shape[0]
        if layout.total is not None and bsz != layout.total:
            raise RuntimeError(
                f"batched population decoding: a forward got {bsz} rows, the members' row "
                f"groups cover {layout.total} (generate must not add or drop rows: no beams)"
            )
        if layout.segments is None:
            return add(x, out, first, second_t)
        # uneven groups (a rare layout): one slice per group, no per-row factor copies
        out = out if out.is_contiguous() else out.contiguous()
        for lo, hi, m in layout.segments:
            add(x[lo:hi], out[lo:hi], first[m : m + 1], second_t[m : m + 1])  # in place
        return out

    return hook


def generate_members(
    policy: Any,
    population: LowRankPopulation,
    requests: Sequence[tuple[tuple[int, float], Sequence[Any]]],
    sampling: Any,
) -> list[list[list[Any]]]:
    """One ``generate`` call for several members: ``requests`` are ((seed, scale), prompts);
    the answer holds, per request, what ``policy.generate_sync(prompts, sampling)`` gives with
    that member's weights materialised (``sampling.n`` completions per prompt).

    ``policy`` is a :class:`~leanrl.train.es.policy.TorchPolicy` over the model the population
    hooks, holding the unperturbed θ. Rows are request-major, then prompt, then sample, all in
    one call (``policy.batch_size`` does not split it: ``scorer.members_per_batch`` bounds it).
    """
    members: list[tuple[int, float]] = []
    index: dict[tuple[int, float], int] = {}
    groups: list[RowGroup] = []
    texts: list[str] = []
    for key, prompts in requests:
        if key not in index:
            index[key] = len(members)
            members.append(key)
        rows = [policy.render(p) for p in prompts for _ in range(sampling.n)]
        groups.append(RowGroup(index[key], len(rows)))
        texts += rows
    if not texts:
        return [[] for _ in requests]
    with population.active(members, groups):
        flat = policy.generate_rows(texts, sampling)
    out: list[list[list[Any]]] = []
    at = 0
    for (_, prompts), g in zip(requests, groups, strict=True):
        mine = flat[at : at + g.rows]
        at += g.rows
        out.append([mine[i * sampling.n : (i + 1) * sampling.n] for i in range(len(prompts))])
    return out
