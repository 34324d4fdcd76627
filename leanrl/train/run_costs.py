"""Cost accounting shared by the trainers: one :class:`RunCosts` per training process.

It prices the GPUs this process holds (wall time × GPUs, at ``launcher.gpu``), the sandboxes of
the environment's runtime, and whatever a remote scorer reports (its containers' GPU time and
their sandboxes), adds ``cost/...`` columns to every metrics row, and writes the run's totals
to ``summary.json`` at the end.
"""

from __future__ import annotations

import json
import time
from typing import Any

from leanrl.costs import CostMeter, Usage, local_gpus, sandbox_usage
from leanrl.launch.config import LauncherConfig
from leanrl.train.common import RunDir
from leanrl.train.infra import infra_summary

__all__ = ["SUMMARY_FILE", "RunCosts"]

SUMMARY_FILE = "summary.json"
"""The run's totals (cost, steps, wall time, ``infra`` attempts), written at the end of every
training call."""


class RunCosts:
    """GPU-seconds, sandbox-seconds and dollars of one training process, step by step."""

    def __init__(self, launcher: LauncherConfig) -> None:
        self.launcher = launcher
        self.meter = CostMeter(launcher.prices)
        self.kind: str | None = None
        self.count = 0
        self._t0 = time.perf_counter()

    def start(self, run: RunDir, device: str, gpus: int = 1) -> None:
        """Start the clock; a resumed run continues the totals of its last metrics row."""
        self.kind, self.count = local_gpus(device, self.launcher.gpu, gpus)
        self.meter.prices.gpu(self.kind)  # an unknown GPU type fails now, not at step 1
        self.meter.resume(run.metrics())
        self._t0 = time.perf_counter()

    def usage(self, env: Any = None, scorer: Any = None) -> Usage:
        """Cumulative usage of this process so far (its GPUs, the runtime's sandboxes, and a
        remote scorer's containers)."""
        held = (time.perf_counter() - self._t0) * self.count
        usage = Usage(gpu_s={self.kind: held} if self.kind else {})
        runtime = getattr(env, "_runtime", None)  # never build a runtime just to ask it
        if runtime is not None:
            usage = usage.add(sandbox_usage(runtime.metrics()))
        remote = getattr(scorer, "usage", None)
        if callable(remote):
            usage = usage.add(remote())
        return usage

    def row(self, env: Any = None, scorer: Any = None) -> dict[str, Any]:
        """The ``cost/...`` columns of the step that just finished."""
        return self.meter.step(self.usage(env, scorer))

    def write_summary(self, run: RunDir, trainer: str, extra: dict[str, Any]) -> None:
        """``summary.json``: the run's cost totals, its last step and what the caller adds.
        Nothing for a start that failed before its first step: no metrics row and no
        checkpoint means no run, and a summary would say "0 steps" of one."""
        every = run.metrics()
        if not every and not run.checkpoints():
            return
        rows = [r for r in every if "cost/total_usd" in r]
        last = rows[-1] if rows else {}
        summary = {
            "trainer": trainer,
            "steps": last.get("step", 0),
            "cost": self.meter.summary(),
            "prices": self.launcher.prices.model_dump(),
            "gpu": self.kind,
            **infra_summary(every),  # attempts the checker could not judge, loud if most
            **extra,
        }
        run.path.mkdir(parents=True, exist_ok=True)
        tmp = run.path / f".{SUMMARY_FILE}.tmp"
        tmp.write_text(json.dumps(summary, indent=2, default=str))
        tmp.replace(run.path / SUMMARY_FILE)
