"""ES with a difficulty curriculum: the population's attempts fill the run's difficulty table,
solved tasks leave the draw, and a resume repeats the tasks of the uninterrupted run."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from test_es_learning import toy_config
from test_es_trainer import run_steps

from leanrl.train.curriculum import DIFFICULTY_FILE
from leanrl.train.es.workers import IterationState, Member, MemberScore

SOLVED = "toy_a"  # the one task every member solves (a task id of the toy taskset)


class PassScorer:
    """Every member solves task ``SOLVED`` and fails the others (reward 1 or 0), one attempt
    per task; records the tasks each iteration was given."""

    def __init__(self) -> None:
        self.tasks: list[list[str]] = []

    async def start(self) -> None:
        return None

    async def score(self, state: IterationState, members: Sequence[Member]) -> list[MemberScore]:
        ids = [str(t.id) for t in state.tasks]
        self.tasks.append(ids)
        passed = [i == SOLVED for i in ids]
        rewards = [float(p) + 0.01 * k for k, p in enumerate(passed)]  # distinct: an update
        return [
            MemberScore(
                reward=sum(rewards) / len(rewards) + 0.001 * j,
                pass_rate=sum(passed) / len(passed),
                rewards=rewards,
                task_ids=ids,
                passed=passed,
            )
            for j, _ in enumerate(members)
        ]

    async def close(self) -> None:
        return None


def _cfg(model: Path, out: Path, steps: int) -> Any:
    return toy_config(
        model,
        out,
        steps=steps,
        tasks_per_step=2,
        population=2,
        save_every=2,
        curriculum={"mode": "drop_solved", "min_attempts": 2},
    )


def test_a_solved_task_leaves_the_draw_and_the_table_is_in_the_run(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    scorer = PassScorer()
    _, rows = run_steps(_cfg(tiny_model_dir, tmp_path / "run", 6), scorer, 6)
    first = next(k for k, ids in enumerate(scorer.tasks) if SOLVED in ids)
    assert all(SOLVED not in ids for ids in scorer.tasks[first + 1 :]), scorer.tasks
    table = json.loads((tmp_path / "run" / DIFFICULTY_FILE).read_text())
    assert table  # written in the run folder
    assert rows[-1]["curriculum/dropped"] == 1  # SOLVED, with 2 members' attempts at it


def test_resume_repeats_the_uninterrupted_tasks(tiny_model_dir: Path, tmp_path: Path) -> None:
    straight = PassScorer()
    run_steps(_cfg(tiny_model_dir, tmp_path / "a", 6), straight, 6)
    first, second = PassScorer(), PassScorer()
    run_steps(_cfg(tiny_model_dir, tmp_path / "b", 6), first, 3)  # stops after 3 iterations
    run_steps(_cfg(tiny_model_dir, tmp_path / "b", 6), second, 3)  # resumes at iteration 4
    assert first.tasks + second.tasks == straight.tasks
