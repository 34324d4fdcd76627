"""Several environments in one run: :class:`MixedEnvironment`, weighted task draws, and the
per-environment metrics and held-out evaluations of a mixed run.

A :class:`MixedEnvironment` is an :class:`~leanrl.Environment` made of named parts, each with a
weight. It looks like one environment to a trainer: ``tasks()`` is every part's tasks (a task id
must be unique across parts), ``rollout`` sends each task to its own part's harness, runtime and
taskset (the parts roll out at once, started in a fixed order), ``start``/``close`` start and stop
every part's runtime. What a trainer needs on top:

- :meth:`MixedEnvironment.batch`: the tasks of a step, each drawn from part e with probability
  ``w_e / Σ w`` and, within a part, in that part's own seeded epoch order (without replacement
  within an epoch). Draw k of a run depends only on (seed, k), so a resumed run draws the same;
- :func:`mixed_metrics`: reward and pass rate per part (``env/NAME/reward_mean``, ...);
- :func:`evaluate_mixed`: the in-run held-out evaluation of each part (``eval/NAME/pass@k``)
  and their task-weighted mean (``eval/pass@k``, which the eval plot draws).

:func:`load_training_environment` is what the trainers call: the config's ``envs`` make a mixed
environment, else ``env`` one environment.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import random
from collections.abc import Sequence
from typing import Any

from leanrl.environment import Environment, EnvironmentConfig, load_environment
from leanrl.errors import ConfigError
from leanrl.harness import Harness, HarnessConfig, SFTEpisode
from leanrl.policy import Policy, Prompt, SamplingConfig
from leanrl.proofs import Pair
from leanrl.rollout import Rollout
from leanrl.runtime import Runtime, RuntimeConfig
from leanrl.task import Task
from leanrl.taskset import Taskset
from leanrl.train.multienv_config import MixedEnvConfig
from leanrl.verdict import Attempt, Verdict

__all__ = [
    "MixedEnvironment",
    "env_batch",
    "evaluate_mixed",
    "load_training_environment",
    "mixed_metrics",
]


class MixedEnvironment(Environment):
    """Named environments with weights, seen by a trainer as one (see the module docstring)."""

    name = "mixed"
    description = "several environments in one run, each with a weight"

    def __init__(
        self, parts: Sequence[tuple[str, float, Environment]], held_out: Any = None
    ) -> None:
        super().__init__(EnvironmentConfig(id="mixed"))
        self.held_out: list[tuple[str, Any]] = list(held_out or [])
        """(part name, the run's ``eval`` section with that part's held-out ``env``): what
        :meth:`check_parts` checks for overlap with the part's training tasks."""
        if not parts:
            raise ConfigError("a mixed environment needs at least one part")
        names = [n for n, _, _ in parts]
        if len(set(names)) != len(names):
            raise ConfigError(f"the environments of a mixed run need distinct names: {names}")
        for n, w, _ in parts:
            if not w > 0:
                raise ConfigError(f"environment {n!r} has weight {w}: weights must be above 0")
        self.parts = [(n, float(w), e) for n, w, e in parts]
        self._tasks: dict[str, list[Task]] | None = None
        self._env_of: dict[str, str] = {}
        self._slots: list[int] = []  # the part of each draw so far (see `batch`)
        self._slot_seed: int | None = None
        self._mixed_runtime = _MixedRuntime(self)
        self._runtime = self._mixed_runtime  # what `runtime_metrics` reads

    @classmethod
    def from_configs(
        cls, envs: Sequence[MixedEnvConfig], eval_config: Any = None
    ) -> MixedEnvironment:
        """The environments ``envs`` names, loaded (nothing is started or read yet).
        ``eval_config``: the run's ``eval`` section (each part's held-out set is checked
        against its training tasks by :meth:`check_parts`)."""
        parts = []
        for e in envs:
            plain = EnvironmentConfig(
                id=e.id, taskset=e.taskset, harness=e.harness, runtime=e.runtime
            )
            parts.append((e.name, e.weight, load_environment(plain)))
        held = [
            (e.name, eval_config.model_copy(update={"env": e.eval}))
            for e in envs
            if eval_config is not None and e.eval is not None
        ]
        return cls(parts, held)

    # -- the parts ------------------------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        """The parts' names, in order."""
        return [n for n, _, _ in self.parts]

    def part(self, name: str) -> Environment:
        """The environment named ``name``."""
        for n, _, e in self.parts:
            if n == name:
                return e
        raise KeyError(name)

    def tasks(self) -> list[Task]:
        """Every part's tasks, part by part. A task id found in two parts is refused (rewards,
        kept proofs and per-part metrics go by task id)."""
        if self._tasks is None:
            by_part: dict[str, list[Task]] = {}
            owner: dict[str, str] = {}
            for n, _, e in self.parts:
                got = e.tasks()
                if not got:
                    raise ConfigError(
                        f"environment {n!r} of the mixed run has no tasks: check its split, "
                        "names, pattern and limit"
                    )
                for t in got:
                    if t.id in owner:
                        raise ConfigError(
                            f"task id {t.id!r} is in both {owner[t.id]!r} and {n!r}: a mixed run "
                            "needs task ids unique across its environments (filter one of them, "
                            "e.g. with --env.taskset.names)"
                        )
                    owner[t.id] = n
                by_part[n] = got
            self._tasks, self._env_of = by_part, owner
        return [t for n in self.names for t in self._tasks[n]]

    def env_of(self, task_id: str) -> str:
        """The name of the part a task comes from."""
        if self._tasks is None:
            self.tasks()
        return self._env_of[task_id]

    def tasks_of(self, name: str) -> list[Task]:
        """The tasks of part ``name``."""
        if self._tasks is None:
            self.tasks()
        assert self._tasks is not None
        return self._tasks[name]

    # -- weighted draws -------------------------------------------------------------------------

    def batch(self, step: int, per_step: int, seed: int) -> list[Task]:
        """The ``per_step`` tasks of ``step`` (0-based): draw k = step·per_step + i picks part e
        with probability w_e / Σ w (a generator seeded with (seed, k)), and that part's j-th draw
        is position j of its epochs of a seeded permutation (without replacement within an
        epoch). A pure function of (seed, step), like ``batch_for_step``."""
        self.tasks()
        assert self._tasks is not None
        if self._slot_seed != seed:
            self._slots, self._slot_seed = [], seed
        end = (step + 1) * per_step
        total = sum(w for _, w, _ in self.parts)
        bounds = list(itertools.accumulate(w / total for _, w, _ in self.parts))
        while len(self._slots) < end:
            u = random.Random(f"leanrl-mix:{seed}:{len(self._slots)}").random()
            self._slots.append(min(bisect.bisect_right(bounds, u), len(self.parts) - 1))
        out = []
        start = step * per_step
        for k in range(start, end):
            i = self._slots[k]
            j = self._slots[:k].count(i)  # this part's earlier draws
            name = self.parts[i][0]
            tasks = self._tasks[name]
            epoch, idx = divmod(j, len(tasks))
            perm = list(range(len(tasks)))
            random.Random(f"leanrl-mix:{seed}:{name}:{epoch}").shuffle(perm)
            out.append(tasks[perm[idx]])
        return out

    # -- parts an Environment has ---------------------------------------------------------------

    @property
    def taskset(self) -> Taskset:
        return _MixedTaskset(self)  # type: ignore[return-value]  # what trainers read of one

    @property
    def harness(self) -> Harness:
        return _MixedHarness(self)

    @property
    def runtime(self) -> Runtime:
        return self._mixed_runtime

    def check_parts(self) -> None:
        """Each part's harness and runtime, and each held-out set against its part's training
        tasks (refused when they share tasks, unless ``eval.allow_overlap``)."""
        for _, _, e in self.parts:
            e.check_parts()
        for name, ev in self.held_out:
            ev.check_held_out(t.name for t in self.tasks_of(name))

    async def start(self) -> None:
        for _, _, e in self.parts:
            await e.start()

    async def close(self) -> None:
        for _, _, e in self.parts:
            await e.close()

    async def rollout(
        self, tasks: Sequence[Task], policy: Policy, sampling: SamplingConfig
    ) -> list[list[Rollout]]:
        """Each task through its own part; the groups in the order of ``tasks``. The parts roll
        out at once (one part's Lean checks while another generates), created in part order,
        each with its own seed derived from ``sampling.seed``."""
        self.tasks()
        where: dict[str, list[int]] = {}
        for k, t in enumerate(tasks):
            where.setdefault(self._env_of[t.id], []).append(k)
        jobs = []
        order = [n for n in self.names if n in where]
        for i, n in enumerate(order):
            s = sampling
            if sampling.seed is not None and i:
                s = sampling.model_copy(update={"seed": sampling.seed + 15_485_863 * i})
            mine = [tasks[k] for k in where[n]]
            jobs.append(asyncio.ensure_future(self.part(n).rollout(mine, policy, s)))
        try:
            got = await asyncio.gather(*jobs)
        except BaseException:
            for job in jobs:
                job.cancel()
            await asyncio.gather(*jobs, return_exceptions=True)
            raise
        out: list[list[Rollout] | None] = [None] * len(tasks)
        for n, groups in zip(order, got, strict=True):
            for k, g in zip(where[n], groups, strict=True):
                out[k] = g
        return [g for g in out if g is not None]

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}×{w:g}" for n, w, _ in self.parts)
        return f"<MixedEnvironment {inner}>"


