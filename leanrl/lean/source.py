"""Putting an attempt's Lean text together.

The attempt is elaborated as ``header imports`` + ``header rest`` + preamble + statement + proof.
:func:`assemble` lays the model's parts out under the statement and remembers where the statement
is, so messages can be told apart (the statement's own ``sorry`` placeholders are not the model's).
Nothing here decides anything: the verdict comes from the trusted checker
(:mod:`leanrl.lean.trust`).
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

from leanrl.verdict import Attempt

__all__ = ["Assembled", "assemble", "model_text", "split_header"]

_IMPORT = re.compile(r"^\s*import\s+\S")


def split_header(header: str) -> tuple[list[str], str]:
    """Split a header into its import lines and the rest (options, ``open``, ...).

    ``import Lean`` is added in front when missing: the trusted checker needs Lean's meta API.
    For Mathlib headers this changes nothing (Mathlib imports Lean); for core-only tasksets it
    makes Lean's meta library visible to the attempt too, which the pre-scan keeps from being run.
    """
    imports: list[str] = []
    rest: list[str] = []
    in_imports = True
    in_comment = False
    for line in header.splitlines():
        stripped = line.strip()
        if in_imports and in_comment:
            in_comment = "-/" not in stripped
        elif in_imports and stripped.startswith("/-"):
            in_comment = "-/" not in stripped[2:]
        elif in_imports and _IMPORT.match(line):
            code = line.split("--", 1)[0]  # `import Mathlib -- why` imports Mathlib only
            imports.extend("import " + m for m in code.split()[1:])
        elif in_imports and (not stripped or stripped.startswith("--")):
            continue
        else:
            in_imports = False
            rest.append(line)
    if "import Lean" not in imports:
        imports.insert(0, "import Lean")
    return imports, "\n".join(rest).strip("\n")


class Assembled(BaseModel):
    """The attempt's Lean text and where its parts are (1-based, inclusive line numbers)."""

    model_config = ConfigDict(frozen=True)

    text: str
    """Preamble, statement and proof, as sent to Lean after the header."""
    statement_lines: tuple[int, int]
    """First and last line of the statement within ``text``."""
    proof_line: int
    """Line where the proof starts within ``text`` (line of ``:= by`` when inline)."""

    def in_statement(self, line: int) -> bool:
        """Whether ``line`` belongs to the statement (not the model's proof or preamble)."""
        return self.statement_lines[0] <= line <= self.statement_lines[1]


def assemble(attempt: Attempt) -> Assembled:
    """Preamble + statement + proof, laid out like :meth:`leanrl.Task.lean_text`.

    The statement is the model's restatement when there is one (``restated_statement``): it is
    what the model's proof was written against, and the trusted checker compares what it
    elaborates to with the reference anyway. A file check's text is its ``proof`` as it is (its
    lines are the file's, so Lean's positions are too).
    """
    if attempt.check == "file":
        text = attempt.proof if attempt.proof.endswith("\n") else attempt.proof + "\n"
        return Assembled(text=text, statement_lines=(0, -1), proof_line=1)
    pre = attempt.preamble.rstrip() + "\n\n" if attempt.preamble.strip() else ""
    stmt = (attempt.restated_statement or attempt.formal_statement).rstrip()
    body = attempt.proof if attempt.proof.startswith("\n") else "\n  " + attempt.proof
    text = f"{pre}{stmt}{body}\n"
    first = pre.count("\n") + 1
    last = first + stmt.count("\n")
    return Assembled(text=text, statement_lines=(first, last), proof_line=last + 1)


def model_text(attempt: Attempt) -> str:
    """The part of the attempt the model wrote (what the pre-scan looks at)."""
    restated = model_part(attempt.restated_statement, attempt.formal_statement)
    return "\n".join((attempt.preamble, restated, attempt.proof))


def model_part(restated: str, reference: str) -> str:
    """``restated`` without the leading lines it shares with ``reference``.

    The extractor keeps the reference's own text before the theorem (PutnamBench's
    ``abbrev ..._solution : T := sorry`` placeholders) in a restated statement; that text is the
    taskset's, not the model's. The cut is made only at a line start where the reference is
    between tokens (not inside a comment or string), so what is scanned is read from the same
    state Lean reads it in.
    """
    if not restated:
        return ""
    from leanrl.lean.trust.lexer import tokenize

    inside = [(t.start, t.end) for t in tokenize(reference, keep_comments=True)]
    best = 0
    for b in [i + 1 for i, c in enumerate(reference) if c == "\n"]:
        if b > len(restated) or not restated.startswith(reference[:b]):
            break
        if not any(a < b < e for a, e in inside):
            best = b
    return restated[best:]
