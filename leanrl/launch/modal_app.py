"""The Modal app of a launch, defined in code: images per role, Volume, Secret, GPU Functions.

:func:`build_app` returns an :class:`AppDefinition` (the ``modal.App`` and what it holds, so it
can be inspected offline): three images, one per role,

- ``gpu``: CUDA torch, transformers, vLLM (``gpu_packages``) and leanrl: ES members, checkpoints,
  GRPO training, evals;
- ``orchestrator``: a slim CPU image (CPU torch, no vLLM) for the ES loop, which holds no weights;
- ``lean``: the Lean sandbox image of the ``modal`` runtime (toolchain, Mathlib, REPL, the
  verification service), started as Sandboxes by the GPU Functions in batches;

the Volume (base weights through ``HF_HOME``, run folders, checkpoints, ES history, eval
outputs), the Secret with ``HF_TOKEN``, and five Functions: ``es_member`` (GPU, ``.map`` over
members, ``members_per_container`` inputs at once), ``es_checkpoint`` (GPU), ``orchestrate``
(CPU), ``train_grpo`` (``gpu_count`` GPUs) and ``evaluate`` (GPU). Building it contacts nothing;
:class:`ModalFunctions` deploys it and calls its Functions (that part needs an account).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from leanrl._sandbox_config import ModalConfig
from leanrl.errors import LeanrlError
from leanrl.launch.config import ModalLaunchConfig
from leanrl.launch.local_functions import FunctionError
from leanrl.launch.specs import FUNCTION_ROLES, ROLE_ENV, VOLUME_ENV, VOLUME_NAME_ENV

__all__ = ["FUNCTION_ROLES", "AppDefinition", "ModalFunctions", "build_app", "function_env"]

_GPU_PIP = ("torch>=2.4,<2.15", "transformers>=4.45", "accelerate>=1.0")
_SLIM_PIP = ("pydantic>=2.7", "pydantic-settings>=2.6", "httpx>=0.27", "modal>=0.64",
             "tqdm>=4.66", "matplotlib>=3.8", "psutil>=5.9", "datasets>=2.20",
             "transformers>=4.45", "fastapi>=0.110", "uvicorn>=0.29")  # fmt: skip


def function_env(m: ModalLaunchConfig, role: str) -> dict[str, str | None]:
    """Environment variables of a Function's containers."""
    env: dict[str, str | None] = {
        VOLUME_ENV: m.volume_mount,
        VOLUME_NAME_ENV: m.volume,
        ROLE_ENV: role,
        # base weights downloaded once, onto the Volume, and shared by every container
        "HF_HOME": f"{m.volume_mount}/hf-cache",
        "TOKENIZERS_PARALLELISM": "false",
    }
    if role == "gpu":
        env["LEANRL_GPU_KIND"] = m.gpu
        env["LEANRL_GPU_COUNT"] = str(m.gpu_count)
    return env


@dataclass
class AppDefinition:
    """A built ``modal.App`` and its parts, by name."""

    app: Any
    images: dict[str, Any]
    """``gpu``, ``orchestrator`` and ``lean`` images."""
    volume: Any
    secrets: list[Any]
    functions: dict[str, Any] = field(default_factory=dict)
    """Function name -> ``modal.Function``."""
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Function name -> the keyword arguments it was defined with (gpu, timeout, retries...)."""


def _with_leanrl(image: Any) -> Any:
    """``image`` with leanrl's source added and installed (without its dependencies)."""
    from leanrl.runtimes.modal.image import _leanrl_source

    src, remote, cmds, env, paths = _leanrl_source()
    ignore = ["**/.git", "**/__pycache__", "**/.venv", "**/*.egg-info", "**/build", "**/runs"]
    for sub in paths:
        here, there = src / sub, f"{remote}/{sub}".removesuffix("/.")
        if here.is_dir():
            image = image.add_local_dir(here, there, copy=True, ignore=ignore)
        elif here.is_file():
            image = image.add_local_file(here, there, copy=True)
    if cmds:
        image = image.run_commands(*cmds)
    return image.env(env) if env else image


def build_images(m: ModalLaunchConfig, lean: ModalConfig) -> dict[str, Any]:
    """The three images (lazy descriptions: nothing is built or sent here)."""
    import modal

    from leanrl.runtimes.modal.image import build_image

    gpu = (
        modal.Image.debian_slim(python_version=m.python_version)
        .apt_install("git")
        .pip_install(*_GPU_PIP, *m.gpu_packages, *_SLIM_PIP)
    )
    slim = (
        modal.Image.debian_slim(python_version=m.python_version)
        .pip_install("torch>=2.4,<2.15", index_url="https://download.pytorch.org/whl/cpu")
        .pip_install(*_SLIM_PIP)
    )
    return {"gpu": _with_leanrl(gpu), "orchestrator": _with_leanrl(slim), "lean": build_image(lean)}


