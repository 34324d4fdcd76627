"""The on-policy distillation term of the advantage, as pure functions of numbers.

For a sampled sequence j with group advantage A_j (0 with ``distill.only``), loss mask m_t
(1 on the model's tokens, 0 on the environment's and on masked ones), the sampler's log-prob
``log π_s(o_t)`` (the student that sampled the token, as it sampled it) and the teacher's
``log π_T(o_t)``::

    A_jt = A_j - λ · m_t · (log π_s(o_t) - log π_T(o_t))

``log π_s - log π_T`` at a token sampled from π_s is the one-sample estimate of the reverse KL
``KL(π_s || π_T)`` at that position (its expectation over o_t ~ π_s), so the policy gradient of
``A_jt`` pushes the student toward the teacher's mode, token by token (Agarwal et al. 2024,
"On-Policy Distillation of Language Models: Learning from Self-Generated Mistakes"; the
per-token reverse KL as an advantage is Thinking Machines' and the tinker cookbook's; prime-rl
and slime add it to the RL advantage the same way). The term is fixed for the batch (no
gradient flows through it) and enters the same clipped surrogate as A_j. Environment tokens
(m_t = 0) carry no KL and no loss.

Nothing here knows about models or configs; :func:`advantage_tensor` is what the GRPO engine's
loss reads (one advantage per sequence, or one per token once a teacher has scored the batch).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["DistillStats", "add_distill_term", "advantage_tensor"]


class _Scored(Protocol):
    """What the term reads and writes of a sequence (``leanrl.train.grpo.data._Sample``)."""

    resp: list[int]
    mask: list[int]
    old: list[float]
    adv: float
    tok_adv: list[float] | None


@dataclass
class DistillStats:
    """Sums over the model tokens of a step's scored sequences, for its metrics row."""

    tokens: int = 0
    rkl: float = 0.0  # Σ (log π_s - log π_T)
    teacher_logp: float = 0.0  # Σ log π_T
    kl_part: float = 0.0  # Σ |λ (log π_s - log π_T)|
    adv_part: float = 0.0  # Σ |A_j|
    sequences: int = 0
    by_env: dict[str, DistillStats] = field(default_factory=dict)

    def add(self, other: DistillStats) -> None:
        """Add ``other``'s sums to these."""
        self.tokens += other.tokens
        self.rkl += other.rkl
        self.teacher_logp += other.teacher_logp
        self.kl_part += other.kl_part
        self.adv_part += other.adv_part
        self.sequences += other.sequences

    def row(self, prefix: str = "distill/") -> dict[str, Any]:
        """``reverse_kl`` (mean per model token, nats), ``kl_share`` (the distillation term's
        share of the advantage's magnitude, Σ|λ·rkl| / (Σ|A_j| + Σ|λ·rkl|) over model tokens:
        1 with ``distill.only``), ``teacher_logp`` (mean), ``tokens``."""
        n = self.tokens
        total = self.kl_part + self.adv_part
        out: dict[str, Any] = {
            f"{prefix}reverse_kl": self.rkl / n if n else None,
            f"{prefix}kl_share": self.kl_part / total if total > 0 else None,
            f"{prefix}teacher_logp": self.teacher_logp / n if n else None,
            f"{prefix}tokens": n,
        }
        for env, sub in sorted(self.by_env.items()):
            got = sub.row(f"{prefix}{env}/")
            out.update({k: v for k, v in got.items() if not k.endswith("/tokens")})
        return out


def add_distill_term(
    sample: _Scored, teacher_logp: Sequence[float], coef: float, only: bool
) -> DistillStats:
    """Set ``sample.tok_adv`` to ``A_j - λ·m_t·(log π_s - log π_T)`` per response token (with
    ``only``, A_j = 0) and return the sums it adds to the step's figures. ``teacher_logp`` has
    one value per response token (any value where the mask is 0)."""
    if len(teacher_logp) != len(sample.resp):
        raise ValueError(
            f"the teacher scored {len(teacher_logp)} tokens of a {len(sample.resp)}-token response"
        )
    base = 0.0 if only else float(sample.adv)
    stats = DistillStats(sequences=1)
    out: list[float] = []
    for m, old, t in zip(sample.mask, sample.old, teacher_logp, strict=True):
        if not m:
            out.append(base)
            continue
        if not (math.isfinite(old) and math.isfinite(t)):
            raise ValueError(
                "a model token without a finite log-prob (the sampler's or the teacher's): "
                "on-policy distillation needs both"
            )
        rkl = old - t
        out.append(base - coef * rkl)
        stats.tokens += 1
        stats.rkl += rkl
        stats.teacher_logp += t
        stats.kl_part += abs(coef * rkl)
        stats.adv_part += abs(base)
    sample.tok_adv = out
    return stats


def advantage_tensor(micro: Sequence[Any], width: int, device: Any) -> Any:
    """The advantages of a micro-batch for the loss: ``[n]`` (one per sequence) when no
    sequence has per-token advantages, else ``[n, width]`` right-aligned like the log-probs
    (a sequence without them repeats its A_j; padding is 0)."""
    import torch

    if all(getattr(s, "tok_adv", None) is None for s in micro):
        return torch.tensor([s.adv for s in micro], device=device)
    out = torch.zeros((len(micro), width), dtype=torch.float32)
    for k, s in enumerate(micro):
        row = s.tok_adv if s.tok_adv is not None else [s.adv] * len(s.resp)
        if row:
            out[k, width - len(row) :] = torch.tensor(row, dtype=torch.float32)
    return out.to(device)
