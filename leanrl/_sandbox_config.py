"""Settings of the sandboxed runtimes (``docker`` and ``modal``), nested in ``RuntimeConfig``.

Both runtimes run ``leanrl serve`` inside a sandbox and keep a warm pool of sandboxes; the pool and
client settings are shared (:class:`PoolConfig`, :class:`ClientConfig`), the rest is per runtime.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, FieldSerializationInfo, field_serializer

from leanrl.lean.versions import REPL_REVS

__all__ = [
    "DEFAULT_TOOLCHAIN",
    "KEEP_SECRETS",
    "REDACTED",
    "ClientConfig",
    "DockerConfig",
    "ModalConfig",
    "PoolConfig",
    "ServiceLimits",
    "image_pins",
    "image_tag",
]

REDACTED = "<redacted>"
"""What a secret value is written as in files and reports."""

KEEP_SECRETS: dict[str, str] = {"secrets": "keep"}
"""Serialization context of a JSON dump that stays in memory to rebuild a config (a launched
job's payload, a compare run's config): ``model_dump(mode="json", context=KEEP_SECRETS)`` keeps
the secret values that every other JSON dump (files, logs) writes as :data:`REDACTED`."""


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class ClientConfig(_Config):
    """How the runtimes talk to a verification service over HTTP."""

    retries: int = Field(default=3, ge=0)
    """Extra tries after a transient failure (connection refused/reset, 502, 503, a read that
    timed out). Each retry reuses the request's idempotency key, so the service never checks the
    same batch twice."""
    backoff_s: float = Field(default=0.2, ge=0)
    """First pause between tries; it doubles after each try (each pause is jittered down by up
    to half, so clients failing together do not retry in lockstep)."""
    max_backoff_s: float = Field(default=10.0, ge=0)
    """Longest pause between tries, also for a service's ``Retry-After``."""
    connect_timeout_s: float = Field(default=5.0, gt=0)
    """How long to wait for a TCP (or unix socket) connection."""
    request_timeout_s: float = Field(default=900.0, gt=0)
    """How long one request may take end to end (a whole batch is one request)."""


class ServiceLimits(_Config):
    """Limits the verification service (``leanrl serve``) enforces on every request."""

    max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    """Largest request body accepted; bigger ones get 413."""
    max_batch: int = Field(default=1024, ge=1)
    """Most attempts in one ``POST /check``; longer batches get 413 (split them)."""
    request_timeout_s: float = Field(default=900.0, gt=0)
    """Wall-clock limit of any request; past it the service answers 504 and cancels the work."""
    header_timeout_s: float = Field(default=10.0, gt=0)
    """A connection must send a complete request head within this many seconds of opening (or
    of its previous answer); otherwise it is closed. Stops clients that connect and say nothing
    (or trickle bytes) from holding connections."""
    body_timeout_s: float = Field(default=60.0, gt=0)
    """A request body must arrive whole within this many seconds of its head (408 otherwise),
    so a client cannot hold a connection by sending its body slowly."""
    max_connections: int = Field(default=1000, ge=2)
    """Open connections at most. A new connection at the cap closes the one that has waited
    longest without a request in progress, so idle or half-open connections cannot lock real
    clients out; only when every connection has a request running is the new one answered 503
    (``Retry`` later)."""
    keep_alive_s: float = Field(default=5.0, gt=0)
    """How long an idle keep-alive connection stays open after an answer (uvicorn's
    ``timeout_keep_alive``, whole seconds)."""
    max_header_bytes: int = Field(default=16 * 1024, ge=1024)
    """Largest request head (request line and headers); a bigger one gets 431 (Request Header
    Fields Too Large) and the connection is closed."""
    backlog: int = Field(default=2048, ge=16)
    """Connections the kernel queues before the service accepts them (``listen`` backlog)."""
    max_sessions: int = Field(default=64, ge=1)
    """Tactic sessions open at once; more get 429 until one is closed. Lowered to what the
    runtime can hold beside the checks (``local``: all of its ``workers + spares`` processes but
    one, which only checks use)."""
    session_idle_s: float = Field(default=600.0, gt=0)
    """A tactic session unused this long is closed by the service."""
    session_orphan_s: float = Field(default=60.0, ge=0)
    """A tactic session whose client closed the connection that carried its last request (a
    client that died or went away) is closed once it has gone this long without a request,
    instead of after ``session_idle_s``. Connections the service closes itself (keep-alive,
    header deadline) do not count. ``leanrl serve`` only (its HTTP layer sees the closes)."""
    idempotency_ttl_s: float = Field(default=600.0, gt=0)
    """How long results are kept by idempotency key, so a retried request gets the first
    answer instead of a second check."""
    idempotency_max_entries: int = Field(default=4096, ge=1)
    """Most results kept by idempotency key (the oldest are dropped first)."""


