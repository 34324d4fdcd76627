"""The Modal implementation of :class:`SandboxBackend`: one ``modal.Sandbox`` per sandbox.

Each Sandbox runs ``leanrl serve`` on ``service_port``, reachable only through Modal's encrypted
tunnel (TLS) and guarded by a random bearer token passed as a Modal secret. Outbound network is
closed by default (an empty ``outbound_cidr_allowlist``). Every call here contacts Modal; none of it runs in the default tests.

Every Sandbox is tagged with its owner (host, pid and start time of this process). A process
killed outright cannot terminate its Sandboxes, and Modal bills them until ``sandbox_timeout_s``;
the next :meth:`ModalBackend.start` on the same host terminates those whose owner is gone.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from leanrl._sandbox_config import ModalConfig
from leanrl.service.sandbox import (
    Sandbox,
    SandboxBackend,
    SandboxStartError,
    process_gone,
    process_start_time,
)

__all__ = ["ModalBackend", "ModalSandbox", "sandbox_command"]

_TUNNEL_TIMEOUT_S = 120

log = logging.getLogger("leanrl.modal")


def owner_tags() -> dict[str, str]:
    """Modal tags naming this process (tags allow only ``[A-Za-z0-9._-]``, 63 characters)."""
    pid = os.getpid()
    return {
        "leanrl-host": _tag_host(),
        "leanrl-pid": str(pid),
        "leanrl-started": process_start_time(pid),
        "leanrl-owner": uuid.uuid4().hex[:12],
    }


def _tag_host() -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())[:63] or "host"


def stale_owner(tags: dict[str, str]) -> bool:
    """True for the tags of a Sandbox started from this host by a process that is gone."""
    if tags.get("leanrl-host") != _tag_host() or not tags.get("leanrl-pid", "").isdigit():
        return False
    return process_gone(int(tags["leanrl-pid"]), tags.get("leanrl-started"))


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
        self.tags = owner_tags()
        """Tags put on every Sandbox (who started it)."""
        self.removed_stale: list[str] = []
        """Ids of Sandboxes of dead processes terminated by :meth:`start`."""
        self.swept: list[str] = []
        """Ids of this backend's Sandboxes found still running by :meth:`close`."""

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
        await self.remove_stale()

    async def remove_stale(self) -> list[str]:
        """Terminate this app's Sandboxes whose owning process (on this host) is gone. Best
        effort: a failure is logged, never fatal."""
        import modal

        stale: list[str] = []
        try:
            async for sb in modal.Sandbox.list.aio(
                app_id=self._app.app_id, tags={"leanrl-host": _tag_host()}
            ):
                if stale_owner(await sb.get_tags.aio()):
                    await sb.terminate.aio()
                    stale.append(sb.object_id)
        except Exception as e:  # noqa: BLE001 - cleanup must not stop a run
            log.warning("could not look for Sandboxes left by dead processes: %s", e)
        if stale:
            log.warning("terminated %d Sandboxes left by dead processes", len(stale))
        self.removed_stale += stale
        return stale

    async def close(self) -> None:
        """Terminate any Sandbox of this backend still running (one whose creation was cancelled
        after Modal had started it never reached the pool). Best effort."""
        if self._app is None:
            return
        import modal

        try:
            async for sb in modal.Sandbox.list.aio(
                app_id=self._app.app_id, tags={"leanrl-owner": self.tags["leanrl-owner"]}
            ):
                await sb.terminate.aio()
                self.swept.append(sb.object_id)
        except Exception as e:  # noqa: BLE001 - cleanup must not hide the run's own outcome
            log.warning("could not look for this run's leftover Sandboxes: %s", e)

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
                tags=dict(self.tags),
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
