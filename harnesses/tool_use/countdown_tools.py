"""A pure-Python tool for the learning check: Countdown with a calculator.

``calc(expr)`` evaluates an arithmetic expression exactly (the Countdown checker's own reader:
integers, ``+ - * /`` and parentheses, nothing run as code) and says its value; it never says
whether the expression solves the puzzle. ``submit(expr)`` hands in the answer, which the
Countdown checker judges after the episode. With ``calc_first`` (harness option), an answer is
taken only once ``calc`` has evaluated an expression in the episode: the rule "use the
calculator before you answer", which the learning check trains a tiny model to follow
(``benchmarks/tool_use.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from leanrl.environments.countdown.arith import NotAnAnswer, evaluate
from leanrl.verdict import Reason

from .tools import Answer, EpisodeTools, Tool, ToolResult, string_params

__all__ = ["CountdownTools", "countdown_tools"]


def countdown_tools() -> list[Tool]:
    """``calc`` and ``submit``."""
    return [
        Tool(
            "calc",
            "Evaluate an arithmetic expression (integers, + - * / and parentheses).",
            string_params(expr="the expression, e.g. (25 - 5) * 3"),
        ),
        Tool(
            "submit",
            "Hand in the final answer: an expression that uses every given number once and "
            "equals the target. The episode ends.",
            string_params(expr="the expression"),
        ),
    ]


def _shown(v: Fraction) -> str:
    return str(v.numerator) if v.denominator == 1 else f"{v} (about {float(v):.6g})"


def _key(expr: str) -> str:
    return "".join(expr.split())


class CountdownTools(EpisodeTools):
    """One Countdown episode's calculator and answer box."""

    def __init__(self, *, calc_first: bool = False) -> None:
        super().__init__()
        self.calc_first = calc_first
        self.evaluated: set[str] = set()
        self._tools = countdown_tools()

    @property
    def tools(self) -> Sequence[Tool]:
        return self._tools

    async def run(self, name: str, args: dict[str, Any]) -> ToolResult:
        expr = str(args["expr"])
        if name == "calc":
            try:
                value, _ = evaluate(expr)
            except NotAnAnswer as e:
                return ToolResult(f"Error: {e}", ok=False)
            self.evaluated.add(_key(expr))
            return ToolResult(f"= {_shown(value)}")
        if not expr.strip():
            return ToolResult("Error: the answer is empty", ok=False)
        if self.calc_first and not self.evaluated:
            return ToolResult("Error: evaluate an expression with calc before submitting", ok=False)
        self.answer = Answer(proof=expr.strip())
        return ToolResult("Submitted.", submitted=True)

    def read_text(self, text: str, finish_reason: str | None) -> Answer | None:
        """Answers go through ``submit`` only: a final turn without a call has none."""
        return Answer(reason=Reason.NO_PROOF, detail="no answer submitted (call submit)")
