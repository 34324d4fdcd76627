"""``leanrl train sft``: the command-line face of :class:`leanrl.train.sft.SFTTrainer`.

Imports nothing heavy at module level (the CLI lists every command at start-up).
"""

from __future__ import annotations

from leanrl.config import ConfigCommand
from leanrl.train.common import print_run_summary
from leanrl.train.sft.trainer import SFTConfig

__all__ = ["SFTCommand"]


class SFTCommand(ConfigCommand, SFTConfig):
    """Supervised fine-tuning on verified proofs (loss on the proof only), in a harness prompt
    format, on transformers' Trainer.

    Example: leanrl train sft --model PATH_OR_ID --data.proofs runs/eval/proofs.jsonl
    --env.harness.prompt_format deepseek --out runs/sft. A dataset with proofs works too:
    --env deepseek-prover-v1 --data.from_env. Rerun the same command to resume from the last
    checkpoint. The run folder holds metrics.jsonl, checkpoint-N/ (Hugging Face model folders)
    and loss_curve.png. Needs accelerate (the ``sft`` extra).
    """

    model: str | None = None
    """Shortcut for --policy.model: a local model folder or a Hugging Face id."""

    def to_sft_config(self) -> SFTConfig:
        """The SFTConfig this command describes (TOML file < flags, ``--model`` applied)."""
        return self.build_config(SFTConfig, "SFT config", {"model": ("policy", "model")})

    def cli_cmd(self) -> None:
        from leanrl.train.sft.trainer import SFTTrainer

        trainer = SFTTrainer(self.to_sft_config())
        trainer.check()  # a bad model path fails here, before anything is loaded
        trainer.train_sync()
        print_run_summary(trainer.run, ("loss", "tokens_per_s"))
