"""The warm pool and the sandbox runtime, with real `leanrl serve` processes as sandboxes.

The sandboxes come from the local implementation of the sandbox interface (the same one the
`modal` runtime uses with `backend = "local"`), each serving the echo test runtime.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import psutil
import pytest
from _service_testing import attempt

from leanrl._sandbox_config import ClientConfig, ModalConfig, PoolConfig
from leanrl.runtime import RuntimeConfig
from leanrl.runtimes.modal import ModalRuntime
from leanrl.runtimes.modal.local_backend import LocalProcessBackend, LocalSandbox
from leanrl.service.client import ServiceClient
from leanrl.service.pool import PoolUnavailable, WarmPool
from leanrl.service.sandbox import Sandbox
from leanrl.service.sandbox_runtime import inner_runtime_args
from leanrl.verdict import Reason

TESTS = Path(__file__).resolve().parent
ECHO = "_echo_runtime:EchoRuntime"


def backend(**options: object) -> LocalProcessBackend:
    args = inner_runtime_args(RuntimeConfig(), ECHO, dict(options))
    return LocalProcessBackend(args, cpu=2.0, pythonpath=[TESTS])


async def probe(sb: Sandbox) -> bool:
    async with ServiceClient(sb.url, sb.token) as c:
        return (await c.health(retries=0, timeout_s=2)).status == "ok"


def runtime(tmp_path: Path, **modal: object) -> ModalRuntime:
    pool = modal.pop("pool", PoolConfig(max_sandboxes=2, max_uses=1, health_interval_s=60))
    client = modal.pop("client", ClientConfig(retries=1, backoff_s=0.05))
    cfg = ModalConfig(
        backend="local",
        local_runtime=ECHO,
        local_pythonpath=[TESTS],
        warm_sandboxes=1,
        cpu=2.0,
        pool=pool,
        client=client,
        metrics_path=tmp_path / "metrics.jsonl",
        inner_options={"log_path": str(tmp_path / "checks.log")},
        **modal,
    )
    return ModalRuntime(RuntimeConfig(name="modal", modal=cfg))


def pids_alive(sbs: list[LocalSandbox]) -> list[int]:
    return [sb.proc.pid for sb in sbs if psutil.pid_exists(sb.proc.pid)]


async def wait_for(cond, timeout_s: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    for _ in range(int(timeout_s / 0.05)):
        if cond():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not reached")


async def test_pool_keeps_target_ready_and_replaces_used_ones() -> None:
    be = backend()
    pool = WarmPool(be, PoolConfig(target_ready=1, max_sandboxes=3, max_uses=1), probe)
    await pool.start()
    assert pool.state()["ready"] == 1
    sb = await pool.acquire()
    assert pool.state()["warm_acquires"] >= 1 and pool.state()["busy"] == 1
    # taking the ready one starts a replacement in the background
    await wait_for(lambda: pool.state()["ready"] == 1)
    async with ServiceClient(sb.url, sb.token) as c:
        assert (await c.check([attempt("ok")]))[0].accepted
    await pool.release(sb, ok=True)  # max_uses=1: retired, not reused
    await wait_for(lambda: pool.state()["terminated"] == 1)
    s = pool.state()
    assert s["retired_used"] == 1 and s["ready"] == 1 and s["busy"] == 0
    assert s["sandbox_s"] > 0 and s["cpu_reserved_s"] == pytest.approx(
        s["sandbox_s"] * 2.0, rel=0.05
    )
    started = list(be.started)
    await pool.close()
    assert not pids_alive(started) and all(x.terminated_at for x in started)
    assert pool.state()["ready"] == 0


async def test_dead_and_over_age_idle_sandboxes_are_replaced() -> None:
    be = backend()
    cfg = PoolConfig(target_ready=1, max_sandboxes=2, health_interval_s=0.2, max_age_s=3600)
    pool = WarmPool(be, cfg, probe)
    await pool.start()
    first = be.started[0]
    first.kill()
    await wait_for(lambda: pool.state()["replaced_dead"] == 1 and pool.state()["ready"] == 1)
    second = await pool.acquire()
    assert second is not first and await second.alive()
    await pool.release(second, ok=True)
    pool.config = cfg.model_copy(update={"max_age_s": 0.01})  # everything is now too old
    await wait_for(lambda: pool.state()["replaced_aged"] >= 1)
    await pool.close()
    assert not pids_alive(be.started)


async def test_a_backend_that_cannot_start_fails_fast_with_its_error() -> None:
    args = inner_runtime_args(RuntimeConfig(), "no_such_module:Nope")
    be = LocalProcessBackend(args, pythonpath=[TESTS])
    pool = WarmPool(be, PoolConfig(target_ready=1, max_sandboxes=1), probe)
    with pytest.raises(PoolUnavailable, match="no_such_module") as ei:
        await pool.start()
    assert "fail to start (3 times in a row)" in str(ei.value)
    await pool.close()


async def test_sandbox_dying_mid_batch_costs_one_retry_and_nothing_twice(tmp_path: Path) -> None:
    rt = runtime(tmp_path, batch_size=3)
    marker = tmp_path / "died-once"
    proofs = ["ok", "bad", f"die-once:{marker}", "ok", "sorry", "rfl"]
    attempts = [attempt(p, id=f"a{i}") for i, p in enumerate(proofs)]
    async with rt:
        verdicts = await rt.check(attempts)
        m = rt.metrics()
    assert marker.exists()  # a sandbox really died
    assert [v.id for v in verdicts] == [a.id for a in attempts]
    assert [v.reason for v in verdicts] == [
        Reason.OK, Reason.ERROR, Reason.OK, Reason.OK, Reason.SORRY, Reason.OK,
    ]  # fmt: skip
    assert m["retried_batches"] == 1 and m["infra_verdicts"] == 0 and m["attempts"] == 6
    assert m["pool_discarded_failed"] == 1


async def test_sandbox_dying_twice_gives_infra_verdicts_for_that_batch_only(
    tmp_path: Path,
) -> None:
    rt = runtime(tmp_path, batch_size=2)
    attempts = [attempt(p, id=f"a{i}") for i, p in enumerate(["ok", "die", "ok", "bad"])]
    async with rt:
        verdicts = await rt.check(attempts)
        m = rt.metrics()
    assert [v.reason for v in verdicts] == [Reason.INFRA, Reason.INFRA, Reason.OK, Reason.ERROR]
    assert "sandbox failed twice" in verdicts[0].detail
    assert [v.id for v in verdicts] == ["a0", "a1", "a2", "a3"]
    assert m["infra_verdicts"] == 2 and m["batches"] == 2


async def test_a_hanging_sandbox_is_dropped_and_its_batch_gets_infra(tmp_path: Path) -> None:
    rt = runtime(tmp_path, batch_size=1, client=ClientConfig(retries=0, request_timeout_s=1.0))
    async with rt:
        verdicts = await rt.check([attempt("hang", id="h"), attempt("ok", id="k")])
        started = list(rt.pool.backend.started) if rt.pool else []  # type: ignore[attr-defined]
    assert [v.reason for v in verdicts] == [Reason.INFRA, Reason.OK]
    assert "ReadTimeout" in verdicts[0].detail
    assert not pids_alive(started)  # closing the runtime stopped every process it started


async def test_cost_is_accounted_per_batch_and_per_run(tmp_path: Path) -> None:
    rt = runtime(tmp_path, batch_size=2)
    async with rt:
        await rt.check([attempt("ok", id=str(i)) for i in range(5)])
        costs = rt.batch_costs()
    assert sum(c.attempts for c in costs) == 5
    assert len(costs) == 3 and all(c.tries == 1 and c.infra == 0 for c in costs)
    for c in costs:
        assert c.sandbox_s > 0 and c.cpu_reserved_s == pytest.approx(c.sandbox_s * 2.0)
        assert c.cpu_used_s is not None and c.cpu_used_s >= 0
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    batches = [x for x in lines if x["kind"] == "batch"]
    runs = [x for x in lines if x["kind"] == "run"]
    assert len(batches) == 3 and len(runs) == 1 and lines[-1]["kind"] == "run"
    run = runs[0]
    assert run["runtime"] == "modal" and run["attempts"] == 5 and run["batches"] == 3
    # billed time covers every sandbox's whole life, so it is at least the busy time
    assert run["pool_sandbox_s"] >= run["batch_sandbox_s"] > 0
    assert run["pool_cpu_reserved_s"] == pytest.approx(run["pool_sandbox_s"] * 2.0, rel=0.01)
    assert run["pool_retired_used"] >= 3  # max_uses=1: a fresh sandbox per batch
    checked = (tmp_path / "checks.log").read_text().split()
    assert sorted(checked[1::2]) == ["0", "1", "2", "3", "4"]  # each attempt checked once


async def test_tactic_session_through_a_pooled_sandbox(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    async with rt:
        async with rt.tactic_session("import Mathlib") as s:
            st = await s.start("theorem t : 1 = 1 := by")
            done = await s.apply(st.proof_state or 0, "rfl")
        assert done.solved
        assert rt.metrics()["pool_retired_used"] == 1  # the session used up its sandbox


async def test_new_sandboxes_load_the_imports_batches_use(tmp_path: Path) -> None:
    rt = runtime(tmp_path, warm_headers=["import Init"], learn_warm_headers=1)
    header = "import Mathlib\nimport Aesop\nset_option maxHeartbeats 400000\nopen Real"
    a = attempt("ok").model_copy(update={"header": header})
    async with rt:
        assert rt.pool is not None
        await rt.check([a, a.model_copy(update={"header": "import Other"})])
        warm = rt.pool.backend.warm_headers
        assert warm == ["import Init", "import Mathlib\nimport Aesop"]  # learned one (limit 1)
        sb = await rt.pool.acquire()  # started after the first batch: loads all three imports
        async with ServiceClient(sb.url, sb.token) as c:
            assert (await c.metrics()).runtime["warmed"] == 2
        await rt.pool.release(sb, ok=True)


async def test_tactic_sessions_share_a_sandbox_up_to_the_limit(tmp_path: Path) -> None:
    # One sandbox may host several sessions (each pins one Lean process in it), so a tactic-loop
    # harness does not need a whole sandbox per proof in progress.
    pool = PoolConfig(max_sandboxes=1, max_uses=1, health_interval_s=60, acquire_timeout_s=3)
    rt = runtime(tmp_path, pool=pool, sessions_per_sandbox=3)
    async with rt:

        async def prove(i: int) -> bool:
            async with rt.tactic_session("import Mathlib") as s:
                st = await s.start(f"theorem t{i} : 1 = 1 := by")
                await asyncio.sleep(0.2)  # all three are open at once
                return (await s.apply(st.proof_state or 0, "rfl")).solved

        assert await asyncio.gather(*(prove(i) for i in range(3))) == [True, True, True]
        m = rt.metrics()
        assert m["pool_created"] == 1  # one sandbox hosted all three
        await wait_for(lambda: rt.metrics()["pool_retired_used"] == 1)  # one use, then retired


async def test_a_batch_over_the_body_limit_is_split_and_a_huge_attempt_gets_a_verdict(
    tmp_path: Path,
) -> None:
    # Long proofs must not turn a whole check() into an exception: the batch is halved until it
    # fits the sandbox service's body limit, and an attempt too big on its own is a Verdict.
    from leanrl._sandbox_config import ServiceLimits

    rt = runtime(tmp_path, batch_size=4, service=ServiceLimits(max_body_bytes=4096))
    proofs = ["ok", "x" * 1500, "ok", "y" * 6000]  # batch ~9 KB; the last alone ~6 KB
    attempts = [attempt(p, id=f"a{i}") for i, p in enumerate(proofs)]
    async with rt:
        verdicts = await rt.check(attempts)
    assert [v.id for v in verdicts] == ["a0", "a1", "a2", "a3"]
    assert [v.reason for v in verdicts] == [Reason.OK, Reason.ERROR, Reason.OK, Reason.INFRA]
    assert "max_body_bytes" in verdicts[3].detail


async def test_sessions_after_a_restart_do_not_use_the_closed_pools_sandboxes(
    tmp_path: Path,
) -> None:
    rt = runtime(tmp_path, sessions_per_sandbox=2)
    async with rt.tactic_session("") as old:
        await old.start("theorem a : 1 = 1 := by")
        await rt.close()  # the runtime goes away under an open session ...
        await rt.start()  # ... and comes back
        async with rt.tactic_session("") as new:  # must not land on the terminated sandbox
            st = await new.start("theorem b : 1 = 1 := by")
            assert (await new.apply(st.proof_state or 0, "rfl")).solved
    await rt.close()


async def test_a_sandbox_that_fails_to_spawn_leaves_no_folder_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The test suite used to leave /tmp/leanrl-sandbox-* folders: one was made before the
    # process started, and nothing removed it when the start failed or was cancelled.
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    be = LocalProcessBackend([], python=str(tmp_path / "no-such-python"))
    with pytest.raises(OSError):
        await be.create()
    assert not list(tmp_path.glob("leanrl-sandbox-*"))
    await be.close()
