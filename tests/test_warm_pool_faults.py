"""The warm pool when its backend misbehaves: liveness checks that raise, sandboxes that never get
healthy. Sandboxes here are small in-process objects (the pool logic is what is tested; real
processes are in test_warm_pool.py)."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass

from leanrl._sandbox_config import PoolConfig
from leanrl.service.pool import WarmPool
from leanrl.service.sandbox import Sandbox, SandboxBackend

_ids = itertools.count()


@dataclass(eq=False)
class FakeSandbox(Sandbox):
    dead: bool = False
    alive_raises: int = 0
    """How many more alive() calls raise (an engine that does not answer)."""
    terminate_s: float = 0.0
    """How long terminating takes (a provider's API call)."""
    stopped: bool = False
    """Set once terminate() has really finished."""

    async def alive(self) -> bool:
        if self.alive_raises:
            self.alive_raises -= 1
            raise TimeoutError("docker inspect did not answer")
        return not self.dead and self.terminated_at is None

    async def terminate(self) -> None:
        if self.terminated_at is None:
            await asyncio.sleep(self.terminate_s)
            self.stopped = True
            self.terminated_at = asyncio.get_running_loop().time()


class FakeBackend(SandboxBackend):
    name = "fake"

    def __init__(self, alive_raises_first: int = 0) -> None:
        super().__init__()
        self.made: list[FakeSandbox] = []
        self.alive_raises_first = alive_raises_first

    async def create(self) -> Sandbox:
        sb = FakeSandbox(id=f"fake-{next(_ids)}", url="http://fake")
        if not self.made:
            sb.alive_raises = self.alive_raises_first
        self.made.append(sb)
        return sb


async def healthy(sb: Sandbox) -> bool:
    # Stands in for a service whose Lean processes run isolated, so the pool may reuse it
    # (reuse without isolation: tests/test_sandbox_reuse.py).
    sb.note_isolation(True)
    return True


async def wait_for(cond, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    for _ in range(int(timeout_s / 0.02)):
        if cond():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


async def test_a_liveness_check_that_raises_does_not_stop_the_health_checks() -> None:
    be = FakeBackend()
    pool = WarmPool(
        be, PoolConfig(target_ready=1, max_sandboxes=2, health_interval_s=0.05), healthy
    )
    await pool.start()
    try:
        first = be.made[0]
        first.alive_raises = 1  # the engine does not answer once ...
        await wait_for(lambda: first.alive_raises == 0)
        first.dead = True  # ... and later the sandbox dies: it must still be replaced
        await wait_for(lambda: pool.state()["replaced_dead"] >= 1 and pool.state()["ready"] == 1)
        assert first.terminated_at is not None
    finally:
        await pool.close()


async def test_a_sandbox_whose_start_check_raises_is_terminated_not_leaked() -> None:
    be = FakeBackend(alive_raises_first=1)
    pool = WarmPool(be, PoolConfig(target_ready=1, max_sandboxes=1), healthy)
    await pool.start()  # the first start fails, the pool retries and a second one is ready
    try:
        first = be.made[0]
        assert first.terminated_at is not None
        assert pool.state()["create_failures"] == 1 and pool.state()["terminated"] == 1
        assert pool.state()["ready"] == 1 and be.made[1].terminated_at is None
    finally:
        await pool.close()
    assert all(sb.terminated_at is not None for sb in be.made)


async def test_closing_right_after_a_retirement_still_terminates_the_retired_sandbox() -> None:
    # max_uses=1: releasing retires the sandbox in the background; a close() right after must
    # wait for that termination, not cancel it (a cancelled one may leave a billed sandbox up).
    be = FakeBackend()
    pool = WarmPool(be, PoolConfig(target_ready=1, max_sandboxes=2, max_uses=1), healthy)
    await pool.start()
    sb = await pool.acquire()
    assert isinstance(sb, FakeSandbox)
    sb.terminate_s = 0.3
    await pool.release(sb, ok=True)
    await pool.close()
    assert sb.stopped
    assert all(x.stopped for x in be.made)
