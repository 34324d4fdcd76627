"""The teacher server's client (leanrl.train.distill.teacher.ServerTeacher) over httpx's own
mock transport: transient failures are retried as the openai policy retries them (the shared
``post_json``), a refusal stops at once with the teacher named, and the echo form is used where
the server answers without ``prompt_logprobs``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from leanrl.errors import PolicyError
from leanrl.train.distill.config import DistillConfig
from leanrl.train.distill.teacher import ServerTeacher, TeacherSource

URL = "http://teacher.test/v1"
SEQS = [([5, 6], [7, 8])]  # prompt ids, response ids
LPS = {7: -0.5, 8: -1.5}


def _teacher(handler: Any) -> ServerTeacher:
    src = TeacherSource(spec=URL, kind="server", where=URL, model="t")
    cfg = DistillConfig(teacher=URL)
    teacher = ServerTeacher(src, cfg)
    teacher._client = httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url=URL + "/")
    return teacher


def _answer(body: dict[str, Any], echo_only: bool = False) -> httpx.Response:
    ids = body["prompt"]
    if body.get("prompt_logprobs") and not echo_only:
        plp = [None] + [{str(t): {"logprob": LPS.get(t, -9.0)}} for t in ids[1:]]
        choice: dict[str, Any] = {"prompt_logprobs": plp}
    elif body.get("echo"):
        choice = {"logprobs": {"token_logprobs": [None] + [LPS.get(t, -9.0) for t in ids[1:]]}}
    else:
        choice = {"text": ""}
    return httpx.Response(200, json={"choices": [choice]})


def _score(teacher: ServerTeacher) -> list[list[float]]:
    async def go() -> list[list[float]]:
        try:
            return await teacher.logprobs(SEQS)
        finally:
            await teacher.close()

    return asyncio.run(go())


def test_transient_failures_are_retried() -> None:
    seen: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(1)
        if len(seen) == 1:
            return httpx.Response(503, headers={"Retry-After": "0"}, text="busy")
        if len(seen) == 2:
            return httpx.Response(200, text="<html>gateway hiccup</html>")
        return _answer(json.loads(request.content))

    assert _score(_teacher(handler)) == [[-0.5, -1.5]]
    assert len(seen) == 3


def test_a_refusal_is_not_retried_and_names_the_teacher() -> None:
    seen: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(1)
        return httpx.Response(404, text="model 't' not served")

    with pytest.raises(PolicyError, match=r"teacher server could not score.*HTTP 404"):
        _score(_teacher(handler))
    assert len(seen) == 1


def test_the_echo_form_is_used_where_prompt_logprobs_are_missing() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return _answer(json.loads(request.content), echo_only=True)

    teacher = _teacher(handler)
    assert _score(teacher) == [[-0.5, -1.5]]
    assert teacher._echo


def test_a_server_with_neither_form_is_refused() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"choices": [{"text": ""}]})

    with pytest.raises(PolicyError, match="returned no prompt log-probs"):
        _score(_teacher(handler))
