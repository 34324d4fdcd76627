"""The GRPO maths as pure tensor functions: advantages, the clipped token loss, KL, aggregation.

Nothing here knows about models, rollouts or configs, so every function is tested against values
computed by hand (``tests/test_grpo_math.py``). Shapes: ``B`` groups (tasks), ``G`` samples per
group, ``N`` sequences in a (micro-)batch, ``T`` response positions (right-aligned, padded).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

__all__ = [
    "LossAgg",
    "RewardScale",
    "aggregate",
    "clipped_token_loss",
    "group_advantages",
    "kl_k3",
    "token_logprobs",
]

LossAgg = Literal["grpo", "dr_grpo", "dapo"]
"""How token losses are reduced (see :func:`aggregate`). Mirrored in ``GRPOConfig.loss_agg``."""
RewardScale = Literal["group", "batch", "none"]
"""How advantages are scaled (see :func:`group_advantages`)."""


def group_advantages(
    rewards: Tensor,
    scale: RewardScale = "group",
    eps: float = 1e-4,
    batch_rewards: Tensor | None = None,
    counted: Tensor | None = None,
) -> Tensor:
    """Group-relative advantages ``A_i = (r_i - mean(group)) / (std + eps)``.

    ``rewards``: [B, G]. ``scale``: ``group`` divides by each group's std (DeepSeekMath),
    ``batch`` by the std of all rewards in the batch, ``none`` not at all (Dr. GRPO). For
    ``batch``, ``batch_rewards`` (any shape) is the batch whose std is used, when it is more
    than ``rewards`` (the trainer passes every reward sampled in the step, dropped groups
    included). The std is the unbiased one (as ``torch.std``, as in TRL). A group whose rewards
    are all equal gets advantage 0 whatever the scaling.

    ``counted``: [B, G] bool, which rewards are real outcomes (default: all). The others (the
    checker could not judge them) get advantage 0 and are left out of their group's mean and
    std, and of the ``batch`` std when ``batch_rewards`` is not given; a group with fewer than
    two counted rewards has nothing to compare and gets 0 throughout. Returns [B, G].
    """
    r = rewards.to(torch.float32)
    w = torch.ones_like(r) if counted is None else counted.to(torch.float32)
    n = w.sum(dim=1, keepdim=True)  # [B, 1] counted rewards per group
    mean = (r * w).sum(dim=1, keepdim=True) / n.clamp(min=1.0)
    centred = (r - mean) * w  # [B, G]; 0 where not counted
    informative = n >= 2  # fewer than two outcomes: nothing to be relative to
    if scale == "group":
        var = (centred**2).sum(dim=1, keepdim=True) / (n - 1.0).clamp(min=1.0)
        adv = centred / (var.sqrt() + eps)
    elif scale == "batch":
        if batch_rewards is not None:
            pool = batch_rewards.to(torch.float32).flatten()
        else:
            pool = r[w > 0]
        std = pool.std() if pool.numel() > 1 else torch.zeros(())
        adv = centred / (std + eps)
    else:
        adv = centred
    return torch.where(informative, adv, torch.zeros_like(adv))


def token_logprobs(logits: Tensor, targets: Tensor, temperature: float = 1.0) -> Tensor:
    """``log softmax(logits / temperature)`` at ``targets``. logits [N, T, V], targets [N, T].

    Uses ``logit - logsumexp`` instead of a full log-softmax, so only one [N, T, V] temporary
    exists at a time (the vocabulary dominates memory for large models).
    """
    x = logits.float()
    if temperature != 1.0:
        x = x / temperature
    picked = x.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [N, T]
    return picked - torch.logsumexp(x, dim=-1)


def clipped_token_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Per-token clipped surrogate ``-min(ρ·A, clip(ρ, 1-eps_low, 1+eps_high)·A)``.

    ``logp``, ``old_logp``: [N, T] (current and behaviour log-probs); ``adv``: [N] (one advantage
    per sequence, broadcast over its tokens). ``ρ = exp(logp - old_logp)``. With ``dual_clip``
    = c (> 1), a token of negative advantage has its loss capped at ``c·|A|`` (dual-clip PPO,
    Ye et al. 2020): without the cap the loss grows with ρ without bound, and a token whose
    probability rose a lot since sampling (stale data) would dominate the update. Returns the
    loss [N, T] and a float mask [N, T] of the tokens where a clip was taken (clip fraction).
    """
    ratio = torch.exp(logp - old_logp)  # [N, T]
    a = adv.unsqueeze(-1)  # [N, 1]
    unclipped = ratio * a
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * a
    loss = -torch.minimum(unclipped, clipped)
    was_clipped = clipped < unclipped  # the min picked the clipped branch
    if dual_clip is not None:
        cap = (-dual_clip * a).expand_as(loss)  # c·|A| where A < 0
        capped = (a < 0) & (loss > cap)
        loss = torch.where(capped, cap, loss)
        was_clipped = was_clipped | capped
    return loss, was_clipped.float()


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(π_θ || π_ref): ``exp(ref - logp) - (ref - logp) - 1`` (≥ 0).

    Unbiased for the KL under samples from π_θ and always non-negative (Schulman, "Approximating
    KL divergence", 2020; the estimator DeepSeekMath uses). Shapes [N, T] -> [N, T].
    """
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def aggregate(
    per_token: Tensor,
    mask: Tensor,
    mode: LossAgg,
    *,
    n_seqs: int,
    n_tokens: int,
    norm_len: int,
) -> Tensor:
    """Reduce a per-token loss [N, T] (masked by ``mask`` [N, T]) to a scalar.

    The denominators are those of the whole optimisation mini-batch, not of this micro-batch, so
    that summing the micro-batch losses (gradient accumulation) gives exactly the mini-batch loss:

    - ``grpo``: mean over tokens of each sequence, then mean over the ``n_seqs`` sequences
      (DeepSeekMath, eq. 3): ``1/n_seqs · Σ_i 1/|o_i| Σ_t l_it``.
    - ``dapo``: one mean over all ``n_tokens`` loss tokens of the mini-batch (DAPO, eq. 8):
      ``1/n_tokens · Σ_i Σ_t l_it``.
    - ``dr_grpo``: sum over tokens divided by a constant ``n_seqs · norm_len`` (Dr. GRPO): no
      length normalisation per sequence, so long wrong answers are not favoured.
    """
    m = mask.to(per_token.dtype)
    masked = per_token * m  # [N, T]
    if mode == "grpo":
        lengths = m.sum(dim=-1).clamp(min=1.0)  # [N]
        return (masked.sum(dim=-1) / lengths).sum() / max(n_seqs, 1)
    if mode == "dapo":
        return masked.sum() / max(n_tokens, 1)
    if mode == "dr_grpo":
        return masked.sum() / max(n_seqs * norm_len, 1)
    raise ValueError(f"unknown loss aggregation {mode!r}")
