"""Decontamination's matching: statement keys, informal n-grams, the index of benchmark rows,
and the report of what was dropped. It loads nothing itself.

Training corpora are scraped and autoformalized from the same competitions the benchmarks come
from, so the same theorem turns up under another name, with other variable names, another
comment or another spelling of the same notation. A row is dropped when

- its **formal statement** equals a benchmark statement after :func:`statement_key` (comments,
  layout, the declaration's name and bound variable names do not count), or, optionally,
- its **informal statement** shares a run of ``informal_ngram`` words with a benchmark's
  (the n-gram overlap test of GPT-3's decontamination, Brown et al. 2020).

The benchmarks are environments, which sit above the taskset that asks for decontamination, so
the caller hands :meth:`BenchmarkIndex.load` the function that loads one by id: a taskset gets
:func:`leanrl.load_environment` from the environment that made it, and
:func:`leanrl.decontam.decontaminate` passes it itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from leanrl.decontam_config import BenchmarkRef, DecontaminationConfig
from leanrl.errors import ConfigError, DatasetError
from leanrl.task import Task

BenchmarkLoader = Callable[..., Any]
"""Loads a benchmark environment by id: ``load(env_id, split=None, path=...)`` returns an object
whose ``tasks()`` are the benchmark's rows (:func:`leanrl.load_environment`)."""
__all__ = [
    "BenchmarkIndex",
    "BenchmarkLoader",
    "DecontaminationMatch",
    "DecontaminationReport",
    "drop_matches",
    "informal_ngrams",
    "save_taskset_report",
    "statement_key",
    "write_report",
]

# Identifiers as Lean writes them (letters, digits, subscripts, ', ! and ?); no dots: a dotted
# name is a global constant, never a bound variable.
_IDENT = r"[^\W\d][\w'!?]*"
_BINDER_GROUP = re.compile(r"[(\[{⦃]\s*((?:" + _IDENT + r"\s+)*" + _IDENT + r")\s*:(?!=)")
_QUANT = re.compile(
    r"(?<![\w.])(?:∀|∃!?|fun|Π|Σ|∑|∏|⋃|⋂)\s*((?:" + _IDENT + r"\s*)+?)\s*(?=[,:>≥<≤∈∉≠]|↦)"
)
_DECL = re.compile(
    r"(?:@\[[^\]]*\]\s*)?(?:(?:private|protected|noncomputable)\s+)*"
    r"(?:theorem|lemma|example)\b\s*(?:[^\s(:{\[⦃]+)?"
)


def _strip_comments(text: str) -> str:
    """``text`` without Lean comments (nested block comments, doc comments, line comments)."""
    out: list[str] = []
    i, depth, n = 0, 0, len(text)
    while i < n:
        if text.startswith("/-", i):
            depth += 1
            i += 2
        elif depth and text.startswith("-/", i):
            depth -= 1
            i += 2
            out.append(" ")
        elif depth:
            i += 1
        elif text.startswith("--", i):
            while i < n and text[i] != "\n":
                i += 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def statement_key(statement: str) -> str:
    """The form two statements are compared in: equal keys mean the same theorem.

    Comments, the ``theorem``/``lemma`` keyword and the declaration's name, a trailing
    ``:= by``/``sorry``, and layout are dropped; notation that changed spelling across Mathlib
    versions is unified (``∑ x in s`` and ``∑ x ∈ s``, ``fun x =>`` and ``fun x ↦``); and the
    names of bound variables (binders ``(x y : ℝ)``, ``{n : ℕ}``, ``∀ x,``) are replaced by
    their order of appearance, so renaming ``x`` to ``a`` or ``h₀`` to ``h0`` changes nothing.
    """
    s = _strip_comments(statement)
    s = re.sub(r":=\s*(?:by\b)?\s*(?:sorry)?\s*$", "", s.strip())
    s = _DECL.sub(" ", s)
    s = re.sub(r"(∑|∏|⋃|⋂)\s*(" + _IDENT + r")\s+in\b", r"\1 \2 ∈", s)
    s = s.replace("=>", "↦").replace("λ", "fun")
    names: list[str] = []
    for pattern in (_BINDER_GROUP, _QUANT):
        for m in pattern.finditer(s):
            for name in m.group(1).split():
                if name not in names:
                    names.append(name)
    if names:
        order = {name: f"v{i}" for i, name in enumerate(names)}
        word = re.compile(r"(?<![\w'!?.])(" + "|".join(map(re.escape, names)) + r")(?![\w'!?])")
        s = word.sub(lambda m: order[m.group(1)], s)
    s = re.sub(r"\s+", " ", s).strip()
    # Whitespace only matters between two identifier characters (`f a b` is not `f ab`).
    return re.sub(r" (?=[^\w'.!?])|(?<=[^\w'.!?]) ", "", s)


