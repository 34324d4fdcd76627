"""Public training corpora: statements (and, for some, proofs) to train provers on.

Each is a taskset over a Hugging Face dataset, pinned to a revision where one is known, with the
columns of its source mapped onto Task fields, so that ``--env goedel-pset`` (or ``path=`` a local
copy in the same format) gives tasks ready for ``leanrl train`` and ``leanrl eval``. Statements
ship ending in ``:= by sorry``; the taskset strips the placeholder. Rows keep their other columns
in ``Task.extra`` (``formal_proof`` and friends, which ``leanrl train sft`` can train on).

Decontaminate against the benchmarks you report (``--env.taskset.decontaminate.against
minif2f=...``, or ``leanrl decontaminate``): these corpora overlap them.
"""

from __future__ import annotations

import re
from typing import ClassVar

from leanrl.environment import Environment
from leanrl.task import Task
from leanrl.taskset import ColumnMap, RawRow, Taskset

__all__ = [
    "DeepSeekProverV1",
    "DeepSeekProverV1Taskset",
    "GoedelPset",
    "GoedelPsetTaskset",
    "LeanWorkbook",
    "LeanWorkbookTaskset",
    "NuminaLean",
    "NuminaLeanTaskset",
]

#: The header the corpora that carry none were written against (Lean Workbook's, DeepSeek's).
MATHLIB_HEADER = (
    "import Mathlib\nimport Aesop\n\nset_option maxHeartbeats 400000\n\n"
    "open BigOperators Real Nat Topology Rat\n\n"
)


class _Corpus(Taskset):
    """What the corpora share: one hub split (``train``), every row kept unless a split is
    asked for, and the header above for rows without one."""

    default_split: ClassVar[str | None] = None
    default_header: ClassVar[str] = MATHLIB_HEADER

    def _hub_split(self, hub_id: str) -> str | None:
        # The corpora publish one split, `train`; a split named in the config filters rows.
        return "train"


class GoedelPsetTaskset(_Corpus):
    """Goedel-Pset-v1 (Goedel-LM): ~1.64M statements autoformalized from Numina and Lean
    Workbook problems, each a whole Lean file (imports, informal statement as a doc comment,
    theorem ending in ``:= by sorry``). No name column: the name is the declared theorem's; the
    id is ``problem_id``. Written for the DeepSeek-Prover-V1.5 environment: Goedel-Prover's
    repository pins the same Mathlib submodule (xinhjBrant/mathlib4 @ 2f65ba7f), whose Lean is
    v4.9.0."""

    name = "goedel-pset"
    description = "Goedel-Pset-v1: 1.64M autoformalized statements (training corpus, no proofs)"
    hub_id = "Goedel-LM/Goedel-Pset-v1"
    hub_revision = None  # not pinned: give --env.taskset.revision to pin a commit
    default_columns = ColumnMap(
        id="problem_id",
        formal_statement="formal_statement",
        informal_statement="informal_statement",
        name_from_statement=True,
    )
    lean_toolchain = "leanprover/lean4:v4.9.0"
    mathlib_rev = "2f65ba7f1a9144b20c8e7358513548e317d26de1"
    mathlib_repo = "https://github.com/xinhjBrant/mathlib4"  # DeepSeek-Prover-V1.5's Mathlib


class NuminaLeanTaskset(_Corpus):
    """NuminaMath-LEAN (Project Numina): ~100K competition problems formalized in Lean 4 by
    humans, with the informal ``problem``; some rows carry a human proof
    (``formal_ground_truth``) or a prover's (``formal_proof``), kept in ``Task.extra``. The id
    is ``uuid``; the name is the declared theorem's. Lean version: unknown (the dataset card
    names none), so none is pinned: point ``env.runtime.lean_project`` at the project you
    train in."""

    name = "numina-lean"
    description = "NuminaMath-LEAN: ~100K human-formalized competition problems (some proofs)"
    hub_id = "AI-MO/NuminaMath-LEAN"
    hub_revision = None  # not pinned: give --env.taskset.revision to pin a commit
    default_columns = ColumnMap(
        id="uuid",
        formal_statement="formal_statement",
        informal_statement="problem",
        name_from_statement=True,
    )


