"""Kept proofs: every verified attempt of a run, once per distinct proof of each task.

``proofs.jsonl`` sits in the run folder of every trainer and of ``leanrl eval``. One line per
(task, distinct proof), with what is needed to train on it later without the taskset at hand
(header, statement, proof, helper lemmas), where it came from (``source``, ``model``, ``step``)
and what Lean said (reason, axioms, time). ``leanrl train sft --data.proofs FILE`` trains on it;
expert iteration is built on it.

Appends are durable (one write and one fsync per batch); a torn last line from a kill is cut off
when the file is opened again.
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

from leanrl.errors import DatasetError
from leanrl.rollout import Rollout
from leanrl.task import Task

__all__ = ["PROOFS_FILE", "KeptProof", "Pair", "ProofStore", "proof_digest", "read_proofs"]

PROOFS_FILE = "proofs.jsonl"
"""Name of the kept-proofs file in a run folder."""


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
    """Every row of a proofs file (a torn last line is ignored; any other bad line is an
    error naming the line)."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise DatasetError(f"proofs file {p} does not exist")
    rows: list[KeptProof] = []
    lines = p.read_text(encoding="utf-8").split("\n")
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines):  # a torn last line (no newline after it): a kill mid-write
                break
            raise DatasetError(f"{p}, line {i}: not valid JSON ({e.msg})") from None
        if not isinstance(data, dict):
            raise DatasetError(f"{p}, line {i}: expected a JSON object")
        data.setdefault("task_id", data.get("id") or data.get("name", ""))
        try:
            row = KeptProof.model_validate(data)
        except ValueError as e:
            raise DatasetError(
                f"{p}, line {i}: not a proof row ({str(e).splitlines()[0]}); rows need "
                "name, header, formal_statement and proof"
            ) from None
        if not row.digest:
            row.digest = proof_digest(row.proof, row.preamble)
        rows.append(row)
    return rows


class ProofStore:
    """The kept-proofs file of one run folder. ``open`` loads what is there; ``add*`` appends
    new distinct proofs only."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        self._seen: dict[str, set[str]] = {}
        self._opened = False

    def open(self) -> ProofStore:
        """Load the existing file (cutting off a torn last line). Idempotent."""
        if self._opened:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.is_file():
            raw = self.path.read_bytes()
            if raw and not raw.endswith(b"\n"):  # torn write from a kill: drop the partial line
                cut = raw.rfind(b"\n") + 1
                with self.path.open("r+b") as f:
                    f.truncate(cut)
            for row in read_proofs(self.path):
                self._seen.setdefault(row.task_id, set()).add(row.digest)
        self._opened = True
        return self

    # -- reading ----------------------------------------------------------------------------------

    def solved(self) -> set[str]:
        """Ids of the tasks with at least one kept proof."""
        self.open()
        return {t for t, d in self._seen.items() if d}

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
        new: list[KeptProof] = []
        for row in rows:
            digest = row.digest or proof_digest(row.proof, row.preamble)
            seen = self._seen.setdefault(row.task_id, set())
            if digest in seen:
                continue
            seen.add(digest)
            new.append(row.model_copy(update={"digest": digest}))
        if new:
            blob = "".join(
                json.dumps(r.model_dump(mode="json"), ensure_ascii=False) + "\n" for r in new
            ).encode()
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                view = memoryview(blob)
                while view:  # a write to a regular file may be short; finish it
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
        return new

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
