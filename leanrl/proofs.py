"""Kept proofs: every verified attempt of a run, once per distinct proof of each task.

``proofs.jsonl`` sits in the run folder of every trainer and of ``leanrl eval``. One line per
(task, distinct proof), with what is needed to train on it later without the taskset at hand
(header, statement, proof, helper lemmas), where it came from (``source``, ``model``, ``step``)
and what Lean said (reason, axioms, time). ``leanrl train sft --data.proofs FILE`` trains on it;
expert iteration is built on it.

Appends are durable (one write and one fsync per batch); a torn last line from a kill is cut off
when the file is opened again, and a complete line that cannot be read (a stray edit, a disk
error, bytes that are not UTF-8) is moved to ``proofs.jsonl.quarantined`` with a warning, as
``results.jsonl`` does: it never blocks a resume.

A completion longer than the store's ``completion_chars`` is not kept (its length and sha256
are, under ``text_cut``): training on the model's text would train on a cut one, and a run that
sampled a 100 MB answer would write it again with every proof of it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from leanrl.errors import DatasetError, disk_errors
from leanrl.jsonl import _decode, cut_text, json_text, quarantine, rewrite_log, scan_log
from leanrl.rollout import Rollout
from leanrl.task import Task

__all__ = ["PROOFS_FILE", "KeptProof", "Pair", "ProofStore", "proof_digest", "read_proofs"]

PROOFS_FILE = "proofs.jsonl"
"""Name of the kept-proofs file in a run folder."""

COMPLETION_FACTOR = 4
"""The longest completion (the model's text, reasoning included) stored in ``results.jsonl`` and
``proofs.jsonl``, in multiples of the taskset's ``max_proof_chars``: the proof itself is at most
``max_proof_chars`` long or it is rejected, and reasoning around it gets three times as much."""


def completion_cap(max_proof_chars: int) -> int:
    """The most characters of a completion a run stores (:data:`COMPLETION_FACTOR`)."""
    return COMPLETION_FACTOR * max_proof_chars


class KeptProof(BaseModel):
    """One verified proof of one task."""

    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True)

    task_id: str
    """The task's id."""
    name: str
    """The theorem's name."""
    header: str
    """The task's header (imports, options, ``open``)."""
    formal_statement: str
    """The reference statement, ending in ``:= by``."""
    informal_statement: str | None = None
    """The natural-language statement, when the task has one."""
    proof: str
    """The tactic block that goes after ``:= by`` (what Lean accepted)."""
    preamble: str = ""
    """Helper lemmas checked together with the proof, placed before the statement."""
    restated_statement: str = ""
    """The model's own statement when it restated the theorem differently (the checker found it
    the same theorem as the reference); the proof was written against it."""
    completion: str = ""
    """The model's text of the turn that held the proof (reasoning included)."""
    source: str = ""
    """What produced it: ``eval``, ``grpo``, ``es``, ``expert-iteration``, ..."""
    model: str = ""
    """The model (path or hub id) that wrote it."""
    step: int | None = None
    """The trainer step (ES: iteration; expert iteration: round) whose weights wrote it."""
    sample: int = 0
    """Sample index within its group."""
    reason: str = "ok"
    """The Verdict's reason (``ok`` for an accepted proof)."""
    axioms: list[str] = Field(default_factory=list)
    """Axioms the proof depends on, as Lean reported them."""
    verify_s: float = 0.0
    """Seconds Lean spent checking it."""
    time: float = 0.0
    """When it was kept (Unix time)."""
    digest: str = ""
    """Hash of the normalised preamble and proof: the deduplication key within a task."""
    text_cut: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Texts not stored whole, by field (``completion``): the full text's ``chars`` and
    ``sha256`` and the characters ``kept`` (0: left out)."""

    def task(self) -> Task:
        """The task this proof proves (enough of it to prompt and to check)."""
        return Task(
            name=self.name,
            id=self.task_id,
            header=self.header,
            formal_statement=self.formal_statement,
            informal_statement=self.informal_statement,
        )


@dataclass(frozen=True)
class Pair:
    """One training pair: a task and a proof of it (what SFT trains on, and what
    :meth:`leanrl.Harness.sft_example` lays out as a prompt and an answer)."""

    task: Task
    proof: str
    preamble: str = ""
    completion: str = ""
    statement: str = ""
    """The statement the proof was written against, when the model restated it differently."""


def proof_digest(proof: str, preamble: str = "") -> str:
    """Dedup key of a proof: layout-insensitive at line ends and around the text."""

    def norm(s: str) -> str:
        return "\n".join(ln.rstrip() for ln in s.strip("\n").split("\n")).strip()

    blob = f"{norm(preamble)}\x00{norm(proof)}".encode()
    return hashlib.sha256(blob).hexdigest()[:20]


def read_proofs(path: str | Path) -> list[KeptProof]:
    """Every row of a proofs file given as input (``--data.proofs``): a torn last line (no
    newline after it) is ignored; any other bad line is a DatasetError naming the line (a
    :class:`ProofStore` moves such lines aside when it opens its own file)."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise DatasetError(f"proofs file {p} does not exist")
    rows: list[KeptProof] = []
    with p.open("rb") as f:
        for i, raw in enumerate(f, start=1):
            torn = not raw.endswith(b"\n")  # only the last line can lack it: a kill mid-write
            try:
                line = _decode(raw, f"{p}, line {i}")
            except DatasetError:
                if torn:
                    break
                raise
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as e:
                if torn:
                    break
                raise DatasetError(f"{p}, line {i}: not valid JSON ({e.msg})") from None
            try:
                rows.append(_row(data))
            except ValueError as e:
                raise DatasetError(f"{p}, line {i}: {e}") from None
    return rows


def _row(data: Any) -> KeptProof:
    """The KeptProof a decoded line holds, or a ValueError saying what is wrong with it."""
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object")
    data.setdefault("task_id", data.get("id") or data.get("name", ""))
    try:
        row = KeptProof.model_validate(data)
    except ValueError as e:
        raise ValueError(
            f"not a proof row ({str(e).splitlines()[0]}); rows need name, header, "
            "formal_statement and proof"
        ) from None
    if not row.digest:
        row.digest = proof_digest(row.proof, row.preamble)
    return row


class ProofStore:
    """The kept-proofs file of one run folder. ``open`` loads what is there; ``add*`` appends
    new distinct proofs only."""

    def __init__(self, path: str | Path, completion_chars: int = completion_cap(200_000)) -> None:
        self.path = Path(path).expanduser()
        self.completion_chars = completion_chars
        """Longest completion stored with a proof (a longer one is left out, see the module)."""
        self._seen: dict[str, set[str]] = {}
        self._opened = False

    def open(self) -> ProofStore:
        """Load the existing file. A torn last line (a kill mid-write) is cut off; a complete
        line that cannot be read is moved to ``proofs.jsonl.quarantined`` with a warning and
        every other line is kept (as for ``results.jsonl``). Idempotent."""
        if self._opened:
            return self
        with disk_errors(self.path, "kept proofs"):
            self.path.parent.mkdir(parents=True, exist_ok=True)
        scan = scan_log(self.path, _row)
        keep: set[int] = set()
        for i, row in scan.good:
            seen = self._seen.setdefault(row.task_id, set())
            if row.digest not in seen:  # a repeated line (e.g. a concatenated file): once
                seen.add(row.digest)
                keep.add(i)
        if scan.bad or scan.torn or len(keep) != len(scan.good):
            # the bad lines go aside first: a crash during the rewrite loses none of them
            quarantine(self.path, scan.bad, "kept proof")
            rewrite_log(self.path, keep, PROOFS_FILE)
        self._opened = True
        return self

    # -- reading ----------------------------------------------------------------------------------

    def solved(self) -> set[str]:
        """Ids of the tasks with at least one kept proof."""
        self.open()
        return {t for t, d in self._seen.items() if d}

    def has(self, task_id: str, digest: str) -> bool:
        """Whether a proof with this :func:`proof_digest` is kept for ``task_id``."""
        self.open()
        return digest in self._seen.get(task_id, ())

    def count(self, task_id: str) -> int:
        """Distinct proofs kept for ``task_id``."""
        self.open()
        return len(self._seen.get(task_id, ()))

    def __len__(self) -> int:
        self.open()
        return sum(len(d) for d in self._seen.values())

    def rows(self) -> list[KeptProof]:
        """Every kept proof, in file order."""
        self.open()
        return read_proofs(self.path) if self.path.is_file() else []

    # -- writing ----------------------------------------------------------------------------------

    def add(self, rows: Iterable[KeptProof]) -> list[KeptProof]:
        """Append the rows whose (task, proof) is new; return those appended."""
        self.open()
        new: dict[tuple[str, str], KeptProof] = {}
        for row in rows:
            digest = row.digest or proof_digest(row.proof, row.preamble)
            if digest in self._seen.get(row.task_id, ()) or (row.task_id, digest) in new:
                continue
            new[(row.task_id, digest)] = self._capped(row.model_copy(update={"digest": digest}))
        if not new:
            return []
        # every line is made before anything is written: a NaN is refused, not half-written
        blob = b"".join(_line(r, self.path) for r in new.values())
        with disk_errors(self.path, "kept proofs"):
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                view = memoryview(blob)
                while view:  # a write to a regular file may be short; finish it
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
        for task_id, digest in new:  # kept once on disk (a failed write keeps nothing)
            self._seen.setdefault(task_id, set()).add(digest)
        return list(new.values())

    def _capped(self, row: KeptProof) -> KeptProof:
        """``row`` with a completion longer than ``completion_chars`` left out (its length and
        sha256 kept): a cut text is no training text, and SFT on ``completion`` falls back to
        the proof when there is none."""
        _, cut = cut_text(row.completion, self.completion_chars)
        if cut is None:
            return row
        return row.model_copy(
            update={
                "completion": "",
                "text_cut": {**row.text_cut, "completion": {**cut, "kept": 0}},
            }
        )

    def add_rollouts(
        self,
        tasks: Sequence[Task] | Mapping[str, Task],
        rollouts: Iterable[Rollout],
        *,
        source: str,
        model: str = "",
        step: int | None = None,
        extra: dict[str, Any] | None = None,
    ) -> list[KeptProof]:
        """Keep every accepted rollout (rollouts of tasks not in ``tasks`` are skipped)."""
        by_id = tasks if isinstance(tasks, Mapping) else {t.id: t for t in tasks}
        rows = []
        for r in rollouts:
            task = by_id.get(r.task_id)
            if task is None or r.verdict is None or not r.verdict.accepted or r.proof is None:
                continue
            rows.append(
                kept_from(
                    task,
                    r.proof,
                    r.preamble,
                    restated_statement=r.restated_statement,
                    completion=r.turns[-1].completion if r.turns else "",
                    source=source,
                    model=model,
                    step=step,
                    sample=r.sample,
                    axioms=list(r.verdict.axioms),
                    verify_s=r.verdict.time_s,
                    **(extra or {}),
                )
            )
        return self.add(rows)


def _line(row: KeptProof, path: Path) -> bytes:
    """One line of ``proofs.jsonl``: UTF-8 JSON (NaN and infinities refused)."""
    data = row.model_dump(mode="json")
    what = f"{path}, a proof of task {row.task_id!r}"
    try:
        return (json_text(data, what, ensure_ascii=False) + "\n").encode()
    except UnicodeEncodeError:
        # a lone surrogate (an API may send "\ud800" escapes) cannot be UTF-8: ASCII escapes
        # read back to the same string
        return (json_text(data, what) + "\n").encode()


def kept_from(task: Task, proof: str, preamble: str = "", **fields: Any) -> KeptProof:
    """A :class:`KeptProof` of ``proof`` for ``task`` (``fields``: the provenance)."""
    return KeptProof(
        task_id=task.id,
        name=task.name,
        header=task.header,
        formal_statement=task.formal_statement,
        informal_statement=task.informal_statement,
        proof=proof,
        preamble=preamble,
        time=fields.pop("time", time.time()),
        digest=proof_digest(proof, preamble),
        **fields,
    )