def build_app(m: ModalLaunchConfig, lean: ModalConfig | None = None) -> AppDefinition:
    """The app for ``m`` (``lean``: the Lean sandboxes' settings, ``env.runtime.modal``)."""
    import modal

    images = build_images(m, lean or ModalConfig())
    volume = modal.Volume.from_name(m.volume, create_if_missing=True)
    secrets = [modal.Secret.from_name(m.secret)] if m.secret else []
    app = modal.App(m.app_name)
    d = AppDefinition(app, images, volume, secrets)
    retries = modal.Retries(max_retries=m.retries, initial_delay=1.0, backoff_coefficient=2.0)
    gpu = m.gpu if m.gpu_count == 1 else f"{m.gpu}:{m.gpu_count}"
    common: dict[str, Any] = {
        "volumes": {m.volume_mount: volume},
        "secrets": secrets,
        "retries": retries,
        "scaledown_window": m.scaledown_window_s,
        "serialized": True,  # defined here, from the config, not at a module's top level
    }
    per_fn: dict[str, dict[str, Any]] = {
        "es_member": {
            "gpu": m.gpu,  # one engine per container; more GPUs go to tensor parallelism
            "timeout": m.member_timeout_s,
            "max_containers": m.member_containers,
        },
        "es_checkpoint": {"gpu": m.gpu, "timeout": m.member_timeout_s},
        "orchestrate": {
            "cpu": m.orchestrator_cpu,
            "memory": m.orchestrator_memory_mb,
            "timeout": m.timeout_s,
        },
        "train_grpo": {"gpu": gpu, "timeout": m.timeout_s},
        "evaluate": {"gpu": gpu, "timeout": m.timeout_s},
    }
    bodies = _bodies()
    for name, role in FUNCTION_ROLES.items():
        kw = {**common, **per_fn[name]}
        body = bodies[name]
        if name == "es_member":
            body = modal.concurrent(max_inputs=m.first_members_per_container)(body)
        d.functions[name] = app.function(
            image=images["gpu" if role == "gpu" else "orchestrator"],
            env=function_env(m, role),
            name=name,
            **kw,
        )(body)
        d.settings[name] = {k: v for k, v in kw.items() if k not in ("volumes", "secrets")}
    return d


def _bodies() -> dict[str, Any]:
    """Thin wrappers the containers run: each imports its body there
    (:data:`~leanrl.launch.specs.FUNCTION_BODIES`), not here."""

    async def es_member(call: Any) -> Any:
        from leanrl.launch.specs import FUNCTION_BODIES, body

        return await body(FUNCTION_BODIES["es_member"])(call)

    def es_checkpoint(call: Any) -> Any:
        from leanrl.launch.specs import FUNCTION_BODIES, body

        return body(FUNCTION_BODIES["es_checkpoint"])(call)

    def run_job(call: Any) -> Any:
        from leanrl.launch.specs import FUNCTION_BODIES, body

        return body(FUNCTION_BODIES["orchestrate"])(call)

    return {
        "es_member": es_member,
        "es_checkpoint": es_checkpoint,
        "orchestrate": run_job,
        "train_grpo": run_job,
        "evaluate": run_job,
    }


class ModalFunctions:
    """The deployed app's Functions behind the interface of :class:`LocalFunctions`.

    Outside a container, :meth:`start` deploys the app (images build once and are cached by
    Modal); inside one (the orchestrator), the Functions are looked up by name.
    """

    def __init__(self, m: ModalLaunchConfig, lean: ModalConfig | None = None) -> None:
        self.m = m
        self.lean = lean
        self._fns: dict[str, Any] = {}

    async def start(self) -> None:
        import os

        import modal

        if not os.environ.get(VOLUME_NAME_ENV):  # on the user's machine: deploy first
            d = build_app(self.m, self.lean)
            try:
                with modal.enable_output():
                    await d.app.deploy.aio(name=self.m.app_name)
            except Exception as e:
                raise FunctionError(
                    f"cannot deploy the Modal app {self.m.app_name!r} ({type(e).__name__}: {e})."
                    " Log in with `modal token new` (or set MODAL_TOKEN_ID and "
                    "MODAL_TOKEN_SECRET), or use --launcher.modal.backend local to run the same "
                    "functions on this machine"
                ) from e

    def _fn(self, name: str) -> Any:
        if name not in self._fns:
            import modal

            self._fns[name] = modal.Function.from_name(self.m.app_name, name)
        return self._fns[name]

    def with_concurrency(self, name: str, max_inputs: int) -> None:
        """Calls of ``name`` go to a variant taking ``max_inputs`` inputs per container
        (``Function.with_concurrency``: it autoscales apart, so its containers start fresh;
        the old ones scale down after their window)."""
        self._fns[name] = self._fn(name).with_concurrency(max_inputs=max_inputs)

    async def map(self, name: str, inputs: Sequence[Any]) -> AsyncIterator[tuple[int, Any]]:
        """Results as they finish (``order_outputs=False``); each carries its input's index."""
        fn = self._fn(name)
        async for r in fn.map.aio(list(inputs), order_outputs=False, return_exceptions=True):
            if isinstance(r, BaseException):
                raise FunctionError(f"{name} failed on Modal: {r}")
            yield int(r.index), r

    async def call(self, name: str, payload: Any) -> Any:
        """One blocking call (``.remote``, not ``.spawn``): Modal ties its input to this caller,
        so a caller that goes away does not leave it running on purpose (see "Crashes and
        resume" in docs/training-modal.md)."""
        try:
            return await self._fn(name).remote.aio(payload)
        except LeanrlError:
            raise  # a ConfigError in the Function: one line on the CLI, as if raised here
        except Exception as e:
            raise FunctionError(f"{name} failed on Modal: {type(e).__name__}: {e}") from e

    async def close(self) -> None:
        return None
