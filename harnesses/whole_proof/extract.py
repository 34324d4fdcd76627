"""Pulling a proof out of a model's text.

The result is always the *proof body* (what goes after the reference statement's ``:= by``)
plus optional helper lemmas (the preamble), or a reason why there is none. The model's own copy
of the statement is never used: when it restates the theorem, the restatement is compared with
the reference and a different one is rejected (``statement_changed``).
"""

from __future__ import annotations

import re
import textwrap

from pydantic import BaseModel, ConfigDict

from leanrl.task import Task
from leanrl.verdict import Reason

__all__ = ["Extracted", "extract_proof", "normalize_statement", "strip_reasoning"]


class Extracted(BaseModel):
    """A proof pulled out of a completion, or why none could be."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    proof: str | None = None
    """The tactic block to put under the reference statement (None when rejected)."""
    preamble: str = ""
    """Helper lemmas/definitions the model wrote before the theorem."""
    reason: Reason | None = None
    """Why nothing can be checked (``no_proof``, ``truncated``, ``statement_changed``)."""
    detail: str = ""
    """One line saying what went wrong."""


_FENCE_OPEN = re.compile(r"```[ \t]*([\w+\-]*)[^\n]*\n")
_DECL_LINE = re.compile(
    r"^(?:@\[|theorem\b|lemma\b|def\b|example\b|abbrev\b|instance\b|structure\b|inductive\b|"
    r"noncomputable\b|private\b|protected\b|namespace\b|section\b|end\b|open\b|import\b|#)"
)
_ANY_THEOREM = re.compile(
    r"(?m)^[ \t]*(?:@\[[^\]\n]*\]\s*)?(?:private\s+|protected\s+)?(theorem|lemma|example)\b"
    r"[ \t]*([^\s(:{\[]*)"
)


def _mask_comments(code: str) -> str:
    """``code`` with every comment character (``--`` lines, nested ``/- -/``) replaced by a space,
    newlines kept, so positions still line up. Declarations are only looked for outside comments:
    a theorem written inside a comment must never be taken for the model's answer (its text
    before it would become a preamble that leaves the comment open and hides the reference
    statement)."""
    out = list(code)
    i, depth, n = 0, 0, len(code)
    while i < n:
        if code.startswith("/-", i):
            depth += 1
            out[i] = out[i + 1] = " "
            i += 2
        elif depth and code.startswith("-/", i):
            depth -= 1
            out[i] = out[i + 1] = " "
            i += 2
        elif depth:
            if code[i] != "\n":
                out[i] = " "
            i += 1
        elif code.startswith("--", i):
            while i < n and code[i] != "\n":
                out[i] = " "
                i += 1
        else:
            i += 1
    return "".join(out)


def strip_reasoning(text: str) -> tuple[str, str | None]:
    """Text after the model's ``<think>`` reasoning; second item says if reasoning never ended."""
    if "</think>" in text:
        return text.rsplit("</think>", 1)[1], None
    if "<think>" in text:
        return "", "the <think> reasoning never closed"
    return text, None


def _fenced(text: str) -> tuple[str | None, bool]:
    """(the last Lean code block, whether the last block opened is unclosed)."""
    blocks: list[tuple[str, str]] = []
    pos = 0
    unclosed_from: int | None = None
    while True:
        m = _FENCE_OPEN.search(text, pos)
        if m is None:
            break
        end = text.find("```", m.end())
        if end < 0:
            unclosed_from = m.end()
            break
        blocks.append((m.group(1).lower(), text[m.end() : end]))
        pos = end + 3
    if unclosed_from is not None:
        return text[unclosed_from:], True
    lean = [code for lang, code in blocks if lang in ("lean4", "lean")]
    bare = [code for lang, code in blocks if lang == ""]
    if lean:
        return lean[-1], False
    if bare:
        return bare[-1], False
    return None, False


def _strip_comments(s: str) -> str:
    s = re.sub(r"/-.*?-/", " ", s, flags=re.S)
    return re.sub(r"--[^\n]*", " ", s)


def normalize_statement(s: str) -> str:
    """A statement with comments, whitespace, the proof opener and lemma/theorem removed, for
    comparing a restated statement with the reference."""
    s = _strip_comments(s).strip()
    s = re.sub(r":=\s*(by)?\s*$", "", s)
    s = re.sub(r"^(@\[[^\]]*\]\s*)?(private\s+|protected\s+)?(theorem|lemma)\b", "theorem", s)
    # Whitespace only matters between two identifier characters (`f a b` is not `f ab`).
    s = re.sub(r"\s+", " ", s).strip()
    return re.sub(r" (?=[^\w'.!?])|(?<=[^\w'.!?]) ", "", s)


def _cut_after_proof(proof: str) -> str:
    """Drop whatever follows the proof at column 0 (a new declaration, ``end``, ``#eval``)."""
    lines = proof.split("\n")
    for i, line in enumerate(lines):
        if i > 0 and _DECL_LINE.match(line):
            return "\n".join(lines[:i])
    return proof


