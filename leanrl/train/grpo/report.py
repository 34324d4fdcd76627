"""What one GRPO step reports: which groups it keeps, why it trained on nothing, its log line.

Pure functions of rollouts and metrics rows, apart from :mod:`leanrl.train.grpo.trainer` so that
the trainer reads as the loop alone.
"""

from __future__ import annotations

import math
from typing import Any

from leanrl.rollout import Rollout
from leanrl.train.grpo.data import _Batch, ends_truncated

__all__: list[str] = []  # the trainer's helpers; nothing here is public


def _informative(g: list[Rollout], dynamic_sampling: str) -> bool:
    """Whether dynamic sampling keeps group ``g``: two judged rewards that differ."""
    judged = [x.reward for x in g if not x.infra]
    return dynamic_sampling == "off" or (len(judged) > 1 and len(set(judged)) > 1)


_CUT_OFF = ("all_truncated", "informative_truncated")
"""Skip reasons where cut-off attempts are the cause (``sampling.max_tokens``, masking)."""


def _skip_reason(batch: _Batch, mask_truncated: bool) -> str:
    """Why a step had nothing to train on (``skip_reason`` in its metrics row):
    ``all_infra`` (no attempt judged), ``all_truncated`` (every judged attempt cut off and
    masked), ``no_informative_group`` (every group's rewards equal), ``informative_truncated`` (the
    groups whose rewards differ were all cut off and masked), else ``no_model_tokens``."""
    judged = [r for g in batch.groups for r in g if not r.infra]
    if not judged:
        return "all_infra"
    if mask_truncated and all(ends_truncated(r) for r in judged):
        return "all_truncated"
    trainable = [r for g in batch.kept for r in g if not r.infra]
    if not trainable:
        return "no_informative_group"
    if mask_truncated and all(ends_truncated(r) for r in trainable):
        return "informative_truncated"
    return "no_model_tokens"


def _step_line(row: dict[str, Any], counter: str, skipped: str = "") -> str:
    """One concise log line for a finished step: ``counter`` (``step 3/20``, or the budget's
    share), ``skipped`` (why it trained on nothing). No pass rate where the environment gives
    rewards but no verdicts."""

    def f(key: str, fmt: str = ".3f") -> str:
        v = row.get(key)
        return "-" if v is None else format(v, fmt)

    what = f"skipped ({skipped})" if row.get("skipped") else f"loss {f('loss', '.4g')}"
    passed = "" if row.get("pass_rate") is None else f" pass {f('pass_rate')}"
    return (
        f"{counter}: reward {f('reward_mean')}{passed} "
        f"groups {row['groups_kept']}/{row['groups']} {what} {f('time_step', '.2f')}s"
    )


class _NoLog:
    """The metrics logger of ranks other than 0 (they write nothing)."""

    def start(self) -> None:
        return None

    def log(self, row: dict[str, Any]) -> None:
        return None

    def close(self) -> None:
        return None


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _std(xs: list[float]) -> float | None:
    if len(xs) < 2:
        return 0.0 if xs else None
    m = sum(xs) / len(xs)
    try:
        return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))
    except OverflowError:  # a square past 1.8e308 (check_rewards refuses such rewards first)
        return math.inf
