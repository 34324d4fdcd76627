"""Core-Lean problems: miniF2F statements that need no Mathlib (ℕ/ℤ arithmetic only)."""

from __future__ import annotations

from typing import ClassVar

from leanrl.environment import Environment
from leanrl.taskset import Taskset

__all__ = ["Core", "CoreTaskset"]


class CoreTaskset(Taskset):
    """117 miniF2F statements rewritten for core Lean (``Nat``/``Int``, no imports).

    A syntactic filter: the statements are not known to elaborate or be provable without
    Mathlib; 34 rows marked ``ground`` are closed numeric facts that ``decide``/``omega`` close.
    Needs only a Lean toolchain, so it is the quickest way to try the whole pipeline.
    """

    name = "core"
    description = "core-Lean arithmetic from miniF2F, no Mathlib needed (117 statements)"
    hub_id = None  # no published dataset: give the local file
    filename = "core_candidates.jsonl"
    lean_toolchain = "leanprover/lean4:v4.24.0"
    mathlib_rev = None


class Core(Environment):
    name = "core"
    description = CoreTaskset.description
    taskset_class: ClassVar[type[Taskset]] = CoreTaskset
