"""Attempts the checker could not judge (verdict ``infra``) in training runs.

An ``infra`` verdict says the checker did not run (a Lean process or sandbox failed to start,
the service was unreachable): it is no outcome of the model, so the trainers give it no weight
(GRPO leaves it out of its group, ES out of its member's mean) and pass rates leave it out, as
the eval runner's pass@k does. What they cannot hide is a run whose steps were mostly not
checked: each such step logs one warning, and ``summary.json`` lists those steps.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["INFRA_KEYS", "infra_metrics", "infra_summary", "warn_if_mostly_infra"]

INFRA_KEYS = ("infra", "infra_frac")
"""The metrics columns every trainer row carries: how many of the step's attempts were
``infra``, and what share of its attempts that was."""


def infra_metrics(infra: int, attempts: int) -> dict[str, Any]:
    """The ``infra`` columns of one metrics row."""
    return {"infra": infra, "infra_frac": infra / attempts if attempts else 0.0}


def _mostly(row: dict[str, Any]) -> bool:
    return float(row.get("infra_frac") or 0.0) > 0.5


def warn_if_mostly_infra(row: dict[str, Any], log: logging.Logger, unit: str = "step") -> bool:
    """One warning line when most of the row's attempts were not checked; whether it warned."""
    if not _mostly(row):
        return False
    log.warning(
        "%s %s: %d of its attempts (%.0f%%) could not be checked (`infra`: the checker did not "
        "run); they carry no weight, so this %s learned from the rest only. Check the runtime "
        "(`leanrl doctor`)",
        unit,
        row.get("step"),
        row.get("infra", 0),
        100 * float(row.get("infra_frac") or 0.0),
        unit,
    )
    return True


def infra_summary(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """``summary.json``'s view of the run's ``infra`` attempts: the total, and the steps where
    they were the majority (``mostly_infra``: true when there is any such step)."""
    seen: Sequence[dict[str, Any]] = [r for r in rows if "infra" in r and "step" in r]
    steps = sorted({int(r["step"]) for r in seen if _mostly(r)})
    return {
        "infra": sum(int(r["infra"]) for r in seen),
        "mostly_infra": bool(steps),
        "mostly_infra_steps": steps,
    }
