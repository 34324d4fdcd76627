"""results.jsonl: one line per attempt, written durably, reconciled on restart.

Attempts whose checker could not run (verdict ``infra``) are not final: a restart redoes them,
and the later record of the same attempt replaces the earlier one.

A chunk's attempts are appended with one ``write`` call and one fsync (an fsync per line would
block the event loop for seconds per chunk on an ordinary disk, stalling the verification that
overlaps generation). A kill at any point leaves whole lines plus at most one torn last line; on
restart the torn line is cut off (its attempt is redone), duplicates are dropped, and
``run.json`` (the config fingerprint) makes sure the run being resumed is the same run. A complete
line that cannot be read (a disk error, a stray edit) is moved to ``results.jsonl.quarantined``
with a warning and its attempt is redone; the lines after it are always kept.

Only a small index of each attempt (key, accepted, verdict reason, token count) stays in memory;
the full records live on disk, so a long run does not grow the process.

The proof is usually a piece of the completion it was extracted from; then the line stores
``"proof_at": [start, end]`` (character offsets into ``completion``) instead of the text a second
time. :func:`read_results` (and everything in leanrl that reads the file) puts ``proof`` back.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from leanrl.errors import ConfigError, disk_errors
from leanrl.jsonl import json_text, quarantine, read_log, rewrite_log, scan_log
from leanrl.runlock import FolderLock
from leanrl.verdict import Verdict

__all__ = ["ResultStore", "read_results"]

Key = tuple[str, int]


class ResultStore:
    """The output folder of one eval run."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.results_path = out / "results.jsonl"
        self.run_path = out / "run.json"
        self.records: dict[Key, dict[str, Any]] = {}
        """What the report needs of each recorded attempt (key, accepted, verdict reason, tokens);
        the whole records are in ``results.jsonl``."""
        self._fd: int | None = None
        # one eval per folder (leanrl.runlock): a second one is refused, not interleaved
        self._run_lock = FolderLock(out, "eval")

    def open(self, fingerprint: str, config: dict[str, Any], command: str = "") -> None:
        """Create or resume the folder; load what earlier runs recorded."""
        self.out.mkdir(parents=True, exist_ok=True)
        self._lock()
        try:
            self._open(fingerprint, config, command)
        except BaseException:
            self.close()  # a refused or failed open must not keep the folder locked
            raise

    def _open(self, fingerprint: str, config: dict[str, Any], command: str) -> None:
        empty = not self.results_path.is_file() or self.results_path.stat().st_size == 0
        if self.run_path.is_file() and not empty:
            old = _read_run_json(self.run_path)
            if old.get("fingerprint") != fingerprint:
                diff = _diff(old.get("config", {}), config)
                raise ConfigError(
                    f"{self.out} holds a different eval run (config fingerprint "
                    f"{old.get('fingerprint')}, this one {fingerprint}); differences: "
                    f"{'; '.join(diff[:8]) or 'unknown'}. Rerun with the same settings to "
                    "resume it, or choose another folder with --out (or delete this one)."
                )
        else:  # a new run, or one that never recorded an attempt: (re)write its identity
            _atomic_write(
                self.run_path,
                json_text(
                    {"fingerprint": fingerprint, "config": config, "command": command},
                    "run.json",
                    indent=2,
                ),
            )
        self.records = self._reconcile()
        self._fd = os.open(self.results_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _reconcile(self) -> dict[Key, dict[str, Any]]:
        scan = scan_log(self.results_path, _checked_index)
        records: dict[Key, dict[str, Any]] = {}
        keep: set[int] = set()
        line_of: dict[Key, int] = {}
        for line, (key, entry) in scan.good:
            if key in records:
                if not retried(records[key]):
                    continue  # the first answer stands; a retried `infra` one is replaced
                keep.discard(line_of[key])
            records[key] = entry
            line_of[key] = line
            keep.add(line)
        if scan.bad or scan.torn or len(keep) != len(scan.good):
            # Bad lines go aside first, so a crash during the rewrite loses nothing.
            quarantine(self.results_path, scan.bad, "attempt record")
            rewrite_log(self.results_path, keep, "results.jsonl")
        return records

    def full_records(self) -> Iterator[dict[str, Any]]:
        """Every recorded attempt as written (read back from ``results.jsonl`` one line at a
        time: memory only holds the index). Lines that cannot be read are left out; a resume
        has already moved them aside."""
        for _, rec in read_log(self.results_path, _full_record):
            yield rec

    def has(self, key: Key) -> bool:
        """The attempt is recorded for good (an ``infra`` record is redone on resume)."""
        return key in self.records and not retried(self.records[key])

    def append(self, records: Iterable[dict[str, Any]]) -> int:
        """Record attempts not recorded yet (one line each, durably, in one write); return how
        many."""
        assert self._fd is not None, "open() first"
        new: dict[Key, dict[str, Any]] = {}
        for rec in records:
            key = (str(rec["task_id"]), int(rec["sample"]))
            if not self.has(key) and key not in new:
                new[key] = rec
        if not new:
            return 0
        blob = b"".join(_line(_pack(r)) for r in new.values())
        view = memoryview(blob)
        with disk_errors(self.results_path, "attempt records"):
            while view:  # a write to a regular file may be short; finish it
                view = view[os.write(self._fd, view) :]
            os.fsync(self._fd)
        # Only what the report needs stays in memory: the full records are on disk.
        self.records.update((k, _index_entry(r)[1]) for k, r in new.items())
        return len(new)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._run_lock.release()

    def _lock(self) -> None:
        """Hold ``.lock`` in the folder while this run writes to it: a second eval on the same
        folder would redo the same attempts and append them a second time. The kernel drops the
        lock when the process dies, so a killed run never leaves the folder locked."""
        self._run_lock.acquire()


def retried(record: dict[str, Any]) -> bool:
    """An attempt whose checker did not run (``infra``): not the model's answer, so a resume
    redoes it and its new record replaces this one."""
    verdict = record.get("verdict")
    return isinstance(verdict, dict) and verdict.get("reason") == "infra"


def _read_run_json(path: Path) -> dict[str, Any]:
    """``run.json`` of a folder being resumed, or a ConfigError that says how to go on."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(
            f"{path} is damaged ({type(e).__name__}: {e}). It records which settings produced "
            f"the attempts in {path.parent / 'results.jsonl'}, so the run cannot be checked "
            "before resuming. If you are sure this command uses the same settings, delete "
            f"{path} and rerun: it is written again and the run resumes. Otherwise use another "
            "--out folder."
        ) from None
    return data


def read_results(path: str | Path, *, typed: bool = False) -> Iterator[dict[str, Any]]:
    """The attempt records of an eval's ``results.jsonl`` (or of its folder), one at a time,
    each as the runner made it: ``proof`` restored where the line stores ``proof_at``. Lines
    that cannot be read are skipped (a resume moves them to ``results.jsonl.quarantined``); a
    retried ``infra`` attempt may appear twice until the run is resumed. ``verdict`` is the
    verdict's JSON (a dict, for tables), or with ``typed`` a :class:`~leanrl.Verdict`.

    Use this rather than reading the JSON lines yourself::

        import pandas as pd
        from leanrl.eval import read_results
        df = pd.DataFrame(read_results("runs/eval-minif2f"))
        first = next(read_results("runs/eval-minif2f", typed=True))["verdict"].reason
    """
    path = Path(path)
    if path.is_dir():
        path = path / "results.jsonl"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist: give the --out folder of a `leanrl eval` run, or its "
            "results.jsonl"
        )
    for _, rec in read_log(path, _full_record):
        if typed and isinstance(rec.get("verdict"), dict):
            rec = {**rec, "verdict": Verdict.model_validate(rec["verdict"])}
        yield rec


def _line(rec: dict[str, Any]) -> bytes:
    # NaN or inf are refused (bare `NaN` is not JSON): the runner checks rewards before this,
    # so what is left to name is a harness's or runtime's field
    what = f"results.jsonl, the record of task {rec.get('task_id')!r}, attempt {rec.get('sample')}"
    text = json_text(rec, what, ensure_ascii=False) + "\n"
    try:
        return text.encode()
    except UnicodeEncodeError:
        # A lone surrogate (an API may send "\ud800" escapes) cannot be UTF-8: write the line
        # with ASCII escapes, which read back to the same string.
        return (json_text(rec, what) + "\n").encode()


def _pack(rec: dict[str, Any]) -> dict[str, Any]:
    """The record as one line stores it: a proof found inside the completion as its offsets."""
    proof, completion = rec.get("proof"), rec.get("completion")
    if not (isinstance(proof, str) and proof and isinstance(completion, str)):
        return rec
    start = completion.find(proof)
    if start < 0:
        return rec  # rebuilt from several turns, or reindented: stored as it is
    out = {k: v for k, v in rec.items() if k != "proof"}
    out["proof_at"] = [start, start + len(proof)]
    return out


def _full_record(rec: Any) -> dict[str, Any]:
    _index_entry(rec)  # the same validity as the index
    out = dict(rec)
    at = out.pop("proof_at", None)
    if at is not None and "proof" not in out:
        start, end = (int(x) for x in at)
        completion = out["completion"]
        if not (isinstance(completion, str) and 0 <= start <= end <= len(completion)):
            raise ValueError(f"proof_at {at} lies outside the completion")
        out["proof"] = completion[start:end]
    return out


def _checked_index(rec: Any) -> tuple[Key, dict[str, Any]]:
    """The index entry of a line that reads back whole (a bad ``proof_at`` quarantines it)."""
    return _index_entry(_full_record(rec))


def _index_entry(rec: Any) -> tuple[Key, dict[str, Any]]:
    """The key of a record and the few fields the report and progress bar read (what the store
    keeps in memory: the completion, proof, prompt and messages stay on disk)."""
    key = (str(rec["task_id"]), int(rec["sample"]))
    verdict = rec.get("verdict") or {}
    entry = {
        "task_id": key[0],
        "sample": key[1],
        "accepted": bool(rec.get("accepted")),
        # None stays None: an attempt stored without a check (generate-only) is "unchecked"
        "verdict": None
        if rec.get("verdict") is None
        else {"reason": verdict.get("reason", "?") if isinstance(verdict, dict) else "?"},
        "completion_tokens": int(rec.get("completion_tokens") or 0),
    }
    return key, entry


def _atomic_write(path: Path, data: str | bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    blob = data.encode() if isinstance(data, str) else data
    with disk_errors(path, path.name):
        with open(tmp, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)


def _diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for k in sorted(set(a) | set(b)):
            out += _diff(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return [] if a == b else [f"{prefix.rstrip('.')}: {a!r} -> {b!r}"]
