"""The service's connections, attacked for real: a real `python -m leanrl.service` process, real
sockets over loopback. Idle and half-open connections cannot lock real clients out, a head or
body that never comes is cut off, and TCP answers are not held back by Nagle's algorithm."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from leanrl._sandbox_config import ClientConfig, ServiceLimits
from leanrl.service.app import ServiceConfig, create_app
from leanrl.service.client import ServiceClient
from leanrl.service.connections import uvicorn_settings
from leanrl.verdict import Reason
from tests._echo_runtime import EchoRuntime
from tests._service_testing import attempt

TESTS = Path(__file__).resolve().parent
ECHO = "_echo_runtime:EchoRuntime"


@contextlib.contextmanager
def serve(tmp_path: Path, *flags: str, token: str | None = None) -> Iterator[int]:
    """``python -m leanrl.service`` on 127.0.0.1:<free port>; yields the port."""
    port_file = tmp_path / f"port-{time.monotonic_ns()}"
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    env.pop("LEANRL_SERVICE_TOKEN", None)
    if token:
        env["LEANRL_SERVICE_TOKEN"] = token
    cmd = [sys.executable, "-m", "leanrl.service", "--port", "0", "--port_file", str(port_file),
           "--runtime.name", ECHO, *flags]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(600):
            if port_file.exists() or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert port_file.exists(), proc.stderr.read() if proc.stderr else ""
        yield int(port_file.read_text())
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    return s


def _closed_by_peer(s: socket.socket, within_s: float) -> bool:
    """True when the server closes ``s`` within ``within_s`` (reads until EOF or the time)."""
    s.settimeout(within_s)
    try:
        while s.recv(4096):
            pass
        return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def _answer(s: socket.socket) -> bytes:
    """One whole HTTP answer from ``s`` (head and ``content-length`` bytes of body)."""
    s.settimeout(10)
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += s.recv(4096)
    head, _, body = buf.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += s.recv(4096)
    return head + b"\r\n\r\n" + body


def _metrics(port: int, token: str | None = None) -> dict[str, object]:
    async def go() -> dict[str, object]:
        async with ServiceClient(f"http://127.0.0.1:{port}", token) as c:
            return (await c.metrics()).model_dump()

    return asyncio.run(go())


def test_a_thousand_idle_connections_do_not_lock_out_a_real_client(tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2200:
        pytest.skip(f"needs ~2,200 open files for 1,000 connections (hard limit is {hard})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    idle: list[socket.socket] = []
    with serve(tmp_path, "--limits.max_connections", "1000") as port:
        try:
            for i in range(1000):
                s = _connect(port)
                if i % 2:  # half of them start a request head and never finish it
                    s.sendall(b"POST /check HTTP/1.1\r\nHost: x\r\nContent-Type: application/")
                idle.append(s)

            async def client() -> list[Reason]:
                cfg = ClientConfig(retries=0, connect_timeout_s=10, request_timeout_s=30)
                async with ServiceClient(f"http://127.0.0.1:{port}", config=cfg) as c:
                    vs = await c.check([attempt("ok"), attempt("sorry")])
                    return [v.reason for v in vs]

            # uvicorn alone answers 503 here (its limit counts the idle connections); with no
            # retries allowed the client would fail
            assert asyncio.run(client()) == [Reason.OK, Reason.SORRY]
            assert asyncio.run(client()) == [Reason.OK, Reason.SORRY]
            m = _metrics(port)
            assert int(m["connections_evicted"]) >= 1  # type: ignore[call-overload]
            assert _closed_by_peer(idle[0], 5)  # the longest-idle ones made room
        finally:
            for s in idle:
                s.close()


def test_a_head_that_never_completes_is_cut_off(tmp_path: Path) -> None:
    with serve(tmp_path, "--limits.header_timeout_s", "0.5") as port:
        silent = _connect(port)
        partial = _connect(port)
        partial.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        trickle = _connect(port)
        try:
            # one byte every 0.2 s would keep uvicorn's keep-alive timer off forever
            t0 = time.monotonic()
            closed = False
            for b in b"GET /health HTTP/1.1\r\nX-Slow: " + b"a" * 200:
                try:
                    trickle.sendall(bytes([b]))
                except (BrokenPipeError, ConnectionResetError):
                    closed = True
                    break
                time.sleep(0.2)
                if time.monotonic() - t0 > 20:
                    break
            assert closed or _closed_by_peer(trickle, 1)
            assert _closed_by_peer(silent, 10) and _closed_by_peer(partial, 10)
            # a connection that answers in time is served, also after its first answer
            ok = _connect(port)
            ok.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert b"200 OK" in _answer(ok)
            assert _closed_by_peer(ok, 10)  # idle after its answer: closed as well
            assert int(_metrics(port)["connections_timed_out"]) >= 3  # type: ignore[call-overload]
        finally:
            for s in (silent, partial, trickle):
                s.close()


def test_a_body_that_trickles_is_cut_off_long_before_the_request_timeout(tmp_path: Path) -> None:
    with serve(tmp_path, "--limits.body_timeout_s", "0.5") as port:  # request timeout: 900 s
        s = _connect(port)
        body = json.dumps({"attempts": [attempt("ok").model_dump(mode="json")]}).encode()
        s.sendall(b"POST /check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body[:10])  # fmt: skip
        answer = _answer(s)
        s.close()
        assert b"408" in answer.split(b"\r\n")[0] and b"0.5 s" in answer


def test_without_the_token_nothing_of_the_body_is_read(tmp_path: Path) -> None:
    with serve(tmp_path, token="tok") as port:
        s = _connect(port)
        # announces 10 MB and sends none of it: the answer comes without waiting for the body
        s.sendall(b"POST /check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 10000000\r\n\r\n")  # fmt: skip
        answer = _answer(s)
        s.close()
        assert b"401" in answer.split(b"\r\n")[0] and b"missing bearer token" in answer


async def test_accepted_tcp_sockets_have_nodelay(tmp_path: Path) -> None:
    import uvicorn

    from leanrl.service.cli import ServeCommand
    from leanrl.service.server import _bind

    sock = _bind(ServeCommand(port=0))
    assert sock.proto == socket.IPPROTO_TCP
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    sock.listen(16)
    limits = ServiceLimits()
    app = create_app(EchoRuntime(), ServiceConfig(limits=limits))
    conf = uvicorn.Config(app, log_level="critical", **uvicorn_settings(limits, app.state.service.connections))  # fmt: skip
    server = uvicorn.Server(conf)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        for _ in range(500):
            if server.started:
                break
            await asyncio.sleep(0.01)
        port = sock.getsockname()[1]
        async with ServiceClient(f"http://127.0.0.1:{port}") as c:
            await c.health()
            accepted = [
                p.transport.get_extra_info("socket") for p in server.server_state.connections
            ]
            assert accepted
            assert all(a.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1 for a in accepted)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


def _status(answer: bytes) -> bytes:
    return answer.split(b"\r\n")[0]


@pytest.mark.parametrize("kb", [20, 70])
def test_a_request_head_over_the_limit_gets_431(tmp_path: Path, kb: int) -> None:
    """A whole head over ``max_header_bytes`` (16 KB) arriving at once was accepted: h11 bounds
    only incomplete heads. It is answered 431, and so is an incomplete one past the limit."""
    filler = b"X-Filler: " + b"a" * (kb * 1024) + b"\r\n"
    with serve(tmp_path) as port:
        big = _connect(port)
        big.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n" + filler + b"\r\n")
        answer = _answer(big)
        assert _status(answer) == b"HTTP/1.1 431 Request Header Fields Too Large", answer[:200]
        assert b"larger than 16384 bytes (limits.max_header_bytes)" in answer
        assert _closed_by_peer(big, 10)
        big.close()
        unfinished = _connect(port)  # no blank line: h11's own bound, now answered 431 too
        unfinished.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n" + filler)
        assert _status(_answer(unfinished)).startswith(b"HTTP/1.1 431 ")
        unfinished.close()
        # a head just under the limit is served as before, and so are pipelined ones after it
        ok = _connect(port)
        near = b"X-Filler: " + b"a" * (15 * 1024) + b"\r\n"
        ok.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n" + near + b"\r\n")
        assert _status(_answer(ok)) == b"HTTP/1.1 200 OK"
        ok.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n"
                   + filler + b"\r\n")  # fmt: skip
        both = _until_closed(ok)  # the big head, pipelined behind a small one, is measured too
        assert both.startswith(b"HTTP/1.1 200 OK\r\n"), both[:200]
        assert both.count(b"HTTP/1.1 431 Request Header Fields Too Large\r\n") == 1
        ok.close()


def _until_closed(s: socket.socket) -> bytes:
    """Everything ``s`` receives until the server closes it."""
    s.settimeout(10)
    buf = b""
    while chunk := s.recv(65536):
        buf += chunk
    return buf
