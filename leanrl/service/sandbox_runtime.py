"""The base of the sandboxed runtimes: batches over a warm pool, retry once, account for cost.

``check`` splits the attempts into batches of ``batch_size`` and sends each to a sandbox from
the :class:`~leanrl.service.pool.WarmPool` over HTTP (:class:`ServiceClient`). A sandbox that
dies or stops answering mid-batch costs that batch only: the sandbox is discarded and the batch is
sent once more to another sandbox; if that fails too, each of its attempts gets a Verdict with
reason ``infra``. A batch's Verdicts are taken from exactly one answer, so nothing is lost and
nothing is counted twice.

Cost: every batch records sandbox-seconds (time a sandbox spent on it), reserved CPU-seconds
(that times the sandbox's cores) and, where the backend can measure it, CPU-seconds used. The
run's totals add what the pool billed (every sandbox from the start of its creation to its
termination, idle warm time included). Both are in :meth:`SandboxRuntime.metrics` and, with a
``metrics_path``, appended as JSON lines.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from leanrl._sandbox_config import ClientConfig, PoolConfig, ServiceLimits
from leanrl.errors import ConfigError, RuntimeUnavailable
from leanrl.runtime import Runtime, RuntimeConfig, TacticSession
from leanrl.service.client import ServiceClient, ServiceError, ServiceRejected
from leanrl.service.pool import WarmPool
from leanrl.service.sandbox import Sandbox, SandboxBackend
from leanrl.verdict import Attempt, Reason, Verdict, VerificationPolicy

__all__ = [
    "BatchCost",
    "SandboxRuntime",
    "SandboxSettings",
    "batch_timeouts",
    "inner_runtime_args",
]

_PROBE_TIMEOUT_S = 5.0
"""A health probe that takes longer than this counts as a failed probe."""


#: RuntimeConfig fields handed to the runtime inside the sandbox (paths on this machine are not).
_INNER_FIELDS = (
    "mode",
    "workers",
    "timeout_s",
    "memory_mb",
    "recycle_after",
    "recycle_memory_mb",
    "judges",
    "isolate",
    "startup_timeout_s",
)


def inner_runtime_args(
    config: RuntimeConfig,
    name: str,
    options: dict[str, Any] | None = None,
    limits: ServiceLimits | None = None,
    cpus: float | None = None,
) -> list[str]:
    """``leanrl serve`` flags that make the service inside a sandbox wrap runtime ``name`` with
    this config's Lean settings (per-attempt timeout, memory cap, workers, ...) and apply
    ``limits``.

    ``workers = 0`` ("one per CPU") is resolved here to the sandbox's ``cpus``: inside a
    container ``os.cpu_count()`` reports the host's CPUs, not the ``--cpus`` quota, and that many
    Lean processes importing Mathlib would not fit the sandbox's memory."""
    args = ["--runtime.name", name]
    for f, value in (limits.model_dump() if limits else {}).items():
        args += [f"--limits.{f}", str(value)]
    for f in _INNER_FIELDS:
        value = getattr(config, f)
        if f == "workers" and not value and cpus is not None:
            value = max(1, int(cpus))
        if value is None:
            continue  # "auto": the service inside decides (and warns) for itself
        if isinstance(value, bool):
            args.append(f"--runtime.{f}" if value else f"--no-runtime.{f}")
        else:
            args += [f"--runtime.{f}", str(value)]
    if options:
        args += ["--runtime.options", json.dumps(options)]
    return args


