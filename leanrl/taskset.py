"""Taskset: the theorems, the Lean project they need, and the reward.

A taskset reads rows from a local JSONL file (or a folder of them) or a Hugging Face dataset,
turns each row into a :class:`~leanrl.Task`, validates it, and filters the result (split, names,
pattern, shuffle, limit). Subclasses override one hook, :meth:`Taskset.load_rows`, to read a new
source, and optionally :meth:`Taskset.reward` / :meth:`Taskset.group_rewards` to shape rewards.
"""

from __future__ import annotations

import fnmatch
import random
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from leanrl._dist import require
from leanrl._hub import hub_offline, hub_reachable
from leanrl.decontam_config import DecontaminationConfig
from leanrl.errors import ConfigError, DatasetError
from leanrl.jsonl import read_jsonl
from leanrl.task import Task
from leanrl.verdict import Verdict, VerificationPolicy

if TYPE_CHECKING:
    from leanrl.decontam_match import BenchmarkLoader, DecontaminationReport
    from leanrl.rollout import Rollout

__all__ = [
    "ColumnMap",
    "RawRow",
    "Taskset",
    "TasksetConfig",
    "declared_name",
    "strip_sorry_proof",
]


class ColumnMap(BaseModel):
    """Which dataset column holds each Task field. ``None`` means: try the usual spellings."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    name: str | None = None
    """Column with the declaration name (default: ``name``)."""
    id: str | None = None
    """Column with a unique id, when names repeat (default: ``id`` if present, else the name)."""
    header: str | None = None
    """Column with the header (imports, options, ``open``). When the dataset has none, the
    header is split off the top of the formal statement (everything before the first
    declaration)."""
    formal_statement: str | None = None
    """Column with the statement ending in ``:= by`` (default: ``formal_statement``)."""
    informal_statement: str | None = None
    """Column with the natural-language statement (default: ``informal_statement``,
    ``informal_stmt``, ``informal_prefix``, ``nl_statement``)."""
    split: str | None = None
    """Column with the split name, for files that hold several splits (default: ``split``)."""
    name_from_statement: bool = False
    """Take the name from the theorem the statement declares, for corpora without a name column
    (Goedel-Pset, NuminaMath-LEAN); ``name``, when given, still wins."""


# The spellings public datasets use for each field, tried in order when no column is named.
_CANDIDATES: dict[str, tuple[str, ...]] = {
    "name": ("name", "problem_name", "full_name"),
    "id": ("id",),
    "header": ("header", "src_header", "lean4_src_header"),
    "formal_statement": ("formal_statement", "lean4_formalization", "lean4_statement"),
    "informal_statement": (
        "informal_statement",
        "informal_stmt",
        "informal_prefix",
        "nl_statement",
    ),
    "split": ("split",),
}


class TasksetConfig(BaseModel):
    """Which theorems to load, from where, and how they are judged."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    path: Path | None = None
    """A local JSONL file, or a folder holding the taskset's file (e.g. a folder with
    ``minif2f.jsonl`` in it, for ``--env minif2f``). When
    unset, the taskset loads from the Hugging Face hub (``hub_id``)."""
    hub_id: str | None = None
    """Hugging Face dataset id to load instead of the taskset's default."""
    revision: str | None = None
    """Hub revision (commit, tag or branch) to load; default: the taskset's pinned revision, if
    it has one. Ignored for local files."""
    split: str | None = "test"
    """Split to keep (``test``, ``valid``, ...). ``None`` (``all`` on the command line) keeps
    every split. Training corpora
    (``goedel-pset``, ``lean-workbook``, ...) use ``train`` unless a split is given."""
    limit: int | None = Field(default=None, ge=1)
    """Keep at most this many tasks (after filtering and shuffling)."""
    names: list[str] | None = None
    """Keep only tasks with these ids (in the dataset's order)."""
    pattern: str | None = None
    """Keep only tasks whose id matches this shell-style glob (``mathd_algebra_*``)."""
    shuffle: bool = False
    """Shuffle the tasks deterministically with ``seed`` before applying ``limit``."""
    seed: int = 0
    """Seed of the shuffle."""
    columns: ColumnMap = Field(default_factory=ColumnMap)
    """Column names, for datasets that spell fields differently."""
    policy: VerificationPolicy = Field(default_factory=VerificationPolicy)
    """The soundness rules attempts on this taskset are judged by (strict by default)."""
    shortest_proof_bonus: float = Field(default=0.0, ge=0.0)
    """Reward shaping: extra reward for the shortest accepted proof in a group of samples of the
    same task. 0 (the default) keeps the reward binary."""
    decontaminate: DecontaminationConfig = Field(default_factory=DecontaminationConfig)
    """Drop rows that match a row of the evaluation benchmarks (off until ``against`` names
    some); see ``leanrl decontaminate``."""

    @field_validator("split")
    @classmethod
    def _split_alias(cls, v: str | None) -> str | None:
        # Hub datasets say "validation", the local files say "valid": accept both. "all" is how
        # a command line says None (every split).
        if v == "all":
            return None
        return "valid" if v == "validation" else v


