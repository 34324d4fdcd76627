"""Tactic sessions cannot starve checks, and a client's sessions end when it goes away (issue 36,
item 3).

Sessions pin Lean processes from the same cap as ``/check``'s elaboration. Before the fix the
service let ``max_sessions`` (64) sessions open, so 3 abandoned sessions on 2 workers + 1 spare
took every process and ``/check`` waited for the whole idle timeout (600 s). Now sessions never
take the last process (``PoolConfig.check_reserve``), the service answers 429 before they would
(its limit is lowered to the runtime's ``max_tactic_sessions``), and a session whose client
closed its connection is closed after ``session_orphan_s``.

Real child processes (the stand-in REPL, tests/fake_repl.py) behind the real service under
uvicorn with leanrl's own HTTP layer (the one ``leanrl serve`` runs), and raw TCP clients, so
which side closes a connection is under the test's control.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import uvicorn

from leanrl import RuntimeConfig
from leanrl._sandbox_config import ServiceLimits
from leanrl.lean.pool import PoolConfig, ReplPool
from leanrl.runtimes.local import LocalRuntime
from leanrl.service.app import ServiceConfig, create_app
from leanrl.service.connections import uvicorn_settings
from leanrl.verdict import Attempt, Reason

FAKE = Path(__file__).with_name("fake_repl.py")
HEADER = "import Mathlib\n"
GUARD_S = 60.0  # turns a starved request into a failure; the fixed service answers at once


def runtime(workers: int = 2, spares: int = 1) -> LocalRuntime:
    return LocalRuntime(
        RuntimeConfig(
            workers=workers,
            timeout_s=5.0,
            isolate=False,
            options={"repl_command": [sys.executable, str(FAKE)], "spares": spares},
        )
    )


def att(i: int) -> dict[str, Any]:
    a = Attempt(
        name="t", header=HEADER, formal_statement="theorem t : 1 = 1 := by", proof="rfl", id=str(i)
    )
    return json.loads(a.model_dump_json())


@contextlib.asynccontextmanager
async def serving(rt: LocalRuntime, limits: ServiceLimits) -> AsyncIterator[tuple[int, Any]]:
    """The service on 127.0.0.1 with ``leanrl serve``'s HTTP settings; (port, service)."""
    app = create_app(rt, ServiceConfig(limits=limits))
    service = app.state.service
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    settings = uvicorn_settings(limits, service.connections)
    server = uvicorn.Server(uvicorn.Config(app, log_level="critical", lifespan="on", **settings))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    for _ in range(500):
        if server.started or task.done():
            break
        await asyncio.sleep(0.01)
    assert server.started, "test service did not start"
    try:
        yield sock.getsockname()[1], service
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 20)
        sock.close()


