"""Test helpers: run the real service under uvicorn on a loopback port inside the test's loop."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import uvicorn

from leanrl.runtime import Runtime
from leanrl.service.app import ServiceConfig, create_app
from leanrl.verdict import Attempt


@contextlib.asynccontextmanager
async def running_service(
    runtime: Runtime, config: ServiceConfig | None = None
) -> AsyncIterator[str]:
    """Serve ``runtime`` on 127.0.0.1:<free port>; yields the base URL."""
    app = create_app(runtime, config or ServiceConfig())
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="critical", lifespan="on"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    for _ in range(500):
        if server.started or task.done():
            break
        await asyncio.sleep(0.01)
    if not server.started:
        task.cancel()
        raise RuntimeError("test service did not start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


def attempt(proof: str, id: str | None = None) -> Attempt:
    """An attempt whose proof is ``proof`` (the echo runtime judges the text)."""
    return Attempt(
        name="t", header="", formal_statement="theorem t : True := by", proof=proof, id=id
    )
