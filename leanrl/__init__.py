"""leanrl: evaluate and post-train language models that write Lean 4 proofs.

An :class:`Environment` is a :class:`Taskset` (theorems and reward), a :class:`Harness` (how the
model works on a task) and a :class:`Runtime` (where Lean runs). The eval runner and the
trainers consume it::

    import leanrl
    env = leanrl.load_environment("minif2f", split="test", limit=20, path="minif2f.jsonl")
    tasks = env.tasks()

Everything public is listed in ``__all__``; modules starting with ``_`` are private.
"""

from __future__ import annotations

import warnings
from importlib.metadata import version

from leanrl._dist import foreign_distribution
from leanrl.environment import Environment, EnvironmentConfig, load_environment
from leanrl.errors import (
    ConfigError,
    DatasetError,
    LeanNotFoundError,
    LeanrlError,
    PolicyError,
    RuntimeUnavailable,
)
from leanrl.harness import Harness, HarnessConfig
from leanrl.policy import Completion, Policy, PolicyConfig, Prompt, SamplingConfig
from leanrl.rollout import ChatMessage, Rollout, Turn
from leanrl.runtime import Runtime, RuntimeConfig, TacticSession, TacticState
from leanrl.task import Task
from leanrl.taskset import ColumnMap, Taskset, TasksetConfig
from leanrl.verdict import Attempt, Message, Reason, Verdict, VerificationPolicy

if foreign_distribution() is None:
    __version__ = version("leanrl")
else:  # a source tree that was never installed, or the unrelated PyPI package of the same name
    __version__ = "0.0.0+unknown"
    warnings.warn(f"leanrl: {foreign_distribution()}", stacklevel=2)

__all__ = [
    "Attempt",
    "ChatMessage",
    "ColumnMap",
    "Completion",
    "ConfigError",
    "DatasetError",
    "Environment",
    "EnvironmentConfig",
    "Harness",
    "HarnessConfig",
    "LeanNotFoundError",
    "LeanrlError",
    "Message",
    "Policy",
    "PolicyConfig",
    "PolicyError",
    "Prompt",
    "Reason",
    "Rollout",
    "Runtime",
    "RuntimeConfig",
    "RuntimeUnavailable",
    "SamplingConfig",
    "TacticSession",
    "TacticState",
    "Task",
    "Taskset",
    "TasksetConfig",
    "Turn",
    "Verdict",
    "VerificationPolicy",
    "__version__",
    "load_environment",
]

# The trainers live in leanrl.train (imported on first use: they pull in torch). TRL users write
# `from leanrl import GRPOConfig`; that works too.
_TRAIN = (
    "GRPOConfig", "GRPOTrainer", "ESConfig", "ESTrainer", "SFTConfig", "SFTTrainer",
    "ExpertIteration", "ExpertIterationConfig",
)  # fmt: skip


# TRL's other trainers: `from leanrl import SFTTrainer` says what leanrl has instead of
# Python's bare "cannot import name".
_TRL_ONLY = ("DPOConfig", "DPOTrainer", "PPOConfig", "PPOTrainer", "RLOOConfig", "RLOOTrainer",
             "KTOConfig", "KTOTrainer", "ORPOConfig", "ORPOTrainer", "RewardConfig",
             "RewardTrainer")  # fmt: skip


def __getattr__(name: str) -> object:
    if name in _TRAIN:
        import leanrl.train

        return getattr(leanrl.train, name)
    if name in _TRL_ONLY:
        # An ImportError (not AttributeError, which `from ... import` would replace by its own
        # message): this name is only ever asked for by code written for TRL.
        raise ImportError(
            f"{name} is TRL's; leanrl trains with GRPOConfig/GRPOTrainer, ESConfig/ESTrainer, "
            "SFTConfig/SFTTrainer and ExpertIteration (`from leanrl import GRPOConfig, "
            "GRPOTrainer`); its GRPOConfig accepts TRL's field names where they mean the same"
        )
    import difflib

    close = difflib.get_close_matches(name, [*__all__, *_TRAIN], n=1)
    hint = f" Did you mean leanrl.{close[0]}?" if close else ""
    raise AttributeError(f"module 'leanrl' has no attribute {name!r}.{hint}")
