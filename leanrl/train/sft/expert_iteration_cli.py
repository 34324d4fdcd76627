"""``leanrl train expert-iteration``: the command-line face of
:class:`leanrl.train.sft.expert_iteration.ExpertIteration`.

Imports nothing heavy at module level (the CLI lists every command at start-up).
"""

from __future__ import annotations

from typing import Literal

from leanrl.config import ConfigCommand
from leanrl.train.common import print_run_summary
from leanrl.train.sft.expert_iteration import ExpertIterationConfig

__all__ = ["ExpertIterationCommand"]


class ExpertIterationCommand(ConfigCommand, ExpertIterationConfig):
    """Expert iteration: rounds of sampling the training theorems, keeping the proofs Lean
    verifies, fine-tuning on them, and evaluating.

    Example: leanrl train expert-iteration --env goedel-pset --env.taskset.limit 2000 --model
    PATH_OR_ID --rounds 4 --samples 16 --eval.every 1 --eval.env.id minif2f --out runs/ei.
    Rerun the same command to resume after the last finished round. The run folder holds
    proofs.jsonl (every verified proof), metrics.jsonl (one row per round: solved_total,
    solved_new, ...), checkpoint-R/ per round, round-R/ (the round's samples and SFT) and
    solved.png. Needs accelerate (the ``sft`` extra).
    """

    model: str | None = None
    """Shortcut for --policy.model: a local model folder or a Hugging Face id."""
    backend: Literal["hf", "vllm"] | None = None
    """Shortcut for --policy.backend (sampling: hf or vllm; SFT always trains with hf)."""

    def to_config(self) -> ExpertIterationConfig:
        """The ExpertIterationConfig this command describes (TOML file < flags, shortcuts)."""
        return self.build_config(
            ExpertIterationConfig,
            "expert-iteration config",
            {"model": ("policy", "model"), "backend": ("policy", "backend")},
        )

    def cli_cmd(self) -> None:
        from leanrl.train.sft.expert_iteration import ExpertIteration

        ei = ExpertIteration(self.to_config())
        ei.check()
        ei.train_sync()
        print_run_summary(ei.run, ("solved_total", "solved_new", "new_proofs"))
