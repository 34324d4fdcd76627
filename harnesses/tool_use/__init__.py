"""``tool-use`` harness: the model calls tools in its chat template's format (Lean's ``check``,
``goals``, ``search``, ``submit``; a calculator on Countdown) and submits an answer, which the
trusted judge checks after the episode.

``harness.py`` runs the episodes, ``calls.py`` reads tool calls in the template's layout,
``chat.py`` renders conversations as token ids and asks the policy for turns, ``tools.py`` says
what a tool is, ``lean_tools.py`` and ``countdown_tools.py`` are the two tool sets, and
``templates.py`` holds a tool template for models that have none (tiny test models).
"""

from __future__ import annotations

from .calls import PARSERS, ParsedTurn, ToolCall, detect_parser, parse_turn
from .harness import ToolUseHarness
from .templates import HERMES_TOOL_TEMPLATE
from .tools import Answer, EpisodeTools, Tool, ToolResult

__all__ = [
    "HERMES_TOOL_TEMPLATE",
    "PARSERS",
    "Answer",
    "EpisodeTools",
    "ParsedTurn",
    "Tool",
    "ToolCall",
    "ToolResult",
    "ToolUseHarness",
    "detect_parser",
    "parse_turn",
]