class RawRow(BaseModel):
    """One row as read from its source, with where it came from (for error messages)."""

    model_config = ConfigDict(frozen=True)

    origin: str
    """File path or hub id the row came from."""
    index: int
    """1-based row number in that source."""
    data: dict[str, Any]
    """The row's fields."""


class Taskset:
    """Base class of every taskset. ``__init__`` only stores the config; :meth:`tasks` loads.

    Class attributes describe the benchmark; subclasses set them and usually nothing else.
    """

    name: ClassVar[str] = "jsonl"
    """Registry id of the taskset."""
    description: ClassVar[str] = ""
    """One line for ``leanrl envs``."""
    hub_id: ClassVar[str | None] = None
    """Default Hugging Face dataset id."""
    hub_revision: ClassVar[str | None] = None
    """The hub revision (commit) the taskset is pinned to (None: the hub's newest)."""
    default_split: ClassVar[str | None] = "test"
    """The split kept when the config does not name one (training corpora: ``train``)."""
    default_columns: ClassVar[ColumnMap] = ColumnMap()
    """Column names of the taskset's source; ``config.columns`` overrides them field by field."""
    default_header: ClassVar[str] = ""
    """Header for rows that carry none (neither a header column nor imports in the statement)."""
    filename: ClassVar[str | None] = None
    """The file to look for when ``config.path`` is a folder."""
    lean_toolchain: ClassVar[str | None] = None
    """The Lean toolchain the statements were written for (``leanprover/lean4:v4.24.0``)."""
    mathlib_rev: ClassVar[str | None] = None
    """The Mathlib git revision the statements were written for (None: needs no Mathlib)."""
    mathlib_repo: ClassVar[str] = "https://github.com/leanprover-community/mathlib4"
    """Where that Mathlib revision lives."""

    def __init__(self, config: TasksetConfig | None = None) -> None:
        self.config = config or TasksetConfig()
        self._tasks: list[Task] | None = None
        self.decontamination: DecontaminationReport | None = None
        """What ``config.decontaminate`` dropped (set by :meth:`tasks`, None when it is off)."""
        self.load_benchmark: BenchmarkLoader | None = None
        """How ``config.decontaminate`` loads its benchmarks by id: :func:`leanrl.load_environment`,
        handed over by the :class:`~leanrl.Environment` that made this taskset (the taskset
        layer sits below the environments it would load)."""

    @property
    def split(self) -> str | None:
        """The split kept: the configured one, or the taskset's default when none was given."""
        if "split" in self.config.model_fields_set:
            return self.config.split
        return self.default_split

    @property
    def columns(self) -> ColumnMap:
        """The column map: the taskset's defaults, with the configured fields laid over them."""
        given = self.config.columns.model_dump(exclude_unset=True)
        return self.default_columns.model_copy(update=given)

    # -- the hook -------------------------------------------------------------------------------

    def load_rows(self) -> Iterable[RawRow]:
        """Read the raw rows. Override this to load from a new kind of source."""
        if self.config.path is not None:
            return self._rows_from_path(Path(self.config.path).expanduser())
        return self._rows_from_hub(self.config.hub_id or self.hub_id)

    # -- optional hooks -------------------------------------------------------------------------

    def row_to_task(self, row: RawRow) -> Task:
        """Turn one raw row into a Task (validated). Override to add fields or categories."""
        cols = self.columns
        data = row.data
        statement = self._field(row, "formal_statement", cols.formal_statement, required=True)
        name = self._field(row, "name", cols.name, required=not cols.name_from_statement)
        if name is None:
            name = declared_name(statement)
            if name is None:
                raise DatasetError(
                    f"{row.origin}, row {row.index}, field 'formal_statement': no theorem is "
                    "declared in it, so its name cannot be taken from it. Map a name column "
                    "with `columns.name`."
                )
        header = self._field(row, "header", cols.header, required=False)
        if header is None:
            header, statement = split_header(statement)
            if not header.strip():
                header = self.default_header
        # Training corpora ship statements with a placeholder proof; the proof goes after `:= by`.
        statement = strip_sorry_proof(statement)
        informal = self._field(row, "informal_statement", cols.informal_statement, required=False)
        task_id = self._field(row, "id", cols.id, required=False) or name
        split = self._field(row, "split", cols.split, required=False)
        if not statement.rstrip().endswith(":= by"):
            raise DatasetError(
                f"{row.origin}, row {row.index}, field 'formal_statement': the statement of "
                f"{name!r} must end in ':= by' (the proof goes after it), but it ends in "
                f"{statement.rstrip()[-30:]!r}. Strip any proof (a trailing `sorry` is removed "
                "for you)."
            )
        if not re.search(rf"(?<![\w.']){re.escape(name)}(?![\w'])", statement):
            raise DatasetError(
                f"{row.origin}, row {row.index}, field 'name': {name!r} is not declared in the "
                "formal statement; the checker looks for a theorem with exactly this name."
            )
        known = {"name", "id", "header", "formal_statement", "informal_statement", "split"}
        return Task(
            name=name,
            id=str(task_id),
            header=header,
            formal_statement=statement.rstrip(),
            informal_statement=informal,
            split=split,
            source=data.get("source") or row.origin,
            category=self.category(name, data),
            extra={k: v for k, v in data.items() if k not in known},
        )

    def category(self, name: str, data: dict[str, Any]) -> str | None:
        """The group a task is reported under for per-category pass@k (default: none)."""
        return None

    def reward(self, task: Task, verdict: Verdict) -> float:
        """Reward of one attempt. Default: 1.0 if Lean accepted it, else 0.0."""
        return 1.0 if verdict.accepted else 0.0

    def group_rewards(self, task: Task, rollouts: Sequence[Rollout]) -> list[float]:
        """Rewards for a group of attempts at the same task (shaping hook).

        Default: the binary reward, plus ``shortest_proof_bonus`` for the shortest accepted proof.
        """
        rewards = [self.reward(task, r.verdict) if r.verdict else 0.0 for r in rollouts]
        bonus = self.config.shortest_proof_bonus
        accepted = [i for i, r in enumerate(rollouts) if r.verdict and r.verdict.accepted]
        if bonus and accepted:
            best = min(accepted, key=lambda i: len((rollouts[i].proof or "").strip()))
            rewards[best] += bonus
        return rewards

    # -- loading and filtering ------------------------------------------------------------------

    def tasks(self) -> list[Task]:
        """Load, validate and filter the tasks (cached after the first call)."""
        if self._tasks is None:
            self._tasks = self._filter(self._decontaminate(self._load_all()))
        return list(self._tasks)

    def _decontaminate(self, tasks: list[Task]) -> list[Task]:
        """``tasks`` without those that match an evaluation benchmark (when configured)."""
        config = self.config.decontaminate
        if not config.against:
            return tasks
        load = getattr(self, "load_benchmark", None)
        if load is None:
            raise ConfigError(
                f"taskset {self.name or type(self).__name__!r}: decontaminate.against needs the "
                "benchmarks loaded as environments; make the taskset through an environment "
                "(leanrl.load_environment(...).tasks()), or set taskset.load_benchmark = "
                "leanrl.load_environment"
            )
        from leanrl.decontam_match import BenchmarkIndex, drop_matches

        index = BenchmarkIndex.load(config, load)  # loads the benchmarks: only when asked
        kept, self.decontamination = drop_matches(tasks, config, index)
        return kept

    def __len__(self) -> int:
        return len(self.tasks())

    def __iter__(self) -> Iterator[Task]:
        return iter(self.tasks())

    def _load_all(self) -> list[Task]:
        tasks: list[Task] = []
        seen: dict[str, str] = {}
        want_split = self.split
        for row in self.load_rows():
            self._check_toolchain(row)
            task = self.row_to_task(row)
            if want_split is not None and task.split is not None and task.split != want_split:
                continue
            where = f"{row.origin}, row {row.index}"
            if task.id in seen:
                raise DatasetError(
                    f"{where}, field 'name': duplicate task id {task.id!r} (first seen at "
                    f"{seen[task.id]}). Give each row a unique name, or map a unique column "
                    "with `columns.id`."
                )
            seen[task.id] = where
            tasks.append(task)
        return tasks

    def _check_toolchain(self, row: RawRow) -> None:
        """A row that names its Lean version (``lean_toolchain``) must match this taskset's: a
        file written for another Lean would be checked by the wrong Lean and Mathlib. A taskset
        that pins none (``dataset``) takes the file's."""
        declared = row.data.get("lean_toolchain")
        if not isinstance(declared, str) or not declared.strip():
            return
        have = _lean_version(self.lean_toolchain)
        got = _lean_version(declared)
        if got is None:
            return
        if have is None:
            self.lean_toolchain = declared.strip()  # type: ignore[misc]
            return
        if have != got:
            fits = _environments_for(got, Path(row.origin).name)
            hint = (
                f"use --env {' or --env '.join(fits[:3])} (made for Lean {got})"
                if fits
                else (
                    "use --env dataset with a Lean project of that version "
                    "(--env.runtime.lean-project)"
                )
            )
            raise DatasetError(
                f"{row.origin}, row {row.index}, field 'lean_toolchain': the file is written for "
                f"Lean {got} ({declared.strip()}), but environment {self.name!r} checks with "
                f"Lean {have} ({self.lean_toolchain}). Statements and proofs of one Lean "
                f"version often fail on another: {hint}."
            )

    def _filter(self, tasks: list[Task]) -> list[Task]:
        cfg = self.config
        if cfg.names is not None:
            by_id = {t.id: t for t in tasks}
            missing = [n for n in cfg.names if n not in by_id]
            if missing:
                raise ConfigError(
                    f"taskset {self.name!r}: no task named {missing[:5]} in split "
                    f"{cfg.split!r}. Check the spelling, or set `split` to the right split."
                )
            wanted = set(cfg.names)
            tasks = [t for t in tasks if t.id in wanted]
        if cfg.pattern is not None:
            tasks = [t for t in tasks if fnmatch.fnmatchcase(t.id, cfg.pattern)]
        if cfg.shuffle:
            tasks = list(tasks)
            random.Random(cfg.seed).shuffle(tasks)
        if cfg.limit is not None:
            tasks = tasks[: cfg.limit]
        return tasks

    def _field(self, row: RawRow, field: str, column: str | None, *, required: bool) -> Any:
        names = (column,) if column else _CANDIDATES[field]
        for col in names:
            value = row.data.get(col)
            if value is not None:
                if not isinstance(value, str):
                    raise DatasetError(
                        f"{row.origin}, row {row.index}, field {col!r}: expected text, got "
                        f"{type(value).__name__}."
                    )
                return value
        if required:
            raise DatasetError(
                f"{row.origin}, row {row.index}, field {field!r}: missing (looked for column "
                f"{' or '.join(repr(n) for n in names)}; present: {sorted(row.data)}). Map the "
                f"right column with `columns.{field}`."
            )
        return None

    def _rows_from_path(self, path: Path) -> Iterator[RawRow]:
        if path.is_dir():
            if self.filename and (path / self.filename).is_file():
                path = path / self.filename
            else:
                files = sorted(path.glob("*.jsonl"))
                if len(files) != 1:
                    want = self.filename or "one .jsonl file"
                    raise DatasetError(
                        f"taskset {self.name!r}: folder {path} does not hold {want}; found "
                        f"{[f.name for f in files][:10]}. Point `path` at the file itself."
                    )
                path = files[0]
        if not path.is_file():
            raise DatasetError(
                f"taskset {self.name!r}: {path} does not exist. Give the path of a local JSONL "
                "copy of the dataset (`--env.taskset.path FILE`)."
            )
        # Rows are read as bytes and decoded one by one, so a byte that is not UTF-8 is reported
        # with its file, row and column rather than as a UnicodeDecodeError.
        rows = 0
        for i, data in read_jsonl(path):
            rows += 1
            yield RawRow(origin=str(path), index=i, data=data)
        if not rows:  # said here, where the file is known: later only "the taskset is empty"
            raise DatasetError(
                f"taskset {self.name!r}: {path} holds no tasks (the file is empty or blank). "
                "Point `--env.taskset.path` at a JSONL file with one JSON object per task."
            )

    def _rows_from_hub(self, hub_id: str | None) -> Iterator[RawRow]:
        if not hub_id:
            raise DatasetError(
                f"taskset {self.name!r} has no Hugging Face dataset; give a local file with "
                "`--env.taskset.path FILE` (or `path=` in Python)."
            )
        fix = (
            f"Either go online (the hub dataset is {hub_id!r}), or give a local copy with "
            f"`--env.taskset.path FILE_OR_FOLDER` (Python: `load_environment({self.name!r}, "
            "path=...)`)."
        )
        offline = hub_offline(datasets=True)
        if not offline and not hub_reachable():
            raise DatasetError(f"taskset {self.name!r}: the Hugging Face hub is unreachable. {fix}")
        datasets = require(
            "datasets", "hub", f"loading taskset {self.name!r} from the Hugging Face hub"
        )
        split = self._hub_split(hub_id)
        revision = self.config.revision or (self.hub_revision if hub_id == self.hub_id else None)
        try:
            ds = datasets.load_dataset(hub_id, split=split, revision=revision)
        except Exception as e:
            why = "offline mode is on and it is not cached" if offline else str(e)[:200]
            raise DatasetError(
                f"taskset {self.name!r}: cannot load {hub_id!r} ({why}). {fix}"
            ) from e
        # Without a split the hub gives every split (a DatasetDict): each row keeps its split.
        parts = ds.items() if isinstance(ds, dict) else [(split, ds)]
        i = 0
        for part, rows in parts:
            for data in rows:
                i += 1
                row = dict(data)
                if part is not None and "split" not in row:
                    row["split"] = {"validation": "valid"}.get(part, part)
                yield RawRow(origin=f"hf://{hub_id}", index=i, data=row)

    def _hub_split(self, hub_id: str) -> str | None:
        """The hub split to request (hub datasets name the validation split ``validation``)."""
        s = self.split
        return {"valid": "validation"}.get(s, s) if s else None


