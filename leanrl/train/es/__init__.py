"""Evolution strategies (ES): post-training a prover with no gradient, on any leanrl Environment.

Each iteration draws a population of seeded perturbations of the weights, scores every member
(its mean reward on a batch of tasks, through the environment: harness → runtime → Verdict →
reward), and moves the fp32 master weights along the noise, weighted by the shaped scores. The
run's state is the base model plus a history of per-iteration coefficients, so any iteration's
weights can be rebuilt anywhere (``replay``). The update rule is the docstring of
:mod:`leanrl.train.es.trainer`.

Where each step lives:

- ``trainer.py``: :class:`ESConfig` and :class:`ESTrainer`, the loop top to bottom: seeds,
  scoring, reward shaping, the update, the history record, checkpoints, in-run eval, resume;
- ``weights.py``: :class:`~leanrl.train.es.weights.ESWeights`, seeded per-tensor noise, exact
  perturb/restore and the fp32 update;
- ``lowrank.py``: low-rank perturbations (``perturbation = "lowrank"``, EGGROLL): per-matrix
  factors A·Bᵀ/√r drawn per (seed, tensor name), and
  :class:`~leanrl.train.es.lowrank.LowRankWeights`, the same three rules for them;
- ``history.py``: the history file (:class:`~leanrl.train.es.history.ESHistory`), the weights
  a worker starts from and :func:`~leanrl.train.es.history.replay`;
- ``workers.py``: the :class:`~leanrl.train.es.workers.MemberScorer` interface and its
  backends (in-process, local processes, vLLM);
- ``pipeline.py``: member i+1 generates while member i's attempts are in Lean (one engine);
- ``fanout.py``: a population fanned out over distributed ranks, and
  :class:`~leanrl.train.es.fanout.ScorerBase` for new scorers;
- ``policy.py``: the in-process Policy over the model ES perturbs in place;
- ``cli.py``: ``leanrl train es``.

What it shares with the other trainers lives in :mod:`leanrl.train` (run folder and metrics,
budget, costs, LoRA, distributed ranks, in-run eval); the Modal fan-out is
:mod:`leanrl.launch.es_map`.

Public names: :class:`ESConfig`, :class:`ESScorerConfig`, :class:`ESTrainer`,
:func:`es_coefficients`, :func:`shape_rewards`. They are imported on first use, so importing this
package is cheap (torch loads when a run starts).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from leanrl.train.es.trainer import (
        ESConfig,
        ESScorerConfig,
        ESTrainer,
        es_coefficients,
        shape_rewards,
    )

__all__ = ["ESConfig", "ESScorerConfig", "ESTrainer", "es_coefficients", "shape_rewards"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("leanrl.train.es.trainer"), name)
    raise AttributeError(f"module 'leanrl.train.es' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
