"""Any JSONL file or Hugging Face dataset of Lean statements, with a column mapping."""

from __future__ import annotations

from typing import ClassVar

from leanrl.environment import Environment
from leanrl.taskset import Taskset

__all__ = ["Dataset", "DatasetTaskset"]


class DatasetTaskset(Taskset):
    """Rows from ``path`` (a JSONL file) or ``hub_id`` (a hub dataset). Map columns that are not
    spelled ``name``/``header``/``formal_statement``/``informal_statement`` with ``columns``.
    The Lean version is whatever your project has (``lean_project``)."""

    name = "dataset"
    description = "any JSONL file or HF dataset (set path= or hub_id=, and columns=)"


class Dataset(Environment):
    name = "dataset"
    description = DatasetTaskset.description
    taskset_class: ClassVar[type[Taskset]] = DatasetTaskset