class _MixedTaskset:
    """What a trainer reads of a taskset, for a mixed environment: the decontamination reports
    of the parts, merged."""

    def __init__(self, env: MixedEnvironment) -> None:
        self.env = env

    @property
    def decontamination(self) -> Any:
        from leanrl.decontam_match import DecontaminationReport

        reports = [
            r
            for _, _, e in self.env.parts
            if isinstance(r := getattr(e.taskset, "decontamination", None), DecontaminationReport)
        ]
        if not reports:
            return None
        return DecontaminationReport(
            against=sorted({a for r in reports for a in r.against}),
            benchmark_rows={k: v for r in reports for k, v in r.benchmark_rows.items()},
            informal_ngram=reports[0].informal_ngram,
            checked=sum(r.checked for r in reports),
            kept=sum(r.kept for r in reports),
            dropped=[m for r in reports for m in r.dropped],
        )


class _MixedHarness(Harness):
    """The harness of a mixed environment: each task goes to its own part's harness."""

    name = "mixed"
    description = "each task through the harness of its own environment"

    def __init__(self, env: MixedEnvironment) -> None:
        first = env.parts[0][2].config.harness
        super().__init__(HarnessConfig(name=first.name))
        self.env = env

    async def run(
        self,
        tasks: Sequence[Task],
        policy: Policy,
        runtime: Runtime,
        sampling: SamplingConfig,
        taskset: Taskset,
    ) -> list[list[Rollout]]:
        return await self.env.rollout(tasks, policy, sampling)

    def own(self, task_id: str) -> Harness:
        """The harness of the part ``task_id`` comes from."""
        return self.env.part(self.env.env_of(task_id)).harness

    def sft_example(self, pair: Pair, target: str = "proof") -> tuple[Prompt, str] | None:
        return self.own(pair.task.id).sft_example(pair, target)

    def sft_episode(self, rollout: Rollout) -> SFTEpisode | None:
        return self.own(rollout.task_id).sft_episode(rollout)


