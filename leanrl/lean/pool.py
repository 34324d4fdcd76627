"""A pool of warm Lean REPL processes, keyed by the header's imports and by role.

Three roles never share a process (the key is ``(role, *imports)``):

- ``elab``: elaborates attempts. It runs model text, so its answers can only reject.
- ``judge``: the trusted checker (:mod:`leanrl.lean.trust.judge`). It loads the checker and only
  ever elaborates the taskset's own text; it reads each attempt's compiled constants as data,
  replays them through the kernel, and its report is the only thing that can accept a proof.
- ``tactic``: REPL tactic-mode sessions (:meth:`ReplPool.acquire`); model tactics run there, and
  such a process never elaborates a whole attempt or checks anything.

Every process has a private folder (under one :class:`~leanrl.lean.trust.containment.ScratchRoot`
per pool), a minimal environment, and -- with ``isolate`` -- a bubblewrap sandbox in which it
sees only that folder (a judge also sees the hand-off folder, read-only).

Speed: each process loads its imports once (``import Mathlib``: seconds and gigabytes) and then
works attempt after attempt. At most ``workers`` attempts are in elaboration at once; as soon as
a key is used, ``spares`` warm processes wait beside the busy ones, so a process killed for a
timeout or memory is replaced without waiting for an import. Judges are fewer (``judges``):
checking compiled constants and replaying them through the kernel takes a fraction of the time
elaboration took. An elaborating process is released before its attempt waits for a judge, so
elaboration of the next attempt overlaps the check of this one.

Every attempt gets exactly one verdict: a dead, hung, flooding or memory-hungry process costs the
attempt it was working on (``crash``/``timeout``/``memory``), never the others, and is replaced.
A process that died under an attempt may have been killed from outside, so the attempt is first
run again on a fresh process (``crash_retries``); only a death that repeats is its ``crash``.
A judge is different: it only ever runs trusted text, so a judge that dies, hangs or fills its
memory while it checks an attempt was brought down by that attempt's terms (a restated statement
the judge evaluates): ``judge_limit``, never retried, and the judge is replaced.

Starts that keep failing (a REPL that dies or hangs while it loads) never hold attempts hostage:
while a key's starts fail, one start is tried at a time, and after ``start_retries`` failures in
a row the next waits out the back-off; an attempt that finds no process waits for at most the
start under way, and gets ``infra`` otherwise -- however many workers wait.

Tactic sessions pin processes of the same cap as elaboration, but never the last
``check_reserve`` of them: sessions held open (or abandoned) cannot starve checks.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections import deque
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

from leanrl.lean.pool_config import PoolConfig, PoolStats, tactic_capacity
from leanrl.lean.pool_keys import KeyState, PoolError, Role, group_of
from leanrl.lean.protocol import ProtocolError
from leanrl.lean.repl import ReplDied, ReplGone, ReplMemory, ReplProcess, ReplTimeout
from leanrl.lean.source import split_header
from leanrl.lean.trust.containment import ScratchRoot, bwrap_argv, minimal_env, process_needs
from leanrl.lean.trust.judge import (
    CHECK_FLOOR_S,
    JudgeLimit,
    JudgeStartError,
    JudgeWorker,
    ReferenceProblem,
    take_pickle,
)
from leanrl.lean.trust.rules import judge_prescan, judge_report
from leanrl.lean.worker import ReplWorker, WorkerStartError
from leanrl.verdict import Attempt, Reason, Verdict

__all__ = ["PoolConfig", "PoolError", "PoolStats", "ReplPool", "tactic_capacity"]

_GONE_RETRIES = 3
"""Times an attempt moves on to another process that was found dead before the attempt was
sent to it (:class:`ReplGone`), beside ``crash_retries``: such a death was not the attempt's."""


