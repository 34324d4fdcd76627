"""Reading JSONL files: datasets with precise errors, and append-only logs that survive bad lines.

Two kinds of JSONL pass through leanrl:

* **input** (a taskset, a file of proofs): any bad row is the user's to fix, so reading stops with
  a :class:`~leanrl.errors.DatasetError` that names the file, the row and, for a byte that is not
  UTF-8, its column and value. :func:`read_jsonl` reads them.
* **logs leanrl appends to** (``results.jsonl`` of an eval, ``metrics.jsonl`` of a trainer): a kill
  can only tear the *last* line, which is dropped (its work is redone). A complete line that does
  not decode (a disk error, a stray edit) is never a reason to drop the lines after it: it is
  moved to ``<file>.quarantined`` and reported, and every other line is kept. :func:`scan_log`
  splits a log into good lines, bad lines and a torn tail; :func:`quarantine` saves bad lines.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from leanrl.errors import DatasetError, LeanrlError, disk_errors

__all__ = [
    "BadLine",
    "LogScan",
    "cut_text",
    "json_text",
    "nonfinite_at",
    "quarantine",
    "quarantine_path",
    "read_jsonl",
    "read_log",
    "rewrite_log",
    "scan_log",
]

log = logging.getLogger("leanrl")

T = TypeVar("T")


def _decode(raw: bytes, where: str) -> str:
    """``raw`` as UTF-8, or a DatasetError naming the column and the byte that is not UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        bad = raw[e.start : e.end]
        col = len(raw[: e.start].decode("utf-8", errors="replace")) + 1
        raise DatasetError(
            f"{where}, column {col}: byte {bad[:4].hex(' ')} is not UTF-8 ({e.reason}). Save the "
            "file as UTF-8 (e.g. `iconv -f latin1 -t utf-8 IN > OUT`) or fix that row."
        ) from None


def read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(row number, object)`` for each non-blank line of ``path`` (rows count from 1).

    A line that is not UTF-8, not JSON or not a JSON object raises :class:`DatasetError` naming
    the file and row. The file is read line by line, so a large dataset is never all in memory.
    """
    with path.open("rb") as f:
        for i, raw in enumerate(f, start=1):
            where = f"{path}, row {i}"
            line = _decode(raw, where)
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(
                    f"{where}: not valid JSON ({e.msg.removesuffix(' at')} at column {e.colno})."
                ) from None
            if not isinstance(data, dict):
                raise DatasetError(f"{where}: expected a JSON object per line.")
            yield i, data


@dataclass(frozen=True)
class BadLine:
    """A complete line of a log that could not be read."""

    line: int
    """1-based line number in the file as it was."""
    raw: bytes
    """The line's bytes, newline included."""
    why: str
    """What was wrong with it."""


@dataclass
class LogScan(Generic[T]):
    """A log file split into what can be kept and what cannot."""

    good: list[tuple[int, T]] = field(default_factory=list)
    """Each readable line: its 1-based number and what ``parse`` made of it."""
    bad: list[BadLine] = field(default_factory=list)
    """Complete lines that did not parse: to be quarantined, never silently dropped."""
    torn: bytes = b""
    """A last line without its newline (a write cut short by a kill): dropped, its work redone."""


def scan_log(path: Path, parse: Callable[[Any], T]) -> LogScan[T]:
    """Read the log at ``path`` line by line; ``parse`` turns a decoded JSON value into a ``T``
    (raising ``ValueError``, ``KeyError`` or ``TypeError`` for a value it cannot use)."""
    out: LogScan[T] = LogScan()
    if not path.is_file():
        return out
    with path.open("rb") as f:
        for i, raw in enumerate(f, start=1):
            if not raw.endswith(b"\n"):
                out.torn = raw  # only the very last line can lack its newline
                break
            if not raw.strip():
                continue
            try:
                out.good.append((i, parse(json.loads(raw.decode("utf-8")))))
            except UnicodeDecodeError as e:
                out.bad.append(
                    BadLine(i, raw, f"byte {raw[e.start : e.start + 1].hex()} is not UTF-8")
                )
            except json.JSONDecodeError as e:
                why = f"not valid JSON ({e.msg.removesuffix(' at')} at column {e.colno})"
                out.bad.append(BadLine(i, raw, why))
            except (ValueError, KeyError, TypeError) as e:
                out.bad.append(BadLine(i, raw, f"not a record ({type(e).__name__}: {e})"))
    return out


