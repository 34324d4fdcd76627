"""The GRPO configuration: every option of :class:`leanrl.train.grpo.GRPOTrainer`, validated.

Kept apart from the trainer so that the CLI (which lists every command at start-up) and the torch
side (:mod:`leanrl.train.grpo.engine`) can import it without importing each other; importing it
does not import torch. The objective the options configure is in
:mod:`leanrl.train.grpo.trainer`.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar, Literal, NamedTuple

from pydantic import Field, field_validator, model_validator

from leanrl.policy import SamplingConfig
from leanrl.train.common import TrainConfig
from leanrl.train.curriculum import CurriculumConfig
from leanrl.train.distill.config import DistillConfig
from leanrl.train.distributed import DistributedConfig
from leanrl.train.grpo.replay import ReplayConfig
from leanrl.train.grpo.trl_names import TRL_DIFFERENT, TRL_RENAMED, TRL_SAME, translate_trl
from leanrl.train.lora import LoRAConfig
from leanrl.train.multienv_config import MixedEnvConfig, check_mixed, mixed_held_out
from leanrl.train.shaping import FormatRewardConfig, OverlongConfig
from leanrl.train.vllm_server import VLLMServerConfig

__all__ = ["AsyncChoice", "GRPOConfig", "LossAgg", "RewardScale", "resolve_async_generation"]

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
        **TRL_RENAMED,
    }
    """TRL names and what leanrl calls them (the CLI's "did you mean" reads this)."""

    @classmethod
    def translate_input(cls, data: Any) -> Any:
        """``data`` with TRL's names moved to leanrl's (``leanrl.config.merge`` applies it to
        the TOML file and the flags each, before laying one over the other)."""
        return translate_trl(data)

    @model_validator(mode="before")
    @classmethod
    def _trl_names(cls, data: Any) -> Any:
        return cls.translate_input(data)

    @model_validator(mode="before")
    @classmethod
    def _mixed_held_out(cls, data: Any) -> Any:
        # issue 40: `envs` read in every spelling, and `eval.env` given without an id is the
        # held-out set of every environment of a mixed run (`--eval.env.taskset.split test`)
        return mixed_held_out(data)

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
    # -- objective variants (issue 25) --
    advantage: Literal["group", "pass_at_k", "unlikeliness"] = "group"
    """How rewards become advantages. ``group`` (the default): GRPO's group-relative advantage
    (DeepSeekMath). ``pass_at_k``: PKPO's unbiased pass@k transform (Walder & Karkhanis 2025,
    "Pass@K Policy Optimization"): optimise the chance that one of ``pass_k`` attempts passes
    (or, for graded rewards, the expected best of ``pass_k``), not the mean reward, with the
    leave-one-out baseline ``pass_k_baseline``; ``scale_rewards`` then divides by the std of
    those advantages. ``unlikeliness``: each reward times ``1 - unlikeliness_beta · rank/G``,
    ranked by the attempt's mean log-prob, 0 for the least likely (He, Fried & Welleck 2025,
    "Rewarding the Unlikely"): rare correct proofs gain over likely ones. It needs the sampler's
    log-probs, and a group whose attempts all pass differs only through the bonus, so use it with
    ``dynamic_sampling = "off"`` to keep such groups."""
    pass_k: int = Field(default=8, ge=1)
    """``advantage = "pass_at_k"``: the k of pass@k to optimise, at most ``group_size`` (at most
    ``group_size - 1`` with ``pass_k_baseline = "loo"``). 1 is GRPO's pass@1 objective with a
    leave-one-out baseline (RLOO). PKPO anneals k down during training; here it is fixed."""
    pass_k_baseline: Literal["none", "loo", "loo_minus_one"] = "loo_minus_one"
    """``advantage = "pass_at_k"``: the baseline subtracted from each transformed reward, from
    the group's other attempts only so the gradient stays unbiased (PKPO's leave-one-out
    variants): ``loo_minus_one`` (the other attempts' max@(k-1) estimate; with k = 1, ``loo``),
    ``loo`` (their max@k estimate), or ``none`` (the raw transformed rewards: unbiased but
    noisy, and uncentred, so it needs ``scale_rewards = "none"``)."""
    unlikeliness_beta: float = Field(default=0.25, ge=0.0, le=1.0)
    """``advantage = "unlikeliness"``: β_rank, the share of its reward the group's most likely
    attempt loses (He et al. 2025 use 0.25)."""
    importance_sampling_level: Literal["token", "sequence"] = "token"
    """Level of the ratio ρ in the loss (TRL's name). ``token`` (PPO/GRPO): one ratio per token.
    ``sequence``: GSPO's (Zheng et al. 2025, "Group Sequence Policy Optimization")
    length-normalised sequence ratio ``exp(mean_t(logp - old))``, shared by every token of the
    sequence and clipped as a whole; GSPO clips it at ``eps_low = 3e-4``, ``eps_high = 4e-4``
    and averages per sequence (``loss_agg = "grpo"``)."""
    loss: Literal["clip", "cispo"] = "clip"
    """Token loss. ``clip``: PPO's clipped surrogate (DeepSeekMath, DAPO). ``cispo``: CISPO
    (MiniMax-M1, 2025): ``-sg(clip(ρ, cispo_min, cispo_max)) · A · log π_θ``: the importance
    weight is clipped and detached instead of the update, so every token keeps its gradient
    (``eps_low``/``eps_high``/``dual_clip`` do not apply)."""
    cispo_max: float = Field(default=5.0, gt=1.0)
    """``loss = "cispo"``: upper bound of the detached importance weight (1 + ε_high^IS in
    MiniMax-M1's notation; 5 is ScaleRL's ε_max, Khatri et al. 2025, and TRL's recommended
    ``epsilon_high`` for CISPO)."""
    cispo_min: float = Field(default=0.0, ge=0.0, lt=1.0)
    """``loss = "cispo"``: lower bound of the weight (1 - ε_low^IS). 0: none, as in MiniMax-M1."""
    is_correction: Literal[
        "auto", "off", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"
    ] = "auto"
    """Correct for the gap between the sampler's log-probs μ (vLLM kernels, bf16, or weights one
    step stale in async mode) and the trainer's own forward π_old of the weights at the step's
    start (TRL's ``vllm_importance_sampling_mode``). When on, π_old is ρ's denominator (the
    detached log-probs of the loss forward itself with one pass and one mini-batch, else a no-grad
    forward before the first pass), and each token's loss is multiplied by the detached weight
    π_old/μ, per token or per sequence (the product over its tokens), truncated at ``is_cap``
    (TIS, Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL
    Training") or zeroed outside [``is_floor``, ``is_cap``] (masked IS; prime-rl's token mask).
    In async mode this is decoupled PPO (Hilton et al. 2021): the clip is around the weights
    being trained and the weight corrects for the stale sampler. ``auto`` (the default):
    ``token_truncate`` in async mode, ``off`` in synchronous steps. (With ρ against a sampler
    one update behind, the clip zeroes the gradient of every token the last update already moved
    past 1 ± eps in its advantage's direction: measured on the 23M benchmark, 28-52% of the loss
    tokens of every stale step (mean 37.5%, 6 seeds), and a mean reward over steps 8-12 of 0.46
    against 0.77 with ``auto`` and 0.99 in synchronous steps; docs/training-grpo.md, "The pipeline's
    objective (issue 38)".) ``off``: ρ is against μ directly."""
    is_cap: float = Field(default=3.0, gt=1.0)
    """``is_correction``: the cap C of the weight π_old/μ (TRL's ``vllm_importance_sampling_cap``,
    default 3)."""
    is_floor: float = Field(default=0.0, ge=0.0, lt=1.0)
    """``is_correction = "*_mask"``: weights below this are masked too (0: none; prime-rl masks
    tokens below 0.125)."""
    rollout_chunks: int = Field(default=1, ge=1)
    """Cut each step's batch of tasks into this many chunks rolled out at once: generation
    takes turns, so chunk j+1 generates while Lean checks chunk j (1, the default: generate
    everything, then check; 2-4 hide most of Lean's time). Each chunk after the first samples
    with its own seed derived from the step's, so changing it changes the samples."""
    async_generation: bool | Literal["auto"] = "auto"
    """Generate step t+1's rollouts while Lean checks and the trainer trains step t (one step
    stale at most ``max_staleness``; ρ is against the sampler's own log-probs, see the trainer's
    module docstring). ``auto`` (the default): on when the engine is apart from the trainer
    (``vllm``, or a vLLM server) with ``old_logprobs = "sampler"`` and one process, off
    otherwise (``hf`` generates on the trainer's device on a second copy of the weights, and
    was measured neither faster nor at equal reward there: docs/training-grpo.md, "Against
    TRL"); the start of a run logs which and why, and a resumed run keeps the mode its run
    folder recorded. Batch s is made on exactly version ``max(s - max_staleness, start)``, so an
    async run repeats. ``false``: synchronous steps, a pure function of (seed, step) that
    resumes exactly: the deterministic replay of a run."""
    stream_training: bool | Literal["auto"] = "auto"
    """Synchronous steps: run each group's forward and backward as soon as the harness reports
    the group checked (``whole-proof`` does), while later groups are still generated and
    checked; the step's one update follows the last group. The same update as training after
    the last verdict, up to float rounding, and as repeatable (groups in task order);
    :mod:`leanrl.train.grpo.streamed` has the objective and what rules it out (``scale_rewards
    = "batch"``, several passes or mini-batches, async mode, replay, a distillation teacher,
    several ranks, LoRA with ``beta`` > 0; with ``hf``, whose sampler shares the model: dropout,
    gradient checkpointing, ``logprob_chunk``). ``auto`` (the default): on for
    ``hf`` where nothing rules it out (the start of a run logs which and why); ``true``: on,
    refused where ruled out; ``false``: train after the last verdict."""
    max_staleness: int = Field(default=1, ge=1)
    """Async mode: most trainer steps between the weights that generated a batch and the
    weights it is trained on."""
    precision: Literal["auto", "fp32", "bf16-mixed", "bf16"] = "auto"
    """``fp32``; ``bf16-mixed``: fp32 weights and optimizer, bf16 autocast (CUDA only);
    ``bf16``: bf16 weights too (half the memory, lossy updates). ``auto``: bf16-mixed on a GPU,
    fp32 on the CPU."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, ~30% slower)."""
    # -- memory-bounded loss (issue 23) --
    logprob_chunk: int | None = Field(default=None, ge=1)
    """Compute the loss's log-probs (and the logged entropy) through tiles of this many tokens
    × ``logprob_vocab_tile`` vocabulary entries of the model's own output head, with an online
    log-sum-exp and the tile logits recomputed in the backward pass, so the [tokens, V] fp32
    logits are never held (the chunked linear-cross-entropy idea of Liger-Kernel, Hsu et al.
    2024, for log-probs). Same values and gradients up to float rounding; ~1/3 more head
    FLOPs. Unset (the default): full logits. Models whose logits are more than ``head(h)``
    (soft-capping, logit scales, a LoRA or quantised head) keep full logits, with a warning.
    1024 is a good start; see docs/training-grpo.md, "Memory-bounded loss"."""
    logprob_vocab_tile: int = Field(default=8192, ge=1)
    """``logprob_chunk``: vocabulary entries per tile (the tile of logits is ``logprob_chunk ×
    logprob_vocab_tile`` fp32 values)."""
    sort_micro_batches: bool = False
    """Sort each rank's share of a mini-batch by sequence length before cutting it into
    micro-batches, so sequences of like length share a micro-batch (less padding: less
    compute and memory). The loss's denominators are the mini-batch's, so the loss and
    gradient are the same up to float rounding of the sums' order."""
    lora: LoRAConfig = Field(default_factory=LoRAConfig)
    """Train low-rank adapters (``peft``) instead of every weight: ``--lora.rank 16``."""
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    """How a ``torchrun`` launch spreads the model over its ranks (FSDP2 or DDP)."""
    vllm_server: VLLMServerConfig = Field(default_factory=VLLMServerConfig)
    """Generate on a separate ``vllm serve`` process and push weights to it after every step."""
    # -- failure replay and shaped rewards (issue 25) --
    replay: ReplayConfig = Field(default_factory=ReplayConfig)
    """Failure replay (Kimina-Prover RL's error-correction prompts): ``--replay.fraction 0.25``
    builds a quarter of each step's groups from the run's own failed attempts, each shown
    Lean's errors through the self-correction harness's prompt and revised ``group_size``
    times. Off by default (see docs/training-grpo.md, "Failure replay")."""
    format_reward: FormatRewardConfig = Field(default_factory=FormatRewardConfig)
    """Format penalties added to the reward (Kimina-Prover RL: one reasoning block, one Lean
    block, no repeated lines). Off by default; never changes a Verdict or the pass rate."""
    overlong: OverlongConfig = Field(default_factory=OverlongConfig)
    """DAPO's soft overlong punishment (Yu et al. 2025) added to the reward; L_max defaults to
    ``sampling.max_tokens``. Off by default."""
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig)
    """Choose each step's tasks by difficulty from a per-task table of attempts and passes
    (``RUN_DIR/difficulty.json``): drop solved tasks, oversample the frontier, or draw from
    easy/frontier/hard pools (``--curriculum.mode pools``). Off by default: the seeded epoch
    order."""
    # -- distillation and mixed runs (issue 40) --
    distill: DistillConfig = Field(default_factory=DistillConfig)
    """On-policy distillation: ``--distill.teacher MODEL`` scores every sampled model token
    and each token's advantage becomes ``A_j - distill.coef · (log π_student - log π_teacher)``
    (``--distill.only``: the reverse KL alone). Off by default (see docs/training-distill.md)."""
    envs: list[MixedEnvConfig] = Field(default_factory=list)
    """Several environments in one run, each with a weight (``--env countdown --env minif2f``,
    ``--env countdown=3``, or a TOML table per environment): each step's tasks are drawn by
    weight, metrics and the in-run evaluation are per environment too (``env/NAME/...``,
    ``eval/NAME/...``), and ``env`` is not used. Empty (the default): ``env`` alone."""

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
    def async_mode(self) -> bool:
        """``async_generation`` resolved for this process (:func:`resolve_async_generation`)."""
        return resolve_async_generation(self, torchrun_ranks()).on

    @property
    def is_mode(self) -> str:
        """``is_correction`` resolved: ``auto`` is ``token_truncate`` in async mode (decoupled
        PPO), ``off`` otherwise."""
        if self.is_correction == "auto":
            return "token_truncate" if self.async_mode else "off"
        return self.is_correction

    @property
    def dual_clip_c(self) -> float | None:
        """``dual_clip`` resolved: the cap constant c, or None when off."""
        if self.dual_clip is None:
            return 3.0 if self.async_mode and self.max_staleness > 1 else None
        return self.dual_clip or None

    @model_validator(mode="after")
    def _replay_and_shaping(self) -> GRPOConfig:
        if self.replay.enabled and self.replay.groups_per_step(self.tasks_per_step) == 0:
            raise ValueError(
                f"replay.fraction = {self.replay.fraction} of tasks_per_step = "
                f"{self.tasks_per_step} is less than one group per step: raise "
                f"--replay.fraction to at least {1 / self.tasks_per_step:.3g} or set it to 0"
            )
        if self.overlong.enabled:
            self.overlong.resolved(self.sampling.max_tokens)  # the buffer must fit in L_max
        return self

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
        if self.async_generation is True and self.old_logprobs == "recompute":
            raise ValueError(
                "async_generation = true needs old_logprobs = 'sampler': the ratio must be "
                "against the stale policy that sampled the tokens, which only the sampler's "
                "log-probs know; drop one of the two (async_generation = 'auto' then runs "
                "synchronously)"
            )
        return self

    @model_validator(mode="after")
    def _distill_and_envs(self) -> GRPOConfig:
        # issue 40: a mixed run's checks, and distill.only's defaults
        check_mixed_run(self)
        if self.distill.only:
            if "dynamic_sampling" in self.model_fields_set and self.dynamic_sampling != "off":
                raise ValueError(
                    f"distill.only with dynamic_sampling = {self.dynamic_sampling!r}: every "
                    "group carries the teacher's signal, so no group is left out; drop "
                    "--dynamic-sampling (distill.only turns it off)"
                )
            self.dynamic_sampling = "off"
            if "mask_truncated" not in self.model_fields_set:
                self.mask_truncated = False  # a cut-off attempt's tokens are still scored
        return self

    @model_validator(mode="after")
    def _objective_variants(self) -> GRPOConfig:
        # issue 25: pass@k needs k attempts of a group to choose from
        if self.advantage == "pass_at_k":
            most = self.group_size - (1 if self.pass_k_baseline == "loo" else 0)
            if self.pass_k > most:
                why = (
                    " (the 'loo' baseline estimates pass@k from the other group_size - 1 "
                    "attempts; 'loo_minus_one' allows pass_k = group_size)"
                    if self.pass_k_baseline == "loo"
                    else ""
                )
                raise ValueError(
                    f"pass_k = {self.pass_k} is more than {most} for group_size = "
                    f"{self.group_size}{why}: pass@k is estimated from the group's attempts; "
                    "lower pass_k or raise group_size"
                )
            if self.pass_k_baseline == "none" and self.reward_scale != "none":
                raise ValueError(
                    "pass_k_baseline = 'none' leaves the pass@k advantages uncentred, and "
                    f"scale_rewards = {self.reward_scale!r} would divide them by a std near 0 "
                    "in nearly uniform groups; set scale_rewards = 'none' (or use the default "
                    "baseline 'loo_minus_one')"
                )
        return self


