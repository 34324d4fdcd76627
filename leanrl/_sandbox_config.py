"""Settings of the sandboxed runtimes (``docker`` and ``modal``), nested in ``RuntimeConfig``."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["DockerConfig", "ModalConfig"]


class DockerConfig(BaseModel):
    """Settings of the ``docker`` runtime."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    image: str = "leanrl-verifier:latest"
    """Image with Lean, Mathlib, the REPL and ``leanrl serve`` (see ``runtimes/docker``)."""
    containers: int = Field(default=1, ge=1)
    """Warm containers to keep ready."""


class ModalConfig(BaseModel):
    """Settings of the ``modal`` runtime."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    batch_size: int = Field(default=64, ge=1)
    """Attempts sent to one Sandbox at a time."""
    warm_sandboxes: int = Field(default=2, ge=0)
    """Sandboxes kept started and ready."""
