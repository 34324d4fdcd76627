"""The verification service: a runtime behind HTTP (FastAPI, served by uvicorn).

``leanrl serve`` runs it; the ``docker`` and ``modal`` runtimes run it inside their sandboxes and
talk to it with :class:`leanrl.service.client.ServiceClient`. The endpoints and their JSON are in
:mod:`leanrl.service.protocol`.

Guarantees:

* every request is guarded before it reaches a handler: bearer token (unless bound to loopback or
  a unix socket), a body size limit (413), and a wall-clock timeout (504, the work is cancelled);
* bad requests get a 4xx whose ``error`` says what was wrong; a bad proof is a Verdict (200);
* ``POST /check`` answers one Verdict per attempt, in order, and with an ``Idempotency-Key`` a
  repeated request replays (or waits for) the first answer instead of checking again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import json
import logging
import os
import time
import uuid
from collections import Counter, OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from leanrl._sandbox_config import ServiceLimits
from leanrl.errors import ConfigError, LeanrlError
from leanrl.runtime import Runtime, TacticSession, TacticState
from leanrl.service import trust
from leanrl.service.connections import CONNECTION_KEY, ConnectionStats
from leanrl.service.guard import Guard, error
from leanrl.service.kimina import KiminaConfig, kimina_router
from leanrl.service.protocol import (
    IDEMPOTENCY_HEADER,
    ApplyTactic,
    CheckRequest,
    CheckResponse,
    Health,
    OpenSession,
    ServiceMetrics,
    SessionOpened,
    StartProof,
)
from leanrl.verdict import Attempt, Reason, Verdict, VerificationPolicy

__all__ = ["ServiceConfig", "VerificationService", "create_app", "is_loopback", "warm_runtime"]

log = logging.getLogger("leanrl.service")

T = TypeVar("T")


_RESTART_REASONS = {Reason.TIMEOUT, Reason.MEMORY, Reason.CRASH, Reason.JUDGE_LIMIT}


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach: ``localhost`` and loopback IP literals.
    Any other host name may resolve to a public address, so it counts as public."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class ServiceConfig(BaseModel):
    """Where the service listens and who may call it."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    host: str = "127.0.0.1"
    """Address to bind. Anything other than loopback requires ``token``."""
    port: int = Field(default=8000, ge=0, le=65535)
    """TCP port; 0 picks a free one (see ``port_file``)."""
    uds: str | None = None
    """Listen on this unix socket instead of TCP (used by the ``docker`` runtime with
    ``--network none``)."""
    uds_mode: str = Field(default="0600", pattern=r"^0?[0-7]{3}$")
    """Permissions of the unix socket (octal). The default lets only the user running the
    service connect; a mode open to a group or to everyone needs ``token``."""
    token: str | None = None
    """Bearer token every request (except ``GET /health``) must carry. Default: the
    ``LEANRL_SERVICE_TOKEN`` environment variable. Required unless bound to loopback or a unix
    socket."""
    limits: ServiceLimits = Field(default_factory=ServiceLimits)
    """Request size, batch length, timeouts, sessions, idempotency cache."""
    warm_headers: list[str] = Field(default_factory=list)
    """Headers whose Lean processes are started (imports loaded) before the service reports
    healthy, so the first batch does not pay for ``import Mathlib``."""
    kimina: KiminaConfig = Field(default_factory=KiminaConfig)
    """The Kimina-compatible ``POST /verify`` and ``POST /api/check`` (docs/interop.md)."""

    def effective_token(self) -> str | None:
        """The token from the config or the environment (None: no auth)."""
        return self.token or os.environ.get("LEANRL_SERVICE_TOKEN") or None

    def check_auth(self) -> None:
        """Refuse to serve a non-loopback address, or a unix socket other users may open,
        without a token."""
        if self.effective_token():
            return
        if self.uds is None and not is_loopback(self.host):
            raise ConfigError(
                f"refusing to serve on {self.host} without a bearer token: pass --token or set "
                "LEANRL_SERVICE_TOKEN (only loopback and private unix sockets may run without one)"
            )
        if self.uds is not None and int(self.uds_mode, 8) & 0o077:
            raise ConfigError(
                f"refusing to serve on unix socket {self.uds} with mode {self.uds_mode} (other "
                "users could connect) without a bearer token: pass --token or set "
                "LEANRL_SERVICE_TOKEN, or keep the default mode 0600"
            )


