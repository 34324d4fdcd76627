"""The REPL revision of every Lean version a built-in taskset pins: data, importing nothing.

Read by ``leanrl setup`` (:mod:`leanrl.lean.project`, which Lake project to make) and by the
sandbox runtimes (:func:`leanrl._sandbox_config.image_pins`, which REPL an image builds), so
both sit above it and neither imports the other.
"""

from __future__ import annotations

__all__ = ["REPL_REVISIONS", "REPL_REVS", "REPL_UNTAGGED"]

REPL_REVISIONS: dict[str, str] = {
    # Untagged: the last master commit on v4.8.0-rc1 (#41, 2024-05-23); the next one (#45)
    # bumps to v4.8.0.
    "v4.8.0-rc1": "88a0643592d35d20a279e416e839a1f4184444a1",
    "v4.9.0": "d920817f334e1d8d27c8ca35e52c736a8c8818b0",  # tag v4.9.0 (#47)
    # Untagged: master went from v4.19.0 to v4.20.1-rc1. The one commit built on v4.20.0 is the
    # tip of the branch `bump_to_v4.20.0` (PR #102, 2025-06-02), which changes only the
    # toolchain and test expectations: its REPL/ folder is byte-identical to tag v4.19.0's.
    "v4.20.0": "16054ca34b80803d6621dccd11882ca2ea03e215",
    "v4.24.0": "8fff8552292860d349b459d6a811e6915671dc0d",  # tag v4.24.0 (#131)
    "v4.27.0": "0e9e6e2962ab0a51440513d9ee028c8aa66bb53b",  # tag v4.27.0 (#142)
}
"""The leanprover-community/repl commit for every Lean version a built-in taskset pins, read
from that repository on 2026-12-01 (a snapshot whose newest master commit is of 2026-08-03,
toolchain v4.33.0-rc2). Each commit's ``lean-toolchain`` names exactly that version, and each
has the ``pickleTo`` requests the pool uses. tests/test_lean_project.py checks the table against
a local copy of the repository where there is one."""

REPL_UNTAGGED = frozenset({"v4.8.0-rc1", "v4.20.0"})
"""Versions of :data:`REPL_REVISIONS` the REPL repository has no tag for: they are required by
commit. Every other version is required by its tag (``v4.24.0``), which Lake resolves."""

REPL_REVS: dict[str, str] = {v: REPL_REVISIONS[v] for v in sorted(REPL_UNTAGGED)}
"""REPL revisions for Lean versions the REPL repository has no tag for."""
