"""Log-probs and entropy of chosen tokens without ever holding the full logits.

The GRPO loss needs, per response token, ``log softmax(h·Wᵀ/τ)`` at the sampled token (and the
entropy for the log). Building the logits ``[N, T, V]`` first costs 4-5× their fp32 size at the
loss's peak (the logits, their fp32 copy, the log-sum-exp temporaries, their gradient), which
for a 150k vocabulary and a few thousand tokens is tens of GB. :func:`tiled_logprobs` instead
walks the vocabulary in tiles of ``vocab_tile`` columns and the tokens in chunks of ``rows``:
only one ``[rows, vocab_tile]`` tile of logits exists at a time, the log-sum-exp is carried from
tile to tile online (running max and rescaled sum, Milakov & Gimelshein 2018, "Online
normalizer calculation for softmax"), and the backward pass recomputes each tile's logits from
the saved hidden states instead of keeping them. This is the idea of fused/chunked
linear-cross-entropy losses (Liger-Kernel, torchtune's ``LinearCrossEntropyLoss``), written here
in plain torch for log-probs, with the exact gradients of both outputs.

The second half is the Hugging Face side: :class:`HeadTiles` runs a model's own output head
(``get_output_embeddings()``, an ``nn.Linear``) through the tiles by standing in for that
module's ``forward`` during one model call, so the call still goes through the model's (and a
DDP/FSDP wrapper's) own ``forward``: gradient sync, FSDP's gathers and gradient checkpointing
are untouched. :func:`head_problem` says when a model's logits are not plain ``head(h)`` (soft
capping, logit scales, a LoRA-wrapped or quantised head); the caller then keeps full logits.

Nothing here knows about configs or rollouts (``tests/test_grpo_tiled.py`` compares it with the
full-logits computation).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from leanrl.train.grpo.loss import token_logprobs

__all__ = ["HeadTiles", "full_entropy", "head_problem", "tiled_logprobs"]


def _tile_logits(
    h: Tensor, w: Tensor, b: Tensor | None, temperature: float, dtype: torch.dtype
) -> Tensor:
    """``(h·wᵀ + b) / τ`` in fp32 (fp64 for fp64 inputs) with the product taken in ``dtype``:
    the same operations, in the same order, as the model's head followed by ``token_logprobs``
    (so the values are the full path's, bf16 rounding of the product included)."""
    z = torch.nn.functional.linear(h.to(dtype), w.to(dtype), None if b is None else b.to(dtype)).to(
        _acc(dtype)
    )
    return z / temperature if temperature != 1.0 else z


def _acc(dtype: torch.dtype) -> torch.dtype:
    """The dtype sums are kept in: fp32, or fp64 when the inputs are fp64."""
    return torch.promote_types(dtype, torch.float32)


class _TiledLogProbs(torch.autograd.Function):
    """``(logp [M], entropy [M])`` of ``softmax((h·Wᵀ + b)/τ)`` for rows ``h`` [M, H] at
    ``targets`` [M]; see :func:`tiled_logprobs`."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        h: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        targets: Tensor,
        temperature: float,
        rows: int,
        vocab_tile: int,
        dtype: torch.dtype,
    ) -> tuple[Tensor, Tensor]:
        m_rows, vocab = h.shape[0], weight.shape[0]
        dev, acc = h.device, _acc(dtype)
        run_max = torch.full((m_rows,), -torch.inf, dtype=acc, device=dev)
        run_sum = torch.zeros(m_rows, dtype=acc, device=dev)  # Σ exp(z - run_max)
        run_zsum = torch.zeros_like(run_sum)  # Σ exp(z - run_max) · z  (for the entropy)
        picked = torch.zeros_like(run_sum)
        with torch.autocast(dev.type, enabled=False):  # the dtype is chosen explicitly
            for lo in range(0, vocab, vocab_tile):
                hi = min(lo + vocab_tile, vocab)
                w = weight[lo:hi].to(dtype)  # cast once per tile (a no-op in the same dtype)
                b = None if bias is None else bias[lo:hi].to(dtype)
                inside = (targets >= lo) & (targets < hi)
                col = (targets - lo).clamp(0, hi - lo - 1)
                for r0 in range(0, m_rows, rows):
                    r1 = min(r0 + rows, m_rows)
                    z = _tile_logits(h[r0:r1], w, b, temperature, dtype)  # [r, v]
                    new_max = torch.maximum(run_max[r0:r1], z.amax(dim=-1))
                    keep = torch.exp(run_max[r0:r1] - new_max)  # rescale what came before
                    e = torch.sub(z, new_max.unsqueeze(-1)).exp_()
                    run_sum[r0:r1] = run_sum[r0:r1] * keep + e.sum(-1)
                    run_zsum[r0:r1] = run_zsum[r0:r1] * keep + (e * z).sum(-1)
                    run_max[r0:r1] = new_max
                    got = z.gather(1, col[r0:r1].unsqueeze(-1)).squeeze(-1)
                    picked[r0:r1] += torch.where(inside[r0:r1], got, 0.0)
                    del z, e
        lse = run_max + torch.log(run_sum)
        entropy = lse - run_zsum / run_sum  # H = lse - E_p[z]
        ctx.save_for_backward(h, weight, bias, targets, lse, entropy)
        ctx.conf = (temperature, rows, vocab_tile, dtype)
        ctx.set_materialize_grads(False)  # an unused output's gradient arrives as None
        return picked - lse, entropy

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, g_lp: Tensor | None, g_ent: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        h, weight, bias, targets, lse, entropy = ctx.saved_tensors
        temperature, rows, vocab_tile, dtype = ctx.conf
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        nothing = (None,) * 8
        if g_lp is None and g_ent is None:
            return nothing
        m_rows, vocab = h.shape[0], weight.shape[0]
        # fp32 accumulators: a tile's contribution is summed over vocabulary tiles (dh) and row
        # chunks (dW) here, where one big matmul would have summed inside the kernel.
        acc, dev = _acc(dtype), h.device
        gh = torch.zeros(h.shape, dtype=acc, device=dev) if need_h else None
        gw = torch.zeros(weight.shape, dtype=acc, device=dev) if need_w else None
        gb = torch.zeros(vocab, dtype=acc, device=dev) if need_b else None
        with torch.autocast(h.device.type, enabled=False):
            for lo in range(0, vocab, vocab_tile):
                hi = min(lo + vocab_tile, vocab)
                w = weight[lo:hi].to(dtype)  # cast once per tile (a no-op in the same dtype)
                b = None if bias is None else bias[lo:hi].to(dtype)
                inside = (targets >= lo) & (targets < hi)
                col = (targets - lo).clamp(0, hi - lo - 1)
                for r0 in range(0, m_rows, rows):
                    r1 = min(r0 + rows, m_rows)
                    # in place where possible: three [rows, tile] tensors at a time
                    logp = _tile_logits(h[r0:r1], w, b, temperature, dtype)
                    logp.sub_(lse[r0:r1].unsqueeze(-1))  # log p, [r, v]
                    p = torch.exp(logp)
                    if g_lp is not None:
                        # d logp_t / dz_v = [v = t] - p_v
                        g = p * -g_lp[r0:r1].unsqueeze(-1)
                        hit = torch.where(inside[r0:r1], g_lp[r0:r1], 0.0).unsqueeze(-1)
                        g.scatter_add_(1, col[r0:r1].unsqueeze(-1), hit)
                    else:
                        g = torch.zeros_like(p)
                    if g_ent is not None:
                        # dH/dz_v = -p_v (log p_v + H)
                        term = logp.add_(entropy[r0:r1, None]).mul_(p)
                        g.sub_(term.mul_(g_ent[r0:r1].unsqueeze(-1)))
                    del logp, p
                    if temperature != 1.0:
                        g.div_(temperature)
                    g = g.to(dtype)  # the gradient reaches the head's product in its dtype
                    if gh is not None:
                        gh[r0:r1] += g @ w
                    if gw is not None:
                        gw[lo:hi] += g.t() @ h[r0:r1].to(dtype)
                    if gb is not None:
                        gb[lo:hi] += g.to(acc).sum(0)
                    del g
        return (
            None if gh is None else gh.to(h.dtype),
            None if gw is None else gw.to(weight.dtype),
            None if gb is None or bias is None else gb.to(bias.dtype),
            *nothing[3:],
        )


def tiled_logprobs(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    *,
    bias: Tensor | None = None,
    temperature: float = 1.0,
    rows: int = 1024,
    vocab_tile: int = 8192,
) -> tuple[Tensor, Tensor]:
    """Log-probs and entropies of ``softmax((hidden·weightᵀ + bias) / temperature)``.

    ``hidden`` [..., H] (the head's input), ``weight`` [V, H] (an ``nn.Linear``'s, tied
    embeddings included), ``targets`` [...] token ids. Returns ``(logp, entropy)``, both fp32 of
    the shape of ``targets``, equal to ``token_logprobs(hidden·Wᵀ + b, targets, temperature)``
    and ``-Σ p log p`` of the full logits; both are differentiable (in ``hidden``, ``weight``
    and ``bias``). Extra memory: O(``rows × vocab_tile``) plus fp32 gradients of ``hidden`` and
    ``weight``, never O(tokens × V). The product is taken in the autocast dtype when autocast
    is on (as the head would be), else in the inputs' common dtype; sums are fp32.
    """
    if rows < 1 or vocab_tile < 1:
        raise ValueError(f"rows and vocab_tile must be at least 1 (got {rows}, {vocab_tile})")
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(
            f"targets {tuple(targets.shape)} must be hidden's shape without its last dimension "
            f"(hidden is {tuple(hidden.shape)})"
        )
    dev = hidden.device.type
    if torch.is_autocast_enabled(dev):
        dtype = torch.get_autocast_dtype(dev)
    else:
        dtype = torch.promote_types(hidden.dtype, weight.dtype)
    flat = hidden.reshape(-1, hidden.shape[-1])
    lp, ent = _TiledLogProbs.apply(
        flat, weight, bias, targets.reshape(-1), float(temperature), rows, vocab_tile, dtype
    )
    return lp.view(targets.shape), ent.view(targets.shape)


@torch.no_grad()
def full_entropy(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """No-grad entropy [N, T] of ``softmax(logits / temperature)`` from full logits [N, T, V],
    one sequence at a time (a [T, V] fp32 temporary, not [N, T, V])."""
    out = []
    for k in range(logits.shape[0]):
        lp = torch.log_softmax(logits[k].detach().float() / temperature, dim=-1)
        out.append(-(lp.exp() * lp).sum(-1))
    return torch.stack(out)


# -- the Hugging Face side ---------------------------------------------------------------------

#: Config fields of Hugging Face models that change the logits after the head (``logits =
#: f(head(h))``), with the value that leaves them unchanged: Gemma 2/3 soft-capping, Cohere's
#: ``logit_scale``, Granite's ``logits_scaling``, Falcon-H1's ``lm_head_multiplier``.
_POSTPROCESSING = {
    "final_logit_softcapping": None,
    "logit_scale": 1.0,
    "logits_scaling": 1.0,
    "lm_head_multiplier": 1.0,
}


def head_problem(model: Any) -> str | None:
    """Why ``model``'s log-probs cannot go through :class:`HeadTiles`, or None when they can.

    ``model``: a Hugging Face causal LM (or a PEFT model around one), not a DDP wrapper."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if head is None:
        return "the model has no output head (get_output_embeddings() returns None)"
    if type(head) is not torch.nn.Linear:
        return (
            f"its output head is a {type(head).__module__}.{type(head).__name__}, not a plain "
            "torch.nn.Linear (a LoRA-wrapped or quantised lm_head computes more than h·Wᵀ)"
        )
    cfg = getattr(model, "config", None)
    for name, neutral in _POSTPROCESSING.items():
        value = getattr(cfg, name, None)
        if value is not None and value != neutral:
            return f"config.{name} = {value!r} changes the logits after the head"
    return None


class HeadTiles:
    """A model's output head computing tiled log-probs instead of logits, for one call.

    Inside :meth:`bound`, the head module returns the log-probs [N, T] of ``targets`` [N, T]
    instead of logits; the model's forward passes them on as ``out.logits``, which
    :meth:`result` checks (anything the model did to "its logits" after the head would break
    the identity, and is refused). The head's input positions beyond ``T`` are dropped from the
    right, so ``targets[:, j]`` is predicted by head input position ``j`` (with
    ``logits_to_keep = T + 1``, the last kept position predicts past the end)."""

    def __init__(
        self, head: torch.nn.Linear, temperature: float, rows: int, vocab_tile: int
    ) -> None:
        self.head = head
        self.temperature = temperature
        self.rows = rows
        self.vocab_tile = vocab_tile

    @classmethod
    def checked(
        cls,
        model: Any,
        temperature: float,
        rows: int,
        vocab_tile: int,
        forward: Callable[[HeadTiles | None], tuple[Tensor, Tensor]],
    ) -> tuple[HeadTiles | None, str | None]:
        """``(tiles, None)`` when ``model``'s tiled log-probs are its full-logits ones, else
        ``(None, why)``. ``forward(tiles)`` runs the model on a short probe batch: with None it
        returns ``(logits [n, R, V], targets [n, R])``, with tiles ``(logp, entropy)``. Run in
        eval mode without gradients (dropout would make the two calls differ)."""
        why = head_problem(model)
        if why:
            return None, why
        tiles = cls(model.get_output_embeddings(), temperature, rows, vocab_tile)
        was = model.training
        model.eval()
        try:
            with torch.no_grad():
                logits, targets = forward(None)
                want = token_logprobs(logits, targets, temperature)
                try:
                    got, _ = forward(tiles)
                except RuntimeError as e:
                    return None, str(e)
        finally:
            model.train(was)
        # An fp32 product is the same per element at any shape; a bf16 one may round apart.
        exact = logits.dtype in (torch.float32, torch.float64)
        tol = 1e-4 * max(1.0, float(want.abs().max())) if exact else 0.1
        gap = float((got - want).abs().max())
        if gap > tol:
            return None, f"tiled and full log-probs differ by {gap:.3g} nats on a probe"
        return tiles, None

    @contextmanager
    def bound(self, targets: Tensor) -> Iterator[dict[str, Tensor]]:
        """The head computes log-probs of ``targets`` while inside; yields where they land
        (``logp``, ``entropy``)."""
        got: dict[str, Tensor] = {}
        head = self.head

        def forward(x: Tensor) -> Tensor:
            # Read the weight here, inside the model's forward: under FSDP it is the gathered
            # (unsharded) parameter only now.
            lp, ent = tiled_logprobs(
                x[:, : targets.shape[1]],
                head.weight,
                targets,
                bias=head.bias,
                temperature=self.temperature,
                rows=self.rows,
                vocab_tile=self.vocab_tile,
            )
            got["logp"], got["entropy"] = lp, ent
            return lp

        head.forward = forward  # type: ignore[method-assign,assignment]  # the instance's, for this call
        try:
            yield got
        finally:
            del head.forward

    @staticmethod
    def result(logits: Any, got: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """``(logp, entropy)`` of the call, if the model returned the head's output untouched."""
        lp = got.get("logp")
        if lp is None or logits is not lp:
            raise RuntimeError(
                "the model changed its head's output before returning it (or never called the "
                "head), so tiled log-probs would be wrong; unset logprob_chunk for this model"
            )
        return lp, got["entropy"]
