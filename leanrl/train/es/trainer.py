"""Evolution strategies (ES) post-training on any leanrl Environment.

Following Qiu et al. 2025, "Evolution Strategies at Scale: LLM Fine-Tuning Beyond Reinforcement
Learning" (Algorithm 1). Per iteration t, with θ the fp32 master weights:

    seeds s_1..s_K drawn from (run seed, t)                 K = N, or N/2 with mirrored pairs
    members n = 1..N:  (s_n, +1)            (plain)      or (s_k, +1), (s_k, -1)  (mirrored)
    R_n  = mean reward of  cast(θ + sign_n·σ·ε(s_n))  on the batch, greedy decoding
    z_n  = (R_n - mean(R)) / std(R)                        (shaping = "zscore", population std)
         = zscore(centered_rank(R_n))                      (shaping = "rank")
    c_k  = f32( α/N · Σ_{n: s_n = s_k} sign_n·z_n )        one coefficient per seed
    θ   += Σ_k c_k · ε(s_k)                                 accumulated and applied in fp32

with ε(s) drawn tensor by tensor from a generator seeded by hash(s, tensor name). With
``perturbation = "lowrank"`` (EGGROLL, Sarkar et al. 2025) every weight matrix uses
``E(s) = A(s)·B(s)ᵀ/√r`` in place of ε(s), so its update Σ_k c_k·E(s_k) has rank ≤ N·r
(:mod:`leanrl.train.es.lowrank`; tensors that are not 2-D follow ``lowrank_other``). Note that,
as in the paper, σ is folded into α (the update is α·mean(z·ε), not α/σ·mean(z·ε)), so α = σ/2 is a
step of ~α/√N per coordinate.

Where this departs from the paper's reference code, and why:

- per-tensor noise streams keyed by the tensor *name* (not one stream walked layer by layer), so
  any tensor's noise can be drawn alone, in any order, on any worker;
- exact restore: the perturbed model is written from an untouched fp32 master and restored by
  re-casting it, instead of subtracting σε again (not exact in floating point);
- the update is accumulated in fp32 and applied to fp32 master weights (in bf16 a ~1e-5 step
  rounds to zero for most weights);
- when every member scores the same (common with binary Lean rewards), z is undefined: the
  update is skipped and the iteration logged with ``skipped = true``;
- options the paper does not use: mirrored (antithetic) pairs, rank shaping, several samples per
  task averaged into a member's reward;
- the coefficients are rounded to float32 *before* being applied, so the history (which stores
  float32) replays the live run bit for bit.

The run state is the base model + the history (``history.py``); full checkpoints every
``save_every`` iterations bound replay time. Members are scored through a
:class:`~leanrl.train.es.workers.MemberScorer` (in-process, local processes, or vLLM).
"""

from __future__ import annotations

import json
import logging
import math
import random
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from leanrl.decontam import save_taskset_report
from leanrl.environment import Environment, load_environment
from leanrl.errors import ConfigError
from leanrl.policy import SamplingConfig
from leanrl.proofs import PROOFS_FILE, ProofStore
from leanrl.rollout import REWARD_LIMIT
from leanrl.runtime import run_sync
from leanrl.train.common import (
    MetricsLogger,
    RunDir,
    batch_for_step,
    check_model_path,
    check_runtimes,
    resume_line,
    runtime_metrics,
)
from leanrl.train.curriculum import Curriculum
from leanrl.train.es.config import ESConfig, ESScorerConfig
from leanrl.train.es.history import (
    DIGEST_KEY,
    HISTORY_FILE,
    ESHistory,
    HistoryMeta,
    HistoryRecord,
    WeightsSource,
    check_perturbation,
    checkpoint_usable,
    device_kind,
    draw_seeds,
    f32,
    load_weights,
    verify_checkpoints,
)
from leanrl.train.es.lowrank import LowRankSpec
from leanrl.train.es.weights import MASTER_FILE
from leanrl.train.es.workers import (
    IterationState,
    Member,
    MemberScore,
    MemberScorer,
    ProcessPoolScorer,
    VLLMScorer,
)
from leanrl.train.infra import infra_metrics, warn_if_mostly_infra

__all__ = ["ESConfig", "ESScorerConfig", "ESTrainer", "es_coefficients", "shape_rewards"]

log = logging.getLogger("leanrl.train")