class PoolConfig(_Config):
    """A warm pool of sandboxes (containers or Modal Sandboxes) running the service."""

    target_ready: Annotated[int, Field(ge=0)] | Literal["auto"] = 1
    """Sandboxes kept started and idle, ready for the next batch. ``"auto"``: follow the
    measured load by Little's law, about (batches per second) x (sandbox start time) + 1, within
    ``[auto_min_ready, max_sandboxes]``; the pool reports its current figure as
    ``pool_target_ready``."""
    auto_min_ready: int = Field(default=1, ge=0)
    """Least sandboxes kept ready with ``target_ready = "auto"`` (also the figure used before
    any batch or start has been measured)."""
    auto_smoothing: float = Field(default=0.3, gt=0, le=1)
    """Weight of the newest measurement in the moving averages of the batch interval and the
    start time behind ``target_ready = "auto"`` (1: only the latest counts)."""
    max_sandboxes: int = Field(default=4, ge=1)
    """Most sandboxes alive at once (ready, starting and busy together); batches beyond this
    wait for a free one."""
    max_uses: int = Field(default=0, ge=0)
    """Batches one sandbox serves before it is replaced; 0 means no limit. 1 gives each batch a
    fresh sandbox. Reuse also needs ``reuse``'s condition."""
    reuse: Literal["auto", "always"] = "auto"
    """When a sandbox may serve more than one batch (up to ``max_uses``). ``auto``: only when
    its service reports on ``/health`` that its Lean processes are isolated from each other
    (bubblewrap in effect inside the sandbox); one that reports otherwise, or nothing, serves
    one batch and is replaced (logged once, counted as ``pool_retired_unisolated``), so no
    verdict comes from a sandbox where an earlier batch's code may have run unconfined.
    ``always``: reuse regardless, as before this check existed; only for proofs from a trusted
    source."""
    max_age_s: float = Field(default=3600.0, gt=0)
    """An idle sandbox older than this is replaced (never in the middle of a batch)."""
    start_timeout_s: float = Field(default=900.0, gt=0)
    """How long a new sandbox may take to answer ``/health`` (loading Mathlib is slow)."""
    acquire_timeout_s: float = Field(default=1800.0, gt=0)
    """How long a batch waits for a ready sandbox before its attempts get ``infra`` Verdicts."""
    health_interval_s: float = Field(default=10.0, gt=0)
    """How often idle sandboxes are checked; dead ones are replaced."""