class _MixedRuntime(Runtime):
    """The runtime of a mixed environment: every part's, checked before and counted together."""

    name = "mixed"
    description = "the runtimes of the parts of a mixed environment"

    def __init__(self, env: MixedEnvironment) -> None:
        super().__init__(RuntimeConfig(name="mixed"))
        self.env = env

    def preflight(self) -> None:
        for _, _, e in self.env.parts:
            e.runtime.preflight()

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for n, _, e in self.env.parts:
            rt = getattr(e, "_runtime", None)  # never built just to be asked for numbers
            if rt is not None:
                out.update({f"{n}/{k}": v for k, v in rt.metrics().items()})
        return out

    async def check(self, attempts: Sequence[Attempt]) -> list[Verdict]:
        raise ConfigError("a mixed environment checks attempts through each part's own runtime")


def env_batch(
    env: Environment, tasks: Sequence[Task], step: int, per_step: int, seed: int
) -> list[Task]:
    """The tasks of ``step``: drawn by weight from a :class:`MixedEnvironment`'s parts, else
    :func:`~leanrl.train.common.batch_for_step` of ``tasks``."""
    if isinstance(env, MixedEnvironment):
        return env.batch(step, per_step, seed)
    from leanrl.train.common import batch_for_step

    return batch_for_step(tasks, step, per_step, seed)