def _body(rest: str) -> str:
    """The proof after ``:=``: a ``by`` block's tactics, or a term wrapped in ``exact``."""
    rest = _cut_after_proof(rest)
    stripped = rest.lstrip()
    if re.match(r"by(?![\w'.])", stripped):
        after = stripped[2:]
        return after.lstrip(" \t") if after.lstrip(" \t").startswith("\n") else after.strip()
    term = textwrap.dedent(rest.strip("\n")).strip()
    if not term:
        return ""
    # Continuation lines deeper than the tactic column, so the term stays one tactic. A line
    # comment on the last line would swallow the closing parenthesis: close it on its own line.
    close = "\n    )" if "--" in term.rsplit("\n", 1)[-1] else ")"
    return "exact (" + term.replace("\n", "\n    ") + close


def _as_block(proof: str) -> str:
    """Tactic lines as a block under ``:= by``: a leading newline, every line indented by 2."""
    lines = textwrap.dedent(proof.strip("\n")).rstrip().split("\n")
    return "\n" + "\n".join(("  " + ln) if ln.strip() else "" for ln in lines)


def _clean_preamble(before: str, header: str) -> str:
    """The model's text before its theorem, made safe to put above the reference statement:
    imports and header lines dropped, modifiers meant for the theorem (doc comment,
    ``set_option ... in``, ``open ... in``) dropped, and namespaces/sections left open closed, so
    the reference statement is elaborated as a top-level declaration under its own name."""
    head = {ln.strip() for ln in header.splitlines() if ln.strip()}
    keep = [
        ln
        for ln in before.split("\n")
        if not ln.lstrip().startswith("import ") and ln.strip() not in head
    ]
    text = "\n".join(keep).strip()
    while True:
        new = re.sub(
            r"(/--(?:(?!-/).)*-/|set_option\s+\S+\s+\S+\s+in|open\s[^\n]*?\sin)\s*$",
            "",
            text,
            flags=re.S,
        ).strip()
        if new == text:
            break
        text = new
    return _close_scopes(text)


_SCOPE = re.compile(r"(?m)^[ \t]*(?:noncomputable[ \t]+)?(namespace|section|end)\b[ \t]*([^\s-]*)")


def _close_scopes(text: str) -> str:
    """``text`` with its scopes balanced: an ``end`` that closes nothing the model opened is
    dropped (it would close the header's ``section`` and change how the reference statement is
    read), and every namespace/section left open gets its ``end`` (a namespace is opened again
    with ``open`` so the proof still sees the helper lemmas by their short names)."""
    stack: list[tuple[str, str]] = []
    stray: list[tuple[int, int]] = []
    for m in _SCOPE.finditer(_mask_comments(text)):
        kind, name = m.group(1), m.group(2)
        if kind == "end":
            if stack:
                stack.pop()
            else:
                stray.append((m.start(), m.end()))
        else:
            stack.append((kind, name))
    for a, b in reversed(stray):
        text = text[:a] + text[b:]
    text = text.strip()
    for kind, name in reversed(stack):
        text += f"\nend{' ' + name if name else ''}"
        if kind == "namespace" and name:
            text += f"\nopen {name}"
    return text


def extract_proof(
    text: str,
    task: Task,
    *,
    finish_reason: str | None = "stop",
    completion_style: bool = False,
) -> Extracted:
    """The proof in ``text`` (a model's output for ``task``), or the reason there is none.

    ``completion_style``: the prompt ended inside an open code block right after the
    statement, so the output *is* the proof until the closing fence.
    """
    truncated = finish_reason == "length"
    body, think_problem = strip_reasoning(text)
    if think_problem is not None:
        if truncated:
            return Extracted(reason=Reason.TRUNCATED, detail=f"cut off: {think_problem}")
        return Extracted(reason=Reason.NO_PROOF, detail=f"no code: {think_problem}")

    if completion_style:
        idx = body.find("```")
        if idx < 0 and truncated:
            return Extracted(reason=Reason.TRUNCATED, detail="cut off before the code block closed")
        code = body if idx < 0 else body[:idx]
        # The text up to the first new command is the continuation of the statement the prompt
        # ended with: the proof. Only when the model starts over with its own declarations
        # (a restated header/theorem) is the code searched for the theorem.
        lead = _cut_after_proof(code).rstrip()
        first = next((ln for ln in lead.split("\n") if ln.strip()), "")
        if first and not _DECL_LINE.match(first.lstrip()):
            if lead.startswith("\n"):
                return Extracted(proof=lead)
            if lead[:1] in (" ", "\t"):
                # Indented first tactic (the prompt ended in a newline): keep every line's own
                # indentation, so the block stays one tactic block.
                return Extracted(proof="\n" + lead)
            return Extracted(proof=lead.strip())
        if not _ANY_THEOREM.search(_mask_comments(code)):
            return Extracted(reason=Reason.NO_PROOF, detail="the completion is empty")
    else:
        found, unclosed = _fenced(body)
        if unclosed and truncated:
            return Extracted(reason=Reason.TRUNCATED, detail="cut off inside the last code block")
        if found is None:
            if truncated:
                return Extracted(reason=Reason.TRUNCATED, detail="cut off before any code block")
            if not _decl_re(task.name).search(_mask_comments(body)):
                return Extracted(reason=Reason.NO_PROOF, detail="no Lean code block in the output")
            found = body
        code = found

    return _from_code(code, task)


