"""GRPO: group-relative policy optimisation on any leanrl Environment.

One step, top to bottom (``GRPOTrainer._train_loop``):

1. **Tasks.** ``batch_for_step(tasks, step, tasks_per_step, seed)``: B tasks, the same batches
   whatever happens (resume included).
2. **Rollouts.** ``env.rollout(tasks, policy, sampling(n=G))``: G attempts per task through the
   harness (whole-proof or tactic-loop), verified by the runtime, rewarded by the taskset. Each
   rollout carries the token ids of the prompt, of the model's turns (loss mask 1) and of the
   environment's feedback (loss mask 0), and the behaviour policy's log-prob of every model token.
3. **Advantages.** Per group i of rewards r_i1..r_iG: ``A_ij = (r_ij - mean_i) / (std_i + 1e-4)``
   (``scale_rewards = "group"``; ``"batch"`` uses the batch std, ``"none"`` no division). Every
   token of rollout j gets A_ij. Groups with all-equal rewards have A = 0 and carry no signal;
   ``dynamic_sampling`` drops them (or refills the batch with new groups).
4. **Loss.** For each model token t of sequence j, with ``ρ_t = π_θ(o_t | ctx) / μ(o_t | ctx)``
   where μ is the *behaviour* policy that sampled the token (its log-probs come with the rollout)::

       l_t = -min(ρ_t · A_j, clip(ρ_t, 1 - eps_low, 1 + eps_high) · A_j)  +  β · KL3_t
       KL3_t = exp(log π_ref - log π_θ) - (log π_ref - log π_θ) - 1          (only if β > 0)

   aggregated over the mini-batch's M sequences with |o_j| loss tokens each:

       grpo:     J = 1/M · Σ_j 1/|o_j| · Σ_t l_t          (DeepSeekMath eq. 3)
       dapo:     J = 1/Σ_j|o_j| · Σ_j Σ_t l_t             (DAPO eq. 8, the default)
       dr_grpo:  J = 1/(M · L) · Σ_j Σ_t l_t, L = norm_len (Dr. GRPO; constant, no length bias)

   Environment tokens and (with ``mask_truncated``) every token of a truncated rollout have
   mask 0: they are in the context but carry no loss and do not count in the denominators.
5. **Update.** ``ppo_epochs`` passes over the batch; each pass is shuffled and cut into
   ``minibatches`` optimizer steps; each mini-batch is cut into micro-batches of
   ``micro_batch_size`` sequences whose gradients accumulate (the denominators are the whole
   mini-batch's, so accumulation is exact). Gradient clipping at ``max_grad_norm``, AdamW, and a
   learning-rate schedule stepped once per trainer step.

Where this departs from the papers, and why:

- ρ is taken against the sampling policy's own log-probs (from the generation backend), not
  against a recomputed forward pass of the same weights. On the first pass with fresh rollouts
  ρ ≈ 1, and it also corrects the small numeric mismatch between the generation kernels and the
  training forward. ``old_logprobs = "recompute"`` gives the paper's π_θ_old instead.
- The log-probs use ``logits / temperature`` on both sides. Top-p truncation is invisible to the
  trainer, so the default sampling here has ``top_p = 1`` (DAPO does the same).
- DeepSeekMath puts the KL in the loss with β = 0.04; the default here is β = 0 (DAPO and
  Dr. GRPO drop it). With β > 0 the reference is the starting model, frozen.
- Rewards of truncated rollouts still count in their group's mean and std (they are real
  attempts); only their tokens leave the loss (DAPO's overlong filtering).

**Asynchronous mode** (``async_generation = true``). The rollouts of step s+1 are generated while
step s trains. Let v be the number of optimizer *trainer steps* applied to the weights. Batch s
is generated with weights of some version v_s and trained on at version s; the trainer waits so
that ``s - v_s <= max_staleness``. Before a batch is generated the generation weights are
refreshed to the newest finished version (in place: a copy of the parameters for ``hf``, a
``load_weights`` push for ``vllm``). The importance ratio ρ is then against μ = π_{v_s}, the
stale policy that really produced the tokens (its log-probs come with the rollout), and the clip
bounds the update around μ, as in PPO with off-policy data. ``hf`` keeps a second copy of the
model for generation in async mode (double the weight memory). A resumed async run restarts
its pipeline from the checkpoint weights, so it is repeatable but not identical to an
uninterrupted one; synchronous CPU runs resume exactly.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from leanrl.environment import Environment, load_environment
from leanrl.errors import ConfigError, PolicyError
from leanrl.policy import Policy, SamplingConfig
from leanrl.rollout import Rollout
from leanrl.task import Task
from leanrl.train.common import MetricsLogger, RunDir, TrainConfig, batch_for_step, check_model_path

__all__ = ["GRPOConfig", "GRPOTrainer", "train_grpo"]

# The same literals as leanrl.train.rl's, spelled out here so that importing the config (the CLI
# does, at start-up) does not import torch.
LossAgg = Literal["grpo", "dr_grpo", "dapo"]
RewardScale = Literal["group", "batch", "none"]

log = logging.getLogger("leanrl.train.grpo")


def _grpo_sampling() -> SamplingConfig:
    # DAPO samples with temperature 1.0 and top-p 1.0; top-p < 1 would bias the ratio (see above).
    return SamplingConfig(temperature=1.0, top_p=1.0, max_tokens=2048)


class GRPOConfig(TrainConfig):
    """GRPO options. Defaults follow the papers each field cites."""

    sampling: SamplingConfig = Field(default_factory=_grpo_sampling)
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
    scale_rewards: RewardScale = "group"
    """Divide advantages by the group's reward std (``group``, DeepSeekMath), the whole batch's
    (``batch``), or not at all (``none``, Dr. GRPO: std scaling over-weights easy and hard
    tasks)."""
    eps_low: float = Field(default=0.2, ge=0.0, lt=1.0)
    """Lower clip bound: ρ is clipped at 1 - eps_low (PPO's 0.2, Schulman et al. 2017)."""
    eps_high: float = Field(default=0.28, ge=0.0)
    """Upper clip bound: ρ is clipped at 1 + eps_high. 0.28 is DAPO's clip-higher, which keeps
    low-probability tokens able to grow (against entropy collapse)."""
    beta: float = Field(default=0.0, ge=0.0)
    """Weight of the k3 KL penalty to the frozen starting model. 0 (no reference model loaded)
    as in DAPO and Dr. GRPO; DeepSeekMath used 0.04."""
    dynamic_sampling: Literal["off", "drop", "refill"] = "drop"
    """Groups whose rewards are all equal have zero advantage. ``drop``: leave them out of the
    batch (they would only dilute the ``dapo``/``grpo`` denominators). ``refill``: also sample
    extra groups until the batch has ``tasks_per_step`` informative ones or
    ``max_refill_rounds`` is reached (DAPO's dynamic sampling, Yu et al. 2025). ``off``: keep
    them."""
    max_refill_rounds: int = Field(default=3, ge=1)
    """``refill``: most extra rounds of ``tasks_per_step`` new groups per step."""
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
    ``sampling.max_tokens`` (times ``env.harness.max_turns`` for multi-turn harnesses)."""
    old_logprobs: Literal["sampler", "recompute"] = "sampler"
    """Denominator of ρ: the log-probs the generation backend reported (``sampler``: corrects
    for staleness and kernel mismatch), or a no-grad forward of the current weights before the
    first pass (``recompute``: the paper's π_old; not allowed in async mode)."""
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

    @field_validator("group_size")
    @classmethod
    def _group_size(cls, v: int) -> int:
        if v < 2:
            raise ValueError(
                f"group_size must be at least 2 (got {v}): GRPO's advantage compares the "
                "samples of a group with each other, so a group of 1 has advantage 0 always"
            )
        return v

    @model_validator(mode="after")
    def _divisible(self) -> GRPOConfig:
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


# -- data --------------------------------------------------------------------------------------


@dataclass
class _Sample:
    """One sequence for the loss: prompt, response (model + environment tokens), per-token data."""

    prompt: list[int]
    resp: list[int]
    mask: list[int]  # 1 = model token with loss, 0 = environment token or masked
    old: list[float]  # behaviour log-prob per response token (0.0 where unknown and masked)
    adv: float
    ref: list[float] | None = None  # reference log-probs (β > 0), filled before training


@dataclass
class _Batch:
    step: int
    groups: list[list[Rollout]]  # every group sampled (dropped ones included)
    kept: list[list[Rollout]]
    samples: list[_Sample]
    version: int  # weights version that generated it
    t_rollout: float
    t_generate: float


class _GenClock(Policy):
    """Wraps the generation policy and measures wall time with a generate call in flight."""

    def __init__(self, inner: Policy) -> None:
        super().__init__(inner.config)
        self.inner = inner
        self.name = inner.name  # type: ignore[misc]
        self.busy = 0.0
        self._inflight = 0
        self._since = 0.0

    async def generate(self, prompts: Any, sampling: SamplingConfig) -> Any:
        if self._inflight == 0:
            self._since = time.perf_counter()
        self._inflight += 1
        try:
            return await self.inner.generate(prompts, sampling)
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self.busy += time.perf_counter() - self._since

    def tokenize(self, text: str) -> list[int]:
        return self.inner.tokenize(text)

    def take(self) -> float:
        t, self.busy = self.busy, 0.0
        return t


# -- the trainer -------------------------------------------------------------------------------


class GRPOTrainer:
    """Train ``config.policy.model`` with GRPO on ``env`` (default: ``config.env``).

    ``__init__`` only stores. ``await train()`` (or :meth:`train_sync`) checks the config, loads
    the model, resumes from the run folder if it holds a checkpoint, trains to ``steps`` and
    returns this call's metrics rows, like ``ESTrainer``. Rerunning on the same ``out`` resumes.
    """

    #: Fields that may change between a run and its resume (they do not change the result up to
    #: the old ``steps``; with a ``linear``/``cosine`` schedule a new ``steps`` reshapes the
    #: rest of the schedule).
    RESUMABLE = ("steps", "out", "log_to", "run_name", "keep_checkpoints", "save_every")

    def __init__(self, config: GRPOConfig, env: Environment | None = None) -> None:
        self.config = config
        self.env = env
        self.run = RunDir(config.out)

    def check(self) -> None:
        """Cheap checks before anything is loaded (clear :class:`ConfigError` s)."""
        check_model_path(self.config.policy.model)
        from leanrl.train.grpo_engine import device_and_precision

        device_and_precision(self.config)
        for target in self.config.log_to:
            if importlib.util.find_spec(target) is None:
                raise ConfigError(
                    f"log_to includes {target!r} but the {target} package is not installed: "
                    f"pip install {target} (or drop it from log_to)"
                )

    def train_sync(self) -> list[dict[str, Any]]:
        """Blocking :meth:`train`, for scripts and notebooks (also inside Jupyter's loop)."""
        from leanrl.runtime import run_sync

        rows: list[dict[str, Any]] = run_sync(self.train())
        return rows

    async def train(self) -> list[dict[str, Any]]:
        """Train to ``config.steps``; returns the metrics rows this call wrote."""
        self.check()
        from leanrl.train.grpo_engine import GRPOEngine

        engine = GRPOEngine(self.config, self.run)
        env = self.env or load_environment(self.config.env)
        # The tasks load before the model: a bad taskset fails in seconds, not after a model load.
        tasks = await asyncio.to_thread(env.tasks)
        batch_for_step(tasks, 0, 1, self.config.seed)  # an empty taskset fails here, clearly
        resumed = self.run.bind_config(self.config, ignore=self.RESUMABLE)
        await asyncio.to_thread(engine.load, resumed)
        logger = MetricsLogger(
            self.run,
            self.config.log_to,
            self.config.run_name,
            self.config.model_dump(mode="json"),
        )
        logger.start()
        gen: Policy | None = None
        rows: list[dict[str, Any]] = []
        try:
            gen = await engine.make_generation_policy()
            clock = _GenClock(gen)
            async with env:
                await self._train_loop(engine, env, tasks, clock, logger, rows)
        finally:
            logger.close()
            if gen is not None:
                await gen.close()
            self.run.plot(title=f"GRPO reward ({self.run.path.name})")
        return rows

    # -- the loop --------------------------------------------------------------------------------

    async def _train_loop(
        self,
        engine: Any,
        env: Environment,
        tasks: list[Task],
        clock: _GenClock,
        logger: MetricsLogger,
        rows: list[dict[str, Any]],
    ) -> None:
        cfg = self.config
        start = engine.step
        if start >= cfg.steps:
            return
        version = asyncio.Condition()

        async def produce(step: int) -> _Batch:
            async with version:  # bounded staleness: batch s waits for weights >= s - k
                await version.wait_for(lambda: engine.step >= step - cfg.max_staleness)
            await asyncio.to_thread(engine.sync_generation_weights)
            return await self._collect(engine, env, tasks, clock, step)

        queue: asyncio.Queue[_Batch | BaseException] = asyncio.Queue(maxsize=cfg.max_staleness)
        producer: asyncio.Task[None] | None = None
        if cfg.async_generation:

            async def run_producer() -> None:
                try:
                    for s in range(start, cfg.steps):
                        await queue.put(await produce(s))
                except Exception as e:  # noqa: BLE001 - the consumer re-raises it
                    await queue.put(e)

            producer = asyncio.create_task(run_producer())
        try:
            for step in range(start, cfg.steps):
                t0 = time.perf_counter()
                if producer is not None:
                    got = await queue.get()
                    if isinstance(got, BaseException):
                        raise got
                    batch = got
                else:
                    batch = await produce(step)
                t1 = time.perf_counter()
                train_stats = await asyncio.to_thread(engine.train_step, batch)
                t2 = time.perf_counter()
                async with version:
                    version.notify_all()
                row = self._metrics_row(engine, batch, train_stats, t0, t1, t2)
                logger.log(row)
                rows.append(row)
                done = engine.step
                if done % cfg.save_every == 0 or done == cfg.steps:
                    await asyncio.to_thread(engine.save_checkpoint, row)
        finally:
            if producer is not None:
                producer.cancel()
                await asyncio.gather(producer, return_exceptions=True)

    async def _collect(
        self,
        engine: Any,
        env: Environment,
        tasks: list[Task],
        clock: _GenClock,
        step: int,
    ) -> _Batch:
        """Rollouts for ``step``: one group per task, filtered and refilled as configured."""
        cfg = self.config
        gen_version = engine.gen_version
        t0 = time.perf_counter()
        clock.take()
        base_seed = cfg.sampling.seed
        groups: list[list[Rollout]] = []
        kept: list[list[Rollout]] = []
        rounds = 1 + (cfg.max_refill_rounds if cfg.dynamic_sampling == "refill" else 0)
        for r in range(rounds):
            # Round 0 is the step's own batch; refill rounds draw from a differently seeded
            # order, so they too depend only on (seed, step, round).
            batch_tasks = batch_for_step(tasks, step, cfg.tasks_per_step, cfg.seed + 7919 * r)
            seed = None if base_seed is None else base_seed + cfg.seed * 1_000_003 + step * 101 + r
            sampling = cfg.sampling.model_copy(update={"n": cfg.group_size, "seed": seed})
            got = await env.rollout(batch_tasks, clock, sampling)
            for task, g in zip(batch_tasks, got, strict=True):
                if len(g) != cfg.group_size:
                    raise PolicyError(
                        f"the harness returned {len(g)} rollouts for task {task.id!r}, "
                        f"expected group_size = {cfg.group_size}"
                    )
            groups += got
            for g in got:
                if cfg.dynamic_sampling == "off" or len({x.reward for x in g}) > 1:
                    kept.append(g)
            if cfg.dynamic_sampling != "refill" or len(kept) >= cfg.tasks_per_step:
                break
        kept = kept[: cfg.tasks_per_step] if cfg.dynamic_sampling == "refill" else kept
        t_rollout = time.perf_counter() - t0
        samples = engine.make_samples(kept)
        return _Batch(
            step=step,
            groups=groups,
            kept=kept,
            samples=samples,
            version=gen_version,
            t_rollout=t_rollout,
            t_generate=clock.take(),
        )

    def _metrics_row(
        self,
        engine: Any,
        batch: _Batch,
        train: dict[str, Any],
        t0: float,
        t1: float,
        t2: float,
    ) -> dict[str, Any]:
        own = [r for g in batch.groups[: self.config.tasks_per_step] for r in g]
        rewards = [r.reward for r in own]
        verdicts = [r.verdict for r in own if r.verdict is not None]
        advs = [s.adv for s in batch.samples]
        model_tokens = sum(sum(s.mask) for s in batch.samples)
        gen_tokens = sum(
            sum(len(t.completion_ids) for t in r.turns) for g in batch.groups for r in g
        )
        step_time = t2 - t0
        return {
            "step": engine.step,
            "reward_mean": _mean(rewards),
            "reward_std": _std(rewards),
            # a rollout without a Verdict (no proof extracted) counts as not accepted
            "pass_rate": (sum(v.accepted for v in verdicts) / len(own) if verdicts else None),
            "pass_at_group": (
                _mean(
                    [
                        float(any(r.verdict is not None and r.verdict.accepted for r in g))
                        for g in batch.groups[: self.config.tasks_per_step]
                    ]
                )
                if verdicts
                else None
            ),
            "groups": len(batch.groups),
            "groups_kept": len(batch.kept),
            "adv_mean": _mean(advs),
            "adv_std": _std(advs),
            "adv_min": min(advs) if advs else None,
            "adv_max": max(advs) if advs else None,
            "truncated_frac": _mean([float(r.truncated) for r in own]),
            # model tokens per rollout, all turns together
            "completion_len": _mean([sum(len(t.completion_ids) for t in r.turns) for r in own]),
            "loss_tokens": model_tokens,
            "staleness": engine.step - 1 - batch.version,
            **train,
            "tokens_per_s": gen_tokens / step_time if step_time > 0 else None,
            "time_step": step_time,
            "time_generate": batch.t_generate,
            "time_verify": max(batch.t_rollout - batch.t_generate, 0.0),
            "time_wait": (t1 - t0) if self.config.async_generation else 0.0,
            "time_train": t2 - t1,
        }


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _std(xs: list[float]) -> float | None:
    if len(xs) < 2:
        return 0.0 if xs else None
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def train_grpo(config: GRPOConfig, env: Environment | None = None) -> list[dict[str, Any]]:
    """Train with GRPO (blocking); returns the metrics rows. ``GRPOTrainer(...).train_sync()``."""
    return GRPOTrainer(config, env).train_sync()
