"""What the model is shown after a rejected attempt: Lean's errors, placed in its own code.

Each error of the verdict (up to a limit) is shown with the lines of the checked Lean text around
it and ``<error>`` ... ``</error>`` around the span Lean reported, then Lean's message (which
holds the unsolved goals, for "unsolved goals" errors), in the layout of Goedel-Prover-V2's
self-correction prompts. A verdict without positioned errors (no proof found, cut off, a changed
statement, ``sorry``, a timeout) is described by its reason and detail instead.

Positions are those of :class:`~leanrl.Verdict` messages: relative to the checked text, that is
helper lemmas + statement + proof without the header (``Task.lean_text`` minus the header).
A position outside that text is shown without code.
"""

from __future__ import annotations

from dataclasses import dataclass

from leanrl.task import Task
from leanrl.verdict import Message, Verdict

__all__ = ["ErrorShown", "checked_text", "errors_shown", "render_errors"]

#: Lines of code shown before the line of an error, and lines of a multi-line span.
_BEFORE = 4
_SPAN_LINES = 6


@dataclass(frozen=True)
class ErrorShown:
    """One error as shown: the code around it (markers in place) and Lean's message."""

    code: str
    message: str


def checked_text(task: Task, proof: str, preamble: str = "", restated_statement: str = "") -> str:
    """The text Lean's message positions refer to (the attempt without its header); with the
    model's own ``restated_statement`` in place of the reference when it made one."""
    if restated_statement:
        task = task.model_copy(update={"formal_statement": restated_statement})
    return task.lean_text(proof, preamble)[len(task.header) :]


def errors_shown(verdict: Verdict, text: str, limit: int) -> tuple[list[ErrorShown], int]:
    """The errors to show (at most ``limit``) and how many more there were."""
    errors = [m for m in verdict.messages if m.severity == "error"]
    return [_one(m, text) for m in errors[:limit]], max(0, len(errors) - limit)


def _one(m: Message, text: str) -> ErrorShown:
    lines = text.split("\n")
    if m.pos is None or not 1 <= m.pos.line <= len(lines):
        return ErrorShown("", m.data.strip())
    start_l, start_c = m.pos.line - 1, m.pos.column
    if m.end_pos is not None and m.pos.line <= m.end_pos.line <= len(lines):
        end_l, end_c = m.end_pos.line - 1, m.end_pos.column
    else:
        end_l, end_c = start_l, len(lines[start_l])
    out = lines[max(0, start_l - _BEFORE) : start_l]
    first = lines[start_l]
    if start_l == end_l:
        end_c = max(end_c, start_c)
        out.append(f"{first[:start_c]}<error>{first[start_c:end_c]}</error>{first[end_c:]}")
    else:
        out.append(f"{first[:start_c]}<error>{first[start_c:]}")
        middle = lines[start_l + 1 : end_l]
        if len(middle) > _SPAN_LINES:
            indent = len(middle[0]) - len(middle[0].lstrip(" "))
            middle = [*middle[:_SPAN_LINES], " " * indent + "... --[Truncated]-- ..."]
        out += middle
        last = lines[end_l]
        out.append(f"{last[:end_c]}</error>{last[end_c:]}")
    if end_l + 1 < len(lines) and lines[end_l + 1].strip():
        out.append(lines[end_l + 1])
    return ErrorShown("\n".join(out), m.data.strip())


def render_errors(verdict: Verdict, text: str, limit: int, *, fenced: bool) -> str:
    """Lean's verdict on an attempt, as text for the next prompt.

    ``fenced``: code in ```` ```lean4 ```` blocks (chat formats); otherwise plain lines (for
    completion formats, whose feedback sits in a Lean comment inside the growing code).
    """
    shown, more = errors_shown(verdict, text, limit)
    if not shown:
        why = verdict.detail or verdict.reason.value
        return f"Lean rejected the proof ({verdict.reason.value}): {why}"
    parts = []
    for i, e in enumerate(shown, start=1):
        if fenced:
            code = f"\nCorresponding Code:\n```lean4\n{e.code}\n```\n" if e.code else ""
            parts.append(f"\nError {i}:\n{code}\nError Message: {e.message}\n")
        else:
            code = f"{e.code}\n" if e.code else ""
            parts.append(f"Error {i}:\n{code}Error Message: {e.message}\n")
    if more:
        parts.append(f"\n... [Omitted {more} more errors] ...\n")
    return "".join(parts).strip("\n")
