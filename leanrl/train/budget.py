"""A training budget: stop a run once it has generated so many tokens or used so many
GPU-seconds, whatever ``steps`` says (how ``leanrl compare`` gives ES and GRPO equal budgets).

Every metrics row carries ``tokens`` (generated this step, all members or samples) and
``total_tokens`` (the whole run, resumes included); GPU-seconds are ``cost/total_gpu_s``. The
row of the step that spends the budget has ``budget_spent = true``, the trainer logs one line
saying so (:meth:`BudgetTracker.spent_line`), and ``summary.json`` has a ``budget`` section.

A run stops at the step boundary *nearest* its budget: after a step, it stops when the budget
is reached, or when one more step of the mean size so far would end further past the budget
than the run is short of it now (``total + mean_step / 2 > budget``). Stopping only once the
budget is reached would overshoot by up to a whole step, and a method with big steps (GRPO: a
step is tasks x group x completion) would get up to a third more than one with small steps in
a compare; this way either ends within about half of its own step of the budget.
SFT and expert iteration generate no tokens to count (or not step by step) and refuse a budget.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["BudgetConfig", "BudgetTracker"]


class BudgetConfig(BaseModel):
    """Stop training early once a budget is spent (unset: train for ``steps``)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    tokens: int | None = Field(default=None, ge=1)
    """Stop at the step boundary nearest this many generated tokens: the run's total ends within
    about half a step of it (docs/training-grpo.md explains the rule)."""
    gpu_s: float | None = Field(default=None, gt=0)
    """Stop at the step boundary nearest this many GPU-seconds (``cost/total_gpu_s``)."""

    @property
    def active(self) -> bool:
        return self.tokens is not None or self.gpu_s is not None


class BudgetTracker:
    """Adds ``total_tokens`` to each row and says when the budget is spent (and, in words, what
    was spent: :meth:`spent_line`)."""

    def __init__(self, budget: BudgetConfig) -> None:
        self.budget = budget
        self.total_tokens = 0
        self.total_gpu_s = 0.0
        self.steps = 0  # steps counted (resumed ones included): the mean step size
        self.spent = False
        self.early = False  # stopped short of the budget: one more step would overshoot more

    def resume(self, rows: list[dict[str, Any]]) -> None:
        counted = [r for r in rows if "total_tokens" in r]
        if counted:
            self.steps = len(counted)
            self.total_tokens = int(counted[-1]["total_tokens"])
            self._check(counted[-1])

    def update(self, row: dict[str, Any]) -> None:
        """Count ``row['tokens']`` and set ``row['total_tokens']``; the row that spends the
        budget also gets ``budget_spent = True``."""
        self.total_tokens += int(row.get("tokens") or 0)
        self.steps += 1
        row["total_tokens"] = self.total_tokens
        self._check(row)
        if self.spent:
            row["budget_spent"] = True

    def spent_line(self, step: int, unit: str = "step", *, already: bool = False) -> str:
        """What stopped the run, in one line: ``budget spent: 1040 generated tokens of 1000;
        stopping after step 5``. ``already``: a resumed run whose budget was spent before it
        started (nothing to train; the budget may be raised on resume)."""
        b = self.budget
        what = []
        if b.tokens is not None and self._near(self.total_tokens, b.tokens):
            what.append(f"{self.total_tokens} generated tokens of {b.tokens}")
        if b.gpu_s is not None and self._near(self.total_gpu_s, b.gpu_s):
            what.append(f"{self.total_gpu_s:.1f} GPU-seconds of {b.gpu_s:g}")
        spent = " and ".join(what)
        if self.early:
            spent += " (one more step would have ended further past it)"
        if already:
            return (
                f"budget already spent: {spent} at {unit} {step}; nothing to train (raise "
                "--budget.tokens or --budget.gpu_s to go on)"
            )
        return f"budget spent: {spent}; stopping after {unit} {step}"

    def counter(self, step: int, steps: int, unit: str = "step") -> str:
        """How far the run is, for its log line: ``step 3/20``, or with a budget (where
        ``steps`` is only a cap) ``step 3, 41% of the token budget``."""
        b = self.budget
        if not b.active:
            return f"{unit} {step}/{steps}"
        shares = []
        if b.tokens is not None:
            shares.append(f"{100 * self.total_tokens / b.tokens:.0f}% of the token budget")
        if b.gpu_s is not None:
            shares.append(f"{100 * self.total_gpu_s / b.gpu_s:.0f}% of the GPU-second budget")
        return f"{unit} {step}, {' and '.join(shares)}"

    def summary(self) -> dict[str, Any]:
        """The budget's part of ``summary.json`` (nothing without a budget)."""
        if not self.budget.active:
            return {}
        return {
            "budget": {
                **self.budget.model_dump(),
                "spent": self.spent,
                "total_tokens": self.total_tokens,
                "total_gpu_s": self.total_gpu_s,
            }
        }

    def _near(self, total: float, budget: float) -> bool:
        """At the step boundary nearest ``budget``: reached, or a mean step away from ending
        further past it than ``total`` is short of it."""
        mean = total / self.steps if self.steps else 0.0
        return total >= budget or total + mean / 2 > budget

    def _check(self, row: dict[str, Any]) -> None:
        b = self.budget
        self.total_gpu_s = float(row.get("cost/total_gpu_s") or 0.0)
        reached = bool(
            (b.tokens is not None and self.total_tokens >= b.tokens)
            or (b.gpu_s is not None and self.total_gpu_s >= b.gpu_s)
        )
        near = bool(
            (b.tokens is not None and self._near(self.total_tokens, b.tokens))
            or (b.gpu_s is not None and self._near(self.total_gpu_s, b.gpu_s))
        )
        self.spent = near
        self.early = near and not reached
