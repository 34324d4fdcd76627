"""The Modal implementation of :class:`SandboxBackend`: one ``modal.Sandbox`` per sandbox.

Each Sandbox runs ``leanrl serve`` on ``service_port``, reachable only through Modal's encrypted
tunnel (TLS) and guarded by a random bearer token passed as a Modal secret. Outbound network is
closed by default (an empty ``outbound_cidr_allowlist``). Every call here contacts Modal; none of it runs in the default tests.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from leanrl._sandbox_config import ModalConfig
from leanrl.service.sandbox import Sandbox, SandboxBackend, SandboxStartError

__all__ = ["ModalBackend", "ModalSandbox", "sandbox_command"]

_TUNNEL_TIMEOUT_S = 120


def sandbox_command(config: ModalConfig, serve_args: Sequence[str]) -> list[str]:
    """The command a Sandbox runs: the service on all interfaces of its ``service_port``."""
    return [
        "python", "-m", "leanrl.service", "--host", "0.0.0.0",
        "--port", str(config.service_port), *serve_args,
    ]  # fmt: skip


@dataclass(eq=False)
class ModalSandbox(Sandbox):
    """A running ``modal.Sandbox``."""

    handle: Any = None
    """The ``modal.Sandbox`` object."""

    async def alive(self) -> bool:
        if self.terminated_at is not None:
            return False
        try:
            return await self.handle.poll.aio() is None
        except Exception:  # noqa: BLE001 - cannot ask Modal: count it as dead
            return False

    async def terminate(self) -> None:
        if self.terminated_at is not None:
            return
        try:
            await self.handle.terminate.aio()
        finally:
            self.terminated_at = time.monotonic()


class ModalBackend(SandboxBackend):
    """Creates Modal Sandboxes from the image of :func:`leanrl.runtimes.modal.image.build_image`."""

    name = "modal"

    def __init__(self, config: ModalConfig, serve_args: Sequence[str]) -> None:
        super().__init__(serve_args)
        self.config = config
        self._app: Any = None
        self._image: Any = None

    async def start(self) -> None:
        try:
            import modal
        except ImportError as e:  # pragma: no cover - modal is a dependency
            raise SandboxStartError(f"the modal package is missing: {e}") from e
        from leanrl.runtimes.modal.image import build_image

        self._image = build_image(self.config)
        try:
            self._app = await modal.App.lookup.aio(self.config.app_name, create_if_missing=True)
        except Exception as e:
            raise SandboxStartError(
                f"cannot reach Modal ({type(e).__name__}: {e}). Log in with `modal token new` "
                "or set MODAL_TOKEN_ID and MODAL_TOKEN_SECRET; or use "
                "--env.runtime.modal.backend local to run the same thing on this machine"
            ) from e

    async def create(self) -> Sandbox:
        import modal

        c = self.config
        t0 = time.monotonic()
        token = secrets.token_urlsafe(24)
        try:
            sb = await modal.Sandbox.create.aio(
                *sandbox_command(c, self.service_args()),
                app=self._app,
                image=self._image,
                secrets=[modal.Secret.from_dict({"LEANRL_SERVICE_TOKEN": token})],
                cpu=c.cpu,
                memory=c.memory_mb,
                timeout=c.sandbox_timeout_s,
                encrypted_ports=[c.service_port],
                # Closed to the outside: block_network would also forbid the tunnel.
                outbound_cidr_allowlist=list(c.outbound_cidr_allowlist),
                region=c.region,
            )
        except Exception as e:
            raise SandboxStartError(f"Modal could not create a Sandbox: {e}") from e
        try:
            tunnels = await sb.tunnels.aio(timeout=_TUNNEL_TIMEOUT_S)
            url = tunnels[c.service_port].url
        except BaseException as e:
            # Never leave a paid Sandbox behind because its tunnel did not come up.
            try:
                await sb.terminate.aio()
            finally:
                if isinstance(e, Exception):
                    raise SandboxStartError(f"Sandbox tunnel did not open: {e}") from e
            raise
        return ModalSandbox(
            id=sb.object_id, url=url, token=token, cpu=c.cpu, created_at=t0, handle=sb
        )
