"""``target_ready = "auto"``: the warm pool sizes its ready set by Little's law on measured load.

The clock behind the measurements is injected: a fake backend moves it forward by a start time
on every creation and the test moves it between batches, so the figures are exact and nothing
depends on real timing.
"""

from __future__ import annotations

import pydantic
import pytest
from test_warm_pool_faults import FakeBackend, FakeSandbox, healthy, wait_for

from leanrl._sandbox_config import PoolConfig
from leanrl.service.pool import WarmPool
from leanrl.service.sandbox import Sandbox


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class TimedBackend(FakeBackend):
    """Creating a sandbox takes ``start_s`` seconds on the fake clock."""

    def __init__(self, clock: Clock, start_s: float) -> None:
        super().__init__()
        self.clock = clock
        self.start_s = start_s

    async def create(self) -> Sandbox:
        self.clock.now += self.start_s
        return await super().create()


async def run_batches(pool: WarmPool, clock: Clock, n: int, interval_s: float) -> None:
    for _ in range(n):
        clock.now += interval_s
        sb = await pool.acquire()
        await pool.release(sb, ok=True)


async def test_auto_target_follows_rate_times_start_time() -> None:
    clock = Clock()
    be = TimedBackend(clock, start_s=10.0)
    cfg = PoolConfig(target_ready="auto", max_sandboxes=8, health_interval_s=60)
    pool = WarmPool(be, cfg, healthy, clock=clock)
    assert pool.target_ready() == 1  # nothing measured yet: auto_min_ready
    await pool.start()
    # One batch every 2 s, sandboxes take 10 s to start: 5 arrive during a start, plus one.
    await run_batches(pool, clock, 6, interval_s=2.0)
    assert pool.target_ready() == 6
    assert pool.state()["pool_target_ready"] == 6
    await wait_for(lambda: len(pool._ready) >= 6)
    # Reused sandboxes (max_uses 0): the target, plus the one refilled behind the batch in use.
    assert len(be.made) == 7
    # The load drops to one batch every 40 s: the target falls back towards 10/40 -> 2.
    await run_batches(pool, clock, 20, interval_s=40.0)
    assert pool.target_ready() == 2
    await pool.close()


async def test_auto_target_is_clamped_to_max_sandboxes_and_min_ready() -> None:
    clock = Clock()
    be = TimedBackend(clock, start_s=100.0)
    cfg = PoolConfig(target_ready="auto", max_sandboxes=3, auto_min_ready=2, health_interval_s=60)
    pool = WarmPool(be, cfg, healthy, clock=clock)
    await pool.start()
    await run_batches(pool, clock, 5, interval_s=1.0)
    assert pool.target_ready() == 3  # Little's law says 101; max_sandboxes caps it
    await run_batches(pool, clock, 30, interval_s=10_000.0)
    assert pool.target_ready() == 2  # nearly idle: auto_min_ready holds
    assert all(isinstance(sb, FakeSandbox) for sb in be.made)
    await pool.close()


async def test_fixed_target_ignores_the_measurements() -> None:
    clock = Clock()
    be = TimedBackend(clock, start_s=10.0)
    pool = WarmPool(be, PoolConfig(target_ready=1, max_sandboxes=8), healthy, clock=clock)
    await pool.start()
    await run_batches(pool, clock, 6, interval_s=1.0)
    assert pool.target_ready() == 1 and pool.state()["pool_target_ready"] == 1
    await pool.close()


@pytest.mark.parametrize("bad", [-1, "fast", 1.5])
def test_bad_target_ready_is_refused(bad: object) -> None:
    with pytest.raises(pydantic.ValidationError, match="target_ready"):
        PoolConfig(target_ready=bad)  # type: ignore[arg-type]


def test_modal_warm_sandboxes_auto_reaches_the_pool() -> None:
    from leanrl._sandbox_config import ModalConfig
    from leanrl.runtime import RuntimeConfig
    from leanrl.runtimes.modal import ModalRuntime

    rt = ModalRuntime(RuntimeConfig(name="modal", modal=ModalConfig(warm_sandboxes="auto")))
    pool = rt.settings().pool
    assert pool.target_ready == "auto" and pool.max_sandboxes >= 1
