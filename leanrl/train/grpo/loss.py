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
    "ISCorrection",
    "LossAgg",
    "RewardScale",
    "aggregate",
    "cispo_token_loss",
    "clipped_ratio_loss",
    "clipped_token_loss",
    "group_advantages",
    "is_correction_weights",
    "kl_k3",
    "loss_denominator",
    "policy_loss",
    "sequence_log_ratio",
    "token_logprobs",
]

LossAgg = Literal["grpo", "dr_grpo", "dapo"]
"""How token losses are reduced (see :func:`aggregate`). Mirrored in ``GRPOConfig.loss_agg``."""
RewardScale = Literal["group", "batch", "none"]
"""How advantages are scaled (see :func:`group_advantages`)."""
ISCorrection = Literal["off", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
"""Sampler/trainer mismatch correction (see :func:`is_correction_weights`)."""


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
    per sequence, broadcast over its tokens) or [N, T] (one per token: on-policy distillation).
    ``ρ = exp(logp - old_logp)``. With ``dual_clip`` = c (> 1), a token of negative advantage
    has its loss capped at ``c·|A|`` (dual-clip PPO, Ye et al. 2020): without the cap the loss grows with ρ without bound, and a token whose
    probability rose a lot since sampling (stale data) would dominate the update. Returns the
    loss [N, T] and a float mask [N, T] of the tokens where a clip was taken (clip fraction).
    """
    return clipped_ratio_loss(torch.exp(logp - old_logp), adv, eps_low, eps_high, dual_clip)


def clipped_ratio_loss(
    ratio: Tensor,
    adv: Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = None,
) -> tuple[Tensor, Tensor]:
    """:func:`clipped_token_loss` for a given ratio ρ [N, T] (token-level, or a sequence-level
    ratio broadcast over the tokens: see :func:`sequence_log_ratio`). Returns the loss [N, T]
    and the float mask of clipped tokens."""
    a = adv.unsqueeze(-1) if adv.dim() == 1 else adv  # [N, 1], or [N, T] per token (distill)
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


def sequence_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """GSPO's sequence-level log-ratio (Zheng et al. 2025, "Group Sequence Policy Optimization"),
    broadcast over each sequence's tokens: ``log s_i = 1/|o_i| · Σ_t m_t (logp_t - old_t)``, the
    log of the length-normalised sequence likelihood ratio. Shapes [N, T] -> [N, T].

    The gradient flows through the mean, so every token of sequence i gets ``s_i/|o_i| · ∇logp_t``
    per unit of its loss: summed over the sequence's tokens (every aggregation weights a
    sequence's tokens alike) this is GSPO's gradient, and also GSPO-token's
    (``sg[s_i] · π_θ(y_t)/sg[π_θ(y_t)]``, equal in value and, for one advantage per sequence,
    in gradient)."""
    m = mask.to(logp.dtype)
    n = m.sum(dim=-1, keepdim=True).clamp(min=1.0)  # [N, 1]
    per_seq = ((logp - old_logp) * m).sum(dim=-1, keepdim=True) / n  # [N, 1]
    return per_seq.expand_as(logp)


def cispo_token_loss(
    logp: Tensor, log_ratio: Tensor, adv: Tensor, w_min: float, w_max: float
) -> tuple[Tensor, Tensor]:
    """CISPO's per-token loss (MiniMax-M1, 2025): ``-sg(clip(ρ, w_min, w_max)) · A · logp``.

    The importance weight is clipped and detached, and every token keeps the gradient
    ``clip(ρ)·A·∇logp`` (the PPO clip instead zeroes the gradient of clipped tokens, which drops
    the rare tokens whose ratio moved most). ``log_ratio`` [N, T] is ``log ρ`` (token-level, or
    :func:`sequence_log_ratio`); ``adv`` [N] or [N, T]. Returns the loss [N, T] and the float
    mask of the tokens whose weight was clipped."""
    ratio = torch.exp(log_ratio.detach())
    weight = torch.clamp(ratio, w_min, w_max)
    loss = -weight * (adv.unsqueeze(-1) if adv.dim() == 1 else adv) * logp
    return loss, ((ratio > w_max) | (ratio < w_min)).float()


def is_correction_weights(
    old_logp: Tensor, sampler_logp: Tensor, mask: Tensor, mode: str, cap: float, floor: float = 0.0
) -> tuple[Tensor, Tensor]:
    """Importance weights correcting for the mismatch between the sampler (vLLM kernels, bf16)
    and the trainer's own forward of the same weights: ``w = π_old / μ_sampler``, no gradient.

    ``token_*``: one weight per token, ``exp(old_t - μ_t)``. ``sequence_*``: one per sequence,
    ``exp(Σ_t m_t (old_t - μ_t))`` (the product of its token ratios, as TRL's
    ``vllm_importance_sampling_mode``). ``*_truncate``: ``min(w, cap)`` (truncated IS, Yao et al.
    2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training");
    ``*_mask``: ``w · 1[floor ≤ w ≤ cap]`` (masked IS; prime-rl masks tokens whose ratio leaves
    [floor, cap]). Inputs [N, T]; returns the weights [N, T] and a float mask [N, T] of the
    tokens whose weight was truncated or masked."""
    diff = ((old_logp - sampler_logp) * mask.to(old_logp.dtype)).detach()
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True).expand_as(old_logp)
    elif not mode.startswith("token"):
        raise ValueError(f"unknown importance-sampling correction {mode!r}")
    w = torch.exp(diff)
    if mode.endswith("truncate"):
        hit = w > cap
        return torch.clamp(w, max=cap), hit.float()
    if mode.endswith("mask"):
        hit = (w > cap) | (w < floor)
        return torch.where(hit, torch.zeros_like(w), w), hit.float()
    raise ValueError(f"unknown importance-sampling correction {mode!r}")


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
    denom = loss_denominator(mode, n_seqs=n_seqs, n_tokens=n_tokens, norm_len=norm_len)
    if mode == "grpo":
        lengths = m.sum(dim=-1).clamp(min=1.0)  # [N]
        return (masked.sum(dim=-1) / lengths).sum() / denom
    return masked.sum() / denom


def loss_denominator(mode: LossAgg, *, n_seqs: int, n_tokens: int, norm_len: int) -> int:
    """What :func:`aggregate` divides the mini-batch's sum by (at least 1): ``n_seqs``
    (``grpo``, after each sequence's token mean), ``n_tokens`` (``dapo``) or ``n_seqs ·
    norm_len`` (``dr_grpo``). A streamed step (``stream_training``) sums with denominators 1
    and divides the gradient by this once the batch is known."""
    if mode == "grpo":
        return max(n_seqs, 1)
    if mode == "dapo":
        return max(n_tokens, 1)
    if mode == "dr_grpo":
        return max(n_seqs * norm_len, 1)
    raise ValueError(f"unknown loss aggregation {mode!r}")


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    level: str = "token",
    loss: str = "clip",
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    dual_clip: float | None = None,
    cispo_min: float = 0.0,
    cispo_max: float = 5.0,
    sampler_logp: Tensor | None = None,
    is_mode: str = "off",
    is_cap: float = 3.0,
    is_floor: float = 0.0,
) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """The per-token policy loss [N, T] of every objective variant (``GRPOConfig``'s
    ``importance_sampling_level``, ``loss``, ``is_correction``), before aggregation and KL.

    ``level`` ``token`` or ``sequence`` (GSPO, :func:`sequence_log_ratio`) picks ρ; ``loss``
    ``clip`` (:func:`clipped_ratio_loss`) or ``cispo`` (:func:`cispo_token_loss`) the surrogate;
    with ``is_mode`` other than ``off`` the loss is multiplied by the detached weights of
    :func:`is_correction_weights` between ``old_logp`` (π_old) and ``sampler_logp`` (μ). The
    defaults call :func:`clipped_token_loss` itself, so today's loss is unchanged to the bit.
    Returns the loss, the clip mask, and the IS weights and their truncated/masked mask (None
    when ``is_mode`` is ``off``)."""
    if level == "token" and loss == "clip":
        per_tok, clipped = clipped_token_loss(logp, old_logp, adv, eps_low, eps_high, dual_clip)
    else:
        if level == "sequence":
            log_ratio = sequence_log_ratio(logp, old_logp, mask)
        elif level == "token":
            log_ratio = logp - old_logp
        else:
            raise ValueError(f"unknown importance_sampling_level {level!r}")
        if loss == "cispo":
            per_tok, clipped = cispo_token_loss(logp, log_ratio, adv, cispo_min, cispo_max)
        elif loss == "clip":
            per_tok, clipped = clipped_ratio_loss(
                torch.exp(log_ratio), adv, eps_low, eps_high, dual_clip
            )
        else:
            raise ValueError(f"unknown loss {loss!r}")
    if is_mode == "off":
        return per_tok, clipped, None, None
    if sampler_logp is None:
        raise ValueError(f"is_correction {is_mode!r} needs the sampler's log-probs")
    w, hit = is_correction_weights(old_logp, sampler_logp, mask, is_mode, is_cap, is_floor)
    return per_tok * w, clipped, w, hit