class _RequestFailed(LeanrlError):
    """The first request with an idempotency key failed; its waiters should retry."""


@dataclass
class _IdemEntry:
    digest: str
    future: asyncio.Future[tuple[Verdict, ...]]
    created: float = field(default_factory=time.monotonic)


@dataclass
class _Session:
    stack: contextlib.AsyncExitStack
    session: TacticSession
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)
    conn: int | None = None
    """The connection that carried its last request (None: not known)."""
    orphaned: float | None = None
    """When the client closed that connection (None: it is open, or not known)."""


class _HTTPError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class VerificationService:
    """The state behind the HTTP endpoints: the runtime, sessions, cache and counters."""

    def __init__(
        self,
        runtime: Runtime,
        limits: ServiceLimits | None = None,
        warm_headers: Sequence[str] = (),
        *,
        trusted: bool = True,
    ) -> None:
        self.runtime = runtime
        self.limits = limits or ServiceLimits()
        self.warm_headers = list(warm_headers)
        self.trusted = trusted
        """False without a token: headers and statements are checked (:mod:`.trust`)."""
        self._started = time.monotonic()
        self._ready = False
        self._lean_version: str | None = None
        self._sessions: dict[str, _Session] = {}
        self._opening = 0
        self._closed_why: OrderedDict[str, str] = OrderedDict()
        self._closing: set[asyncio.Task[None]] = set()
        self._idem: OrderedDict[str, _IdemEntry] = OrderedDict()
        self._reaper: asyncio.Task[None] | None = None
        self._window: deque[tuple[float, int]] = deque()
        self.queue_depth = 0
        self.attempts_total = 0
        self.requests_total = 0
        self.rejected_requests = 0
        self.request_timeouts = 0
        self.cache_hits = 0
        self.warm_failures = 0
        self.reasons: Counter[str] = Counter()
        self.connections = ConnectionStats()
        """Connections the HTTP layer closed on its own (:mod:`leanrl.service.connections`)."""
        self.connections.on_client_closed = self._client_closed
        self._gone: OrderedDict[int, float] = OrderedDict()
        """Connections their clients closed lately (number -> when), for sessions whose open
        finishes after their client went away."""

    async def start(self) -> None:
        """Start the runtime and the idle-session reaper. Idempotent."""
        if self._ready:
            return
        self._started = time.monotonic()
        await self.runtime.start()
        for header in self.warm_headers:
            # Best effort: a header that cannot load (a bad import in a dataset) must not stop
            # the service; its attempts get their Verdicts when they are checked.
            try:
                await warm_runtime(self.runtime, header)
            except Exception as e:  # noqa: BLE001
                self.warm_failures += 1
                log.warning("warming up %r failed: %s", header[:200], e)
        try:  # what the clients' reports name as the Lean that ran
            self._lean_version = await self.runtime.lean_version()
        except Exception as e:  # noqa: BLE001 - informative only
            log.warning("the runtime could not tell its Lean version: %s", e)
        self._reaper = asyncio.create_task(self._reap_loop())
        self._ready = True

    async def close(self) -> None:
        """Close every session and the runtime."""
        self._ready = False
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for sid in list(self._sessions):
            await self.close_session(sid)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        await self.runtime.close()

    # -- checking ---------------------------------------------------------------------------

    async def check(self, attempts: tuple[Attempt, ...], key: str | None) -> CheckResponse:
        """Check a batch (deduplicated by ``key``)."""
        if len(attempts) > self.limits.max_batch:
            raise _HTTPError(
                413,
                f"batch of {len(attempts)} attempts is longer than the limit of "
                f"{self.limits.max_batch}; split it into batches of at most "
                f"{self.limits.max_batch}",
            )
        if not self.trusted:
            size = sum(len(a.header) + len(a.formal_statement) for a in attempts)
            why = await _cpu(size, _first_untrusted_problem, attempts)
            if why is not None:
                raise _HTTPError(403, why)
        if key is None:
            return CheckResponse(verdicts=await self._run(attempts))
        self._expire_idem()
        digest = _digest(attempts)
        entry = self._idem.get(key)
        if entry is not None:
            if entry.digest != digest:
                raise _HTTPError(
                    409,
                    f"idempotency key {key!r} was already used for a different batch; use a "
                    "fresh key for each new batch",
                )
            self.cache_hits += 1
            try:
                verdicts = await asyncio.shield(entry.future)
            except _RequestFailed as e:
                raise _HTTPError(503, str(e)) from None
            return CheckResponse(verdicts=verdicts, cached=True)
        fut: asyncio.Future[tuple[Verdict, ...]] = asyncio.get_running_loop().create_future()
        fut.add_done_callback(_consume)
        self._idem[key] = _IdemEntry(digest, fut)
        self._evict_idem()
        try:
            verdicts = await self._run(attempts)
        except BaseException as e:
            # Forget the key so a retry checks again, and release anyone waiting on it.
            self._idem.pop(key, None)
            fut.set_exception(
                _RequestFailed(f"the first request with this key failed ({e!r}); retry")
            )
            raise
        fut.set_result(verdicts)
        return CheckResponse(verdicts=verdicts)

    async def _run(self, attempts: tuple[Attempt, ...]) -> tuple[Verdict, ...]:
        n = len(attempts)
        self.queue_depth += n
        try:
            try:
                verdicts = await self.runtime.check(attempts)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.exception("runtime %s failed on a batch of %d", self.runtime.name, n)
                raise _HTTPError(503, f"runtime failed: {type(e).__name__}: {e}") from e
        finally:
            self.queue_depth -= n
        if len(verdicts) != n:
            raise _HTTPError(
                503, f"runtime returned {len(verdicts)} verdicts for {n} attempts (a runtime bug)"
            )
        now = time.monotonic()
        self.attempts_total += n
        self._window.append((now, n))
        for v in verdicts:
            self.reasons[v.reason.value] += 1
        return tuple(verdicts)

    def _evict_idem(self) -> None:
        # Oldest answered entries go first. A request still running is never evicted: its
        # retry must wait for it, not check the batch again (running ones are bounded by the
        # server's concurrency limit).
        excess = len(self._idem) - self.limits.idempotency_max_entries
        for k in list(self._idem):
            if excess <= 0:
                break
            if self._idem[k].future.done():
                del self._idem[k]
                excess -= 1

    def _expire_idem(self) -> None:
        cutoff = time.monotonic() - self.limits.idempotency_ttl_s
        while self._idem:
            key, entry = next(iter(self._idem.items()))
            if entry.created >= cutoff or not entry.future.done():
                break
            self._idem.pop(key)

    # -- tactic sessions --------------------------------------------------------------------

    def session_limit(self) -> int:
        """Sessions that may be open at once: ``max_sessions``, lowered to what the runtime can
        hold (``max_tactic_sessions``: for ``local``, all its processes but the one kept for
        checks), so that the 429 comes before sessions would take every process."""
        cap = getattr(self.runtime, "max_tactic_sessions", None)
        if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0:
            return min(self.limits.max_sessions, cap)
        return self.limits.max_sessions

    async def open_session(
        self, header: str, policy: VerificationPolicy | None = None, conn: int | None = None
    ) -> str:
        """Open a tactic session under ``header`` (tactics judged by ``policy``); returns its id.
        ``conn``: the connection the request came on (its client closing it ends the session
        after ``session_orphan_s``)."""
        if not self.trusted:
            rules = policy or VerificationPolicy()
            why = trust.policy_problem(rules) or await _cpu(
                len(header), trust.header_problem, header, VerificationPolicy()
            )
            if why is not None:
                raise _HTTPError(403, f"session: {why}. {trust.FIX}")
        # Sessions being opened count too: concurrent opens must not overshoot the limit.
        limit = self.session_limit()
        if len(self._sessions) + self._opening >= limit:
            why = (
                f"max_sessions {self.limits.max_sessions}"
                if limit == self.limits.max_sessions
                else f"what the runtime holds beside the checks; max_sessions is "
                f"{self.limits.max_sessions}"
            )
            raise _HTTPError(
                429,
                f"{len(self._sessions) + self._opening} tactic sessions are open or opening "
                f"(the limit is {limit}: {why}); close one with DELETE /sessions/{{id}} first",
            )
        self._opening += 1
        stack = contextlib.AsyncExitStack()
        try:
            session = await stack.enter_async_context(
                self.runtime.tactic_session(header, policy=policy)
            )
        except ConfigError as e:
            await stack.aclose()
            raise _HTTPError(501, str(e)) from None
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - any failure: a clear 503, never a 500
            await stack.aclose()
            log.warning("opening a tactic session failed: %r", e)
            raise _HTTPError(
                503, f"could not open a tactic session: {type(e).__name__}: {e}"
            ) from None
        finally:
            self._opening -= 1
        sid = uuid.uuid4().hex
        s = self._sessions[sid] = _Session(stack, session, conn=conn)
        if conn is not None and conn in self._gone:  # its client left while it opened
            self._orphan(sid, s, self._gone[conn])
        return sid

    def _session(self, sid: str, conn: int | None = None) -> _Session:
        s = self._sessions.get(sid)
        if s is None:
            why = self._closed_why.get(sid, "closed, expired after idling, or never opened")
            raise _HTTPError(404, f"no tactic session {sid!r} ({why}); open a new one")
        s.last_used = time.monotonic()
        if conn is not None and conn != s.conn:  # its client is back, on another connection
            s.conn, s.orphaned = conn, None
        return s

    async def start_proof(self, sid: str, req: StartProof, conn: int | None = None) -> TacticState:
        """Start a proof in session ``sid`` (``conn``: the connection the request came on)."""
        if not self.trusted:
            rules = VerificationPolicy()
            why = await _cpu(
                len(req.formal_statement) + len(req.preamble),
                lambda: (
                    trust.statement_problem(req.formal_statement, rules, "formal_statement")
                    or trust.statement_problem(req.preamble, rules, "preamble")
                ),
            )
            if why is not None:
                raise _HTTPError(403, f"{why}. {trust.FIX}")
        return await self._step(sid, lambda s: s.start(req.formal_statement, req.preamble), conn)

    async def apply(self, sid: str, req: ApplyTactic, conn: int | None = None) -> TacticState:
        """Apply a tactic in session ``sid`` (``conn``: the connection the request came on)."""
        return await self._step(sid, lambda s: s.apply(req.proof_state, req.tactic), conn)

    async def _step(
        self,
        sid: str,
        op: Callable[[TacticSession], Awaitable[TacticState]],
        conn: int | None = None,
    ) -> TacticState:
        # A step that was cancelled (request timeout, client gone) or raised leaves the Lean
        # process in an unknown state, possibly still writing the old answer: the session is
        # closed rather than reused, and later requests are told why.
        s = self._session(sid, conn)
        async with s.lock:
            if self._sessions.get(sid) is not s:  # closed while this step waited for its turn
                self._session(sid)  # raises the 404 saying why
            try:
                state = await op(s.session)
            except asyncio.CancelledError:
                self._drop_session(sid, "closed after a request on it timed out or was cancelled")
                raise
            except Exception as e:  # noqa: BLE001 - any failure: a clear 503, never a 500
                why = f"closed after it failed: {type(e).__name__}: {e}"
                self._drop_session(sid, why)
                log.warning("tactic session %s failed: %r", sid, e)
                raise _HTTPError(
                    503,
                    f"tactic session failed ({type(e).__name__}: {e}); the session was closed, "
                    "open a new one",
                ) from None
        s.last_used = time.monotonic()
        return state

    def _drop_session(self, sid: str, why: str) -> None:
        # Forget it now (so the next request gets a clear 404) and close it in the background
        # once the step holding its lock has let go.
        s = self._sessions.pop(sid, None)
        if s is None:
            return
        self._remember_closed(sid, why)
        task = asyncio.ensure_future(self._close_stack(sid, s))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _remember_closed(self, sid: str, why: str) -> None:
        self._closed_why[sid] = why
        while len(self._closed_why) > 4 * self.limits.max_sessions:
            self._closed_why.popitem(last=False)

    async def close_session(self, sid: str) -> bool:
        """Close session ``sid``; False when there was none."""
        s = self._sessions.pop(sid, None)
        if s is None:
            return False
        self._closed_why.setdefault(sid, "closed")
        await self._close_stack(sid, s)
        return True

    async def _close_quietly(self, sid: str) -> None:
        await self.close_session(sid)

    async def _close_stack(self, sid: str, s: _Session) -> None:
        # Wait for a step in progress, so its process is not released under it.
        async with s.lock:
            try:
                await s.stack.aclose()
            except Exception:
                log.exception("closing tactic session %s failed", sid)

    async def _reap_loop(self) -> None:
        lim = self.limits
        while True:
            await asyncio.sleep(min(5.0, lim.session_idle_s / 2, max(lim.session_orphan_s, 0.1)))
            cutoff = time.monotonic() - lim.session_idle_s
            for sid, s in list(self._sessions.items()):
                if s.last_used < cutoff and not s.lock.locked():
                    self._remember_closed(sid, f"expired after idling {lim.session_idle_s:g} s")
                    await self.close_session(sid)
                elif self._abandoned(s):
                    self._remember_closed(sid, self._abandoned_why())
                    await self.close_session(sid)

    # -- clients that go away -----------------------------------------------------------------

    def _client_closed(self, conn: int) -> None:
        """The client closed connection ``conn`` (from the HTTP layer): the sessions whose last
        request came on it are closed unless used again within ``session_orphan_s``."""
        now = time.monotonic()
        self._gone[conn] = now
        while len(self._gone) > 4096:
            self._gone.popitem(last=False)
        for sid, s in list(self._sessions.items()):
            if s.conn == conn:
                self._orphan(sid, s, now)

    def _orphan(self, sid: str, s: _Session, since: float) -> None:
        s.orphaned = since
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # the reaper sees it
        loop.call_later(self.limits.session_orphan_s, self._close_if_abandoned, sid, s)

    def _abandoned(self, s: _Session) -> bool:
        """Its client closed the connection of its last request, and nothing has used it for
        ``session_orphan_s`` since (a step in progress keeps it)."""
        if s.orphaned is None or s.lock.locked():
            return False
        quiet = time.monotonic() - max(s.orphaned, s.last_used)
        return quiet >= self.limits.session_orphan_s

    def _abandoned_why(self) -> str:
        return (
            "closed: its client closed the connection of its last request and did not come "
            f"back within {self.limits.session_orphan_s:g} s (session_orphan_s)"
        )

    def _close_if_abandoned(self, sid: str, s: _Session) -> None:
        if self._sessions.get(sid) is not s or not self._abandoned(s):
            return  # used again, closed already, or a step is running (the reaper follows up)
        self._remember_closed(sid, self._abandoned_why())
        task = asyncio.ensure_future(self._close_quietly(sid))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    # -- health and metrics -----------------------------------------------------------------

    def health(self) -> Health:
        problems = self.runtime.problems() if self._ready else []
        status = "starting" if not self._ready else "ok"
        if any(p.startswith("infra:") for p in problems):
            status = "degraded"
        isolated: bool | None = None
        note = ""
        if self._ready:
            try:
                isolated, note = self.runtime.isolation()
            except Exception as e:  # noqa: BLE001 - unknown counts as not isolated
                isolated, note = None, f"the runtime could not tell: {type(e).__name__}: {e}"
        return Health(
            status=status,
            problems=tuple(problems),
            runtime=self.runtime.name,
            pid=os.getpid(),
            lean_version=self._lean_version,
            isolated=isolated,
            isolation_note=note,
        )

    def metrics(self) -> ServiceMetrics:
        now = time.monotonic()
        while self._window and self._window[0][0] < now - 60.0:
            self._window.popleft()
        recent = sum(n for _, n in self._window)
        span = min(60.0, max(now - self._started, 1e-3))
        rt = _runtime_numbers(self.runtime)
        implied = sum(self.reasons[r.value] for r in _RESTART_REASONS)
        return ServiceMetrics(
            uptime_s=now - self._started,
            queue_depth=self.queue_depth,
            attempts_total=self.attempts_total,
            attempts_per_s=recent / span,
            requests_total=self.requests_total,
            rejected_requests=self.rejected_requests,
            timeouts=self.reasons[Reason.TIMEOUT.value] + self.request_timeouts,
            request_timeouts=self.request_timeouts,
            restarts=int(rt.get("restarts", implied)),
            cache_hits=self.cache_hits,
            sessions_open=len(self._sessions),
            warm_failures=self.warm_failures,
            memory_rss_mb=_rss_mb(),
            connections_timed_out=self.connections.header_timeouts,
            connections_evicted=self.connections.evicted,
            reasons=dict(self.reasons),
            runtime=rt,
        )