def informal_ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    """The word ``n``-grams of ``text`` (lower-cased words and numbers; LaTeX commands count
    as words). Empty when the text has fewer than ``n`` words."""
    words = re.findall(r"\w+", text.lower())
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


class DecontaminationMatch(BaseModel):
    """One dropped training row and the benchmark row it matched."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    task_id: str
    """The training row's task id."""
    name: str
    """The training row's theorem name."""
    by: Literal["statement", "informal"]
    """What matched: the formal statement, or an informal n-gram."""
    benchmark: str
    """The benchmark environment matched (``minif2f``, ...)."""
    benchmark_task: str
    """The id of the benchmark task matched."""
    evidence: str = ""
    """The shared n-gram (informal matches) or the statement key (formal matches), cut short."""


class DecontaminationReport(BaseModel):
    """What a decontamination pass checked and dropped."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    against: list[str]
    """The benchmarks checked against (``ENV`` or ``ENV=PATH``)."""
    benchmark_rows: dict[str, int]
    """Rows loaded per benchmark."""
    informal_ngram: int | None = None
    """The n of the informal n-gram test (None: not run)."""
    checked: int = 0
    """Training rows checked."""
    kept: int = 0
    """Training rows kept."""
    dropped: list[DecontaminationMatch] = Field(default_factory=list)
    """Every dropped row, with the benchmark row it matched (first match)."""

    def counts(self) -> dict[str, int]:
        """Dropped rows per (benchmark, what matched), e.g. ``{"minif2f/statement": 3}``."""
        out: dict[str, int] = {}
        for m in self.dropped:
            key = f"{m.benchmark}/{m.by}"
            out[key] = out.get(key, 0) + 1
        return dict(sorted(out.items()))

    def summary(self) -> str:
        """One line for logs."""
        parts = ", ".join(f"{k}: {v}" for k, v in self.counts().items()) or "none"
        return (
            f"decontamination against {', '.join(self.against)}: dropped "
            f"{len(self.dropped)} of {self.checked} training rows ({parts}); kept {self.kept}"
        )

    def markdown(self) -> str:
        """A readable report (the summary, counts, and every dropped row)."""
        lines = ["# Decontamination report", "", self.summary(), ""]
        lines += ["| benchmark | rows loaded |", "| --- | --- |"]
        lines += [f"| {k} | {v} |" for k, v in self.benchmark_rows.items()]
        if self.dropped:
            lines += ["", "| training row | name | matched by | benchmark row | evidence |"]
            lines += ["| --- | --- | --- | --- | --- |"]
            for m in self.dropped:
                ev = m.evidence.replace("|", "\\|")
                lines.append(
                    f"| {m.task_id} | {m.name} | {m.by} | {m.benchmark}:{m.benchmark_task} | "
                    f"`{ev}` |"
                )
        return "\n".join(lines) + "\n"


class BenchmarkIndex:
    """The benchmarks' statement keys and informal n-grams, for fast look-ups."""

    def __init__(self, informal_ngram: int | None) -> None:
        self.n = informal_ngram
        self.statements: dict[str, tuple[str, str]] = {}
        self.ngrams: dict[tuple[str, ...], tuple[str, str]] = {}
        self.rows: dict[str, int] = {}

    def add(self, benchmark: str, tasks: Iterable[Task]) -> None:
        """Index ``tasks`` of ``benchmark`` (first occurrence wins)."""
        count = 0
        for t in tasks:
            count += 1
            self.statements.setdefault(statement_key(t.formal_statement), (benchmark, t.id))
            if self.n and t.informal_statement:
                for g in informal_ngrams(t.informal_statement, self.n):
                    self.ngrams.setdefault(g, (benchmark, t.id))
        self.rows[benchmark] = self.rows.get(benchmark, 0) + count

    def match(self, task: Task) -> DecontaminationMatch | None:
        """The benchmark row ``task`` matches, or None."""
        key = statement_key(task.formal_statement)
        hit = self.statements.get(key)
        if hit is not None:
            return DecontaminationMatch(
                task_id=task.id,
                name=task.name,
                by="statement",
                benchmark=hit[0],
                benchmark_task=hit[1],
                evidence=key[:160],
            )
        if self.n and task.informal_statement:
            for g in sorted(informal_ngrams(task.informal_statement, self.n)):
                got = self.ngrams.get(g)
                if got is not None:
                    return DecontaminationMatch(
                        task_id=task.id,
                        name=task.name,
                        by="informal",
                        benchmark=got[0],
                        benchmark_task=got[1],
                        evidence=" ".join(g)[:160],
                    )
        return None

    @classmethod
    def load(cls, config: DecontaminationConfig, load: BenchmarkLoader) -> BenchmarkIndex:
        """Load every benchmark of ``config.against`` (all splits) with ``load`` into an index."""
        index = cls(config.informal_ngram)
        for ref in config.benchmarks:
            index.add(ref.env, _benchmark_tasks(ref, load))
        return index