def check_mixed_run(cfg: GRPOConfig) -> None:
    """A mixed run's checks (``ValueError``, for the validator): distinct names, one part or
    more, no curriculum or failure replay (they draw from one task list), experts named after
    environments; the run's ``eval.env`` becomes the first part's held-out set."""
    experts = set(cfg.distill.experts)
    if not cfg.envs:
        if experts:
            raise ValueError(
                f"distill.experts names environments ({', '.join(sorted(experts))}) but the run "
                "has one environment: use --distill.teacher, or a mixed run (--env A --env B)"
            )
        return
    check_mixed(cfg.envs)
    names = {e.name for e in cfg.envs}
    if experts - names:
        raise ValueError(
            f"distill.experts names {sorted(experts - names)}, not environments of this run "
            f"({sorted(names)})"
        )
    if cfg.curriculum.mode != "off":
        raise ValueError(
            "curriculum with several environments (envs) is not supported yet: each step's "
            "tasks are drawn by the environments' weights; drop --curriculum.mode"
        )
    if cfg.replay.enabled:
        raise ValueError(
            "replay with several environments (envs) is not supported yet: set --replay.fraction 0"
        )
    held = [e.eval for e in cfg.envs if e.eval is not None]
    if cfg.eval.every and held:
        cfg.eval = cfg.eval.model_copy(update={"env": held[0]})