async def warm_runtime(runtime: Runtime, header: str) -> bool:
    """Load ``header``'s imports in the runtime's processes now, if it can (``runtime.warm``,
    or its process pool's ``warm``, as the ``local`` runtime has). False when it cannot."""
    warm = getattr(runtime, "warm", None)
    if not callable(warm):
        warm = getattr(getattr(runtime, "pool", None), "warm", None)
    if not callable(warm):
        log.warning("runtime %s cannot be warmed up; its first batch starts Lean", runtime.name)
        return False
    await warm(header)
    return True


def _runtime_numbers(runtime: Runtime) -> dict[str, float]:
    """Numbers the runtime reports: its ``metrics()`` if it has one, else the counters of its
    process pool (``runtime.pool.stats``, as the ``local`` runtime keeps them), where killed and
    recycled processes add up to ``restarts``."""
    raw: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        fn = getattr(runtime, "metrics", None)
        if callable(fn):
            raw = dict(fn())
        else:
            stats = getattr(getattr(runtime, "pool", None), "stats", None)
            if isinstance(stats, BaseModel):
                raw = stats.model_dump()
                raw.setdefault("restarts", raw.get("killed", 0) + raw.get("recycled", 0))
    return {
        k: float(v)
        for k, v in raw.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }


_INLINE_CHARS = 64 * 1024
"""Texts up to this size are scanned on the event loop (microseconds); larger ones in a thread,
whose hand-off would cost more than the scan for small texts on a loaded machine."""


