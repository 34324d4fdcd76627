"""GRPO: group-relative policy optimisation of a prover on any leanrl Environment.

Each step takes a batch of tasks, samples G attempts per task through the environment (harness
→ runtime → Verdict → the taskset's reward), turns each group's rewards into advantages and
takes clipped policy-gradient steps on the model's own tokens. The objective, with its shapes,
is the docstring of :mod:`leanrl.train.grpo.trainer`, next to the loop that computes it.

Where each step lives:

- ``config.py``: :class:`GRPOConfig`, every option validated (imports no torch);
- ``trainer.py``: :class:`GRPOTrainer`, the loop top to bottom: the step's tasks, rollouts,
  advantages, skipped steps, metrics, checkpoints, in-run eval, resume;
- ``overlap.py``: rollouts cut into chunks, so chunk j+1 generates while Lean checks chunk j
  (``rollout_chunks``);
- ``streamed.py``: each group's gradient accumulated as soon as the harness reports it checked,
  the update after the last (``stream_training``);
- ``data.py``: a step's rollouts as the sequences the loss sees (shared by loop and engine);
- ``engine.py``: :class:`GRPOEngine`, everything with weights in it: the model, the reference,
  the optimizer, one optimisation step, the generation policy and its weight sync, ranks,
  checkpoint files;
- ``model_io.py``: loading and saving the model, optimizer and RNG state; device and precision;
- ``loss.py``: the maths as pure tensor functions (advantages, clipped token loss, GSPO's
  sequence ratio, CISPO, the sampler/trainer importance correction, KL, aggregation);
- ``advantages.py``: pass@k (PKPO) and unlikeliness reward transforms of a group;
- ``tiled.py``: log-probs and entropy over vocabulary tiles, never the full logits
  (``logprob_chunk``);
- ``replay.py``: failed attempts kept and replayed as revision prompts (``replay``);
- ``report.py``: which groups a step keeps, why it trained on nothing, its log line;
- ``trl_names.py``: TRL's ``GRPOConfig`` field names, read as leanrl's;
- ``cli.py``: ``leanrl train grpo``.

What it shares with the other trainers lives in :mod:`leanrl.train` (run folder and metrics,
budget, costs, LoRA, distributed ranks, vLLM weight sync, in-run eval).

Public names: :class:`GRPOConfig`, :class:`GRPOTrainer`, :func:`train_grpo`,
:func:`ends_truncated`. They are imported on first use, so importing this package is cheap
(torch loads when a run starts).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from leanrl.train.grpo.config import GRPOConfig
    from leanrl.train.grpo.data import ends_truncated
    from leanrl.train.grpo.trainer import GRPOTrainer, train_grpo

__all__ = ["GRPOConfig", "GRPOTrainer", "ends_truncated", "train_grpo"]

_LAZY = {
    "GRPOConfig": "leanrl.train.grpo.config",
    "GRPOTrainer": "leanrl.train.grpo.trainer",
    "ends_truncated": "leanrl.train.grpo.data",
    "train_grpo": "leanrl.train.grpo.trainer",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'leanrl.train.grpo' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
