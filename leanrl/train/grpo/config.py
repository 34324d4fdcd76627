"""The GRPO configuration: every option of :class:`leanrl.train.grpo.GRPOTrainer`, validated.

Kept apart from the trainer so that the CLI (which lists every command at start-up) and the torch
side (:mod:`leanrl.train.grpo.engine`) can import it without importing each other; importing it
does not import torch. The objective the options configure is in
:mod:`leanrl.train.grpo.trainer`.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from leanrl.policy import SamplingConfig
from leanrl.train.common import TrainConfig
from leanrl.train.distributed import DistributedConfig
from leanrl.train.grpo.trl_names import TRL_DIFFERENT, TRL_SAME, translate_trl
from leanrl.train.lora import LoRAConfig
from leanrl.train.vllm_server import VLLMServerConfig

__all__ = ["GRPOConfig", "LossAgg", "RewardScale"]

# The same literals as leanrl.train.grpo.loss's, spelled out here so that importing the config (the
# CLI does, at start-up) does not import torch.
LossAgg = Literal["grpo", "dr_grpo", "dapo"]
RewardScale = Literal["group", "batch", "none"]


class GRPOSamplingConfig(SamplingConfig):
    """Sampling for GRPO rollouts: SamplingConfig with DAPO's defaults (temperature 1.0, top-p
    1.0), which stay in force for the fields a run does not set (``--sampling.max-tokens 512``
    keeps top-p 1.0)."""

    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass; 1.0 (the default here) samples from the whole distribution, which
    the importance ratio assumes (DAPO, Yu et al. 2025)."""