class ReplPool:
    """Warm REPL processes per role and set of imports; ``await pool.check(attempts)``."""

    def __init__(self, config: PoolConfig) -> None:
        self.config = config
        self.stats = PoolStats()
        self._keys: dict[tuple[str, ...], KeyState] = {}
        self._cond: asyncio.Condition | None = None
        self._sem: asyncio.Semaphore | None = None
        self._tactic_sem: asyncio.Semaphore | None = None
        self._live: dict[str, int] = {"work": 0, "judge": 0}
        self._role_live: dict[Role, int] = {"elab": 0, "judge": 0, "tactic": 0}
        self._tasks: set[asyncio.Task[None]] = set()
        self._starts: set[asyncio.Task[None]] = set()
        self._busy: set[Any] = set()
        self._pinned: set[Any] = set()
        self._root: ScratchRoot | None = None
        self._handoff: Path | None = None
        self._closed = False
        self.events: deque[tuple[str, int]] = deque(maxlen=10_000)
        """(event, pid) in the order they happened: ready, acquire, kill, retire (diagnostics)."""
        self.roles: dict[int, Role] = {}
        """The role of every process started, by pid (diagnostics and tests)."""

    async def start(self) -> None:
        """Create the scratch root (sweeping stale ones of dead owners) and the locks.
        Processes start on demand."""
        if self._cond is None:
            self._cond = asyncio.Condition()
            self._sem = asyncio.Semaphore(self.config.workers)
            self._tactic_sem = asyncio.Semaphore(self.config.tactic_cap)
            self._root = ScratchRoot("pool", self.config.scratch_parent)
            await asyncio.to_thread(self._root.create)
            self._handoff = self._root.folder("handoff")
            self._closed = False

    async def warm(self, header: str, n: int | None = None) -> None:
        """Start ``n`` elaborating processes for ``header`` now (default: workers), the spares
        and the judges, and wait until they are all ready."""
        await self.start()
        cfg = self.config
        n = n or cfg.workers
        targets = {
            self._key_of(header, "elab"): (n, min(n + cfg.spares, cfg.workers + cfg.spares)),
            self._key_of(header, "judge"): (self._cap("judge"), self._cap("judge")),
        }
        for key, (count, _) in targets.items():
            ws = [await self._acquire(key) for _ in range(count)]
            for w in ws:
                await self._release(key, w)
        assert self._cond is not None
        async with self._cond:
            for key, (_, target) in targets.items():
                k = self._keys[key]
                while (
                    len(k.ready) < target
                    and k.header_error is None
                    and not k.failing(self.config.start_retries)
                    and (k.starting or k.ready)
                ):
                    await self._cond.wait()

    # -- checking -------------------------------------------------------------------------------

    async def check(self, attempts: Sequence[Attempt]) -> list[Verdict]:
        """One verdict per attempt, in order."""
        await self.start()
        return list(await asyncio.gather(*(self.check_one(a) for a in attempts)))

    async def check_one(self, attempt: Attempt) -> Verdict:
        """Check one attempt; never raises for anything the attempt or Lean did.

        ``time_s`` is the time Lean processes spent on the attempt (not the waits for them).
        """
        spent = [0.0]
        try:
            verdict = await self._check(attempt, spent)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - an attempt must always get a verdict
            verdict = Verdict.reject(Reason.INFRA, f"internal error: {type(e).__name__}: {e}")
        return verdict.model_copy(update={"id": attempt.id, "time_s": spent[0]})

    async def _check(self, attempt: Attempt, spent: list[float]) -> Verdict:
        # The pre-scan is CPU work: off the event loop, so a batch of long texts cannot stall
        # the reading of every process's answers (and turn into false timeouts).
        early = await asyncio.to_thread(judge_prescan, attempt)
        if early is not None:
            return early
        imports = split_header(attempt.header)[0]
        assert self._sem is not None and self._handoff is not None
        key = ("elab", *imports)
        async with self._sem:
            for tries in itertools.count(1):
                try:
                    worker: ReplWorker = await self._acquire(key)
                except PoolError as e:
                    return Verdict.reject(Reason.ERROR if e.header_fault else Reason.INFRA, str(e))
                self.stats.checked += 1
                t0 = time.monotonic()
                try:
                    elab = await worker.elaborate(attempt, self.config.timeout_s)
                    # Nothing the attempt's code started may outlive it (or touch its pickle).
                    self.stats.strays_killed += worker.end_attempt()
                    if elab.verdict is None and elab.pickle is not None:
                        # Copied while this process is still ours: nothing else writes there.
                        copy = await asyncio.to_thread(
                            take_pickle, elab.pickle, self._handoff, self.config.max_pickle_mb << 20
                        )
                    else:
                        copy = None
                except BaseException as e:
                    spent[0] += time.monotonic() - t0
                    failed = await self._failure(key, worker, e, "elaborating the attempt", tries)
                    if failed is None:
                        raise
                    if self._retry_crash(e, failed, tries):
                        continue
                    return failed
                spent[0] += time.monotonic() - t0
                await self._release(key, worker)
                break
        if elab.verdict is not None:
            return elab.verdict
        if not isinstance(copy, Path):
            return Verdict.reject(Reason.CRASH, str(copy), messages=elab.messages)
        try:
            left = max(self.config.timeout_s - spent[0], CHECK_FLOOR_S)
            return await self._judge(attempt, copy, elab.messages, imports, spent, left)
        finally:
            copy.unlink(missing_ok=True)

    async def _judge(
        self,
        attempt: Attempt,
        pickle: Path,
        messages: tuple[Any, ...],
        imports: list[str],
        spent: list[float],
        timeout: float,
    ) -> Verdict:
        key = ("judge", *imports)
        for tries in itertools.count(1):
            try:
                judge: JudgeWorker = await self._acquire(key)
            except PoolError as e:
                return Verdict.reject(Reason.ERROR if e.header_fault else Reason.INFRA, str(e))
            self.stats.judged += 1
            t0 = time.monotonic()
            try:
                report = await judge.check(
                    header=attempt.header,
                    statement=attempt.formal_statement,
                    name=attempt.name,
                    pickle=pickle,
                    olean=False,
                    replay=attempt.policy.kernel_replay,
                    timeout=timeout,
                    file=attempt.check == "file",
                )
            except JudgeLimit as e:
                # The judge runs only trusted text: what killed, stalled or filled it while it
                # checked this attempt was the attempt's own terms. Never retried (a retry would
                # stall a second judge), never charged to anyone else: the judge is replaced.
                spent[0] += time.monotonic() - t0
                self.stats.judge_limits += 1
                await self._discard(key, judge)
                return Verdict.reject(Reason.JUDGE_LIMIT, e.detail, messages=messages)
            except BaseException as e:
                spent[0] += time.monotonic() - t0
                failed = await self._failure(key, judge, e, "the trusted check", tries)
                if failed is None:
                    raise
                if self._retry_crash(e, failed, tries):
                    # The pickle is the pool's own copy (the judge only reads it): reused.
                    timeout = max(timeout - (time.monotonic() - t0), CHECK_FLOOR_S)
                    continue
                return failed.model_copy(update={"messages": messages})
            spent[0] += time.monotonic() - t0
            await self._release(key, judge)
            break
        if isinstance(report, ReferenceProblem):
            return Verdict.reject(Reason.ERROR, str(report), messages=messages)
        return judge_report(attempt, report, messages)

    def _retry_crash(self, e: BaseException, failed: Verdict, tries: int) -> bool:
        """Whether an attempt whose process died under it (``failed`` is ``crash``) runs again
        on a fresh process: a death can come from outside (see ``PoolConfig.crash_retries``).
        An answer out of protocol is not retried: only what the process printed causes it (the
        attempt's output, or a forged answer), never a kill."""
        if failed.reason is not Reason.CRASH or isinstance(e, ProtocolError):
            return False
        # Found dead before the request was sent: it never saw the attempt. Free (bounded, in
        # case every fresh process dies at once).
        gone = isinstance(e, ReplGone) and tries <= _GONE_RETRIES
        if not gone and tries > self.config.crash_retries:
            return False
        self.stats.crash_retried += 1
        return True

    async def _failure(
        self, key: tuple[str, ...], w: Any, e: BaseException, what: str, tries: int = 1
    ) -> Verdict | None:
        """Kill a process that failed its attempt; the verdict that costs (None: re-raise).
        ``tries``: the processes the attempt has been run on, this one included."""
        near_cap = self._near_cap(w)
        await self._discard(key, w)
        if isinstance(e, ReplTimeout):
            return Verdict.reject(
                Reason.TIMEOUT,
                f"time limit of {self.config.timeout_s:g} s exceeded in {what} ({e})",
            )
        if isinstance(e, ReplMemory):
            return Verdict.reject(Reason.MEMORY, f"{e} ({what})")
        if isinstance(e, (ReplDied, ProtocolError, OSError)):
            if near_cap:
                return Verdict.reject(
                    Reason.MEMORY,
                    f"the Lean process died near its memory cap of {self.config.memory_mb} MiB "
                    f"({what}): {e}",
                )
            again = f", on {tries} fresh processes in a row" if tries > 1 else ""
            return Verdict.reject(Reason.CRASH, f"the Lean process failed ({what}{again}): {e}")
        return None

    # -- pinning a process (tactic sessions) ----------------------------------------------------

    async def acquire(self, header: str) -> ReplWorker:
        """Take a warm tactic-mode process for ``header`` for exclusive use (raises
        :class:`PoolError`). It comes from the tactic sub-pool and goes back there: it never
        elaborates whole attempts or checks proofs. At most :attr:`PoolConfig.tactic_cap` are
        held at once; more wait for one to be released (the service answers 429 before)."""
        await self.start()
        sem = self._tactic_sem
        assert sem is not None
        await sem.acquire()
        try:
            w: ReplWorker = await self._acquire(self._key_of(header, "tactic"))
        except BaseException:
            sem.release()
            raise
        self._pinned.add(w)
        return w

    async def release(self, header: str, worker: ReplWorker, *, broken: bool = False) -> None:
        """Give a process from :meth:`acquire` back; a ``broken`` one is killed and replaced."""
        key = self._key_of(header, "tactic")
        if worker in self._pinned:
            self._pinned.discard(worker)
            if self._tactic_sem is not None:
                self._tactic_sem.release()
        if self._cond is None:  # the pool was closed meanwhile: the process is gone already
            return
        if broken:
            await self._discard(key, worker)
        else:
            self.stats.strays_killed += worker.end_attempt()
            await self._release(key, worker)

    def _near_cap(self, w: Any) -> bool:
        cap = self.config.memory_mb
        if cap is None:
            return False
        return bool(w.proc.out_of_memory() or w.proc.peak_rss_mb >= 0.8 * cap)

    def _key_of(self, header: str, role: Role) -> tuple[str, ...]:
        """``(role, *imports)``: processes of different roles never mix."""
        return (role, *split_header(header)[0])

    # -- the process book-keeping ---------------------------------------------------------------

    def _cap(self, role: Role) -> int:
        if group_of(role) == "judge":
            return self.config.judge_count
        return self.config.work_cap

    def _count(self, role: Role, n: int) -> None:
        self._live[group_of(role)] += n
        self._role_live[role] += n

    def _room(self, role: Role) -> bool:
        """Whether one more process of ``role`` may live: its group's cap, and for elaborating
        processes ``workers + spares`` (the group's cap is one higher only to leave a session
        a process beside ``check_reserve``)."""
        if self._live[group_of(role)] >= self._cap(role):
            return False
        return role != "elab" or self._role_live["elab"] < self.config.workers + self.config.spares

    def _spares(self, role: Role) -> int:
        return 0 if role == "judge" else self.config.spares

    async def _acquire(self, key: tuple[str, ...]) -> Any:
        assert self._cond is not None
        async with self._cond:
            k = self._keys.setdefault(key, KeyState(key[0]))  # type: ignore[arg-type]
            k.waiting += 1
            try:
                while True:
                    if k.header_error is not None:
                        raise PoolError(k.header_error, header_fault=True)
                    if k.ready:
                        w = k.ready.popleft()
                        if not w.proc.alive:  # died while idle: forget it
                            self._count(k.role, -1)
                            self._background(w.close())
                            continue
                        if w.proc.rss_mb() > self.config.recycle_mb:
                            # Grown while idle (or past the threshold before it was measured):
                            # no attempt is handed a process with too little memory left.
                            self._retire(key, k, w, recycled=True)
                            continue
                        self._busy.add(w)
                        if k.role == "elab":
                            busy = sum(1 for b in self._busy if isinstance(b, ReplWorker))
                            self.stats.max_busy = max(self.stats.max_busy, busy)
                        self._event("acquire", w)
                        k.last_used = time.monotonic()
                        self._top_up(key, k)
                        return w
                    retries = self.config.start_retries
                    if k.failing(retries) and not k.starting:
                        wait = k.retry_at - time.monotonic()
                        if wait > 0:
                            # In back-off, with nothing starting: the attempt is not held
                            # hostage to an outage. `infra` is redone on resume, never a reward.
                            raise PoolError(
                                f"{k.fails} starts in a row of a Lean process for these imports "
                                f"failed (next try in {wait:.1f} s): {k.infra_error}",
                                header_fault=False,
                            )
                    if k.starting < k.waiting:
                        # Gated (``may_start``): while starts fail, one at a time, after the
                        # back-off. No room: wait for a release.
                        self._spawn_for(key, k)
                    # Woken by a start that ends (each is bounded by ``startup_timeout_s``), a
                    # release or a kill: an attempt waits for at most the start under way.
                    await self._cond.wait()
            finally:
                k.waiting -= 1

    def _top_up(self, key: tuple[str, ...], k: KeyState) -> None:
        """Keep the role's spare warm processes ready (or starting) for a key in use."""
        retries = self.config.start_retries
        while (
            len(k.ready) + k.starting < self._spares(k.role)
            and self._room(k.role)
            and k.may_start(retries)
        ):
            self._spawn(key, k)

    def _spawn_for(self, key: tuple[str, ...], k: KeyState) -> bool:
        """Start a process for a waiting attempt, if the key's start policy allows one now
        (:meth:`KeyState.may_start`) and there is room (or an idle process to evict)."""
        if not k.may_start(self.config.start_retries):
            return False
        if not self._room(k.role) and not self._evict(key, k.role):
            return False
        self._spawn(key, k)
        return True

    def _evict(self, key: tuple[str, ...], role: Role) -> bool:
        """Close the least recently used idle process of another key of the same cap group
        (of the same role, where the role's own cap is what is full) if that makes room."""
        group_full = self._live[group_of(role)] >= self._cap(role)
        others = [
            (kk, k)
            for kk, k in self._keys.items()
            if kk != key
            and k.ready
            and group_of(k.role) == group_of(role)
            and (group_full or k.role == role)
        ]
        if not others:
            return False
        _, victim = min(others, key=lambda p: p[1].last_used)
        w = victim.ready.pop()
        self._count(victim.role, -1)
        self.stats.evicted += 1
        self._background(w.close())
        if not self._room(role):  # the group had room but the role had none, or vice versa
            return self._evict(key, role)
        return True

    def _spawn(self, key: tuple[str, ...], k: KeyState) -> None:
        self._count(k.role, 1)
        k.starting += 1
        task = asyncio.ensure_future(self._start_worker(key, k))
        self._starts.add(task)
        task.add_done_callback(self._starts.discard)

    def _background(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run a clean-up coroutine (closing a process) without waiting for it."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _new_worker(self, role: Role, imports: tuple[str, ...]) -> Any:
        """A process for ``role``: its private folder, minimal environment and sandbox."""
        cfg = self.config
        assert self._root is not None and self._handoff is not None and self._root.path
        folder = self._root.folder(role)
        env = minimal_env(cfg.env if cfg.env is not None else os.environ, folder)
        argv = list(cfg.command)
        if cfg.isolate:
            readable = [self._handoff] if role == "judge" else []
            needs = process_needs(argv, cfg.cwd, env)
            argv = bwrap_argv([folder], readable, hide=[self._root.path], needs=needs) + argv
        proc = ReplProcess(
            argv,
            cwd=cfg.cwd,
            env=env,
            memory_mb=cfg.memory_mb,
            max_output_mb=cfg.max_output_mb,
            on_spawn=self._registered(role),
        )
        if role == "judge":
            return JudgeWorker(proc, imports, folder)
        return ReplWorker(proc, imports, folder)

    def _registered(self, role: Role) -> Any:
        def on_spawn(pid: int) -> None:
            self.roles[pid] = role
            assert self._root is not None
            self._root.register(pid)

        return on_spawn

    async def _start_worker(self, key: tuple[str, ...], k: KeyState) -> None:
        cfg = self.config
        assert self._cond is not None
        w = self._new_worker(k.role, key[1:])
        t0 = time.monotonic()
        error: WorkerStartError | JudgeStartError | None = None
        try:
            await w.start(cfg.startup_timeout_s)
        except asyncio.CancelledError:
            await w.close()
            raise
        except (WorkerStartError, JudgeStartError) as e:
            error = e
        except Exception as e:  # noqa: BLE001 - any start failure is reported the same way
            error = WorkerStartError(f"the Lean REPL did not start: {e}", header_fault=False)
        async with self._cond:
            k.starting -= 1
            if error is None and not self._closed:
                self.stats.started += 1
                self.stats.start_seconds += time.monotonic() - t0
                if k.failing(cfg.start_retries):
                    self.stats.healed += 1
                k.fails, k.infra_error, k.retry_at, k.level = 0, None, 0.0, 0  # healed
                k.ready.append(w)
                self._event("ready", w)
            else:
                self._count(k.role, -1)
                if error is not None:
                    self.stats.start_failures += 1
                    if error.header_fault:  # Lean's own answer: the header does not elaborate
                        k.header_error = error.detail
                    else:
                        k.fails += 1
                        k.infra_error = error.detail
                        if k.failing(cfg.start_retries):
                            k.retry_at = time.monotonic() + min(
                                cfg.max_start_backoff_s,
                                cfg.start_backoff_s * 2.0 ** min(k.level, 30),
                            )
                            # Starts that ran together (the first wave of a key) fail together:
                            # the back-off doubles once per wave, not once per process.
                            if not k.starting:
                                k.level += 1
            self._cond.notify_all()
        if error is not None or self._closed:
            await w.close()

    async def _release(self, key: tuple[str, ...], w: Any) -> None:
        assert self._cond is not None
        # Measured after every attempt, judges included: a judge keeps what it read of every
        # pickle, and the next attempt must not pay for what earlier ones left.
        recycle = (
            w.attempts >= self.config.recycle_after or w.proc.rss_mb() > self.config.recycle_mb
        )
        async with self._cond:
            self._busy.discard(w)
            k = self._keys[key]
            if not recycle and not self._closed and w.proc.alive:
                k.ready.append(w)
            else:
                self._retire(key, k, w, recycled=recycle)
            self._cond.notify_all()

    def _retire(self, key: tuple[str, ...], k: KeyState, w: Any, *, recycled: bool) -> None:
        """Close a process that is not busy (under the condition's lock); start what the key
        needs in its place."""
        self._count(k.role, -1)
        self._event("retire", w)
        if recycled:
            self.stats.recycled += 1
        self._background(w.close())
        if not self._closed:
            self._top_up(key, k)
            if k.waiting > k.starting:
                self._spawn_for(key, k)

    async def _discard(self, key: tuple[str, ...], w: Any) -> None:
        """Kill a process that failed an attempt; a replacement starts at once."""
        self.stats.killed += 1
        self._event("kill", w)
        await w.proc.kill()
        self._background(w.close())
        assert self._cond is not None
        async with self._cond:
            self._busy.discard(w)
            k = self._keys[key]
            self._count(k.role, -1)
            if not self._closed:
                self._top_up(key, k)
                if k.waiting > k.starting:
                    self._spawn_for(key, k)
            self._cond.notify_all()

    def _event(self, what: str, w: Any) -> None:
        self.events.append((what, w.proc.pid if w.proc.pid is not None else -1))

    def live_processes(self, role: Role | None = None) -> list[ReplProcess]:
        """The processes alive now (idle and busy), optionally of one role."""
        keys = [k for k in self._keys.values() if role is None or k.role == role]
        procs = [w.proc for k in keys for w in k.ready]
        busy = [w.proc for w in self._busy if role is None or self.roles.get(w.proc.pid) == role]
        return [p for p in procs + busy if p.alive]

    @property
    def scratch(self) -> Path | None:
        """The pool's scratch root (None before :meth:`start` and after :meth:`close`)."""
        return self._root.path if self._root is not None else None

    def problems(self) -> list[str]:
        """What keeps this pool from starting Lean processes right now, one line per set of
        imports and role: a header Lean refuses (the taskset's fault; it stays), or starts
        failing in a row (infrastructure; the pool keeps trying, and it heals). Empty when
        every key in use can start processes. ``GET /health`` reports these."""
        out = []
        for key, k in self._keys.items():
            what = f"{k.role} processes for {' '.join(key[1:]) or 'no imports'}"
            if k.header_error is not None:
                out.append(f"header: {what}: {k.header_error}")
            elif k.failing(self.config.start_retries):
                out.append(f"infra: {what}: {k.fails} failed starts in a row: {k.infra_error}")
        return out

    async def close(self) -> None:
        """Stop every process and remove the scratch root. Idempotent."""
        self._closed = True
        if self._cond is None:
            return
        async with self._cond:
            workers = [w for k in self._keys.values() for w in k.ready] + list(self._busy)
            for k in self._keys.values():
                k.ready.clear()
            self._cond.notify_all()
        # Killed, not asked to exit: busy ones are mid-request; the folders go with the root.
        await asyncio.gather(*(w.proc.kill() for w in workers), return_exceptions=True)
        for t in list(self._starts):
            t.cancel()
        await asyncio.gather(*self._starts, return_exceptions=True)
        # Closing processes: let them finish (each is bounded by a kill after a short wait).
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._live = {"work": 0, "judge": 0}
        self._role_live = {"elab": 0, "judge": 0, "tactic": 0}
        self._pinned.clear()
        self._tactic_sem = None
        if self._root is not None:
            await asyncio.to_thread(self._root.remove)
        self._root = None
        self._handoff = None
        self._cond = None
        self._sem = None
        self._keys.clear()