def load_training_environment(config: Any) -> Environment:
    """The environment a trainer's config describes: a :class:`MixedEnvironment` of its
    ``envs`` when it names several, else ``env``."""
    envs = getattr(config, "envs", None)
    if envs:
        return MixedEnvironment.from_configs(envs, getattr(config, "eval", None))
    return load_environment(config.env)


# -- per-environment metrics and evaluations ---------------------------------------------------------


def mixed_metrics(env: Environment, groups: Sequence[Sequence[Rollout]]) -> dict[str, Any]:
    """Reward, pass rate and group count per part of a mixed environment (``env/NAME/...``)
    over ``groups`` (a step's fresh groups); empty for one environment. Attempts the checker
    could not judge (``infra``) are left out, as in the step's own figures."""
    if not isinstance(env, MixedEnvironment):
        return {}
    out: dict[str, Any] = {}
    for name in env.names:
        mine = [g for g in groups if g and env.env_of(g[0].task_id) == name]
        judged = [r for g in mine for r in g if not r.infra]
        verdicts = [r.verdict for r in judged if r.verdict is not None]
        out[f"env/{name}/groups"] = len(mine)
        out[f"env/{name}/reward_mean"] = (
            sum(r.reward for r in judged) / len(judged) if judged else None
        )
        out[f"env/{name}/pass_rate"] = (
            sum(v.accepted for v in verdicts) / len(judged) if verdicts else None
        )
    return out


def held_out_sets(config: Any) -> list[tuple[str, EnvironmentConfig]]:
    """The held-out environment of each part of a mixed run that has one (``envs[i].eval``)."""
    return [(e.name, e.eval) for e in getattr(config, "envs", None) or [] if e.eval is not None]


async def evaluate_mixed(
    config: Any,
    step: int,
    run: Any,
    model: Any,
    tokenizer: Any,
    live: Policy | None = None,
) -> dict[str, Any]:
    """The in-run evaluation of a run (``config.eval``): one evaluation of ``eval.env``, or
    with a mixed run whose parts have held-out sets one per part, each to
    ``RUN/eval/step-N/NAME/`` with keys ``eval/NAME/pass@k``, and their mean weighted by tasks
    as ``eval/pass@k``."""
    from leanrl.train.inrun_eval import evaluate

    sets = held_out_sets(config)
    if not sets:
        return await evaluate(config.eval, step, run, model, tokenizer, config.policy, live=live)
    row: dict[str, Any] = {}
    total: dict[str, float] = {}
    n_all = 0
    for name, held in sets:
        ev = config.eval.model_copy(update={"env": held})
        out = run.path / "eval" / f"step-{step}" / name
        got = await evaluate(ev, step, run, model, tokenizer, config.policy, live=live, out=out)
        n = int(got.get("eval/tasks") or 0)
        n_all += n
        for k, v in got.items():
            row[f"eval/{name}/{k[5:]}"] = v
            if k.startswith("eval/pass@") and v is not None:
                total[k] = total.get(k, 0.0) + float(v) * n
    for k in config.eval.ks:
        key = f"eval/pass@{k}"
        row[key] = total[key] / n_all if n_all and key in total else None
    row["eval/tasks"] = n_all
    return row