def _decl_re(name: str) -> re.Pattern[str]:
    """A line declaring the theorem ``name`` (``theorem``/``lemma``; ``instance`` for tasksets
    whose statement is one), with attributes and modifiers."""
    return re.compile(
        rf"(?m)^[ \t]*(?:@\[[^\]\n]*\]\s*)?(?:private\s+|protected\s+)?(?:noncomputable\s+)?"
        rf"(?:theorem|lemma|instance)\s+{re.escape(name)}(?![\w'.])"
    )


_DEFINES = re.compile(
    r"(?m)^[ \t]*(?:@\[[^\]\n]*\]\s*)?(?:noncomputable\s+)?(?:private\s+|protected\s+)?"
    r"(?:abbrev|def|theorem|lemma|instance|structure|inductive)\s+([^\s(:{\[]+)"
)


def _norm_text(s: str) -> str:
    """Text with comments dropped and whitespace normalized as in :func:`normalize_statement`."""
    s = re.sub(r"\s+", " ", _strip_comments(s)).strip()
    return re.sub(r" (?=[^\w'.!?])|(?<=[^\w'.!?]) ", "", s)


def _split_reference(task: Task) -> tuple[str, str]:
    """The reference statement as (what comes before the theorem, the theorem): some tasksets
    put definitions in the statement (PutnamBench's ``abbrev ..._solution``)."""
    stmt = task.formal_statement
    m = _decl_re(task.name).search(_mask_comments(stmt))
    if m is None:
        return "", stmt
    return stmt[: m.start()], stmt[m.start() :]


def _without_restated_prefix(before: str, prefix: str) -> str | None:
    """``before`` minus a restatement of the reference's ``prefix`` at its end; ``before`` when
    the model did not restate it; None when it restated it differently."""
    want = _norm_text(prefix)
    if not want:
        return before
    starts = [0] + [m.end() for m in re.finditer("\n", before)]
    for j in sorted(starts, reverse=True):
        if _norm_text(before[j:]) == want:
            return before[:j]
    ours = set(_DEFINES.findall(_mask_comments(prefix)))
    if ours & set(_DEFINES.findall(_mask_comments(before))):
        return None  # it redefines what the statement is built on (an answer, a definition)
    return before


def _from_code(code: str, task: Task) -> Extracted:
    masked = _mask_comments(code)
    matches = list(_decl_re(task.name).finditer(masked))
    if not matches:
        others = [m.group(2) or m.group(1) for m in _ANY_THEOREM.finditer(masked)]
        if others:
            return Extracted(
                reason=Reason.STATEMENT_CHANGED,
                detail=f"the code states {others[-1]!r}, not the theorem {task.name!r}",
            )
        proof = re.sub(r"^\s*(:=\s*)?by\b", "", code.strip("\n"))
        lines = [
            ln for ln in proof.split("\n") if not re.match(r"\s*(import|open|set_option)\s", ln)
        ]
        proof = "\n".join(lines).rstrip()
        if not proof.strip():
            return Extracted(reason=Reason.NO_PROOF, detail="the code block is empty")
        return Extracted(proof=_as_block(proof))
    if len(matches) > 1:
        # Lean would reject the redeclaration anyway; say why instead of letting an earlier copy
        # (perhaps of a different statement) sit in the preamble above the reference.
        return Extracted(
            reason=Reason.STATEMENT_CHANGED,
            detail=f"the code declares the theorem {task.name!r} {len(matches)} times",
        )
    m = matches[-1]
    before, after = code[: m.start()], code[m.start() :]
    ref_prefix, ref_theorem = _split_reference(task)
    ref = normalize_statement(ref_theorem)
    for assign in re.finditer(r":=", after):
        if normalize_statement(after[: assign.start()]) == ref:
            proof = _body(after[assign.end() :]).rstrip()
            if not proof.strip():
                return Extracted(reason=Reason.NO_PROOF, detail="the theorem has an empty proof")
            rest = _without_restated_prefix(before, ref_prefix)
            if rest is None:
                return Extracted(
                    reason=Reason.STATEMENT_CHANGED,
                    detail="the code redefines what the reference statement is built on "
                    f"({', '.join(sorted(set(_DEFINES.findall(_mask_comments(ref_prefix)))))})",
                )
            return Extracted(proof=proof, preamble=_clean_preamble(rest, task.header))
    first = after.split(":=", 1)[0].strip().replace("\n", " ")
    return Extracted(
        reason=Reason.STATEMENT_CHANGED,
        detail=f"the restated theorem differs from the reference: {first[:200]!r}",
    )
