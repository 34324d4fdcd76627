"""The small interface between the sandboxed runtimes and whatever starts sandboxes.

A :class:`SandboxBackend` starts one sandbox running ``leanrl serve`` and hands back a
:class:`Sandbox`: where its service answers (a URL, or a unix socket) and how to stop it. The warm
pool, batching, retries and cost accounting are the same for every backend (Docker containers,
Modal Sandboxes, local processes); only this interface differs.
"""

from __future__ import annotations

import abc
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from leanrl.errors import RuntimeUnavailable

__all__ = [
    "Sandbox",
    "SandboxBackend",
    "SandboxStartError",
    "process_gone",
    "process_start_time",
]


def process_start_time(pid: int) -> str:
    """When process ``pid`` started (seconds since the epoch, 2 decimals), or ``unknown``.

    A pid alone does not name a process for long: pids are reused, and a program started in a
    fresh container gets the same small pid every run. Owner labels of sandboxes therefore
    record the pid together with this."""
    try:
        import psutil

        return f"{psutil.Process(pid).create_time():.2f}"
    except Exception:  # noqa: BLE001 - unknown: owner checks fall back to the pid alone
        return "unknown"


def process_gone(pid: int, start: str | None) -> bool:
    """True when the process ``pid`` that started at ``start`` (as :func:`process_start_time`
    wrote it; None or ``unknown``: not recorded) no longer runs on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # it exists, as another user
    if not start or start in ("unknown", "?"):
        return False
    now = process_start_time(pid)
    try:
        return now != "unknown" and abs(float(now) - float(start)) > 1.0
    except ValueError:
        return False


class SandboxStartError(RuntimeUnavailable):
    """A sandbox could not be started (the message says why: no engine, bad image, ...)."""


@dataclass(eq=False)
class Sandbox(abc.ABC):
    """A started sandbox whose verification service answers at ``url`` (or ``uds``)."""

    id: str
    """Backend id (container id, Modal Sandbox id, process id)."""
    url: str
    """Base URL of the service (``http://localhost`` for unix sockets)."""
    token: str | None = None
    """Bearer token of its service."""
    uds: str | None = None
    """Unix socket of its service, when it listens on one."""
    cpu: float = 1.0
    """CPU cores reserved for it (the rate of CPU-second accounting)."""
    created_at: float = field(default_factory=time.monotonic)
    """``time.monotonic()`` when its creation began (billing starts then)."""
    uses: int = 0
    """Batches (or tactic sessions) it has served."""
    terminated_at: float | None = None
    """When :meth:`terminate` finished (None while it lives)."""
    isolated: bool | None = None
    """Whether its service's ``/health`` says the Lean processes inside are isolated from each
    other (None: no healthy answer yet). Set by :meth:`note_isolation`; once False it stays
    False."""
    isolation_note: str = ""
    """Why they are not isolated, as its service said (or that it said nothing)."""

    def note_isolation(self, isolated: bool | None, note: str = "") -> None:
        """Record what a healthy ``/health`` answer said about isolation. A service that does
        not say (``None``: a runtime without the report, an image of an older leanrl) counts as
        not isolated. Only the first answer can make it True; a later answer can take it back
        but never give it again, so a sandbox once seen unisolated is never trusted later."""
        ok = isolated is True
        why = "" if ok else note or "its service does not report isolated Lean processes"
        if self.isolated is None or (self.isolated and not ok):
            self.isolated, self.isolation_note = ok, why

    @abc.abstractmethod
    async def terminate(self) -> None:
        """Stop it and free everything it holds. Idempotent; never raises for a dead one."""

    async def alive(self) -> bool:
        """Cheap liveness check (process/container still running). Default: assume so."""
        return self.terminated_at is None

    def cpu_seconds(self) -> float | None:
        """CPU time it has actually used so far, when the backend can measure it."""
        return None

    async def exit_reason(self) -> str:
        """Why it stopped (an exit code, the end of its log), for the error of a sandbox that
        died while starting. Called before :meth:`terminate`. Default: nothing known."""
        return ""

    def age_s(self, now: float | None = None) -> float:
        """Seconds since creation began."""
        return (now if now is not None else time.monotonic()) - self.created_at

    def lifetime_s(self, now: float | None = None) -> float:
        """Seconds it has existed (up to termination): what a provider bills."""
        end = self.terminated_at if self.terminated_at is not None else now or time.monotonic()
        return end - self.created_at


class SandboxBackend(abc.ABC):
    """Starts sandboxes. :meth:`create` is the one method that matters."""

    name: str = ""
    """Short name for messages and metrics (``docker``, ``modal``, ``local``)."""

    def __init__(self, serve_args: Sequence[str] = ()) -> None:
        self.serve_args = list(serve_args)
        """``leanrl serve`` flags for the service in each sandbox (inner runtime, limits)."""
        self.warm_headers: list[str] = []
        """Headers each new sandbox loads before it counts as ready (the runtime adds to it)."""

    def service_args(self) -> list[str]:
        """The flags for the next sandbox: ``serve_args`` plus the current warm-up headers."""
        if not self.warm_headers:
            return list(self.serve_args)
        return [*self.serve_args, "--warm_headers", json.dumps(self.warm_headers)]

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Prepare (check the engine, clean up leftovers). Raises
        :class:`SandboxStartError` with a fix when the backend cannot work at all."""

    @abc.abstractmethod
    async def create(self) -> Sandbox:
        """Start one sandbox running the service. Returns once its address is known; the pool
        then waits for ``GET /health``. Raises :class:`SandboxStartError` on failure and must
        leave nothing running when it raises or is cancelled."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release backend-wide resources (after every sandbox was terminated)."""
