"""Launching ``leanrl train es|grpo`` and ``leanrl eval`` where ``launcher`` says.

``launch(kind, config)`` is what the CLI calls when ``launcher.name = "modal"``:

- ES, orchestrator ``local``: the ES loop runs here (no weights here), the population is fanned
  out over ``es_member`` calls (:class:`~leanrl.launch.es_map.MapScorer`), checkpoints are built
  by ``es_checkpoint``, and the run folder is mirrored to the Volume after every iteration;
- ES, orchestrator ``function``: the same loop runs in the ``orchestrate`` CPU Function, with
  the run folder on the mounted Volume (committed every iteration);
- GRPO and eval: the whole command runs in a GPU Function (``train_grpo``, ``evaluate``) with
  the Volume as its working folder, Lean in Modal Sandboxes.

Either way ``--out`` (and a ``--model`` path) are folders on the Volume, so a crashed run is
resumed by running the same command again, and ``leanrl eval --launcher.name modal --model
runs/x/checkpoint-N`` evaluates a checkpoint where it lies.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any, Literal

from leanrl._sandbox_config import KEEP_SECRETS
from leanrl.errors import ConfigError
from leanrl.launch.config import ModalLaunchConfig
from leanrl.launch.local_functions import FunctionSpec, LocalFunctions
from leanrl.launch.specs import FUNCTION_BODIES, ROLE_ENV, JobCall, volume_root

__all__ = ["functions_for", "job_call", "launch", "local_specs", "run_here"]


def local_specs(m: ModalLaunchConfig) -> dict[str, FunctionSpec]:
    """The app's Functions as local processes (the ``local`` backend)."""
    gpu = {"LEANRL_GPU_KIND": "none"}  # local processes are priced by their own device
    return {
        "es_member": FunctionSpec(
            FUNCTION_BODIES["es_member"], m.member_containers, m.first_members_per_container, gpu
        ),
        "es_checkpoint": FunctionSpec(FUNCTION_BODIES["es_checkpoint"], 1, 1, gpu),
        "orchestrate": FunctionSpec(
            FUNCTION_BODIES["orchestrate"], 1, 1, {ROLE_ENV: "orchestrator"}
        ),
        "train_grpo": FunctionSpec(FUNCTION_BODIES["train_grpo"], 1, 1, {ROLE_ENV: "gpu"}),
        "evaluate": FunctionSpec(FUNCTION_BODIES["evaluate"], 1, 1, {ROLE_ENV: "gpu"}),
    }


def functions_for(m: ModalLaunchConfig, lean: Any = None) -> Any:
    """The app's Functions: deployed on Modal, or local processes."""
    if m.backend == "local":
        root = volume_root() if os.environ.get(ROLE_ENV) else m.local_volume
        return LocalFunctions(local_specs(m), root, retries=m.retries)
    from leanrl.launch.modal_app import ModalFunctions

    return ModalFunctions(m, lean)


def _on_volume(path: Path | None, what: str) -> str:
    if path is None:
        raise ConfigError(f"{what} must be set with --launcher.name modal")
    if Path(path).expanduser().is_absolute():
        raise ConfigError(
            f"{what} = {str(path)!r}: with --launcher.name modal it is a folder on the Volume, so "
            "give a relative path (e.g. runs/es-minif2f)"
        )
    return Path(path).as_posix()


def job_call(kind: str, config: Any) -> JobCall:
    """The payload of a whole-command Function: ``config`` as JSON, secrets kept.

    A plain JSON dump writes ``runtime.docker.env`` values as ``<redacted>``; the job rebuilt
    from it would hand its containers that string as their credential. The payload travels to
    the Function's process (pickled, over Modal's encrypted channel) and is never written to
    the Volume: the job's own files (``config.json``, ``run.json``) redact them as always."""
    role = "orchestrator" if kind == "es" else "gpu"
    return JobCall(kind, config.model_dump(mode="json", context=KEEP_SECRETS), role)  # type: ignore[arg-type]


