"""Sequence-level distillation: teachers sample, leanrl verifies, the student is fine-tuned on the
verified proofs. Expert iteration (:mod:`leanrl.train.sft.expert_iteration`) with the sampling
done by teachers instead of the student.

One round R of :class:`SequenceDistill`:

1. **Teachers sample and leanrl verifies.** ``samples`` attempts at each task (by default only
   those no round has solved yet) by the task's teacher: its environment's expert
   (``experts``), else ``teacher``; through the environment's harness and runtime, with the
   eval runner (pipelined, resumable chunk by chunk: ``RUN/round-R/sample/``, one folder per
   environment in a mixed run, their ``proofs.jsonl`` and ``results.jsonl`` joined after).
   A teacher is a model folder, a hub id, a leanrl run folder or checkpoint (sampled with
   ``teacher_policy``'s backend, ``hf`` by default), or an OpenAI-compatible server's URL.
2. **Keep.** The verified proofs join ``RUN/proofs.jsonl``.
3. **SFT.** The student (``policy.model``; from round 2 the previous round's model) is
   fine-tuned on them in each environment's own layout, with loss on the answer; the result is
   ``RUN/checkpoint-R/``. The examples are text laid out again with the student's tokenizer,
   so teacher and student may tokenize differently.
4. **Eval.** When ``eval.every`` is due, the student's pass@k on the held-out set(s).

The training tasks are the environments' tasksets, so their ``decontaminate`` option applies to
this SFT data as to any (``--env.taskset.decontaminate.against minif2f``). The teachers'
revisions are recorded in ``config.json`` (``revisions``) and a resumed run whose teacher
changed is refused, as in on-policy distillation.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from leanrl.environment import Environment, EnvironmentConfig
from leanrl.harness import HarnessConfig
from leanrl.policy import PolicyConfig, Prompt
from leanrl.proofs import PROOFS_FILE, Pair
from leanrl.rollout import RewardError
from leanrl.task import Task
from leanrl.train.distill.config import DistillConfig
from leanrl.train.distill.onpolicy import resolve_revisions
from leanrl.train.distill.teacher import resolve
from leanrl.train.multienv import MixedEnvironment, _MixedHarness, evaluate_mixed
from leanrl.train.multienv_config import MixedEnvConfig, check_mixed, mixed_held_out
from leanrl.train.sft.expert_iteration import ExpertIteration, ExpertIterationConfig

__all__ = ["SequenceDistill", "SequenceDistillConfig"]

log = logging.getLogger("leanrl.train.distill")


class SequenceDistillConfig(ExpertIterationConfig):
    """Sequence-level distillation: rounds of teachers sampling → verify → SFT of the student."""

    teacher: str | None = None
    """The model that samples the proofs: a model folder, a Hugging Face id, a leanrl run
    folder (its newest checkpoint) or checkpoint, or an OpenAI-compatible server's URL
    (``http://127.0.0.1:8000/v1``). Its tokenizer may differ from the student's."""
    experts: dict[str, str] = Field(default_factory=dict)
    """One teacher per environment of a mixed run (``envs``): name → teacher
    (``--expert countdown=runs/cd``); an environment without one is sampled by ``teacher``."""
    envs: list[MixedEnvConfig] = Field(default_factory=list)
    """Several environments at once, each with its own tasks and teacher (``--env countdown
    --env minif2f``, or a TOML table per environment). Their weights are not used here: every
    (unsolved) task of each is sampled every round. Empty: ``env`` alone."""
    teacher_policy: PolicyConfig = Field(default_factory=PolicyConfig)
    """How a teacher that is a model samples (``backend`` hf or vllm, ``device``, ``dtype``,
    ``chat``, ...); its ``model`` is the teacher's. A server teacher uses the ``openai`` backend
    with the URL as ``base_url``."""
    revisions: dict[str, str] = Field(default_factory=dict)
    """The teachers' revisions (teacher → revision), filled in when the run starts and recorded
    in ``config.json``; a resumed run whose teacher changed is refused. Set one to pin it."""
    server_model: str | None = None
    """A server teacher: the model name to ask for (default: the one model it lists)."""
    rounds: int = Field(default=1, ge=1)
    """Rounds to run: one (the default) samples the teachers once and fine-tunes once; more
    sample again the tasks still unsolved (``unsolved_only``) with new seeds."""

    @model_validator(mode="before")
    @classmethod
    def _mixed_held_out(cls, data: Any) -> Any:
        return mixed_held_out(data)

    @model_validator(mode="after")
    def _teachers(self) -> SequenceDistillConfig:
        names = [e.name for e in self.envs] if self.envs else [self.env.id]
        if self.envs:
            check_mixed(self.envs)
            if self.curriculum.mode != "off":
                raise ValueError(
                    "curriculum with several environments (envs) is not supported: drop "
                    "--curriculum.mode"
                )
            held = [e.eval for e in self.envs if e.eval is not None]
            if self.eval.every and held:
                self.eval = self.eval.model_copy(update={"env": held[0]})
        unknown = sorted(set(self.experts) - set(names))
        if unknown:
            raise ValueError(
                f"experts names {unknown}, not environments of this run ({', '.join(names)})"
            )
        missing = [n for n in names if self.teacher_of(n) is None]
        if missing:
            raise ValueError(
                f"no teacher for {', '.join(missing)}: pass --teacher MODEL (every environment) "
                "or --expert ENV=MODEL for each"
            )
        return self

    def teacher_of(self, env: str) -> str | None:
        """The teacher of environment ``env``: its expert, else ``teacher``."""
        return self.experts.get(env) or self.teacher

    def distill_section(self) -> DistillConfig:
        """The teachers as a :class:`DistillConfig` (what resolving and revisions read)."""
        return DistillConfig(
            teacher=self.teacher,
            experts=self.experts,
            revisions=self.revisions,
            server_model=self.server_model,
        )


class SequenceDistill(ExpertIteration):
    """Runs sequence-level distillation (see the module docstring). ``__init__`` only stores;
    :meth:`train` (or :meth:`train_sync`) checks, resumes after the last finished round and
    runs the rest."""

    config: SequenceDistillConfig

    def __init__(self, config: SequenceDistillConfig, env: Environment | None = None) -> None:
        if env is None and config.envs:
            env = MixedEnvironment.from_configs(config.envs, config.eval)
        super().__init__(config, env)

    def check(self) -> None:
        """Expert iteration's checks, then every teacher resolved (loadable, or its server
        answering) and its revision written into the config; one that changed since the run
        started is refused."""
        super().check()
        cfg = self.config
        revs = resolve_revisions(
            cfg.distill_section(), cfg.policy.model, self.run.path, tokenizers=False
        )
        self.config = cfg.model_copy(update={"revisions": revs})

    # -- one round's sampling, by the teachers ------------------------------------------------------

    def _teacher_policy(self, spec: str) -> PolicyConfig:
        """The policy that samples with teacher ``spec``."""
        cfg = self.config
        src = resolve(spec, cfg.distill_section())
        if src.kind == "server":
            return cfg.teacher_policy.model_copy(
                update={"backend": "openai", "base_url": src.where, "model": src.model}
            )
        return cfg.teacher_policy.model_copy(update={"model": src.where})

    def _parts(self, todo: Sequence[Task]) -> list[tuple[str, EnvironmentConfig, list[Task]]]:
        """``todo`` by environment: (name, its config, its tasks), in the run's order."""
        cfg = self.config
        if not cfg.envs:
            return [(cfg.env.id, cfg.env, list(todo))]
        assert isinstance(self.env, MixedEnvironment)
        out = []
        for e in cfg.envs:
            mine = [t for t in todo if self.env.env_of(t.id) == e.name]
            if mine:
                plain = EnvironmentConfig(
                    id=e.id, taskset=e.taskset, harness=e.harness, runtime=e.runtime
                )
                out.append((e.name, plain, mine))
        return out

    async def _sample(self, r: int, model: str, todo: Sequence[Task]) -> float:
        """Attempts at ``todo`` by each task's teacher (``model``, the student, does not
        sample here); the tasks' pass rate (pass@samples, weighted by tasks)."""
        from leanrl.eval.config import EvalConfig
        from leanrl.eval.runner import run_eval

        cfg = self.config
        parts = self._parts(todo)
        seed = None if cfg.sampling.seed is None else cfg.sampling.seed + 7919 * r
        base = self._round_dir(r) / "sample"
        solved = 0.0
        for name, env_cfg, tasks in parts:
            spec = cfg.teacher_of(name)
            assert spec is not None  # the config's validator saw to it
            taskset = env_cfg.taskset.model_copy(
                update={"names": [t.id for t in tasks], "limit": None, "shuffle": False}
            )
            eval_cfg = EvalConfig(
                env=env_cfg.model_copy(update={"taskset": taskset}),
                policy=self._teacher_policy(spec),
                sampling=cfg.sampling.model_copy(update={"seed": seed}),
                samples=cfg.samples,
                k=[1, cfg.samples],
                out=base / name if cfg.envs else base,
                chunk_tasks=cfg.chunk_tasks,
                progress=False,
            )
            log.info("round %d: %s samples %d task(s) of %s", r, spec, len(tasks), name)
            try:
                summary = await run_eval(eval_cfg)
            except RewardError as e:
                raise RewardError(f"distillation round {r} ({name}): {e}") from None
            got = summary["results"]["pass_at_k"]["all"].get(f"pass@{cfg.samples}")
            solved += float(got or 0.0) * len(tasks)
        if cfg.envs:  # the round's files in one place, as expert iteration reads them
            await asyncio.to_thread(_join, [base / n / PROOFS_FILE for n, _, _ in parts],
                                    base / PROOFS_FILE)  # fmt: skip
            await asyncio.to_thread(_join, [base / n / "results.jsonl" for n, _, _ in parts],
                                    base / "results.jsonl")  # fmt: skip
        return solved / len(todo) if todo else 0.0

    def _sft_env(self) -> Environment | None:
        if isinstance(self.env, MixedEnvironment):
            return _LayoutMixed(self.env)
        return None

    async def _evaluate(self, r: int) -> dict[str, Any]:
        """The student's held-out evaluation after round ``r``: one per environment of a mixed
        run that has a held-out set (``eval/NAME/pass@k`` and their mean), else
        ``eval.env``'s."""
        if not self.config.envs:
            return await super()._evaluate(r)
        from leanrl.train.sft.trainer import device_and_precision, load_model

        cfg = self.config
        pol = cfg.policy.model_copy(update={"model": self.current_model(r + 1), "backend": "hf"})
        _, precision = device_and_precision(pol.device, cfg.sft.precision)
        model, tokenizer = await asyncio.to_thread(load_model, pol, precision)
        return await evaluate_mixed(cfg.model_copy(update={"policy": pol}), r, self.run, model,
                                    tokenizer)  # fmt: skip


def _join(parts: Sequence[Path], target: Path) -> None:
    """``target`` written (atomically) as the concatenation of the ``parts`` that exist."""
    tmp = target.with_name(f".{target.name}.tmp")
    with tmp.open("w", encoding="utf-8") as out:
        for p in parts:
            if p.is_file():
                text = p.read_text(encoding="utf-8")
                out.write(text if not text or text.endswith("\n") else text + "\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, target)


class _LayoutHarness(_MixedHarness):
    """A mixed environment's harness for SFT: each pair in its own environment's layout, the
    whole-proof one (with that environment's prompt format) where its harness has none."""

    def sft_example(self, pair: Pair, target: str = "proof") -> tuple[Prompt, str] | None:
        own = self.own(pair.task.id)
        got = own.sft_example(pair, target)
        if got is not None:
            return got
        from leanrl.harnesses.whole_proof.prompts import build_prompt
        from leanrl.train.sft.data import target_text

        conf: HarnessConfig = own.config
        return build_prompt(pair.task, conf), target_text(pair, conf, target)


class _LayoutMixed(MixedEnvironment):
    """A mixed environment whose harness lays SFT examples out per environment."""

    def __init__(self, env: MixedEnvironment) -> None:
        super().__init__(env.parts, env.held_out)
        self._tasks, self._env_of = env._tasks, env._env_of

    @property
    def harness(self) -> _LayoutHarness:
        return _LayoutHarness(self)
