"""Sandboxes serve a second batch only when their Lean processes are isolated from each other.

Without bubblewrap inside a sandbox, code one attempt manages to run while it is elaborated can
leave files or processes behind that change the verdicts of a later batch in the same sandbox.
So ``GET /health`` says whether the wrapped runtime's Lean processes run isolated, and the warm
pool (``PoolConfig.reuse = "auto"``, the default) gives a sandbox that does not say so exactly
one batch.

First the pool's rule with in-process sandboxes, then the whole path with real ``leanrl serve``
processes (the ``modal`` runtime's local backend) wrapping the real ``local`` runtime, whose Lean
processes are stand-in REPLs (tests/fake_repl.py, not Lean) under real bubblewrap or without it.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import pytest
from test_docker import docker_image  # noqa: F401 - a fixture, for the docker test below
from test_warm_pool_faults import FakeBackend

from leanrl._sandbox_config import ClientConfig, DockerConfig, ModalConfig, PoolConfig
from leanrl.lean.trust.containment import isolation_problem
from leanrl.runtime import RuntimeConfig
from leanrl.runtimes.docker import DockerRuntime
from leanrl.runtimes.local import LocalRuntime
from leanrl.runtimes.modal import ModalRuntime
from leanrl.service.app import VerificationService
from leanrl.service.client import ServiceClient
from leanrl.service.pool import WarmPool
from leanrl.service.sandbox import Sandbox
from leanrl.verdict import Attempt

TESTS = Path(__file__).resolve().parent
FAKE_REPL = [sys.executable, str(TESTS / "fake_repl.py")]


def saying(isolated: bool | None, note: str = "") -> Any:
    """A health probe whose service answers ``ok`` and says ``isolated``."""

    async def probe(sb: Sandbox) -> bool:
        sb.note_isolation(isolated, note)
        return True

    return probe


async def serve(pool: WarmPool, batches: int) -> list[Sandbox]:
    """The sandbox each of ``batches`` batches in a row was given."""
    served = []
    for _ in range(batches):
        sb = await pool.acquire()
        served.append(sb)
        await pool.release(sb, ok=True)
    return served


def warnings_from_pool(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "leanrl.pool" and r.levelno >= logging.WARNING
    ]


# -- the pool's rule --------------------------------------------------------------------------


async def test_isolated_sandboxes_serve_many_batches() -> None:
    pool = WarmPool(FakeBackend(), PoolConfig(max_sandboxes=2, health_interval_s=60), saying(True))
    await pool.start()
    try:
        served = await serve(pool, 6)
        # Nothing is retired, so at most 2 sandboxes ever exist: they take turns.
        assert len({id(sb) for sb in served}) <= 2
        assert pool.state()["retired_unisolated"] == 0
    finally:
        await pool.close()


@pytest.mark.parametrize(
    ("isolated", "why"),
    [(False, "runtime.isolate = false"), (None, "does not report isolated Lean processes")],
)
async def test_a_sandbox_that_does_not_report_isolation_serves_one_batch(
    isolated: bool | None, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "leanrl.pool")
    be = FakeBackend()
    cfg = PoolConfig(max_sandboxes=2, health_interval_s=60)  # max_uses 0: no cap of its own
    pool = WarmPool(
        be, cfg, saying(isolated, "runtime.isolate = false" if isolated is False else "")
    )
    await pool.start()
    try:
        served = await serve(pool, 5)
        assert len({id(sb) for sb in served}) == 5  # a fresh sandbox for every batch
        assert all(sb.uses == 1 for sb in served)
        assert pool.state()["retired_unisolated"] == 5 and pool.state()["retired_used"] == 0
    finally:
        await pool.close()
    assert all(sb.terminated_at is not None for sb in served)
    told = warnings_from_pool(caplog)
    assert len(told) == 1, told  # said once, not per batch
    assert why in told[0] and "one batch" in told[0] and 'reuse = "always"' in told[0]


async def test_reuse_always_reuses_an_unisolated_sandbox_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "leanrl.pool")
    cfg = PoolConfig(max_sandboxes=2, health_interval_s=60, reuse="always")
    pool = WarmPool(FakeBackend(), cfg, saying(False, "bubblewrap does not run here"))
    await pool.start()
    try:
        served = await serve(pool, 6)
        assert len({id(sb) for sb in served}) <= 2
        assert pool.state()["retired_unisolated"] == 0
    finally:
        await pool.close()
    told = warnings_from_pool(caplog)
    assert len(told) == 1 and "bubblewrap does not run here" in told[0] and "trusted" in told[0]


async def test_max_uses_1_retires_as_used_without_an_isolation_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "leanrl.pool")
    cfg = PoolConfig(max_sandboxes=2, health_interval_s=60, max_uses=1)
    pool = WarmPool(FakeBackend(), cfg, saying(False))
    await pool.start()
    try:
        await serve(pool, 3)
        assert pool.state()["retired_used"] == 3 and pool.state()["retired_unisolated"] == 0
    finally:
        await pool.close()
    assert warnings_from_pool(caplog) == []


async def test_isolation_taken_back_while_idle_is_never_given_again() -> None:
    pool = WarmPool(FakeBackend(), PoolConfig(max_sandboxes=2, health_interval_s=60), saying(True))
    await pool.start()
    try:
        (first,) = await serve(pool, 1)
        assert first.isolated is True and first in pool._ready
        # A later health check of the idle sandbox says its processes are no longer isolated.
        first.note_isolation(False, "bubblewrap stopped working")
        first.note_isolation(True)  # and a later answer cannot give it back
        assert first.isolated is False and first.isolation_note == "bubblewrap stopped working"
        later = await serve(pool, 3)
        assert all(sb is not first for sb in later)
        assert first.terminated_at is not None and pool.state()["retired_unisolated"] == 1
    finally:
        await pool.close()


async def test_a_sandbox_that_checked_nothing_may_be_taken_again() -> None:
    # A request the service refused before running anything (413: the batch is halved and
    # sent again) is no use: even an unisolated sandbox ran no attempt's code.
    pool = WarmPool(FakeBackend(), PoolConfig(max_sandboxes=1, health_interval_s=60), saying(None))
    await pool.start()
    try:
        sb = await pool.acquire()
        await pool.release(sb, ok=True, count_use=False)
        assert await pool.acquire() is sb
        await pool.release(sb, ok=True)
        assert pool.state()["retired_unisolated"] == 1  # now it checked a batch: retired
    finally:
        await pool.close()


def test_reuse_defaults_to_auto_on_modal_and_docker() -> None:
    modal = ModalRuntime(RuntimeConfig(name="modal")).settings().pool
    assert modal.reuse == "auto" and modal.max_uses == 0  # reused where isolated
    docker = DockerRuntime(RuntimeConfig(name="docker")).settings().pool
    assert DockerConfig().pool.reuse == "auto" and docker.reuse == "auto"
    always = RuntimeConfig(name="modal", modal=ModalConfig(pool=PoolConfig(reuse="always")))
    assert ModalRuntime(always).settings().pool.reuse == "always"


# -- what the local runtime and the service report -------------------------------------------


def local_runtime(isolate: bool | None) -> LocalRuntime:
    options = {"repl_command": FAKE_REPL, "spares": 0}
    return LocalRuntime(RuntimeConfig(workers=1, timeout_s=10.0, isolate=isolate, options=options))


async def test_the_local_runtime_and_health_say_whether_lean_runs_isolated() -> None:
    rt = local_runtime(isolate=False)
    service = VerificationService(rt)
    assert rt.isolation() == (None, "")
    assert service.health().isolated is None  # starting: nothing said yet
    await service.start()
    try:
        assert rt.isolation() == (False, "runtime.isolate = false")
        health = service.health()
        assert health.isolated is False and health.isolation_note == "runtime.isolate = false"
    finally:
        await service.close()
    assert rt.isolation() == (None, "")


@pytest.mark.skipif(isolation_problem() is not None, reason=f"no bubblewrap: {isolation_problem()}")
async def test_the_local_runtime_reports_isolated_where_bubblewrap_works() -> None:
    service = VerificationService(local_runtime(isolate=None))
    await service.start()
    try:
        health = service.health()
        assert health.isolated is True and health.isolation_note == ""
    finally:
        await service.close()


# -- end to end: real service processes, the real local runtime, stand-in Lean -----------------


def sandboxed(isolate: bool | None) -> ModalRuntime:
    cfg = ModalConfig(
        backend="local",
        local_runtime="local",
        warm_sandboxes=1,
        cpu=1.0,
        batch_size=2,
        pool=PoolConfig(max_sandboxes=2, health_interval_s=60),
        client=ClientConfig(retries=1, backoff_s=0.05),
        # a command line as one string: the options are scalars (no spaces in these paths)
        inner_options={"repl_command": " ".join(FAKE_REPL), "spares": 0},
    )
    return ModalRuntime(
        RuntimeConfig(name="modal", workers=1, timeout_s=20.0, isolate=isolate, modal=cfg)
    )


def record_batches(rt: ModalRuntime, monkeypatch: pytest.MonkeyPatch) -> list[Sandbox]:
    """The sandbox every ``POST /check`` went to, seen from outside the pool (the list holds
    them, so no two are ever confused by a reused ``id()``)."""
    served: list[Sandbox] = []
    real = rt._client

    class Spy:
        def __init__(self, sb: Sandbox) -> None:
            self._sb, self._client = sb, real(sb)

        async def check(self, *args: Any, **kwargs: Any) -> Any:
            served.append(self._sb)
            return await self._client.check(*args, **kwargs)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._client, name)

    monkeypatch.setattr(rt, "_client", Spy)
    return served


def attempt(i: int) -> Attempt:
    return Attempt(
        name="t",
        header="import Mathlib\n",
        formal_statement="theorem t : 1 = 1 := by",
        proof="rfl",
        id=str(i),
    )


async def health_of(sb: Sandbox) -> Any:
    async with ServiceClient(sb.url, sb.token) as c:
        return await c.health(retries=0, timeout_s=10)


@pytest.mark.slow
async def test_unisolated_service_processes_never_get_a_second_batch(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "leanrl.pool")
    rt = sandboxed(isolate=False)
    served = record_batches(rt, monkeypatch)
    async with rt:
        assert rt.pool is not None
        sb = await rt.pool.acquire()
        health = await health_of(sb)
        assert health.isolated is False and health.isolation_note == "runtime.isolate = false"
        await rt.pool.release(sb, ok=True, count_use=False)  # it checked nothing
        for i in range(4):
            (v,) = await rt.check([attempt(i)])
            assert v.accepted, v
        state = rt.metrics()
    assert len(served) == 4 and len({id(sb) for sb in served}) == 4
    assert state["pool_retired_unisolated"] == 4 and state["pool_created"] >= 4
    told = warnings_from_pool(caplog)
    assert len(told) == 1 and "runtime.isolate = false" in told[0], told


@pytest.mark.slow
@pytest.mark.skipif(isolation_problem() is not None, reason=f"no bubblewrap: {isolation_problem()}")
async def test_isolated_service_processes_serve_many_batches(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "leanrl.pool")
    rt = sandboxed(isolate=None)  # bubblewrap wherever it works: here it does
    served = record_batches(rt, monkeypatch)
    async with rt:
        for i in range(4):
            (v,) = await rt.check([attempt(i)])
            assert v.accepted, v
        state = rt.metrics()
    assert len(served) == 4 and len({id(sb) for sb in served}) < 4  # some served several
    assert all(sb.isolated is True for sb in served)
    assert state["pool_retired_unisolated"] == 0 and state["pool_created"] <= 2
    assert warnings_from_pool(caplog) == []


# -- the docker runtime: the same rule for containers -------------------------------------------


@pytest.mark.docker
@pytest.mark.parametrize("isolated", [True, None])
async def test_docker_containers_are_reused_only_when_they_report_isolation(
    docker_image: str,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    isolated: bool | None,
) -> None:
    from _service_testing import attempt as echo_attempt
    from test_docker import config as docker_config

    rc = docker_config(docker_image, tmp_path)
    options = dict(rc.docker.inner_options)
    if isolated is not None:  # the echo runtime says what it is told to; unset: says nothing
        options["isolated"] = isolated
    rc = rc.model_copy(update={"docker": rc.docker.model_copy(update={"inner_options": options})})
    rt = DockerRuntime(rc)
    served = record_batches(rt, monkeypatch)
    async with rt:
        for i in range(3):
            (v,) = await rt.check([echo_attempt("ok", id=str(i))])
            assert v.accepted
        state = rt.metrics()
    assert len(served) == 3
    if isolated:
        assert len({id(sb) for sb in served}) < 3 and state["pool_retired_unisolated"] == 0
    else:
        assert len({id(sb) for sb in served}) == 3 and state["pool_retired_unisolated"] == 3


@pytest.mark.slow
@pytest.mark.parametrize("isolated", [True, None])
async def test_overlapping_tactic_sessions_do_not_keep_an_unisolated_sandbox_for_ever(
    isolated: bool | None,
) -> None:
    options: dict[str, str | int | float | bool] = {}
    if isolated is not None:
        options["isolated"] = isolated
    cfg = ModalConfig(
        backend="local",
        local_runtime="_echo_runtime:EchoRuntime",
        local_pythonpath=[TESTS],
        warm_sandboxes=1,
        cpu=1.0,
        sessions_per_sandbox=2,
        pool=PoolConfig(max_sandboxes=3, health_interval_s=60),
        inner_options=options,
    )
    rt = ModalRuntime(RuntimeConfig(name="modal", modal=cfg))
    async with rt:
        first = rt.tactic_session("import Mathlib")
        second = rt.tactic_session("import Mathlib")
        third = rt.tactic_session("import Mathlib")
        await first.__aenter__()
        await second.__aenter__()  # two sessions share the sandbox
        await first.__aexit__(None, None, None)
        await third.__aenter__()  # while the second is still open
        hosts = {id(h.sandbox) for h in rt._session_hosts}
        await second.__aexit__(None, None, None)
        await third.__aexit__(None, None, None)
    # Isolated: the third joins the open sandbox. Not: that sandbox has had its two sessions.
    assert len(hosts) == (1 if isolated else 2)
