"""Difficulty-aware task sampling, shared by GRPO, expert iteration and ES.

A run with ``curriculum.mode`` other than ``off`` keeps a per-task table of attempts, passes
and reward (``RUN_DIR/difficulty.json``, written atomically after every step) and chooses each
step's tasks from it:

- ``drop_solved``: leave out the tasks solved more often than ``easy_above`` (Kimina-Prover's
  RL drops statements whose win rate is over 0.5: they teach little and cost rollouts);
- ``frontier``: draw the tasks on the frontier (neither mostly solved nor never solved, or not
  yet tried ``min_attempts`` times) ``frontier_weight`` times as often as the others;
- ``pools``: draw ``easy_fraction`` of each batch from the easy pool, ``hard_fraction`` from
  the hard pool and the rest from the frontier (prime-rl's difficulty pools, whose easy and
  hard pools are set by a problem's reward the same way).

``off`` (the default) is :func:`leanrl.train.common.batch_for_step`, exactly: no table, no
file, no metrics, so existing runs replay.

**Resume.** The table holds the counts of every step separately (``steps``) on top of a
``base`` (the warm start, plus the steps folded in once no checkpoint could need them back).
The sampler at step ``s`` reads only the steps before ``s``, so a step's batch depends only on
(tasks, seed, step, the steps before it) whatever ran ahead of it (async generation). A resume
at step ``S`` drops the steps from ``S`` on (recorded after the checkpoint it resumes from,
then redone), and recording a step replaces what an earlier attempt at it recorded, so no
attempt is counted twice. Steps are folded into the base only below the oldest checkpoint in
the folder (a resume never goes further back). A resume that starts the run over (no usable
checkpoint) rebuilds the table from the warm start.

The trainers call it the same way (``leanrl.train.es`` too)::

    cur = Curriculum.open(config.curriculum, tasks, run.path, before=start_step, seed=config.seed,
                          writer=is_main)
    batch = cur.select(step, tasks_per_step, seed)         # this step's tasks
    row.update(cur.metrics(step))                          # curriculum/easy, /frontier, ...
    cur.record(step, outcomes)                             # (task_id, passed, reward) per attempt
"""

from __future__ import annotations

import json
import logging
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from leanrl.errors import ConfigError
from leanrl.task import Task
from leanrl.train.common import RunDir, _atomic_write, batch_for_step

__all__ = [
    "DIFFICULTY_FILE",
    "Curriculum",
    "CurriculumConfig",
    "DifficultyTable",
    "Outcome",
    "TaskCounts",
    "read_results",
    "rollout_outcomes",
]

log = logging.getLogger("leanrl.train.curriculum")

DIFFICULTY_FILE = "difficulty.json"
"""The run folder's per-task table (attempts, passes, reward), written atomically."""

_FORMAT = 1

Outcome = tuple[str, bool, float]
"""One judged attempt: (task id, accepted, reward). Attempts the checker could not judge
(``infra``) are no outcome and are left out by the caller."""