def batch_timeouts(
    config: RuntimeConfig,
    batch_size: int,
    cpus: float,
    service: ServiceLimits,
    client: ClientConfig,
) -> tuple[ServiceLimits, ClientConfig]:
    """Request timeouts long enough for a whole batch, unless set explicitly.

    A batch can legitimately take ``ceil(batch_size / workers)`` per-attempt time limits, plus
    one Lean start-up (a process killed mid-batch is replaced). The service's limit is raised to
    that, and the client's to a minute more, so the service answers (504) before the client
    gives up; a retried request then never races the first one.
    """
    workers = config.workers or max(1, int(cpus))
    # Each attempt: elaboration and the trusted check within the per-attempt limit, and the
    # check's floor of a few seconds (leanrl.lean.trust.judge.CHECK_FLOOR_S) inside the slack.
    need = -(-batch_size // workers) * (config.timeout_s + 5.0) + config.startup_timeout_s
    if "request_timeout_s" not in service.model_fields_set:
        service = service.model_copy(
            update={"request_timeout_s": max(service.request_timeout_s, need)}
        )
    if "request_timeout_s" not in client.model_fields_set:
        client = client.model_copy(
            update={
                "request_timeout_s": max(client.request_timeout_s, service.request_timeout_s + 60)
            }
        )
    return service, client


@dataclass(frozen=True)
class SandboxSettings:
    """What :class:`SandboxRuntime` needs from a runtime's config section."""

    pool: PoolConfig
    batch_size: int
    client: ClientConfig
    service: ServiceLimits
    metrics_path: Path | None = None
    warm_headers: tuple[str, ...] = ()
    learn_warm_headers: int = 0
    sessions_per_sandbox: int = 1
    """Tactic sessions sharing one sandbox (at most the service's ``max_sessions``)."""


@dataclass(eq=False)
class _SessionHost:
    """A sandbox taken from the pool to host tactic sessions."""

    sandbox: Sandbox
    open: int = 0
    broken: bool = False
    opened: int = 0
    """Sessions it has hosted in all: one sandbox-use's worth where Lean is not isolated."""


@dataclass(frozen=True)
class BatchCost:
    """Cost and outcome of one batch (one JSON line in the metrics file)."""

    batch: int
    attempts: int
    tries: int
    infra: int
    sandbox_s: float
    cpu_reserved_s: float
    cpu_used_s: float | None
    wait_s: float

    def as_dict(self) -> dict[str, Any]:
        return {"kind": "batch", **self.__dict__}


class SandboxRuntime(Runtime):
    """A runtime that runs ``leanrl serve`` in sandboxes from a warm pool (subclass it)."""

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        self.pool: WarmPool | None = None
        self._http: httpx.AsyncClient | None = None
        self._clients: dict[int, ServiceClient] = {}
        self._batches = 0
        self._costs: list[BatchCost] = []
        self._totals: dict[str, float] = {
            "attempts": 0,
            "batches": 0,
            "retried_batches": 0,
            "infra_verdicts": 0,
            "batch_sandbox_s": 0.0,
            "batch_cpu_reserved_s": 0.0,
            "batch_cpu_used_s": 0.0,
        }
        self._start_lock: asyncio.Lock | None = None
        self._learned = 0
        self._session_hosts: list[_SessionHost] = []

    # -- what subclasses provide --------------------------------------------------------------

    @abc.abstractmethod
    def settings(self) -> SandboxSettings:
        """The pool, batch, client and metrics settings from this runtime's config section."""

    @abc.abstractmethod
    def make_backend(self) -> SandboxBackend:
        """The backend that starts this runtime's sandboxes."""

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        s = self.settings()
        if s.batch_size > s.service.max_batch:
            raise ConfigError(
                f"batch_size {s.batch_size} is over the sandbox service's max_batch "
                f"{s.service.max_batch}: lower batch_size or raise service.max_batch"
            )
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self.pool is not None:
                return
            self._http = httpx.AsyncClient()
            backend = self.make_backend()
            backend.warm_headers = list(s.warm_headers)
            self._learned = 0
            pool = WarmPool(backend, s.pool, self._probe, self._forget)
            try:
                await pool.start(wait_ready=True)
            except BaseException:
                await pool.close()
                await self._http.aclose()
                self._http = None
                raise
            self.pool = pool

    async def close(self) -> None:
        pool, self.pool = self.pool, None
        if pool is None:
            return
        self._session_hosts.clear()  # their sandboxes go with the pool
        await pool.close()
        for c in list(self._clients.values()):
            await c.close()
        self._clients.clear()
        if self._http is not None:
            await self._http.aclose()
            self._http = None
        self._write({"kind": "run", **self._summary(pool)})

    # -- checking ---------------------------------------------------------------------------

    def check_piece(self) -> int:
        """The batch size: each batch goes to one sandbox anyway."""
        return self.settings().batch_size

    async def check(self, attempts: Sequence[Attempt]) -> list[Verdict]:
        if not attempts:
            return []
        await self.start()
        self._learn_headers(attempts)
        size = self.settings().batch_size
        chunks = [list(attempts[i : i + size]) for i in range(0, len(attempts), size)]
        results = await asyncio.gather(*(self._run_batch(c) for c in chunks))
        return [v for chunk in results for v in chunk]

    async def _run_batch(self, batch: list[Attempt]) -> list[Verdict]:
        pool = self._need_pool()
        self._batches += 1
        number = self._batches
        errors: list[str] = []
        busy_s = wait_s = reserved = 0.0
        used: float | None = 0.0
        verdicts: list[Verdict] | None = None
        tries = 0
        for _ in range(2):  # the first try, and one retry on another sandbox
            tries += 1
            t0 = time.monotonic()
            try:
                sb = await pool.acquire()
            except RuntimeUnavailable as e:
                wait_s += time.monotonic() - t0
                errors.append(str(e))
                continue
            t1 = time.monotonic()
            wait_s += t1 - t0
            cpu0 = sb.cpu_seconds()
            try:
                verdicts = await self._client(sb).check(batch, key=uuid.uuid4().hex)
            except ServiceError as e:
                errors.append(f"sandbox {sb.id}: {e}")
            except ServiceRejected as e:  # the request itself was wrong: not the sandbox's fault
                await pool.release(sb, ok=True, count_use=False)  # it checked nothing
                if e.status != 413:
                    raise
                # Over the service's body limit (long proofs): halve the batch until it fits;
                # one attempt that alone does not fit gets a Verdict saying so.
                if len(batch) == 1:
                    detail = f"attempt too large for the sandbox service's max_body_bytes: {e}"
                    return [Verdict.reject(Reason.INFRA, detail[:2000], id=batch[0].id)]
                half = len(batch) // 2
                first, second = await asyncio.gather(
                    self._run_batch(batch[:half]), self._run_batch(batch[half:])
                )
                return first + second
            except BaseException:  # cancelled: the sandbox may be mid-batch, do not reuse it
                await pool.release(sb, ok=False)
                raise
            dt = time.monotonic() - t1
            busy_s += dt
            reserved += dt * sb.cpu
            cpu1 = sb.cpu_seconds()
            used = None if used is None or cpu0 is None or cpu1 is None else used + cpu1 - cpu0
            await pool.release(sb, ok=verdicts is not None)
            if verdicts is not None:
                break
        infra = 0
        if verdicts is None:
            detail = "sandbox failed twice: " + " | ".join(errors)
            verdicts = [Verdict.reject(Reason.INFRA, detail[:2000], id=a.id) for a in batch]
            infra = len(batch)
        cost = BatchCost(number, len(batch), tries, infra, busy_s, reserved, used, wait_s)
        self._account(cost)
        return verdicts

    # -- tactic mode ------------------------------------------------------------------------

    def tactic_session(
        self, header: str, policy: VerificationPolicy | None = None
    ) -> AbstractAsyncContextManager[TacticSession]:
        """A session in a sandbox taken from the pool. Up to ``sessions_per_sandbox`` sessions
        share one sandbox (each pins one Lean process there); the sandbox goes back to the pool
        when its last session ends, and is discarded if one of them failed on it."""

        @contextlib.asynccontextmanager
        async def session() -> AsyncIterator[TacticSession]:
            await self.start()
            pool = self._need_pool()
            host = await self._take_session_host(pool)
            ok = False
            try:
                async with self._client(host.sandbox).tactic_session(header, policy) as s:
                    yield s
                ok = True
            except ServiceError:
                raise  # the sandbox failed: not reused
            except BaseException:
                # A rejected request (ConfigError), the caller's own error or a cancellation:
                # the sandbox is fine (the service closes a session whose step was cut off).
                ok = True
                raise
            finally:
                await self._give_session_host(pool, host, ok)

        return session()

    async def _take_session_host(self, pool: WarmPool) -> _SessionHost:
        limit = max(
            1, min(self.settings().sessions_per_sandbox, self.settings().service.max_sessions)
        )
        for host in self._session_hosts:
            if host.broken or host.open >= limit or host.sandbox.terminated_at is not None:
                continue
            # Sessions that overlap would keep one sandbox in use for ever: where its Lean is
            # not isolated, `limit` sessions in all are its one use, like a batch.
            if host.opened >= limit and not (
                host.sandbox.isolated or pool.config.reuse == "always"
            ):
                continue
            host.open += 1
            host.opened += 1
            return host
        sb = await pool.acquire()
        host = _SessionHost(sb, open=1, opened=1)
        self._session_hosts.append(host)
        return host

    async def _give_session_host(self, pool: WarmPool, host: _SessionHost, ok: bool) -> None:
        host.open -= 1
        host.broken = host.broken or not ok
        if host.open == 0 and host in self._session_hosts:
            self._session_hosts.remove(host)
            await pool.release(host.sandbox, ok=not host.broken)

    # -- metrics ----------------------------------------------------------------------------

    def metrics(self) -> dict[str, float]:
        """Pool state, batch counters and cost so far (numbers only)."""
        if self.pool is None:
            return dict(self._totals)
        return self._summary(self.pool)

    def batch_costs(self) -> list[BatchCost]:
        """Every batch's cost record so far, in completion order."""
        return list(self._costs)

    def _summary(self, pool: WarmPool) -> dict[str, float]:
        state = {f"pool_{k}": float(v) for k, v in pool.state().items()}
        return {**self._totals, **state}

    def _account(self, cost: BatchCost) -> None:
        self._costs.append(cost)
        t = self._totals
        t["attempts"] += cost.attempts
        t["batches"] += 1
        t["retried_batches"] += cost.tries > 1
        t["infra_verdicts"] += cost.infra
        t["batch_sandbox_s"] += cost.sandbox_s
        t["batch_cpu_reserved_s"] += cost.cpu_reserved_s
        t["batch_cpu_used_s"] += cost.cpu_used_s or 0.0
        self._write(cost.as_dict())

    def _write(self, record: dict[str, Any]) -> None:
        path = self.settings().metrics_path
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"runtime": self.name, "time": time.time(), **record}) + "\n")

    # -- internals --------------------------------------------------------------------------

    def _learn_headers(self, attempts: Sequence[Attempt]) -> None:
        # New sandboxes load the imports of the headers batches use, so that with a warm pool
        # no batch waits for Lean to import Mathlib.
        limit = self.settings().learn_warm_headers
        pool = self.pool
        if pool is None or self._learned >= limit:
            return
        warm = pool.backend.warm_headers
        for a in attempts:
            imports = "\n".join(
                line.strip() for line in a.header.splitlines() if line.strip().startswith("import ")
            )
            if imports and imports not in warm and self._learned < limit:
                warm.append(imports)
                self._learned += 1

    def _need_pool(self) -> WarmPool:
        if self.pool is None:
            raise RuntimeUnavailable(f"runtime {self.name!r} is closed; call start() again")
        return self.pool

    def _client(self, sb: Sandbox) -> ServiceClient:
        c = self._clients.get(id(sb))
        if c is None:
            cfg = self.settings().client
            if sb.uds:
                c = ServiceClient(sb.url, sb.token, cfg, uds=sb.uds)
            else:  # TCP sandboxes share one connection pool
                c = ServiceClient(sb.url, sb.token, cfg, http=self._http)
            self._clients[id(sb)] = c
        return c

    async def _probe(self, sb: Sandbox) -> bool:
        health = await self._client(sb).health(retries=0, timeout_s=_PROBE_TIMEOUT_S)
        if health.lean_version:
            self._lean_version = health.lean_version
        if health.status != "ok":
            return False
        # The pool reuses a sandbox for more batches only if its Lean processes are isolated.
        sb.note_isolation(health.isolated, health.isolation_note)
        return True

    async def lean_version(self) -> str | None:
        """The Lean version the sandboxes' services report (from their ``/health``)."""
        return getattr(self, "_lean_version", None)

    async def _forget(self, sb: Sandbox) -> None:
        c = self._clients.pop(id(sb), None)
        if c is not None:
            await c.close()
