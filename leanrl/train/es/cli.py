"""``leanrl train es``: the command-line face of :class:`leanrl.train.es.ESTrainer`.

Imports nothing heavy at module level (the CLI lists every command at start-up); torch and
transformers load only once the config has been checked.
"""

from __future__ import annotations

from typing import ClassVar

from leanrl.config import ConfigCommand
from leanrl.launch.cli import launched
from leanrl.train.common import check_model_path, print_run_summary
from leanrl.train.es.config import ESConfig

__all__ = ["ESCommand"]


class ESCommand(ConfigCommand, ESConfig):
    """Post-train a model with evolution strategies (ES) on an environment.

    Example: leanrl train es --env minif2f --model PATH_OR_ID --config
    examples/train-es-minif2f.toml --out runs/es. Defaults follow Qiu et al. 2025 (population
    30, sigma 1e-3, alpha sigma/2, greedy decoding). Rerun the same command to resume: the run
    continues from its history (written every iteration) and last checkpoint, losing nothing.
    The run folder holds es_history.bin, metrics.jsonl, checkpoint-N/ (Hugging Face model
    folders) and reward_curve.png.
    """

    cli_common: ClassVar[tuple[str, ...]] = (
        "out", "steps", "tasks_per_step", "population", "sigma", "lr", "seed", "save_every",
        "sampling.temperature", "sampling.max_tokens", "env.taskset.path",
    )  # fmt: skip
    """Options ``--help`` shows in full (the others by name; ``--help-all`` shows every one)."""

    model: str | None = None
    """Shortcut for --policy.model: a local model folder or a Hugging Face id."""
    dry_run: bool = False
    """Print the launch plan (functions, GPUs, sandboxes, batches) and an estimated cost per
    iteration, then exit without starting anything (``--dry-run``)."""

    def to_es_config(self) -> ESConfig:
        """The ESConfig this command describes (TOML file < flags, ``--model`` applied)."""
        config = self.build_config(
            ESConfig, "ES config", {"model": ("policy", "model")}, command_only=("dry_run",)
        )
        # Folders now; a hub id where the model loads (here, or in a launched container).
        check_model_path(config.policy.model, hub=False)
        return config

    def cli_cmd(self) -> None:
        from leanrl.train.es.trainer import ESTrainer

        config = self.to_es_config()
        if launched("es", config, self.dry_run):
            return
        trainer = ESTrainer(config)
        trainer.train_sync()
        print_run_summary(trainer.run, ("reward_mean", "pass_rate", "skipped"))
