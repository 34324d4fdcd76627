"""Core-Lean problems: miniF2F statements that need no Mathlib (ℕ/ℤ arithmetic only).

The statements ship with leanrl (``data/core.jsonl``; how they were made and their license are in
``data/README.md``), so this environment loads offline with no download.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import ClassVar

from leanrl.environment import Environment
from leanrl.taskset import RawRow, Taskset

__all__ = ["Core", "CoreTaskset", "data_file"]


def data_file() -> Path:
    """The shipped ``core.jsonl``."""
    return Path(str(resources.files(__name__).joinpath("data", "core.jsonl")))


class CoreTaskset(Taskset):
    """121 miniF2F statements rewritten for core Lean (``Nat``/``Int``, no imports), shipped with
    leanrl: 67 in the ``test`` split (the default) and 54 in ``valid`` (``--env.taskset.split
    valid``; ``--env.taskset.split all`` for both).

    A syntactic filter: the statements are not known to elaborate or be provable without
    Mathlib; 34 rows marked ``ground`` are closed numeric facts that ``decide``/``omega`` close.
    Needs only a Lean toolchain (no Mathlib), so it is the quickest way to try the whole pipeline.
    """

    name = "core"
    description = (
        "core-Lean arithmetic from miniF2F, no Mathlib needed (shipped: 67 test + 54 valid)"
    )
    hub_id = None  # shipped with the package; `path=` still loads another copy
    filename = "core.jsonl"
    lean_toolchain = "leanprover/lean4:v4.24.0"
    mathlib_rev = None

    def load_rows(self) -> Iterable[RawRow]:
        """The shipped file, unless ``path`` or ``hub_id`` names another source."""
        if self.config.path is None and self.config.hub_id is None:
            return self._rows_from_path(data_file())
        return super().load_rows()


class Core(Environment):
    name = "core"
    description = CoreTaskset.description
    taskset_class: ClassVar[type[Taskset]] = CoreTaskset