class Conn:
    """One raw HTTP/1.1 keep-alive connection: requests go on it until it is closed."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Conn:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def send(self, method: str, path: str, body: object = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else b""
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n"
        )
        self.writer.write(head.encode() + data)
        await self.writer.drain()
        raw = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), GUARD_S)
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length = next(int(x.split(":")[1]) for x in lines if x.lower().startswith("content-length"))
        payload = await self.reader.readexactly(length)
        return status, json.loads(payload) if payload else None

    async def close(self) -> None:
        """The client closes its end (what a killed client's kernel does)."""
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()


async def sessions_open(port: int) -> int:
    c = await Conn.open(port)
    try:
        _, m = await c.send("GET", "/metrics")
        return int(m["sessions_open"])
    finally:
        await c.close()


async def until_sessions(port: int, n: int) -> int:
    """Poll until ``n`` sessions are open (bounded); the last count seen."""
    seen = -1
    for _ in range(200):
        seen = await sessions_open(port)
        if seen == n:
            break
        await asyncio.sleep(0.05)
    return seen


async def test_held_sessions_never_starve_check_and_the_next_open_gets_429() -> None:
    # The shape: 2 workers + 1 spare, sessions opened and left open.
    limits = ServiceLimits(request_timeout_s=GUARD_S)
    async with serving(runtime(), limits) as (port, _):
        c = await Conn.open(port)
        statuses, bodies = [], []
        for _ in range(3):
            status, body = await c.send("POST", "/sessions", {"header": HEADER})
            statuses.append(status)
            bodies.append(body)
        # Before the fix this waited until a session was closed (the idle timeout).
        status, checked = await c.send("POST", "/check", {"attempts": [att(i) for i in range(3)]})
        await c.close()
    assert statuses == [200, 200, 429], (statuses, bodies)
    assert "the limit is 2" in bodies[2]["error"] and "beside the checks" in bodies[2]["error"]
    assert status == 200, checked
    assert [v["reason"] for v in checked["verdicts"]] == ["ok"] * 3, checked


async def test_sessions_held_in_the_pool_leave_a_process_for_checks() -> None:
    for workers, spares in [(2, 1), (1, 0), (3, 0)]:
        p = ReplPool(
            PoolConfig(
                command=[sys.executable, str(FAKE)], workers=workers, spares=spares, timeout_s=5
            )
        )
        held = []
        try:
            for _ in range(p.config.tactic_cap):
                held.append(await p.acquire(HEADER))
            a = Attempt(
                name="t", header=HEADER, formal_statement="theorem t : 1 = 1 := by", proof="rfl"
            )
            vs = await asyncio.wait_for(p.check([a, a, a]), GUARD_S)
            for w in held:
                await p.release(HEADER, w)
        finally:
            await p.close()
        assert [v.reason for v in vs] == [Reason.OK] * 3, (workers, spares, vs)
        assert p.config.tactic_cap == max(1, workers + spares - 1)


async def test_a_clients_sessions_close_when_it_goes_away() -> None:
    limits = ServiceLimits(session_orphan_s=0.2, session_idle_s=600.0)
    async with serving(runtime(workers=3), limits) as (port, _):
        gone = await Conn.open(port)
        sids = []
        for _ in range(2):
            status, body = await gone.send("POST", "/sessions", {"header": HEADER})
            assert status == 200, body
            sids.append(body["session_id"])
        other = await Conn.open(port)  # another client's session stays
        status, body = await other.send("POST", "/sessions", {"header": HEADER})
        assert status == 200, body
        assert await sessions_open(port) == 3
        await gone.close()  # the client dies: its kernel closes the connection
        left = await until_sessions(port, 1)
        late = await other.send(
            "POST", f"/sessions/{sids[0]}/start", {"formal_statement": "theorem t : 1 = 1 := by"}
        )
        kept = await other.send(
            "POST",
            f"/sessions/{body['session_id']}/start",
            {"formal_statement": "theorem t : 1 = 1 := by"},
        )
        await other.close()
    assert left == 1  # was 3 until the idle timeout (600 s here)
    assert late[0] == 404 and "did not come back" in late[1]["error"], late
    assert kept[0] == 200, kept


async def test_sessions_outlive_connections_the_service_closes_and_clients_that_come_back() -> None:
    # A client thinking between steps loses its idle keep-alive connection to the service's
    # own timer: that is not the client going away. And a client whose connection closed but
    # that uses its session again within session_orphan_s keeps it.
    limits = ServiceLimits(session_orphan_s=0.3, keep_alive_s=1.0)
    async with serving(runtime(), limits) as (port, service):
        c = await Conn.open(port)
        status, body = await c.send("POST", "/sessions", {"header": HEADER})
        assert status == 200, body
        sid = body["session_id"]
        # Wait for the service to close this idle connection (keep_alive_s): end of stream.
        assert await asyncio.wait_for(c.reader.read(), GUARD_S) == b""
        await c.close()
        back = await Conn.open(port)
        start = await back.send(
            "POST", f"/sessions/{sid}/start", {"formal_statement": "theorem t : 1 = 1 := by"}
        )
        await back.close()  # the client closes this one, and comes back at once on another
        again = await Conn.open(port)
        state = start[1]
        step = await again.send(
            "POST", f"/sessions/{sid}/tactic", {"proof_state": state["proof_state"], "tactic": "x"}
        )
        await asyncio.sleep(0.6)  # past session_orphan_s: the session was used meanwhile
        still = len(service._sessions)
        await again.close()
    assert start[0] == 200 and state["proof_state"] is not None, start
    assert step[0] == 200, step
    assert still == 1
