"""Connections of the verification service: no delayed small writes, and no lock-out by clients
that connect and then say nothing.

uvicorn has settings for most of this and they are used (``limit_concurrency``,
``timeout_keep_alive``, ``h11_max_incomplete_event_size``, ``backlog``); what it lacks is added
here, on its own h11 protocol class:

* **a header deadline**: a connection must send a complete request head within
  ``ServiceLimits.header_timeout_s`` of opening, or of its previous answer. uvicorn's keep-alive
  timer is cancelled by the first byte that arrives, so without this a client that sends one
  byte, or nothing, holds its connection forever.
* **room for real clients**: uvicorn answers 503 to every request once ``limit_concurrency``
  connections are open, whatever they are doing, so ~1,000 idle connections lock everyone out.
  Here a new connection that would reach the cap closes the connection that has waited longest
  without a request in progress instead. Only when every connection is busy with a request does
  a new one get uvicorn's 503.
* **a bound on the request head**: a head (request line and headers) over
  ``ServiceLimits.max_header_bytes`` is answered 431 and the connection closed. uvicorn's
  ``h11_max_incomplete_event_size`` bounds only the bytes buffered while a head is incomplete,
  so a 20-70 KB head arriving in one read was accepted whole.
* **TCP_NODELAY** on every accepted TCP socket: an answer is written in pieces (head, body), and
  with Nagle's algorithm the second piece waits for the client's delayed ACK, ~40 ms per request.
* **which connection a request came on, and which ones the client closed**: every request's
  scope carries its connection's number (:data:`CONNECTION_KEY`), and a connection closed by
  the client (end of stream or reset, not a close of the service's own) is reported to
  :attr:`ConnectionStats.on_client_closed`: the service closes the tactic sessions of a client
  that went away (``ServiceLimits.session_orphan_s``).

The body of a request is bounded by the app itself (:mod:`leanrl.service.guard`):
its size, the time it may take to arrive (``body_timeout_s``), and, with a token, only after the
token was checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
from collections.abc import Callable
from typing import Any

from leanrl._sandbox_config import ServiceLimits

__all__ = [
    "CONNECTION_KEY",
    "ConnectionStats",
    "guarded_protocol",
    "set_nodelay",
    "uvicorn_settings",
]

log = logging.getLogger("leanrl.service")

CONNECTION_KEY = "leanrl.connection"
"""The ASGI scope key holding the number of the connection a request came on (numbers are never
reused in one process). Absent where the service runs under another HTTP layer."""

_numbers = itertools.count(1)


def set_nodelay(sock: socket.socket | None) -> None:
    """Send small writes at once on a TCP socket (a no-op for unix sockets and None)."""
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class ConnectionStats:
    """Counts of connections the service closed on its own (for ``GET /metrics``)."""

    def __init__(self) -> None:
        self.header_timeouts = 0
        """Connections closed for not sending a request head in time."""
        self.evicted = 0
        """Idle connections closed to make room for a new one at the cap."""
        self.oversized_heads = 0
        """Requests answered 431 for a head over ``max_header_bytes``."""
        self.client_closed = 0
        """Connections the client closed (end of stream or reset)."""
        self.on_client_closed: Callable[[int], None] | None = None
        """Called with a connection's number (:data:`CONNECTION_KEY`) when its client closes it:
        not for connections the service closes itself (keep-alive, header deadline, eviction)."""


def head_bytes(request: Any) -> int:
    """The size of an ``h11.Request``'s head as sent: request line, headers, blank line (h11
    strips the whitespace around header values, so this is at most a few bytes short)."""
    line = len(request.method) + len(request.target) + len(b"  HTTP/1.1\r\n")
    fields = sum(len(k) + len(v) + 4 for k, v in request.headers.raw_items())
    return line + fields + 2


def uvicorn_settings(limits: ServiceLimits, stats: ConnectionStats) -> dict[str, Any]:
    """Keyword arguments for ``uvicorn.Config``: uvicorn's own limits, and the protocol class
    that adds the header deadline, idle eviction and TCP_NODELAY."""
    return {
        "http": guarded_protocol(limits, stats),
        # One above the cap: a connection closed to make room is only forgotten by uvicorn a
        # moment later, and the request that made room must not be refused meanwhile.
        "limit_concurrency": limits.max_connections + 1,
        "timeout_keep_alive": max(1, round(limits.keep_alive_s)),
        "h11_max_incomplete_event_size": limits.max_header_bytes,
        "backlog": limits.backlog,
    }


def guarded_protocol(limits: ServiceLimits, stats: ConnectionStats) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with a header deadline, idle eviction at the cap and TCP_NODELAY."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    header_s = limits.header_timeout_s
    cap = limits.max_connections
    max_head = limits.max_header_bytes

    class GuardedH11Protocol(H11Protocol):
        _idle_since = 0.0
        _deadline: asyncio.TimerHandle | None = None
        _number = 0
        _client_eof = False

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)  # type: ignore[arg-type]
            # Every request on this connection carries its number, so the service can tell which
            # client a tactic session belongs to and close it when that client goes away.
            self._number = number = next(_numbers)
            app = self.app

            async def numbered(scope: Any, receive: Any, send: Any) -> None:
                scope[CONNECTION_KEY] = number
                await app(scope, receive, send)

            self.app = numbered
            # Every event uvicorn reads goes through here, pipelined requests included, so each
            # request head is measured, however the bytes arrived.
            self._h11_next_event = self.conn.next_event
            self.conn.next_event = self._next_event  # type: ignore[method-assign]
            set_nodelay(transport.get_extra_info("socket"))
            self._idle_since = self.loop.time()
            self._deadline = self.loop.call_later(header_s, self._check_deadline)
            if len(self.connections) >= cap:
                self._make_room()

        def eof_received(self) -> None:
            self._client_eof = True  # the client closed its end (a FIN), not us
            super().eof_received()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
            super().connection_lost(exc)
            # Ours are plain closes (exc None, no end of stream first); the client's are its end
            # of stream, or a reset/error on the socket.
            if self._client_eof or exc is not None:
                stats.client_closed += 1
                if stats.on_client_closed is not None:
                    try:
                        stats.on_client_closed(self._number)
                    except Exception:  # a listener must not break the server
                        log.exception("the connection-closed listener failed")

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._idle_since = self.loop.time()  # the next request head is due from now

        def _next_event(self) -> Any:
            """h11's next event, or (after answering 431 and closing) ``PAUSED`` for a head over
            ``max_header_bytes``: one that arrived whole, which h11 accepts (it bounds only the
            bytes of an incomplete event), or one still incomplete past the bound, for which
            h11 raises and uvicorn would answer a bare 400."""
            try:
                event = self._h11_next_event()
            except h11.RemoteProtocolError as e:
                if e.error_status_hint != 431:
                    raise
            else:
                if not isinstance(event, h11.Request) or head_bytes(event) <= max_head:
                    return event
            stats.oversized_heads += 1
            log.info("answering %s 431: request head over %d bytes", self.client, max_head)
            body = (
                f"request head (request line and headers) larger than {max_head} bytes "
                "(limits.max_header_bytes)"
            ).encode()
            head = (
                b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
                b"content-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
                b"content-length: " + str(len(body)).encode() + b"\r\n\r\n"
            )
            # Written directly, not through h11: its state for a refused head is not one it
            # would send a response from in every case (an incomplete head is an ERROR state).
            self.transport.write(head + body)
            self.transport.close()
            return h11.PAUSED  # uvicorn then stops reading; the app never sees the request

        def _busy(self) -> bool:
            return self.cycle is not None and not self.cycle.response_complete

        def _check_deadline(self) -> None:
            self._deadline = None
            if self.transport.is_closing():
                return
            waited = self.loop.time() - self._idle_since
            if self._busy():
                wait = header_s  # a request is running: its own timeouts apply
            elif waited >= header_s:
                stats.header_timeouts += 1
                log.info("closing %s: no request head within %g s", self.client, header_s)
                self.transport.close()
                return
            else:
                wait = header_s - waited
            self._deadline = self.loop.call_later(wait, self._check_deadline)

        def _make_room(self) -> None:
            idle = [
                c
                for c in self.connections
                if c is not self
                and isinstance(c, GuardedH11Protocol)
                and not c._busy()
                and not c.transport.is_closing()
            ]
            if not idle:
                return  # every connection is working: uvicorn answers this one 503
            victim = min(idle, key=lambda c: c._idle_since)
            stats.evicted += 1
            victim.transport.close()

    return GuardedH11Protocol