class CurriculumConfig(BaseModel):
    """How a trainer chooses its tasks by difficulty (``--curriculum.mode pools``)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    mode: Literal["off", "drop_solved", "frontier", "pools"] = "off"
    """``off`` (the default): the seeded epoch order of ``batch_for_step``, as before.
    ``drop_solved``: leave out the easy tasks (rate above ``easy_above``; Kimina-Prover's RL
    drops statements with a win rate over 0.5). ``frontier``: draw frontier tasks
    ``frontier_weight`` times as often. ``pools``: ``easy_fraction`` / ``hard_fraction`` of
    each batch from the easy / hard pools, the rest from the frontier (prime-rl's difficulty
    pools)."""
    signal: Literal["pass", "reward"] = "pass"
    """What a task's rate is: its share of accepted attempts (``pass``), or its mean reward
    (``reward``: for environments whose reward is graded, such as Countdown's ``dense``)."""
    easy_above: float = Field(default=0.5, ge=0.0, le=1.0)
    """A task whose rate is above this is easy (0.5: Kimina-Prover RL's win-rate cut)."""
    hard_at_most: float = Field(default=0.0, ge=0.0, le=1.0)
    """A task whose rate is at most this (after ``min_attempts``) is hard (0: never solved)."""
    min_attempts: int = Field(default=4, ge=1)
    """Attempts a task needs before its rate counts; until then it is on the frontier (untried
    tasks are explored, never dropped)."""
    frontier_weight: float = Field(default=4.0, ge=1.0)
    """``frontier``: how many times as often a frontier task is drawn as an easy or hard one."""
    easy_fraction: float = Field(default=0.1, ge=0.0, le=1.0)
    """``pools``: share of each batch drawn from the easy pool (prime-rl's ``easy_fraction``).
    A pool with too few tasks gives its share to the frontier, then hard, then easy pool."""
    hard_fraction: float = Field(default=0.2, ge=0.0, le=1.0)
    """``pools``: share of each batch drawn from the hard pool (prime-rl's ``hard_fraction``)."""
    warm_start: Path | None = None
    """An eval's ``results.jsonl`` (``leanrl eval --out DIR`` writes ``DIR/results.jsonl``):
    its attempts start the table, matched to the training tasks by task id, so the first step
    already knows which tasks the model solves."""

    @property
    def active(self) -> bool:
        """Whether a table is kept (any mode but ``off``)."""
        return self.mode != "off"

    @model_validator(mode="after")
    def _consistent(self) -> CurriculumConfig:
        if self.hard_at_most >= self.easy_above:
            raise ValueError(
                f"curriculum.hard_at_most ({self.hard_at_most}) must be below "
                f"curriculum.easy_above ({self.easy_above}): a task cannot be easy and hard"
            )
        if self.easy_fraction + self.hard_fraction > 1.0 + 1e-9:
            raise ValueError(
                f"curriculum.easy_fraction + curriculum.hard_fraction = "
                f"{self.easy_fraction + self.hard_fraction:g} is over 1: lower one of them "
                "(the frontier pool gets what is left)"
            )
        return self


@dataclass
class TaskCounts:
    """One task's record: judged attempts, accepted ones, and their summed reward."""

    attempts: int = 0
    passes: int = 0
    reward: float = 0.0

    def add(self, other: TaskCounts) -> None:
        self.attempts += other.attempts
        self.passes += other.passes
        self.reward += other.reward

    def rate(self, signal: str) -> float:
        if not self.attempts:
            return 0.0
        return (self.passes if signal == "pass" else self.reward) / self.attempts


def _counts_of(outcomes: Iterable[Outcome]) -> dict[str, TaskCounts]:
    out: dict[str, TaskCounts] = {}
    for task_id, passed, reward in outcomes:
        c = out.setdefault(str(task_id), TaskCounts())
        c.attempts += 1
        c.passes += int(bool(passed))
        c.reward += float(reward) if math.isfinite(reward) else 0.0
    return out


class DifficultyTable:
    """Per-task counts: a ``base`` (counts of steps before ``base_before``, warm start
    included) plus each later step's own counts, so a resume can take steps back."""

    def __init__(
        self,
        base: dict[str, TaskCounts] | None = None,
        base_before: int = 0,
        steps: dict[int, dict[str, TaskCounts]] | None = None,
    ) -> None:
        self.base = base or {}
        self.base_before = base_before
        self.steps = steps or {}

    def record(self, step: int, outcomes: Iterable[Outcome]) -> None:
        """Set ``step``'s counts to these outcomes (replacing any earlier record of the step:
        a redone step is not counted twice)."""
        if step < self.base_before:
            raise ValueError(f"step {step} is folded into the table's base already")
        self.steps[step] = _counts_of(outcomes)

    def counts(self, before: int | None = None) -> dict[str, TaskCounts]:
        """Every task's counts over the base and the steps before ``before`` (None: all)."""
        out = {k: TaskCounts(c.attempts, c.passes, c.reward) for k, c in self.base.items()}
        for s in sorted(self.steps):
            if before is not None and s >= before:
                continue
            for k, c in self.steps[s].items():
                out.setdefault(k, TaskCounts()).add(c)
        return out

    def rollback(self, before: int) -> None:
        """Forget the steps from ``before`` on (a resume at ``before`` redoes them)."""
        if before < self.base_before:
            raise ValueError(f"steps before {self.base_before} are folded into the base")
        self.steps = {s: c for s, c in self.steps.items() if s < before}

    def fold(self, before: int) -> None:
        """Merge the steps before ``before`` into the base (no resume goes back past them)."""
        if before <= self.base_before:
            return
        for s in sorted(self.steps):
            if s < before:
                for k, c in self.steps.pop(s).items():
                    self.base.setdefault(k, TaskCounts()).add(c)
        self.base_before = before

    @property
    def written_at(self) -> int:
        """How many steps the table holds: one past the last recorded step."""
        return max([self.base_before, *(s + 1 for s in self.steps)])

    # -- files --------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        def enc(counts: dict[str, TaskCounts]) -> dict[str, list[float]]:
            return {k: [c.attempts, c.passes, c.reward] for k, c in sorted(counts.items())}

        return {
            "format": _FORMAT,
            "step": self.written_at,
            "base_before": self.base_before,
            "base": enc(self.base),
            "steps": {str(s): enc(self.steps[s]) for s in sorted(self.steps)},
        }

    def save(self, path: Path) -> None:
        """Write the table to ``path`` atomically (a kill leaves the old file or the new)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(path, json.dumps(self.to_json(), separators=(",", ":")))

    @classmethod
    def load(cls, path: Path) -> DifficultyTable:
        """The table saved at ``path`` (a ConfigError naming it when it cannot be read)."""

        def dec(raw: Any) -> dict[str, TaskCounts]:
            return {str(k): TaskCounts(int(v[0]), int(v[1]), float(v[2])) for k, v in raw.items()}

        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("format") != _FORMAT:
                raise ValueError(f"format {data.get('format')!r}, expected {_FORMAT}")
            return cls(
                dec(data["base"]),
                int(data["base_before"]),
                {int(s): dec(c) for s, c in data["steps"].items()},
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
            raise ConfigError(
                f"{path} is damaged ({type(e).__name__}: {e}): delete it to rebuild the "
                "difficulty table from curriculum.warm_start (the counts of earlier steps are "
                "lost), or start the run in a new --out folder"
            ) from None

    @classmethod
    def from_results(cls, path: Path, task_ids: Iterable[str]) -> DifficultyTable:
        """A table whose base is an eval's ``results.jsonl`` (``curriculum.warm_start``),
        restricted to ``task_ids`` (see :func:`read_results`)."""
        try:
            found = read_results(path)
        except OSError as e:
            raise ConfigError(
                f"curriculum.warm_start {path} cannot be read ({e.strerror or e}): give the "
                "results.jsonl of a `leanrl eval --out DIR` run (DIR/results.jsonl)"
            ) from None
        wanted = set(task_ids)
        matched = [o for o in found if o[0] in wanted]
        if found and not matched:
            some = ", ".join(sorted({o[0] for o in found})[:3])
            raise ConfigError(
                f"curriculum.warm_start {path} holds no attempt at a training task (its task "
                f"ids, e.g. {some}, match none of this run's): give an eval of the same "
                "taskset, or leave warm_start unset"
            )
        return cls(_counts_of(matched), 0, {})


def read_results(path: Path) -> list[Outcome]:
    """The judged attempts of an eval's ``results.jsonl`` (one JSON line per attempt, keyed by
    ``task_id`` and ``sample``; the last line of a key wins). Unchecked attempts (no verdict)
    and ``infra`` ones are no outcome; a torn last line (a kill) is skipped, other unreadable
    lines too, with a warning. An OSError when the file cannot be read."""
    lines = path.read_text(encoding="utf-8").splitlines()
    seen: dict[tuple[str, int], Outcome] = {}
    bad = 0
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            key = (str(rec["task_id"]), int(rec["sample"]))
        except (ValueError, KeyError, TypeError):
            bad += n < len(lines)  # a torn last line is what a kill leaves: not damage
            continue
        verdict = rec.get("verdict")
        if not isinstance(verdict, dict) or verdict.get("reason") == "infra":
            continue  # unchecked, or the checker could not judge it: no outcome
        reward = rec.get("reward")
        reward = float(reward) if isinstance(reward, (int, float)) else 0.0
        seen[key] = (key[0], bool(rec.get("accepted")), reward)
    if bad:
        log.warning("%s: %d unreadable line(s) left out", path, bad)
    return list(seen.values())


# -- sampling --------------------------------------------------------------------------------------


def _draw(rng: random.Random, items: Sequence[Task], k: int, *, repeat: bool) -> list[Task]:
    """``k`` of ``items`` without replacement; past ``len(items)``, fresh shuffled passes
    (``repeat``) or only what there is."""
    out: list[Task] = []
    while len(out) < k and items:
        perm = list(items)
        rng.shuffle(perm)
        out += perm[: k - len(out)]
        if not repeat:
            break
    return out


def _draw_weighted(
    rng: random.Random, items: Sequence[Task], weights: Sequence[float], k: int, *, repeat: bool
) -> list[Task]:
    """``k`` of ``items`` without replacement, item i with probability proportional to
    ``weights[i]`` at each draw (Efraimidis & Spirakis 2006: the k largest ``u ** (1 / w)``)."""
    out: list[Task] = []
    while len(out) < k and items:
        keys = [rng.random() ** (1.0 / w) for w in weights]
        order = sorted(range(len(items)), key=lambda i: keys[i], reverse=True)
        out += [items[i] for i in order[: k - len(out)]]
        if not repeat:
            break
    return out


class Curriculum:
    """Chooses a step's tasks by difficulty and keeps the table (see the module docstring).

    ``open`` loads (or starts) the table for a run resuming at step ``before``; ``select``
    gives a step's tasks; ``record`` stores a step's outcomes and saves the table (``writer``:
    the process that writes the run folder, rank 0). With ``mode = "off"`` nothing is kept and
    ``select`` is :func:`batch_for_step`."""

    def __init__(
        self,
        config: CurriculumConfig,
        tasks: Sequence[Task],
        table: DifficultyTable | None,
        path: Path | None,
        *,
        writer: bool = True,
    ) -> None:
        self.config = config
        self.tasks = list(tasks)
        self.table = table
        self.path = path
        self.writer = writer
        self._warned_empty = False

    @classmethod
    def open(
        cls,
        config: CurriculumConfig,
        tasks: Sequence[Task],
        run_dir: Path,
        *,
        before: int,
        writer: bool = True,
    ) -> Curriculum:
        """The curriculum of the run in ``run_dir`` resuming at step ``before`` (0: a fresh
        start): its saved table with the steps from ``before`` on dropped, else the warm start."""
        if not config.active:
            return cls(config, tasks, None, None, writer=writer)
        path = Path(run_dir) / DIFFICULTY_FILE
        table: DifficultyTable | None = None
        if path.is_file():
            table = DifficultyTable.load(path)
            if table.base_before > before:
                if before > 0:
                    log.warning(
                        "%s: the steps before %d are folded together, so the table cannot go "
                        "back to step %d; it restarts from curriculum.warm_start",
                        path,
                        table.base_before,
                        before,
                    )
                table = None  # a run started over (no usable checkpoint): the warm start
            else:
                table.rollback(before)
        elif before > 0:
            log.warning(
                "%s is missing: the difficulty table restarts from curriculum.warm_start at "
                "step %d",
                path,
                before,
            )
        if table is None:
            ids = [t.id for t in tasks]
            ws = config.warm_start
            table = DifficultyTable.from_results(ws, ids) if ws is not None else DifficultyTable()
            table.base_before = 0
        cur = cls(config, tasks, table, path, writer=writer)
        if writer:
            cur.save()  # the file now matches the step the run resumes at
        return cur

    # -- pools ----------------------------------------------------------------------------------

    def pool_of(self, counts: TaskCounts | None) -> Literal["easy", "frontier", "hard"]:
        """A task's pool given its counts (None or too few attempts: the frontier)."""
        cfg = self.config
        if counts is None or counts.attempts < cfg.min_attempts:
            return "frontier"
        rate = counts.rate(cfg.signal)
        if rate > cfg.easy_above:
            return "easy"
        if rate <= cfg.hard_at_most:
            return "hard"
        return "frontier"

    def pools(self, step: int, candidates: Sequence[Task] | None = None) -> dict[str, list[Task]]:
        """``candidates`` (default: every task) by pool, from the steps before ``step``."""
        assert self.table is not None
        counts = self.table.counts(before=step)
        out: dict[str, list[Task]] = {"easy": [], "frontier": [], "hard": []}
        for t in self.tasks if candidates is None else candidates:
            out[self.pool_of(counts.get(t.id))].append(t)
        return out

    def metrics(self, step: int, candidates: Sequence[Task] | None = None) -> dict[str, Any]:
        """Pool sizes for a metrics row (``curriculum/easy``, ``/frontier``, ``/hard``,
        ``/unseen``, ``/dropped``); empty when the curriculum is off."""
        if self.table is None:
            return {}
        pools = self.pools(step, candidates)
        counts = self.table.counts(before=step)
        pool = self.tasks if candidates is None else candidates
        unseen = sum(
            1
            for t in pool
            if counts.get(t.id) is None or counts[t.id].attempts < self.config.min_attempts
        )
        dropped = len(pools["easy"]) if self.config.mode == "drop_solved" else 0
        return {
            "curriculum/easy": len(pools["easy"]),
            "curriculum/frontier": len(pools["frontier"]),
            "curriculum/hard": len(pools["hard"]),
            "curriculum/unseen": unseen,
            "curriculum/dropped": dropped,
        }

    # -- choosing ---------------------------------------------------------------------------------

    def select(
        self,
        step: int,
        count: int,
        seed: int,
        candidates: Sequence[Task] | None = None,
        *,
        repeat: bool = True,
    ) -> list[Task]:
        """The tasks of ``step``: ``count`` of ``candidates`` (default: every task), from the
        table as it stood before ``step`` and ``(seed, step)`` only, so a resume repeats it.

        ``repeat``: when fewer tasks are eligible than ``count``, draw them again (GRPO, ES:
        a batch has a fixed size) or return only those (expert iteration: a task once a round).
        Mode ``off``: ``batch_for_step(candidates, step, count, seed)``, today's order."""
        pool = self.tasks if candidates is None else list(candidates)
        cfg = self.config
        if self.table is None:
            return batch_for_step(pool, step, count, seed)
        if not pool:
            raise ConfigError("the taskset is empty: check the split, names, pattern and limit")
        # a string seed is hashed the same way in every process (not PYTHONHASHSEED's hash)
        rng = random.Random(f"leanrl-curriculum:{seed}:{step}")
        pools = self.pools(step, pool)
        if cfg.mode == "drop_solved":
            keep = pools["frontier"] + pools["hard"]
            if not keep:
                if not self._warned_empty:
                    self._warned_empty = True
                    log.warning(
                        "curriculum: every task is above easy_above = %g at step %d; drawing "
                        "from all of them (nothing is left to drop to)",
                        cfg.easy_above,
                        step,
                    )
                keep = pool
            ids = {t.id for t in keep}
            keep = [t for t in pool if t.id in ids]  # the candidates' order: stable draws
            return _draw(rng, keep, count, repeat=repeat)
        if cfg.mode == "frontier":
            front = {t.id for t in pools["frontier"]}
            weights = [cfg.frontier_weight if t.id in front else 1.0 for t in pool]
            return _draw_weighted(rng, pool, weights, count, repeat=repeat)
        return self._from_pools(rng, pools, count, repeat=repeat)

    def _from_pools(
        self, rng: random.Random, pools: dict[str, list[Task]], count: int, *, repeat: bool
    ) -> list[Task]:
        """``pools`` mode: each pool's share of ``count``; a pool short of its share gives the
        rest to the frontier, then the hard, then the easy pool; past every task, repeats."""
        cfg = self.config
        want = {"easy": round(count * cfg.easy_fraction), "hard": round(count * cfg.hard_fraction)}
        want["frontier"] = count - want["easy"] - want["hard"]
        take = {p: min(want[p], len(pools[p])) for p in want}
        short = count - sum(take.values())
        for p in ("frontier", "hard", "easy"):
            extra = min(short, len(pools[p]) - take[p])
            take[p] += extra
            short -= extra
        out: list[Task] = []
        for p in ("easy", "frontier", "hard"):
            out += _draw(rng, pools[p], take[p], repeat=False)
        if short and repeat:  # fewer tasks than a batch: another pass over all of them
            everyone = pools["easy"] + pools["frontier"] + pools["hard"]
            out += _draw(rng, everyone, short, repeat=True)
        rng.shuffle(out)  # pools mixed through the batch (rollout chunks see all kinds)
        return out

    # -- recording ---------------------------------------------------------------------------------

    def record(self, step: int, outcomes: Iterable[Outcome]) -> None:
        """Store ``step``'s judged attempts (replacing an earlier record of it) and save."""
        if self.table is None:
            return
        self.table.record(step, outcomes)
        if self.writer:
            self.save()

    def save(self) -> None:
        """Write ``difficulty.json``, first folding in the steps before the oldest checkpoint
        in the run folder (no resume goes back further)."""
        if self.table is None or self.path is None:
            return
        ckpts = RunDir(self.path.parent).checkpoints()
        if ckpts:
            self.table.fold(min(ckpts[0][0], self.table.written_at))
        self.table.save(self.path)


def rollout_outcomes(tasks: Sequence[Task], groups: Sequence[Sequence[Any]]) -> list[Outcome]:
    """The judged outcomes of one group of rollouts per task (``infra`` attempts left out)."""
    out: list[Outcome] = []
    for task, group in zip(tasks, groups, strict=True):
        for r in group:
            if getattr(r, "infra", False):
                continue
            v = getattr(r, "verdict", None)
            out.append((task.id, bool(v is not None and v.accepted), float(r.reward)))
    return out
