"""ProofNet: 371 undergraduate textbook exercises (analysis, algebra, topology)."""

from __future__ import annotations

from typing import Any, ClassVar

from leanrl.environment import Environment
from leanrl.taskset import Taskset

__all__ = ["ProofNet", "ProofNetDeepSeek", "ProofNetDeepSeekTaskset", "ProofNetTaskset"]


class ProofNetTaskset(Taskset):
    """The Lean 4 port rahul3613/ProofNet-lean4 (Lean/Mathlib v4.20.0), 185 valid / 186 test."""

    name = "proofnet"
    description = "ProofNet, Lean 4 port (v4.20.0): 185 valid / 186 test"
    hub_id = "PAug/ProofNetSharp"  # ProofNet#, the corrected port; columns differ, see docs
    filename = "proofnet.jsonl"
    lean_toolchain = "leanprover/lean4:v4.20.0"
    mathlib_rev = "c211948581bde9846a99e32d97a03f0d5307c31e"  # tag v4.20.0

    def category(self, name: str, data: dict[str, Any]) -> str | None:
        """The textbook (``Rudin``, ``Munkres``, ``Dummit-Foote``...), from the id."""
        ident = str(data.get("id") or name)
        return ident.split("|")[0] if "|" in ident else name.split("_exercise")[0]


class ProofNetDeepSeekTaskset(ProofNetTaskset):
    """DeepSeek-Prover's copy (Lean v4.9.0); names repeat across books, so ids are used."""

    name = "proofnet-deepseek"
    description = "ProofNet as DeepSeek-Prover reports it (Lean v4.9.0)"
    hub_id = "HaimingW/proofnet-lean4"
    filename = "proofnet_deepseek.jsonl"
    lean_toolchain = "leanprover/lean4:v4.9.0"
    mathlib_rev = "2f65ba7f1a9144b20c8e7358513548e317d26de1"
    mathlib_repo = "https://github.com/xinhjBrant/mathlib4"


class ProofNet(Environment):
    name = "proofnet"
    description = ProofNetTaskset.description
    taskset_class: ClassVar[type[Taskset]] = ProofNetTaskset


class ProofNetDeepSeek(Environment):
    name = "proofnet-deepseek"
    description = ProofNetDeepSeekTaskset.description
    taskset_class: ClassVar[type[Taskset]] = ProofNetDeepSeekTaskset
