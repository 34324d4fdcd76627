"""Trainers: GRPO, evolution strategies, SFT and expert iteration, on any leanrl Environment,
sharing one run folder.

One package per trainer, and here only what they share:

- :mod:`leanrl.train.grpo`: GRPO (``GRPOConfig``, ``GRPOTrainer``);
- :mod:`leanrl.train.es`: evolution strategies (``ESConfig``, ``ESTrainer``);
- :mod:`leanrl.train.sft`: SFT on verified proofs and expert iteration (``SFTConfig``,
  ``SFTTrainer``, ``ExpertIterationConfig``, ``ExpertIteration``);
- :mod:`leanrl.train.distill`: distillation from teachers, on-policy (GRPO's ``distill``
  section) and sequence-level (``leanrl train distill``);
- shared: ``common.py`` (config base, data order, the run folder, metrics), ``budget.py`` and
  ``run_costs.py`` (spend limits, what a run cost), ``infra.py`` (attempts lost to the
  infrastructure), ``lora.py``, ``distributed.py`` (ranks), ``hf_policy.py`` (a policy over the
  model being trained), ``prompt_ids.py`` (a prompt's token ids, as ``leanrl eval`` makes
  them), ``vllm_sync.py`` and ``vllm_server.py`` (trained weights into vLLM), ``inrun_eval.py``
  and ``inrun_eval_config.py`` (held-out pass@k during a run), ``curriculum.py``
  (difficulty-aware task sampling: the per-task table and its samplers), ``multienv.py`` and
  ``multienv_config.py`` (several environments in one run, drawn by weight).

``GRPOTrainer``, ``ESTrainer`` and ``SFTTrainer`` take the same inputs (an Environment config, a
model, a run folder) and write the same run folder; ``ExpertIteration`` runs rounds of sampling
and SFT. They are imported on first use, so ``import leanrl.train`` stays light until a trainer
is needed. The old flat module names (``leanrl.train.es_history``, ``leanrl.train.sft_data``, ...)
that the docs once named still import, re-exporting the new modules.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from leanrl.train.common import MetricsLogger, RunDir, TrainConfig, batch_for_step

if TYPE_CHECKING:
    from leanrl.train.es import ESConfig, ESTrainer
    from leanrl.train.grpo import GRPOConfig, GRPOTrainer
    from leanrl.train.sft import SFTConfig, SFTTrainer
    from leanrl.train.sft.expert_iteration import ExpertIteration, ExpertIterationConfig

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
    "ExpertIteration": "leanrl.train.sft.expert_iteration",
    "ExpertIterationConfig": "leanrl.train.sft.expert_iteration",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'leanrl.train' has no attribute {name!r}")
