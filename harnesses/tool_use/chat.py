"""Tool-calling conversations as token ids, and the three ways a policy is asked for a turn.

**Token ids through the chat template** (``ChatFormat``). The first prompt is the template's
rendering of the system and user messages with ``tools=`` (what transformers'
``apply_chat_template(tools=...)`` gives). After each model turn, the tool results go in as the
template renders them: the text between the end of an assistant message and the next
generation prompt, found by rendering a probe conversation (a user message, an assistant message
holding a marker, then the tool messages) and keeping what follows the marker; the end-of-turn
token is left out when the model's own last token already is it. So an episode's context is
``prompt ids + turn 1 ids + results 1 ids + turn 2 ids + ...``: the model's ids, tool-call
tokens included, carry loss, the template's ids for the results carry none, and a trainer
replays exactly the ids the model saw.

**How a turn is generated** (``mode``):

- ``ids``: the policy generates from token ids (``hf``, ``vllm``, the trainers' policies, a
  vLLM server under GRPO, whose tokenizer is loaded from its model folder):
  :class:`TokenBackend` sends the ids. Every pending turn of every episode goes into one
  ``Policy.stream`` call, so episodes waiting on a tool do not hold the others back, and each
  completion is handed back as soon as it ends;
- ``text``: a policy with a tokenizer that cannot take ids (ES's torch policy) gets the same
  context decoded to text (not token-exact; ES needs only rewards);
- ``messages``: the ``openai`` backend has no tokenizer here: :class:`MessagesBackend` sends
  OpenAI messages with the ``tools`` field, and the server's template and tool parser do the
  rest (its ``tool_calls`` come back structured; token ids only where the server returns them).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from leanrl.errors import ConfigError, PolicyError
from leanrl.policy import (
    Completion,
    Policy,
    SamplingConfig,
    StreamRequest,
    closing_stream,
)

from .calls import ParsedTurn, ToolCall, call_from_json, render_calls

__all__ = ["ChatFormat", "MessagesBackend", "TokenBackend", "generation_mode", "read_choice"]

_MARK = "LEANRL-TOOL-TURN-5c1e"  # stands for the assistant's text in a probe render


def generation_mode(policy: Policy) -> tuple[str, Any]:
    """``ids``, ``text`` or ``messages`` for this policy (see the module docstring), and the
    tokenizer the first two render with. A policy that generates from ids but carries no
    tokenizer (the vLLM server policy of GRPO) gets its model's, loaded from
    ``policy.config.model``, so its episodes stay token-exact."""
    takes_ids = type(policy).generate_from_ids is not Policy.generate_from_ids
    tok = getattr(policy, "tokenizer", None)
    if tok is None and takes_ids and policy.config.model:
        tok = _load_tokenizer(policy.config.model)
    if tok is not None and getattr(tok, "chat_template", None) is not None:
        return ("ids" if takes_ids else "text"), tok
    if callable(getattr(policy, "chat_completion", None)):
        return "messages", None
    raise ConfigError(
        f"the policy {policy.name!r} offers no way to call tools: the tool-use harness needs a "
        "tokenizer with a chat template (hf, vllm) or an OpenAI-compatible server (openai)"
    )


def _load_tokenizer(model: str) -> Any:
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(model)
    except Exception:  # noqa: BLE001 - a served name that is no local model: no tokenizer here
        return None


class ChatFormat:
    """A tokenizer's chat template with tools: first prompts and tool results as token ids."""

    def __init__(self, tokenizer: Any, tools: Sequence[dict[str, Any]]) -> None:
        self.tok = tokenizer
        self.tools = list(tools)
        self._specials = _special_ids(tokenizer)

    def render(self, messages: Sequence[dict[str, Any]], generation: bool = True) -> str:
        """The template's text of ``messages`` with the tools."""
        try:
            text = self.tok.apply_chat_template(
                list(messages),
                tools=self.tools or None,
                tokenize=False,
                add_generation_prompt=generation,
            )
        except Exception as e:  # noqa: BLE001 - a template error, said in one line
            raise ConfigError(
                f"the model's chat template cannot render this conversation: {e}"
            ) from None
        return str(text)

    def ids(self, text: str) -> list[int]:
        """Token ids of rendered text (special-token text becomes the special ids)."""
        return list(self.tok(text, add_special_tokens=False).input_ids)

    def prompt_ids(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        """The first prompt's ids, generation prompt included."""
        return self.ids(self.render(messages))

    def after_turn(self, completion: Completion, messages: Sequence[dict[str, Any]]) -> list[int]:
        """The ids that follow a model turn: ``messages`` (tool results, or a user message) as
        the template renders them after an assistant message, up to the next generation
        prompt (see the module docstring)."""
        probe = [
            {"role": "user", "content": "."},
            {"role": "assistant", "content": _MARK},
            *messages,
        ]
        text = self.render(probe)
        at = text.rfind(_MARK)
        if at < 0:
            raise ConfigError("the model's chat template drops the assistant's text")
        ids = self.ids(text[at + len(_MARK) :])
        last = completion.token_ids[-1] if completion.token_ids else None
        if ids and last is not None and ids[0] == last and ids[0] in self._specials:
            ids = ids[1:]  # the model closed its turn itself
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Ids as text, special tokens kept (``text`` mode's prompt)."""
        return str(self.tok.decode(list(ids), skip_special_tokens=False))


def _special_ids(tok: Any) -> set[int]:
    ids = {int(i) for i in getattr(tok, "all_special_ids", ())}
    added = getattr(tok, "added_tokens_decoder", {}) or {}
    return ids | {int(i) for i, t in added.items() if getattr(t, "special", False)}


@dataclass
class _Pending:
    request: StreamRequest
    future: asyncio.Future[tuple[Completion, float]]


class TokenBackend:
    """Turns from token ids (``ids`` mode) or from their text (``text`` mode), the pending
    turns of all episodes batched into one ``Policy.stream`` call at a time."""

    def __init__(self, policy: Policy, fmt: ChatFormat, *, ids: bool) -> None:
        self.policy, self.fmt, self.use_ids = policy, fmt, ids
        self._pending: list[_Pending] = []
        self._worker: asyncio.Future[None] | None = None
        self.batches: list[int] = []
        """Size of each ``stream`` call (for measurements)."""

    async def complete(
        self, ids: Sequence[int], sampling: SamplingConfig, slot: int
    ) -> tuple[Completion, float]:
        """One completion of the context ``ids`` (n = 1) and the seconds it took."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[tuple[Completion, float]] = loop.create_future()
        key = len(self._pending)
        if self.use_ids:
            req = StreamRequest(key, sampling, prompt_ids=tuple(ids), slot=slot)
        else:
            req = StreamRequest(key, sampling, prompt=self.fmt.decode(ids), slot=slot)
        self._pending.append(_Pending(req, fut))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.ensure_future(self._work())
        return await fut

    async def _work(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            waiting = {k: p.future for k, p in enumerate(batch)}
            requests = [
                StreamRequest(
                    k,
                    p.request.sampling,
                    prompt=p.request.prompt,
                    prompt_ids=p.request.prompt_ids,
                    slot=p.request.slot,
                )
                for k, p in enumerate(batch)
            ]
            self.batches.append(len(requests))
            try:
                async with closing_stream(self.policy.stream(requests)) as items:
                    async for sc in items:
                        fut = waiting.pop(int(sc.key))  # type: ignore[call-overload]
                        if not fut.done():
                            fut.set_result((sc.completion, sc.elapsed_s))
            except Exception as e:  # noqa: BLE001 - handed to every episode waiting on it
                for fut in waiting.values():
                    if not fut.done():
                        fut.set_exception(e)
                continue
            for fut in waiting.values():
                if not fut.done():
                    fut.set_exception(PolicyError("the policy's stream ended without a turn"))

    async def close(self) -> None:
        """Stop the batching worker (episodes still waiting get cancelled)."""
        if self._worker is not None and not self._worker.done():
            self._worker.cancel()
            try:
                await self._worker
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - shutting down
                pass
        for p in self._pending:
            p.future.cancel()
        self._pending = []


class MessagesBackend:
    """Turns from an OpenAI-compatible server: messages and the ``tools`` field go up, the
    server's ``tool_calls`` come back (``messages`` mode)."""

    def __init__(self, policy: Policy, tools: Sequence[dict[str, Any]]) -> None:
        self.policy, self.tools = policy, list(tools)

    async def complete(
        self, messages: Sequence[dict[str, Any]], sampling: SamplingConfig, turn: int
    ) -> tuple[Completion, ParsedTurn, dict[str, Any], float]:
        """One turn: the completion (its text holds the content and the calls, Hermes-style),
        the calls, the assistant message to append, and the seconds it took."""
        body: dict[str, Any] = {
            "model": self.policy.config.model,
            "messages": list(messages),
            **({"tools": self.tools} if self.tools else {}),
            "n": 1,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_tokens,
            "logprobs": True,
            **({"seed": sampling.seed} if sampling.seed is not None else {}),
            **({"stop": list(sampling.stop)} if sampling.stop else {}),
            **self.policy.config.options,
        }
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        data = await self.policy.chat_completion(body)  # type: ignore[attr-defined]
        elapsed = loop.time() - t0
        choices = data.get("choices") or []
        if not choices:
            raise PolicyError("the server answered a chat request with no choices")
        return (*read_choice(choices[0], turn), elapsed)


def read_choice(choice: dict[str, Any], turn: int) -> tuple[Completion, ParsedTurn, dict[str, Any]]:
    """An OpenAI chat choice as (completion, parsed turn, assistant message to append)."""
    msg = choice.get("message") or {}
    content = msg.get("content") or ""
    raw_calls = msg.get("tool_calls") or []
    calls: list[ToolCall] = []
    for k, rc in enumerate(raw_calls):
        fn = rc.get("function") if isinstance(rc, dict) else None
        cid = (
            str(rc.get("id") or f"call_{turn}_{k}") if isinstance(rc, dict) else f"call_{turn}_{k}"
        )
        calls.append(call_from_json(fn, cid))
    lp: tuple[float, ...] | None = None
    raw = choice.get("logprobs")
    if isinstance(raw, dict) and raw.get("content"):
        lp = tuple(float(t["logprob"]) for t in raw["content"])
    finish: Literal["stop", "length"] = (
        "length" if choice.get("finish_reason") == "length" else "stop"
    )
    completion = Completion(
        text=content + render_calls(calls),
        token_ids=tuple(int(x) for x in choice.get("token_ids") or ()),
        logprobs=lp,
        prompt_token_ids=tuple(int(x) for x in choice.get("prompt_token_ids") or ()),
        finish_reason=finish,
    )
    assistant: dict[str, Any] = {"role": "assistant", "content": content or None}
    if raw_calls:
        assistant["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
            }
            for c in calls
        ]
    return completion, ParsedTurn(content.strip(), tuple(calls)), assistant
