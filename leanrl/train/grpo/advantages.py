"""Advantage transforms beyond GRPO's group-relative one: pass@k (PKPO) and the unlikeliness reward.

Pure functions of a group's rewards (and, for the unlikeliness reward, of its sequences' mean
log-probs), like :mod:`leanrl.train.grpo.loss`; ``tests/test_grpo_objectives_ext.py`` checks them
against brute force over every k-subset of small synthetic groups.

**Pass@k (PKPO, Walder & Karkhanis 2025, "Pass@K Policy Optimization").** Provers are scored at
pass@k for large k, while GRPO's per-sample reward optimises pass@1 and sharpens the
distribution. For a group of n i.i.d. attempts with rewards g_1..g_n, the unbiased estimate of
``maxg@k = E[max of k attempts]`` (``pass@k`` for 0/1 rewards) averages the maximum over all
C(n, k) k-subsets S; its score-function gradient is ``Σ_i s_i ∇ log π(x_i)`` with
``s_i = 1/C(n,k) · Σ_{S ∋ i} max_{j∈S} g_j``. Here ``r̃_i = (n/k) · s_i`` (the *transformed
reward*), scaled so that its group mean is exactly the unbiased maxg@k estimate. With the rewards
sorted ascending, ``g_(1) ≤ ... ≤ g_(n)``, the attempt at sorted position i has::

    r̃_(i) = n / (k · C(n,k)) · [ C(i-1, k-1) · g_(i) + Σ_{m>i} C(m-2, k-2) · g_(m) ]

(the subsets where it is the maximum, and those where a larger m is). For 0/1 rewards with c
correct: ``r̃ = 1`` for a correct attempt and ``ρ(n-1, c, k-1) = 1 - C(n-1-c, k-1)/C(n-1, k-1)``
for a wrong one (PKPO's binary form, times n/k). A baseline b_i that does not depend on attempt
i keeps the gradient unbiased and lowers its variance (PKPO's leave-one-out variants):

- ``loo``: ``b_i = maxg@k`` estimated from the other n-1 attempts (needs k ≤ n-1);
- ``loo_minus_one``: ``b_i = maxg@(k-1)`` from the other n-1 attempts. Then
  ``r̃_i - b_i = n/(k·C(n,k)) · Σ_{S∋i} (max S - max S∖{i})``: an attempt earns only where it
  beats the rest of its subset, so every attempt that is not the group's best-ranked gets less.
  With k = 1 there is no k-1 = 0 estimate, and ``loo`` is used.

**Unlikeliness reward (He, Fried & Welleck 2025, "Rewarding the Unlikely: Lifting GRPO Beyond
Distribution Sharpening").** GRPO reinforces the correct proofs the model already finds likely
and neglects rare ones (rank bias). The reward of attempt i becomes
``r_i · (1 - β · rank_i / n)``, where ``rank_i`` ∈ {0..n-1} orders the group by the sequence's mean
per-token log-prob under the sampling policy, 0 for the least likely (tied values share their
mean rank): a correct but unlikely proof keeps its whole reward, the most likely loses up to β.
The group-relative advantage is then taken of these rewards as usual.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from leanrl.errors import PolicyError
from leanrl.rollout import Rollout

__all__ = [
    "PassKBaseline",
    "max_at_k_estimate",
    "mean_sampler_logp",
    "pass_at_k_advantages",
    "pass_at_k_rewards",
    "unlikeliness_rewards",
]

PassKBaseline = Literal["none", "loo", "loo_minus_one"]
"""The baseline subtracted from PKPO's transformed rewards (see the module docstring)."""


def max_at_k_estimate(values: list[float], k: int) -> float:
    """Unbiased estimate of ``E[max of k draws]`` from ``values`` (n ≥ k i.i.d. draws): the mean
    over every k-subset of its maximum, ``1/C(n,k) · Σ_i C(i-1, k-1) · v_(i)`` over the values
    sorted ascending (the i-th smallest is the maximum of C(i-1, k-1) subsets). For 0/1 values
    with c ones this is ``1 - C(n-c, k)/C(n, k)``, the pass@k estimator of Chen et al. 2021."""
    n = len(values)
    if not 1 <= k <= n:
        raise ValueError(f"max@k needs 1 <= k <= n (got k = {k}, n = {n})")
    v = sorted(values)
    total = math.comb(n, k)
    # exact integer weights, one division each: float64 keeps the sum accurate for large n
    return sum(math.comb(i, k - 1) / total * v[i] for i in range(k - 1, n))


def pass_at_k_rewards(values: list[float], k: int) -> list[float]:
    """PKPO's transformed rewards ``r̃_i = (n/k) · 1/C(n,k) · Σ_{S∋i} max S`` of one group (in the
    order given); their mean is ``max_at_k_estimate(values, k)``. O(n log n + n) with a running
    suffix sum over the sorted rewards."""
    n = len(values)
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n (got k = {k}, n = {n})")
    order = sorted(range(n), key=lambda j: values[j])
    v = [values[j] for j in order]
    scale = n / (k * math.comb(n, k))
    out = [0.0] * n
    # suffix[i] = Σ_{m>i} C(m-1, k-2) · v[m] with 0-based m (C(m-2, k-2) in 1-based positions):
    # the subsets holding position i whose maximum is a larger position m.
    tail = 0.0
    for i in range(n - 1, -1, -1):
        own = math.comb(i, k - 1) * v[i]  # subsets where position i is the maximum
        out[order[i]] = scale * (own + tail)
        if k >= 2 and i >= 1:
            tail += math.comb(i - 1, k - 2) * v[i]
    return out


