"""``leanrl train grpo``: the command-line face of :class:`leanrl.train.grpo.GRPOTrainer`.

Imports nothing heavy at module level (the CLI lists every command at start-up); torch and
transformers load only once the config has been checked.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import model_validator

from leanrl.config import ConfigCommand
from leanrl.launch.cli import launched
from leanrl.train.common import print_run_summary
from leanrl.train.grpo.trainer import GRPOConfig

__all__ = ["GRPOCommand"]


class GRPOCommand(ConfigCommand, GRPOConfig):
    """Post-train a model with GRPO (group-relative policy optimisation) on an environment.

    Example: leanrl train grpo --env minif2f --model PATH_OR_ID --config
    examples/train-grpo-minif2f.toml --out runs/grpo. Rerun the same command to resume from the
    last checkpoint. The run folder holds metrics.jsonl, checkpoint-N/ (Hugging Face model
    folders) and reward_curve.png.
    """

    cli_common: ClassVar[tuple[str, ...]] = (
        "out", "steps", "tasks_per_step", "group_size", "lr", "beta", "seed", "save_every",
        "sampling.temperature", "sampling.max_tokens", "env.taskset.path",
    )  # fmt: skip
    """Options ``--help`` shows in full (the others by name; ``--help-all`` shows every one)."""

    model: str | None = None
    """Shortcut for --policy.model: a local model folder or a Hugging Face id."""
    dry_run: bool = False
    """Print the launch plan (functions, GPUs, sandboxes, batches) and an estimated cost per
    iteration, then exit without starting anything (``--dry-run``)."""
    backend: Literal["hf", "vllm"] | None = None
    """Shortcut for --policy.backend (hf: transformers on CPU/GPU, vllm: in-process vLLM on a
    GPU, weights pushed into the engine after each step)."""

    @model_validator(mode="after")
    def _divisible(self) -> GRPOCommand:
        # Cross-field checks wait for the TOML file: the flags alone are not the whole config.
        # ``to_grpo_config`` validates the merged result as a GRPOConfig.
        return self

    def to_grpo_config(self) -> GRPOConfig:
        """The GRPOConfig this command describes (TOML file < flags, shortcuts applied)."""
        return self.build_config(
            GRPOConfig,
            "GRPO config",
            {"model": ("policy", "model"), "backend": ("policy", "backend")},
            command_only=("dry_run",),
        )

    def cli_cmd(self) -> None:
        from leanrl.train.grpo.trainer import GRPOTrainer

        config = self.to_grpo_config()
        if launched("grpo", config, self.dry_run):
            return
        trainer = GRPOTrainer(config)
        trainer.check()  # a bad model path fails here, before anything is loaded
        trainer.train_sync()
        print_run_summary(trainer.run, ("reward_mean", "pass_rate"))
