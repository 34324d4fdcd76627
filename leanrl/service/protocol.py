"""The JSON the verification service speaks: frozen models shared by the server and the client.

=========================  =====================  ========================================
endpoint                   body                   answer
=========================  =====================  ========================================
``POST /check``            :class:`CheckRequest`   :class:`CheckResponse` (Verdicts in order)
``POST /sessions``         :class:`OpenSession`    :class:`SessionOpened`
``POST /sessions/{id}/start``  :class:`StartProof`  :class:`~leanrl.TacticState`
``POST /sessions/{id}/tactic`` :class:`ApplyTactic` :class:`~leanrl.TacticState`
``DELETE /sessions/{id}``  (none)                 204
``GET /health``            (none)                 :class:`Health`
``GET /metrics``           (none)                 :class:`ServiceMetrics`
=========================  =====================  ========================================

Errors are ``{"error": "..."}`` with a 4xx/5xx status. ``POST /check`` takes an optional
``Idempotency-Key`` header: a request repeated with the same key gets the first answer (or waits
for it) instead of a second check.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from leanrl.verdict import Attempt, Verdict, VerificationPolicy

__all__ = [
    "IDEMPOTENCY_HEADER",
    "ApplyTactic",
    "CheckRequest",
    "CheckResponse",
    "ErrorBody",
    "Health",
    "OpenSession",
    "ServiceMetrics",
    "SessionOpened",
    "StartProof",
]

IDEMPOTENCY_HEADER = "Idempotency-Key"


class _Wire(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CheckRequest(_Wire):
    """A batch of attempts to check."""

    attempts: tuple[Attempt, ...]
    """The attempts, answered in this order."""


class CheckResponse(_Wire):
    """One Verdict per attempt, in the order they were sent."""

    verdicts: tuple[Verdict, ...]
    """The Verdicts."""
    cached: bool = False
    """True when this answer was replayed from the idempotency cache (not checked again)."""


class OpenSession(_Wire):
    """Open a tactic-mode session under a header."""

    header: str
    """Imports/options/opens the proofs in this session run under."""
    policy: VerificationPolicy | None = None
    """The rules tactics are pre-scanned under (the taskset's); default: the strict policy."""


class SessionOpened(_Wire):
    """A session was opened."""

    session_id: str
    """Id to use in ``/sessions/{id}/...``."""


class StartProof(_Wire):
    """Elaborate a statement with a hole and return its goal."""

    formal_statement: str
    """The statement, ending in ``:= by``."""
    preamble: str = ""
    """Helper declarations placed before the statement."""


class ApplyTactic(_Wire):
    """Run one tactic on a proof state."""

    proof_state: int
    """The ``proof_state`` from an earlier answer."""
    tactic: str
    """The tactic text."""


class ErrorBody(_Wire):
    """What every 4xx/5xx answer carries."""

    error: str
    """What was wrong and how to fix it."""


class Health(_Wire):
    """``GET /health``: the service is up and its runtime started."""

    status: str = "ok"
    """``ok`` once the runtime has started; ``starting`` before; ``degraded`` while the runtime
    reports an ``infra:`` problem (Lean processes failing to start), so that a sandbox pool
    replaces this sandbox."""
    problems: tuple[str, ...] = ()
    """What keeps the runtime from checking attempts now (its ``problems()``): ``infra: ...``
    lines (start failures in a row; the runtime keeps trying) and ``header: ...`` lines (a
    taskset header Lean refuses)."""
    runtime: str = ""
    """Name of the wrapped runtime."""
    pid: int = 0
    """Process id of the service (handy when several run on one machine)."""
    lean_version: str | None = None
    """The Lean version the wrapped runtime runs (its ``lean_version()``), once started."""
    isolated: bool | None = None
    """Whether the wrapped runtime's Lean processes are isolated from each other (its
    ``isolation()``): True when each runs under bubblewrap, so code one attempt manages to run
    cannot reach the processes that check later attempts; False when not
    (``isolation_note`` says why); None before the runtime started or when it does not say.
    Sandbox pools give a sandbox more than one batch only when this is True
    (``PoolConfig.reuse``)."""
    isolation_note: str = ""
    """Why the Lean processes are not isolated (empty when they are, or when nobody says)."""


class ServiceMetrics(_Wire):
    """``GET /metrics``: counters since the service started."""

    uptime_s: float
    """Seconds since start-up."""
    queue_depth: int
    """Attempts received and not yet answered."""
    attempts_total: int
    """Attempts answered (cache replays not counted)."""
    attempts_per_s: float
    """Attempts answered per second over the last minute."""
    requests_total: int
    """HTTP requests handled."""
    rejected_requests: int
    """Requests answered with a 4xx."""
    timeouts: int
    """Attempts whose Verdict was ``timeout`` plus requests that hit the request timeout."""
    request_timeouts: int
    """Requests that hit the service's request timeout (answered 504)."""
    restarts: int
    """Lean process restarts reported by the runtime (or, if it reports none, Verdicts that
    imply one: timeout, memory, crash)."""
    cache_hits: int
    """Requests answered from the idempotency cache."""
    sessions_open: int
    """Tactic sessions open now."""
    warm_failures: int = 0
    """Warm-up headers that failed to load at start (the service runs on, colder)."""
    memory_rss_mb: float
    """Resident memory of the service and its child processes, in MiB."""
    connections_timed_out: int = 0
    """Connections closed for not sending a request head within ``header_timeout_s``."""
    connections_evicted: int = 0
    """Idle connections closed to make room for a new one at ``max_connections``."""
    reasons: dict[str, int] = Field(default_factory=dict)
    """Verdict counts by reason."""
    runtime: dict[str, float] = Field(default_factory=dict)
    """Numeric metrics the runtime reports itself (``runtime.metrics()``, when it has one)."""
