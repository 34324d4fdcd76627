"""A pool of warm Lean REPL processes, keyed by the header's imports.

- Each process loads its imports once (``import Mathlib``: seconds and gigabytes) and then checks
  attempt after attempt; headers that differ only in options/``open`` lines share processes.
- At most ``workers`` attempts are in flight; at most ``workers + spares`` processes live. As soon
  as a key is used, one spare process is warmed beside the busy ones, so when a process is killed
  (timeout, memory) the next attempt finds a warm one instead of waiting for ``import Mathlib``;
  the replacement is started at once in the background.
- Per-attempt time limit (kill and replace), per-process memory cap (RSS watch plus
  ``RLIMIT_DATA``), recycling after ``recycle_after`` attempts or above ``recycle_memory_mb``.
- Every attempt gets exactly one verdict: a dead, hung or memory-hungry process costs the attempt
  it was working on (``crash``/``timeout``/``memory``), never the others.
- Tactic sessions (:meth:`ReplPool.acquire`) get processes of their own: a process that ran model
  tactics never checks a proof. Tactic mode elaborates the model's text in the process itself, so
  a construct the pre-scan missed could leave state behind (swap a scratch pickle, change an
  option) that a later check would trust. Those processes form a separate warm sub-pool (key
  ``("tactic", *imports)`` beside ``("check", *imports)``) instead of being retired after each
  session, so a session still starts on a warm process without re-loading the imports. Both
  kinds share the ``workers + spares`` cap; an idle process of one kind is evicted when the
  other needs room.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections import deque
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from leanrl.lean.checker import split_header
from leanrl.lean.judge import judge_prescan
from leanrl.lean.protocol import ProtocolError
from leanrl.lean.repl import ReplDied, ReplMemory, ReplProcess, ReplTimeout
from leanrl.lean.worker import ReplWorker, WorkerStartError
from leanrl.verdict import Attempt, Reason, Verdict

__all__ = ["PoolConfig", "PoolError", "PoolStats", "ReplPool"]


class PoolConfig(BaseModel):
    """How the pool runs its REPL processes (built by the local runtime from RuntimeConfig)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    command: list[str]
    """The REPL command line (for example ``["lake", "env", ".../bin/repl"]``)."""
    cwd: Path | None = None
    """Folder to run it in (the Lean project)."""
    env: dict[str, str] | None = None
    """Environment variables for the process (None: inherit)."""
    workers: int = Field(default=1, ge=1)
    """Attempts in flight at once."""
    spares: int = Field(default=1, ge=0)
    """Warm processes kept beside the busy ones, so a kill does not stall the queue."""
    timeout_s: float = Field(default=60.0, gt=0)
    """Per-attempt wall-clock limit."""
    memory_mb: int | None = Field(default=8192, ge=16)
    """Per-process memory cap in MiB (None: no cap)."""
    recycle_after: int = Field(default=200, ge=1)
    """Replace a process after this many attempts."""
    recycle_memory_mb: int = Field(default=6144, ge=16)
    """Replace a process once its resident memory passes this many MiB."""
    isolate: bool = False
    """Run each process under bubblewrap (no network, read-only file system)."""
    startup_timeout_s: float = Field(default=600.0, gt=0)
    """How long a process may take to load its imports and the checker."""
    start_retries: int = Field(default=2, ge=1)
    """Failed starts in a row (not caused by the header) before a key's attempts get ``infra``."""


class PoolStats(BaseModel):
    """Counters, for tests, logs and the benchmark."""

    started: int = 0
    """Processes started successfully."""
    start_failures: int = 0
    """Processes that failed to start."""
    killed: int = 0
    """Processes killed after a timeout, memory overrun or crash."""
    recycled: int = 0
    """Processes retired after ``recycle_after`` attempts or above the memory threshold."""
    evicted: int = 0
    """Idle processes closed to make room for another header's imports."""
    checked: int = 0
    """Attempts that reached a Lean process."""
    start_seconds: float = 0.0
    """Total time spent starting processes."""
    max_busy: int = 0
    """Most attempts that were in Lean processes at the same time."""


