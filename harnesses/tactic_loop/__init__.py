"""``tactic-loop`` harness: tactics one turn at a time against REPL tactic mode."""

from __future__ import annotations

from .harness import TacticLoopHarness, extract_tactics, join_tactics

__all__ = ["TacticLoopHarness", "extract_tactics", "join_tactics"]
