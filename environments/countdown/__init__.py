"""Countdown (the ES paper's task): reach a target number with given numbers and + - × ÷.

A built-in environment with a pure-Python reward and no Lean, so ES and GRPO can be compared on
a real model anywhere (``leanrl compare --env countdown``). Puzzles ship in ``data/`` and are
made by ``generate.py``; see ``docs/countdown.md``.
"""

from __future__ import annotations

from .arith import Checked, check_answer, evaluate
from .env import (
    Countdown,
    CountdownChecker,
    CountdownHarness,
    CountdownTaskset,
    parse_statement,
    puzzle_statement,
)

__all__ = [
    "Checked",
    "Countdown",
    "CountdownChecker",
    "CountdownHarness",
    "CountdownTaskset",
    "check_answer",
    "evaluate",
    "parse_statement",
    "puzzle_statement",
]