def split_header(text: str) -> tuple[str, str]:
    """Split a statement that starts with its own imports/opens into (header, statement)."""
    lines = text.splitlines(keepends=True)
    decl = re.compile(
        r"^(/--|@\[|(private\s+|protected\s+|noncomputable\s+)*"
        r"(theorem|lemma|example|def|abbrev|instance|structure)\b)"
    )
    for i, line in enumerate(lines):
        if decl.match(line):
            return "".join(lines[:i]), "".join(lines[i:])
    return "", text


_SORRY_PROOF = re.compile(r"\s*:=\s*(?:by\s+)?sorry\s*$")


def strip_sorry_proof(statement: str) -> str:
    """A statement whose proof is a placeholder ``sorry`` (``:= by sorry``, ``:= sorry``,
    ``:= by\\n  sorry``), as training corpora ship them, ending in ``:= by`` instead. Any other
    statement is returned unchanged."""
    clean = _strip_line_comments(statement.rstrip()).rstrip()
    if _SORRY_PROOF.search(clean) is None:
        return statement
    return _SORRY_PROOF.sub(" := by", clean)


def _strip_line_comments(text: str) -> str:
    # A `sorry` after `--` on the last line is a comment, not the proof.
    last = text.rsplit("\n", 1)[-1]
    return text if "--" not in last else text[: len(text) - len(last)] + last.split("--", 1)[0]


