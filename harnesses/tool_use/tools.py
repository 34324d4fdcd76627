"""What a tool is, what it answers, and one episode's set of tools.

A :class:`Tool` is a name, a description and a JSON schema of its arguments: what a chat
template renders (``apply_chat_template(tools=...)``) and what the OpenAI ``tools`` field
carries. :class:`EpisodeTools` is one episode's tools for one task: it runs a call and keeps
the answer the model submitted. Tool results are text for the model, never a verdict: the
reward comes from the judge on the submitted answer, after the episode.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from leanrl.verdict import Reason

__all__ = ["Answer", "EpisodeTools", "Tool", "ToolResult", "check_arguments", "clip"]


@dataclass(frozen=True)
class Tool:
    """One tool offered to the model."""

    name: str
    """What the model calls it by."""
    description: str
    """What it does, for the model (rendered into the prompt by the chat template)."""
    parameters: dict[str, Any]
    """JSON schema of the arguments (an ``object`` with ``properties`` and ``required``)."""

    def schema(self) -> dict[str, Any]:
        """The OpenAI / chat-template form: ``{"type": "function", "function": {...}}``."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


def string_params(**fields: str) -> dict[str, Any]:
    """A schema of required string arguments, ``name=description`` each."""
    return {
        "type": "object",
        "properties": {k: {"type": "string", "description": v} for k, v in fields.items()},
        "required": list(fields),
    }


@dataclass(frozen=True)
class ToolResult:
    """What one call answered."""

    text: str
    """The result shown to the model (a tool message)."""
    ok: bool = True
    """False when the call failed (bad arguments, an unknown tool, Lean's error, a budget)."""
    submitted: bool = False
    """The call handed in the final answer: the episode ends after this turn."""


@dataclass(frozen=True)
class Answer:
    """What an episode handed in for the judge: a proof split the way the whole-proof
    harness splits a completion (or a Countdown expression as ``proof``), or why nothing can be
    checked."""

    proof: str | None = None
    """What goes to the judge (the tactic block, or the expression); None: nothing."""
    preamble: str = ""
    """Helper lemmas before the theorem."""
    restated_statement: str = ""
    """The model's own copy of the statement, when it differs in text from the reference."""
    reason: Reason | None = None
    """Why there is nothing to check (no proof, cut off, statement changed)."""
    detail: str = ""
    """One line saying why."""


def check_arguments(tool: Tool, args: dict[str, Any]) -> str | None:
    """Why ``args`` do not fit ``tool``'s schema (missing, unknown or mistyped arguments), or
    None. Only the flat schemas the built-in tools use are read: string, integer and boolean
    properties."""
    props: dict[str, Any] = tool.parameters.get("properties", {})
    missing = [k for k in tool.parameters.get("required", []) if k not in args]
    if missing:
        return f"{tool.name} needs the argument(s) {', '.join(missing)}"
    unknown = sorted(k for k in args if k not in props)
    if unknown:
        return (
            f"{tool.name} takes no argument {unknown[0]!r} "
            f"(its arguments: {', '.join(props) or 'none'})"
        )
    kinds = {"string": str, "integer": int, "boolean": bool}
    for k, v in args.items():
        want = kinds.get(props[k].get("type", ""))
        if want is not None and not isinstance(v, want):
            return f"argument {k!r} of {tool.name} must be a {props[k]['type']}"
    return None


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out (a result's tokens
    count towards the episode's budget)."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n... ({len(text) - limit} more characters left out)"


class EpisodeTools(abc.ABC):
    """One episode's tools. ``answer`` is None until a call (or the final text) hands one in."""

    def __init__(self) -> None:
        self.answer: Answer | None = None
        self.calls: dict[str, int] = {}
        """Calls made so far, per tool name."""
        self.wait_s = 0.0
        """Seconds calls spent waiting for room (a Lean process) before they ran."""

    @property
    @abc.abstractmethod
    def tools(self) -> Sequence[Tool]:
        """The tools offered (their order is the prompt's)."""

    @property
    def submit_name(self) -> str:
        """The tool that hands in the answer (it stays usable when the call budget is spent)."""
        return "submit"

    def find(self, name: str) -> Tool | None:
        """The tool called ``name``, if offered."""
        return next((t for t in self.tools if t.name == name), None)

    def refuse(self, name: str, args: dict[str, Any]) -> ToolResult | None:
        """The error result for a call of an unknown tool or with arguments that do not fit,
        or None for a call that can run (such a refused call costs no tool budget)."""
        tool = self.find(name)
        if tool is None:
            names = ", ".join(t.name for t in self.tools)
            return ToolResult(f"Error: there is no tool {name!r}; the tools are {names}", ok=False)
        bad = check_arguments(tool, args)
        if bad is not None:
            return ToolResult(f"Error: {bad}", ok=False)
        return None

    async def call(self, name: str, args: dict[str, Any]) -> ToolResult:
        """Run one call (:meth:`refuse`'s error instead, where it has one)."""
        refused = self.refuse(name, args)
        if refused is not None:
            return refused
        self.calls[name] = self.calls.get(name, 0) + 1
        return await self.run(name, args)

    @abc.abstractmethod
    async def run(self, name: str, args: dict[str, Any]) -> ToolResult:
        """Run a call whose name and arguments fit a tool."""

    def read_text(self, text: str, finish_reason: str | None) -> Answer | None:
        """The answer in a final turn that called no tool (None: it holds none). Default: none,
        answers go through the submit tool only."""
        return None
