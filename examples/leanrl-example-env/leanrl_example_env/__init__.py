"""An example third-party environment: closed arithmetic facts that core Lean proves by ``decide``.

It shows the two hooks a new benchmark needs: :meth:`Taskset.load_rows` (where rows come from;
here, generated in code) and the ``taskset_class`` of an :class:`Environment`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from leanrl import Environment, Taskset
from leanrl.taskset import RawRow

__all__ = ["ArithEnvironment", "ArithTaskset"]


class ArithTaskset(Taskset):
    """``a * b % m = r`` for small numbers, needing no Mathlib."""

    name = "example-arith"
    description = "example third-party env: small Nat arithmetic facts (core Lean)"
    lean_toolchain = "leanprover/lean4:v4.24.0"

    def load_rows(self) -> Iterator[RawRow]:
        for i, (a, b, m) in enumerate([(7, 8, 5), (12, 13, 7), (21, 4, 9), (6, 6, 10), (9, 11, 4)]):
            name = f"arith_{i}"
            stmt = f"theorem {name} : {a} * {b} % {m} = {a * b % m} := by"
            yield RawRow(
                origin="generated",
                index=i + 1,
                data={"name": name, "header": "", "formal_statement": stmt, "split": "test"},
            )


class ArithEnvironment(Environment):
    name = "example-arith"
    description = ArithTaskset.description
    taskset_class: ClassVar[type[Taskset]] = ArithTaskset
