"""PutnamBench: 672 Putnam competition problems (1962-2024), all in the ``test`` split."""

from __future__ import annotations

from typing import Any, ClassVar

from leanrl.environment import Environment
from leanrl.task import Task
from leanrl.taskset import RawRow, Taskset

__all__ = ["PutnamBench", "PutnamBenchTaskset"]


class PutnamBenchTaskset(Taskset):
    """trishullab/PutnamBench (Lean/Mathlib v4.27.0).

    Problems with an answer (``abbrev putnam_..._solution : T := sorry``) are loaded with the
    official answer filled in by default (``formal_statement_with_answer``): otherwise the
    statement itself depends on ``sorry`` and no proof could ever be accepted under the strict
    policy. For the answer-free track, subclass and override :meth:`row_to_task`.
    """

    name = "putnambench"
    description = "PutnamBench (v4.27.0): 672 Putnam problems, answers filled in"
    hub_id = "HaimingW/PutnamBench-lean4"  # a third-party, older snapshot; the official copy is on GitHub
    filename = "putnambench.jsonl"
    lean_toolchain = "leanprover/lean4:v4.27.0"
    mathlib_rev = "a3a10db0e9d66acbebf76c5e6a135066525ac900"  # tag v4.27.0

    def row_to_task(self, row: RawRow) -> Task:
        data = row.data
        if data.get("formal_statement_with_answer"):
            data = {**data, "formal_statement": data["formal_statement_with_answer"]}
        return super().row_to_task(RawRow(origin=row.origin, index=row.index, data=data))

    def category(self, name: str, data: dict[str, Any]) -> str | None:
        """The first topic tag (``algebra``, ``analysis``, ``number_theory``...)."""
        tags = data.get("tags") or []
        return str(tags[0]) if tags else None


class PutnamBench(Environment):
    name = "putnambench"
    description = PutnamBenchTaskset.description
    taskset_class: ClassVar[type[Taskset]] = PutnamBenchTaskset
