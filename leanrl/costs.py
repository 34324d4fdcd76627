"""What a run costs: GPU-seconds, sandbox-seconds and dollars, from a price table.

Every trainer metrics row and every ``summary.json`` carries:

- ``gpu_s``: GPU-seconds billed (GPUs held × seconds held; an idle GPU still costs),
- ``sandbox_s``: sandbox-seconds billed (each Lean sandbox from its creation to its end, idle
  warm time included) and the reserved ``sandbox_cpu_s`` / ``sandbox_gib_s`` behind it,
- ``usd``: those priced with :class:`PriceTable`, plus the orchestrator's CPU and memory when it
  runs in a Modal Function,

for the step (``cost/gpu_s``...) and for the whole run so far (``cost/total_gpu_s``...). A local
run is priced as if it ran on Modal at list prices (what the same work would cost there), which
keeps local and Modal runs comparable; set the prices to 0 to see only seconds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from leanrl.errors import ConfigError

__all__ = [
    "CostMeter",
    "PriceTable",
    "Usage",
    "gpu_kind",
    "local_gpus",
    "sandbox_usage",
]

# Modal's published list prices, USD per second (https://modal.com/pricing). Read on 2026-12-01
# from the transcription of that page in the api-evangelist/modal-labs plans file (dated
# 2026-07-01): Modal itself cannot be reached from the machine this was written on. Sandboxes
# (and Notebooks) are billed at their own, higher CPU and memory rates.
_GPU_PRICES: dict[str, float] = {
    "B200": 0.001736,
    "H200": 0.001261,
    "H100": 0.001097,
    "RTX-PRO-6000": 0.000842,
    "A100-80GB": 0.000694,
    "A100-40GB": 0.000583,
    "L40S": 0.000542,
    "A10": 0.000306,
    "L4": 0.000222,
    "T4": 0.000164,
}


class PriceTable(BaseModel):
    """Dollar prices per second. Defaults: Modal's published list prices
    (https://modal.com/pricing), read 2026-12-01 as transcribed on 2026-07-01 (Modal was not
    reachable from where this was written): GPUs B200 $0.001736/s, H200 $0.001261/s, H100
    $0.001097/s, A100-80GB $0.000694/s, A100-40GB $0.000583/s, L40S $0.000542/s, A10
    $0.000306/s, L4 $0.000222/s, T4 $0.000164/s; Function CPU $0.0000131 per physical core-second
    and memory $0.00000222 per GiB-second; Sandbox CPU $0.00003942 per core-second and memory
    $0.00000672 per GiB-second. Override any of them for negotiated or newer prices."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    gpu_per_s: dict[str, float] = Field(default_factory=lambda: dict(_GPU_PRICES))
    """USD per GPU-second by GPU type (Modal's names: ``H100``, ``A100-80GB``, ``L4``...)."""
    cpu_core_per_s: float = Field(default=0.0000131, ge=0)
    """USD per physical CPU core-second of a Function (the CPU orchestrator)."""
    memory_gib_per_s: float = Field(default=0.00000222, ge=0)
    """USD per GiB-second of a Function's memory."""
    sandbox_cpu_core_per_s: float = Field(default=0.00003942, ge=0)
    """USD per CPU core-second reserved by a Lean Sandbox."""
    sandbox_memory_gib_per_s: float = Field(default=0.00000672, ge=0)
    """USD per GiB-second of memory reserved by a Lean Sandbox."""

    def gpu(self, kind: str | None) -> float:
        """USD per second of one GPU of ``kind`` (0 for no GPU); unknown kinds are an error."""
        if not kind:
            return 0.0
        key = _normalise(kind)
        for name, price in self.gpu_per_s.items():
            if _normalise(name) == key:
                return price
        raise ConfigError(
            f"no price for GPU type {kind!r}: known {sorted(self.gpu_per_s)}. Add it with "
            f"--launcher.prices.gpu_per_s '{{\"{kind}\": 0.001}}' (USD per second)"
        )


def _normalise(kind: str) -> str:
    return re.sub(r"[^a-z0-9]", "", kind.lower())


def gpu_kind(device_name: str) -> str | None:
    """The price-table name of a CUDA device (``torch.cuda.get_device_name``), or None.

    ``NVIDIA H100 80GB HBM3`` -> ``H100``; ``NVIDIA A100-SXM4-40GB`` -> ``A100-40GB``.
    """
    name = device_name.upper()
    if "A100" in name:
        return "A100-40GB" if "40G" in name else "A100-80GB"
    for kind in ("B200", "H200", "H100", "L40S", "A10", "L4", "T4"):
        if re.search(rf"(?<![A-Z0-9]){kind}(?![0-9])", name):
            return kind
    if "RTX PRO 6000" in name or "RTX-PRO-6000" in name:
        return "RTX-PRO-6000"
    return None


def local_gpus(device: str, setting: str, count: int = 1) -> tuple[str | None, int]:
    """(price-table GPU kind, GPUs held) of a process running on ``device``.

    ``setting`` is ``launcher.gpu``: ``none`` bills nothing, ``auto`` names the CUDA device
    (CPU: nothing), anything else is taken as the kind.
    """
    if setting == "none" or not device.startswith("cuda"):
        return None, 0
    if setting != "auto":
        return setting, count
    import torch

    if not torch.cuda.is_available():
        return None, 0
    index = int(device.split(":", 1)[1]) if ":" in device else 0
    kind = gpu_kind(torch.cuda.get_device_name(index))
    return kind, count if kind else 0


