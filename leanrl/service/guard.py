"""The verification service's ASGI middleware: counting, bearer auth, body size and deadlines.

Every request passes here before any handler: the token is checked first (so nothing of an
unauthenticated request's body is read), then the body is read within its size limit and
``body_timeout_s``, then the handler runs within ``request_timeout_s``.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol

from fastapi.responses import JSONResponse

from leanrl._sandbox_config import ServiceLimits

__all__ = ["Counted", "Guard", "error"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class Counted(Protocol):
    """What the guard reads and counts on the service it guards
    (:class:`~leanrl.service.app.VerificationService`)."""

    limits: ServiceLimits
    requests_total: int
    rejected_requests: int
    request_timeouts: int


_PUBLIC = frozenset({"/health", "/health/", "/"})
"""Paths answered without the token: the health check (``GET /`` is Kimina's, which its
server answers without a key too)."""


def error(status: int, message: str) -> JSONResponse:
    """The service's error answer: ``{"error": message}`` with ``status``."""
    return JSONResponse({"error": message}, status_code=status)


class Guard:
    """ASGI middleware: counting, bearer auth, body size limit and the request timeout.

    Pure ASGI (not ``BaseHTTPMiddleware``) so the timeout really cancels the handler and an
    oversized body is refused while it streams in, before more than the limit is in memory.
    """

    def __init__(self, app: ASGIApp, service: Counted, token: str | None) -> None:
        self.app = app
        self.service = service
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        svc = self.service
        svc.requests_total += 1
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        started = False

        async def send_wrapped(msg: Message) -> None:
            nonlocal started
            if msg["type"] == "http.response.start":
                started = True
                if 400 <= msg["status"] < 500:
                    svc.rejected_requests += 1
            await send(msg)

        async def reply(status: int, message: str) -> None:
            await error(status, message)(scope, receive, send_wrapped)

        if self.token and scope["path"] not in _PUBLIC:
            auth = headers.get("authorization", "")
            given = auth[7:] if auth.lower().startswith("bearer ") else ""
            if not secrets.compare_digest(given.encode(), self.token.encode()):
                what = "wrong bearer token" if given else "missing bearer token"
                await reply(401, f"{what}: send 'Authorization: Bearer <token>'")
                return
        limit = svc.limits.max_body_bytes
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await reply(413, f"request body of {length} bytes is over the limit of {limit} bytes")
            return
        # Read the whole body here (it is bounded by the limit) so an oversized chunked body is
        # refused with 413 before any handler sees it. Reading it counts against the request
        # timeout: a client that trickles or stops sending its body cannot hold a connection.
        timeout_s = svc.limits.request_timeout_s
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        body_s = min(timeout_s, svc.limits.body_timeout_s)
        body_deadline = loop.time() + body_s
        chunks: list[bytes] = []
        seen = 0
        more = True
        while more:
            try:
                msg = await asyncio.wait_for(receive(), max(0.0, body_deadline - loop.time()))
            except asyncio.TimeoutError:
                svc.request_timeouts += 1
                await reply(
                    408,
                    f"request body not received within the service's limit of {body_s:g} s "
                    f"({seen} bytes came); send the whole body at once",
                )
                return
            if msg["type"] != "http.request":
                return  # the client went away
            chunk = msg.get("body", b"")
            seen += len(chunk)
            if seen > limit:
                await reply(413, f"request body is over the limit of {limit} bytes")
                return
            chunks.append(chunk)
            more = msg.get("more_body", False)
        replayed = False

        async def receive_buffered() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        try:
            await asyncio.wait_for(
                self.app(scope, receive_buffered, send_wrapped), max(0.0, deadline - loop.time())
            )
        except asyncio.TimeoutError:
            svc.request_timeouts += 1
            if not started:
                await reply(
                    504,
                    f"request took longer than the service's limit of {timeout_s:g} s and was "
                    "cancelled",
                )
