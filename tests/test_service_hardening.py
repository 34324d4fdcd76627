"""The service and client under abuse: races, slow clients, broken sessions, retries that must
not repeat work. Real HTTP over loopback, the echo test runtime behind it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from _echo_runtime import EchoRuntime
from _service_testing import attempt, running_service

from leanrl._sandbox_config import ClientConfig, ServiceLimits
from leanrl.errors import ConfigError
from leanrl.runtime import RuntimeConfig
from leanrl.service.app import ServiceConfig, create_app, is_loopback
from leanrl.service.client import ServiceClient, ServiceError


def echo(**options: object) -> EchoRuntime:
    return EchoRuntime(RuntimeConfig(name="echo-test", options=dict(options)))


def checks_logged(tmp_path: Path) -> list[str]:
    p = tmp_path / "checks.log"
    return [line.split()[1] for line in p.read_text().splitlines()] if p.exists() else []


def body(*proofs: str) -> dict:
    return {
        "attempts": [attempt(p, id=str(i)).model_dump(mode="json") for i, p in enumerate(proofs)]
    }


def test_only_real_loopback_addresses_count_as_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    assert is_loopback("127.0.0.1") and is_loopback("127.1.2.3") and is_loopback("::1")
    assert is_loopback("localhost")
    # a host name that merely starts with "127." resolves anywhere: it needs a token
    for host in ("127.example.com", "0.0.0.0", "::", "10.0.0.1", "example.com"):
        assert not is_loopback(host), host
    monkeypatch.delenv("LEANRL_SERVICE_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="without a bearer token"):
        create_app(echo(), ServiceConfig(host="127.attacker.example"))


async def test_concurrent_opens_cannot_exceed_the_session_limit() -> None:
    rt = echo(session_open_s=0.3)
    cfg = ServiceConfig(limits=ServiceLimits(max_sessions=2))
    async with running_service(rt, cfg) as url, httpx.AsyncClient() as http:
        rs = await asyncio.gather(
            *(http.post(f"{url}/sessions", json={"header": ""}) for _ in range(5))
        )
        codes = sorted(r.status_code for r in rs)
        assert codes == [200, 200, 429, 429, 429]
        m = (await http.get(f"{url}/metrics")).json()
        assert m["sessions_open"] == 2 and rt.sessions_opened == 2


async def test_a_session_that_cannot_open_or_raises_is_503_and_closed_never_500() -> None:
    rt = echo()
    async with running_service(rt) as url, httpx.AsyncClient() as http:
        r = await http.post(f"{url}/sessions", json={"header": "import Broken"})
        assert r.status_code == 503 and "unknown module Broken" in r.json()["error"]
        sid = (await http.post(f"{url}/sessions", json={"header": ""})).json()["session_id"]
        st = await http.post(f"{url}/sessions/{sid}/start", json={"formal_statement": "t := by"})
        assert st.status_code == 200
        r = await http.post(
            f"{url}/sessions/{sid}/tactic", json={"proof_state": 0, "tactic": "raise"}
        )
        assert r.status_code == 503 and "echo session asked to raise" in r.json()["error"]
        assert "session was closed" in r.json()["error"]
        # the session's state is unknown after a failure: it is gone, and says why
        r = await http.post(f"{url}/sessions/{sid}/tactic", json={"proof_state": 0, "tactic": "x"})
        assert r.status_code == 404 and "no tactic session" in r.json()["error"]
        assert (await http.get(f"{url}/metrics")).json()["sessions_open"] == 0


async def test_a_session_whose_request_timed_out_is_closed() -> None:
    # A cancelled step may leave the Lean process mid-answer; reusing it would read a stale
    # answer. The service closes the session instead.
    cfg = ServiceConfig(limits=ServiceLimits(request_timeout_s=0.3))
    async with running_service(echo(), cfg) as url, httpx.AsyncClient() as http:
        sid = (await http.post(f"{url}/sessions", json={"header": ""})).json()["session_id"]
        await http.post(f"{url}/sessions/{sid}/start", json={"formal_statement": "t := by"})
        r = await http.post(
            f"{url}/sessions/{sid}/tactic", json={"proof_state": 0, "tactic": "hang"}
        )
        assert r.status_code == 504
        r = await http.post(f"{url}/sessions/{sid}/tactic", json={"proof_state": 0, "tactic": "x"})
        assert r.status_code == 404
        assert (await http.get(f"{url}/metrics")).json()["sessions_open"] == 0


async def test_idle_sessions_are_reaped() -> None:
    cfg = ServiceConfig(limits=ServiceLimits(session_idle_s=0.2))
    async with running_service(echo(), cfg) as url, httpx.AsyncClient() as http:
        sid = (await http.post(f"{url}/sessions", json={"header": ""})).json()["session_id"]
        for _ in range(200):
            if (await http.get(f"{url}/metrics")).json()["sessions_open"] == 0:
                break
            await asyncio.sleep(0.05)
        r = await http.post(f"{url}/sessions/{sid}/start", json={"formal_statement": "t := by"})
        assert r.status_code == 404 and "expired after idling" in r.json()["error"]


async def test_a_slow_body_is_cut_off_by_the_request_timeout() -> None:
    # A client that sends headers and then trickles (or stops sending) its body must not hold a
    # connection forever: the request timeout covers reading the body too.
    cfg = ServiceConfig(limits=ServiceLimits(request_timeout_s=0.5))
    async with running_service(echo(), cfg) as url:
        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"POST /check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"attempts": '
        )
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), 10)
        rest = await asyncio.wait_for(reader.read(4096), 10)
        writer.close()
        assert status.split()[1] == b"408", status
        assert b"body" in rest and b"0.5 s" in rest


async def test_an_in_flight_idempotent_request_is_never_evicted(tmp_path: Path) -> None:
    cfg = ServiceConfig(limits=ServiceLimits(idempotency_max_entries=1))
    rt = echo(log_path=str(tmp_path / "checks.log"))
    async with running_service(rt, cfg) as url, httpx.AsyncClient() as http:
        slow = asyncio.create_task(
            http.post(f"{url}/check", json=body("sleep 0.5"), headers={"Idempotency-Key": "a"})
        )
        for _ in range(400):  # until "a" is running in the service
            if (await http.get(f"{url}/metrics")).json()["queue_depth"] == 1:
                break
            await asyncio.sleep(0.005)
        r = await http.post(f"{url}/check", json=body("ok"), headers={"Idempotency-Key": "b"})
        assert r.status_code == 200
        # "a" is still running: its retry must wait for it, not check it a second time
        again = await http.post(
            f"{url}/check", json=body("sleep 0.5"), headers={"Idempotency-Key": "a"}
        )
        first = await slow
        assert again.json()["cached"] is True and first.json()["cached"] is False
        assert sorted(checks_logged(tmp_path)) == ["0", "0"]  # "a" once and "b" once


async def test_requests_without_a_key_are_not_retried_after_being_sent() -> None:
    # Opening a session is not idempotent: a retry after a read timeout would open a second one.
    rt = echo(session_open_s=0.6)
    async with running_service(rt) as url:
        cfg = ClientConfig(retries=3, backoff_s=0.01, request_timeout_s=0.2)
        async with ServiceClient(url, config=cfg) as client:
            with pytest.raises(ServiceError, match="ReadTimeout"):
                async with client.tactic_session(""):
                    pass
            assert client.retries_done == 0
        for _ in range(500):  # until the one open that was sent has finished on the service
            if rt.sessions_opened:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.7)  # a retried open (had there been one) would finish by now
        assert rt.sessions_opened == 1


async def test_requests_without_a_key_are_retried_when_never_sent() -> None:
    # Connection refused: the request never reached a service, so trying again is safe.
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    cfg = ClientConfig(retries=2, backoff_s=0.01)
    async with ServiceClient(f"http://127.0.0.1:{port}", config=cfg) as client:
        with pytest.raises(ServiceError, match="after 3 tries"):
            async with client.tactic_session(""):
                pass
        assert client.retries_done == 2


async def test_a_garbled_answer_is_a_service_error_not_a_crash() -> None:
    # A sandbox that answers 200 with a truncated or foreign body is broken: the sandbox runtime
    # must see a ServiceError (retry elsewhere, then infra Verdicts), not a stray exception.
    answers = iter([b'{"verdicts": [', b'{"verdicts": "nope"}'])

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=next(answers))

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        client = ServiceClient("http://sandbox", http=http)
        with pytest.raises(ServiceError, match="invalid JSON"):
            await client.check([attempt("ok")])
        with pytest.raises(ServiceError, match="no CheckResponse"):
            await client.check([attempt("ok")])


async def test_wrong_paths_and_methods_say_what_exists() -> None:
    async with running_service(echo()) as url, httpx.AsyncClient() as http:
        r = await http.get(f"{url}/nope")
        assert r.status_code == 404
        assert "no endpoint GET /nope" in r.json()["error"] and "POST /check" in r.json()["error"]
        r = await http.get(f"{url}/check")
        assert r.status_code == 405
        assert "GET /check is not allowed" in r.json()["error"] and "POST" in r.json()["error"]


async def test_a_step_queued_behind_a_failing_step_does_not_run_on_the_closed_session() -> None:
    cfg = ServiceConfig(limits=ServiceLimits(request_timeout_s=0.4))
    async with running_service(echo(), cfg) as url, httpx.AsyncClient() as http:
        sid = (await http.post(f"{url}/sessions", json={"header": ""})).json()["session_id"]
        await http.post(f"{url}/sessions/{sid}/start", json={"formal_statement": "t := by"})
        step = f"{url}/sessions/{sid}/tactic"
        hang = asyncio.create_task(http.post(step, json={"proof_state": 0, "tactic": "hang"}))
        await asyncio.sleep(0.1)  # the hanging step holds the session; the next one queues
        queued = await http.post(step, json={"proof_state": 0, "tactic": "skip"})
        assert (await hang).status_code == 504
        assert queued.status_code == 404 and "timed out" in queued.json()["error"]


async def test_backoff_is_jittered_capped_and_honours_retry_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import leanrl.service.client as client_mod

    pauses: list[float] = []

    async def record(seconds: float) -> None:
        pauses.append(seconds)

    monkeypatch.setattr(client_mod.asyncio, "sleep", record)
    answers = iter(
        [httpx.Response(503, json={"error": "busy"}, headers={"Retry-After": "1.5"})]
        + [httpx.Response(503, json={"error": "busy"})] * 6
        + [httpx.Response(200, json={"status": "ok"})]
    )
    async with httpx.AsyncClient(
        transport=httpx.MockTransport(lambda request: next(answers))
    ) as http:
        cfg = ClientConfig(retries=7, backoff_s=1.0, max_backoff_s=4.0)
        health = await ServiceClient("http://svc", config=cfg, http=http).health()
    assert health.status == "ok" and len(pauses) == 7
    assert pauses[0] == 1.5  # the service's Retry-After
    # then doubling from 1 s, each jittered to [50%, 100%] and never above the 4 s cap
    for pause, nominal in zip(pauses[1:], [2.0, 4.0, 4.0, 4.0, 4.0, 4.0], strict=True):
        assert nominal / 2 <= pause <= nominal
