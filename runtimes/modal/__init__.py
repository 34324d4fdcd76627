"""The ``modal`` runtime: Lean in Modal Sandboxes from a warm pool, reused where Lean runs isolated.

Each Sandbox runs ``leanrl serve`` (wrapping the ``local`` Lean runtime) from an image defined in
code (:mod:`.image`); batches go over HTTP through an encrypted tunnel. Sandboxes come from a
:class:`~leanrl.service.pool.WarmPool` kept at ``warm_sandboxes`` ready. A Sandbox serves many
batches only when its service reports that its Lean processes run isolated from each other
(bubblewrap works inside it; ``pool.reuse = "auto"``), and one batch otherwise; ``pool.max_uses``
caps the batches either way. Cost (sandbox-seconds, CPU-seconds) is accounted per batch and per
run. ``backend = "local"`` runs the same machinery with local processes
(:mod:`.local_backend`) instead of Modal.

Modal itself is imported only when a Sandbox is about to be created.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from leanrl._dist import require
from leanrl._sandbox_config import image_pins
from leanrl.runtime import RuntimeConfig
from leanrl.service.sandbox import SandboxBackend
from leanrl.service.sandbox_runtime import (
    SandboxRuntime,
    SandboxSettings,
    batch_timeouts,
    inner_runtime_args,
)

__all__ = ["ModalRuntime"]

log = logging.getLogger("leanrl.modal")


def modal_credentials_configured() -> bool:
    """Whether Modal's client would find a token: both ``MODAL_TOKEN_ID`` and
    ``MODAL_TOKEN_SECRET``, or a config file (``MODAL_CONFIG_PATH``, default ``~/.modal.toml``)
    naming a ``token_id``. Reads files only; whether the token is valid only Modal can say."""
    if os.environ.get("MODAL_TOKEN_ID") and os.environ.get("MODAL_TOKEN_SECRET"):
        return True
    path = Path(os.environ.get("MODAL_CONFIG_PATH") or Path.home() / ".modal.toml").expanduser()
    try:
        return "token_id" in path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False


_BATCH_MARGIN_S = 60.0
"""Slack between the end of the longest batch and Modal's hard Sandbox timeout."""


class ModalRuntime(SandboxRuntime):
    """Lean in Modal Sandboxes (settings under ``RuntimeConfig.modal``)."""

    name = "modal"
    description = (
        "Lean in Modal Sandboxes: warm pool, reused only where Lean runs isolated, cost accounting"
    )

    def __init__(self, config: RuntimeConfig | None = None) -> None:
        super().__init__(config or RuntimeConfig(name="modal"))

    def preflight(self) -> None:
        """Modal credentials are configured here (``MODAL_TOKEN_ID``/``MODAL_TOKEN_SECRET``, or
        the file ``modal token new`` writes), checked without contacting Modal, so a machine
        without them stops before a model loads. The ``local`` backend needs none."""
        if self.config.modal.backend != "modal" or modal_credentials_configured():
            return
        from leanrl.service.sandbox import SandboxStartError

        raise SandboxStartError(
            "no Modal credentials on this machine: log in with `modal token new` (it writes "
            "~/.modal.toml) or set MODAL_TOKEN_ID and MODAL_TOKEN_SECRET; or use "
            "--env.runtime.modal.backend local to run the same thing here"
        )

    async def start(self) -> None:
        m = self.config.modal
        need = self.settings().service.request_timeout_s + _BATCH_MARGIN_S
        if m.backend == "modal" and m.sandbox_timeout_s <= need:
            # The bound assumes every attempt of a batch runs into its time limit; typical
            # batches are far faster, and a Sandbox killed mid-batch costs a retry, so warn.
            log.warning(
                "modal.sandbox_timeout_s %s s is shorter than the longest a batch may take "
                "(%g s: every attempt timing out, plus a margin); Modal may kill a Sandbox "
                "mid-batch. Raise it above %g s, or lower batch_size or timeout_s",
                m.sandbox_timeout_s,
                need,
                need,
            )
        await super().start()

    def metrics(self) -> dict[str, float]:
        """The pool's figures plus ``pool_memory_gib_s``: memory reserved over the sandboxes'
        billed lifetimes (Modal bills Sandbox memory per GiB-second)."""
        out = super().metrics()
        if "pool_sandbox_s" in out:
            out["pool_memory_gib_s"] = out["pool_sandbox_s"] * self.config.modal.memory_mb / 1024
        return out

    def settings(self) -> SandboxSettings:
        m = self.config.modal
        service, client = batch_timeouts(self.config, m.batch_size, m.cpu, m.service, m.client)
        # Modal kills a Sandbox at sandbox_timeout_s: retire idle ones early enough that a
        # batch handed to one can still finish (a warm Sandbox may idle for a long time between
        # a trainer's verification phases).
        max_age = min(m.pool.max_age_s, 0.5 * m.sandbox_timeout_s)
        room = m.sandbox_timeout_s - service.request_timeout_s - _BATCH_MARGIN_S
        if m.backend == "modal" and room > 0:
            max_age = min(max_age, room)
        pool = m.pool.model_copy(
            update={
                "target_ready": m.warm_sandboxes,
                "max_sandboxes": max(
                    m.pool.max_sandboxes,
                    m.warm_sandboxes if isinstance(m.warm_sandboxes, int) else 1,
                    1,
                ),
                "max_age_s": max_age,
            }
        )
        return SandboxSettings(
            pool=pool,
            batch_size=m.batch_size,
            client=client,
            service=service,
            metrics_path=m.metrics_path,
            warm_headers=tuple(m.warm_headers),
            learn_warm_headers=m.learn_warm_headers,
            sessions_per_sandbox=m.sessions_per_sandbox or self.config.workers or int(m.cpu),
        )

    def make_backend(self) -> SandboxBackend:
        m = self.config.modal
        service = self.settings().service
        if m.backend == "local":
            from leanrl.runtimes.modal.local_backend import LocalProcessBackend

            # Its sandboxes are `leanrl serve` processes here.
            require("fastapi", "serve", "the modal runtime's local backend")
            require("uvicorn", "serve", "the modal runtime's local backend")

            args = inner_runtime_args(
                self.config, m.local_runtime, m.inner_options, service, cpus=m.cpu
            )
            return LocalProcessBackend(
                args,
                cpu=m.cpu,
                pythonpath=m.local_pythonpath,
                start_timeout_s=m.pool.start_timeout_s,
            )
        from leanrl.runtimes.modal.backend import ModalBackend

        require("modal", "modal", "the modal runtime")
        if m.image_source != "registry":  # the image is built: for the taskset's Lean by default
            want, rev = self.taskset_pins
            toolchain, mathlib, repl = image_pins(
                m.lean_toolchain or want, m.mathlib_rev or rev, m.repl_rev
            )
            m = m.model_copy(
                update={"lean_toolchain": toolchain, "mathlib_rev": mathlib, "repl_rev": repl}
            )
        args = inner_runtime_args(self.config, "local", m.inner_options, service, cpus=m.cpu)
        return ModalBackend(m, args)
