"""The ``docker`` runtime: Lean in Docker containers running the verification service.

Containers come from a warm pool (``docker.containers`` ready) and are reused across batches
until they die, pass ``pool.max_age_s`` or serve ``pool.max_uses`` batches -- but only while
their service reports that its Lean processes run isolated from each other (bubblewrap works in
the container; ``pool.reuse = "auto"``); otherwise each serves one batch. They have no network
(``--network none``, the service on a unix socket; or, with ``transport = "tcp"``, a port
published on 127.0.0.1 only) and memory, CPU and process limits. The image is built from
``runtimes/docker/Dockerfile``; see docs/sandboxes.md.
"""

from __future__ import annotations

from leanrl._sandbox_config import image_tag
from leanrl.runtime import RuntimeConfig
from leanrl.service.sandbox import SandboxBackend
from leanrl.service.sandbox_runtime import (
    SandboxRuntime,
    SandboxSettings,
    batch_timeouts,
    inner_runtime_args,
)

__all__ = ["DockerRuntime"]


class DockerRuntime(SandboxRuntime):
    """Lean in Docker containers (settings under ``RuntimeConfig.docker``)."""

    name = "docker"
    description = "Lean in Docker containers: no network, resource limits, warm pool"

    def __init__(self, config: RuntimeConfig | None = None) -> None:
        super().__init__(config or RuntimeConfig(name="docker"))

    def settings(self) -> SandboxSettings:
        d = self.config.docker
        pool = d.pool.model_copy(
            update={
                "target_ready": d.containers,
                "max_sandboxes": max(d.pool.max_sandboxes, d.containers),
            }
        )
        service, client = batch_timeouts(self.config, d.batch_size, d.cpus, d.service, d.client)
        return SandboxSettings(
            pool=pool,
            batch_size=d.batch_size,
            client=client,
            service=service,
            metrics_path=d.metrics_path,
            warm_headers=tuple(d.warm_headers),
            learn_warm_headers=d.learn_warm_headers,
            sessions_per_sandbox=d.sessions_per_sandbox or self.config.workers or int(d.cpus),
        )

    def preflight(self) -> None:
        """The Docker engine answers and the image exists, as :meth:`start` first checks, but
        starting no container: trainers and ``leanrl eval`` ask before they load a model."""
        from leanrl.runtimes.docker.backend import engine_and_image_problem
        from leanrl.service.sandbox import SandboxStartError

        d = self.config.docker
        image = d.image if d.image is not None else image_tag(self.taskset_pins[0])
        problem = engine_and_image_problem(d.docker_bin, image)
        if problem is not None:
            raise SandboxStartError(problem)

    def make_backend(self) -> SandboxBackend:
        from leanrl.runtimes.docker.backend import DockerBackend

        d = self.config.docker
        if d.image is None:  # the image built for the taskset's Lean
            d = d.model_copy(update={"image": image_tag(self.taskset_pins[0])})
        service = self.settings().service
        args = inner_runtime_args(
            self.config, d.inner_runtime, d.inner_options, service, cpus=d.cpus
        )
        return DockerBackend(d, args)
