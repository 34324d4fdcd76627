"""``openai`` policy: any OpenAI-compatible server (vLLM, SGLang, hosted APIs) over httpx.

Text prompts go to ``/completions``, chat prompts to ``/chat/completions``. Requests are async,
at most ``max_concurrency`` in flight, retried with exponential backoff on 429, 5xx and
connection errors, and bounded by ``request_timeout_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from leanrl.errors import PolicyError
from leanrl.policies._common import to_messages
from leanrl.policy import (
    Completion,
    Policy,
    PolicyConfig,
    Prompt,
    SamplingConfig,
    StreamCompletion,
    StreamRequest,
)

if TYPE_CHECKING:
    import httpx

__all__ = ["OpenAIPolicy"]

_RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class OpenAIPolicy(Policy):
    """A model served behind an OpenAI-compatible HTTP API."""

    name = "openai"

    #: First backoff delay in seconds (doubled each retry, with jitter, capped at 30 s).
    backoff_s: float = 0.5

    def __init__(self, config: PolicyConfig) -> None:
        super().__init__(config)
        self._client: httpx.AsyncClient | None = None
        self._sem: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._one_per_request = False  # set once the server is seen to ignore `n`
        self.retries = 0
        """Transient failures retried so far (for logs and tests)."""

    async def start(self) -> None:
        # imported here: httpx (with the rich and click it pulls in) costs every `leanrl`
        # command that merely lists this backend's config ~0.15 s of CPU at start-up
        import httpx

        loop = asyncio.get_running_loop()
        if self._client is not None and self._loop is loop:
            return
        if self._client is not None:
            # Used from a new event loop (`run_sync`, a notebook, a trainer step): the client's
            # connections and the semaphore belong to the old loop and cannot be awaited here.
            self._client = None
        headers = {}
        key = os.environ.get(self.config.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._client = httpx.AsyncClient(
            base_url=self.config.base_url.rstrip("/") + "/",
            headers=headers,
            timeout=httpx.Timeout(self.config.request_timeout_s, connect=10.0),
            limits=httpx.Limits(max_connections=self.config.max_concurrency),
        )
        self._sem = asyncio.Semaphore(self.config.max_concurrency)
        self._loop = loop
        try:
            # Fail in seconds, not after a whole run's worth of retries, when nobody listens.
            await self._client.get("models", timeout=10.0)
        except httpx.TransportError as e:
            await self.close()
            raise PolicyError(
                f"cannot reach the OpenAI-compatible server at {self.config.base_url} "
                f"({type(e).__name__}). Start one (e.g. `vllm serve MODEL`) or set "
                "--policy.base_url to where it listens."
            ) from e

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            if self._loop is asyncio.get_running_loop():
                await client.aclose()

    async def generate(
        self, prompts: Sequence[Prompt], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        await self.start()

        async def reported(prompt: Prompt) -> list[Completion]:
            got = await self._one(prompt, sampling)
            self.completed(len(got))  # progress per prompt, as the requests come back
            self.tokens_generated(sum(map(_generated, got)))
            return got

        jobs = [asyncio.ensure_future(reported(p)) for p in prompts]
        try:
            return list(await asyncio.gather(*jobs))
        finally:
            # One prompt failed for good (or the caller was cancelled): stop the others instead
            # of leaving them retrying against a client that is about to be closed.
            for job in jobs:
                job.cancel()

    async def stream(self, requests: Sequence[StreamRequest]) -> AsyncIterator[StreamCompletion]:
        """Every completion, yielded as its request comes back: all requests are sent at once
        (``max_concurrency`` in flight, the server batching them), each with its own
        ``sampling`` (so the same samples as ``generate`` on a seeded server)."""
        if any(r.prompt_ids is not None for r in requests):
            raise PolicyError(
                f"policy {self.name!r} cannot generate from token ids; stream text prompts"
            )
        await self.start()
        queue: asyncio.Queue[tuple[StreamRequest, list[Completion], float] | Exception] = (
            asyncio.Queue()
        )

        async def one(r: StreamRequest) -> None:
            t0 = time.perf_counter()
            try:
                got = await self._one(r.prompt or "", r.sampling)
            except Exception as e:  # noqa: BLE001 - raised in the consumer
                await queue.put(e)
                return
            self.completed(len(got))
            self.tokens_generated(sum(map(_generated, got)))
            await queue.put((r, got, time.perf_counter() - t0))

        jobs = [asyncio.ensure_future(one(r)) for r in requests]
        try:
            for _ in jobs:
                item = await queue.get()
                if isinstance(item, Exception):
                    raise item
                r, got, elapsed = item
                for s, c in enumerate(got):
                    yield StreamCompletion(r.key, s, c, elapsed)
        finally:
            for job in jobs:  # a failure (or a consumer that stopped) ends the rest
                job.cancel()

    async def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``/chat/completions`` as it is and return the server's JSON, with
        this policy's connection, concurrency bound, retries and timeout: for callers that need
        what :meth:`generate` does not carry (``tools`` in, ``tool_calls`` out: the
        ``tool-use`` harness, the ``external`` harness's endpoint)."""
        await self.start()
        return await self._post("chat/completions", body)

    async def _one(self, prompt: Prompt, sampling: SamplingConfig) -> list[Completion]:
        chat = self.config.chat if self.config.chat is not None else not isinstance(prompt, str)
        body: dict[str, Any] = {
            "model": self.config.model,
            "n": sampling.n,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_tokens,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if chat:
            body["messages"] = to_messages(prompt)
            body["logprobs"] = True
            path = "chat/completions"
        else:
            if not isinstance(prompt, str):
                raise PolicyError("a chat prompt needs --policy.chat true (or unset)")
            body["prompt"] = prompt
            body["logprobs"] = 0  # the sampled token's logprob only
            path = "completions"
        body.update(self.config.options)
        if self._one_per_request and sampling.n > 1:
            return await self._singly(path, body, sampling, chat)
        data = await self._post(path, body)
        choices = sorted(data.get("choices", []), key=lambda c: c.get("index", 0))
        if len(choices) == 1 and sampling.n > 1:
            # The server ignores `n` (some hosted APIs do): draw the rest one request each, and
            # from now on ask for one sample per request straight away.
            self._one_per_request = True
            rest = await self._singly(path, body, sampling, chat, start=1)
            return [*_completions(data, choices[:1], chat), *rest]
        if len(choices) != sampling.n:
            raise PolicyError(
                f"{self.config.base_url}/{path} returned {len(choices)} choices for n={sampling.n}"
            )
        return _completions(data, choices, chat)

    async def _singly(
        self,
        path: str,
        body: dict[str, Any],
        sampling: SamplingConfig,
        chat: bool,
        start: int = 0,
    ) -> list[Completion]:
        """Samples ``start..n-1`` with one request each (``n`` = 1). Sample i gets seed
        ``seed + i``: one seed for all would make a seeded server return one sample n times."""

        async def one(i: int) -> Completion:
            b = {**body, "n": 1}
            if sampling.seed is not None:
                b["seed"] = sampling.seed + i
            data = await self._post(path, b)
            choices = data.get("choices", [])
            if len(choices) != 1:
                raise PolicyError(
                    f"{self.config.base_url}/{path} returned {len(choices)} choices for n=1"
                )
            return _completions(data, choices, chat)[0]

        return list(await asyncio.gather(*(one(i) for i in range(start, sampling.n))))

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        assert self._client is not None and self._sem is not None

        def counted() -> None:
            self.retries += 1

        return await post_json(
            self._client,
            path,
            body,
            where=self.config.base_url,
            max_retries=self.config.max_retries,
            backoff_s=self.backoff_s,
            sem=self._sem,
            on_retry=counted,
        )


async def post_json(
    client: Any,
    path: str,
    body: dict[str, Any],
    *,
    where: str,
    max_retries: int,
    backoff_s: float,
    sem: asyncio.Semaphore | None = None,
    on_retry: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """POST ``body`` to ``path`` on an ``httpx.AsyncClient`` of an OpenAI-compatible server and
    return the JSON object it answers, retrying transport errors, timeouts, a 200 whose body is
    not a JSON object and the statuses in ``_RETRY_STATUS`` up to ``max_retries`` times
    (exponential backoff from ``backoff_s`` with jitter, capped at 30 s; a numeric
    ``Retry-After`` is honoured up to 60 s). Other statuses raise :class:`PolicyError` at once.
    ``sem`` (when given) is held for each request, not while waiting to retry."""
    import httpx

    last = ""
    for attempt in range(max_retries + 1):
        delay = min(30.0, backoff_s * 2**attempt) * (0.5 + random.random() / 2)
        async with sem if sem is not None else contextlib.nullcontext():
            try:
                r = await client.post(path, json=body)
            except (httpx.TransportError, httpx.TimeoutException) as e:
                last = f"{type(e).__name__}: {e}"
            else:
                if r.status_code == 200:
                    try:
                        out = r.json()
                    except ValueError:
                        out = None
                    if isinstance(out, dict):
                        return out
                    # A proxy or a dying server can answer 200 with something else.
                    last = f"HTTP 200 with a body that is not a JSON object: {r.text[:300]!r}"
                else:
                    last = f"HTTP {r.status_code}: {r.text[:300]}"
                if r.status_code != 200 and r.status_code not in _RETRY_STATUS:
                    raise PolicyError(f"{where}/{path} rejected the request ({last})")
                after = r.headers.get("retry-after")
                if after and after.replace(".", "", 1).isdigit():
                    delay = min(60.0, float(after))
        if attempt < max_retries:
            if on_retry is not None:
                on_retry()
            await asyncio.sleep(delay)
    raise PolicyError(f"{where}/{path} failed {max_retries + 1} times; last: {last}")


def _completions(
    data: dict[str, Any], choices: list[dict[str, Any]], chat: bool
) -> list[Completion]:
    """The completions of one response. Where the server returned neither token ids nor
    log-probs, each gets the response's ``usage.completion_tokens``: the count itself for one
    choice; for several (usage counts them together) split in proportion to their text length,
    the parts summing to the server's total."""
    out = [_completion(c, chat) for c in choices]
    usage = data.get("usage")
    total = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if not isinstance(total, int) or isinstance(total, bool) or total < 0:
        return out
    if any(c.token_ids or c.logprobs for c in out):
        return out  # the server's own per-token data counts them
    chars = [len(c.text) for c in out]
    weights = chars if sum(chars) else [1] * len(out)
    shares = [total * w // sum(weights) for w in weights]
    for i in sorted(range(len(out)), key=lambda k: -weights[k])[: total - sum(shares)]:
        shares[i] += 1
    return [c.model_copy(update={"usage_tokens": n}) for c, n in zip(out, shares, strict=True)]


def _generated(c: Completion) -> int:
    """Tokens in ``c`` as far as the server said (for progress; 0 when it said nothing)."""
    return len(c.token_ids) or len(c.logprobs or ()) or (c.usage_tokens or 0)


def _completion(choice: dict[str, Any], chat: bool) -> Completion:
    finish: Literal["stop", "length"] = (
        "length" if choice.get("finish_reason") == "length" else "stop"
    )
    lp: tuple[float, ...] | None = None
    raw = choice.get("logprobs")
    if chat:
        text = (choice.get("message") or {}).get("content") or ""
        if isinstance(raw, dict) and raw.get("content"):
            lp = tuple(float(t["logprob"]) for t in raw["content"])
    else:
        text = choice.get("text") or ""
        if isinstance(raw, dict) and raw.get("token_logprobs"):
            lp = tuple(float(x) if x is not None else 0.0 for x in raw["token_logprobs"])
    # vLLM returns ids when asked (`return_token_ids`); other servers do not.
    ids = tuple(int(x) for x in choice.get("token_ids") or ())
    prompt_ids = tuple(int(x) for x in choice.get("prompt_token_ids") or ())
    return Completion(
        text=text, token_ids=ids, logprobs=lp, finish_reason=finish, prompt_token_ids=prompt_ids
    )
