"""The Lean REPL wire protocol (leanprover-community/repl), as frozen pydantic models.

Requests are JSON objects separated by a blank line on the REPL's stdin; responses are JSON
objects separated by a blank line on its stdout. The field names below are the REPL's own
(``proofState``, ``endPos``, ...); Python attribute names are snake_case with aliases.

Responses come in three shapes, told apart by their keys:

- a command answer (``cmd``, ``pickleTo``, ``unpickleEnvFrom``): ``env`` plus optional
  ``messages``, ``sorries``, ``tactics``, ``infotree``;
- a tactic answer (``tactic``): ``proofState``, ``goals``, optional ``messages``, ``sorries``,
  ``proofStatus``, ``traces``;
- an error: ``{"message": "..."}`` (unknown env or proof state, a tactic that threw, bad JSON).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = [
    "CommandRequest",
    "CommandResponse",
    "PickleEnvRequest",
    "ProtocolError",
    "ReplError",
    "ReplMessage",
    "ReplPos",
    "Response",
    "Sorry",
    "TacticInfo",
    "TacticRequest",
    "TacticResponse",
    "UnpickleEnvRequest",
    "encode_request",
    "parse_response",
    "read_request_block",
    "split_blocks",
]


class ProtocolError(ValueError):
    """The REPL answered something that is not one of its documented response shapes."""


class _Wire(BaseModel):
    # Unknown keys are ignored (newer REPLs add fields), never fatal: the protocol grows.
    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)


class ReplPos(_Wire):
    """A source position: 1-based line, 0-based column (codepoints)."""

    line: int
    """1-based line."""
    column: int
    """0-based column, in codepoints."""


class ReplMessage(_Wire):
    """One Lean message in a REPL answer."""

    severity: str
    """``error``, ``warning`` or ``info`` (the REPL's spelling; ``lean --json`` says
    ``information``)."""
    data: str
    """The message text, verbatim."""
    pos: ReplPos | None = None
    """Where the message starts (``pos``)."""
    end_pos: ReplPos | None = Field(default=None, alias="endPos")
    """Where it ends (``endPos``)."""


class Sorry(_Wire):
    """A ``sorry`` the REPL found, with the goal it stands for and a proof state to resume."""

    goal: str
    """The goal the ``sorry`` stands for, pretty-printed."""
    pos: ReplPos | None = None
    """Where the ``sorry`` starts."""
    end_pos: ReplPos | None = Field(default=None, alias="endPos")
    """Where it ends."""
    proof_state: int | None = Field(default=None, alias="proofState")
    """Proof state to continue from in tactic mode (``proofState``)."""


class TacticInfo(_Wire):
    """One tactic reported with ``allTactics``."""

    tactic: str
    """The tactic, pretty-printed."""
    goals: str
    """The goals before it, pretty-printed."""
    pos: ReplPos | None = None
    """Where the tactic starts."""
    end_pos: ReplPos | None = Field(default=None, alias="endPos")
    """Where it ends."""
    proof_state: int | None = Field(default=None, alias="proofState")
    """Proof state before the tactic."""
    used_constants: tuple[str, ...] = Field(default=(), alias="usedConstants")
    """Constants the tactic's result uses."""


class CommandResponse(_Wire):
    """Answer to ``cmd``, ``pickleTo`` and ``unpickleEnvFrom``."""

    env: int
    """Id of the new environment (pass it as ``env`` to build on it)."""
    messages: tuple[ReplMessage, ...] = ()
    """Lean's messages."""
    sorries: tuple[Sorry, ...] = ()
    """The ``sorry``s in the command, each with its goal."""
    tactics: tuple[TacticInfo, ...] = ()
    """Every tactic, when asked for with ``allTactics``."""
    infotree: Any = None
    """The info tree, when asked for (kept as raw JSON)."""

    @property
    def errors(self) -> tuple[ReplMessage, ...]:
        """The messages of severity ``error``."""
        return tuple(m for m in self.messages if m.severity == "error")


