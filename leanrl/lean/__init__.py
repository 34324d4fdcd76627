"""leanrl's Lean layer: the REPL protocol, message parsing, the soundness policy, the process pool,
one-shot mode, and finding/creating the Lean project. See docs/verification.md.

Import submodules directly (``leanrl.lean.pool``, ``leanrl.lean.judge``, ...); this package keeps
its import light so the CLI starts fast.
"""

from __future__ import annotations

__all__: list[str] = []
