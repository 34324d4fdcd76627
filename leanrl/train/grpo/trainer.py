"""GRPO: group-relative policy optimisation on any leanrl Environment.

One step, top to bottom (``GRPOTrainer._train_loop``):

1. **Tasks.** ``batch_for_step(tasks, step, tasks_per_step, seed)``: B tasks, the same batches
   whatever happens (resume included). With ``curriculum.mode`` set, the tasks are chosen by
   difficulty instead (:mod:`leanrl.train.curriculum`), as repeatably. With ``envs`` (several
   environments in one run), each task is drawn from an environment chosen by weight, in that
   environment's own epoch order (:mod:`leanrl.train.multienv`).
2. **Rollouts.** ``env.rollout(tasks, policy, sampling(n=G))``: G attempts per task through the
   harness (whole-proof, tactic-loop, self-correction), verified by the runtime, rewarded by the
   taskset. Each rollout carries the token ids of the prompt, of the model's turns (loss mask 1) and of the
   environment's feedback (loss mask 0), and the behaviour policy's log-prob of every model token.
3. **Advantages.** Per group i of rewards r_i1..r_iG: ``A_ij = (r_ij - mean_i) / (std_i + 1e-4)``
   (``scale_rewards = "group"``; ``"batch"`` uses the std of every reward sampled this step,
   dropped groups included; ``"none"`` no division, the default with ``dr_grpo``). Every token
   of rollout j gets A_ij. Groups with all-equal rewards have A = 0 and carry no signal;
   ``dynamic_sampling`` drops them and refills the batch with new groups (bounded rounds).
   Variants (``advantage``; :mod:`leanrl.train.grpo.advantages`): ``pass_at_k`` (PKPO) sets
   ``A_ij = r̃_ij - b_ij``, with ``r̃_ij = n/(k·C(n,k)) · Σ_{S ∋ j, |S| = k} max_{l∈S} r_il`` (so
   ``mean_j r̃_ij`` is the unbiased max@k / pass@k estimate of group i) and ``b_ij`` the
   max@(k-1) (``loo_minus_one``) or max@k (``loo``) estimate from the group's other n - 1
   attempts, or 0 (``none``); then divided by the std of the group's A (``scale_rewards =
   "group"``) or of the batch's (``"batch"``). ``unlikeliness`` replaces r_ij by
   ``r_ij · (1 - β_rank · rank_ij / n)`` (rank 0 = lowest mean sampler log-prob of the group)
   before the formula above.

   **On-policy distillation** (``distill.teacher``; issue 40, :mod:`leanrl.train.distill`): a
   teacher π_T scores every token of the kept sequences (in process through its tiled head, or
   a server's prompt log-probs) and each model token gets its own advantage::

       A_jt = A_j - λ · (log μ(o_t | ctx) - log π_T(o_t | ctx))        λ = distill.coef

   with μ the sampler's log-prob (the rollout's): the one-sample estimate of the reverse KL
   ``KL(μ || π_T)`` at the token, fixed for the batch. ``distill.only`` sets A_j = 0 (the
   reverse KL alone; every group is kept). Environment tokens (mask 0) carry no KL. A_jt then
   stands for A_j in the loss below, token by token. In a mixed run (``envs``) a sequence's
   teacher is its environment's expert (``distill.experts``), else ``distill.teacher``.
4. **Loss.** For each model token t of sequence j, with ``ρ_t = π_θ(o_t | ctx) / μ(o_t | ctx)``
   where μ is the *behaviour* policy that sampled the token (its log-probs come with the rollout)::

       l_t = -min(ρ_t · A_j, clip(ρ_t, 1 - eps_low, 1 + eps_high) · A_j)  +  β · KL3_t
       KL3_t = exp(log π_ref - log π_θ) - (log π_ref - log π_θ) - 1          (only if β > 0)

   With dual clip c (async, ``max_staleness > 1``), ``l_t = min(l_t, c·|A_j|)`` where A_j < 0.

   Objective variants (issue 25; :func:`leanrl.train.grpo.loss.policy_loss`), each off by
   default. With ``m_t`` the loss mask and ``|o_j| = Σ_t m_t``:

   - ``importance_sampling_level = "sequence"`` (GSPO): every ρ_t of sequence j is
     ``s_j = exp(1/|o_j| · Σ_t m_t (log π_θ(o_t) - log μ(o_t)))``, gradient through the mean;
     the clip and dual clip act on s_j.
   - ``loss = "cispo"`` (CISPO), in place of the clipped surrogate, ρ_t per the level above
     (sg: no gradient)::

       l_t = -sg(clip(ρ_t, cispo_min, cispo_max)) · A_j · log π_θ(o_t)

   - ``is_correction`` (truncated / masked IS for the sampler-trainer mismatch): π_old, a
     no-grad forward of the weights before the first pass, replaces μ in ρ, and each token's
     policy loss is multiplied by ``w_t = sg(π_old(o_t) / μ(o_t))`` (``token_*``) or
     ``w_j = sg(Π_t (π_old / μ)^{m_t})`` (``sequence_*``), then ``min(w, is_cap)``
     (``*_truncate``) or ``w · 1[is_floor ≤ w ≤ is_cap]`` (``*_mask``). The KL term is not
     weighted.

   aggregated over the mini-batch's M sequences with |o_j| loss tokens each:

       grpo:     J = 1/M · Σ_j 1/|o_j| · Σ_t l_t          (DeepSeekMath eq. 3)
       dapo:     J = 1/Σ_j|o_j| · Σ_j Σ_t l_t             (DAPO eq. 8, the default)
       dr_grpo:  J = 1/(M · L) · Σ_j Σ_t l_t, L = norm_len (Dr. GRPO; constant, no length bias)

   Environment tokens and (with ``mask_truncated``) every token of a rollout whose final
   outcome is truncated (last turn cut off, or Verdict ``truncated``) have mask 0: they are in the context but carry no loss and do not count in the denominators.
5. **Update.** ``ppo_epochs`` passes over the batch; each pass is shuffled and cut into
   ``minibatches`` optimizer steps; each mini-batch is cut into micro-batches of
   ``micro_batch_size`` sequences whose gradients accumulate (the denominators are the whole
   mini-batch's, so accumulation is exact). Gradient clipping at ``max_grad_norm``, AdamW, and a
   learning-rate schedule stepped once per trainer step. With ``stream_training`` (one pass of
   one mini-batch; :mod:`leanrl.train.grpo.streamed`) each group's micro-batches run as soon
   as the harness reports the group checked, with denominators 1, and the accumulated gradient
   is divided by the batch's denominator before the clip: the same update, in task order.

Where this departs from the papers, and why:

- ρ is taken against the sampling policy's own log-probs (from the generation backend), not
  against a recomputed forward pass of the same weights. On the first pass with fresh rollouts
  ρ ≈ 1, and it also corrects the small numeric mismatch between the generation kernels and the
  training forward. ``old_logprobs = "recompute"`` gives the paper's π_θ_old instead.
- The loss forward runs with dropout off (``disable_dropout``), as the sampler does.
- The log-probs use ``logits / temperature`` on both sides. Top-p truncation is invisible to the
  trainer, so the default sampling here has ``top_p = 1`` (DAPO does the same).
- DeepSeekMath puts the KL in the loss with β = 0.04; the default here is β = 0 (DAPO and
  Dr. GRPO drop it). With β > 0 the reference is the starting model, frozen.
- Rewards of truncated rollouts still count in their group's mean and std (they are real
  attempts); only their tokens leave the loss (DAPO's overlong filtering).

**Asynchronous mode** (``async_generation = true``; ``auto``, the default, turns it on for
``vllm`` and a vLLM server in one process: ``resolve_async_generation``). The rollouts of step s+1 are generated while
step s trains. Let v be the number of optimizer *trainer steps* applied to the weights. Batch s
is generated with weights of version ``v_s = max(s - max_staleness, start)`` and trained on at
version s (:mod:`leanrl.train.grpo.pipeline`: the update of step ``v_s`` waits until the
generation weights for batch s were taken, so the versions do not depend on timing). Before a
batch is generated the generation weights are refreshed to that version (in place: a copy of
the parameters for ``hf``, a ``load_weights`` push for ``vllm``). The tokens come from μ =
π_{v_s}, the stale policy that really produced them (its log-probs come with the rollout). The
default objective is then decoupled PPO (``is_correction = "auto"`` resolves to
``token_truncate``): ρ = π_θ/π_old with π_old the weights at the step's start (the loss
forward's own log-probs with one pass of one mini-batch), so the clip bounds the update around
the weights being trained, and each token's loss is weighted by ``min(π_old/μ, is_cap)``. With
``is_correction = "off"`` ρ is against μ and the clip is around μ, as in PPO with off-policy
data; where one update moves token probabilities past 1 ± eps, that clip zeroes the gradient of
every token the last update already moved in its advantage's direction, and the pipeline learns
at half speed or less (issue 38). ``hf`` keeps a second copy of the
model for generation in async mode (double the weight memory). Async runs repeat exactly; a
resumed async run restarts its pipeline from the checkpoint weights (its first batches less
stale), so it is repeatable but not identical to an uninterrupted one; synchronous CPU runs
resume exactly (``async_generation = false`` is the deterministic replay of a run).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import time
from typing import Any

from leanrl._dist import install_hint
from leanrl.decontam import save_taskset_report
from leanrl.environment import Environment
from leanrl.errors import ConfigError, PolicyError
from leanrl.harness import listen_for_groups
from leanrl.policy import Policy, SamplingConfig
from leanrl.proofs import PROOFS_FILE, ProofStore, completion_cap
from leanrl.rollout import Rollout, check_rewards
from leanrl.task import Task
from leanrl.train.common import (
    MetricsLogger,
    RunDir,
    batch_for_step,
    check_model_path,
    check_runtimes,
    runtime_metrics,
)
from leanrl.train.curriculum import Curriculum, rollout_outcomes
from leanrl.train.distill.onpolicy import OnPolicyDistill, open_distill
from leanrl.train.distill.onpolicy import prepare as prepare_distill
from leanrl.train.grpo.clock import GenClock, clock_for
from leanrl.train.grpo.config import GRPOConfig, resolve_async_generation, torchrun_ranks
from leanrl.train.grpo.data import _Batch, ends_truncated
from leanrl.train.grpo.overlap import chunked_rollout
from leanrl.train.grpo.pipeline import Pipeline
from leanrl.train.grpo.replay import REPLAY_FOLDER, Replayer, check_replay, is_replay
from leanrl.train.grpo.report import (
    _CUT_OFF,
    _informative,
    _mean,
    _NoLog,
    _skip_reason,
    _std,
    _step_line,
)
from leanrl.train.grpo.streamed import GroupStream, StepSums, resolve_stream_training
from leanrl.train.infra import infra_metrics, warn_if_mostly_infra
from leanrl.train.multienv import (
    env_batch,
    evaluate_mixed,
    load_training_environment,
    mixed_metrics,
)
from leanrl.train.shaping import check_shaping, shape_groups, shaping_metrics

__all__ = ["GRPOConfig", "GRPOTrainer", "ends_truncated", "train_grpo"]

log = logging.getLogger("leanrl.train.grpo")


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
    RESUMABLE = (
        "steps",
        "out",
        "log_to",
        "run_name",
        "keep_checkpoints",
        "save_every",
        "distributed",
        "vllm_server",
        # how the loss is computed, not what: a run that ran out of memory resumes with tiles
        "logprob_chunk",
        "logprob_vocab_tile",
        "sort_micro_batches",
        "eval",
        # the checkpoint holds all either mode needs, an async run restarts its pipeline from
        # it anyway, and `auto` depends on the ranks (which may change): see _resolve_async
        "async_generation",
        # when each group's gradient is computed, not what it is (float rounding aside)
        "stream_training",
    )

    def __init__(self, config: GRPOConfig, env: Environment | None = None) -> None:
        self.config = config
        self.env = env
        self.run = RunDir(config.out)
        self._warned_top_p = False
        self._replay: Replayer | None = None  # failure replay (issue 25): opened lazily
        self._curriculum: Curriculum | None = None  # set when the run starts (after the load)
        self._distill: OnPolicyDistill | None = None  # issue 40: the teachers, after the load
        self._stream_on = False  # stream_training, resolved when the run starts
        self._kept = ProofStore(
            self.run.path / PROOFS_FILE,
            completion_chars=completion_cap(config.env.taskset.policy.max_proof_chars),
        )
        from leanrl.train.budget import BudgetTracker
        from leanrl.train.run_costs import RunCosts

        self._costs = RunCosts(config.launcher)
        self._budget = BudgetTracker(config.budget)

    def check(self) -> None:
        """Cheap checks before anything is loaded (clear :class:`ConfigError` s)."""
        cfg = self.config
        check_model_path(cfg.policy.model)
        # issue 40: every teacher resolved, its tokenizer checked against the student's and its
        # revision written into the config (config.json records it; a changed one is refused)
        self.config = cfg = prepare_distill(cfg, self.run.path)
        from leanrl.train.grpo.engine import device_and_precision

        device, _ = device_and_precision(cfg)
        backend = cfg.policy.backend
        from leanrl.train.vllm_server import check_sync_config

        check_sync_config(cfg.vllm_server, cfg.policy)
        if backend not in ("hf", "vllm") and not cfg.vllm_server.enabled:
            raise ConfigError(
                f"GRPO cannot train through the {backend!r} backend (it cannot receive new "
                "weights); use --policy.backend hf or vllm, or a vLLM server (--policy.backend "
                "openai with --vllm_server.transport nccl, gloo or disk)"
            )
        _check_ranks(cfg)
        if backend == "vllm":
            if importlib.util.find_spec("vllm") is None:
                raise ConfigError(
                    f"policy.backend is 'vllm' but vLLM is not installed: {install_hint('vllm')} "
                    "(on a machine with an NVIDIA GPU), or use --policy.backend hf"
                )
            if device.type != "cuda":
                raise ConfigError(
                    "policy.backend 'vllm' needs a CUDA device (vLLM generates on the GPU "
                    "next to the model being trained); use --policy.backend hf on the CPU"
                )
        if cfg.sampling.top_p < 1.0 and not self._warned_top_p:
            self._warned_top_p = True
            log.warning(
                "sampling.top_p = %s < 1: the sampler's log-probs are of the untruncated "
                "distribution, so the importance ratio does not match what was sampled "
                "(biased updates); GRPO normally samples with top_p = 1",
                cfg.sampling.top_p,
            )
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
        self._resolve_async()
        from leanrl.train.distributed import World
        from leanrl.train.grpo.engine import GRPOEngine, device_and_precision

        # torchrun: every rank runs this; rank 0 alone writes the run folder
        world = World.from_env(self.config.distributed, device_and_precision(self.config)[0].type)
        self._world = world
        stream = resolve_stream_training(self.config, world.size)  # refused here if it can't
        self._stream_on = stream.on
        if world.is_main:
            log.info(stream.line())
        engine = GRPOEngine(self.config, self.run, world)
        env = self.env or load_training_environment(self.config)  # `envs`: a mixed one
        gen: Policy | None = None
        rows: list[dict[str, Any]] = []
        logger: Any = _NoLog()
        self.run.lock("GRPO run", writer=world.is_main)  # before anything (finally) writes
        failed = True  # until the loop ends: the `finally` must not hide the run's own error
        try:
            # The tasks load before the model: a bad taskset fails in seconds, not after a load.
            tasks = await asyncio.to_thread(env.tasks)
            batch_for_step(tasks, 0, 1, self.config.seed)  # an empty taskset fails here, clearly
            self.config.eval.check_held_out(t.name for t in tasks)
            env.check_parts()  # e.g. a tactic loop on one-shot Lean: refused before the load
            check_replay(self.config.replay, env, world.distributed)  # whole-proof only
            check_shaping(self.config.format_reward, env.harness.name)
            self._replay = None  # a retried train() re-reads the buffer of its start step
            # no Lean project, REPL or sandbox here: the runtime's own error, in seconds
            await asyncio.to_thread(check_runtimes, env, self.config.eval)
            resumed = False
            if world.is_main:
                self._forget_failed_start()
                resumed = self.run.bind_config(self.config, ignore=self.RESUMABLE)
                save_taskset_report(env.taskset, self.run.path)  # what decontamination dropped
                # proofs.jsonl is read now, not at the first kept proof after the model loads:
                # a damaged line is moved aside (or a disk error raised) in seconds
                await asyncio.to_thread(self._kept.open)
            resumed = world.broadcast(resumed)
            # The runtime starts before the model loads, as `leanrl eval` does: what the
            # preflight cannot see (a Docker daemon, a Modal sandbox) also fails first.
            async with env:
                await asyncio.to_thread(engine.load, resumed)
                # on-policy distillation: the teachers, on the student's device (None: off)
                self._distill = await asyncio.to_thread(
                    open_distill, self.config, env, engine.device
                )
                # the difficulty table as of the step the run resumes at (curriculum.mode)
                self._curriculum = Curriculum.open(
                    self.config.curriculum,
                    tasks,
                    self.run.path,
                    before=engine.step,
                    writer=world.is_main,
                )
                from leanrl.train.grpo.engine import device_and_precision

                # every rank holds one GPU; rank 0's rows count them all
                self._costs.start(self.run, str(device_and_precision(self.config)[0]), world.size)
                self._budget.resume(self.run.metrics())
                if world.is_main:
                    logger = MetricsLogger(
                        self.run,
                        self.config.log_to,
                        self.config.run_name,
                        self.config.model_dump(mode="json"),
                    )
                logger.start()
                gen = await engine.make_generation_policy()
                clock = clock_for(gen)
                await self._train_loop(engine, env, tasks, clock, logger, rows)
            failed = False
        finally:
            logger.close()
            if gen is not None:
                await gen.close()
            if self._distill is not None:
                await self._distill.close()
            engine.close()
            if world.is_main:
                try:
                    self.run.plot(title=f"GRPO reward ({self.run.path.name})")
                    from leanrl.train.inrun_eval import plot_eval

                    plot_eval(self.run)
                    self._costs.write_summary(self.run, "grpo", self._budget.summary())
                except OSError as e:
                    if not failed:
                        raise
                    # The run already failed (a read-only or full --out, say): its own error is
                    # the one to show, not a second traceback from the plot.
                    log.warning("could not write the plot and summary in %s: %s", self.run.path, e)
            world.close()
            self.run.unlock()  # after the last write (the plot and summary above)
        return rows

    def _resolve_async(self) -> None:
        """Write ``async_generation`` resolved into the config (the engine, the loop and
        ``config.json`` see a plain bool) and log which and why. ``auto`` resuming a run folder
        that holds a run keeps the mode it recorded (old folders stored ``false``)."""
        cfg_file, stored = self.run.path / "config.json", None
        if self.config.async_generation == "auto" and cfg_file.is_file():
            if self.run.checkpoints() or self.run.metrics():  # else a failed start: no run
                try:
                    old = json.loads(cfg_file.read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    old = None  # bind_config reports a damaged file, with the fix
                got = old.get("async_generation") if isinstance(old, dict) else None
                stored = got if isinstance(got, bool) else None
        choice = resolve_async_generation(self.config, torchrun_ranks(), stored)
        self.config = self.config.model_copy(update={"async_generation": choice.on})
        if int(os.environ.get("RANK", "0")) == 0:
            log.info(choice.line())

    def _spent(self) -> bool:
        """Whether the run's budget is used up (every rank agrees: rank 0 decides)."""
        spent = self._budget.spent
        world = getattr(self, "_world", None)
        if world is not None and world.distributed:
            spent = bool(world.broadcast(spent))
        return spent

    def _forget_failed_start(self) -> None:
        """A folder with a config but no checkpoint and no metrics line holds no run: a start
        that failed before its first step (a model that did not load, a backend error). Its
        config binds nothing, so a corrected rerun may start there afresh."""
        cfg_file = self.run.path / "config.json"
        if cfg_file.is_file() and not self.run.checkpoints() and not self.run.metrics():
            cfg_file.unlink()

    # -- the loop --------------------------------------------------------------------------------

    async def _train_loop(
        self,
        engine: Any,
        env: Environment,
        tasks: list[Task],
        clock: GenClock,
        logger: MetricsLogger,
        rows: list[dict[str, Any]],
    ) -> None:
        cfg = self.config
        start = engine.step
        if self._spent():  # a resumed run whose budget is used up (it may be raised on resume)
            if self._is_main():
                log.info(self._budget.spent_line(start, already=True))
            return
        if start >= cfg.steps:
            return
        due = cfg.eval.baseline_due(self.run.metrics()) if self._is_main() else False
        world = getattr(self, "_world", None)
        if world is not None:
            due = world.broadcast(due)  # rank 0 read the metrics; every rank must agree
        if start == 0 and due:  # the starting weights
            row0 = {"step": 0, **await self._evaluate(engine, 0)}
            logger.log(row0)
            rows.append(row0)

        async def collect(step: int) -> _Batch:
            return await self._collect(engine, env, tasks, clock, step)

        lag = cfg.max_staleness if cfg.async_mode else None
        async with Pipeline(engine, collect, start, cfg.steps, lag) as pipeline:
            for step in range(start, cfg.steps):
                t0 = time.perf_counter()
                batch = await pipeline.batch(step)
                t1 = time.perf_counter()
                train_stats = await pipeline.train(batch)
                t2 = time.perf_counter()
                row = self._metrics_row(engine, batch, train_stats, t0, t1, t2)
                if self._curriculum is not None:  # pool sizes the step's tasks came from
                    row.update(self._curriculum.metrics(batch.step))
                row.update(runtime_metrics(env))  # Lean pool counters, sandbox/CPU-seconds
                if self._distill is not None:  # reverse KL per token, its share of the advantage
                    row.update(self._distill.metrics(batch.step))
                row.update(mixed_metrics(env, batch.groups[: cfg.tasks_per_step]))  # per env
                row.update(self._costs.row(env))  # GPU-s, sandbox-s and $ (step and total)
                self._budget.update(row)
                spent = self._spent()
                if cfg.eval.due(engine.step, cfg.steps) or (cfg.eval.every and spent):
                    row.update(await self._evaluate(engine, engine.step))
                logger.log(row)
                # a step that learned nothing because of the config is worth a warning
                level = logging.WARNING if row.get("skip_reason") in _CUT_OFF else logging.INFO
                why = self._skip_text(row, batch) if row.get("skipped") else ""
                counter = self._budget.counter(row["step"], cfg.steps)
                log.log(level, _step_line(row, counter, why))
                if self._is_main():
                    warn_if_mostly_infra(row, log)
                rows.append(row)
                done = engine.step
                if done % cfg.save_every == 0 or done == cfg.steps or spent:
                    await asyncio.to_thread(engine.save_checkpoint, row)
                if spent:  # the budget (tokens or GPU-seconds) is used up
                    if self._is_main():
                        log.info(self._budget.spent_line(done))
                    break

    async def _collect(
        self,
        engine: Any,
        env: Environment,
        tasks: list[Task],
        clock: GenClock,
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
        # failure replay (issue 25): revisions of stored failures, in the place of the last
        # tasks of round 0; informative ones count toward `tasks_per_step` like any group
        replayed = await self._replay_groups(engine, env, tasks, clock, step)
        kept += [g for g in replayed if _informative(g, cfg.dynamic_sampling)]
        drawn: list[Task] = []  # every round's tasks, in the order of `groups`
        sums: StepSums | None = None  # stream_training: the step's gradient sums
        rounds = 1 + (cfg.max_refill_rounds if cfg.dynamic_sampling == "refill" else 0)
        for r in range(rounds):
            # Round 0 is the step's own batch; refill rounds draw from a differently seeded
            # order, so they too depend only on (seed, step, round).
            r_seed = cfg.seed + 7919 * r
            batch_tasks = (
                self._curriculum.select(step, cfg.tasks_per_step, r_seed)
                if self._curriculum is not None
                else env_batch(env, tasks, step, cfg.tasks_per_step, r_seed)  # by weight if mixed
            )
            if r == 0 and replayed:
                batch_tasks = batch_tasks[: cfg.tasks_per_step - len(replayed)]
            seed = None if base_seed is None else base_seed + cfg.seed * 1_000_003 + step * 101 + r
            sampling = cfg.sampling.model_copy(update={"n": cfg.group_size, "seed": seed})
            label = f"step {step + 1}" + (f" (refill round {r})" if r else "")
            if self._stream_on:  # each group trained as the harness reports it (streamed.py)
                sums = sums or StepSums()  # the step's, over its refill rounds
                room = cfg.tasks_per_step - len(kept) if cfg.dynamic_sampling == "refill" else None
                stream = GroupStream(engine, cfg, label, batch_tasks, sums, room)
                stream.start()
                try:
                    with listen_for_groups(stream.listener):  # the rollout's tasks inherit it
                        rollout = self._rollout(env, batch_tasks, clock, sampling)
                        got = await stream.guard(rollout)  # a failed group pass fails it now
                    await stream.finish(got)  # checks and shapes each group, as below
                finally:
                    await stream.cancel()
            else:
                got = await self._rollout(env, batch_tasks, clock, sampling)
                # Before anything uses a reward: one NaN makes every advantage, then every
                # weight, NaN (and the run would end "successfully" with a NaN checkpoint).
                check_rewards(
                    (x for g in got for x in g), label, "a NaN or inf would make every weight NaN"
                )
                shape_groups(got, cfg.format_reward, cfg.overlong, cfg.sampling.max_tokens)
            if self._is_main():  # every rank has the gathered groups; rank 0 keeps the proofs
                self._kept.add_rollouts(
                    batch_tasks,
                    (x for g in got for x in g),
                    source="grpo",
                    model=cfg.policy.model,
                    step=gen_version,
                )
            for task, g in zip(batch_tasks, got, strict=True):
                if len(g) != cfg.group_size:
                    raise PolicyError(
                        f"the harness returned {len(g)} rollouts for task {task.id!r}, "
                        f"expected group_size = {cfg.group_size}"
                    )
            groups += got
            drawn += batch_tasks
            # informative: two judged outcomes that differ (infra ones are no outcome)
            kept += [g for g in got if _informative(g, cfg.dynamic_sampling)]
            if cfg.dynamic_sampling != "refill" or len(kept) >= cfg.tasks_per_step:
                break
        kept = kept[: cfg.tasks_per_step] if cfg.dynamic_sampling == "refill" else kept
        if self._curriculum is not None:  # every judged attempt, refills too (replaces a redo)
            self._curriculum.record(step, rollout_outcomes(drawn, groups))
        if self._replay is not None:
            groups = replayed + groups  # first, so batch.groups[:tasks_per_step] is round 0
            # the buffer of step + 1, written with every checkpointed step's kept
            keep = {s for s, _ in self.run.checkpoints()} if self._is_main() else None
            self._replay.store(step, groups, keep)
        t_rollout = time.perf_counter() - t0
        # scale_rewards = "batch": the std of everything sampled, before groups were dropped
        batch_rewards = [r.reward for g in groups for r in g if not r.infra]
        if sums is not None:  # trained on already, in this order (the streams kept `kept`)
            samples = sums.made
        else:
            samples = engine.make_samples(kept, batch_rewards)
        if self._distill is not None:  # issue 40: the teacher scores every model token
            await self._distill.apply(step, samples)
        return _Batch(
            step=step,
            groups=groups,
            kept=kept,
            samples=samples,
            version=gen_version,
            t_rollout=t_rollout,
            t_generate=clock.take(),
            streamed=sums,
        )

    async def _replay_groups(
        self, engine: Any, env: Environment, tasks: list[Task], clock: GenClock, step: int
    ) -> list[list[Rollout]]:
        """This step's replay groups (``replay``; empty when off), checked and shaped."""
        cfg = self.config
        if not cfg.replay.enabled:
            return []
        if self._replay is None:  # the buffer as of the step the run (re)starts at
            self._replay = Replayer(cfg, self.run.path / REPLAY_FOLDER, step)
        got = await self._replay.rollouts(step, env, tasks, clock)
        check_rewards((x for g in got for x in g), f"step {step + 1} (failure replay)",
                      "a NaN or inf would make every weight NaN")  # fmt: skip
        shape_groups(got, cfg.format_reward, cfg.overlong, cfg.sampling.max_tokens)
        if self._is_main():
            self._kept.add_rollouts(tasks, (x for g in got for x in g), source="grpo-replay",
                                    model=cfg.policy.model, step=engine.gen_version)  # fmt: skip
        return got

    async def _evaluate(self, engine: Any, step: int) -> dict[str, Any]:
        """The in-run held-out evaluation of the weights being trained (``eval``).

        With several ranks, rank 0 evaluates (on its replica, on the full generation copy under
        FSDP, or through the vLLM server after a push) and every rank gets its figures."""
        from leanrl.train.inrun_eval import evaluate

        world = getattr(self, "_world", None)
        if world is None or not world.distributed:
            # The step has finished: nothing writes the weights while they are evaluated.
            # a mixed run evaluates each environment's held-out set (issue 40)
            return await evaluate_mixed(self.config, step, self.run, engine.model, engine.tokenizer)
        await asyncio.to_thread(engine.sync_generation_weights)  # every rank: FSDP gathers
        row: dict[str, Any] = {}
        if world.is_main:
            server = engine.gen_policy if self.config.vllm_server.enabled else None
            model = engine.gen_model if engine.gen_model is not None else engine.model
            if server is None and engine.strategy == "fsdp" and engine.gen_model is None:
                raise ConfigError("in-run eval under FSDP needs the hf backend or a vLLM server")
            row = await evaluate(
                self.config.eval,
                step,
                self.run,
                model,
                engine.tokenizer,
                self.config.policy,
                live=server,
            )
        return world.broadcast(row)

    def _skip_text(self, row: dict[str, Any], batch: _Batch) -> str:
        """Why a step trained on nothing, and, where the config is the cause, what to change."""
        reason = row.get("skip_reason")
        cfg = self.config
        judged = [r for g in batch.groups for r in g if not r.infra]
        if all(r.turns and r.turns[-1].finish_reason == "length" for r in judged):
            cut = f"hit sampling.max_tokens = {cfg.sampling.max_tokens}"
            fix = "raise --sampling.max-tokens"
        else:  # a multi-turn episode can also run out of its total token budget
            cut = (
                f"was cut off (sampling.max_tokens = {cfg.sampling.max_tokens} per turn, "
                f"env.harness.max_total_tokens = {cfg.env.harness.max_total_tokens} per episode)"
            )
            fix = "raise --sampling.max-tokens or --env.harness.max-total-tokens"
        if reason in _CUT_OFF:
            who = "every attempt" if reason == "all_truncated" else "every informative attempt"
            return f"{who} {cut} and was masked (mask_truncated): {fix} or pass --no-mask-truncated"
        if reason == "no_informative_group":
            alike = "no informative group: every group's attempts scored alike"
            if judged and all(ends_truncated(r) for r in judged):
                return f"{alike}, and every attempt {cut}: {fix}"
            return alike
        if reason == "all_infra":
            return "no attempt could be judged (all infra)"
        return "no model tokens to train on"

    def _is_main(self) -> bool:
        world = getattr(self, "_world", None)
        return world is None or world.is_main

    async def _rollout(
        self, env: Environment, tasks: list[Task], policy: Policy, sampling: SamplingConfig
    ) -> list[list[Rollout]]:
        """One group per task. With several ranks each rank rolls out its round-robin share of
        the tasks (its own policy, harness and Lean runtime) and the groups are gathered, in task
        order, on every rank: advantages, dynamic sampling and metrics then see the whole step,
        and every rank holds the same batch."""
        world = getattr(self, "_world", None)
        if world is None or not world.distributed:
            # chunk j+1 generates while chunk j's attempts are checked (rollout_chunks > 1)
            return await chunked_rollout(env, tasks, policy, sampling, self.config.rollout_chunks)
        from leanrl.train.distributed import round_robin

        shares = round_robin(len(tasks), world.size)
        mine = [tasks[i] for i in shares[world.rank]]
        chunks = self.config.rollout_chunks
        got = await chunked_rollout(env, mine, policy, sampling, chunks) if mine else []
        out: list[list[Rollout]] = [[] for _ in tasks]
        for share, groups in zip(shares, world.all_gather(got), strict=True):
            for i, g in zip(share, groups, strict=True):
                out[i] = g
        return out

    def _metrics_row(
        self,
        engine: Any,
        batch: _Batch,
        train: dict[str, Any],
        t0: float,
        t1: float,
        t2: float,
    ) -> dict[str, Any]:
        # round 0's fresh groups (replay groups have their own columns)
        first = [g for g in batch.groups[: self.config.tasks_per_step] if not is_replay(g)]
        mine = [r for g in first for r in g]
        # the checker could not judge `infra` attempts: rewards and pass rates leave them out
        own = [r for r in mine if not r.infra]
        rewards = [r.reward for r in own]
        verdicts = [r.verdict for r in own if r.verdict is not None]
        every = [r for g in batch.groups for r in g]
        advs = [s.adv for s in batch.samples]
        model_tokens = sum(sum(s.mask) for s in batch.samples)
        gen_tokens = sum(
            sum(len(t.completion_ids) for t in r.turns) for g in batch.groups for r in g
        )
        step_time = t2 - t0
        streamed_s = float(train.get("time_train_streamed") or 0.0)
        return {
            "step": engine.step,
            "reward_mean": _mean(rewards),
            "reward_std": _std(rewards),
            # None when no attempt could be judged at all (every one an infrastructure fault),
            # or when the environment gives rewards but no verdicts (nothing passes or fails)
            "pass_rate": (sum(v.accepted for v in verdicts) / len(own) if verdicts else None),
            # every attempt sampled in the step (refills included)
            **infra_metrics(sum(r.infra for r in every), len(every)),
            "pass_at_group": (
                _mean(
                    [
                        float(any(r.verdict is not None and r.verdict.accepted for r in g))
                        for g in first
                        if not all(r.infra for r in g)  # nothing judged: no outcome
                    ]
                )
                if verdicts
                else None
            ),
            "groups": len(batch.groups),
            **shaping_metrics(batch.groups, self.config.format_reward, self.config.overlong),
            **(self._replay.metrics(batch.step, batch.groups) if self._replay is not None else {}),
            "groups_kept": len(batch.kept),
            "adv_mean": _mean(advs),
            "adv_std": _std(advs),
            "adv_min": min(advs) if advs else None,
            "adv_max": max(advs) if advs else None,
            "truncated_frac": _mean([float(ends_truncated(r)) for r in own]),
            # model tokens per rollout, all turns together
            "completion_len": _mean([sum(len(t.completion_ids) for t in r.turns) for r in own]),
            "loss_tokens": model_tokens,
            "staleness": engine.step - 1 - batch.version,
            **train,
            **(
                {"skip_reason": _skip_reason(batch, self.config.mask_truncated)}
                if train.get("skipped")
                else {}
            ),
            "tokens_per_s": gen_tokens / step_time if step_time > 0 else None,
            "tokens": gen_tokens,
            "time_step": step_time,
            "time_generate": batch.t_generate,
            "time_verify": max(batch.t_rollout - batch.t_generate, 0.0),
            "time_wait": (t1 - t0) if self.config.async_mode else 0.0,
            "time_train": t2 - t1,  # after the rollout (streamed: only the update)
            # share of the step the model neither generated nor trained (waited for Lean);
            # streamed group passes count as busy too, and where one overlapped generation it
            # is counted twice: then a lower bound
            "gpu_idle_frac": (
                max(0.0, 1.0 - (batch.t_generate + (t2 - t1) + streamed_s) / step_time)
                if step_time > 0 and not self.config.async_mode
                else None
            ),
        }


def _check_ranks(cfg: GRPOConfig) -> None:
    """What a torchrun launch (WORLD_SIZE > 1) cannot do yet, refused before anything loads."""
    ranks = int(os.environ.get("WORLD_SIZE", "1"))
    if ranks <= 1 and "TORCHELASTIC_RUN_ID" not in os.environ:  # not a torchrun launch
        return
    if cfg.async_generation is True:  # "auto" falls back to off (resolve_async_generation)
        raise ConfigError(
            f"async_generation with {ranks} ranks is not supported: the generation thread's "
            "collectives would interleave with training's. Use async_generation = false, or "
            "one process"
        )
    if cfg.policy.backend == "vllm":
        raise ConfigError(
            f"policy.backend 'vllm' (an engine inside each trainer process) with {ranks} ranks is "
            "not supported: run a vLLM server instead (--policy.backend openai "
            "--vllm_server.transport nccl; docs/training-grpo.md, 'vLLM server')"
        )


def train_grpo(config: GRPOConfig, env: Environment | None = None) -> list[dict[str, Any]]:
    """Train with GRPO (blocking); returns the metrics rows. ``GRPOTrainer(...).train_sync()``."""
    return GRPOTrainer(config, env).train_sync()
