"""Running the service under uvicorn: bind the socket first, then report the port, then serve."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from pathlib import Path
from typing import Literal, Protocol

from leanrl import registry
from leanrl._sandbox_config import ServiceLimits
from leanrl.errors import ConfigError
from leanrl.runtime import Runtime, RuntimeConfig
from leanrl.service.app import ServiceConfig, create_app
from leanrl.service.connections import set_nodelay, uvicorn_settings
from leanrl.service.kimina import KiminaConfig

__all__ = ["ServeSettings", "build_runtime", "serve"]


class ServeSettings(Protocol):
    """What :func:`serve` reads: the options of ``leanrl serve``
    (:class:`~leanrl.service.cli.ServeCommand`, which documents each one)."""

    host: str
    port: int
    uds: str | None
    uds_mode: str
    token: str | None
    port_file: Path | None
    log_level: Literal["critical", "error", "warning", "info", "debug"]
    limits: ServiceLimits
    warm_headers: list[str]
    runtime: RuntimeConfig
    kimina: KiminaConfig


def build_runtime(config: RuntimeConfig) -> Runtime:
    """The runtime ``config.name`` names, constructed (not started)."""
    cls = registry.resolve("runtimes", config.name)
    if not (isinstance(cls, type) and issubclass(cls, Runtime)):
        raise ConfigError(f"runtime {config.name!r} resolved to {cls!r}, not a leanrl.Runtime")
    return cls(config)


def _bind(cmd: ServeSettings) -> socket.socket:
    if cmd.uds:
        path = Path(cmd.uds)
        path.unlink(missing_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        mode = int(cmd.uds_mode, 8)
        # The socket file is created with the process umask: narrow it for the bind, so the
        # socket is never reachable by more users than asked for, not even for a moment.
        old_umask = os.umask(0o777 & ~mode)
        try:
            sock.bind(str(path))
        finally:
            os.umask(old_umask)
        os.chmod(path, mode)
        return sock
    family = socket.AF_INET6 if ":" in cmd.host else socket.AF_INET
    # IPPROTO_TCP explicitly: accepted sockets inherit it, and asyncio only sets TCP_NODELAY on
    # sockets that say they are TCP (a bare `socket.socket()` has protocol 0).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    set_nodelay(sock)  # inherited by accepted sockets on Linux; set again per connection
    try:
        sock.bind((cmd.host, cmd.port))
    except OSError as e:
        raise ConfigError(f"cannot listen on {cmd.host}:{cmd.port}: {e}") from None
    return sock


def serve(cmd: ServeSettings) -> None:
    """Serve until interrupted (SIGINT/SIGTERM shut down cleanly, closing the runtime)."""
    import uvicorn

    config = ServiceConfig(
        host=cmd.host,
        port=cmd.port,
        uds=cmd.uds,
        uds_mode=cmd.uds_mode,
        token=cmd.token,
        limits=cmd.limits,
        warm_headers=cmd.warm_headers,
        kimina=cmd.kimina,
    )
    config.check_auth()
    app = create_app(build_runtime(cmd.runtime), config)
    sock = _bind(cmd)
    sock.listen(cmd.limits.backlog)
    port_file = cmd.port_file if cmd.port_file is not None and not cmd.uds else None
    port = str(sock.getsockname()[1]) if port_file is not None else ""
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level=cmd.log_level,
            timeout_graceful_shutdown=5,
            **uvicorn_settings(cmd.limits, app.state.service.connections),
        )
    )

    async def main() -> None:
        # Start the runtime before serving, so a runtime that cannot start (no Lean, no
        # Docker) is a clean error here, not a traceback from uvicorn's lifespan.
        try:
            await app.state.service.start()
        except BaseException:
            await app.state.service.close()
            raise
        if port_file is not None:
            # Only now: the runtime is up and the socket listens (connections wait in its
            # backlog until uvicorn accepts them). Written earlier, a service that then failed
            # to start (no Lean) left a port file naming a dead port.
            tmp = port_file.with_suffix(".tmp")
            tmp.write_text(port)
            tmp.replace(port_file)  # atomic: a reader never sees a half-written port
        await server.serve(sockets=[sock])

    try:
        asyncio.run(main())
    finally:
        sock.close()
        if cmd.uds:
            Path(cmd.uds).unlink(missing_ok=True)
        if port_file is not None:
            # the port is closed now: a port file left behind would name a dead port
            with contextlib.suppress(OSError):
                if port_file.read_text() == port:
                    port_file.unlink()
    if not server.started:
        raise ConfigError("the service failed to start (see the log above)")
