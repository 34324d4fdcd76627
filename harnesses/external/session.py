"""One episode of an outside agent program: its model requests recorded as token-exact turns.

The program talks to the policy through OpenAI chat requests, each carrying the whole
conversation so far. A request whose messages start with what the previous one held plus the
reply it got (compared by role, text and tool calls, not by JSON spelling) extends the same
token context: its new messages (tool results, a user message) go in as the chat template
renders them after an assistant turn, exactly as the ``tool-use`` harness adds tool results,
so the context is ``prompt ids + turn ids + new-message ids + turn ids ...`` and the rollout
replays what the model saw. A request that does not (the program rewrote or cut its history,
or started a side conversation) starts a new *segment*, rendered from scratch. The rollout is
made from the segment with the most model turns (the last of equal ones); ``meta`` says how
many segments and turns there were, so turns left out of training are visible.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from leanrl.errors import ConfigError
from leanrl.policy import ChatMessage, Completion, Policy, SamplingConfig
from leanrl.rollout import Turn
from leanrl.task import Task

from ..tool_use.calls import ParsedTurn, parse_turn
from ..tool_use.chat import ChatFormat, MessagesBackend, TokenBackend, read_choice
from ..tool_use.tools import EpisodeTools

__all__ = ["BudgetError", "RequestError", "Segment", "Session", "normalize"]

_ROLES = {"system", "developer", "user", "assistant", "tool"}


class RequestError(ValueError):
    """A request the endpoint refuses (HTTP 400), with the one-line reason."""

    status = 400
    kind = "invalid_request_error"


class BudgetError(RequestError):
    """The episode's budget (turns, tokens) is spent: no more model turns."""

    kind = "leanrl_budget_exceeded"


def normalize(raw: Any) -> dict[str, Any]:
    """One OpenAI chat message as the chat template takes it: content as one string (text
    parts joined), ``developer`` as ``system``, tool-call arguments as objects."""
    if not isinstance(raw, dict):
        raise RequestError("every message must be a JSON object with a role")
    role = raw.get("role")
    if role not in _ROLES:
        raise RequestError(f"unknown message role {role!r} (use {', '.join(sorted(_ROLES))})")
    content = raw.get("content")
    if isinstance(content, list):
        content = "".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") in ("text", "input_text", "output_text")
        )
    out: dict[str, Any] = {
        "role": "system" if role == "developer" else role,
        "content": "" if content is None else str(content),
    }
    if role == "assistant" and raw.get("tool_calls"):
        calls = []
        for tc in raw["tool_calls"]:
            fn = (tc or {}).get("function") or {}
            args = fn.get("arguments", {})
            if isinstance(args, str):
                try:
                    args = json.loads(args) if args.strip() else {}
                except json.JSONDecodeError:
                    args = {"_raw": args}
            calls.append(
                {
                    "id": str(tc.get("id", "")),
                    "type": "function",
                    "function": {"name": str(fn.get("name", "")), "arguments": args},
                }
            )
        out["tool_calls"] = calls
    if role == "tool":
        out["tool_call_id"] = str(raw.get("tool_call_id", ""))
        if raw.get("name"):
            out["name"] = str(raw["name"])
    return out


def _key(m: dict[str, Any]) -> tuple[Any, ...]:
    """What must match for a message to count as the same one (ids and spelling aside)."""
    calls = tuple(
        (c["function"]["name"], json.dumps(c["function"]["arguments"], sort_keys=True))
        for c in m.get("tool_calls", ())
    )
    return (m["role"], m["content"].strip(), calls)


@dataclass
class Segment:
    """One token context the program's requests grew."""

    messages: list[dict[str, Any]]
    """The conversation the context holds, ending with the last reply given."""
    tools_key: str
    """The request's ``tools``, as JSON: another tool list is another context."""
    prompt: list[ChatMessage]
    """The first request's messages (role and text) for ``Rollout.prompt``."""
    prompt_ids: list[int] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    last: Completion | None = None


