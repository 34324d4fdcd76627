"""Expert iteration: rounds of sample → verify → SFT on the new verified proofs → eval.

The recipe every strong open prover used before or alongside RL (DeepSeek-Prover V1/V1.5,
Goedel-Prover, Kimina): the model attempts the training theorems, Lean keeps what is right, the
model is fine-tuned on its own verified proofs, and the next round starts from the result.
Nothing here needs Lean itself: the environment's checker decides what is kept and the SFT phase
trains in the environment's harness layout, so an environment without Lean (Countdown) works. One
round R (1-based) of :class:`ExpertIteration`:

1. **Sample and verify.** ``samples`` attempts at each training task (by default only those no
   round has solved yet) with the current model, through the configured harness and runtime:
   the eval runner does it, so the phase is pipelined and resumable chunk by chunk
   (``RUN/round-R/sample/``).
2. **Keep.** The round's verified proofs join ``RUN/proofs.jsonl`` (``source =
   "expert-iteration"``, ``step = R``), once per distinct proof; the solved set is the tasks
   with a kept proof.
3. **SFT.** The model is fine-tuned on the proofs first found this round (``train_on = "new"``)
   or on every kept proof (``"all"``), at most ``max_proofs_per_task`` per task, starting from
   the current model (``start_from = "previous"``) or the base model (``"base"``), in the
   harness's layout (``Harness.sft_example``; else its prompt format; with ``turns = "all"``
   whole multi-turn episodes, ``Harness.sft_episode``) with loss on the proof only (``RUN/round-R/sft/``, an ordinary SFT
   run folder that resumes from its checkpoints). The result is published as
   ``RUN/checkpoint-R/`` (with ``lora.rank > 0``: the round's adapters merged into the model
   it started from, a plain model folder). A round that found nothing new trains nothing.
4. **Eval.** When ``eval.every`` is due, pass@k of the new model on the held-out environment.

One ``metrics.jsonl`` row per round: the solved set's growth (``solved_total``,
``solved_new``, ``solved_frac``), the round's pass rate, the SFT losses, the evaluation. A round
is done when its row is written; rerunning the command continues after the last done round, and
a round cut short redoes only what is missing (every phase is resumable).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from leanrl.environment import Environment, load_environment
from leanrl.errors import ConfigError
from leanrl.policy import SamplingConfig
from leanrl.proofs import PROOFS_FILE, KeptProof, ProofStore, read_proofs
from leanrl.rollout import RewardError
from leanrl.task import Task
from leanrl.train.common import (
    MetricsLogger,
    RunDir,
    TrainConfig,
    check_model_path,
    check_runtimes,
    resume_line,
)
from leanrl.train.curriculum import Curriculum, CurriculumConfig, read_results
from leanrl.train.lora import LoRAConfig, check_peft
from leanrl.train.sft.trainer import SFTOptions

__all__ = ["ExpertIteration", "ExpertIterationConfig"]

log = logging.getLogger("leanrl.train.sft.expert_iteration")


class ExpertIterationConfig(TrainConfig):
    """Expert iteration on ``env``: rounds of sample → verify → SFT → eval."""

    rounds: int = Field(default=3, ge=1)
    """Rounds to run (a rerun with more rounds continues the run)."""
    samples: int = Field(default=8, ge=1)
    """Attempts per task per round (the k of the pass@k that finds proofs)."""
    sampling: SamplingConfig = Field(default_factory=lambda: SamplingConfig(temperature=1.0))
    """Sampling of the attempts (``n`` is ``samples``); the seed is varied per round."""
    unsolved_only: bool = True
    """Sample only the tasks no earlier round has solved (False: every task every round, which
    finds more distinct proofs of solved tasks)."""
    train_on: Literal["new", "all"] = "new"
    """SFT on the proofs first found this round (``new``), or on every proof kept so far."""
    start_from: Literal["previous", "base"] = "previous"
    """Fine-tune the previous round's model (``previous``) or the base model each round
    (``base``, usually with ``train_on = "all"``)."""
    max_proofs_per_task: int = Field(default=1, ge=1)
    """Most proofs per task in a round's SFT data."""
    turns: Literal["first", "all"] = "first"
    """What a round's SFT trains of a multi-turn episode: ``first`` (the first turn, in the
    whole-proof layout) or ``all`` (a proof whose verified episode had several turns is trained
    as the whole conversation, loss on the turns the harness marks as targets; see
    ``data.turns`` of ``leanrl train sft``). ``all`` is needed for the ``tactic-loop``
    harness."""
    chunk_tasks: int = Field(default=8, ge=1)
    """Tasks per chunk of the sampling phase (one generate call and one check batch)."""
    sft: SFTOptions = Field(default_factory=SFTOptions)
    """How each round's SFT optimises (epochs, learning rate, batch sizes, ...)."""
    lora: LoRAConfig = Field(default_factory=LoRAConfig)
    """Each round's SFT trains low-rank adapters (``peft``) instead of every weight:
    ``--lora.rank 16``. The round's model is published merged (``W + (alpha/r)·B·A``, a plain
    model folder), so the next round samples from it with any backend and adds fresh adapters."""
    steps: int = Field(default=1, ge=1)
    """Not used by expert iteration (rounds are ``rounds``)."""
    tasks_per_step: int = Field(default=8, ge=1)
    """Not used by expert iteration (a round samples every (unsolved) task)."""
    save_every: int = Field(default=1, ge=1)
    """Not used: every round that trains publishes ``checkpoint-R``."""
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig)
    """Choose each round's tasks by difficulty (after ``unsolved_only``) from a per-task table
    of attempts and passes (``RUN_DIR/difficulty.json``, fed by every round's samples and
    ``curriculum.warm_start``): ``drop_solved`` leaves out tasks solved above
    ``curriculum.easy_above``; ``frontier`` and ``pools`` draw ``tasks_per_round`` of them.
    Off by default: every (unsolved) task every round."""
    tasks_per_round: int | None = Field(default=None, ge=1)
    """With a curriculum: the most tasks a round samples, drawn by it (each at most once).
    Unset: every task the curriculum keeps. Ignored when ``curriculum.mode`` is ``off``."""