@dataclass
class Usage:
    """Billed resources: GPU-seconds by kind, sandbox and orchestrator seconds."""

    gpu_s: dict[str, float] = field(default_factory=dict)
    """GPU-seconds by GPU kind (GPUs held × seconds)."""
    sandbox_s: float = 0.0
    """Sandbox-seconds (each sandbox's lifetime)."""
    sandbox_cpu_s: float = 0.0
    """CPU core-seconds the sandboxes reserved."""
    sandbox_gib_s: float = 0.0
    """GiB-seconds of memory the sandboxes reserved."""
    cpu_s: float = 0.0
    """CPU core-seconds of Functions without a GPU (the orchestrator)."""
    gib_s: float = 0.0
    """GiB-seconds of memory of those Functions."""

    def add(self, other: Usage) -> Usage:
        gpu = dict(self.gpu_s)
        for k, v in other.gpu_s.items():
            gpu[k] = gpu.get(k, 0.0) + v
        return Usage(
            gpu,
            self.sandbox_s + other.sandbox_s,
            self.sandbox_cpu_s + other.sandbox_cpu_s,
            self.sandbox_gib_s + other.sandbox_gib_s,
            self.cpu_s + other.cpu_s,
            self.gib_s + other.gib_s,
        )

    def minus(self, other: Usage) -> Usage:
        """``self - other``, never below 0 (counters restart when a process restarts)."""
        gpu = {k: max(0.0, v - other.gpu_s.get(k, 0.0)) for k, v in self.gpu_s.items()}
        return Usage(
            gpu,
            max(0.0, self.sandbox_s - other.sandbox_s),
            max(0.0, self.sandbox_cpu_s - other.sandbox_cpu_s),
            max(0.0, self.sandbox_gib_s - other.sandbox_gib_s),
            max(0.0, self.cpu_s - other.cpu_s),
            max(0.0, self.gib_s - other.gib_s),
        )

    def usd(self, prices: PriceTable) -> float:
        """The dollars these resources cost at ``prices``."""
        return (
            sum(prices.gpu(k) * s for k, s in self.gpu_s.items())
            + prices.sandbox_cpu_core_per_s * self.sandbox_cpu_s
            + prices.sandbox_memory_gib_per_s * self.sandbox_gib_s
            + prices.cpu_core_per_s * self.cpu_s
            + prices.memory_gib_per_s * self.gib_s
        )

    def as_dict(self, prices: PriceTable) -> dict[str, Any]:
        """The figures for ``summary.json`` (GPU-seconds per kind, sandbox-seconds, dollars)."""
        return {
            "gpu_s": sum(self.gpu_s.values()),
            "gpu_s_by_kind": dict(self.gpu_s),
            "sandbox_s": self.sandbox_s,
            "sandbox_cpu_s": self.sandbox_cpu_s,
            "sandbox_gib_s": self.sandbox_gib_s,
            "orchestrator_cpu_s": self.cpu_s,
            "orchestrator_gib_s": self.gib_s,
            "usd": self.usd(prices),
        }


def sandbox_usage(runtime_metrics: Mapping[str, float]) -> Usage:
    """The sandbox part of a runtime's ``metrics()`` (cumulative since it started).

    Sandboxed runtimes report what their pool billed (``pool_sandbox_s``,
    ``pool_cpu_reserved_s``, and ``pool_memory_gib_s`` where the runtime knows its memory);
    a local Lean pool reports none of these and costs nothing here.
    """
    return Usage(
        sandbox_s=float(runtime_metrics.get("pool_sandbox_s", 0.0)),
        sandbox_cpu_s=float(runtime_metrics.get("pool_cpu_reserved_s", 0.0)),
        sandbox_gib_s=float(runtime_metrics.get("pool_memory_gib_s", 0.0)),
    )


class CostMeter:
    """Turns cumulative usage readings into per-step and run-total metrics.

    ``resume(rows)`` continues the totals of a resumed run from its last metrics row, so the
    totals cover the whole run, not just this process.
    """

    def __init__(self, prices: PriceTable) -> None:
        self.prices = prices
        self.total = Usage()
        self._last: Usage = Usage()
        """The previous cumulative reading (deltas are taken against it)."""

    def resume(self, rows: list[dict[str, Any]]) -> None:
        for row in reversed(rows):
            if "cost/total_usd" in row:
                self.total = Usage(
                    gpu_s=dict(row.get("cost/total_gpu_s_by_kind") or {}),
                    sandbox_s=float(row.get("cost/total_sandbox_s") or 0.0),
                    sandbox_cpu_s=float(row.get("cost/total_sandbox_cpu_s") or 0.0),
                    sandbox_gib_s=float(row.get("cost/total_sandbox_gib_s") or 0.0),
                    cpu_s=float(row.get("cost/total_orchestrator_cpu_s") or 0.0),
                    gib_s=float(row.get("cost/total_orchestrator_gib_s") or 0.0),
                )
                return

    def step(self, cumulative: Usage) -> dict[str, Any]:
        """The metrics of one step, given this process's cumulative usage so far."""
        delta = cumulative.minus(self._last)
        self._last = cumulative
        self.total = self.total.add(delta)
        t = self.total
        return {
            "cost/gpu_s": sum(delta.gpu_s.values()),
            "cost/sandbox_s": delta.sandbox_s,
            "cost/usd": delta.usd(self.prices),
            "cost/total_gpu_s": sum(t.gpu_s.values()),
            "cost/total_gpu_s_by_kind": dict(t.gpu_s),
            "cost/total_sandbox_s": t.sandbox_s,
            "cost/total_sandbox_cpu_s": t.sandbox_cpu_s,
            "cost/total_sandbox_gib_s": t.sandbox_gib_s,
            "cost/total_orchestrator_cpu_s": t.cpu_s,
            "cost/total_orchestrator_gib_s": t.gib_s,
            "cost/total_usd": t.usd(self.prices),
        }

    def summary(self) -> dict[str, Any]:
        """The run's totals, for ``summary.json``."""
        return self.total.as_dict(self.prices)