class LeanWorkbookTaskset(_Corpus):
    """Lean Workbook (InternLM): ~57K statements autoformalized from AoPS problems, with the
    ``natural_language_statement``; names are ``lean_workbook_...`` (taken from the statement,
    ``id`` is the id). Statements carry no imports: the Mathlib header above is used. Written
    for Lean v4.8.0-rc1 with the Mathlib of the same tag (the dataset card at the pinned
    revision)."""

    name = "lean-workbook"
    description = "Lean Workbook: ~57K autoformalized AoPS statements (training corpus)"
    hub_id = "internlm/Lean-Workbook"
    hub_revision = "4db66c03298bb5a20b5b1e1923d8f42051a4851f"  # lean_workbook.json, June 2024
    # The card at that revision: "Our test environment is based on Lean v4.8.0-rc1 with
    # Mathlib4 of the same version (... the tag v4.8.0-rc1)". The tag's commit, as a lake
    # manifest that requires mathlib @ "v4.8.0-rc1" resolves it:
    lean_toolchain = "leanprover/lean4:v4.8.0-rc1"
    mathlib_rev = "db651742f2c631e5b8525e9aabcf3d61ed094a4a"  # tag v4.8.0-rc1
    default_columns = ColumnMap(
        id="id",
        formal_statement="formal_statement",
        informal_statement="natural_language_statement",
        name_from_statement=True,
    )


class DeepSeekProverV1Taskset(_Corpus):
    """DeepSeek-Prover-V1's released synthetic data: ~27K autoformalized statements, each with
    a verified whole proof (``formal_proof``, kept in ``Task.extra``) and its ``header``. The
    informal statement comes as a ``/-- ... -/`` comment (``informal_prefix``) and is
    unwrapped. Lean version: unknown (neither the dataset card nor the paper's text names one),
    so none is pinned."""

    name = "deepseek-prover-v1"
    description = "DeepSeek-Prover-V1 data: ~27K statements with verified proofs"
    hub_id = "deepseek-ai/DeepSeek-Prover-V1"
    hub_revision = "b6b147a760e6132b18f163830888fe2614925bef"
    default_columns = ColumnMap(
        name="name",
        header="header",
        formal_statement="formal_statement",
        informal_statement="informal_prefix",
    )

    def row_to_task(self, row: RawRow) -> Task:
        task = super().row_to_task(row)
        if task.informal_statement:
            text = unwrap_doc_comment(task.informal_statement)
            task = task.model_copy(update={"informal_statement": text})
        return task


def unwrap_doc_comment(text: str) -> str:
    """``/-- text -/`` (DeepSeek's ``informal_prefix``) as ``text``; other text unchanged."""
    m = re.fullmatch(r"\s*/--?(.*?)-/\s*", text, flags=re.S)
    return m.group(1).strip() if m else text


class GoedelPset(Environment):
    name = "goedel-pset"
    description = GoedelPsetTaskset.description
    taskset_class: ClassVar[type[Taskset]] = GoedelPsetTaskset


class NuminaLean(Environment):
    name = "numina-lean"
    description = NuminaLeanTaskset.description
    taskset_class: ClassVar[type[Taskset]] = NuminaLeanTaskset


class LeanWorkbook(Environment):
    name = "lean-workbook"
    description = LeanWorkbookTaskset.description
    taskset_class: ClassVar[type[Taskset]] = LeanWorkbookTaskset


class DeepSeekProverV1(Environment):
    name = "deepseek-prover-v1"
    description = DeepSeekProverV1Taskset.description
    taskset_class: ClassVar[type[Taskset]] = DeepSeekProverV1Taskset