class DockerConfig(_Config):
    """Settings of the ``docker`` runtime."""

    image: str | None = None
    """Image with Lean, Mathlib, the REPL and ``leanrl serve`` (see ``runtimes/docker``). None:
    ``leanrl-verifier:<the taskset's Lean version>`` (``leanrl-verifier:v4.24.0`` for
    ``minif2f``, also the default without a taskset), the tag docs/sandboxes.md builds."""
    containers: int = Field(default=1, ge=1)
    """Warm containers to keep ready (the pool's ``target_ready``; also raises ``max_sandboxes``
    to at least this)."""
    pool: PoolConfig = Field(default_factory=lambda: PoolConfig(max_sandboxes=4, max_uses=0))
    """Warm pool settings (``containers`` overrides ``pool.target_ready``). A container serves
    many batches only where its Lean processes run isolated (``pool.reuse = "auto"``)."""
    batch_size: int = Field(default=64, ge=1)
    """Attempts sent to one container at a time."""
    client: ClientConfig = Field(default_factory=ClientConfig)
    """Retries and timeouts of the HTTP client talking to the containers."""
    service: ServiceLimits = Field(default_factory=ServiceLimits)
    """Limits of the service inside each container (``max_batch`` must be at least
    ``batch_size``)."""
    warm_headers: list[str] = Field(default_factory=list)
    """Headers (e.g. ``"import Mathlib"``) whose imports each container loads before it counts
    as ready, so no batch waits for Lean to start."""
    learn_warm_headers: int = Field(default=2, ge=0)
    """Also warm new containers with the imports of the first this-many distinct headers seen
    in batches (0: only ``warm_headers``)."""
    sessions_per_sandbox: int = Field(default=0, ge=0)
    """Tactic sessions that share one container (each pins one Lean process in it); 0: as many
    as its Lean workers (``RuntimeConfig.workers``, else ``cpus``)."""
    metrics_path: Path | None = None
    """Append one JSON line per batch and one run summary (container-seconds, CPU-seconds) to
    this file. The same figures are in ``runtime.metrics()``."""
    transport: Literal["unix", "tcp"] = "unix"
    """``unix``: the container gets ``--network none`` and the service listens on a unix socket
    in a host folder mounted into the container (no network at all; works with
    ``dockerd --bridge=none``). ``tcp``: the container joins ``network`` and the service port is
    published on 127.0.0.1 only (the container can reach the network; use on hosts where bind
    mounts are not possible)."""
    network: str = "bridge"
    """Docker network for ``transport = "tcp"``."""
    service_port: int = Field(default=8000, ge=1, le=65535)
    """Port the service listens on inside the container (``tcp`` transport)."""
    memory_mb: int = Field(default=16384, ge=64)
    """Memory limit of each container (``--memory``), in MiB; Lean processes inside have their
    own per-process caps from ``RuntimeConfig.memory_mb``."""
    cpus: float = Field(default=4.0, gt=0)
    """CPU limit of each container (``--cpus``)."""
    pids_limit: int = Field(default=512, ge=16)
    """Most processes/threads inside a container (``--pids-limit``); stops fork bombs."""
    read_only: bool = True
    """Mount the image's file system read-only; ``/tmp`` is a private tmpfs."""
    tmpfs_mb: int = Field(default=1024, ge=16)
    """Size of the ``/tmp`` tmpfs, in MiB."""
    command: list[str] = Field(default_factory=lambda: ["python", "-m", "leanrl.service"])
    """Command that starts the service in the container (it replaces the image's entrypoint);
    the runtime appends ``--host``, ``--port``/``--uds`` and the inner runtime settings."""
    inner_runtime: str = "local"
    """Runtime the service wraps inside the container (``local`` for the Lean pool)."""
    inner_options: dict[str, str | int | float | bool] = Field(default_factory=dict)
    """``--runtime.options`` given to the inner runtime (third-party or test runtimes)."""
    mounts: list[str] = Field(default_factory=list)
    """Extra ``--volume`` specs (``/host/path:/container/path:ro``), e.g. a prebuilt Lean
    project. Mounts are read-only unless the spec says otherwise."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables inside the container. The values may be secrets (API keys):
    they are never written to files (``run.json``, ``summary.json`` and ``config.json`` show
    ``<redacted>``) nor put on the ``docker run`` command line (the docker client gets them
    through its environment)."""

    @field_serializer("env", when_used="json")
    def _redact_env(self, env: dict[str, str], info: FieldSerializationInfo) -> dict[str, str]:
        # JSON is what goes to files and reports; Python dumps keep the values. A JSON dump
        # that rebuilds a config for another process (a launched job, a compare run) passes
        # context=KEEP_SECRETS, or the job would get "<redacted>" as its credential.
        if isinstance(info.context, dict) and info.context.get("secrets") == "keep":
            return dict(env)
        return {k: REDACTED for k in env}

    docker_bin: str = "docker"
    """The docker client to run (a name on PATH or a path)."""
    socket_dir: Path | None = None
    """Host folder for the unix sockets (``unix`` transport). Default: a fresh temporary
    folder."""
    label: str = "leanrl.runtime"
    """Label put on every container this runtime starts; containers with this label whose
    owning process is gone are removed at start."""


