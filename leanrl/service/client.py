"""The one HTTP client every runtime uses to talk to a verification service (``leanrl serve``).

Transient failures (connection refused or reset, a read that timed out, 429/502/503) are retried
with exponential backoff. Every ``check`` carries an idempotency key that stays the same across
its retries, so a batch whose answer was lost on the way back is replayed from the service's
cache instead of being checked a second time. Requests that are not idempotent and carry no key
(opening a tactic session, a tactic step) are retried only when they certainly never reached the
service (the connection could not be made) or were refused before any work (429): a retry after
a lost answer would do the work twice.

Failures the retries cannot fix raise :class:`ServiceError` (a
:class:`~leanrl.errors.RuntimeUnavailable`): the sandboxed runtimes treat it as "this sandbox is
gone". A 4xx (the request itself was wrong) raises :class:`~leanrl.errors.ConfigError` with the
service's message.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import httpx
from pydantic import ValidationError

from leanrl._sandbox_config import ClientConfig
from leanrl.errors import ConfigError, RuntimeUnavailable
from leanrl.runtime import TacticSession, TacticState
from leanrl.service.protocol import (
    IDEMPOTENCY_HEADER,
    CheckResponse,
    Health,
    OpenSession,
    ServiceMetrics,
    SessionOpened,
)
from leanrl.verdict import Attempt, Verdict, VerificationPolicy

__all__ = ["ServiceClient", "ServiceError", "ServiceRejected"]

_TRANSIENT_STATUS = {429, 502, 503}
_NOT_STARTED_STATUS = {429}
"""Answers that mean the request was refused before any work was done."""
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
"""Transport errors raised before the request left this machine."""
_SAFE_METHODS = {"GET", "HEAD", "OPTIONS", "DELETE"}


class ServiceError(RuntimeUnavailable):
    """The service could not answer (unreachable, timed out, or failing after every retry)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ServiceRejected(ConfigError):
    """The service refused the request itself (a 4xx): the message says why, ``status`` which."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class ServiceClient:
    """Async client of one verification service.

    ``base_url`` is ``http://host:port`` (or any URL prefix). ``uds`` connects through a unix
    socket instead (give a ``base_url`` such as ``http://localhost``; its host is ignored). ``http`` lets several clients share one
    ``httpx.AsyncClient`` and its connection pool (TCP only). Nothing connects before the first
    request.
    """

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        config: ClientConfig | None = None,
        *,
        uds: str | None = None,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        if http is not None and uds is not None:
            raise ConfigError("a shared httpx client cannot be used with a unix socket")
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.config = config or ClientConfig()
        self.uds = uds
        self._http = http
        self._owns_http = http is None
        self.retries_done = 0
        """Requests retried so far (for metrics and tests)."""

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            transport = httpx.AsyncHTTPTransport(uds=self.uds) if self.uds else None
            self._http = httpx.AsyncClient(transport=transport, timeout=self._timeout())
        if self._http.is_closed:  # a shared connection pool closed by its owner (a runtime)
            raise ServiceError(f"the connection pool for {self.base_url} was closed")
        return self._http

    def _timeout(self) -> httpx.Timeout:
        c = self.config
        return httpx.Timeout(c.request_timeout_s, connect=c.connect_timeout_s)

    async def close(self) -> None:
        """Close the connection pool (only if this client created it)."""
        if self._owns_http and self._http is not None:
            await self._http.aclose()
            self._http = None

    async def __aenter__(self) -> ServiceClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the endpoints ----------------------------------------------------------------------

    async def check(self, attempts: Sequence[Attempt], key: str | None = None) -> list[Verdict]:
        """One Verdict per attempt, in order. ``key`` defaults to a fresh idempotency key."""
        if not attempts:
            return []
        key = key or uuid.uuid4().hex
        body = {"attempts": [a.model_dump(mode="json") for a in attempts]}
        data = await self._request("POST", "/check", json=body, headers={IDEMPOTENCY_HEADER: key})
        try:
            resp = CheckResponse.model_validate(data)
        except ValidationError as e:
            # A broken or impostor service: the sandbox is unusable, not the batch.
            raise ServiceError(
                f"service at {self.base_url} answered /check with something that is no "
                f"CheckResponse: {str(e)[:500]}"
            ) from None
        if len(resp.verdicts) != len(attempts):
            raise ServiceError(
                f"service at {self.base_url} answered {len(resp.verdicts)} verdicts for "
                f"{len(attempts)} attempts"
            )
        return list(resp.verdicts)

    async def health(self, retries: int | None = None, timeout_s: float | None = None) -> Health:
        """``GET /health`` (``retries=0`` and a short ``timeout_s`` for a quick probe)."""
        data = await self._request("GET", "/health", retries=retries, timeout_s=timeout_s)
        return Health.model_validate(data)

    async def metrics(self) -> ServiceMetrics:
        """``GET /metrics``."""
        return ServiceMetrics.model_validate(await self._request("GET", "/metrics"))

    def tactic_session(
        self, header: str, policy: VerificationPolicy | None = None
    ) -> AbstractAsyncContextManager[TacticSession]:
        """A tactic-mode session on the service (closed on exit); tactics judged by ``policy``."""

        @contextlib.asynccontextmanager
        async def session() -> AsyncIterator[TacticSession]:
            opened = SessionOpened.model_validate(
                await self._request(
                    "POST",
                    "/sessions",
                    json=OpenSession(header=header, policy=policy).model_dump(mode="json"),
                )
            )
            remote = RemoteTacticSession(self, opened.session_id)
            try:
                yield remote
            finally:
                await remote.close()

        return session()

    # -- plumbing ---------------------------------------------------------------------------

    async def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        headers: dict[str, str] | None = None,
        retries: int | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        hdrs = dict(headers or {})
        if self.token:
            hdrs["Authorization"] = f"Bearer {self.token}"
        tries = 1 + (self.config.retries if retries is None else retries)
        delay = self.config.backoff_s
        wait_hint: float | None = None
        last = ""
        status: int | None = None
        url = self.base_url + path
        timeout = self._timeout() if timeout_s is None else httpx.Timeout(timeout_s)
        idempotent = method.upper() in _SAFE_METHODS or IDEMPOTENCY_HEADER in hdrs
        for i in range(tries):
            if i:
                self.retries_done += 1
                # Jittered, so many batches failing together do not retry in lockstep; capped;
                # a service that says when to come back (Retry-After) is believed, within a cap.
                pause = min(delay, self.config.max_backoff_s) * random.uniform(0.5, 1.0)
                if wait_hint is not None:
                    pause = min(wait_hint, self.config.max_backoff_s)
                await asyncio.sleep(pause)
                delay *= 2
                wait_hint = None
            try:
                r = await self._client().request(
                    method, url, json=json, headers=hdrs, timeout=timeout
                )
            except httpx.TransportError as e:
                last, status = f"{type(e).__name__}: {e}", None
                if idempotent or isinstance(e, _NOT_SENT):
                    continue
                raise ServiceError(
                    f"verification service at {self.base_url} failed {method} {path} "
                    f"({last}); not retried: it may have been done already",
                ) from e
            if r.status_code < 300:
                if not r.content:
                    return None
                try:
                    return r.json()
                except ValueError:
                    raise ServiceError(
                        f"verification service at {self.base_url} answered {method} {path} "
                        f"with invalid JSON: {r.text[:200]!r}",
                        r.status_code,
                    ) from None
            msg = _error_text(r)
            if r.status_code in _TRANSIENT_STATUS and (
                idempotent or r.status_code in _NOT_STARTED_STATUS
            ):
                last, status = f"{r.status_code}: {msg}", r.status_code
                wait_hint = _retry_after(r)
                continue
            if 400 <= r.status_code < 500:
                raise ServiceRejected(
                    f"verification service rejected {method} {path} ({r.status_code}): {msg}",
                    r.status_code,
                )
            raise ServiceError(
                f"verification service at {self.base_url} failed {method} {path} "
                f"({r.status_code}): {msg}",
                r.status_code,
            )
        raise ServiceError(
            f"verification service at {self.base_url} unreachable for {method} {path} after "
            f"{tries} tries: {last}",
            status,
        )


class RemoteTacticSession(TacticSession):
    """A tactic session living in a remote service."""

    def __init__(self, client: ServiceClient, session_id: str) -> None:
        self.client = client
        self.session_id = session_id
        self._closed = False

    async def start(self, formal_statement: str, preamble: str = "") -> TacticState:
        data = await self.client._request(
            "POST",
            f"/sessions/{self.session_id}/start",
            json={"formal_statement": formal_statement, "preamble": preamble},
        )
        return TacticState.model_validate(data)

    async def apply(self, proof_state: int, tactic: str) -> TacticState:
        data = await self.client._request(
            "POST",
            f"/sessions/{self.session_id}/tactic",
            json={"proof_state": proof_state, "tactic": tactic},
        )
        return TacticState.model_validate(data)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # The service reaps idle sessions anyway; a failed close must not hide the real error.
        with contextlib.suppress(ServiceError, ConfigError):
            await self.client._request("DELETE", f"/sessions/{self.session_id}", retries=0)


def _retry_after(r: httpx.Response) -> float | None:
    """Seconds from a ``Retry-After: <seconds>`` header (HTTP dates are ignored)."""
    try:
        value = float(r.headers.get("retry-after", ""))
    except ValueError:
        return None
    return value if value >= 0 else None


def _error_text(r: httpx.Response) -> str:
    try:
        data = r.json()
    except ValueError:
        return r.text[:500] or r.reason_phrase
    if isinstance(data, dict) and "error" in data:
        return str(data["error"])
    return str(data)[:500]
