"""The bodies of the launched functions, the same on Modal and in local processes.

Each takes one small picklable payload and returns a small picklable result; no weights travel.
A *container* (a Modal container, or a local process) keeps what it loaded in :data:`_WARM`, so
the next member it scores reuses the model and applies only the history records it lacks.

- :func:`es_member`: one ES member: rebuild θ from (base model or checkpoint on the Volume,
  history records), perturb, generate, check in Lean sandboxes, reward. Several members may
  run at once in one container; they share its engine through a gate (member i+1 generates
  while member i is checked: :mod:`leanrl.train.es_pipeline`).
- :func:`es_checkpoint`: rebuild θ at iteration t on a GPU and save ``checkpoint-t`` into the
  run folder on the Volume (the orchestrator holds no weights).
- :func:`run_job`: run a whole command (the ES orchestrator, GRPO training, an eval) with the
  Volume as its working folder, so ``runs/x`` is a folder on the Volume.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from leanrl.environment import EnvironmentConfig
from leanrl.policy import PolicyConfig, SamplingConfig
from leanrl.task import Task
from leanrl.train.es_history import HistoryRecord, WeightsSource
from leanrl.train.es_workers import Member, MemberScore

__all__ = [
    "CheckpointCall",
    "JobCall",
    "MemberCall",
    "MemberResult",
    "container_id",
    "es_checkpoint",
    "es_member",
    "run_job",
    "volume_root",
]

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


# -- ES members -------------------------------------------------------------------------------


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


class _Warm:
    """A container's loaded engine, the history it has applied, and its environment."""

    def __init__(self) -> None:
        self.key: tuple[Any, ...] | None = None
        self.engine: Any = None
        self.gate: Any = None
        self.env: Any = None
        self.applied = 0
        self.lock = asyncio.Lock()


_WARM = _Warm()


def _resolve(path: str | None) -> str | None:
    """A relative path is on the Volume; a hub id (no such folder) is kept as it is."""
    if path is None:
        return None
    p = Path(path).expanduser()
    if p.is_absolute():
        return str(p)
    on_volume = volume_root() / p
    return str(on_volume) if on_volume.exists() else path


async def _engine_for(call: MemberCall) -> _Warm:
    from leanrl.environment import load_environment
    from leanrl.train.es_history import load_weights
    from leanrl.train.es_pipeline import EngineGate, TorchEngine
    from leanrl.train.es_policy import TorchPolicy

    w = _WARM
    src = call.source
    key = (src.model, src.checkpoint, src.iteration, src.dtype, call.engine, call.env, call.policy)
    async with w.lock:  # concurrent members of one container build the engine once
        if w.key != key or w.applied > len(call.records):
            if w.env is not None:
                await w.env.close()
            w.engine = w.gate = w.env = None
            model = _resolve(src.model) or src.model
            ckpt = _resolve(src.checkpoint)
            if ckpt is not None and not Path(ckpt).exists():
                reload_volume()  # written by another container after this one started
            local = replace(src, model=model, checkpoint=ckpt)  # LoRA settings and all
            records = [r for r in call.records if r.iteration > src.iteration]
            if call.engine == "vllm":
                from leanrl.train.es_pipeline import VLLMEngine
                from leanrl.train.es_workers import VLLMScorer, _EnginePolicy

                scorer = VLLMScorer(None, local, call.policy, None)  # type: ignore[arg-type]
                await scorer.start()
                scorer.sync(records)
                w.engine = VLLMEngine(scorer.llm, _EnginePolicy(scorer.llm, call.policy))
                w.engine.scorer = scorer  # type: ignore[attr-defined]
            else:
                m, tok, weights = load_weights(local, records)
                w.engine = TorchEngine(weights, TorchPolicy(m, tok, call.policy))
            w.gate = EngineGate(w.engine)
            w.env = load_environment(call.env)
            await w.env.start()
            w.key = key
            w.applied = max(src.iteration, len(call.records))
        for rec in call.records:  # records of iterations finished since the last call
            if rec.iteration > w.applied:
                async with w.gate.lock:  # no member generates while θ moves
                    w.gate.restore()
                    if call.engine == "vllm":
                        w.engine.scorer.sync([rec])
                    else:
                        w.engine.weights.apply_update(rec.coeffs)
                w.applied = rec.iteration
    return w


