"""Task: one theorem to prove. Immutable data, nothing else."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["Task"]


class Task(BaseModel):
    """One theorem: the statement the model must prove and where it came from."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    name: str
    """Declaration name, exactly as it appears in ``formal_statement`` (the checker looks for
    a theorem with exactly this name)."""
    id: str = ""
    """Unique id within the taskset; defaults to ``name`` (ProofNet's DeepSeek copy repeats names
    across books, so it uses ``Book|exercise`` ids)."""
    header: str
    """Imports, options and ``open`` lines that go before the statement (may be empty)."""
    formal_statement: str
    """The declaration without its proof, ending in ``:= by``."""
    informal_statement: str | None = None
    """The natural-language statement (often LaTeX), when the dataset has one."""
    split: str | None = None
    """The dataset split the task belongs to (``valid``/``test``/...)."""
    source: str | None = None
    """Where the statement came from (``owner/repo@commit:path`` or a hub id)."""
    category: str | None = None
    """A grouping for per-category pass@k (e.g. ``imo``, ``aime``, ``mathd_algebra``)."""
    extra: dict[str, Any] = Field(default_factory=dict)
    """Any other fields of the dataset row (kept for prompts and reports)."""

    @model_validator(mode="after")
    def _default_id(self) -> Task:
        if not self.id:
            object.__setattr__(self, "id", self.name)
        return self

    def lean_text(self, proof: str, preamble: str = "") -> str:
        """The full Lean source for ``proof`` placed under this statement."""
        body = proof if proof.startswith("\n") else "\n  " + proof
        pre = preamble.rstrip() + "\n\n" if preamble.strip() else ""
        return f"{self.header}{pre}{self.formal_statement}{body}\n"