def launch(kind: str, config: Any) -> dict[str, Any]:
    """Run command ``kind`` (``es``, ``grpo``, ``eval``) per ``config.launcher`` (Modal)."""
    m = config.launcher.modal
    out = config.out if kind != "eval" else config.out_dir
    rel = _on_volume(out, "--out")
    lean = config.env.runtime.modal
    if kind == "es" and m.orchestrator == "local":
        from leanrl.launch.volume import FolderVolume, ModalVolume, RunMirror

        store: Any = FolderVolume(m.local_volume) if m.backend == "local" else ModalVolume(m.volume)
        mirror = RunMirror(store, Path(out), rel)
        mirror.pull()  # a run started (or killed) elsewhere continues here
        there = str(Path(store.root) / rel) if m.backend == "local" else f"{m.volume_mount}/{rel}"
        return asyncio.run(
            _orchestrate(config, functions_for(m, lean), (str(Path(out)), there), mirror)
        )
    name = {"es": "orchestrate", "grpo": "train_grpo", "eval": "evaluate"}[kind]
    call = job_call(kind, config)

    async def go() -> Any:
        fns = functions_for(m, lean)
        await fns.start()
        try:
            return await fns.call(name, call)
        finally:
            await fns.close()

    result: dict[str, Any] = asyncio.run(go())
    return result


async def _orchestrate(
    config: Any, functions: Any, path_map: tuple[str, str] | None, mirror: Any = None
) -> dict[str, Any]:
    """The ES loop with the population fanned out over ``es_member`` calls."""
    from leanrl.launch.es_map import MapScorer
    from leanrl.launch.specs import commit_volume
    from leanrl.train.es import ESTrainer

    m = config.launcher.modal
    device = "cuda" if m.backend == "modal" else config.policy.device
    if device == "auto":
        device = "cpu"  # the local backend's processes run where this does: no GPU assumed
    engine: Literal["inprocess", "vllm"] = (
        "vllm" if config.scorer.backend == "vllm" else "inprocess"
    )
    scorer = MapScorer(
        functions,
        config.env,
        config.policy,
        device=device,
        engine=engine,
        scaledown_window_s=m.scaledown_window_s,
        members_per_container=m.members_per_container,
        path_map=path_map,
        sync=mirror.push if mirror is not None else commit_volume,
    )
    trainer = ESTrainer(config, scorer=scorer)
    try:
        await trainer.train()
    finally:
        await trainer.close()
        if mirror is not None:
            mirror.push()
        else:
            commit_volume()
    return {"out": str(trainer.run.path), "iterations": trainer.iteration}


def run_here(kind: str, config_json: dict[str, Any]) -> dict[str, Any]:
    """Run a job in this process (inside a launched container, or the local launcher)."""
    if kind == "es":
        from leanrl.train.es import ESConfig

        cfg = ESConfig.model_validate(config_json)
        if cfg.launcher.name == "modal" and os.environ.get(ROLE_ENV) == "orchestrator":
            return asyncio.run(_orchestrate(cfg, functions_for(cfg.launcher.modal), None))
        from leanrl.train.es import ESTrainer

        t = ESTrainer(cfg)
        t.train_sync()
        return {"out": str(t.run.path), "iterations": t.iteration}
    if kind == "grpo":
        from leanrl.train.grpo import GRPOConfig, GRPOTrainer

        g = GRPOTrainer(GRPOConfig.model_validate(config_json))
        g.check()
        g.train_sync()
        return {"out": str(g.run.path)}
    if kind == "eval":
        from leanrl.eval.config import EvalConfig
        from leanrl.eval.runner import run_eval_sync

        summary: dict[str, Any] = run_eval_sync(EvalConfig.model_validate(config_json))
        return summary
    raise ConfigError(f"unknown job kind {kind!r}")
