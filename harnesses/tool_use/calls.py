"""Tool calls in a model's text, in the format its chat template teaches.

A chat template that takes ``tools`` also shows the model how to call them, and each family
does it its own way. The parsers here read the three layouts that cover most open models:

==============  ==========================================================  ====================
parser          what the model writes                                       templates
==============  ==========================================================  ====================
``hermes``      ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``  Qwen2.5/3, Hermes,
                (one block per call, text around them is the content)       QwQ, many fine-tunes
``mistral``     ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]``   Mistral, Mixtral
``llama3-json`` the whole message is ``{"name": ..., "parameters": {...}}``  Llama 3.1/3.2/3.3
                (optionally after ``<|python_tag|>``; several split by
                ``;``)
==============  ==========================================================  ====================

:func:`detect_parser` picks one from the template's text. Reading never raises: a call that is
not JSON, lacks a name, or has arguments that are not an object is kept as a :class:`ToolCall`
with ``error`` set, so that the harness answers it with an error result (one turn, not a crash).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from leanrl.errors import ConfigError

__all__ = ["PARSERS", "ParsedTurn", "ToolCall", "detect_parser", "parse_turn", "render_calls"]

PARSERS = ("hermes", "mistral", "llama3-json")
"""The tool-call layouts this module reads (``options.tool_parser``; ``auto`` detects one)."""

_HERMES = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.S)
_MAX_CALLS = 32  # calls read from one turn; more are answered with one error


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: a tool name and its arguments, or why it could not be read."""

    id: str
    """The call's id (``call_<turn>_<k>``), echoed by its result (``tool_call_id``)."""
    name: str
    """The tool's name ('' when it could not be read)."""
    arguments: dict[str, Any] = field(default_factory=dict)
    """The arguments as a JSON object."""
    error: str | None = None
    """Why the call could not be read (it is then answered with this error); None if it could."""


@dataclass(frozen=True)
class ParsedTurn:
    """A model turn taken apart: its plain text and its tool calls."""

    content: str
    """The text outside the tool calls."""
    calls: tuple[ToolCall, ...] = ()
    """The calls, in order (malformed ones included, with ``error`` set)."""


def detect_parser(template: str | None) -> str:
    """The parser for a chat template, from the markers its text holds; a :class:`ConfigError`
    when it has none (a template without tools, or a layout not read here)."""
    t = template or ""
    if "<tool_call>" in t:
        return "hermes"
    if "[TOOL_CALLS]" in t:
        return "mistral"
    if "<|python_tag|>" in t or "ipython" in t:
        return "llama3-json"
    what = "no chat template" if not t else "a chat template with no tool-call format it knows"
    raise ConfigError(
        f"the tool-use harness needs a chat template that offers tools, and the model has {what}. "
        f"Use a tool-calling model (Qwen2.5/3-Instruct, Llama 3.1, Mistral), or name the layout "
        f'with --env.harness.options \'{{"tool_parser": "hermes"}}\' (one of {", ".join(PARSERS)})'
    )


def parse_turn(text: str, parser: str, turn: int = 0) -> ParsedTurn:
    """``text`` (one model turn) read with ``parser``; call ids are ``call_<turn>_<k>``."""
    if parser == "hermes":
        return _hermes(text, turn)
    if parser == "mistral":
        return _mistral(text, turn)
    if parser == "llama3-json":
        return _llama3(text, turn)
    raise ConfigError(f"unknown tool parser {parser!r}; use one of {', '.join(PARSERS)} or auto")


def render_calls(calls: tuple[ToolCall, ...] | list[ToolCall]) -> str:
    """Calls as Hermes ``<tool_call>`` blocks: how a transcript shows calls that came back as
    structured data (the ``openai`` backend's ``tool_calls``) rather than as text."""
    return "".join(
        "\n<tool_call>\n"
        + json.dumps({"name": c.name, "arguments": c.arguments}, ensure_ascii=False)
        + "\n</tool_call>"
        for c in calls
    )


def call_from_json(raw: Any, call_id: str, args_key: str = "arguments") -> ToolCall:
    """A :class:`ToolCall` from a decoded JSON value ``{"name": ..., args_key: {...}}``; the
    arguments may also come as a JSON string holding an object (the OpenAI wire format)."""
    if not isinstance(raw, dict):
        return ToolCall(call_id, "", error="a tool call must be a JSON object with a name")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall(call_id, "", error="the tool call has no name")
    args: Any = raw.get(args_key, raw.get("arguments", raw.get("parameters", {})))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            return ToolCall(call_id, name, error=f"the arguments of {name!r} are not JSON ({e})")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return ToolCall(call_id, name, error=f"the arguments of {name!r} must be a JSON object")
    return ToolCall(call_id, name, dict(args))


def _loads(body: str, call_id: str, args_key: str = "arguments") -> ToolCall:
    try:
        raw = json.loads(body)
    except json.JSONDecodeError as e:
        shown = body.strip()[:80]
        return ToolCall(call_id, "", error=f"the tool call is not JSON ({e}): {shown!r}")
    return call_from_json(raw, call_id, args_key)


def _capped(calls: list[ToolCall], turn: int) -> tuple[ToolCall, ...]:
    if len(calls) <= _MAX_CALLS:
        return tuple(calls)
    extra = ToolCall(
        f"call_{turn}_{_MAX_CALLS}",
        "",
        error=f"{len(calls) - _MAX_CALLS} more calls were ignored (at most {_MAX_CALLS} a turn)",
    )
    return (*calls[:_MAX_CALLS], extra)


def _hermes(text: str, turn: int) -> ParsedTurn:
    calls: list[ToolCall] = []
    for k, m in enumerate(_HERMES.finditer(text)):
        cid = f"call_{turn}_{k}"
        if not m.group(2):
            calls.append(ToolCall(cid, "", error="the <tool_call> block is never closed"))
            continue
        calls.append(_loads(m.group(1), cid))
    content = _HERMES.sub("", text).strip()
    return ParsedTurn(content, _capped(calls, turn))


def _mistral(text: str, turn: int) -> ParsedTurn:
    if "[TOOL_CALLS]" not in text:
        return ParsedTurn(text.strip())
    content, _, rest = text.partition("[TOOL_CALLS]")
    try:
        raw = json.loads(rest.strip())
    except json.JSONDecodeError as e:
        return ParsedTurn(
            content.strip(), (ToolCall(f"call_{turn}_0", "", error=f"[TOOL_CALLS] not JSON ({e})"),)
        )
    items = raw if isinstance(raw, list) else [raw]
    calls = [call_from_json(x, f"call_{turn}_{k}") for k, x in enumerate(items)]
    return ParsedTurn(content.strip(), _capped(calls, turn))


def _llama3(text: str, turn: int) -> ParsedTurn:
    body = text.strip().removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return ParsedTurn(text.strip())
    calls = [
        _loads(part, f"call_{turn}_{k}", "parameters")
        for k, part in enumerate(p for p in _split_top(body) if p.strip())
    ]
    return ParsedTurn("", _capped(calls, turn))


def _split_top(body: str) -> list[str]:
    """``body`` split at the ``;`` that separate JSON objects (not inside strings or braces)."""
    parts: list[str] = []
    depth, start, in_str, esc = 0, 0, False, False
    for i, ch in enumerate(body):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        elif ch == ";" and depth == 0:
            parts.append(body[start:i])
            start = i + 1
    parts.append(body[start:])
    return parts
