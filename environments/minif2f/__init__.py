"""miniF2F: 488 competition problems (AMC, AIME, IMO, MATH), split 244 valid / 244 test."""

from __future__ import annotations

import re
from typing import Any, ClassVar

from leanrl.environment import Environment
from leanrl.taskset import Taskset

__all__ = ["MiniF2F", "MiniF2FDeepSeek", "MiniF2FDeepSeekTaskset", "MiniF2FTaskset"]


class MiniF2FTaskset(Taskset):
    """The maintained Lean 4 port (yangky11/miniF2F-lean4), Lean/Mathlib v4.24.0."""

    name = "minif2f"
    description = "miniF2F, maintained Lean 4 port (v4.24.0): 244 valid / 244 test"
    hub_id = "cat-searcher/minif2f-lean4"
    filename = "minif2f.jsonl"
    lean_toolchain = "leanprover/lean4:v4.24.0"
    mathlib_rev = "f897ebcf72cd16f89ab4577d0c826cd14afaafc7"  # tag v4.24.0

    def category(self, name: str, data: dict[str, Any]) -> str | None:
        """``mathd_algebra``, ``amc12a``, ``imo``, ``aime``, ``induction`` ... from the name."""
        if name.startswith("mathd_"):
            return "_".join(name.split("_")[:2])
        m = re.match(r"[a-zA-Z]+\d*[a-zA-Z]?", name)
        head = m.group(0) if m else name
        for family in ("amc12", "aime", "imo", "algebra", "numbertheory", "induction"):
            if head.lower().startswith(family):
                return family
        return head


class MiniF2FDeepSeekTaskset(MiniF2FTaskset):
    """DeepSeek-Prover's copy (Lean v4.9.0): the statements behind the published DeepSeek-Prover
    V1.5/V2, Goedel-Prover and Kimina-Prover numbers."""

    name = "minif2f-deepseek"
    description = "miniF2F as DeepSeek-Prover/Goedel/Kimina report it (Lean v4.9.0)"
    hub_id = "Slim205/minif2f"
    filename = "minif2f_deepseek.jsonl"
    lean_toolchain = "leanprover/lean4:v4.9.0"
    mathlib_rev = "2f65ba7f1a9144b20c8e7358513548e317d26de1"
    mathlib_repo = "https://github.com/xinhjBrant/mathlib4"  # branch `deepseek`


class MiniF2F(Environment):
    name = "minif2f"
    description = MiniF2FTaskset.description
    taskset_class: ClassVar[type[Taskset]] = MiniF2FTaskset


class MiniF2FDeepSeek(Environment):
    name = "minif2f-deepseek"
    description = MiniF2FDeepSeekTaskset.description
    taskset_class: ClassVar[type[Taskset]] = MiniF2FDeepSeekTaskset