class Session:
    """The state of one episode: its task, tools, budgets, and what its requests recorded."""

    def __init__(
        self,
        index: int,
        task: Task,
        tools: EpisodeTools,
        *,
        sample: int = 0,
        max_turns: int,
        max_total_tokens: int,
        max_tool_calls: int,
    ) -> None:
        self.index, self.task, self.tools, self.sample = index, task, tools, sample
        self.key = "leanrl-" + secrets.token_urlsafe(24)
        """The episode's API key: the bearer token that routes its requests here."""
        self.max_turns, self.max_total_tokens = max_turns, max_total_tokens
        self.max_tool_calls = max_tool_calls
        self.segments: list[Segment] = []
        self.requests = 0
        self.tokens = 0
        self.tool_calls = 0
        self.gen_s = 0.0
        self.tool_s = 0.0
        self.log: list[dict[str, Any]] = []
        self.refused = 0
        self.errors: list[BaseException] = []
        """Failures of the policy or of leanrl while answering (the harness raises the first
        once the episodes are over: a broken policy must not pass for failed episodes)."""
        self.closed = False

    # -- model turns -----------------------------------------------------------------------------

    def budget(self, asked: int | None, sampling: SamplingConfig) -> int:
        """Tokens the next turn may have, or :class:`BudgetError`."""
        if self.requests >= self.max_turns:
            raise BudgetError(f"the episode's turn budget ({self.max_turns} requests) is spent")
        left = self.max_total_tokens - self.tokens
        if left <= 0:
            raise BudgetError(f"the episode's token budget ({self.max_total_tokens}) is spent")
        return max(1, min(sampling.max_tokens, left, asked or sampling.max_tokens))

    async def chat(
        self,
        body: dict[str, Any],
        backend: TokenBackend | MessagesBackend,
        fmt: ChatFormat | None,
        parser: str,
        sampling: SamplingConfig,
        policy: Policy,
    ) -> tuple[Completion, ParsedTurn, dict[str, Any]]:
        """Answer one chat request: (completion, its calls, the assistant message returned)."""
        if self.closed:
            raise RequestError("this episode is over")
        raw = body.get("messages")
        if not isinstance(raw, list) or not raw:
            raise RequestError("messages must be a non-empty list")
        if int(body.get("n") or 1) != 1:
            raise RequestError("n must be 1 (each request is one model turn)")
        messages = [normalize(m) for m in raw]
        tools = body.get("tools") or []
        if not isinstance(tools, list):
            raise RequestError("tools must be a list")
        asked = body.get("max_completion_tokens") or body.get("max_tokens")
        s = sampling.model_copy(
            update={
                "n": 1,
                "max_tokens": self.budget(int(asked) if asked else None, sampling),
                "stop": _stops(body.get("stop")) or list(sampling.stop),
            }
        )
        if tools and isinstance(backend, TokenBackend) and not parser:
            raise RequestError(
                "the request offers tools, and the model's chat template has no tool-call "
                "format leanrl reads (set the harness option tool_parser)"
            )
        turn = self.requests
        self.requests += 1
        seg, new = self._segment(messages, json.dumps(tools, sort_keys=True))
        if isinstance(backend, MessagesBackend):
            backend = MessagesBackend(policy, tools)
            c, parsed, assistant, dt = await backend.complete(messages, s, turn)
            if seg.turns and new:
                seg.turns[-1].feedback = "\n".join(m["content"] for m in new)
        else:
            assert fmt is not None
            sub = ChatFormat(fmt.tok, tools)
            fb: list[int] = []
            try:
                if not seg.turns:
                    seg.prompt_ids = sub.prompt_ids(messages)
                    seg.ids = list(seg.prompt_ids)
                elif new:
                    assert seg.last is not None
                    fb = sub.after_turn(seg.last, new)
            except ConfigError as e:  # the template cannot render what the program sent
                raise RequestError(str(e)) from None
            if seg.turns and new:
                seg.turns[-1].feedback_ids = fb
                seg.turns[-1].feedback = sub.decode(fb)
                seg.ids += fb
                self.tokens += len(fb)
            slot = self.index * 100_003 + turn
            c, dt = await backend.complete(seg.ids, s, slot)
            parsed = parse_turn(c.text, parser, turn) if tools else ParsedTurn(c.text)
            _, _, assistant = read_choice(_as_choice(c, parsed), turn)
            seg.ids += list(c.token_ids)
        self.gen_s += dt
        self.tokens += len(c.token_ids)
        seg.turns.append(Turn.from_completion(c))
        seg.last = c
        seg.messages = [*messages, normalize(assistant)]
        return c, parsed, assistant

    def _segment(
        self, messages: list[dict[str, Any]], tools_key: str
    ) -> tuple[Segment, list[dict[str, Any]]]:
        """The segment this request extends and its new messages, or a new segment."""
        for seg in reversed(self.segments):
            n = len(seg.messages)
            if (
                seg.tools_key == tools_key
                and len(messages) > n
                and [_key(m) for m in messages[:n]] == [_key(m) for m in seg.messages]
            ):
                return seg, messages[n:]
        prompt = [
            ChatMessage(role=m["role"], content=m["content"])
            for m in messages
            if m["role"] in ("system", "user", "assistant", "tool")
        ]
        seg = Segment(messages=list(messages), tools_key=tools_key, prompt=prompt)
        self.segments.append(seg)
        return seg, []

    # -- tools -----------------------------------------------------------------------------------

    async def call_tool(self, name: str, args: Any) -> dict[str, Any]:
        """One call of the episode's tools over HTTP (the program's own Lean tools)."""
        if self.closed:
            raise RequestError("this episode is over")
        if not isinstance(args, dict):
            raise RequestError("the body must be a JSON object of the tool's arguments")
        refused = self.tools.refuse(name, args)
        if refused is not None:
            return {"result": refused.text, "ok": False, "submitted": False}
        if name != self.tools.submit_name:
            if self.tool_calls >= self.max_tool_calls:
                raise BudgetError(f"the episode's tool budget ({self.max_tool_calls}) is spent")
            self.tool_calls += 1
        t0 = time.perf_counter()
        r = await self.tools.call(name, args)
        dt = time.perf_counter() - t0
        self.tool_s += dt
        self.log.append({"tool": name, "ok": r.ok, "s": round(dt, 6)})
        return {"result": r.text, "ok": r.ok, "submitted": r.submitted}

    # -- the rollout -----------------------------------------------------------------------------

    def best(self) -> Segment | None:
        """The segment the rollout is made from (most model turns; the last of equals)."""
        if not self.segments:
            return None
        return max(reversed(self.segments), key=lambda s: len(s.turns))


