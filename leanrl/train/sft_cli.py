"""``leanrl train sft``: the command-line face of :class:`leanrl.train.sft.SFTTrainer`.

Imports nothing heavy at module level (the CLI lists every command at start-up).
"""

from __future__ import annotations

from typing import Any

from leanrl.config import ConfigCommand, validate
from leanrl.train.common import print_run_summary
from leanrl.train.sft import SFTConfig

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
        cmd = self.resolved()
        data: dict[str, Any] = cmd.model_dump(exclude_unset=True)
        for key in ("config", "model"):
            data.pop(key, None)
        if cmd.model is not None:
            data.setdefault("policy", {})["model"] = cmd.model
        return validate(SFTConfig, data, "SFT config")

    def cli_cmd(self) -> None:
        from leanrl.train.sft import SFTTrainer

        trainer = SFTTrainer(self.to_sft_config())
        trainer.check()  # a bad model path fails here, before anything is loaded
        trainer.train_sync()
        print_run_summary(trainer.run, ("loss", "tokens_per_s"))