class TacticResponse(_Wire):
    """Answer to ``{"tactic": ..., "proofState": n}`` (and to proof-state pickling)."""

    proof_state: int = Field(alias="proofState")
    """Id of the new proof state."""
    goals: tuple[str, ...] = ()
    """The goals left, pretty-printed; empty when none."""
    messages: tuple[ReplMessage, ...] = ()
    """Lean's messages for this step."""
    sorries: tuple[Sorry, ...] = ()
    """``sorry``s the tactic introduced."""
    proof_status: str | None = Field(default=None, alias="proofStatus")
    """``Completed``, ``Incomplete: ...`` or ``Error: ...`` (newer REPLs only)."""
    traces: tuple[str, ...] = ()
    """Trace output, when tracing is on."""


class ReplError(_Wire):
    """An error answer: ``{"message": "Unknown environment."}`` or ``"Lean error:\\n..."``."""

    message: str
    """What went wrong, as the REPL says it."""


Response = CommandResponse | TacticResponse | ReplError


def parse_response(obj: Any) -> Response:
    """Turn one decoded REPL answer into its model; :class:`ProtocolError` if it is none."""
    if not isinstance(obj, dict):
        raise ProtocolError(f"REPL answer is not a JSON object: {obj!r:.200}")
    try:
        if "env" in obj and "proofState" not in obj:
            return CommandResponse.model_validate(obj)
        if "proofState" in obj:
            return TacticResponse.model_validate(obj)
        if set(obj) == {"message"}:
            return ReplError.model_validate(obj)
    except ValidationError as e:
        raise ProtocolError(f"malformed REPL answer {obj!r:.200}: {e}") from e
    raise ProtocolError(f"unrecognised REPL answer with keys {sorted(obj)}: {obj!r:.200}")


def split_blocks(text: str) -> list[str]:
    """Split a transcript (requests or answers) into its blank-line-separated blocks."""
    blocks, cur = [], []
    for line in text.splitlines():
        if line.strip():
            cur.append(line)
        elif cur:
            blocks.append("\n".join(cur))
            cur = []
    if cur:
        blocks.append("\n".join(cur))
    return blocks


def read_request_block(block: str) -> Any:
    """Decode one request block the way the REPL does: its lines are joined with their line
    ends (and trailing spaces) removed, so a raw line break inside a JSON string disappears."""
    return json.loads("".join(line.rstrip() for line in block.splitlines()))


class CommandRequest(_Wire):
    """``{"cmd": text, "env": n}``: elaborate ``text`` in environment ``n`` (fresh when None)."""

    cmd: str
    """Lean source to elaborate (one or more commands)."""
    env: int | None = None
    """Environment to run in; None starts fresh (only then may ``cmd`` import)."""
    all_tactics: bool | None = Field(default=None, alias="allTactics")
    """Also report every tactic with its goals."""
    root_goals: bool | None = Field(default=None, alias="rootGoals")
    """Also report the root goals as sorries."""


class TacticRequest(_Wire):
    """``{"tactic": t, "proofState": n}``: run one tactic on a proof state."""

    tactic: str
    """The tactic (or tactic block) to run."""
    proof_state: int = Field(alias="proofState")
    """Proof state to run it on."""


class PickleEnvRequest(_Wire):
    """``{"pickleTo": path, "env": n}``: write environment ``n`` to an ``.olean`` file."""

    pickle_to: str = Field(alias="pickleTo")
    """Path of the ``.olean`` file to write."""
    env: int
    """Environment to write."""


class UnpickleEnvRequest(_Wire):
    """``{"unpickleEnvFrom": path}``: load a pickled environment (re-imports, replays)."""

    unpickle_env_from: str = Field(alias="unpickleEnvFrom")
    """Path of a file written by ``pickleTo``."""


Request = CommandRequest | TacticRequest | PickleEnvRequest | UnpickleEnvRequest


def encode_request(req: Request) -> bytes:
    """The bytes to write to the REPL's stdin for one request: one JSON line, then a blank line.

    The REPL reads lines until a blank one and joins them with their line ends trimmed, so a
    request must not contain a raw newline outside strings; ``json.dumps`` escapes them.
    """
    body = json.dumps(req.model_dump(by_alias=True, exclude_none=True), ensure_ascii=False)
    # Model output can hold lone surrogates; they cannot be UTF-8, so they become "?".
    return (body + "\n\n").encode("utf-8", errors="replace")