async def _cpu(size: int, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``: inline for small inputs, in a worker thread for large ones (CPU work on
    big texts must not stall the event loop)."""
    if size <= _INLINE_CHARS:
        return fn(*args)
    return await asyncio.to_thread(fn, *args)


def _first_untrusted_problem(attempts: Sequence[Attempt]) -> str | None:
    for i, a in enumerate(attempts):
        why = trust.untrusted_attempt_problem(a, i)
        if why is not None:
            return why
    return None


def _consume(fut: asyncio.Future[Any]) -> None:
    # Mark a failed future's exception as seen when nobody was waiting on it.
    if not fut.cancelled():
        fut.exception()


def _digest(attempts: tuple[Attempt, ...]) -> str:
    data = json.dumps([a.model_dump(mode="json") for a in attempts], sort_keys=True)
    return hashlib.sha256(data.encode()).hexdigest()


def _rss_mb() -> float:
    try:
        import psutil

        proc = psutil.Process()
        total = proc.memory_info().rss
        for child in proc.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                total += child.memory_info().rss
        return total / 2**20
    except Exception:  # noqa: BLE001 - metrics must never fail a request
        return 0.0


_ENDPOINTS = (
    "POST /check, POST /sessions, POST /sessions/{id}/start, POST /sessions/{id}/tactic, "
    "DELETE /sessions/{id}, GET /health (also GET /), GET /metrics, and Kimina's POST /verify "
    "(/one_pass_verify_batch) and POST /api/check"
)


def create_app(runtime: Runtime, config: ServiceConfig | None = None) -> FastAPI:
    """The FastAPI app serving ``runtime``. The runtime is started and closed with the app."""
    config = config or ServiceConfig()
    config.check_auth()
    # Without a token any local user can call the service: it then accepts only plain headers
    # and statements (see leanrl.service.trust).
    service = VerificationService(
        runtime, config.limits, config.warm_headers, trusted=config.effective_token() is not None
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await service.start()
        try:
            yield
        finally:
            await service.close()

    app = FastAPI(title="leanrl verification service", lifespan=lifespan)
    app.state.service = service

    @app.exception_handler(_HTTPError)
    async def _on_httperror(_: Request, e: _HTTPError) -> JSONResponse:
        return error(e.status, e.message)

    @app.exception_handler(StarletteHTTPException)
    async def _on_starlette(request: Request, e: StarletteHTTPException) -> JSONResponse:
        where = f"{request.method} {request.url.path}"
        if e.status_code == 404:
            return error(404, f"no endpoint {where}; the service has {_ENDPOINTS}")
        if e.status_code == 405:
            allowed = {k.lower(): v for k, v in (e.headers or {}).items()}.get("allow", "")
            return error(
                405,
                f"{where} is not allowed; {request.url.path} takes {allowed or 'another method'}",
            )
        return error(e.status_code, str(e.detail))

    @app.exception_handler(RequestValidationError)
    async def _on_invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        errs = list(e.errors())
        if any(err.get("type") == "json_invalid" for err in errs):
            return error(400, "request body is not valid JSON")
        ctype = request.headers.get("content-type", "")
        if request.method == "POST" and "json" not in ctype:
            return error(
                415, f"send a JSON body with 'Content-Type: application/json' (got {ctype!r})"
            )
        lines = []
        for err in errs[:10]:
            loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "(body)"
            lines.append(f"{loc}: {err.get('msg')}")
        more = f" (and {len(errs) - 10} more)" if len(errs) > 10 else ""
        return error(422, "invalid request: " + "; ".join(lines) + more)

    @app.post("/check", response_model=CheckResponse)
    async def check(req: CheckRequest, request: Request) -> CheckResponse:
        key = request.headers.get(IDEMPOTENCY_HEADER)
        if key is not None and not (0 < len(key) <= 200):
            raise _HTTPError(400, f"{IDEMPOTENCY_HEADER} must be 1 to 200 characters")
        return await service.check(req.attempts, key)

    @app.post("/sessions", response_model=SessionOpened)
    async def open_session(req: OpenSession, request: Request) -> SessionOpened:
        conn = request.scope.get(CONNECTION_KEY)
        return SessionOpened(session_id=await service.open_session(req.header, req.policy, conn))

    @app.post("/sessions/{sid}/start", response_model=TacticState)
    async def start_proof(sid: str, req: StartProof, request: Request) -> TacticState:
        return await service.start_proof(sid, req, request.scope.get(CONNECTION_KEY))

    @app.post("/sessions/{sid}/tactic", response_model=TacticState)
    async def apply(sid: str, req: ApplyTactic, request: Request) -> TacticState:
        return await service.apply(sid, req, request.scope.get(CONNECTION_KEY))

    @app.delete("/sessions/{sid}", status_code=204)
    async def close_session(sid: str) -> Response:
        if not await service.close_session(sid):
            raise _HTTPError(404, f"no tactic session {sid!r}")
        return Response(status_code=204)

    @app.get("/health", response_model=Health)
    # Kimina's server answers its health on these too (its clients and load balancers ask
    # `GET /`); answered in place, not redirected.
    @app.get("/health/", response_model=Health, include_in_schema=False)
    @app.get("/", response_model=Health, include_in_schema=False)
    async def health() -> Health:
        return service.health()

    @app.get("/metrics", response_model=ServiceMetrics)
    async def metrics() -> ServiceMetrics:
        return service.metrics()

    app.include_router(kimina_router(service, config.kimina))
    app.add_middleware(Guard, service=service, token=config.effective_token())
    return app