def _pkpo_group(values: list[float], k: int, baseline: PassKBaseline) -> list[float]:
    """One group's PKPO advantages (before any std scaling)."""
    n = len(values)
    r = pass_at_k_rewards(values, k)
    if baseline == "none":
        return r
    j = k if baseline == "loo" or k == 1 else k - 1
    out = []
    for i in range(n):
        others = values[:i] + values[i + 1 :]
        out.append(r[i] - max_at_k_estimate(others, j))
    return out


def pass_at_k_advantages(
    rewards: Tensor,
    k: int,
    baseline: PassKBaseline = "loo_minus_one",
    scale: Literal["group", "batch", "none"] = "group",
    eps: float = 1e-4,
    counted: Tensor | None = None,
) -> Tensor:
    """PKPO advantages for rewards [B, G]: the transformed rewards of each group minus the chosen
    leave-one-out baseline, then divided by the std of the group's advantages (``group``), of
    every group's (``batch``), or not at all (``none``).

    Only ``counted`` rewards (default: all) take part, as n; the others get 0. A group with
    fewer than two counted rewards gets 0. When fewer than k rewards count, k is lowered to what
    the group has (to n - 1 for ``loo``). A group whose rewards are all equal gets 0 with either
    baseline (``none`` gives it its constant transformed reward). Returns [B, G] float32.
    """
    r = rewards.to(torch.float64)
    w = torch.ones_like(r, dtype=torch.bool) if counted is None else counted.to(torch.bool)
    out = torch.zeros_like(r)
    for b in range(r.shape[0]):
        idx = [g for g in range(r.shape[1]) if bool(w[b, g])]
        n = len(idx)
        if n < 2:
            continue
        kk = min(k, n - 1) if baseline == "loo" else min(k, n)
        vals = [float(r[b, g]) for g in idx]
        for g, a in zip(idx, _pkpo_group(vals, kk, baseline), strict=True):
            out[b, g] = a
    if scale == "group":
        for b in range(r.shape[0]):
            sel = w[b]
            if int(sel.sum()) > 1:
                std = out[b][sel].std()
                if std > 0:  # an all-equal group keeps its advantages (0 with a baseline)
                    out[b] = torch.where(sel, out[b] / (std + eps), out[b])
    elif scale == "batch":
        pool = out[w]
        if pool.numel() > 1 and pool.std() > 0:
            out = out / (pool.std() + eps)
    return out.to(torch.float32)


def unlikeliness_rewards(
    rewards: Tensor, mean_logp: Tensor, beta: float, counted: Tensor | None = None
) -> Tensor:
    """The unlikeliness reward ``r_i · (1 - β · rank_i / n)`` for rewards and mean per-token
    log-probs [B, G]; ``rank_i`` orders the counted attempts of a group by ``mean_logp`` (0 =
    least likely; ties share their mean rank), n is their number. Uncounted rewards are returned
    as they are (the advantage leaves them out anyway). Returns [B, G] float32."""
    r = rewards.to(torch.float32).clone()
    w = torch.ones_like(r, dtype=torch.bool) if counted is None else counted.to(torch.bool)
    for b in range(r.shape[0]):
        idx = [g for g in range(r.shape[1]) if bool(w[b, g])]
        n = len(idx)
        if n == 0:
            continue
        lp = [float(mean_logp[b, g]) for g in idx]
        for g, rank in zip(idx, _mean_ranks(lp), strict=True):
            r[b, g] = r[b, g] * (1.0 - beta * rank / n)
    return r


def _mean_ranks(x: list[float]) -> list[float]:
    """0-based ranks of ``x`` ascending, tied values sharing the mean of their ranks."""
    order = sorted(range(len(x)), key=lambda i: x[i])
    ranks = [0.0] * len(x)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
            j += 1
        for t in range(i, j + 1):
            ranks[order[t]] = (i + j) / 2
        i = j + 1
    return ranks


def mean_sampler_logp(r: Rollout) -> float:
    """Mean log-prob per model token of rollout ``r`` under the policy that sampled it (the
    likelihood the unlikeliness reward ranks by); 0.0 for an infra rollout or one without tokens.
    """
    if r.infra:
        return 0.0
    _, mask, lps = r.token_ids_and_mask()
    got = [lp for lp, m in zip(lps, mask, strict=True) if m]
    if any(lp is None for lp in got):
        raise PolicyError(
            f"advantage = 'unlikeliness' ranks attempts by the sampler's log-probs, but a "
            f"rollout of task {r.task_id!r} has none: use a backend that reports them (hf, "
            "vllm) or another advantage"
        )
    return sum(got) / len(got) if got else 0.0  # type: ignore[arg-type]
