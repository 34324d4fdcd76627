"""Trainers: GRPO and evolution strategies, on any leanrl Environment, sharing one run folder.

``GRPOTrainer`` and ``ESTrainer`` take the same inputs (an Environment config, a model, a run
folder) and write the same run folder, so one can be swapped for the other. They are imported on
first use, so ``import leanrl.train`` stays light until a trainer is needed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from leanrl.train.common import MetricsLogger, RunDir, TrainConfig, batch_for_step

if TYPE_CHECKING:
    from leanrl.train.es import ESConfig, ESTrainer
    from leanrl.train.grpo import GRPOConfig, GRPOTrainer

__all__ = [
    "ESConfig",
    "ESTrainer",
    "GRPOConfig",
    "GRPOTrainer",
    "MetricsLogger",
    "RunDir",
    "TrainConfig",
    "batch_for_step",
]

_LAZY = {
    "ESConfig": "leanrl.train.es",
    "ESTrainer": "leanrl.train.es",
    "GRPOConfig": "leanrl.train.grpo",
    "GRPOTrainer": "leanrl.train.grpo",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'leanrl.train' has no attribute {name!r}")