class AsyncChoice(NamedTuple):
    """What ``async_generation`` resolved to, and why (the line a run logs at its start)."""

    on: bool
    reason: str

    def line(self) -> str:
        """``async generation: on (vllm server: the engine is separate)``."""
        return f"async generation: {'on' if self.on else 'off'} ({self.reason})"


def torchrun_ranks() -> int | None:
    """The number of ranks of a ``torchrun`` launch (``WORLD_SIZE``), None for a plain process."""
    ranks = int(os.environ.get("WORLD_SIZE", "1"))
    if ranks <= 1 and "TORCHELASTIC_RUN_ID" not in os.environ:
        return None
    return ranks


def resolve_async_generation(
    cfg: GRPOConfig, ranks: int | None, stored: bool | None = None
) -> AsyncChoice:
    """Whether GRPO overlaps generation with checking and training, and why.

    ``ranks``: :func:`torchrun_ranks` (None: one plain process). ``stored``: the value the run
    folder being resumed recorded, if any. An explicit ``true``/``false`` is kept as it is
    (unsupported combinations are refused elsewhere, as before). ``auto`` never fails: it falls
    back to off with the reason, so that a default config runs everywhere.
    """
    if cfg.async_generation is not True and cfg.async_generation is not False:  # "auto"
        return _resolve_auto(cfg, ranks, stored)
    return AsyncChoice(
        cfg.async_generation, f"async_generation = {str(cfg.async_generation).lower()}"
    )


