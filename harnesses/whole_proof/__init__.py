"""``whole-proof`` harness: one turn, the model writes the whole proof (see docs/harnesses.md)."""

from __future__ import annotations

from .extract import Extracted, extract_proof
from .harness import WholeProofHarness, check_and_reward
from .prompts import FORMATS, build_prompt

__all__ = [
    "FORMATS",
    "Extracted",
    "WholeProofHarness",
    "build_prompt",
    "check_and_reward",
    "extract_proof",
]