def _stops(stop: Any) -> list[str]:
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list):
        return [str(s) for s in stop if s]
    return []


def _as_choice(c: Completion, parsed: ParsedTurn) -> dict[str, Any]:
    """A completion read for calls, shaped as an OpenAI choice. Calls that could not all be
    read are returned as the raw text (as OpenAI-compatible servers do)."""
    readable = bool(parsed.calls) and all(call.error is None for call in parsed.calls)
    message: dict[str, Any] = {
        "role": "assistant",
        "content": parsed.content if readable else c.text,
    }
    if readable:
        message["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
            }
            for call in parsed.calls
        ]
    return {"message": message, "finish_reason": c.finish_reason}


def response_body(
    c: Completion, assistant: dict[str, Any], model: str, logprobs: bool
) -> dict[str, Any]:
    """The OpenAI ``chat.completion`` object for one turn."""
    finish = (
        "length"
        if c.finish_reason == "length"
        else ("tool_calls" if assistant.get("tool_calls") else "stop")
    )
    choice: dict[str, Any] = {
        "index": 0,
        "message": {k: v for k, v in assistant.items() if k in ("role", "content", "tool_calls")},
        "finish_reason": finish,
        "logprobs": None,
    }
    if logprobs and c.logprobs is not None:
        choice["logprobs"] = {
            "content": [
                {"token": str(t), "logprob": lp}
                for t, lp in zip(c.token_ids, c.logprobs, strict=False)
            ]
        }
    return {
        "id": "chatcmpl-" + secrets.token_hex(8),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": len(c.prompt_token_ids),
            "completion_tokens": len(c.token_ids),
            "total_tokens": len(c.prompt_token_ids) + len(c.token_ids),
        },
    }


def stream_chunks(body: dict[str, Any]) -> Sequence[dict[str, Any]]:
    """A whole ``chat.completion`` as the ``chat.completion.chunk`` events of a streamed answer
    (the turn is generated whole, then sent as one delta and a final chunk)."""
    choice = body["choices"][0]
    msg = choice["message"]
    delta: dict[str, Any] = {"role": "assistant", "content": msg.get("content") or ""}
    if msg.get("tool_calls"):
        delta["tool_calls"] = [{"index": k, **tc} for k, tc in enumerate(msg["tool_calls"])]
    base = {k: body[k] for k in ("id", "created", "model")}
    return [
        {
            **base,
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
        },
        {
            **base,
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}],
            "usage": body["usage"],
        },
    ]