class GRPOConfig(TrainConfig):
    """GRPO options. Defaults follow the papers each field cites. TRL's ``GRPOConfig`` names
    are accepted where they mean the same (``learning_rate``, ``num_generations``, ...; see
    ``leanrl.train.grpo.trl_names``)."""

    foreign_names: ClassVar[dict[str, str]] = {
        **{k: f"--{v.replace('_', '-')}" for k, v in TRL_SAME.items()},
        **TRL_DIFFERENT,
    }
    """TRL names and what leanrl calls them (the CLI's "did you mean" reads this)."""

    @model_validator(mode="before")
    @classmethod
    def _trl_names(cls, data: Any) -> Any:
        return translate_trl(data)

    @field_validator("sampling", mode="before")
    @classmethod
    def _plain_sampling(cls, v: Any) -> Any:
        # A SamplingConfig given in Python: the fields it sets, GRPO's defaults for the rest.
        return GRPOSamplingConfig.given_fields(v)

    sampling: GRPOSamplingConfig = Field(default_factory=GRPOSamplingConfig)
    """Sampling during training (``n`` is ignored: ``group_size`` is used). Default temperature
    1.0 and top-p 1.0 as in DAPO (Yu et al. 2025): the importance ratio needs the true sampling
    distribution, which top-p would change."""
    group_size: int = 16
    """G, completions per task; advantages are relative to the group. GRPO (DeepSeekMath, Shao et
    al. 2024) uses 64; the default 16 is DAPO's (Yu et al. 2025). At least 2."""
    loss_agg: LossAgg = "dapo"
    """How token losses become one number. ``dapo``: one mean over all loss tokens of the
    mini-batch (DAPO, Yu et al. 2025; the default: long sequences are not down-weighted).
    ``grpo``: mean per sequence, then mean over sequences (DeepSeekMath). ``dr_grpo``: sum over
    tokens divided by a constant ``norm_len`` per sequence (Dr. GRPO, Liu et al. 2025)."""
    scale_rewards: RewardScale | None = None
    """Divide advantages by the group's reward std (``group``, DeepSeekMath), by the std of every
    reward sampled this step (``batch``: all groups, before dynamic sampling drops any), or not at
    all (``none``, Dr. GRPO: std scaling over-weights easy and hard tasks). Default (unset):
    per the loss, ``none`` for ``loss_agg = "dr_grpo"`` (Liu et al. 2025 remove both biases
    together) and ``group`` otherwise."""
    eps_low: float = Field(default=0.2, ge=0.0, lt=1.0)
    """Lower clip bound: ρ is clipped at 1 - eps_low (PPO's 0.2, Schulman et al. 2017)."""
    eps_high: float = Field(default=0.28, ge=0.0)
    """Upper clip bound: ρ is clipped at 1 + eps_high. 0.28 is DAPO's clip-higher, which keeps
    low-probability tokens able to grow (against entropy collapse)."""
    beta: float = Field(default=0.0, ge=0.0)
    """Weight of the k3 KL penalty to the frozen starting model. 0 (no reference model loaded)
    as in DAPO and Dr. GRPO; DeepSeekMath used 0.04."""
    dynamic_sampling: Literal["off", "drop", "refill"] = "refill"
    """Groups whose rewards are all equal have zero advantage. ``refill`` (the default, DAPO's
    dynamic sampling, Yu et al. 2025): leave them out and sample extra groups until the batch has
    ``tasks_per_step`` informative ones, for at most ``max_refill_rounds`` extra rounds (DAPO
    samples until full; the bound keeps a step's cost finite when nearly every task is solved
    or hopeless). ``drop``: only leave them out (they would dilute the ``dapo``/``grpo``
    denominators). ``off``: keep them."""
    max_refill_rounds: int = Field(default=3, ge=1)
    """``refill``: most extra rounds of ``tasks_per_step`` new groups per step (the step then
    trains on the informative groups it has, fewer than ``tasks_per_step`` if need be)."""
    mask_truncated: bool = True
    """Give no loss to rollouts cut off by the token limit (DAPO's overlong filtering): a
    truncated proof is unfinished, not wrong."""
    ppo_epochs: int = Field(default=1, ge=1)
    """Optimisation passes over each batch of rollouts (μ in DeepSeekMath, which uses 1). Passes
    after the first see ρ ≠ 1 and are kept in the trust region by the clip."""
    minibatches: int = Field(default=1, ge=1)
    """Optimizer steps per pass: the batch is shuffled and cut into this many mini-batches
    (DAPO: 16 updates per rollout batch). ``tasks_per_step × group_size`` must divide by it."""
    micro_batch_size: int = Field(default=4, ge=1)
    """Sequences per forward/backward; gradients of micro-batches accumulate (bounds memory,
    does not change the result)."""
    lr: float = Field(default=1e-6, gt=0.0)
    """AdamW learning rate (1e-6 in DeepSeekMath and DAPO)."""
    weight_decay: float = Field(default=0.1, ge=0.0)
    """AdamW weight decay (0.1 in DAPO)."""
    adam_betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas (PyTorch's defaults, Loshchilov & Hutter 2019)."""
    max_grad_norm: float = Field(default=1.0, gt=0.0)
    """Clip the global gradient norm at this value (1.0 in DAPO)."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Learning rate after warm-up: ``constant`` (DAPO), or decayed to 0 at ``steps``
    (``linear``/``cosine``)."""
    warmup_steps: int = Field(default=0, ge=0)
    """Linear warm-up over this many trainer steps (DAPO warms up over 20)."""
    norm_len: int | None = Field(default=None, ge=1)
    """``dr_grpo``: the constant length each sequence's token sum is divided by. Default:
    ``sampling.max_tokens`` times the most turns of an attempt (``env.harness.max_turns`` for
    ``tactic-loop``, ``max_revisions + 1`` for ``self-correction``)."""
    disable_dropout: bool = True
    """Turn off every dropout of the model for the loss forward (as TRL's ``disable_dropout``).
    The sampler draws with dropout off (eval mode); a training forward with dropout on would
    see a different, random policy, so ρ ≠ 1 on fresh rollouts and the clip fires on noise."""
    dual_clip: float | None = None
    """Dual-clip PPO (Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep RL"):
    for a negative advantage the token loss is capped at ``dual_clip · |A|`` (a value > 1; the
    paper uses 3), so a token whose ratio has grown large under stale data cannot dominate the
    update. Unset: 3 in async mode with ``max_staleness > 1`` (where such ratios occur), off
    otherwise; 0 turns it off."""
    old_logprobs: Literal["sampler", "recompute"] = "sampler"
    """Denominator of ρ: the log-probs the generation backend reported (``sampler``: corrects
    for staleness and kernel mismatch), or a no-grad forward of the current weights before the
    first pass (``recompute``: the paper's π_old; not allowed in async mode)."""
    rollout_chunks: int = Field(default=1, ge=1)
    """Cut each step's batch of tasks into this many chunks rolled out at once: generation
    takes turns, so chunk j+1 generates while Lean checks chunk j (1, the default: generate
    everything, then check; 2-4 hide most of Lean's time). Each chunk after the first samples
    with its own seed derived from the step's, so changing it changes the samples."""
    async_generation: bool = False
    """Generate the next step's rollouts while this step trains (see the module docstring)."""
    max_staleness: int = Field(default=1, ge=1)
    """Async mode: most trainer steps between the weights that generated a batch and the
    weights it is trained on."""
    precision: Literal["auto", "fp32", "bf16-mixed", "bf16"] = "auto"
    """``fp32``; ``bf16-mixed``: fp32 weights and optimizer, bf16 autocast (CUDA only);
    ``bf16``: bf16 weights too (half the memory, lossy updates). ``auto``: bf16-mixed on a GPU,
    fp32 on the CPU."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, ~30% slower)."""
    lora: LoRAConfig = Field(default_factory=LoRAConfig)
    """Train low-rank adapters (``peft``) instead of every weight: ``--lora.rank 16``."""
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    """How a ``torchrun`` launch spreads the model over its ranks (FSDP2 or DDP)."""
    vllm_server: VLLMServerConfig = Field(default_factory=VLLMServerConfig)
    """Generate on a separate ``vllm serve`` process and push weights to it after every step."""

    @field_validator("group_size")
    @classmethod
    def _group_size(cls, v: int) -> int:
        if v < 2:
            raise ValueError(
                f"group_size must be at least 2 (got {v}): GRPO's advantage compares the "
                "samples of a group with each other, so a group of 1 has advantage 0 always"
            )
        return v

    @field_validator("dual_clip")
    @classmethod
    def _dual_clip(cls, v: float | None) -> float | None:
        if v is not None and v != 0 and v <= 1:
            raise ValueError(
                f"dual_clip must be 0 (off) or greater than 1 (got {v}): it caps a negative "
                "advantage's token loss at dual_clip × |A|, above the ordinary clip (paper: 3)"
            )
        return v

    @property
    def reward_scale(self) -> RewardScale:
        """``scale_rewards`` resolved: unset means ``none`` for ``dr_grpo``, ``group`` else."""
        if self.scale_rewards is not None:
            return self.scale_rewards
        return "none" if self.loss_agg == "dr_grpo" else "group"

    @property
    def dual_clip_c(self) -> float | None:
        """``dual_clip`` resolved: the cap constant c, or None when off."""
        if self.dual_clip is None:
            return 3.0 if self.async_generation and self.max_staleness > 1 else None
        return self.dual_clip or None

    @model_validator(mode="after")
    def _divisible(self) -> GRPOConfig:
        if self.sampling.temperature <= 0:
            raise ValueError(
                f"sampling.temperature must be above 0 for GRPO (got {self.sampling.temperature}):"
                " greedy decoding makes every attempt of a group identical, so every advantage is"
                " 0 and nothing is learned; GRPO needs sampling, use a temperature around 1.0"
            )
        total = self.tasks_per_step * self.group_size
        if total % self.minibatches:
            raise ValueError(
                f"tasks_per_step × group_size = {self.tasks_per_step} × {self.group_size} = "
                f"{total} sequences per step is not divisible by minibatches = "
                f"{self.minibatches}; change one of them"
            )
        if self.async_generation and self.old_logprobs == "recompute":
            raise ValueError(
                "async_generation needs old_logprobs = 'sampler': the ratio must be against the "
                "stale policy that sampled the tokens, which only the sampler's log-probs know"
            )
        return self