def read_log(path: Path, parse: Callable[[Any], T]) -> Iterator[tuple[int, T]]:
    """The readable lines of a log, one at a time (line number, parsed): what :func:`scan_log`
    keeps, streamed, for reading a large log without holding it. Bad lines and a torn tail are
    skipped silently (:func:`scan_log` reports them)."""
    if not path.is_file():
        return
    with path.open("rb") as f:
        for i, raw in enumerate(f, start=1):
            if not raw.endswith(b"\n") or not raw.strip():
                continue
            try:
                yield i, parse(json.loads(raw.decode("utf-8")))
            except (UnicodeDecodeError, ValueError, KeyError, TypeError):
                continue


def json_text(obj: Any, what: str, **kw: Any) -> str:
    """``json.dumps(obj, **kw)`` that refuses NaN and infinities (``allow_nan=False``).

    Python writes them as bare ``NaN``/``Infinity``, which is not JSON: other readers (``jq``,
    JavaScript, strict parsers) reject the whole file. A :class:`LeanrlError` names where in
    ``obj`` the value is and what was being written (``what``); nothing is written."""
    try:
        return json.dumps(obj, allow_nan=False, **kw)
    except ValueError:
        where = nonfinite_at(obj)
        if where is None:
            raise
        raise LeanrlError(
            f"{what}: {where[0] or 'the value'} is {where[1]!r}, which JSON cannot hold (NaN and "
            "infinity are not JSON numbers), so it was not written. Whatever produced it must "
            "give a finite number (or None)."
        ) from None


def nonfinite_at(obj: Any, at: str = "") -> tuple[str, float] | None:
    """The first place in ``obj`` (dicts, lists, tuples) holding a NaN or infinite float, as a
    path (``verdict.time_s``, ``turns[2].x``) and the value; None when there is none."""
    if isinstance(obj, float):
        return None if math.isfinite(obj) else (at, obj)
    if isinstance(obj, dict):
        for k, v in obj.items():
            got = nonfinite_at(v, f"{at}.{k}" if at else str(k))
            if got is not None:
                return got
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            got = nonfinite_at(v, f"{at}[{i}]")
            if got is not None:
                return got
    return None


def cut_text(text: str, limit: int) -> tuple[str, dict[str, Any] | None]:
    """``text`` as a log stores it: whole when at most ``limit`` characters, else its first
    ``limit`` characters and what identifies the whole (``chars``: its length, ``sha256``: of
    its UTF-8, ``kept``: the characters stored), so a cut is never mistaken for the text."""
    if len(text) <= limit:
        return text, None
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return text[:limit], {"chars": len(text), "sha256": digest, "kept": limit}


def quarantine_path(path: Path) -> Path:
    """Where bad lines of ``path`` are kept: ``<name>.quarantined`` beside it."""
    return path.with_name(path.name + ".quarantined")


def quarantine(path: Path, bad: list[BadLine], what: str) -> Path | None:
    """Append ``bad`` lines of ``path`` to its quarantine file (durably) and warn, saying how
    many and where; returns the quarantine file (None when there was nothing to move).

    Call this *before* rewriting ``path`` without them: a crash in between then leaves the lines
    in both files, never in neither.
    """
    if not bad:
        return None
    qpath = quarantine_path(path)
    blob = b"".join(b.raw if b.raw.endswith(b"\n") else b.raw + b"\n" for b in bad)
    with disk_errors(qpath, f"quarantined lines of {path.name}"), qpath.open("ab") as f:
        f.write(blob)
        f.flush()
        os.fsync(f.fileno())
    first = bad[0]
    more = f" (and {len(bad) - 1} more line(s))" if len(bad) > 1 else ""
    log.warning(
        "%s: line %d is not a valid %s: %s%s. Moved to %s; every other line is kept%s.",
        path,
        first.line,
        what,
        first.why,
        more,
        qpath,
        " and the work of the moved lines is redone" if what == "attempt record" else "",
    )
    return qpath


def rewrite_log(path: Path, keep: set[int], what: str) -> None:
    """Rewrite ``path`` with only the lines whose 1-based numbers are in ``keep`` (streamed, so
    the file is never all in memory), atomically: written aside, fsynced, renamed over it."""
    tmp = path.with_name(f".{path.name}.tmp")
    with disk_errors(path, what):
        with path.open("rb") as src, tmp.open("wb") as dst:
            for i, raw in enumerate(src, start=1):
                if i in keep:
                    dst.write(raw)
            dst.flush()
            os.fsync(dst.fileno())
        os.replace(tmp, path)
