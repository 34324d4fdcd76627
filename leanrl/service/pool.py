"""A warm pool of sandboxes, shared by the ``docker`` and ``modal`` runtimes.

The pool keeps ``target_ready`` sandboxes started and idle, so a batch takes one without waiting
for a cold start. It refills in the background as sandboxes are taken, replaces sandboxes that
die (checked every ``health_interval_s``) or pass ``max_age_s`` (only while idle), and retires
a sandbox after ``max_uses`` batches. Never more than ``max_sandboxes`` exist at once.
``target_ready = "auto"`` follows the measured load instead (:meth:`WarmPool.target_ready`).

A sandbox serves a second batch only when its Lean processes are isolated from each other
(``Sandbox.isolated``, from its ``/health``), unless ``reuse = "always"``: without bubblewrap,
code one attempt runs could leave files or processes behind that change a later batch's
verdicts, so such a sandbox is used once (:meth:`WarmPool.reusable`).

Billing starts when a sandbox's creation begins and ends when it is terminated; the pool keeps
those totals (:meth:`WarmPool.state`) so the runtimes can report what a run cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from leanrl._sandbox_config import PoolConfig
from leanrl.errors import RuntimeUnavailable
from leanrl.service.sandbox import Sandbox, SandboxBackend

__all__ = ["PoolUnavailable", "WarmPool"]

log = logging.getLogger("leanrl.pool")

Probe = Callable[[Sandbox], Awaitable[bool]]
OnRetire = Callable[[Sandbox], Awaitable[None]]

_FAIL_FAST = 3
"""Consecutive failed creations after which waiting batches give up at once."""


class PoolUnavailable(RuntimeUnavailable):
    """No sandbox could be had in time (the message has the backend's last error)."""


class WarmPool:
    """Hands out ready sandboxes; see the module docstring. Call :meth:`start` first."""

    def __init__(
        self,
        backend: SandboxBackend,
        config: PoolConfig,
        probe: Probe,
        on_retire: OnRetire | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend = backend
        # Measurements behind ``target_ready = "auto"`` (moving averages, in seconds); the clock
        # is injectable so tests can drive them without sleeping.
        self._clock = clock
        self._last_acquire: float | None = None
        self._interval_ema: float | None = None
        self._start_ema: float | None = None
        self.config = config
        self._probe = probe
        self._on_retire = on_retire
        self._ready: deque[Sandbox] = deque()
        self._busy: set[Sandbox] = set()
        self._starting = 0
        self._waiters = 0
        self._cond: asyncio.Condition | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._terminations: set[asyncio.Task[Any]] = set()
        self._maintainer: asyncio.Task[None] | None = None
        self._closed = False
        self._started = False
        self._fail_streak = 0
        self.last_error = ""
        self._told_unisolated = False
        self.stats: dict[str, float] = {
            "created": 0,
            "create_failures": 0,
            "replaced_dead": 0,
            "replaced_aged": 0,
            "retired_used": 0,
            "retired_unisolated": 0,
            "discarded_failed": 0,
            "terminated": 0,
            "cold_acquires": 0,
            "warm_acquires": 0,
            "sandbox_s_terminated": 0.0,
            "cpu_used_s_terminated": 0.0,
            "cpu_reserved_s_terminated": 0.0,
        }

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self, wait_ready: bool = True) -> None:
        """Start the backend and the background refill; with ``wait_ready``, wait until one
        sandbox answers (raises :class:`PoolUnavailable` with the reason if none can)."""
        if self._started:
            return
        self._started = True
        self._cond = asyncio.Condition()
        await self.backend.start()
        self._maintainer = asyncio.create_task(self._maintain())
        async with self._cond:
            self._rebalance()
        if wait_ready and self.target_ready() > 0:
            await self._wait_first_ready()

    async def _wait_first_ready(self) -> None:
        cond = self._need_cond()
        deadline = time.monotonic() + self.config.start_timeout_s
        async with cond:
            while not self._ready:
                if self._fail_streak >= _FAIL_FAST:
                    raise PoolUnavailable(
                        f"{self.backend.name} sandboxes fail to start "
                        f"({self._fail_streak} times in a row): {self.last_error}"
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise PoolUnavailable(
                        f"no {self.backend.name} sandbox became ready within "
                        f"{self.config.start_timeout_s:g} s; last error: {self.last_error}"
                    )
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(cond.wait(), remaining)

    async def close(self) -> None:
        """Terminate every sandbox (ready, starting or busy) and stop the refill. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._maintainer is not None:
            self._maintainer.cancel()
        # Creations are cancelled (each terminates what it started); terminations already under
        # way are awaited, never cancelled: a cancelled one could leave a billed sandbox running.
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*self._terminations, return_exceptions=True)
        if self._maintainer is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._maintainer
        doomed = list(self._ready) + list(self._busy)
        self._ready.clear()
        self._busy.clear()
        await asyncio.gather(*(self._terminate(sb) for sb in doomed), return_exceptions=True)
        if self._cond is not None:
            async with self._cond:
                self._cond.notify_all()
        await self.backend.close()

    # -- taking and returning ---------------------------------------------------------------

    async def acquire(self, timeout_s: float | None = None) -> Sandbox:
        """A ready sandbox, now if one is idle, else after a cold start (or a release)."""
        cond = self._need_cond()
        self._note_acquire()
        limit = timeout_s or self.config.acquire_timeout_s
        deadline = time.monotonic() + limit
        waited = False
        async with cond:
            while True:
                if self._closed:
                    raise PoolUnavailable("the sandbox pool is closed")
                now = time.monotonic()
                while self._ready:
                    sb = self._ready.popleft()
                    if sb.age_s(now) > self.config.max_age_s:
                        self._retire(sb, "replaced_aged")
                        continue
                    # Checked again here, not only on release: a health check may have taken
                    # the sandbox's isolation back while it waited.
                    if sb.uses and not self.reusable(sb):
                        self._retire(sb, "retired_unisolated")
                        continue
                    self._busy.add(sb)
                    self.stats["cold_acquires" if waited else "warm_acquires"] += 1
                    self._rebalance()  # refill behind the one just taken
                    return sb
                if self._fail_streak >= _FAIL_FAST and not self._busy:
                    # The backend is broken: fail now with its error instead of waiting out
                    # the timeout. The pool keeps retrying in the background.
                    raise PoolUnavailable(
                        f"{self.backend.name} sandboxes fail to start "
                        f"({self._fail_streak} times in a row): {self.last_error}"
                    )
                remaining = deadline - now
                if remaining <= 0:
                    raise PoolUnavailable(
                        f"no {self.backend.name} sandbox became ready within {limit:g} s"
                        + (f"; last error: {self.last_error}" if self.last_error else "")
                    )
                waited = True
                # Counted as waiting only while waiting, so the refill starts one for us.
                self._waiters += 1
                try:
                    self._rebalance()
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(cond.wait(), remaining)
                finally:
                    self._waiters -= 1

    async def release(self, sb: Sandbox, ok: bool, count_use: bool = True) -> None:
        """Give ``sb`` back. ``ok=False`` (it failed or may be broken) terminates it."""
        cond = self._need_cond()
        async with cond:
            self._busy.discard(sb)
            if count_use:
                sb.uses += 1
            if self._closed:
                self._spawn_terminate(sb)
            elif not ok:
                self._retire(sb, "discarded_failed")
            elif self.config.max_uses and sb.uses >= self.config.max_uses:
                self._retire(sb, "retired_used")
            elif sb.uses and not self.reusable(sb):
                self._retire(sb, "retired_unisolated")
            elif sb.age_s() > self.config.max_age_s:
                self._retire(sb, "replaced_aged")
            else:
                self._ready.append(sb)
            self._rebalance()
            cond.notify_all()

    def reusable(self, sb: Sandbox) -> bool:
        """Whether ``sb`` may serve another batch after one: its Lean processes are isolated,
        or ``reuse = "always"``. The first refusal (and the first reuse of an unisolated
        sandbox under ``always``) is logged with the sandbox's reason."""
        if sb.isolated:
            return True
        why = sb.isolation_note or "its service does not report isolated Lean processes"
        if self.config.reuse == "always":
            if not self._told_unisolated:
                self._told_unisolated = True
                log.warning(
                    "%s sandbox %s serves more batches although its Lean processes are not "
                    'isolated from each other (%s), because pool.reuse = "always": code one '
                    "attempt runs may change later batches' verdicts. Use this only for proofs "
                    "from a trusted source.",
                    self.backend.name,
                    sb.id,
                    why,
                )
            return True
        if not self._told_unisolated:
            self._told_unisolated = True
            log.warning(
                "%s sandbox %s: its Lean processes are not isolated from each other (%s), so "
                'each sandbox serves one batch and is then replaced (pool.reuse = "auto"): '
                "code one attempt runs must not reach a later batch. For sandboxes that serve "
                "many batches, make bubblewrap work inside them (RuntimeConfig.isolate, "
                'docs/sandboxes.md); pool.reuse = "always" reuses them anyway, for proofs '
                "from a trusted source only.",
                self.backend.name,
                sb.id,
                why,
            )
        return False

    # -- state ------------------------------------------------------------------------------

    def state(self) -> dict[str, float]:
        """Pool gauges and counters, plus billing totals (terminated and live sandboxes)."""
        now = time.monotonic()
        live = list(self._ready) + list(self._busy)
        live_s = sum(sb.lifetime_s(now) for sb in live)
        live_reserved = sum(sb.lifetime_s(now) * sb.cpu for sb in live)
        live_used = sum(sb.cpu_seconds() or 0.0 for sb in live)
        return {
            "ready": len(self._ready),
            "busy": len(self._busy),
            "starting": self._starting,
            "waiting": self._waiters,
            "target_ready": self.target_ready(),
            "pool_target_ready": self.target_ready(),
            **self.stats,
            "sandbox_s": self.stats["sandbox_s_terminated"] + live_s,
            "cpu_reserved_s": self.stats["cpu_reserved_s_terminated"] + live_reserved,
            "cpu_used_s": self.stats["cpu_used_s_terminated"] + live_used,
        }

    def target_ready(self) -> int:
        """Sandboxes to keep ready now: ``config.target_ready``, or with ``"auto"`` Little's
        law on the measured load, ceil(rate x start time) + 1, within
        ``[auto_min_ready, max_sandboxes]``. Before both are measured: ``auto_min_ready``."""
        cfg = self.config
        if cfg.target_ready != "auto":
            return cfg.target_ready
        lo, hi = min(cfg.auto_min_ready, cfg.max_sandboxes), cfg.max_sandboxes
        if self._interval_ema is None or self._start_ema is None:
            return lo
        # Batches arriving while one sandbox starts must each find one ready; +1 covers the
        # batch that arrives as the refill begins.
        in_flight = self._start_ema / max(self._interval_ema, 1e-9)
        return max(lo, min(hi, math.ceil(in_flight - 1e-9) + 1))

    # -- internals --------------------------------------------------------------------------

    def _ema(self, old: float | None, new: float) -> float:
        a = self.config.auto_smoothing
        return new if old is None else a * new + (1 - a) * old

    def _note_acquire(self) -> None:
        now = self._clock()
        if self._last_acquire is not None:
            self._interval_ema = self._ema(self._interval_ema, max(0.0, now - self._last_acquire))
        self._last_acquire = now

    def _need_cond(self) -> asyncio.Condition:
        if self._cond is None:
            raise RuntimeUnavailable("the sandbox pool was not started; call start() first")
        return self._cond

    def _rebalance(self) -> None:
        # Called with the condition held: start sandboxes until ready + starting covers the
        # target plus everyone waiting, within max_sandboxes.
        if self._closed:
            return
        have = len(self._ready) + self._starting
        want = self.target_ready() + max(0, self._waiters - len(self._ready))
        room = self.config.max_sandboxes - (have + len(self._busy))
        for _ in range(max(0, min(want - have, room))):
            self._starting += 1
            self._spawn_task(self._create_one())

    def _spawn_terminate(self, sb: Sandbox) -> None:
        task = asyncio.ensure_future(self._terminate(sb))
        self._terminations.add(task)
        task.add_done_callback(self._terminations.discard)

    def _spawn_task(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _create_one(self) -> None:
        cond = self._need_cond()
        sb: Sandbox | None = None
        error = ""
        began = self._clock()
        try:
            sb = await self.backend.create()
            t0 = time.monotonic()
            if not await self._wait_healthy(sb):
                waited = time.monotonic() - t0
                if await sb.alive():
                    error = (
                        f"sandbox {sb.id} did not answer /health within "
                        f"{self.config.start_timeout_s:g} s"
                    )
                else:  # it died: say so, and why, instead of blaming a timeout
                    why = ""
                    with contextlib.suppress(Exception):
                        why = await sb.exit_reason()
                    error = f"sandbox {sb.id} exited after {waited:.1f} s while starting" + (
                        f": {why}" if why else " (no exit reason available)"
                    )
                await self._terminate(sb)
                sb = None
        except asyncio.CancelledError:
            if sb is not None:
                await asyncio.shield(self._terminate(sb))
            async with cond:
                self._starting -= 1
            raise
        except Exception as e:  # noqa: BLE001 - recorded and retried with backoff
            error = f"{type(e).__name__}: {e}"
            if sb is not None:  # created, then its start-up check failed: never leave it running
                await self._terminate(sb)
            sb = None
        if sb is None:
            self.stats["create_failures"] += 1
            self._fail_streak += 1
            self.last_error = error
            log.warning("%s sandbox failed to start: %s", self.backend.name, error)
            # Back off so a broken backend is not hammered; waiters see the streak meanwhile.
            async with cond:
                cond.notify_all()
            await asyncio.sleep(min(30.0, 0.1 * 2 ** min(self._fail_streak, 8)))
        async with cond:
            self._starting -= 1
            if sb is not None:
                self._fail_streak = 0
                self.stats["created"] += 1
                self._start_ema = self._ema(self._start_ema, self._clock() - began)
                if self._closed:
                    self._spawn_terminate(sb)
                else:
                    self._ready.append(sb)
            self._rebalance()
            cond.notify_all()

    async def _wait_healthy(self, sb: Sandbox) -> bool:
        deadline = time.monotonic() + self.config.start_timeout_s
        delay = 0.05
        while time.monotonic() < deadline:
            if not await sb.alive():
                return False
            with contextlib.suppress(Exception):
                if await self._probe(sb):
                    return True
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 1.0)
        return False

    def _retire(self, sb: Sandbox, why: str) -> None:
        self.stats[why] += 1
        self._spawn_terminate(sb)

    async def _terminate(self, sb: Sandbox) -> None:
        if sb.terminated_at is not None:
            return
        used = sb.cpu_seconds()
        try:
            await sb.terminate()
        except Exception as e:  # noqa: BLE001 - a failed terminate must not stop the others
            log.warning("terminating sandbox %s failed: %s", sb.id, e)
        if sb.terminated_at is None:
            sb.terminated_at = time.monotonic()
        self.stats["terminated"] += 1
        self.stats["sandbox_s_terminated"] += sb.lifetime_s()
        self.stats["cpu_reserved_s_terminated"] += sb.lifetime_s() * sb.cpu
        self.stats["cpu_used_s_terminated"] += used or 0.0
        if self._on_retire is not None:
            with contextlib.suppress(Exception):
                await self._on_retire(sb)

    async def _maintain(self) -> None:
        # Health-check idle sandboxes; replace dead and over-age ones; keep the target.
        cond = self._need_cond()
        while not self._closed:
            await asyncio.sleep(self.config.health_interval_s)
            try:
                await self._check_idle(cond)
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad round must not end the health checks
                log.exception("%s pool health check failed; trying again", self.backend.name)

    async def _check_idle(self, cond: asyncio.Condition) -> None:
        for sb in list(self._ready):
            if sb.age_s() > self.config.max_age_s:
                why = "replaced_aged"
            else:
                try:
                    # A liveness check that cannot answer (an engine under load) says nothing
                    # about the sandbox: ask again next round.
                    healthy = await sb.alive()
                except Exception as e:  # noqa: BLE001
                    log.warning("liveness check of sandbox %s failed: %s", sb.id, e)
                    continue
                if healthy:
                    try:
                        healthy = await self._probe(sb)
                    except Exception:  # noqa: BLE001 - any probe failure means unhealthy
                        healthy = False
                if healthy:
                    continue
                why = "replaced_dead"
            async with cond:
                if sb in self._ready:
                    self._ready.remove(sb)
                    self._retire(sb, why)
        async with cond:
            self._rebalance()
            cond.notify_all()
