"""Countdown arithmetic: read an answer like ``(25 - 5) * 3 + 1``, check it, score it.

Pure Python and exact: the expression is parsed with :mod:`ast` (only integer literals, ``+ - *
/``, unary minus and parentheses are allowed; anything else is not an answer) and evaluated in
:class:`fractions.Fraction`, so ``7 / 2 * 2`` is exactly 7 and nothing is evaluated as code.
"""

from __future__ import annotations

import ast
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

__all__ = ["Checked", "check_answer", "evaluate"]

_MAX_CHARS = 200
"""Longer answers are rejected unparsed (a Countdown answer is a short expression)."""
_MAX_LITERAL = 10**6
"""Bigger literals are rejected (no 10**100000 games with the evaluator)."""


class NotAnAnswer(ValueError):
    """The text is not an arithmetic expression over integer literals."""


def evaluate(text: str) -> tuple[Fraction, list[int]]:
    """The exact value of ``text`` and the integer literals it uses, in order.

    Raises :class:`NotAnAnswer` for anything but ``+ - * /``, parentheses and integers, and
    for a division by zero.
    """
    if len(text) > _MAX_CHARS:
        raise NotAnAnswer(f"longer than {_MAX_CHARS} characters")
    try:
        # Answers are model output: the parser warns on some of them (an invalid escape in a
        # string, `1if`), a DeprecationWarning or SyntaxWarning that would land on the user's
        # terminal, and that `-W error` would turn into a SyntaxError with another verdict
        # detail. Ignored here, whatever the caller's filters, so the verdict depends on the
        # text alone (such answers are refused below anyway: strings and names are not numbers).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise NotAnAnswer(f"not an expression ({e.msg})") from None
    used: list[int] = []

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            if node.value > _MAX_LITERAL:
                raise NotAnAnswer(f"number {node.value} is too large")
            used.append(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.BinOp) and isinstance(
            node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)
        ):
            a, b = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Add):
                return a + b
            if isinstance(node.op, ast.Sub):
                return a - b
            if isinstance(node.op, ast.Mult):
                return a * b
            if b == 0:
                raise NotAnAnswer("division by zero")
            return a / b
        raise NotAnAnswer(f"{type(node).__name__} is not allowed (only + - * / and integers)")

    return walk(tree.body), used


@dataclass(frozen=True)
class Checked:
    """What one answer achieved."""

    correct: bool
    """Every given number used exactly once, nothing else, and the value is the target."""
    parsed: bool
    """The answer is an arithmetic expression over integers."""
    detail: str
    """Why it is not correct (empty when it is)."""
    numbers_used: int = 0
    """How many of the given numbers the answer uses (each counted at most as often as given)."""
    foreign: int = 0
    """Literals in the answer that are not among the given numbers (or used too often)."""
    value: Fraction | None = None
    """The answer's value, when it parsed."""


def check_answer(answer: str, numbers: Sequence[int], target: int) -> Checked:
    """Judge ``answer`` for the puzzle (``numbers``, ``target``)."""
    if not answer.strip():
        return Checked(False, False, "no answer")
    try:
        value, used = evaluate(answer)
    except NotAnAnswer as e:
        return Checked(False, False, f"not an arithmetic answer: {e}")
    have, want = Counter(used), Counter(numbers)
    hits = sum((have & want).values())
    foreign = sum((have - want).values())
    if foreign:
        extra = sorted((have - want).elements())
        return Checked(
            False, True, f"uses numbers not given (or too often): {extra}", hits, foreign, value
        )
    if hits < len(numbers):
        missing = sorted((want - have).elements())
        return Checked(
            False, True, f"does not use every number: {missing} unused", hits, foreign, value
        )
    if value != target:
        shown = str(value) if value.denominator == 1 else f"{float(value):.4g}"
        return Checked(False, True, f"equals {shown}, not {target}", hits, foreign, value)
    return Checked(True, True, "", hits, foreign, value)