async def es_member(call: MemberCall) -> MemberResult:
    """Score one member in this container (see the module docstring)."""
    from leanrl.costs import local_gpus
    from leanrl.train.es_pipeline import MemberPolicy
    from leanrl.train.es_workers import score_rollouts

    t_start = time.time()
    w = await _engine_for(call)
    policy = MemberPolicy(w.gate, call.member, call.sigma)
    busy0 = w.gate.busy_s
    score = await score_rollouts(w.env, policy, call.tasks, call.sampling)
    scale = call.member.sign * call.sigma
    score.perturb_s = w.gate.perturb_s.get((call.member.seed, scale), 0.0)
    device = "cuda" if call.engine == "vllm" else call.source.device
    kind, gpus = local_gpus(device, os.environ.get("LEANRL_GPU_KIND", "auto"))
    runtime = getattr(w.env, "_runtime", None)
    return MemberResult(
        index=call.index,
        score=score,
        container=_CONTAINER_ID,
        container_t0=_CONTAINER_T0,
        t_start=t_start,
        t_end=time.time(),
        # the gate's busy time grew by this member's turns and any other member's in between;
        # the caller sums per container over the iteration, where the two agree
        busy_s=w.gate.busy_s - busy0,
        gpu_kind=kind,
        gpus=gpus or int(os.environ.get("LEANRL_GPU_COUNT", "0") or 0),
        sandbox=dict(runtime.metrics()) if runtime is not None else {},
    )


# -- checkpoints ------------------------------------------------------------------------------


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


def es_checkpoint(call: CheckpointCall) -> str:
    """Rebuild θ at ``iteration`` from source + records and save it as a checkpoint."""
    from leanrl.train.common import RunDir
    from leanrl.train.es_history import load_weights
    from leanrl.train.es_weights import MASTER_FILE

    src = call.source
    local = replace(
        src, model=_resolve(src.model) or src.model, checkpoint=_resolve(src.checkpoint)
    )
    reload_volume()
    model, tok, weights = load_weights(local, list(call.records[: call.iteration]))
    need_master = any(str(p.dtype) != "torch.float32" for p in weights.params.values())
    run = RunDir(_resolve(call.run_dir) or call.run_dir)
    path = run.save_checkpoint(
        call.iteration,
        model,
        tok,
        {**call.state, "es_master": need_master},
        keep=call.keep,
        extra=(lambda p: weights.save_master(p / MASTER_FILE)) if need_master else None,
    )
    commit_volume()
    return str(path)


# -- whole jobs -------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobCall:
    """A whole command to run in a container: ``kind`` with its resolved config."""

    kind: Literal["es", "grpo", "eval"]
    config: dict[str, Any]
    """The command's config (``model_dump(mode="json")``); paths are relative to the Volume."""
    role: Literal["orchestrator", "gpu"]


def run_job(call: JobCall) -> dict[str, Any]:
    """Run the job with the Volume as the working folder; returns its summary.

    The role and the working folder are put back afterwards, so a job run in-process (a
    Function's ``.local()``) leaves the caller as it found it."""
    role, cwd = os.environ.get(ROLE_ENV), os.getcwd()
    os.environ[ROLE_ENV] = call.role
    os.chdir(volume_root())
    try:
        from leanrl.launch.launcher import run_here

        return run_here(call.kind, call.config)
    finally:
        commit_volume()
        os.chdir(cwd)
        if role is None:
            os.environ.pop(ROLE_ENV, None)
        else:
            os.environ[ROLE_ENV] = role