_DECLARED = re.compile(
    r"(?m)^[ \t]*(?:@\[[^\]\n]*\]\s*)?(?:private\s+|protected\s+)?(?:theorem|lemma)\s+"
    r"([^\s(:{\[]+)"
)


def declared_name(statement: str) -> str | None:
    """The name of the last theorem (or lemma) ``statement`` declares, None when there is none.

    Comments are skipped, so a theorem quoted in a doc comment is not taken for the declaration.
    """
    code = re.sub(r"/-.*?-/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), statement, flags=re.S)
    code = re.sub(r"--[^\n]*", "", code)
    found = _DECLARED.findall(code)
    return found[-1] if found else None


def _lean_version(toolchain: str | None) -> str | None:
    """``leanprover/lean4:v4.24.0`` -> ``4.24.0`` (None when it names no version)."""
    m = re.search(r"(\d+\.\d+\.\d+(?:-rc\d+)?)", toolchain or "")
    return m.group(1) if m else None


def _environments_for(version: str, filename: str = "") -> list[str]:
    """Ids of installed environments whose taskset is written for Lean ``version``; the one
    whose taskset file is called ``filename`` first."""
    from leanrl import registry

    out = []
    for name, ep in registry.available("environments").items():
        try:
            ts = getattr(ep.load(), "taskset_class", None)
        except Exception:  # noqa: BLE001 - a broken plugin is no candidate
            continue
        if ts is not None and _lean_version(getattr(ts, "lean_toolchain", None)) == version:
            own = getattr(ts, "filename", None) == filename
            out.append((not own, name))
    return [name for _, name in sorted(out)]