_ENGINE_TMP = ".tmp-es-engine-master-"
"""Prefix of the folder the vLLM scorer's master is saved to while a checkpoint is built."""


# -- the math --------------------------------------------------------------------------------------


def _centered_ranks(x: Sequence[float]) -> list[float]:
    order = sorted(range(len(x)), key=lambda i: x[i])
    ranks = [0.0] * len(x)
    i = 0
    while i < len(order):  # ties share the mean of their ranks
        j = i
        while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    n = len(x)
    return [r / (n - 1) - 0.5 for r in ranks]


def shape_rewards(rewards: Sequence[float], shaping: str = "zscore") -> list[float] | None:
    """Normalised rewards z (population std), or None when all rewards are equal (no signal).

    Raises ConfigError on a NaN or infinite reward: it would turn every coefficient, and so
    every weight, into NaN (or hide the signal: [0, -inf, 1] has no finite spread).
    """
    r = [float(v) for v in rewards]
    bad = [i for i, v in enumerate(r) if not math.isfinite(v)]
    if bad:
        raise ConfigError(
            f"non-finite member rewards {[r[i] for i in bad]} (members {bad}): the "
            "Environment must return finite rewards"
        )
    if max(r) - min(r) <= 1e-12 * max(1.0, max(abs(v) for v in r)):
        return None
    if shaping == "rank":
        r = _centered_ranks(r)
    elif shaping != "zscore":
        raise ConfigError(f"unknown shaping {shaping!r}: use 'zscore' or 'rank'")
    mean = sum(r) / len(r)
    std = (sum((v - mean) ** 2 for v in r) / len(r)) ** 0.5
    return [(v - mean) / std for v in r]


def es_coefficients(
    members: Sequence[Member], z: Sequence[float], alpha: float, n: int | None = None
) -> list[tuple[int, float]]:
    """c_k = f32(α/N · Σ_{n: seed_n = k} sign_n·z_n), one per distinct seed, in first-seen order.

    ``n``: the N of α/N, when fewer members than all were scored (default: all of them)."""
    n = len(members) if n is None else n
    acc: dict[int, float] = {}
    for m, zn in zip(members, z, strict=True):
        acc[m.seed] = acc.get(m.seed, 0.0) + m.sign * zn
    return [(s, f32(alpha / n * v)) for s, v in acc.items()]