class ExpertIteration:
    """Runs expert iteration. ``__init__`` only stores; :meth:`train` (or :meth:`train_sync`)
    checks, resumes after the last finished round, and runs the remaining rounds."""

    #: Fields that may change between a run and its resume.
    RESUMABLE = ("rounds", "out", "log_to", "run_name", "keep_checkpoints", "eval")

    def __init__(self, config: ExpertIterationConfig, env: Environment | None = None) -> None:
        self.config = config
        self.env = env
        self.run = RunDir(config.out)
        self.kept = ProofStore(self.run.path / PROOFS_FILE)

    def check(self) -> None:
        """Cheap checks before anything is loaded."""
        cfg = self.config
        check_model_path(cfg.policy.model)
        if cfg.policy.backend not in ("hf", "vllm"):
            raise ConfigError(
                "expert iteration fine-tunes the model it samples from: use --policy.backend hf "
                "or vllm (the SFT phase always trains with transformers)"
            )
        if cfg.env.harness.name == "tactic-loop" and cfg.turns != "all":
            raise ConfigError(
                "expert iteration trains whole proofs: use the whole-proof or self-correction "
                "harness, not tactic-loop, or train whole tactic-loop episodes with --turns all"
            )
        check_peft(cfg.lora)
        if cfg.budget.active:  # it would be ignored: say so rather than run past it
            raise ConfigError(
                "budget.tokens / budget.gpu_s are set, but expert iteration does not stop on a "
                "budget (each round samples every task it has left): give its length as "
                "--rounds R instead"
            )

    def train_sync(self) -> list[dict[str, Any]]:
        """Blocking :meth:`train`."""
        from leanrl.runtime import run_sync

        rows: list[dict[str, Any]] = run_sync(self.train())
        return rows

    async def train(self) -> list[dict[str, Any]]:
        """Run the rounds not done yet; returns this call's metrics rows (one per round)."""
        self.check()
        cfg = self.config
        env = self.env or load_environment(cfg.env)
        tasks = await asyncio.to_thread(env.tasks)
        if not tasks:
            raise ConfigError("the training taskset is empty: check split, names and limit")
        cfg.eval.check_held_out(t.name for t in tasks)
        # every round checks attempts (and the baseline evaluation loads the model first)
        env.check_parts()
        check_runtimes(env, cfg.eval)
        self.run.lock("expert iteration run")  # before anything is written: one per folder
        self.run.bind_config(cfg, ignore=self.RESUMABLE)
        done = max((int(r["step"]) for r in self.run.metrics()), default=0)
        self.run.truncate_metrics(done)
        if done:
            log.info(resume_line(self.current_model(done + 1), done, "round"))
        self.kept.open()
        # the table as of the round the run continues at (steps are rounds here)
        self._curriculum = Curriculum.open(cfg.curriculum, tasks, self.run.path, before=done + 1)
        from leanrl.decontam import save_taskset_report

        save_taskset_report(env.taskset, self.run.path)  # what decontamination dropped
        logger = MetricsLogger(self.run, cfg.log_to, cfg.run_name, cfg.model_dump(mode="json"))
        logger.start()
        rows: list[dict[str, Any]] = []
        try:
            if cfg.eval.baseline_due(self.run.metrics()):  # the base model, for a baseline
                row0 = {"step": 0, **await self._evaluate(0)}
                logger.log(row0)
                rows.append(row0)
            for r in range(done + 1, cfg.rounds + 1):
                row = await self._round(r, tasks)
                logger.log(row)  # the round is done once its row is written
                rows.append(row)
                log.info(
                    "round %d/%d: solved %d/%d (+%d), %d new proofs",
                    r,
                    cfg.rounds,
                    row["solved_total"],
                    row["tasks"],
                    row["solved_new"],
                    row["new_proofs"],
                )
        finally:
            logger.close()
            self.run.plot("solved_frac", f"expert iteration ({self.run.path.name})", "solved.png")
            from leanrl.train.inrun_eval import plot_eval

            plot_eval(self.run)
            self.run.unlock()  # after the last write (the plots above)
        return rows

    # -- one round --------------------------------------------------------------------------------

    def current_model(self, before_round: int) -> str:
        """The model round ``before_round`` starts from: the newest published checkpoint of an
        earlier round, else the base model."""
        earlier = [(s, p) for s, p in self.run.checkpoints() if s < before_round]
        return str(earlier[-1][1]) if earlier else self.config.policy.model

    async def _round(self, r: int, tasks: Sequence[Task]) -> dict[str, Any]:
        cfg = self.config
        model = self.current_model(r)
        solved_before = {p.task_id for p in self.kept.rows() if p.step is None or p.step < r}
        todo = [t for t in tasks if not (cfg.unsolved_only and t.id in solved_before)]
        cur = getattr(self, "_curriculum", None)
        pools = cur.metrics(r, todo) if cur is not None and todo else {}
        if cur is not None and cur.table is not None and todo:
            count = min(cfg.tasks_per_round or len(todo), len(todo))
            chosen = {t.id for t in cur.select(r, count, cfg.seed, todo, repeat=False)}
            todo = [t for t in todo if t.id in chosen]  # the taskset's order
        t0 = time.perf_counter()
        round_pass = await self._sample(r, model, todo) if todo else None
        if cur is not None and cur.table is not None:  # a redone round replaces its record
            results = self._round_dir(r) / "sample" / "results.jsonl"
            cur.record(r, read_results(results) if todo and results.is_file() else [])
        t1 = time.perf_counter()
        new_rows = self._keep(r, {t.id for t in tasks})
        solved_now = self.kept.solved() & {t.id for t in tasks}
        sft = await self._sft(r, model, tasks)
        t2 = time.perf_counter()
        row: dict[str, Any] = {
            "step": r,
            "model": model,
            "tasks": len(tasks),
            "tasks_sampled": len(todo),
            **pools,
            "attempts": len(todo) * cfg.samples,
            "pass_rate": round_pass,
            "new_proofs": len(new_rows),
            "solved_new": len(solved_now - solved_before),
            "solved_total": len(solved_now),
            "solved_frac": len(solved_now) / len(tasks),
            **sft,
            "time_sample": t1 - t0,
            "time_sft": t2 - t1,
        }
        if cfg.eval.due(r, cfg.rounds):
            row.update(await self._evaluate(r))
        return row

    async def _sample(self, r: int, model: str, todo: Sequence[Task]) -> float:
        """Attempts at ``todo`` with ``model`` through the eval runner; the tasks' pass rate."""
        from leanrl.eval.config import EvalConfig
        from leanrl.eval.runner import run_eval

        cfg = self.config
        taskset = cfg.env.taskset.model_copy(
            update={"names": [t.id for t in todo], "limit": None, "shuffle": False}
        )
        env_cfg = cfg.env.model_copy(update={"taskset": taskset})
        seed = None if cfg.sampling.seed is None else cfg.sampling.seed + 7919 * r
        eval_cfg = EvalConfig(
            env=env_cfg,
            policy=cfg.policy.model_copy(update={"model": model}),
            sampling=cfg.sampling.model_copy(update={"seed": seed}),
            samples=cfg.samples,
            k=[1, cfg.samples],
            out=self._round_dir(r) / "sample",
            chunk_tasks=cfg.chunk_tasks,
            progress=False,
        )
        try:
            summary = await run_eval(eval_cfg)
        except RewardError as e:  # the eval names task and attempt; say which round too
            raise RewardError(f"expert iteration round {r}: {e}") from None
        solved = summary["results"]["pass_at_k"]["all"].get(f"pass@{cfg.samples}")
        return float(solved) if solved is not None else 0.0

    def _keep(self, r: int, task_ids: set[str]) -> list[KeptProof]:
        """The round's verified proofs into the run's ``proofs.jsonl``; the ones that are new."""
        path = self._round_dir(r) / "sample" / PROOFS_FILE
        if not path.is_file():
            return []
        found = [
            p.model_copy(update={"source": "expert-iteration", "step": r})
            for p in read_proofs(path)
            if p.task_id in task_ids
        ]
        self.kept.add(found)
        # new = first found in this round (also when an earlier attempt at this round added
        # them before a kill): the file's rows of step r
        return [p for p in self.kept.rows() if p.step == r]

    async def _sft(self, r: int, model: str, tasks: Sequence[Task]) -> dict[str, Any]:
        """Fine-tune on the round's proofs and publish ``checkpoint-r``; the SFT figures."""
        from leanrl.train.sft.data import Pair, SFTDataConfig
        from leanrl.train.sft.trainer import SFTConfig, SFTTrainer

        cfg = self.config
        rows = [p for p in self.kept.rows() if cfg.train_on == "all" or p.step == r]
        per_task: dict[str, int] = {}
        pairs = []
        for p in rows:
            if per_task.get(p.task_id, 0) >= cfg.max_proofs_per_task:
                continue
            per_task[p.task_id] = per_task.get(p.task_id, 0) + 1
            pairs.append(Pair(p.task(), p.proof, p.preamble, p.completion))
        empty: dict[str, Any] = {"sft_pairs": 0, "sft_steps": 0, "sft_loss_first": None}
        empty["sft_loss_last"] = None
        if not pairs:
            return empty
        start = cfg.policy.model if cfg.start_from == "base" else model
        sft_cfg = SFTConfig(
            **cfg.sft.model_dump(),
            env=cfg.env,
            policy=cfg.policy.model_copy(update={"model": start, "backend": "hf"}),
            lora=cfg.lora,
            out=self._round_dir(r) / "sft",
            seed=cfg.seed + r,
            save_every=10**9,  # one checkpoint, at the end (the Trainer saves the last step)
            keep_checkpoints=1,
            data=SFTDataConfig(turns=cfg.turns),
        )
        episodes = None
        if cfg.turns == "all":  # each proof's episode is in the sample folder of its round
            from leanrl.train.sft.data import episodes_from_results

            steps = sorted({p.step for p in rows if p.step is not None})
            episodes = episodes_from_results(
                self._round_dir(s) / "sample" / "results.jsonl" for s in steps
            )
        trainer = SFTTrainer(sft_cfg, env=self._sft_env(), pairs=pairs, episodes=episodes)
        await asyncio.to_thread(trainer.train_sync)
        metrics = trainer.run.metrics()
        await asyncio.to_thread(self._publish, r, trainer)
        return {
            "sft_pairs": len(pairs),
            "sft_steps": metrics[-1]["step"] if metrics else 0,
            "sft_loss_first": metrics[0].get("loss") if metrics else None,
            "sft_loss_last": metrics[-1].get("loss") if metrics else None,
        }

    def _sft_env(self) -> Environment | None:
        """The environment whose harness lays out a round's SFT examples; None: the one
        ``config.env`` names (a subclass that samples several environments gives its own)."""
        return None

    def _publish(self, r: int, trainer: Any) -> None:
        """The round's model as ``RUN/checkpoint-r`` (weights and tokenizer, no optimizer);
        the SFT phase's own checkpoints (with optimizer state) are then removed."""
        # a rerun after a kill between the SFT's end and this publish finds the SFT finished,
        # and a finished SFT loads nothing: its final weights are loaded here
        trainer.load_trained()
        state = {"trainer": "expert-iteration", "round": r, "base_model": self.config.policy.model}
        lora = self.config.lora
        model = _Merged(trainer.model, lora.scale) if lora.enabled else trainer.model
        state["lora"] = lora.enabled  # published merged: a plain model folder either way
        self.run.save_checkpoint(
            r, model, trainer.tokenizer, state, keep=self.config.keep_checkpoints
        )
        for _, p in trainer.run.checkpoints():
            shutil.rmtree(p, ignore_errors=True)

    async def _evaluate(self, r: int) -> dict[str, Any]:
        """The held-out evaluation of the round's model (``eval``), loaded from its checkpoint."""
        from leanrl.train.inrun_eval import evaluate
        from leanrl.train.sft.trainer import device_and_precision, load_model

        cfg = self.config
        pol = cfg.policy.model_copy(update={"model": self.current_model(r + 1), "backend": "hf"})
        _, precision = device_and_precision(pol.device, cfg.sft.precision)
        model, tokenizer = await asyncio.to_thread(load_model, pol, precision)
        return await evaluate(cfg.eval, r, self.run, model, tokenizer, pol)

    def _round_dir(self, r: int) -> Path:
        return self.run.path / f"round-{r}"


class _Merged:
    """What ``RunDir.save_checkpoint`` saves of a LoRA round: the merged model, a plain folder."""

    def __init__(self, model: Any, scale: float) -> None:
        self.model = model
        self.scale = scale

    def save_pretrained(self, folder: Path) -> None:
        from leanrl.train.lora import save_merged

        save_merged(self.model, None, folder, self.scale)
