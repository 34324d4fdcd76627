"""The bodies of the launched functions, the same on Modal and in local processes.

Each takes one small picklable payload and returns a small picklable result; no weights travel.
A *container* (a Modal container, or a local process) keeps what it loaded in :data:`_WARM`, so
the next member it scores reuses the model and applies only the history records it lacks.

- :func:`es_member`: one ES member: rebuild θ from (base model or checkpoint on the Volume,
  history records), perturb, generate, check in Lean sandboxes, reward. Several members may
  run at once in one container; they share its engine through a gate (member i+1 generates
  while member i is checked: :mod:`leanrl.train.es.pipeline`).
- :func:`es_checkpoint`: rebuild θ at iteration t on a GPU and save ``checkpoint-t`` into the
  run folder on the Volume (the orchestrator holds no weights).
- :func:`run_job`: run a whole command (the ES orchestrator, GRPO training, an eval) with the
  Volume as its working folder, so ``runs/x`` is a folder on the Volume.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from leanrl.launch.specs import (
    ROLE_ENV,
    VOLUME_ENV,
    VOLUME_NAME_ENV,
    CheckpointCall,
    JobCall,
    MemberCall,
    MemberResult,
    commit_volume,
    container_id,
    container_started,
    reload_volume,
    volume_root,
)

__all__ = [
    "ROLE_ENV",
    "VOLUME_ENV",
    "VOLUME_NAME_ENV",
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


# -- ES members -------------------------------------------------------------------------------


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
    from leanrl.train.es.history import load_weights
    from leanrl.train.es.pipeline import EngineGate, TorchEngine
    from leanrl.train.es.policy import TorchPolicy

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
                from leanrl.train.es.pipeline import VLLMEngine
                from leanrl.train.es.workers import VLLMScorer, _EnginePolicy

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
    from leanrl.train.es.pipeline import MemberPolicy
    from leanrl.train.es.workers import score_rollouts

    t_start = time.time()
    w = await _engine_for(call)
    policy = MemberPolicy(w.gate, call.member, call.sigma)
    busy0 = w.gate.busy_s
    scale = call.member.sign * call.sigma
    turn0 = w.gate.turn_s.get((call.member.seed, scale), 0.0)
    t0 = time.perf_counter()
    score = await score_rollouts(w.env, policy, call.tasks, call.sampling)
    wall = time.perf_counter() - t0
    score.perturb_s = w.gate.perturb_s.get((call.member.seed, scale), 0.0)
    device = "cuda" if call.engine == "vllm" else call.source.device
    kind, gpus = local_gpus(device, os.environ.get("LEANRL_GPU_KIND", "auto"))
    runtime = getattr(w.env, "_runtime", None)
    return MemberResult(
        index=call.index,
        score=score,
        container=container_id(),
        container_t0=container_started(),
        t_start=t_start,
        t_end=time.time(),
        # the gate's busy time grew by this member's turns and any other member's in between;
        # the caller sums per container over the iteration, where the two agree
        busy_s=w.gate.busy_s - busy0,
        gpu_kind=kind,
        gpus=gpus or int(os.environ.get("LEANRL_GPU_COUNT", "0") or 0),
        sandbox=dict(runtime.metrics()) if runtime is not None else {},
        gen_s=w.gate.turn_s.get((call.member.seed, scale), 0.0) - turn0,
        check_s=max(0.0, wall - policy.generate_s),
    )


# -- checkpoints ------------------------------------------------------------------------------


def es_checkpoint(call: CheckpointCall) -> str:
    """Rebuild θ at ``iteration`` from source + records and save it as a checkpoint."""
    from leanrl.train.common import RunDir
    from leanrl.train.es.history import load_weights
    from leanrl.train.es.weights import MASTER_FILE

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