def population(config: ESConfig, iteration: int) -> list[Member]:
    """The members of ``iteration``: a pure function of (seed, iteration), so resumes repeat it."""
    if config.mirrored:
        seeds = draw_seeds(config.seed, iteration, config.population // 2)
        return [Member(s, sign) for s in seeds for sign in (1, -1)]
    return [Member(s, 1) for s in draw_seeds(config.seed, iteration, config.population)]


# -- the trainer -----------------------------------------------------------------------------------


class ESTrainer:
    """Runs ES on an environment. ``await start()``, ``await train()``, ``await close()``
    (or :meth:`train_sync`). Rerunning on the same ``out`` folder resumes the run."""

    #: Fields that may change between a run and its resume (they do not change the weights).
    RESUMABLE = (
        "steps", "out", "scorer", "log_to", "run_name", "keep_checkpoints", "save_every", "eval",
    )  # fmt: skip

    #: Fields that config.json does not check on resume because the history's header does
    #: (:meth:`_check_perturbation_early`): a config.json written before they existed lacks them.
    HEADER_CHECKED = ("perturbation", "rank", "lowrank_other", "lowrank_targets")

    def __init__(
        self,
        config: ESConfig,
        env: Environment | None = None,
        scorer: MemberScorer | None = None,
    ) -> None:
        self.config = config
        self._env = env
        self._scorer = scorer
        # A remote scorer (launched functions) keeps the weights in its containers' engines.
        self._remote = bool(getattr(scorer, "remote_weights", False))
        self.run = RunDir(config.out)
        self.history = ESHistory(self.run.path / HISTORY_FILE)
        self.iteration = 0
        self._curriculum: Curriculum  # opened by start(), at the iteration the run resumes at
        self.model: Any = None
        self.tokenizer: Any = None
        self.weights: Any = None
        self._logger: MetricsLogger | None = None
        self._started = False
        self._kept = ProofStore(self.run.path / PROOFS_FILE)
        self.world: Any = None  # leanrl.train.distributed.World, set by start()
        from leanrl.train.run_costs import RunCosts

        self.costs = RunCosts(config.launcher)
        from leanrl.train.budget import BudgetTracker

        self.budget = BudgetTracker(config.budget)

    @property
    def env(self) -> Environment:
        if self._env is None:
            self._env = load_environment(self.config.env)
        return self._env

    @property
    def scorer(self) -> MemberScorer:
        if self._scorer is None:
            raise RuntimeError("call start() first")
        return self._scorer

    async def start(self) -> None:
        """Check the config, bind the run folder, rebuild the weights (resume), start scoring."""
        if self._started:
            return
        cfg = self.config
        check_model_path(cfg.policy.model)  # before anything heavy
        if cfg.eval.every and (cfg.scorer.backend == "vllm" or self._remote):
            raise ConfigError(
                "eval.every needs the weights in the trainer, but with scorer.backend 'vllm' "
                "they live in the engine: evaluate the checkpoints with leanrl eval instead"
            )
        # What a bad flag or a bare machine gets wrong fails here, before the folder is written.
        self.tasks = self.env.tasks()
        batch_for_step(self.tasks, 0, 1, cfg.seed)  # an empty taskset fails here, clearly
        cfg.eval.check_held_out(t.name for t in self.tasks)
        self.env.check_parts()  # e.g. a tactic loop on one-shot Lean: refused before loading
        # No Lean project, REPL or sandbox here: the runtime's own error, in seconds. The
        # runtime then starts before the weights load, as `leanrl eval` does, so what the
        # preflight cannot see (a Docker daemon, a Modal sandbox) fails first too.
        check_runtimes(self.env, cfg.eval)
        world = self._world()
        if world.is_main:  # torchrun: rank 0 alone writes the run folder
            self.run.lock("ES run")  # before anything is written: one run per folder
            self._forget_a_start_that_never_ran()
            self._check_perturbation_early()  # before config.json is rewritten
            self.run.bind_config(cfg, ignore=self.RESUMABLE + self.HEADER_CHECKED)
            for leftover in self.run.path.glob(f"{_ENGINE_TMP}*"):  # a kill mid-checkpoint
                shutil.rmtree(leftover, ignore_errors=True)
            records = self.history.open(self._meta())
        world.barrier()  # the history exists (and a torn tail is cut) before the others read it
        if not world.is_main:
            records = self.history.open(read_only=True)
        self._check_meta()
        verify_checkpoints(self.history, self.run)  # records changed since a checkpoint: refused
        self.iteration = len(records)
        # the difficulty table as of the iteration the run resumes at (curriculum.mode)
        self._curriculum = Curriculum.open(
            cfg.curriculum, self.tasks, self.run.path, before=self.iteration, writer=world.is_main
        )
        if world.is_main:
            save_taskset_report(self.env.taskset, self.run.path)  # what decontamination dropped
        await self.env.start()
        source = self._source()
        # Launched functions, worker processes and the vLLM engine rebuild θ from the source
        # checkpoint again (a checkpoint save, a new container or worker): it must outlive the
        # pruning. The in-process scorer holds θ itself and never reads it again.
        reads_again = self._remote or cfg.scorer.backend != "inprocess"
        if world.is_main:
            self.run.pin(Path(source.checkpoint) if source.checkpoint and reads_again else None)
        if self.iteration and world.is_main:
            log.info(_resume_line(source, self.iteration, self.run))
        if self._remote:
            self._scorer.source = source  # type: ignore[union-attr]
        elif cfg.scorer.backend != "vllm":
            self.model, self.tokenizer, self.weights = load_weights(source, records)
        if world.is_main:
            self.run.truncate_metrics(self.iteration)
        held = "cpu" if self._remote else "cuda" if cfg.scorer.backend == "vllm" else source.device
        self.costs.start(self.run, held)  # a remote scorer bills its own containers
        self.budget.resume(self.run.metrics())
        if self._scorer is None:
            self._scorer = self._make_scorer(source, records)
            if world.distributed:
                from leanrl.train.es.fanout import DistributedScorer

                self._scorer = DistributedScorer(self._scorer, world)
        await self._scorer.start()
        if world.is_main:
            self._logger = MetricsLogger(
                self.run, cfg.log_to, cfg.run_name, json.loads(cfg.model_dump_json())
            )
            self._logger.start()
        self._started = True

    def _forget_a_start_that_never_ran(self) -> None:
        """A start that failed after the folder was bound (the model would not load, the scorer
        would not start) left ``config.json`` and a history with no iteration in it. Nothing of
        that run exists, so the corrected command starts afresh here, instead of being refused
        as "a different config" (what it is: the fix the error asked for)."""
        if not self.history.path.is_file() or any(self.run.path.glob("checkpoint-*")):
            return
        try:
            done = len(ESHistory(self.history.path).open(read_only=True))
        except ConfigError:  # a damaged history is reported by the normal open, unchanged
            return
        if done == 0:
            log.info("%s holds no completed iteration: starting it afresh", self.run.path)
            (self.run.path / "config.json").unlink(missing_ok=True)
            self.history.path.unlink()

    def _check_perturbation_early(self) -> None:
        """Refuse a resume with another perturbation mode, rank or 1-D rule than the history's
        header records (a header without them, from before low rank existed: full-rank)."""
        if self.history.path.is_file():
            peek = ESHistory(self.history.path)
            peek.open(read_only=True)
            check_perturbation(peek, LowRankSpec.from_config(self.config), self.run.path)

    def _world(self) -> Any:
        """The ranks of a torchrun launch (one engine per rank, one rank per GPU), or one."""
        if self.world is None:
            from leanrl.train.distributed import World
            from leanrl.train.es.policy import resolve_device_dtype

            device, _ = resolve_device_dtype(self.config.policy)
            self.world = World.from_env(device_type=device_kind(device))
        return self.world

    def _meta(self) -> HistoryMeta:
        """What this run's history records: run seed, and the noise device kind and dtype."""
        from leanrl.train.es.policy import resolve_device_dtype

        device, dtype = resolve_device_dtype(self.config.policy)
        # the vLLM scorer draws the noise inside the engine, on its GPU, whatever policy.device
        kind = "cuda" if self.config.scorer.backend == "vllm" else device_kind(device)
        if self._remote:  # the members draw the noise where they run
            kind = str(getattr(self._scorer, "device_kind", kind))
        return HistoryMeta(self.config.seed, kind, dtype, LowRankSpec.from_config(self.config))

    def _check_meta(self) -> None:
        """Refuse to continue a run whose noise was drawn on another kind of device / dtype."""
        old, new = self.history.meta, self._meta()
        check_perturbation(self.history, new.lowrank, self.run.path)  # format 1: full-rank
        if old is None:  # a format 1 history: it did not record them
            return
        if (old.device_type, old.dtype) != (new.device_type, new.dtype):
            raise ConfigError(
                f"{self.run.path} was trained with noise drawn on {old.device_type!r} in "
                f"{old.dtype}, but this resume would use {new.device_type!r} in {new.dtype} "
                f"(scorer {self.config.scorer.backend!r}). The same seeds give different noise "
                "there, so the history's updates would not mean what they meant. Resume on a "
                f"{old.device_type} machine with policy.device and policy.dtype = "
                f"{old.dtype!r} set explicitly (the vLLM scorer counts as 'cuda'), or start a "
                "new --out folder."
            )
        if old.run_seed != new.run_seed:  # config.json already pins seed; belt and braces
            raise ConfigError(
                f"{self.history.path} belongs to a run with seed {old.run_seed}, not "
                f"{new.run_seed}: use the seed of the run, or a new --out folder"
            )

    def _source(self) -> WeightsSource:
        """Base model, or the newest complete checkpoint the history reaches."""
        from leanrl.train.es.policy import resolve_device_dtype

        device, dtype = resolve_device_dtype(self.config.policy)
        if self._remote:
            device = str(getattr(self._scorer, "device", device))
        if self._world().distributed and device_kind(device) == "cuda":
            device = self._world().device("cuda")  # one GPU per rank (the same noise on each)
        opts = dict(self.config.policy.options)
        if self.config.scorer.backend == "vllm":
            opts = {}  # policy.options go to vllm.LLM(...), not to from_pretrained
        lora = self.lora_spec()
        lowrank = LowRankSpec.from_config(self.config)
        base = WeightsSource(
            self.config.policy.model, dtype, device, options=opts, lora=lora, lowrank=lowrank
        )
        for step, path in reversed(self.run.checkpoints()):
            if step > self.iteration:
                raise ConfigError(
                    f"{path} is at iteration {step} but the history "
                    f"({self.history.path}) has only {self.iteration}: the history was truncated "
                    "or replaced. Restore it, or start a new run folder."
                )
        # A damaged checkpoint is skipped (with a warning) for an older one; with none left the
        # intact history rebuilds the weights from the base model, so nothing is lost.
        for step, path in self.run.resumable_checkpoints():
            if checkpoint_usable(path):
                return WeightsSource(
                    base.model, dtype, device, str(path), step, opts, lora, lowrank=lowrank
                )
        if self.run.damaged and self.iteration:
            log.warning(
                "no intact checkpoint in %s: rebuilding iteration %d from the base model and "
                "the history (%s)",
                self.run.path,
                self.iteration,
                self.history.path,
            )
        return base

    def lora_spec(self) -> dict[str, Any] | None:
        """What rebuilds this run's adapters anywhere: the LoRA settings and their init seed."""
        if not self.config.lora.enabled:
            return None
        return {**self.config.lora.model_dump(mode="json"), "seed": self.config.seed}

    def _make_scorer(self, source: WeightsSource, records: list[HistoryRecord]) -> MemberScorer:
        from leanrl.train.es.policy import TorchPolicy

        sc = self.config.scorer
        if sc.backend == "inprocess":
            from leanrl.train.es.pipeline import inprocess_scorer

            policy = TorchPolicy(self.model, self.tokenizer, self.config.policy)
            # members_per_batch > 1 (low rank): several members per batched generate call
            return inprocess_scorer(self.env, self.weights, policy, self.config)
        if sc.backend == "processes":
            return ProcessPoolScorer(
                source,
                self.env.config,
                self.config.policy,
                workers=sc.workers,
                threads_per_worker=sc.threads_per_worker,
                records=records,
            )
        master = None
        if source.checkpoint and (Path(source.checkpoint) / MASTER_FILE).is_file():
            master = str(Path(source.checkpoint) / MASTER_FILE)
        if self.config.perturbation == "lowrank":  # members as LoRA adapters of the engine
            from leanrl.train.es.vllm_scorer import LowRankVLLMScorer

            return LowRankVLLMScorer(
                self.env,
                source,
                self.config.policy,
                master,
                depth=sc.pipeline,
                members_per_batch=sc.members_per_batch,
            )
        from leanrl.train.es.pipeline import PipelinedVLLMScorer

        return PipelinedVLLMScorer(self.env, source, self.config.policy, master, depth=sc.pipeline)

    def sampling_for(self, iteration: int) -> SamplingConfig:
        """Decoding for every member of ``iteration`` (same seed for all: common random numbers)."""
        cfg = self.config
        upd: dict[str, Any] = {"n": cfg.samples_per_task}
        if cfg.greedy:
            upd["temperature"] = 0.0
        upd["seed"] = random.Random(f"leanrl-es-sampling:{cfg.seed}:{iteration}").getrandbits(31)
        return cfg.sampling.model_copy(update=upd)

    async def step(self) -> dict[str, Any]:
        """Run one iteration: score the population, update θ, append history, log, checkpoint."""
        cfg = self.config
        it = self.iteration + 1
        t_start = time.perf_counter()
        tasks = self._curriculum.select(it - 1, cfg.tasks_per_step, cfg.seed)
        pools = self._curriculum.metrics(it - 1)  # the pool sizes the tasks came from
        members = population(cfg, it)
        state = IterationState(
            it, tuple(tasks), self.sampling_for(it), cfg.sigma, tuple(self.history.records)
        )
        scores: list[MemberScore] = await self.scorer.score(state, members)
        t_scored = time.perf_counter()
        if self._world().is_main:  # every rank has every score; rank 0 keeps the proofs
            self._keep(tasks, members, scores, it)
        _check_finite(scores, members, it)
        if cfg.curriculum.active:
            # Every member's judged attempts count (on every rank, so all draw the same next
            # tasks); recorded before the history, so a crash in between is rolled back.
            self._curriculum.record(it - 1, _outcomes(scores))
        # A member none of whose attempts the checker could judge (all `infra`) has no reward:
        # it is left out of the shaping and the update (z = 0, and N of α/N counts the judged
        # members only). Its seed keeps its place in the history, whose seeds are regenerated.
        judged = [(m, s) for m, s in zip(members, scores, strict=True) if not s.unjudged]
        rewards = [s.reward for _, s in judged]
        z = shape_rewards(rewards, cfg.shaping) if len(rewards) > 1 else None
        coeffs = []
        if z is not None:
            z_of = iter(z)
            z_all = [0.0 if s.unjudged else next(z_of) for s in scores]
            coeffs = es_coefficients(members, z_all, cfg.lr, n=len(judged))
        # mirrored pairs whose twins score the same give c = 0 for every seed: no update either
        skipped = not any(c != 0.0 for _, c in coeffs)
        if skipped:
            coeffs = []
        norm: float | None = None  # vllm: the trainer holds no weights to measure the step on
        if self.weights is not None:
            norm = self.weights.apply_update(coeffs) if coeffs else 0.0
        t_updated = time.perf_counter()
        n = len(rewards)
        mean = sum(rewards) / n if n else None
        perturb_s = sum(s.perturb_s for s in scores)
        score_s = sum(s.score_s for s in scores)
        tokens = sum(s.tokens for s in scores)
        infra = sum(s.infra for s in scores)
        attempts = infra + sum(len(s.rewards) for s in scores)
        row: dict[str, Any] = {
            "step": it,
            "reward_mean": mean,
            "reward_std": (
                (sum((r - mean) ** 2 for r in rewards) / n) ** 0.5 if mean is not None else None
            ),
            "reward_max": max(rewards, default=None),
            "reward_min": min(rewards, default=None),
            "pass_rate": _mean_or_none([s.pass_rate for _, s in judged]),
            "skipped": skipped,
            "members_judged": n,  # members with at least one attempt the checker judged
            **infra_metrics(infra, attempts),
            "update_norm": norm,
            "time_perturb_s": perturb_s,
            "time_score_s": score_s,
            "time_update_s": t_updated - t_scored,
            "step_time_s": t_updated - t_start,
            "tokens_per_s": tokens / max(t_scored - t_start, 1e-9),
            "population": len(scores),
            "tokens": tokens,
            **_idle(self._scorer),
            **pools,
            **runtime_metrics(self._env),
            **self.costs.row(self._env, self._scorer),
        }
        self.budget.update(row)
        if cfg.eval.due(it, cfg.steps) or (
            cfg.eval.every and self.budget.spent
        ):  # the updated weights θ_it, unperturbed
            row.update(await self._evaluate(it))
        # Metrics first, then the history: a crash in between leaves a metrics line past the
        # history, which the resume drops (truncate_metrics) before redoing that iteration.
        record = HistoryRecord(it, tuple(coeffs), skipped=skipped)
        self.iteration = it
        if not self._world().is_main:  # every rank applied the same update; rank 0 records it
            self.history.records.append(record)
            return row
        if self._logger is not None:
            self._logger.log(row)
        log.info(_iteration_line(row, self.budget.counter(row["step"], cfg.steps, "iteration")))
        warn_if_mostly_infra(row, log, unit="iteration")
        self.history.append(record)
        if it % cfg.save_every == 0 or it == cfg.steps:
            await self._checkpoint()
        return row

    def _keep(
        self,
        tasks: Sequence[Any],
        members: Sequence[Member],
        scores: Sequence[MemberScore],
        it: int,
    ) -> None:
        """Every member's accepted attempts into ``proofs.jsonl`` (written by θ_{it-1} + noise:
        ``step`` is the iteration, the member's seed and sign are kept with it)."""
        from leanrl.proofs import kept_from

        by_id = {t.id: t for t in tasks}
        rows = [
            kept_from(
                by_id[k["task_id"]],
                k["proof"],
                k["preamble"],
                restated_statement=k.get("restated_statement", ""),
                completion=k["completion"],
                source="es",
                model=self.config.policy.model,
                step=it,
                sample=k["sample"],
                axioms=k["axioms"],
                verify_s=k["verify_s"],
                member_seed=m.seed,
                member_sign=m.sign,
            )
            for m, s in zip(members, scores, strict=True)
            for k in s.kept
            if k["task_id"] in by_id
        ]
        self._kept.add(rows)

    async def _evaluate(self, step: int) -> dict[str, Any]:
        """The in-run held-out evaluation of the current weights (``eval``)."""
        from leanrl.train.inrun_eval import evaluate

        cfg = self.config
        world = self._world()
        row: dict[str, Any] = {}
        if world.is_main:  # every rank holds the same θ: rank 0 evaluates, every rank gets it
            row = await evaluate(cfg.eval, step, self.run, self.model, self.tokenizer, cfg.policy)
        return world.broadcast(row)  # type: ignore[no-any-return]

    async def _checkpoint(self) -> Path:
        """A checkpoint at the current iteration: here, or built by a remote scorer's GPU
        function (the weights live in its containers)."""
        remote = getattr(self._scorer, "checkpoint", None)
        if self._remote and remote is not None:
            it = self.iteration
            state = {"trainer": "es", "iteration": it, "history_records": len(self.history)}
            state[DIGEST_KEY] = self.history.digest()  # resume/replay check the history by it
            keep = self.config.keep_checkpoints
            path: Path = await remote(self.run, it, list(self.history.records), state, keep)
            return path
        return self.save_checkpoint()

    def save_checkpoint(self) -> Path:
        """A Hugging Face model folder at the current iteration (+ exact fp32 master if needed)."""
        it = self.iteration
        state = {"trainer": "es", "iteration": it, "history_records": len(self.history)}
        state[DIGEST_KEY] = self.history.digest()  # resume/replay check the history by it
        if self.weights is None:  # vllm: the master lives in the engine
            return self._save_checkpoint_from_engine(it, state)
        need_master = any(str(p.dtype) != "torch.float32" for p in self.weights.params.values())
        state["es_master"] = need_master
        weights = self.weights
        lora = self.config.lora
        state["lora"] = lora.enabled  # the folder then holds adapters (peft layout)

        def extra(p: Path) -> None:
            if need_master:
                weights.save_master(p / MASTER_FILE)
            if lora.enabled and lora.save_merged:
                from leanrl.train.lora import MERGED_DIR, save_merged

                save_merged(self.model, self.tokenizer, p / MERGED_DIR, lora.scale)

        # The master goes into the folder *before* it is published (and before older
        # checkpoints are pruned): a kill mid-write leaves no half-usable checkpoint.
        return self.run.save_checkpoint(
            it, self.model, self.tokenizer, state, keep=self.config.keep_checkpoints, extra=extra
        )

    def _save_checkpoint_from_engine(self, it: int, state: dict[str, Any]) -> Path:
        import tempfile

        from leanrl.train.es.policy import load_model
        from leanrl.train.es.weights import ESWeights, load_master_file

        assert isinstance(self._scorer, VLLMScorer)
        self._scorer.sync(self.history.records)  # the engine applies updates lazily
        # in the run folder (the master can be tens of GB); start() removes it if we die here
        tmp = Path(tempfile.mkdtemp(prefix=_ENGINE_TMP, dir=self.run.path))
        try:
            master = tmp / MASTER_FILE
            self._scorer.save_master(str(master))
            src = self._scorer.source
            model, tok = load_model(src.checkpoint or src.model, src.dtype, "cpu")
            w = ESWeights.from_model(model)
            w.load_master(load_master_file(master))
            state["es_master"] = True
            return self.run.save_checkpoint(
                it,
                model,
                tok,
                state,
                keep=self.config.keep_checkpoints,
                extra=lambda p: _copy(master, p / MASTER_FILE),
            )
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    async def train(self) -> list[dict[str, Any]]:
        """Run iterations until ``steps``; returns this call's metrics rows."""
        await self.start()
        rows = []
        world = self._world()
        due = self.config.eval.baseline_due(self.run.metrics()) if world.is_main else False
        if self.iteration == 0 and world.broadcast(due):
            row0 = {"step": 0, **await self._evaluate(0)}
            if self._logger is not None:
                self._logger.log(row0)
            rows.append(row0)
        before = self.iteration
        while self.iteration < self.config.steps and not self.budget.spent:
            rows.append(await self.step())
        if self.budget.spent and world.is_main:
            already = self.iteration == before  # spent before this call trained anything
            log.info(self.budget.spent_line(self.iteration, "iteration", already=already))
        if self._world().is_main:
            latest = self.run.latest_checkpoint()
            if self.iteration and (latest is None or latest[0] != self.iteration):
                await self._checkpoint()
            self.run.plot(title=f"ES reward ({self.run.path.name})")
            from leanrl.train.inrun_eval import plot_eval

            plot_eval(self.run)
            extra = {"iterations": self.iteration, **self.budget.summary()}
            self.costs.write_summary(self.run, "es", extra)
        return rows

    async def close(self) -> None:
        """Stop the scorer, the environment and the loggers. Safe to call twice."""
        if self._scorer is not None:
            await self._scorer.close()
        if self._env is not None:
            await self._env.close()
        if self._logger is not None:
            self._logger.close()
            self._logger = None
        self._started = False
        if self.world is not None:
            self.world.close()
            self.world = None

    def train_sync(self) -> list[dict[str, Any]]:
        """Blocking :meth:`train` (with :meth:`close`), for scripts and notebooks."""

        async def go() -> list[dict[str, Any]]:
            try:
                return await self.train()
            finally:
                await self.close()

        return run_sync(go())  # type: ignore[no-any-return]


def _resume_line(source: WeightsSource, iteration: int, run: RunDir) -> str:
    """Where a resumed run's weights come from: a checkpoint, then the history's iterations
    after it, or the base model and the whole history (no checkpoint yet, or every one is
    damaged: then which, and why)."""
    if source.checkpoint is None:
        then = "the weights are rebuilt from the base model and the history"
        return f"resuming at iteration {iteration}: " + run.no_checkpoint_line(then)
    line = resume_line(source.checkpoint, source.iteration, "iteration")
    replay = iteration - source.iteration
    return line + (f", then {replay} iteration(s) replayed from the history" if replay else "")


def _idle(scorer: Any) -> dict[str, float | int]:
    """The scorer's GPU-idle fraction and pipeline depth of the last iteration, if it has them."""
    frac, depth = getattr(scorer, "last_idle_frac", None), getattr(scorer, "last_depth", None)
    row: dict[str, float | int] = {} if frac is None else {"gpu_idle_frac": float(frac)}
    return row if depth is None else {**row, "pipeline_depth": int(depth)}


def _outcomes(scores: Sequence[MemberScore]) -> list[tuple[str, bool, float]]:
    """(task id, accepted, reward) of every judged attempt of every member. A scorer that does
    not fill ``passed`` (a user's) counts its attempts as not accepted, as a reward-only
    environment's are."""
    out: list[tuple[str, bool, float]] = []
    for s in scores:
        passed = s.passed if len(s.passed) == len(s.rewards) else [False] * len(s.rewards)
        out.extend(zip(s.task_ids, passed, s.rewards, strict=True))
    return out


def _copy(src: Path, dst: Path) -> None:
    shutil.copyfile(src, dst)


def _check_finite(scores: Sequence[MemberScore], members: Sequence[Member], it: int) -> None:
    """Raise, naming member and task, when the environment returned a NaN or infinite reward."""
    for i, (score, m) in enumerate(zip(scores, members, strict=True)):
        values = score.rewards or [score.reward]
        for j, r in enumerate(values):
            if not math.isfinite(r) or abs(r) > REWARD_LIMIT:
                task = score.task_ids[j] if j < len(score.task_ids) else "?"
                what = (
                    "finite rewards (a NaN or inf would make every weight NaN)"
                    if not math.isfinite(r)
                    else f"rewards within ±{REWARD_LIMIT:g} (means and spreads over a larger "
                    "one overflow)"
                )
                raise ConfigError(
                    f"iteration {it}, member {i} (seed {m.seed}, sign {m.sign:+d}): task "
                    f"{task!r} got reward {r}. The Environment must return {what}: fix its "
                    "reward function, e.g. clamp log-probabilities or map failures to a finite "
                    "penalty"
                )
        if not math.isfinite(score.reward):
            raise ConfigError(
                f"iteration {it}, member {i} (seed {m.seed}): mean reward {score.reward}: the "
                "Environment must return finite rewards"
            )


def _mean_or_none(xs: Sequence[float | None]) -> float | None:
    """The mean of the values given (None ones left out); None when there are none."""
    got = [x for x in xs if x is not None]
    return sum(got) / len(got) if got else None


def _iteration_line(row: dict[str, Any], counter: str) -> str:
    """One concise log line for a finished iteration (``counter``: ``iteration 3/20``, or the
    budget's share); no pass rate where the environment gives rewards but no verdicts."""

    def f(key: str, fmt: str = ".3f") -> str:
        v = row.get(key)
        return "-" if v is None else format(v, fmt)

    what = (
        "skipped (all members scored alike)"
        if row.get("skipped")
        else (f"update {f('update_norm', '.3g')}")
    )
    return (
        f"{counter}: reward {f('reward_mean')} (max {f('reward_max')}) "
        + ("" if row.get("pass_rate") is None else f"pass {f('pass_rate')} ")
        + f"population {row['population']} {what} {f('step_time_s', '.2f')}s"
    )
