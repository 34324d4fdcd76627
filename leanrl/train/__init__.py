"""Trainers: GRPO, evolution strategies, SFT and expert iteration, on any leanrl Environment,
sharing one run folder.

``GRPOTrainer``, ``ESTrainer`` and ``SFTTrainer`` take the same inputs (an Environment config, a
model, a run folder) and write the same run folder; ``ExpertIteration`` runs rounds of sampling
and SFT. They are imported on first use, so ``import leanrl.train`` stays light until a trainer
is needed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from leanrl.train.common import MetricsLogger, RunDir, TrainConfig, batch_for_step

if TYPE_CHECKING:
    from leanrl.train.es import ESConfig, ESTrainer
    from leanrl.train.expert_iteration import ExpertIteration, ExpertIterationConfig
    from leanrl.train.grpo import GRPOConfig, GRPOTrainer
    from leanrl.train.sft import SFTConfig, SFTTrainer

__all__ = [
    "ESConfig",
    "ESTrainer",
    "ExpertIteration",
    "ExpertIterationConfig",
    "GRPOConfig",
    "GRPOTrainer",
    "MetricsLogger",
    "RunDir",
    "SFTConfig",
    "SFTTrainer",
    "TrainConfig",
    "batch_for_step",
]

_LAZY = {
    "ESConfig": "leanrl.train.es",
    "ESTrainer": "leanrl.train.es",
    "GRPOConfig": "leanrl.train.grpo",
    "GRPOTrainer": "leanrl.train.grpo",
    "SFTConfig": "leanrl.train.sft",
    "SFTTrainer": "leanrl.train.sft",
    "ExpertIteration": "leanrl.train.expert_iteration",
    "ExpertIterationConfig": "leanrl.train.expert_iteration",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'leanrl.train' has no attribute {name!r}")
