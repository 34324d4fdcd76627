"""The in-run evaluation options (its own small module: every trainer's config holds one, and
configs are imported at CLI start-up, before torch)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from leanrl.environment import EnvironmentConfig
from leanrl.policy import SamplingConfig

__all__ = ["InRunEvalConfig"]


class EvalSamplingConfig(SamplingConfig):
    """Sampling for held-out evaluation: greedy unless a temperature is set."""

    temperature: float = Field(default=0.0, ge=0.0)
    """Softmax temperature; 0 (the default here) means greedy decoding."""


class InRunEvalConfig(BaseModel):
    """Held-out evaluation while training: pass@k on a named environment every ``every`` steps,
    with the weights being trained, logged to ``metrics.jsonl`` (keys ``eval/pass@k``) and
    plotted to ``eval_curve.png``. Each evaluation's full output (results.jsonl, report.md and
    its own proofs.jsonl, never mixed into the run's training proofs) goes to
    ``RUN/eval/step-N/``."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    every: int = Field(default=0, ge=0)
    """Evaluate after every this many trainer steps (ES: iterations; SFT: optimizer steps) and
    after the last one. 0 (the default) turns it off."""
    env: EnvironmentConfig | None = None
    """The held-out environment (``--eval.env.id minif2f --eval.env.taskset.split valid``).
    Required when ``every`` is set; keep it disjoint from the training set. Without an ``id``
    it is the training environment (its id, source, harness and runtime) with the split and
    filters given here: ``--eval.env.taskset.split test``."""
    samples: int = Field(default=1, ge=1)
    """Attempts per task (the n of pass@k)."""
    k: list[int] | None = None
    """The k values logged (``1,8``). Default: 1 and ``samples``."""
    sampling: EvalSamplingConfig = Field(default_factory=EvalSamplingConfig)
    """Sampling for the evaluation (default: greedy; set a temperature for ``samples > 1``)."""
    at_start: bool = False
    """Also evaluate the starting weights (logged as step 0), for a baseline on the plot."""
    allow_overlap: bool = False
    """Let the held-out set share tasks (by name) with the training set. Off: a run whose
    evaluation would score tasks it trains on stops before loading the model, naming them."""

    @field_validator("sampling", mode="before")
    @classmethod
    def _plain_sampling(cls, v: Any) -> Any:
        # A SamplingConfig given in Python (or copied from another config) is taken as it is.
        return EvalSamplingConfig.given_fields(v, all_fields=True)

    @field_validator("k", mode="before")
    @classmethod
    def _parse_k(cls, v: Any) -> Any:
        if isinstance(v, str):
            return [int(x) for x in re.split(r"[,\s]+", v.strip()) if x]
        return [v] if isinstance(v, int) else v

    @model_validator(mode="after")
    def _check(self) -> InRunEvalConfig:
        if self.every and self.env is None:
            raise ValueError(
                "eval.every is set but eval.env is not: name the held-out set, e.g. "
                "--eval.env.taskset.split test (the training environment's test split) or "
                "--eval.env.id minif2f --eval.env.taskset.split valid"
            )
        bad = [k for k in self.ks if k > self.samples]
        if bad:
            raise ValueError(f"eval.k {bad} is larger than eval.samples = {self.samples}")
        return self

    def check_held_out(self, train_names: Iterable[str]) -> None:
        """Refuse (ConfigError) a held-out set that shares tasks with the training set, unless
        ``allow_overlap``. Loads the held-out environment's task list (no model, no Lean)."""
        if not self.every or self.env is None or self.allow_overlap:
            return
        from leanrl.environment import load_environment
        from leanrl.errors import ConfigError

        held = {t.name for t in load_environment(self.env).tasks()}
        shared = sorted(held & set(train_names))
        if shared:
            split = self.env.taskset.split if "split" in self.env.taskset.model_fields_set else None
            where = f"{self.env.id}" + (f" (split {split})" if split else "")
            raise ConfigError(
                f"the held-out evaluation on {where} shares {len(shared)} of its {len(held)} "
                f"tasks with the training set (e.g. {', '.join(shared[:3])}): its pass rate would "
                "measure memorisation. Train and evaluate on different splits (e.g. "
                "--env.taskset.split train --eval.env.taskset.split test), or pass "
                "--eval.allow-overlap to evaluate on training tasks on purpose."
            )

    @property
    def ks(self) -> list[int]:
        """The k values logged, sorted."""
        return sorted(set(self.k or [1, self.samples]))

    def baseline_due(self, rows: list[dict[str, Any]]) -> bool:
        """Whether to evaluate the starting weights now: ``at_start`` is on and the run's
        ``metrics.jsonl`` (``rows``) has no step-0 evaluation yet (a resumed run has one)."""
        return bool(self.every and self.at_start) and not any(r.get("step") == 0 for r in rows)

    def due(self, step: int, last: int) -> bool:
        """Whether to evaluate after trainer step ``step`` of a run that ends at ``last``."""
        if not self.every:
            return False
        if step == 0:
            return self.at_start
        return step % self.every == 0 or step == last
