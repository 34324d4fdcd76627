"""Lean's messages in the three forms Lean prints them, turned into :class:`leanrl.Message`.

- REPL answers: ``{"severity", "pos": {"line", "column"}, "endPos", "data"}``;
- ``lean --json``: one JSON object per line, ``{"fileName", "pos", "endPos", "severity",
  "caption", "data", ...}`` with severity ``information``/``warning``/``error``;
- plain ``lean file.lean`` output: ``file:line:col: severity: text`` with the text possibly
  continuing over the following lines (older Lean prints info messages without a severity).

Positions can be shifted so they are relative to the text the caller cares about (for example
the model's proof rather than the whole generated file).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

from leanrl.lean.protocol import ReplMessage, ReplPos
from leanrl.verdict import Message, Position

__all__ = [
    "cut_tagged",
    "from_repl",
    "normalize_severity",
    "parse_json_output",
    "parse_plain_output",
    "shift",
]

_SEVERITIES = {"information": "info", "info": "info", "warning": "warning", "error": "error"}


def normalize_severity(s: str) -> str:
    """``information`` -> ``info``; other spellings as Lean writes them."""
    return _SEVERITIES.get(s.strip().lower(), s.strip().lower())


def _pos(p: ReplPos | dict | None, line_offset: int) -> Position | None:
    if p is None:
        return None
    line, col = (p.line, p.column) if isinstance(p, ReplPos) else (p["line"], p["column"])
    # Line 0 is what the REPL reports for tactic-mode messages with no position: keep it.
    return Position(line=line - line_offset if line > 0 else line, column=col)


def from_repl(msgs: Iterable[ReplMessage], line_offset: int = 0) -> tuple[Message, ...]:
    """REPL messages as verdict messages, with ``line_offset`` subtracted from line numbers."""
    return tuple(
        Message(
            severity=normalize_severity(m.severity),
            data=m.data,
            pos=_pos(m.pos, line_offset),
            end_pos=_pos(m.end_pos, line_offset),
        )
        for m in msgs
    )


def shift(msgs: Iterable[Message], line_offset: int) -> tuple[Message, ...]:
    """Messages with ``line_offset`` subtracted from every (positive) line number."""
    out = []
    for m in msgs:
        pos = _shift_pos(m.pos, line_offset)
        end = _shift_pos(m.end_pos, line_offset)
        out.append(m.model_copy(update={"pos": pos, "end_pos": end}))
    return tuple(out)


def _shift_pos(p: Position | None, off: int) -> Position | None:
    if p is None or p.line <= 0:
        return p
    return Position(line=p.line - off, column=p.column)


def parse_json_output(text: str) -> tuple[Message, ...]:
    """Messages from ``lean --json`` output (one JSON object per line; other lines ignored)."""
    out: list[Message] = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(obj, dict) or "severity" not in obj or "data" not in obj:
            continue
        data = obj["data"]
        if not isinstance(data, str):  # newer Lean may send structured data; keep its text
            data = json.dumps(data, ensure_ascii=False)
        cap = obj.get("caption") or ""
        out.append(
            Message(
                severity=normalize_severity(str(obj["severity"])),
                data=f"{cap}: {data}" if cap and not data.startswith(cap) else data,
                pos=_pos(obj.get("pos"), 0),
                end_pos=_pos(obj.get("endPos"), 0),
            )
        )
    return tuple(out)


# `file:12:4: error: text`, also `file:12:4-12:9: error:` (with -DincludeEndPos), and old-style
# info output `file:12:4: text` with no severity word.
_HEAD = re.compile(
    r"^(?P<file>[^\n:]+?):(?P<line>\d+):(?P<col>\d+)"
    r"(?:-(?P<eline>\d+):(?P<ecol>\d+))?:\s"
    r"(?:(?P<sev>error|warning|info|information)(?:\s*\[[^\]]*\])?:\s?)?(?P<text>.*)$"
)


def parse_plain_output(text: str, file_name: str | None = None) -> tuple[Message, ...]:
    """Messages from plain ``lean file.lean`` output.

    A line ``file:line:col: severity: text`` starts a message; following lines that do not start
    a new one continue its text. With ``file_name``, only heads naming that file (by basename)
    start messages, so file paths inside message text are not mistaken for new messages.
    """
    out: list[dict] = []
    for raw in text.splitlines():
        m = _HEAD.match(raw)
        if m and (file_name is None or _same_file(m.group("file"), file_name)):
            end = None
            if m.group("eline"):
                end = Position(line=int(m.group("eline")), column=int(m.group("ecol")))
            out.append(
                {
                    "severity": normalize_severity(m.group("sev") or "info"),
                    "lines": [m.group("text")],
                    "pos": Position(line=int(m.group("line")), column=int(m.group("col"))),
                    "end_pos": end,
                }
            )
        elif out:
            out[-1]["lines"].append(raw)
        elif raw.strip():
            # Text before any positioned message (e.g. "uncaught exception: ..."): keep it as
            # an error without position, so a failing run never looks clean.
            out.append({"severity": "error", "lines": [raw], "pos": None, "end_pos": None})
    return tuple(
        Message(
            severity=d["severity"],
            data="\n".join(d["lines"]).rstrip(),
            pos=d["pos"],
            end_pos=d["end_pos"],
        )
        for d in out
    )


def _same_file(a: str, b: str) -> bool:
    return a == b or a.rsplit("/", 1)[-1] == b.rsplit("/", 1)[-1]


def cut_tagged(text: str, tag: str) -> tuple[list[str], str]:
    """Every ``tag`` + one-line JSON object found anywhere in ``text``, and the text without them.

    Old Lean prints info messages with no ``file:line:col:`` head and no newline of their own, so
    a tagged report can start a line by itself (where the plain parser would take it for an
    error) or be glued to the end of the previous message's text. Each report is returned as
    ``tag + json`` (the JSON exactly as printed); an occurrence whose JSON does not decode keeps
    the rest of its line, so the caller can say the report is unreadable instead of missing.
    """
    found: list[str] = []
    kept: list[str] = []
    decoder = json.JSONDecoder()
    i = 0
    while (j := text.find(tag, i)) >= 0:
        kept.append(text[i:j])
        start = j + len(tag)
        try:
            _, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            nl = text.find("\n", start)
            end = len(text) if nl < 0 else nl
        found.append(tag + text[start:end])
        i = end
    kept.append(text[i:])
    return found, "".join(kept)
