"""Distillation: a student learns from teachers, on its own samples or on theirs.

Two ways, and a run over several environments for each:

- **On-policy** (in a GRPO run: ``leanrl train grpo --distill.teacher MODEL``): the student
  samples, a teacher scores every sampled model token, and the per-token reverse KL joins the
  advantage (``--distill.only``: it is the whole advantage). The objective is step 3 of
  :mod:`leanrl.train.grpo.trainer`'s docstring.
- **Sequence-level** (``leanrl train distill --teacher MODEL --env ENV``): the teacher samples,
  leanrl verifies, and the verified proofs are the student's SFT data (expert iteration's
  machinery, with the teacher sampling); tokenizers may differ.
- **Experts merged** (``leanrl train distill --expert A=runs/a --expert B=runs/b --student M``):
  each environment's tasks are distilled from its own expert into one student, either way.

Where each step lives:

- ``config.py``: :class:`DistillConfig`, the ``distill`` section of a GRPO run (imports no torch);
- ``teacher.py``: teachers resolved (folder, hub id, run folder, server), their revisions, the
  tokenizer check, and their log-probs (in-process through the tiled head, or a server's
  prompt log-probs);
- ``objective.py``: the per-token distillation term of the advantage (pure functions);
- ``onpolicy.py``: what the GRPO trainer calls (prepare before loading, score each step);
- ``sequence.py``: sequence-level distillation (:class:`SequenceDistill`, expert iteration with
  teachers sampling);
- ``run.py`` and ``cli.py``: ``leanrl train distill`` (:class:`DistillRunConfig`, both ways).

A run over several environments (``envs``) is :mod:`leanrl.train.multienv`'s.

Public names: :class:`DistillConfig`, :class:`DistillRunConfig`, :class:`SequenceDistill`,
:func:`train_distill`. They are imported on first use (torch loads when a run starts).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from leanrl.train.distill.config import DistillConfig
    from leanrl.train.distill.run import DistillRunConfig, train_distill
    from leanrl.train.distill.sequence import SequenceDistill

__all__ = ["DistillConfig", "DistillRunConfig", "SequenceDistill", "train_distill"]

_LAZY = {
    "DistillConfig": "leanrl.train.distill.config",
    "DistillRunConfig": "leanrl.train.distill.run",
    "SequenceDistill": "leanrl.train.distill.sequence",
    "train_distill": "leanrl.train.distill.run",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'leanrl.train.distill' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