def _resolve_auto(cfg: GRPOConfig, ranks: int | None, stored: bool | None) -> AsyncChoice:
    if ranks is not None:
        # the generation thread's collectives (FSDP gathers, barriers) would interleave
        return AsyncChoice(False, f"auto: {ranks} rank(s) under torchrun, which async mode does "
                           "not support (its generation thread's collectives would interleave "
                           "with training's)")  # fmt: skip
    if cfg.old_logprobs == "recompute":
        return AsyncChoice(False, "auto: old_logprobs = 'recompute' takes π_old from the "
                           "trainer's weights, which are the sampler's only in synchronous "
                           "steps")  # fmt: skip
    if stored is not None:
        # a resumed run keeps its mode: old run folders (stored false) resume as they ran
        return AsyncChoice(stored, f"auto: the run folder ran with async_generation = "
                           f"{str(stored).lower()}, and a resumed run keeps its mode")  # fmt: skip
    backend = cfg.policy.backend
    if backend == "openai" and cfg.vllm_server.enabled:
        return AsyncChoice(True, "vllm server: the engine is separate")
    if backend == "vllm":
        return AsyncChoice(True, "vllm: the engine holds its own copy of the weights")
    if backend == "hf":
        return AsyncChoice(False, "hf: generation shares the trainer's device (the one-step "
                           "pipeline measured at a lower reward on a CPU); set async_generation "
                           "= true to overlap anyway, at twice the weight memory")  # fmt: skip
    return AsyncChoice(False, f"auto: the {backend!r} backend cannot receive new weights")
