"""The verification service over real loopback HTTP: verdicts, auth, limits, hangs, idempotency."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from _echo_runtime import EchoRuntime
from _service_testing import attempt, running_service

from leanrl._sandbox_config import ClientConfig, ServiceLimits
from leanrl.errors import ConfigError
from leanrl.runtime import Runtime, RuntimeConfig
from leanrl.service.app import ServiceConfig, create_app, warm_runtime
from leanrl.service.client import ServiceClient, ServiceError
from leanrl.verdict import Reason, Verdict

TESTS = Path(__file__).resolve().parent
ECHO = "_echo_runtime:EchoRuntime"


def echo(tmp_path: Path | None = None, **options: object) -> EchoRuntime:
    if tmp_path is not None:
        options.setdefault("log_path", str(tmp_path / "checks.log"))
    return EchoRuntime(RuntimeConfig(name="echo-test", options=dict(options)))


def checks_logged(tmp_path: Path) -> list[str]:
    p = tmp_path / "checks.log"
    return [line.split()[1] for line in p.read_text().splitlines()] if p.exists() else []


def body(*proofs: str) -> dict:
    return {
        "attempts": [attempt(p, id=str(i)).model_dump(mode="json") for i, p in enumerate(proofs)]
    }


async def test_check_answers_in_order_and_bad_proofs_are_verdicts() -> None:
    rt = echo()
    async with running_service(rt) as url, httpx.AsyncClient() as http:
        r = await http.post(f"{url}/check", json=body("ok", "nonsense", "sorry", "rfl"))
        assert r.status_code == 200
        vs = [Verdict.model_validate(v) for v in r.json()["verdicts"]]
        assert [v.id for v in vs] == ["0", "1", "2", "3"]
        assert [v.reason for v in vs] == [Reason.OK, Reason.ERROR, Reason.SORRY, Reason.OK]
        assert "unknown tactic" in vs[1].messages[0].data
        empty = await http.post(f"{url}/check", json={"attempts": []})
        assert empty.status_code == 200 and empty.json()["verdicts"] == []
        health = (await http.get(f"{url}/health")).json()
        assert health["status"] == "ok" and health["runtime"] == "echo-test"
    assert rt.started and rt.closed  # the app's lifespan starts and closes the runtime


async def test_bad_requests_get_4xx_with_a_message() -> None:
    async with running_service(echo()) as url, httpx.AsyncClient() as http:
        r = await http.post(
            f"{url}/check", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert r.status_code == 400 and "not valid JSON" in r.json()["error"]
        r = await http.post(f"{url}/check", json={"attempts": [{"name": "t", "header": ""}]})
        assert r.status_code == 422
        assert "attempts.0.proof" in r.json()["error"] and "required" in r.json()["error"]
        r = await http.post(f"{url}/check", json={"attempts": [], "extra": 1})
        assert r.status_code == 422 and "extra" in r.json()["error"]
        r = await http.post(f"{url}/check", content=b"x=1")
        assert r.status_code == 415 and "application/json" in r.json()["error"]
        r = await http.get(f"{url}/nope")
        assert r.status_code == 404 and r.json()["error"]
        r = await http.post(f"{url}/check", json=body("ok"), headers={"Idempotency-Key": "k" * 300})
        assert r.status_code == 400 and "Idempotency-Key" in r.json()["error"]
        metrics = (await http.get(f"{url}/metrics")).json()
        assert metrics["rejected_requests"] == 6


async def test_bearer_token_is_required_when_configured() -> None:
    cfg = ServiceConfig(token="s3cret")
    async with running_service(echo(), cfg) as url, httpx.AsyncClient() as http:
        r = await http.post(f"{url}/check", json=body("ok"))
        assert r.status_code == 401 and "missing bearer token" in r.json()["error"]
        r = await http.post(f"{url}/check", json=body("ok"), headers={"Authorization": "Bearer x"})
        assert r.status_code == 401 and "wrong bearer token" in r.json()["error"]
        r = await http.get(f"{url}/metrics")
        assert r.status_code == 401
        assert (await http.get(f"{url}/health")).status_code == 200  # health needs no token
        ok = await ServiceClient(url, token="s3cret").check([attempt("ok")])
        assert ok[0].accepted
        with pytest.raises(ConfigError, match="401"):
            await ServiceClient(url, token="wrong").check([attempt("ok")])


def test_non_loopback_bind_needs_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LEANRL_SERVICE_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="without a bearer token"):
        create_app(echo(), ServiceConfig(host="0.0.0.0"))
    create_app(echo(), ServiceConfig(host="0.0.0.0", token="t"))  # fine with a token
    create_app(echo(), ServiceConfig(host="0.0.0.0", uds="/tmp/x.sock"))  # unix socket: fine
    monkeypatch.setenv("LEANRL_SERVICE_TOKEN", "from-env")
    assert ServiceConfig(host="0.0.0.0").effective_token() == "from-env"


async def test_oversized_bodies_and_batches_are_refused() -> None:
    cfg = ServiceConfig(limits=ServiceLimits(max_body_bytes=4096, max_batch=3))
    async with running_service(echo(), cfg) as url, httpx.AsyncClient() as http:
        big = body("ok " + "x" * 8000)
        r = await http.post(f"{url}/check", json=big)
        assert r.status_code == 413 and "over the limit of 4096 bytes" in r.json()["error"]

        async def chunks():  # no Content-Length: the limit must hold while streaming
            for _ in range(10):
                yield b" " * 1000

        r = await http.post(
            f"{url}/check", content=chunks(), headers={"content-type": "application/json"}
        )
        assert r.status_code == 413
        r = await http.post(f"{url}/check", json=body("ok", "ok", "ok", "ok"))
        assert r.status_code == 413 and "split it into batches of at most 3" in r.json()["error"]
        r = await http.post(f"{url}/check", json=body("ok", "ok", "ok"))
        assert r.status_code == 200


async def test_hanging_backend_gets_504_and_the_service_keeps_serving() -> None:
    cfg = ServiceConfig(limits=ServiceLimits(request_timeout_s=0.5))
    async with running_service(echo(), cfg) as url, httpx.AsyncClient() as http:
        r = await http.post(f"{url}/check", json=body("hang"))
        assert r.status_code == 504 and "was cancelled" in r.json()["error"]
        r = await http.post(f"{url}/check", json=body("ok"))
        assert r.status_code == 200 and r.json()["verdicts"][0]["accepted"]
        m = (await http.get(f"{url}/metrics")).json()
        assert m["request_timeouts"] == 1 and m["timeouts"] == 1 and m["queue_depth"] == 0
        # the client does not retry a 504 (the backend already had its full time)
        client = ServiceClient(url, config=ClientConfig(retries=3, backoff_s=0.01))
        with pytest.raises(ServiceError, match="504") as ei:
            await client.check([attempt("hang")])
        assert ei.value.status == 504 and client.retries_done == 0


class _Broken(Runtime):
    name = "broken"

    async def check(self, attempts):  # type: ignore[no-untyped-def]
        if attempts[0].proof == "short":
            return []
        raise ValueError("boom")


async def test_a_failing_runtime_is_503_never_500() -> None:
    async with running_service(_Broken()) as url, httpx.AsyncClient() as http:
        r = await http.post(f"{url}/check", json=body("x"))
        assert r.status_code == 503 and "runtime failed: ValueError: boom" in r.json()["error"]
        r = await http.post(f"{url}/check", json=body("short"))
        assert r.status_code == 503 and "returned 0 verdicts for 1" in r.json()["error"]
        # the runtime has no tactic mode: a clear 501, and the client says so as a ConfigError
        r = await http.post(f"{url}/sessions", json={"header": ""})
        assert r.status_code == 501 and "tactic mode" in r.json()["error"]


async def test_idempotency_key_replays_instead_of_checking_twice(tmp_path: Path) -> None:
    async with running_service(echo(tmp_path)) as url, httpx.AsyncClient() as http:
        h = {"Idempotency-Key": "batch-1"}
        r1 = await http.post(f"{url}/check", json=body("ok", "bad"), headers=h)
        r2 = await http.post(f"{url}/check", json=body("ok", "bad"), headers=h)
        assert r1.json()["verdicts"] == r2.json()["verdicts"]
        assert r1.json()["cached"] is False and r2.json()["cached"] is True
        assert checks_logged(tmp_path) == ["0", "1"]
        r3 = await http.post(f"{url}/check", json=body("ok"), headers=h)
        assert r3.status_code == 409 and "different batch" in r3.json()["error"]
        # duplicates arriving while the first is still running wait for it
        h2 = {"Idempotency-Key": "batch-2"}
        rs = await asyncio.gather(
            *(http.post(f"{url}/check", json=body("sleep 0.3"), headers=h2) for _ in range(4))
        )
        assert all(r.status_code == 200 and r.json()["verdicts"][0]["accepted"] for r in rs)
        assert sum(r.json()["cached"] for r in rs) == 3
        assert checks_logged(tmp_path) == ["0", "1", "0"]
        assert (await http.get(f"{url}/metrics")).json()["cache_hits"] == 4


async def test_client_retry_after_lost_answer_does_not_check_twice(tmp_path: Path) -> None:
    async with running_service(echo(tmp_path)) as url:
        # The answer takes 1 s but the client gives up after 0.3 s: it retries with the same key
        # and gets the first check's answer once it is ready.
        cfg = ClientConfig(retries=8, backoff_s=0.05, request_timeout_s=0.3)
        async with ServiceClient(url, config=cfg) as client:
            vs = await client.check([attempt("sleep 1", id="a"), attempt("bad", id="b")])
        assert [v.reason for v in vs] == [Reason.OK, Reason.ERROR]
        assert client.retries_done >= 1
        assert checks_logged(tmp_path) == ["a", "b"]


async def test_client_gives_up_on_an_unreachable_service() -> None:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    client = ServiceClient(
        f"http://127.0.0.1:{port}", config=ClientConfig(retries=2, backoff_s=0.01)
    )
    with pytest.raises(ServiceError, match="after 3 tries") as ei:
        await client.check([attempt("ok")])
    assert ei.value.status is None and client.retries_done == 2
    await client.close()


async def test_tactic_sessions_over_http() -> None:
    cfg = ServiceConfig(limits=ServiceLimits(max_sessions=1))
    async with running_service(echo(), cfg) as url, httpx.AsyncClient() as http:
        client = ServiceClient(url, config=ClientConfig(retries=0))
        async with client.tactic_session("import Mathlib") as s:
            st = await s.start("theorem t : 1 = 1 := by")
            assert st.goals == ("⊢ theorem t : 1 = 1",) and st.proof_state == 0
            st2 = await s.apply(st.proof_state, "skip")
            assert not st2.solved and st2.proof_state == 1
            bad = await s.apply(st2.proof_state, "fail")
            assert bad.error and bad.proof_state is None
            done = await s.apply(st2.proof_state, "done")
            assert done.solved
            # the limit of one open session holds
            r = await http.post(f"{url}/sessions", json={"header": ""})
            assert r.status_code == 429 and "DELETE /sessions" in r.json()["error"]
            assert (await http.get(f"{url}/metrics")).json()["sessions_open"] == 1
            sid = s.session_id  # type: ignore[attr-defined]
        r = await http.post(f"{url}/sessions/{sid}/tactic", json={"proof_state": 0, "tactic": "x"})
        assert r.status_code == 404 and "no tactic session" in r.json()["error"]
        assert (await http.delete(f"{url}/sessions/{sid}")).status_code == 404
        await client.close()


async def test_metrics_show_queue_depth_and_throughput() -> None:
    async with running_service(echo()) as url, httpx.AsyncClient() as http:
        pending = asyncio.create_task(http.post(f"{url}/check", json=body("sleep 0.5", "ok", "ok")))
        depth = 0
        for _ in range(200):
            depth = (await http.get(f"{url}/metrics")).json()["queue_depth"]
            if depth:
                break
            await asyncio.sleep(0.01)
        assert depth == 3
        await pending
        m = (await http.get(f"{url}/metrics")).json()
        assert m["queue_depth"] == 0 and m["attempts_total"] == 3
        assert m["attempts_per_s"] > 0 and m["memory_rss_mb"] > 0
        assert m["reasons"] == {"ok": 3} and m["runtime"]["checked"] == 3.0


def test_leanrl_serve_command_runs_and_stops_cleanly(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    env = {**os.environ, "PYTHONPATH": str(TESTS), "LEANRL_SERVICE_TOKEN": "tok"}
    cmd = [
        sys.executable, "-m", "leanrl.cli", "serve", "--port", "0",
        "--port_file", str(port_file), "--runtime.name", "_echo_runtime:EchoRuntime",
        "--runtime.options", f"closed_path={tmp_path / 'closed'}",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        for _ in range(300):
            if port_file.exists() or proc.poll() is not None:
                break
            subprocess.run(["sleep", "0.05"])
        assert port_file.exists(), proc.stdout.read() if proc.stdout else ""
        url = f"http://127.0.0.1:{port_file.read_text()}"

        async def go() -> list[Verdict]:
            async with ServiceClient(url, token="tok", config=ClientConfig(backoff_s=0.1)) as c:
                await c.health()
                return await c.check([attempt("ok"), attempt("x")])

        vs = asyncio.run(go())
        assert [v.accepted for v in vs] == [True, False]
        proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully (closing the runtime), then re-raises the signal
        assert proc.wait(timeout=15) in (0, -signal.SIGTERM)
        assert (tmp_path / "closed").read_text() == "closed"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_refuses_public_bind_without_token(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "LEANRL_SERVICE_TOKEN"}
    env["PYTHONPATH"] = str(TESTS)
    r = subprocess.run(
        [sys.executable, "-m", "leanrl.service", "--host", "0.0.0.0", "--port", "0"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2 and "without a bearer token" in r.stderr


def test_unix_socket_transport_and_container_healthcheck(tmp_path: Path) -> None:
    # The docker runtime's default transport, without Docker: the service on a unix socket,
    # the client through it, and the image's HEALTHCHECK script against it.
    sock = tmp_path / "service.sock"
    env = {**os.environ, "PYTHONPATH": str(TESTS), "LEANRL_SERVICE_TOKEN": "tok"}
    cmd = [sys.executable, "-m", "leanrl.service", "--uds", str(sock), "--runtime.name", ECHO]
    health = [sys.executable, "-m", "leanrl.service.healthcheck"]
    assert subprocess.run(health, env={**env, "LEANRL_SERVICE_UDS": str(sock)}).returncode == 1
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:

        async def go() -> list[Verdict]:
            cfg = ClientConfig(retries=40, backoff_s=0.05)
            async with ServiceClient("http://localhost", "tok", cfg, uds=str(sock)) as c:
                await c.health()
                return await c.check([attempt("ok"), attempt("sorry")])

        vs = asyncio.run(go())
        assert [v.reason for v in vs] == [Reason.OK, Reason.SORRY]
        r = subprocess.run(health, env={**env, "LEANRL_SERVICE_UDS": str(sock)})
        assert r.returncode == 0
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_shared_http_client_cannot_use_a_unix_socket() -> None:
    with pytest.raises(ConfigError, match="unix socket"):
        ServiceClient("http://localhost", uds="/x.sock", http=httpx.AsyncClient())


async def test_metrics_use_a_runtime_pools_counters_for_restarts() -> None:
    from pydantic import BaseModel

    class Stats(BaseModel):
        killed: int = 2
        recycled: int = 3
        checked: int = 9

    class Pooled(EchoRuntime):
        metrics = None  # type: ignore[assignment]  # no metrics(): the pool's stats are used

        def __init__(self) -> None:
            super().__init__(RuntimeConfig(name="echo-test"))
            self.pool = type("P", (), {"stats": Stats()})()

    async with running_service(Pooled()) as url, httpx.AsyncClient() as http:
        m = (await http.get(f"{url}/metrics")).json()
    assert m["restarts"] == 5 and m["runtime"]["checked"] == 9.0


def test_serve_reports_a_runtime_that_cannot_start_cleanly() -> None:
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    opts = json.dumps({"start_error": "no Lean here: install it"})
    r = subprocess.run(
        [sys.executable, "-m", "leanrl.service", "--port", "0", "--runtime.name", ECHO,
         "--runtime.options", opts],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2
    assert "leanrl serve: error: no Lean here: install it" in r.stderr
    assert "Traceback" not in r.stderr


async def test_warm_headers_are_loaded_before_the_service_is_ready() -> None:
    rt = echo()
    cfg = ServiceConfig(warm_headers=["import Mathlib", "import Broken", "import Foo"])
    async with running_service(rt, cfg) as url, httpx.AsyncClient() as http:
        assert rt.warmed == ["import Mathlib", "import Foo"]
        # a header that cannot load is logged and counted, and the service runs on
        assert (await http.get(f"{url}/metrics")).json()["warm_failures"] == 1
    assert not await warm_runtime(_Broken(), "import Mathlib")  # cannot warm: says so


async def test_a_session_carries_the_tasksets_rules_to_the_runtime() -> None:
    """Tactics in a sandboxed session are pre-scanned under the taskset's rules, not the
    service's defaults: the policy travels with the session request."""
    from leanrl.verdict import VerificationPolicy

    rt = echo()
    rules = VerificationPolicy(allow_native_decide=True)
    async with running_service(rt) as url:
        client = ServiceClient(url, config=ClientConfig(retries=0))
        async with client.tactic_session("import Mathlib", rules):
            pass
        async with client.tactic_session("import Mathlib"):
            pass
        await client.close()
    assert rt.session_policies == [rules, None]
