"""Supervised fine-tuning on verified proofs, and expert iteration built on it.

:class:`SFTTrainer` turns (statement, proof) pairs into examples in the environment's own
prompt layout, with loss on the answer's tokens only, and trains with ``transformers.Trainer``.
:class:`ExpertIteration` runs rounds of sample → verify (the environment keeps what Lean
accepts) → SFT on the new verified proofs → eval.

Where each step lives:

- ``data.py``: where pairs come from (``proofs.jsonl`` files, a dataset's proof column) and how
  they become token ids in the harness's prompt format (:class:`~leanrl.proofs.Pair` is the
  pair itself);
- ``trainer.py``: :class:`SFTConfig` and :class:`SFTTrainer`: the model, the loss on the
  answer, the Trainer, checkpoints, in-run eval, resume;
- ``expert_iteration.py``: :class:`ExpertIterationConfig` and :class:`ExpertIteration`: the
  rounds, each phase resumable;
- ``cli.py`` and ``expert_iteration_cli.py``: ``leanrl train sft`` and
  ``leanrl train expert-iteration``.

What it shares with the other trainers lives in :mod:`leanrl.train` (run folder and metrics,
LoRA, in-run eval).

Public names: :class:`SFTConfig`, :class:`SFTOptions`, :class:`SFTTrainer`, :func:`train_sft`,
:func:`answer_loss`, :func:`device_and_precision`, :func:`load_model`,
:class:`ExpertIteration`, :class:`ExpertIterationConfig`. They are imported on first use, so
importing this package is cheap (torch loads when a run starts).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from leanrl.train.sft.expert_iteration import ExpertIteration, ExpertIterationConfig
    from leanrl.train.sft.trainer import (
        SFTConfig,
        SFTOptions,
        SFTTrainer,
        answer_loss,
        device_and_precision,
        load_model,
        train_sft,
    )

__all__ = [
    "ExpertIteration",
    "ExpertIterationConfig",
    "SFTConfig",
    "SFTOptions",
    "SFTTrainer",
    "answer_loss",
    "device_and_precision",
    "load_model",
    "train_sft",
]

_LAZY = {
    "ExpertIteration": "leanrl.train.sft.expert_iteration",
    "ExpertIterationConfig": "leanrl.train.sft.expert_iteration",
    "SFTConfig": "leanrl.train.sft.trainer",
    "SFTOptions": "leanrl.train.sft.trainer",
    "SFTTrainer": "leanrl.train.sft.trainer",
    "answer_loss": "leanrl.train.sft.trainer",
    "device_and_precision": "leanrl.train.sft.trainer",
    "load_model": "leanrl.train.sft.trainer",
    "train_sft": "leanrl.train.sft.trainer",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'leanrl.train.sft' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
