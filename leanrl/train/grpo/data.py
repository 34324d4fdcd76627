"""What flows through one GRPO step: the sequences the loss sees and the batch of one step.

Shared by the trainer loop (:mod:`leanrl.train.grpo.trainer`) and the torch side
(:mod:`leanrl.train.grpo.engine`), so neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from leanrl.rollout import Rollout
from leanrl.verdict import Reason

__all__ = ["ends_truncated"]


@dataclass
class _Sample:
    """One sequence for the loss: prompt, response (model + environment tokens), per-token data."""

    prompt: list[int]
    resp: list[int]
    mask: list[int]  # 1 = model token with loss, 0 = environment token or masked
    old: list[float]  # behaviour log-prob per response token (0.0 where unknown and masked)
    adv: float
    ref: list[float] | None = None  # reference log-probs (β > 0), filled before training
    # the sampler's log-probs, kept when ``old`` is recomputed for ``is_correction`` (issue 25)
    sampler: list[float] | None = None
    # issue 40: the rollout's task (a mixed run's teacher is its environment's), and one
    # advantage per response token once a teacher has scored it (else ``adv`` for every token)
    task_id: str = ""
    tok_adv: list[float] | None = None


@dataclass
class _Batch:
    step: int
    groups: list[list[Rollout]]  # every group sampled (dropped ones included)
    kept: list[list[Rollout]]
    samples: list[_Sample]
    version: int  # weights version that generated it
    t_rollout: float
    t_generate: float
    # stream_training: the step's gradient, accumulated group by group during the rollout
    # (a ``streamed.StepSums``; None: train on ``samples`` after it)
    streamed: Any = None


def ends_truncated(r: Rollout) -> bool:
    """Whether the attempt as a whole was cut off: its last turn hit the token limit, or the
    episode ran out of its total token budget (Verdict reason ``truncated``).

    A multi-turn episode whose early turn was cut but which went on and finished is *not*
    truncated: its reward is a real outcome, so its tokens keep their loss.
    """
    if r.turns and r.turns[-1].finish_reason == "length":
        return True
    return r.verdict is not None and r.verdict.reason == Reason.TRUNCATED
