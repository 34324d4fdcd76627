"""The loopback endpoint outside agent programs talk to: OpenAI chat completions answered by
the policy under evaluation or training, and the episode's Lean tools.

One server serves every episode of a harness run. Each episode has its own API key (a random
bearer token, handed to its program as ``OPENAI_API_KEY``), which routes its requests to its
:class:`~leanrl.harnesses.external.session.Session`; a key that is not live (an episode that is
over, a guess) gets 401. Routes:

=================================  =============================================================
``POST /v1/chat/completions``      one model turn (``stream`` too: sent whole, as SSE chunks)
``GET /v1/models``                 the served model's name
``GET /leanrl/task``               the episode's task (name, header, statement, informal text)
``GET /leanrl/tools``              the episode's tools in the OpenAI ``tools`` format
``POST /leanrl/tools/{name}``      call one (JSON arguments in; ``result``, ``ok``,
                                   ``submitted`` out); ``submit`` hands in the proof
=================================  =============================================================

uvicorn serves the Starlette app on its own event loop in a daemon thread (so it neither
installs signal handlers in the caller's main thread nor waits on it); each request is run on
the harness's event loop, where the policy and the runtime live, and its answer handed back.
The server binds 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import socket
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from leanrl._dist import require
from leanrl.errors import ConfigError
from leanrl.policy import Policy, SamplingConfig

from ..tool_use.chat import ChatFormat, MessagesBackend, TokenBackend
from .session import RequestError, Session, response_body, stream_chunks

__all__ = ["Endpoint"]


class Endpoint:
    """The server, the policy behind it, and the live sessions (by API key)."""

    def __init__(
        self,
        policy: Policy,
        sampling: SamplingConfig,
        backend: TokenBackend | MessagesBackend,
        fmt: ChatFormat | None,
        parser: str,
    ) -> None:
        self.policy, self.sampling = policy, sampling
        self.backend, self.fmt, self.parser = backend, fmt, parser
        self.sessions: dict[str, Session] = {}
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT`` (``/v1`` is the OpenAI base URL)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def model(self) -> str:
        """The model name the endpoint reports."""
        return self.policy.config.model or self.policy.name

    def open(self, session: Session) -> None:
        """Route ``session.key`` to ``session``."""
        self.sessions[session.key] = session

    def close_session(self, session: Session) -> None:
        """Stop routing the session's key; later requests with it get 401."""
        session.closed = True
        self.sessions.pop(session.key, None)

    async def start(self) -> None:
        """Bind a free loopback port and serve (returns once the server listens)."""
        require("uvicorn", "serve", "the external harness's endpoint")
        require("starlette", "serve", "the external harness's endpoint")
        import uvicorn

        self._loop = asyncio.get_running_loop()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        self._sock, self.port = sock, sock.getsockname()[1]
        self._server = uvicorn.Server(
            uvicorn.Config(
                self._app(),
                log_level="critical",
                log_config=None,  # leave the caller's logging alone
                lifespan="off",
                access_log=False,
            )
        )
        ready = threading.Event()
        failed: list[BaseException] = []

        def serve() -> None:
            try:
                asyncio.run(self._server.serve(sockets=[sock]))
            except BaseException as e:  # noqa: BLE001 - reported to start()
                failed.append(e)
            finally:
                ready.set()

        self._thread = threading.Thread(target=serve, name="leanrl-external-endpoint", daemon=True)
        self._thread.start()
        while not self._server.started and not ready.is_set():
            await asyncio.sleep(0.01)
        if failed or not self._server.started:
            raise ConfigError(f"the external harness's endpoint did not start: {failed or '?'}")

    async def close(self) -> None:
        """Stop serving (idempotent)."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10)
            self._thread = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    # -- the app ---------------------------------------------------------------------------------

    def _app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse, Response, StreamingResponse
        from starlette.routing import Route

        def error(status: int, message: str, kind: str) -> JSONResponse:
            return JSONResponse({"error": {"message": message, "type": kind}}, status)

        async def on_loop(fn: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
            assert self._loop is not None
            fut: concurrent.futures.Future[Any] = asyncio.run_coroutine_threadsafe(fn(), self._loop)
            return await asyncio.wrap_future(fut)

        def session_of(request: Request) -> Session | None:
            auth = request.headers.get("authorization", "")
            return self.sessions.get(auth.removeprefix("Bearer ").strip())

        async def read(request: Request) -> Any:
            try:
                return json.loads(await request.body() or b"{}")
            except ValueError as e:
                raise RequestError(f"the body is not JSON ({e})") from None

        async def guarded(
            request: Request, work: Callable[[Session], Awaitable[Response]]
        ) -> Response:
            session = session_of(request)
            if session is None:
                return error(401, "unknown or expired API key", "invalid_api_key")
            try:
                return await work(session)
            except RequestError as e:
                session.refused += 1
                return error(e.status, str(e), e.kind)
            except Exception as e:  # noqa: BLE001 - the policy or leanrl failed: the run says so
                session.errors.append(e)
                return error(500, f"{type(e).__name__}: {e}", "server_error")

        async def chat(request: Request) -> Response:
            async def work(session: Session) -> Response:
                body = await read(request)
                if not isinstance(body, dict):
                    raise RequestError("the body must be a JSON object")
                c, _parsed, assistant = await on_loop(
                    lambda: session.chat(
                        body, self.backend, self.fmt, self.parser, self.sampling, self.policy
                    )
                )
                out = response_body(c, assistant, self.model, bool(body.get("logprobs")))
                if not body.get("stream"):
                    return JSONResponse(out)
                events = "".join(f"data: {json.dumps(ch)}\n\n" for ch in stream_chunks(out))

                async def sse() -> Any:
                    yield events + "data: [DONE]\n\n"

                return StreamingResponse(sse(), media_type="text/event-stream")

            return await guarded(request, work)

        async def models(request: Request) -> Response:
            async def work(session: Session) -> Response:
                return JSONResponse(
                    {"object": "list", "data": [{"id": self.model, "object": "model"}]}
                )

            return await guarded(request, work)

        async def task(request: Request) -> Response:
            async def work(session: Session) -> Response:
                t = session.task
                return JSONResponse(
                    {
                        "id": t.id,
                        "name": t.name,
                        "header": t.header,
                        "formal_statement": t.formal_statement,
                        "informal_statement": t.informal_statement,
                    }
                )

            return await guarded(request, work)

        async def tools(request: Request) -> Response:
            async def work(session: Session) -> Response:
                return JSONResponse([t.schema() for t in session.tools.tools])

            return await guarded(request, work)

        async def call(request: Request) -> Response:
            async def work(session: Session) -> Response:
                args = await read(request)
                name = request.path_params["name"]
                return JSONResponse(await on_loop(lambda: session.call_tool(name, args)))

            return await guarded(request, work)

        return Starlette(
            routes=[
                Route("/v1/chat/completions", chat, methods=["POST"]),
                Route("/v1/models", models, methods=["GET"]),
                Route("/leanrl/task", task, methods=["GET"]),
                Route("/leanrl/tools", tools, methods=["GET"]),
                Route("/leanrl/tools/{name}", call, methods=["POST"]),
            ]
        )
