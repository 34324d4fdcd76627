"""``leanrl train distill``: the command-line face of :mod:`leanrl.train.distill.run`.

Imports nothing heavy at module level (the CLI lists every command at start-up).
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import model_validator

from leanrl.config import ConfigCommand
from leanrl.train.common import print_run_summary
from leanrl.train.distill.run import DistillRunConfig

__all__ = ["DistillCommand"]


class DistillCommand(ConfigCommand, DistillRunConfig):
    """Distil teachers into a student: their verified proofs as SFT data (--mode sequence, the
    default; tokenizers may differ), or on the student's own samples scored by the teacher
    token by token (--mode on-policy).

    Example: leanrl train distill --teacher runs/grpo-cd --env countdown --student PATH_OR_ID
    --out runs/distill. One expert per environment: --env countdown --env minif2f --expert
    countdown=runs/cd --expert minif2f=runs/mf --student PATH. Rerun the same command to
    resume. The run folder is expert iteration's (sequence: proofs.jsonl, round-R/,
    checkpoint-R/) or GRPO's (on-policy).
    """

    cli_common: ClassVar[tuple[str, ...]] = (
        "mode", "teacher", "out", "rounds", "samples", "steps", "sampling.max_tokens",
        "on_policy.coef", "on_policy.rl", "env.taskset.path",
    )  # fmt: skip
    """Options ``--help`` shows in full (the others by name; ``--help-all`` shows every one)."""

    student: str | None = None
    """The model distilled into (a local folder or a Hugging Face id): --policy.model."""
    model: str | None = None
    """Shortcut for --policy.model (the student), as in the other trainers."""
    expert: dict[str, str] | None = None
    """One teacher per environment, ``--expert countdown=runs/cd`` (repeatable): --experts."""

    @model_validator(mode="after")
    def _teachers(self) -> DistillCommand:
        # Cross-field checks wait for the TOML file and the shortcuts (--expert, --student):
        # ``to_config`` validates the merged result as a DistillRunConfig.
        return self

    def to_config(self) -> DistillRunConfig:
        """The DistillRunConfig this command describes (TOML file < flags, shortcuts)."""
        return self.build_config(
            DistillRunConfig,
            "distill config",
            {"model": ("policy", "model"), "student": ("policy", "model"), "expert": ("experts",)},
        )

    def cli_cmd(self) -> None:
        from leanrl.train.distill.run import train_distill

        config = self.to_config()
        trainer, _ = train_distill(config)
        keys = ("reward_mean", "distill/reverse_kl") if config.mode == "on-policy" else (
            "solved_total", "new_proofs", "sft_loss_last"
        )  # fmt: skip
        print_run_summary(trainer.run, keys)