class ModalConfig(_Config):
    """Settings of the ``modal`` runtime."""

    batch_size: int = Field(default=64, ge=1)
    """Attempts sent to one Sandbox at a time."""
    client: ClientConfig = Field(default_factory=ClientConfig)
    """Retries and timeouts of the HTTP client talking to the Sandboxes."""
    service: ServiceLimits = Field(default_factory=ServiceLimits)
    """Limits of the service inside each Sandbox (``max_batch`` must be at least
    ``batch_size``)."""
    warm_headers: list[str] = Field(default_factory=list)
    """Headers (e.g. ``"import Mathlib"``) whose imports each Sandbox loads before it counts as
    ready, so no batch waits for Lean to start."""
    learn_warm_headers: int = Field(default=2, ge=0)
    """Also warm new Sandboxes with the imports of the first this-many distinct headers seen in
    batches (0: only ``warm_headers``)."""
    sessions_per_sandbox: int = Field(default=0, ge=0)
    """Tactic sessions that share one Sandbox (each pins one Lean process in it); 0: as many as
    its Lean workers (``RuntimeConfig.workers``, else ``cpu``)."""
    warm_sandboxes: Annotated[int, Field(ge=0)] | Literal["auto"] = 2
    """Sandboxes kept started and ready (the pool's ``target_ready``). ``"auto"``: as many as
    the measured batch rate needs (the pool's ``target_ready = "auto"``)."""
    pool: PoolConfig = Field(default_factory=lambda: PoolConfig(max_sandboxes=16))
    """Warm pool settings (``warm_sandboxes`` overrides ``pool.target_ready``). By default a
    Sandbox serves many batches where its Lean processes run isolated (bubblewrap works inside
    it) and one batch otherwise (``reuse = "auto"``); ``max_uses = 1`` gives every batch a
    fresh Sandbox."""
    backend: Literal["modal", "local"] = "modal"
    """``modal``: real Modal Sandboxes. ``local``: ``leanrl serve`` processes on this machine
    behind the same interface (tests, benchmarks, debugging without a Modal account)."""
    app_name: str = "leanrl-verifier"
    """Modal app the Sandboxes belong to (created if missing)."""
    image_source: Literal["code", "dockerfile", "registry"] = "code"
    """How the Sandbox image is made: ``code`` builds it with ``modal.Image`` calls (the same
    install script as the Dockerfile); ``dockerfile`` builds ``runtimes/docker/Dockerfile`` on
    Modal; ``registry`` uses a pushed image (``image_ref``)."""
    image_ref: str = ""
    """Registry tag for ``image_source = "registry"`` (e.g. ``ghcr.io/me/leanrl-verifier:v1``)."""
    lean_toolchain: str | None = None
    """Lean toolchain installed in the image. None: the taskset's (``leanprover/lean4:v4.24.0``
    for ``minif2f``)."""
    mathlib_rev: str | None = None
    """Mathlib git revision (tag, branch or commit) built in the image. None: the taskset's, or
    the Mathlib tag of its Lean version for a taskset that needs no Mathlib."""
    repl_rev: str | None = None
    """Revision of github.com/leanprover-community/repl built in the image. None: the tag of the
    Lean version (``v4.24.0``)."""
    cpu: float = Field(default=4.0, gt=0)
    """CPU cores reserved per Sandbox (also the rate for CPU-second accounting)."""
    memory_mb: int = Field(default=16384, ge=128)
    """Memory reserved per Sandbox, in MiB."""
    sandbox_timeout_s: int = Field(default=3600, ge=60)
    """Hard lifetime of a Sandbox; Modal kills it after this many seconds."""
    service_port: int = Field(default=8000, ge=1, le=65535)
    """Port of the service inside the Sandbox, exposed through an encrypted tunnel."""
    outbound_cidr_allowlist: list[str] = Field(default_factory=list)
    """Outbound destinations (CIDR ranges) the Sandbox may reach; empty (the default) blocks all
    outbound traffic. (Modal's ``block_network`` cannot be combined with the tunnel the service
    needs, so an empty allow-list is how the network is closed.)"""
    region: str | None = None
    """Modal region to run in (None: Modal picks)."""
    inner_options: dict[str, str | int | float | bool] = Field(default_factory=dict)
    """``--runtime.options`` given to the runtime inside each Sandbox."""
    local_runtime: str = "local"
    """``backend = "local"`` only: the runtime each local ``leanrl serve`` process wraps (an id
    or ``module:Class``)."""
    local_pythonpath: list[Path] = Field(default_factory=list)
    """``backend = "local"`` only: folders added to ``PYTHONPATH`` of the local service
    processes (so they can import ``local_runtime``)."""
    metrics_path: Path | None = None
    """Append one JSON line per batch (sandbox-seconds, CPU-seconds, attempts) and one per run
    summary to this file. The same figures are in ``runtime.metrics()``."""


DEFAULT_TOOLCHAIN = "leanprover/lean4:v4.24.0"
"""The Lean of the default environment (``minif2f``): what a sandbox runtime made without a
taskset builds for."""


def image_pins(
    lean_toolchain: str | None, mathlib_rev: str | None, repl_rev: str | None = None
) -> tuple[str, str, str]:
    """(toolchain, Mathlib revision, REPL revision) to build a sandbox image with, from the
    taskset's pins (the default environment's Lean when there is no taskset): the Mathlib and
    REPL tags of the Lean version fill in what is missing."""
    lean_toolchain = lean_toolchain or DEFAULT_TOOLCHAIN
    tag = "v" + lean_toolchain.rsplit(":v", 1)[-1] if ":v" in lean_toolchain else lean_toolchain
    return lean_toolchain, mathlib_rev or tag, repl_rev or REPL_REVS.get(tag, tag)


def image_tag(lean_toolchain: str | None) -> str:
    """The default Docker image name for a Lean version: ``leanrl-verifier:v4.24.0``."""
    lean_toolchain = lean_toolchain or DEFAULT_TOOLCHAIN
    return "leanrl-verifier:" + lean_toolchain.rsplit(":", 1)[-1]
