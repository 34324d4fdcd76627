"""What the launcher and both backends share: the Functions, their bodies and payloads.

The launcher (:mod:`leanrl.launch.launcher`), the Modal app (:mod:`leanrl.launch.modal_app`) and
the local processes (:mod:`leanrl.launch.local_functions`) name the same Functions; each
Function's body is named here by its import path (:data:`FUNCTION_BODIES`) and imported where it
runs, in the container, so no backend imports the bodies (:mod:`leanrl.launch.functions`), which
themselves start launches (the ES orchestrator fans its members out again). The payloads are
small picklable dataclasses; no weights travel.
"""

from __future__ import annotations

import importlib
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from leanrl.environment import EnvironmentConfig
from leanrl.policy import PolicyConfig, SamplingConfig
from leanrl.task import Task
from leanrl.train.es.history import HistoryRecord, WeightsSource
from leanrl.train.es.workers import Member, MemberScore

__all__ = [
    "FUNCTION_BODIES",
    "FUNCTION_ROLES",
    "ROLE_ENV",
    "VOLUME_ENV",
    "VOLUME_NAME_ENV",
    "CheckpointCall",
    "JobCall",
    "MemberCall",
    "MemberResult",
    "body",
    "commit_volume",
    "container_id",
    "container_started",
    "reload_volume",
    "volume_root",
]

FUNCTION_ROLES: dict[str, str] = {
    "es_member": "gpu",
    "es_checkpoint": "gpu",
    "orchestrate": "orchestrator",
    "train_grpo": "gpu",
    "evaluate": "gpu",
}
"""Every Function of the app and the image (role) it runs in."""

FUNCTION_BODIES: dict[str, str] = {
    "es_member": "leanrl.launch.functions:es_member",
    "es_checkpoint": "leanrl.launch.functions:es_checkpoint",
    "orchestrate": "leanrl.launch.functions:run_job",
    "train_grpo": "leanrl.launch.functions:run_job",
    "evaluate": "leanrl.launch.functions:run_job",
}
"""Every Function's body, ``module:function``: imported in the container that runs it."""


def body(spec: str) -> Any:
    """The function a ``module:function`` body names (imported here, in the container)."""
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


ROLE_ENV = "LEANRL_LAUNCH_ROLE"
"""Set in every launched container: ``orchestrator`` or ``gpu`` (what the job runs as)."""
VOLUME_ENV = "LEANRL_VOLUME_ROOT"
"""The Volume's mount point in this container."""
VOLUME_NAME_ENV = "LEANRL_VOLUME_NAME"
"""The Modal Volume's name (unset for the local backend, whose Volume is a folder)."""

_CONTAINER_ID = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
_CONTAINER_T0 = time.time()


def container_id() -> str:
    """Who this container is (results carry it, so the caller can account per container)."""
    return _CONTAINER_ID


def container_started() -> float:
    """When this container started (epoch seconds; results carry it, for the GPU-seconds)."""
    return _CONTAINER_T0


def volume_root() -> Path:
    """Where the Volume is in this container (the current folder outside one)."""
    return Path(os.environ.get(VOLUME_ENV, ".")).resolve()


def commit_volume() -> None:
    """Make this container's writes to the Volume durable and visible (no-op for a folder)."""
    name = os.environ.get(VOLUME_NAME_ENV)
    if name:
        import modal

        modal.Volume.from_name(name).commit()


def reload_volume() -> None:
    """See writes other containers committed since this one started (no-op for a folder)."""
    name = os.environ.get(VOLUME_NAME_ENV)
    if name:
        import modal

        modal.Volume.from_name(name).reload()


# -- payloads ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemberCall:
    """Everything a container needs to score one member (all of it small)."""

    index: int
    """Position of the member in the population (results are put back in this order)."""
    member: Member
    source: WeightsSource
    """Base model (hub id or a path on the Volume) or checkpoint, and the device kind."""
    records: tuple[HistoryRecord, ...]
    """The history so far; the container applies the ones it lacks."""
    iteration: int
    tasks: tuple[Task, ...]
    sampling: SamplingConfig
    sigma: float
    env: EnvironmentConfig
    policy: PolicyConfig
    engine: Literal["inprocess", "vllm"] = "inprocess"
    """What generates in the container: transformers, or a vLLM engine (GPU)."""


@dataclass
class MemberResult:
    """One member's score and what its container spent."""

    index: int
    score: MemberScore
    container: str
    """Id of the container that scored it."""
    container_t0: float
    """When that container started (epoch seconds)."""
    t_start: float
    """When this call started and ended in the container (epoch seconds)."""
    t_end: float
    busy_s: float
    """Seconds this member held the engine (perturbing and generating)."""
    gpu_kind: str | None
    gpus: int
    sandbox: dict[str, float] = field(default_factory=dict)
    """The container's Lean runtime figures so far (cumulative; sandbox-seconds...)."""
    gen_s: float = 0.0
    """Engine seconds of this member's own generate calls (G of the pipeline-depth rule)."""
    check_s: float = 0.0
    """Seconds of this call spent outside generate (waiting for the engine excluded): its
    attempts being checked (V of the rule)."""


@dataclass(frozen=True)
class CheckpointCall:
    """Save ``checkpoint-<iteration>`` of an ES run whose weights live only in member engines."""

    run_dir: str
    """The run folder (a path on the Volume)."""
    source: WeightsSource
    records: tuple[HistoryRecord, ...]
    iteration: int
    state: dict[str, Any]
    keep: int


@dataclass(frozen=True)
class JobCall:
    """A whole command to run in a container: ``kind`` with its resolved config."""

    kind: Literal["es", "grpo", "eval"]
    config: dict[str, Any]
    """The command's config (``model_dump(mode="json", context=KEEP_SECRETS)``: secret values
    kept, since the job runs with them; it is never written as it is). Paths are relative to the
    Volume."""
    role: Literal["orchestrator", "gpu"]
