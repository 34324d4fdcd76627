"""A training budget: stop a run once it has generated so many tokens or used so many
GPU-seconds, whatever ``steps`` says (how ``leanrl compare`` gives ES and GRPO equal budgets).

Every metrics row carries ``tokens`` (generated this step, all members or samples) and
``total_tokens`` (the whole run, resumes included); GPU-seconds are ``cost/total_gpu_s``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["BudgetConfig", "BudgetTracker"]


class BudgetConfig(BaseModel):
    """Stop training early once a budget is spent (unset: train for ``steps``)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    tokens: int | None = Field(default=None, ge=1)
    """Stop after the step at which the run's generated tokens reach this many."""
    gpu_s: float | None = Field(default=None, gt=0)
    """Stop after the step at which the run's GPU-seconds (``cost/total_gpu_s``) reach this."""

    @property
    def active(self) -> bool:
        return self.tokens is not None or self.gpu_s is not None


class BudgetTracker:
    """Adds ``total_tokens`` to each row and says when the budget is spent."""

    def __init__(self, budget: BudgetConfig) -> None:
        self.budget = budget
        self.total_tokens = 0
        self.spent = False

    def resume(self, rows: list[dict[str, Any]]) -> None:
        for row in reversed(rows):
            if "total_tokens" in row:
                self.total_tokens = int(row["total_tokens"])
                self._check(row)
                return

    def update(self, row: dict[str, Any]) -> None:
        """Count ``row['tokens']`` and set ``row['total_tokens']``."""
        self.total_tokens += int(row.get("tokens") or 0)
        row["total_tokens"] = self.total_tokens
        self._check(row)

    def _check(self, row: dict[str, Any]) -> None:
        b = self.budget
        gpu = float(row.get("cost/total_gpu_s") or 0.0)
        self.spent = bool(
            (b.tokens is not None and self.total_tokens >= b.tokens)
            or (b.gpu_s is not None and gpu >= b.gpu_s)
        )