def _benchmark_tasks(ref: BenchmarkRef, load: BenchmarkLoader) -> list[Task]:
    kw: dict[str, object] = {"split": None}
    if ref.path is not None:
        if not ref.path.exists():
            raise ConfigError(
                f"decontamination benchmark {ref}: {ref.path} does not exist. Give the path of "
                f"a local copy of {ref.env!r} (a JSONL file, or a folder holding it)."
            )
        kw["path"] = ref.path
    try:
        env = load(ref.env, **kw)
        return list(env.tasks())
    except DatasetError as e:
        if ref.path is not None:
            raise
        # The loader's own hint names --env.taskset.path, which is the training set's flag
        # here: a benchmark's local copy goes into the `against` entry itself.
        raise DatasetError(
            f"decontamination benchmark {ref.env!r} cannot be loaded: {e}\nHere, give its local "
            f"copy in the `against` entry: --against {ref.env}=FILE_OR_FOLDER (in a trainer: "
            f"--env.taskset.decontaminate.against {ref.env}=FILE_OR_FOLDER)."
        ) from e


def drop_matches(
    tasks: Sequence[Task],
    config: DecontaminationConfig,
    index: BenchmarkIndex,
    *,
    announce: bool = True,
) -> tuple[list[Task], DecontaminationReport]:
    """``tasks`` without those matching a benchmark row of ``index``, and the report (whose
    summary is logged unless ``announce`` is False: a caller that prints it itself)."""
    kept: list[Task] = []
    dropped: list[DecontaminationMatch] = []
    for t in tasks:
        m = index.match(t)
        if m is None:
            kept.append(t)
        else:
            dropped.append(m)
    report = DecontaminationReport(
        against=list(config.against),
        benchmark_rows=dict(index.rows),
        informal_ngram=config.informal_ngram,
        checked=len(tasks),
        kept=len(kept),
        dropped=dropped,
    )
    if announce:
        import logging

        logging.getLogger("leanrl.decontam").info(report.summary())
    return kept, report


def write_report(report: DecontaminationReport, folder: Path) -> None:
    """``decontamination.json`` and ``decontamination.md`` in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "decontamination.json").write_text(
        json.dumps(report.model_dump(mode="json"), indent=2, ensure_ascii=False) + "\n",
        encoding="utf-8",
    )
    (folder / "decontamination.md").write_text(report.markdown(), encoding="utf-8")


def save_taskset_report(taskset: object, folder: Path) -> None:
    """Write the report of what a taskset's ``decontaminate`` option dropped (if it ran) into
    ``folder`` (a trainer's run folder)."""
    report = getattr(taskset, "decontamination", None)
    if isinstance(report, DecontaminationReport):
        write_report(report, folder)
