"""The ``launcher`` config section: where a run happens (here, or on Modal) and what it costs.

``leanrl train es|grpo`` and ``leanrl eval`` read it (``--launcher.name modal``). It never
changes what a run computes, only where, so a run may be resumed under another launcher.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from leanrl.costs import PriceTable

__all__ = ["EstimateConfig", "LauncherConfig", "ModalLaunchConfig"]


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class ModalLaunchConfig(_Config):
    """The Modal app a run is launched on (``launcher.name = "modal"``)."""

    backend: Literal["modal", "local"] = "modal"
    """``modal``: real Modal Functions, Volume and Secret. ``local``: the same functions run in
    processes on this machine (containers are processes, the Volume is a folder): tests,
    debugging, and trying a launch without an account."""
    app_name: str = "leanrl"
    """Name of the Modal app that holds the functions."""
    gpu: str = "H100"
    """GPU type of the GPU Functions (Modal's names: ``H100``, ``A100-80GB``, ``L40S``...)."""
    gpu_count: int = Field(default=1, ge=1, le=8)
    """GPUs per GPU container (GRPO trains on all of them; an ES member engine uses them for
    tensor parallelism)."""
    member_containers: int = Field(default=10, ge=1)
    """Most ES member containers at once (the ``.map`` fan-out; Modal's Starter plan allows 10
    GPUs at once)."""
    members_per_container: Annotated[int, Field(ge=1)] | Literal["auto"] = "auto"
    """ES members one container works on at once: with 2, member i+1 generates while member
    i's attempts are in Lean (the container's engine is shared, generation takes turns).
    ``auto`` (the default): 2 in the first iteration, then ``ceil(1 + V/G)`` from the
    containers' measured checking (V) and generation (G) seconds per member (the rule of
    ``scorer.pipeline = "auto"``), logged as ``pipeline_depth``. A change takes effect through
    Modal's ``Function.with_concurrency``, whose containers autoscale apart from the first
    ones: each change starts fresh containers once (the measurement is smoothed, so it rarely
    changes after the second iteration)."""

    @property
    def first_members_per_container(self) -> int:
        """Members per container before anything is measured (the app is defined with it)."""
        # 2: leanrl.train.es.pipeline.AUTO_FIRST_DEPTH (not imported: this layer is below it)
        return 2 if self.members_per_container == "auto" else self.members_per_container

    retries: int = Field(default=2, ge=0)
    """Extra tries of a function call whose container died (preemption, out of memory)."""
    volume: str = "leanrl-runs"
    """Modal Volume holding base models, run folders (history, checkpoints, metrics) and eval
    outputs (created if missing)."""
    volume_mount: str = "/vol"
    """Where the Volume is mounted in every container. ``--out runs/x`` is ``/vol/runs/x``
    there, and ``--model runs/x/checkpoint-10`` resolves on the Volume too."""
    secret: str | None = "huggingface"
    """Modal Secret with ``HF_TOKEN`` (gated models); None for none."""
    orchestrator: Literal["function", "local"] = "function"
    """Where the training loop runs. ``function``: a small CPU Function with the Volume
    mounted (a crash is resumed by running the same command again). ``local``: on this
    machine, with the run folder mirrored to the Volume after every step."""
    orchestrator_cpu: float = Field(default=2.0, gt=0)
    """CPU cores of the orchestrator Function."""
    orchestrator_memory_mb: int = Field(default=8192, ge=256)
    """Memory of the orchestrator Function, in MiB."""
    timeout_s: int = Field(default=86_400, ge=60, le=86_400)
    """Longest a single Function call may run (Modal allows 24 h); a longer run is resumed
    by running the command again."""
    member_timeout_s: int = Field(default=3_600, ge=60)
    """Longest one ES member's scoring may take before its call is retried."""
    scaledown_window_s: int = Field(default=60, ge=2)
    """Seconds an idle container is kept (and billed) before it stops."""
    python_version: str = "3.11"
    """Python of the images."""
    gpu_packages: list[str] = Field(default_factory=lambda: ["vllm>=0.8"])
    """Extra pip packages of the GPU image (torch and transformers come with leanrl)."""
    local_volume: Path = Path("~/.cache/leanrl/modal-volume")
    """``backend = "local"``: the folder that stands in for the Volume."""
    local_python: str | None = None
    """``backend = "local"``: the Python that runs the function processes (default: this one)."""


class EstimateConfig(_Config):
    """Assumptions of the ``--dry-run`` cost estimate (per attempt and per container)."""

    gpu_s_per_attempt: float = Field(default=147 / 3840, gt=0)
    """GPU-seconds of generation per attempt. Default from the reference ES loop: 147 s of
    GPU generation for 30 members x 128 theorems (3,840 attempts)."""
    sandbox_core_s_per_attempt: float = Field(default=4.0, gt=0)
    """Sandbox CPU core-seconds to check one attempt (Lean with Mathlib warm)."""
    container_start_s: float = Field(default=90.0, ge=0)
    """Seconds a new GPU container takes before its first member (image, model load)."""
    sandbox_start_s: float = Field(default=30.0, ge=0)
    """Seconds a new Lean sandbox is billed before it can take a batch: the Sandbox or
    container starting, the service starting, and its Lean processes importing Mathlib (the
    warm-up headers). An assumption, not a measurement (no Modal here): the "tens of seconds"
    of a real ``import Mathlib`` that ``benchmarks/pool_latency.py --startup-s`` stands in for.
    Every batch pays it when sandboxes serve one batch each; reused sandboxes pay it once."""
    sandbox_reuse: Literal["auto", "reused", "one_use"] = "auto"
    """How the estimate bills sandboxes. ``auto``: from the runtime's pool settings: one
    batch per sandbox with ``max_uses = 1`` and under ``reuse = "auto"`` (whether a sandbox's
    Lean processes are isolated, which reuse then needs, is only known once it reports so;
    the plan prints the reused figure beside it), reused with ``reuse = "always"``.
    ``reused`` / ``one_use``: assume that (``reused`` once a run's metrics show
    ``pool_retired_unisolated`` 0)."""


class LauncherConfig(_Config):
    """Where the run happens, and the prices its cost is reported in."""

    name: Literal["local", "modal"] = "local"
    """``local``: this machine (today's behaviour). ``modal``: Modal GPU Functions, a Volume
    and Lean Sandboxes (``modal`` settings)."""
    gpu: str = "auto"
    """GPU type that local GPU-seconds are priced as: ``auto`` reads the CUDA device name
    (no GPU: none), ``none`` never bills GPU time, or a price-table name (``H100``)."""
    prices: PriceTable = Field(default_factory=PriceTable)
    """USD prices per second (Modal list prices by default)."""
    modal: ModalLaunchConfig = Field(default_factory=ModalLaunchConfig)
    """The Modal app, used when ``name = "modal"``."""
    estimate: EstimateConfig = Field(default_factory=EstimateConfig)
    """What ``--dry-run`` assumes to estimate the cost of an iteration."""
