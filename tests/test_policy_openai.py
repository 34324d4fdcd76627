"""The openai policy against a real HTTP server on loopback that fails transiently."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from leanrl import ChatMessage, PolicyConfig, PolicyError, SamplingConfig
from leanrl.policies import make_policy
from leanrl.policies.openai import OpenAIPolicy


class Server:
    """An OpenAI-compatible server. Each prompt's first ``fail`` requests get 503/429 or a dropped
    connection; it records the peak number of requests in flight."""

    def __init__(
        self, fail: int = 2, delay_s: float = 0.05, status: int | None = None, garbage: int = 0
    ) -> None:
        self.fail, self.delay_s, self.status = fail, delay_s, status
        self.garbage = garbage  # then this many "200 OK" answers that are not JSON
        self.seen: dict[str, int] = {}
        self.bodies: list[dict[str, Any]] = []
        self.in_flight = 0
        self.peak = 0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._send(200, {"data": [{"id": "m"}]})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                key = json.dumps(body.get("prompt") or body.get("messages"))
                with server.lock:
                    server.bodies.append(body)
                    server.seen[key] = server.seen.get(key, 0) + 1
                    tries = server.seen[key]
                    server.in_flight += 1
                    server.peak = max(server.peak, server.in_flight)
                self._counted = True
                try:
                    time.sleep(server.delay_s)
                    if server.status is not None:
                        return self._send(server.status, {"error": "bad request"})
                    if tries <= server.fail:
                        if tries % 3 == 0:
                            self._leave()
                            self.connection.close()  # a dropped connection
                            return None
                        return self._send(503 if tries % 2 else 429, {"error": "busy"})
                    if tries <= server.fail + server.garbage:
                        blob = b"<html>gateway hiccup</html>"
                        self._leave()
                        self.send_response(200)
                        self.send_header("Content-Type", "text/html")
                        self.send_header("Content-Length", str(len(blob)))
                        self.end_headers()
                        self.wfile.write(blob)
                        return None
                    return self._send(200, server.answer(self.path, body))
                finally:
                    self._leave()

            def _leave(self) -> None:
                # Out of the count before the client can see the answer: once it has, it may
                # send its next request at once, and a count lowered only after the write let
                # a loaded machine see max_concurrency + 1 "in flight" (issue 42's loaded runs).
                if getattr(self, "_counted", False):
                    self._counted = False
                    with server.lock:
                        server.in_flight -= 1

            def _send(self, code: int, data: dict[str, Any]) -> None:
                self._leave()
                blob = json.dumps(data).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(blob)))
                if code == 429:
                    self.send_header("Retry-After", "0")
                self.end_headers()
                try:
                    self.wfile.write(blob)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up first (the timeout tests do that on purpose)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def answer(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        choices = []
        for i in range(body["n"]):
            if path.endswith("/chat/completions"):
                text = f"chat {i}: {body['messages'][-1]['content']}"
                choices.append(
                    {
                        "index": i,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": "stop",
                        "logprobs": {"content": [{"token": "x", "logprob": -0.25}] * 3},
                    }
                )
            else:
                choices.append(
                    {
                        "index": body["n"] - 1 - i,  # out of order: the client sorts by index
                        "text": f"{body['prompt']} -> {body['n'] - 1 - i}",
                        "finish_reason": "length" if i == 0 else "stop",
                        "logprobs": {"token_logprobs": [-1.0, -2.0]},
                    }
                )
        return {"choices": choices}

    def __enter__(self) -> Server:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *a: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[Server]:
    with Server() as s:
        yield s


def policy(url: str, **kw: Any) -> OpenAIPolicy:
    p = make_policy(PolicyConfig(model="m", backend="openai", base_url=url, **kw))
    assert isinstance(p, OpenAIPolicy)
    p.backoff_s = 0.01
    return p


async def test_retries_through_transient_failures_with_bounded_concurrency(server: Server) -> None:
    p = policy(server.url, max_concurrency=3, max_retries=4)
    prompts = [f"p{i}" for i in range(8)]
    out = await p.generate(prompts, SamplingConfig(n=2, max_tokens=5, seed=1, stop=["```"]))
    await p.close()
    assert [[c.text for c in row] for row in out] == [
        [f"p{i} -> 0", f"p{i} -> 1"] for i in range(8)
    ]
    assert out[0][0].logprobs == (-1.0, -2.0)
    assert {c.finish_reason for row in out for c in row} == {"stop", "length"}
    assert all(n == 3 for n in server.seen.values())  # two failures, then success
    assert p.retries == 16
    assert server.peak <= 3  # never more than max_concurrency requests in flight
    sent = server.bodies[-1]
    assert sent["stop"] == ["```"] and sent["seed"] == 1 and sent["max_tokens"] == 5


async def test_chat_prompts_go_to_chat_completions(server: Server) -> None:
    p = policy(server.url)
    msgs = [ChatMessage(role="system", content="S"), ChatMessage(role="user", content="prove it")]
    out = await p.generate([msgs], SamplingConfig(n=2))
    await p.close()
    assert [c.text for c in out[0]] == ["chat 0: prove it", "chat 1: prove it"]
    assert out[0][0].logprobs == (-0.25, -0.25, -0.25)
    assert server.bodies[-1]["messages"][0] == {"role": "system", "content": "S"}


async def test_gives_up_after_max_retries_and_on_client_errors() -> None:
    with Server(fail=100) as s:
        p = policy(s.url, max_retries=2)
        with pytest.raises(PolicyError, match="failed 3 times; last: RemoteProtocolError"):
            await p.generate(["x"], SamplingConfig())
        await p.close()
    with Server(status=400) as s:
        p = policy(s.url, max_retries=5)
        with pytest.raises(PolicyError, match=r"rejected the request.*HTTP 400"):
            await p.generate(["x"], SamplingConfig())
        assert len(s.bodies) == 1  # a 400 is not retried
        await p.close()


async def test_timeouts_are_retried_then_reported() -> None:
    with Server(fail=0, delay_s=1.0) as s:
        p = policy(s.url, max_retries=1, request_timeout_s=0.2)
        with pytest.raises(PolicyError, match="ReadTimeout"):
            await p.generate(["x"], SamplingConfig())
        await p.close()


async def test_nobody_listening_fails_at_start() -> None:
    with Server() as s:
        url = s.url
    p = policy(url)
    with pytest.raises(PolicyError, match="cannot reach the OpenAI-compatible server"):
        await p.start()


async def test_a_200_that_is_not_json_is_retried_then_reported() -> None:
    with Server(fail=0, garbage=1) as s:
        p = policy(s.url, max_retries=2)
        out = await p.generate(["x"], SamplingConfig())
        assert out[0][0].text == "x -> 0" and p.retries == 1
        await p.close()
    with Server(fail=0, garbage=100) as s:
        p = policy(s.url, max_retries=1)
        with pytest.raises(PolicyError, match="not a JSON object"):
            await p.generate(["x"], SamplingConfig())
        await p.close()


def test_one_policy_serves_several_event_loops() -> None:
    """`run_sync`, notebooks and trainers call the same policy from fresh event loops; the
    semaphore and connections of the first loop must not be reused in the next."""
    import asyncio

    with Server(fail=0) as s:
        p = policy(s.url, max_concurrency=1)  # one slot: the semaphore is contended
        for _ in range(2):
            out = asyncio.run(p.generate(["a", "b", "c"], SamplingConfig()))
            assert [row[0].text for row in out] == ["a -> 0", "b -> 0", "c -> 0"]
        asyncio.run(p.close())


async def test_one_failed_prompt_stops_the_others() -> None:
    """A prompt that fails for good ends the call; its siblings are cancelled, not left retrying
    in the background."""
    import asyncio

    class OneBad(Server):
        def answer(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
            if body["prompt"] == "bad":
                return {"choices": []}  # too few choices: a PolicyError, not retried
            time.sleep(0.5)  # the others are slow
            return super().answer(path, body)

    with OneBad(fail=0, delay_s=0.0) as s:
        p = policy(s.url, max_retries=3)
        with pytest.raises(PolicyError, match="returned 0 choices"):
            await p.generate(["bad", "slow1", "slow2"], SamplingConfig())
        me = asyncio.current_task()
        left = [t for t in asyncio.all_tasks() if t is not me and "_one" in repr(t.get_coro())]
        assert all(t.done() or t.cancelling() for t in left)  # nothing goes on retrying
        await asyncio.gather(*left, return_exceptions=True)
        await p.close()


async def test_a_server_that_ignores_n_is_asked_once_per_sample() -> None:
    class NoN(Server):
        def answer(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
            seed = body.get("seed")
            return {
                "choices": [
                    {"index": 0, "text": f"{body['prompt']}@{seed}", "finish_reason": "stop"}
                ]
            }

    with NoN(fail=0, delay_s=0.0) as s:
        p = policy(s.url)
        out = await p.generate(["a", "b"], SamplingConfig(n=3, seed=7))
        # every sample drawn, each with its own seed (one seed for all would repeat one sample)
        assert sorted(c.text for c in out[0]) == ["a@7", "a@8", "a@9"]
        assert sorted(c.text for c in out[1]) == ["b@7", "b@8", "b@9"]
        before = len(s.bodies)
        again = await p.generate(["c"], SamplingConfig(n=2, seed=0))
        assert sorted(c.text for c in again[0]) == ["c@0", "c@1"]
        assert len(s.bodies) - before == 2 and all(b["n"] == 1 for b in s.bodies[before:])
        await p.close()
