"""``leanrl train distill``: one command for both ways of distilling, from one teacher or from
one expert per environment.

- ``mode = "sequence"`` (the default): :class:`~leanrl.train.distill.sequence.SequenceDistill`,
  the teachers' verified proofs as the student's SFT data.
- ``mode = "on-policy"``: a GRPO run of the student with its ``distill`` section set from this
  config (:meth:`DistillRunConfig.to_grpo`): the reverse KL to each task's teacher alone, or
  added to the verifier's group advantage with ``on_policy.rl``. Every other GRPO option is
  ``leanrl train grpo --distill.teacher ...``'s to set.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from leanrl.train.distill.config import DistillConfig
from leanrl.train.distill.sequence import SequenceDistill, SequenceDistillConfig

__all__ = ["DistillRunConfig", "OnPolicyOptions", "train_distill"]


class OnPolicyOptions(BaseModel):
    """The GRPO options of ``mode = "on-policy"`` (the rest keep GRPO's defaults)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    group_size: int = Field(default=4, ge=2)
    """Samples per task per step."""
    lr: float = Field(default=1e-5, gt=0.0)
    """AdamW learning rate (the tinker cookbook distils with 5e-5 for full fine-tuning)."""
    coef: float = Field(default=1.0, ge=0.0)
    """λ, the weight of the per-token reverse KL (``distill.coef``)."""
    rl: bool = False
    """Add the verifier's group advantage (GRPO + distillation); off: the reverse KL alone
    (``distill.only``)."""
    micro_batch_size: int = Field(default=4, ge=1)
    """Sequences per forward/backward of the student."""
    logprob_chunk: int | None = Field(default=None, ge=1)
    """The student's loss through vocabulary tiles of this many tokens (GRPO's
    ``logprob_chunk``; unset: full logits)."""
    temperature: float = Field(default=1.0, gt=0.0)
    """The teacher's softmax temperature (``distill.temperature``)."""


class DistillRunConfig(SequenceDistillConfig):
    """``leanrl train distill``: sequence-level or on-policy distillation of ``policy.model``
    (the student) from ``teacher`` or one expert per environment."""

    mode: Literal["sequence", "on-policy"] = "sequence"
    """``sequence``: the teachers sample, leanrl verifies, the student is fine-tuned on the
    verified proofs (tokenizers may differ). ``on-policy``: the student samples and each task's
    teacher scores every sampled token (GRPO with ``distill``; tokenizers must be one)."""
    on_policy: OnPolicyOptions = Field(default_factory=OnPolicyOptions)
    """``mode = "on-policy"``: group size, learning rate, λ, and whether the verifier's reward
    joins in."""
    steps: int = Field(default=100, ge=1)
    """``mode = "on-policy"``: optimisation steps (``sequence`` runs ``rounds``)."""
    tasks_per_step: int = Field(default=8, ge=1)
    """``mode = "on-policy"``: tasks per step (drawn by weight in a mixed run)."""
    save_every: int = Field(default=10, ge=1)
    """``mode = "on-policy"``: a checkpoint every this many steps (and at the end)."""

    @field_validator("experts", mode="before")
    @classmethod
    def _expert_specs(cls, v: Any) -> Any:
        # `--expert countdown=runs/cd` given as strings (Python lists, a TOML array)
        if isinstance(v, str):
            v = [v]
        if isinstance(v, list):
            out = {}
            for spec in v:
                env, sep, teacher = str(spec).partition("=")
                if not sep or not env.strip() or not teacher.strip():
                    raise ValueError(f"expert {spec!r}: expected ENV=MODEL, e.g. countdown=runs/cd")
                out[env.strip()] = teacher.strip()
            return out
        return v

    def to_grpo(self) -> Any:
        """The GRPO config of ``mode = "on-policy"``."""
        from leanrl.train.grpo.config import GRPOConfig

        o = self.on_policy
        return GRPOConfig.model_validate(
            {
                "env": self.env,
                "envs": list(self.envs),
                "policy": self.policy,
                "sampling": self.sampling,
                "out": self.out,
                "steps": self.steps,
                "tasks_per_step": self.tasks_per_step,
                "seed": self.seed,
                "save_every": self.save_every,
                "keep_checkpoints": self.keep_checkpoints,
                "log_to": self.log_to,
                "run_name": self.run_name,
                "eval": self.eval,
                "budget": self.budget,
                "launcher": self.launcher,
                "group_size": o.group_size,
                "lr": o.lr,
                "micro_batch_size": o.micro_batch_size,
                "logprob_chunk": o.logprob_chunk,
                "distill": DistillConfig(
                    teacher=self.teacher,
                    experts=self.experts,
                    coef=o.coef,
                    only=not o.rl,
                    temperature=o.temperature,
                    revisions=self.revisions,
                    server_model=self.server_model,
                ),
            }
        )


def train_distill(config: DistillRunConfig, env: Any = None) -> tuple[Any, list[dict[str, Any]]]:
    """Run ``config`` (blocking): ``(trainer, metrics rows of this call)``; the trainer's
    ``run`` is the run folder."""
    if config.mode == "on-policy":
        from leanrl.train.grpo.trainer import GRPOTrainer

        grpo = GRPOTrainer(config.to_grpo(), env)
        return grpo, grpo.train_sync()
    seq = SequenceDistill(config, env)
    return seq, seq.train_sync()
