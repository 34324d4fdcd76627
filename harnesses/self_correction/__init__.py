"""``self-correction`` harness: a whole proof, then revisions shown Lean's errors (see
docs/harnesses.md)."""

from __future__ import annotations

from .feedback import checked_text, render_errors
from .harness import SelfCorrectionHarness

__all__ = ["SelfCorrectionHarness", "checked_text", "render_errors"]
