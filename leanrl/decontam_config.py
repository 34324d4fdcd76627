"""The decontamination options (a small module of its own: tasksets import it at start-up, while
the matching itself, :mod:`leanrl.decontam_match`, is imported only when used)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["BenchmarkRef", "DecontaminationConfig"]


class BenchmarkRef(BaseModel):
    """One evaluation benchmark to check training rows against."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    env: str
    """Environment id (``minif2f``, ``proofnet``, ...) or import path ``package.module:Class``."""
    path: Path | None = None
    """Local copy of its data (a JSONL file or a folder holding it); None loads it from the hub."""

    @classmethod
    def parse(cls, spec: str) -> BenchmarkRef:
        """``ENV`` or ``ENV=PATH`` (the command-line and TOML spelling)."""
        env, sep, path = spec.partition("=")
        env = env.strip()
        if not env:
            raise ValueError(f"benchmark {spec!r}: expected ENV or ENV=PATH, e.g. minif2f=data/")
        return cls(env=env, path=Path(path.strip()).expanduser() if sep else None)

    def __str__(self) -> str:
        return self.env if self.path is None else f"{self.env}={self.path}"


class DecontaminationConfig(BaseModel):
    """Which benchmarks training rows must not overlap, and how overlap is decided."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    against: list[str] = Field(default_factory=list)
    """Benchmarks to check against, each ``ENV`` or ``ENV=PATH`` (``minif2f=data/minif2f.jsonl``,
    comma-separated on the command line); every split of each is used. Empty (the default)
    turns decontamination off."""
    informal_ngram: int | None = Field(default=None, ge=3)
    """Also drop rows whose informal statement shares a run of this many words with a
    benchmark's informal statement (13 is the usual choice; texts shorter than that are not
    compared). None: formal statements only."""

    @field_validator("against", mode="before")
    @classmethod
    def _split(cls, v: object) -> object:
        if isinstance(v, str):
            v = v.split(",")
        if isinstance(v, list):
            out = [str(x).strip() for x in v if str(x).strip()]
            for spec in out:
                BenchmarkRef.parse(spec)  # a malformed spec fails here, at config time
            return out
        return v

    @property
    def benchmarks(self) -> list[BenchmarkRef]:
        """``against`` parsed."""
        return [BenchmarkRef.parse(s) for s in self.against]