class _Key:
    def __init__(self) -> None:
        self.ready: deque[ReplWorker] = deque()
        self.starting = 0
        self.waiting = 0
        self.fails = 0
        self.error: str | None = None
        self.last_used = 0.0


class PoolError(RuntimeError):
    """No process can be started for these imports (the detail says why)."""

    def __init__(self, detail: str, *, header_fault: bool) -> None:
        super().__init__(detail)
        self.header_fault = header_fault


class ReplPool:
    """Warm REPL processes per set of imports; ``await pool.check(attempts)``."""

    def __init__(self, config: PoolConfig) -> None:
        self.config = config
        self.stats = PoolStats()
        self._keys: dict[tuple[str, ...], _Key] = {}
        self._cond: asyncio.Condition | None = None
        self._sem: asyncio.Semaphore | None = None
        self._live = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._starts: set[asyncio.Task[None]] = set()
        self._busy: set[ReplWorker] = set()
        self._scratch: Path | None = None
        self._closed = False
        self.events: deque[tuple[str, int]] = deque(maxlen=10_000)
        """(event, pid) in the order they happened: ready, acquire, kill, retire (diagnostics)."""

    async def start(self) -> None:
        """Create the scratch folder and the locks. Processes start on demand."""
        if self._cond is None:
            self._cond = asyncio.Condition()
            self._sem = asyncio.Semaphore(self.config.workers)
            self._scratch = Path(tempfile.mkdtemp(prefix="leanrl-pool-"))
            self._closed = False

    async def warm(self, header: str, n: int | None = None) -> None:
        """Start ``n`` processes for ``header`` now (default: workers), plus the spares, and wait
        until they are all ready."""
        await self.start()
        key = self._key_of(header, "check")
        n = n or self.config.workers
        ws = [await self._acquire(key) for _ in range(n)]
        for w in ws:
            await self._release(key, w, healthy=True)
        assert self._cond is not None
        target = min(n + self.config.spares, self._cap)
        async with self._cond:
            k = self._keys[key]
            while len(k.ready) < target and k.error is None and (k.starting or k.ready):
                await self._cond.wait()

    # -- checking -------------------------------------------------------------------------------

    async def check(self, attempts: Sequence[Attempt]) -> list[Verdict]:
        """One verdict per attempt, in order."""
        await self.start()
        return list(await asyncio.gather(*(self.check_one(a) for a in attempts)))

    async def check_one(self, attempt: Attempt) -> Verdict:
        """Check one attempt; never raises for anything the attempt or Lean did.

        ``time_s`` is the time a Lean process spent on the attempt (not the wait for one).
        """
        clock = [time.monotonic()]
        try:
            verdict = await self._check(attempt, clock)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - an attempt must always get a verdict
            verdict = Verdict.reject(Reason.INFRA, f"internal error: {type(e).__name__}: {e}")
        elapsed = time.monotonic() - clock[0]
        return verdict.model_copy(update={"id": attempt.id, "time_s": elapsed})

    async def _check(self, attempt: Attempt, clock: list[float]) -> Verdict:
        early = judge_prescan(attempt)
        if early is not None:
            return early
        assert self._sem is not None
        key = self._key_of(attempt.header, "check")
        async with self._sem:
            try:
                worker = await self._acquire(key)
            except PoolError as e:
                reason = Reason.ERROR if e.header_fault else Reason.INFRA
                return Verdict.reject(reason, str(e))
            self.stats.checked += 1
            clock[0] = time.monotonic()
            try:
                verdict = await worker.check(attempt, self.config.timeout_s)
            except ReplTimeout as e:
                await self._discard(key, worker)
                return Verdict.reject(
                    Reason.TIMEOUT, f"time limit of {self.config.timeout_s:g} s exceeded ({e})"
                )
            except ReplMemory as e:
                await self._discard(key, worker)
                return Verdict.reject(Reason.MEMORY, str(e))
            except (ReplDied, ProtocolError, OSError) as e:
                memory = self._near_cap(worker)
                await self._discard(key, worker)
                if memory:
                    return Verdict.reject(
                        Reason.MEMORY,
                        f"the Lean process died near its memory cap of "
                        f"{self.config.memory_mb} MiB: {e}",
                    )
                return Verdict.reject(Reason.CRASH, f"the Lean process failed: {e}")
            except BaseException:
                await self._discard(key, worker)
                raise
            await self._release(key, worker, healthy=True)
            return verdict

    # -- pinning a process (tactic sessions) ----------------------------------------------------

    async def acquire(self, header: str) -> ReplWorker:
        """Take a warm tactic-mode process for ``header`` for exclusive use (raises
        :class:`PoolError`). It comes from the tactic sub-pool and goes back there: it never
        checks proofs."""
        await self.start()
        return await self._acquire(self._key_of(header, "tactic"))

    async def release(self, header: str, worker: ReplWorker, *, broken: bool = False) -> None:
        """Give a process from :meth:`acquire` back; a ``broken`` one is killed and replaced."""
        key = self._key_of(header, "tactic")
        if broken:
            await self._discard(key, worker)
        else:
            await self._release(key, worker, healthy=True)

    def _near_cap(self, w: ReplWorker) -> bool:
        cap = self.config.memory_mb
        if cap is None:
            return False
        return w.proc.out_of_memory() or w.proc.peak_rss_mb >= 0.8 * cap

    def _key_of(self, header: str, purpose: Literal["check", "tactic"]) -> tuple[str, ...]:
        """``(purpose, *imports)``: check and tactic processes never mix."""
        return (purpose, *split_header(header)[0])

    # -- the process book-keeping ---------------------------------------------------------------

    @property
    def _cap(self) -> int:
        return self.config.workers + self.config.spares

    async def _acquire(self, key: tuple[str, ...]) -> ReplWorker:
        assert self._cond is not None
        async with self._cond:
            k = self._keys.setdefault(key, _Key())
            k.waiting += 1
            try:
                while True:
                    if k.error is not None:
                        raise PoolError(k.error, header_fault=k.fails == 0)
                    if k.ready:
                        w = k.ready.popleft()
                        if not w.proc.alive:  # died while idle: forget it
                            self._live -= 1
                            continue
                        self._busy.add(w)
                        self.stats.max_busy = max(self.stats.max_busy, len(self._busy))
                        self._event("acquire", w)
                        k.last_used = time.monotonic()
                        self._top_up(key, k)
                        return w
                    if k.starting < k.waiting and not self._spawn_for(key, k):
                        pass  # no room: wait for a release
                    await self._cond.wait()
            finally:
                k.waiting -= 1

    def _top_up(self, key: tuple[str, ...], k: _Key) -> None:
        """Keep ``spares`` warm processes ready (or starting) for a key in use."""
        while len(k.ready) + k.starting < self.config.spares and self._live < self._cap:
            self._spawn(key, k)

    def _spawn_for(self, key: tuple[str, ...], k: _Key) -> bool:
        if self._live >= self._cap and not self._evict(key):
            return False
        self._spawn(key, k)
        return True

    def _evict(self, key: tuple[str, ...]) -> bool:
        """Close the least recently used idle process of another key."""
        others = [(kk, k) for kk, k in self._keys.items() if kk != key and k.ready]
        if not others:
            return False
        _, victim = min(others, key=lambda p: p[1].last_used)
        w = victim.ready.pop()
        self._live -= 1
        self.stats.evicted += 1
        self._background(w.close())
        return True

    def _spawn(self, key: tuple[str, ...], k: _Key) -> None:
        self._live += 1
        k.starting += 1
        task = asyncio.ensure_future(self._start_worker(key, k))
        self._starts.add(task)
        task.add_done_callback(self._starts.discard)

    def _background(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run a clean-up coroutine (closing a process) without waiting for it."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _start_worker(self, key: tuple[str, ...], k: _Key) -> None:
        cfg = self.config
        assert self._scratch is not None and self._cond is not None
        proc = ReplProcess(
            cfg.command,
            cwd=cfg.cwd,
            env=cfg.env,
            memory_mb=cfg.memory_mb,
            isolate=cfg.isolate,
            scratch=self._scratch,
        )
        w = ReplWorker(proc, key[1:], self._scratch)
        t0 = time.monotonic()
        error: WorkerStartError | None = None
        try:
            await w.start(cfg.startup_timeout_s)
        except asyncio.CancelledError:
            await w.proc.kill()
            raise
        except WorkerStartError as e:
            error = e
        except Exception as e:  # noqa: BLE001 - any start failure is reported the same way
            error = WorkerStartError(f"the Lean REPL did not start: {e}", header_fault=False)
        async with self._cond:
            k.starting -= 1
            if error is None and not self._closed:
                self.stats.started += 1
                self.stats.start_seconds += time.monotonic() - t0
                k.fails = 0
                k.ready.append(w)
                self._event("ready", w)
            else:
                self._live -= 1
                if error is not None:
                    self.stats.start_failures += 1
                    if error.header_fault:
                        k.fails = 0
                        k.error = error.detail
                    else:
                        k.fails += 1
                        if k.fails >= cfg.start_retries:
                            k.error = error.detail
            self._cond.notify_all()
        if error is not None or self._closed:
            await w.proc.kill()

    async def _release(self, key: tuple[str, ...], w: ReplWorker, *, healthy: bool) -> None:
        assert self._cond is not None
        recycle = healthy and (
            w.attempts >= self.config.recycle_after
            or w.proc.rss_mb() > self.config.recycle_memory_mb
        )
        async with self._cond:
            self._busy.discard(w)
            k = self._keys[key]
            if healthy and not recycle and not self._closed and w.proc.alive:
                k.ready.append(w)
            else:
                self._live -= 1
                self._event("retire", w)
                if recycle:
                    self.stats.recycled += 1
                self._background(w.close())
                if not self._closed:
                    self._top_up(key, k)
            self._cond.notify_all()

    async def _discard(self, key: tuple[str, ...], w: ReplWorker) -> None:
        """Kill a process that failed an attempt; a replacement starts at once."""
        self.stats.killed += 1
        self._event("kill", w)
        await w.proc.kill()
        assert self._cond is not None
        async with self._cond:
            self._busy.discard(w)
            self._live -= 1
            k = self._keys[key]
            if not self._closed:
                self._top_up(key, k)
                if k.waiting > k.starting:
                    self._spawn_for(key, k)
            self._cond.notify_all()

    def _event(self, what: str, w: ReplWorker) -> None:
        pid = w.proc.proc.pid if w.proc.proc is not None else -1
        self.events.append((what, pid))

    def live_processes(self) -> list[ReplProcess]:
        """The processes alive now (idle and busy), for tests and diagnostics."""
        procs = [w.proc for k in self._keys.values() for w in k.ready]
        return [p for p in procs + [w.proc for w in self._busy] if p.alive]

    async def close(self) -> None:
        """Stop every process and remove the scratch folder. Idempotent."""
        self._closed = True
        if self._cond is None:
            return
        async with self._cond:
            workers = [w for k in self._keys.values() for w in k.ready] + list(self._busy)
            for k in self._keys.values():
                k.ready.clear()
            self._cond.notify_all()
        await asyncio.gather(*(w.proc.kill() for w in workers), return_exceptions=True)
        for t in list(self._starts):
            t.cancel()
        await asyncio.gather(*self._starts, return_exceptions=True)
        # Closing processes: let them finish (each is bounded by a kill after a short wait).
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._live = 0
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
        self._cond = None
        self._sem = None
        self._keys.clear()
