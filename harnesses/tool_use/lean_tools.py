"""Lean as a tool: ``check``, ``goals``, ``search`` and ``submit`` for one task.

Every call opens a tactic session on the task's runtime (``Runtime.tactic_session``: a warm
REPL process of the task's header from the pool, the tactic sub-pool, never one that checks
proofs), asks one or two questions, and gives the process back; a session is never held
between a model's turns, so episodes that are generating hold no Lean process. Model text
reaches Lean only through the session's pre-scan (the taskset's rules), like the tactic loop's.

What the tools answer is text for the model. None of it is a verdict: ``submit`` only records
the proof, which the trusted judge checks after the episode like any other attempt (a proof the
tools found fine can still be rejected there). The functions :func:`check_code`,
:func:`goals_after` and :func:`search_lean` are what the MCP server (``leanrl mcp``) serves too.

``sorry``: the pre-scan refuses it in anything sent to Lean, so :func:`check_code` stands each
``sorry`` (and ``admit``) in for a tactic that fails showing the goal it was to close (``done``;
``(by done)`` where a term is expected) and reports those goals as ``goal at sorry``. Lean stops
a tactic block at its first failing tactic, so after a ``sorry`` in the main block the rest of
that block is not checked (a ``sorry`` inside a ``have ... := by`` block leaves the main block
going); check the rest with ``goals``.
"""

from __future__ import annotations

import asyncio
import re
import textwrap
import time
from collections.abc import Sequence
from typing import Any

from leanrl.lean.trust.lexer import Kind, tokenize
from leanrl.runtime import Runtime, TacticState
from leanrl.task import Task
from leanrl.verdict import Message, Reason, VerificationPolicy

from ..tactic_loop import join_tactics
from ..whole_proof.extract import extract_proof
from .tools import Answer, EpisodeTools, Tool, ToolResult, clip, string_params

__all__ = [
    "LeanTools",
    "check_code",
    "goals_after",
    "lean_tools",
    "read_submission",
    "search_lean",
    "stand_in_sorries",
]

PROBE = "example : True := by"
"""The statement a :func:`check_code` snippet is elaborated in front of (the session needs
one; its own hole and messages are dropped)."""

_DECLARATION = re.compile(
    r"^\s*(?:@\[[^\]]*\]\s*)?(?:(?:private|protected|noncomputable|nonrec|partial)\s+)*"
    r"(?:theorem|lemma|example|def|abbrev|instance|structure|inductive|class|namespace|section|"
    r"open|variable|universe|set_option|#check|#print|#reduce)\b",
    re.M,
)
_IDENT = re.compile(r"@?[A-Za-z_\u00c0-\u024f\u0370-\u03ff][\w.'!?\u2080-\u2089\u00c0-\u03ff]*")
# Tokens after which a `sorry` stands for a tactic (else it is a term).
_TACTIC_AFTER = frozenset({"by", ";", "<;>", "·", ".", "then", "else", "do", "at", "case"})


def lean_tools(*, search: bool = True) -> list[Tool]:
    """The Lean tools, in the order the prompt lists them."""
    tools = [
        Tool(
            "check",
            "Elaborate Lean 4 code under the task's header and get Lean's errors and warnings, "
            "and the goal at each `sorry`. The code may be helper lemmas, the theorem with a "
            "(partial) proof, or just a tactic proof of the theorem.",
            string_params(code="Lean 4 code, or tactics proving the task's theorem"),
        ),
        Tool(
            "goals",
            "The goals left after a partial tactic proof of the task's theorem (empty for the "
            "goal at the start).",
            string_params(proof_so_far="tactics, one per line, as they go after `:= by`"),
        ),
    ]
    if search:
        tools.append(
            Tool(
                "search",
                "Look up a declaration: give a name (e.g. Nat.add_comm) for its statement, or a "
                "proposition (e.g. a + b = b + a) for lemmas that prove it (exact?).",
                string_params(query="a declaration name, or a Lean proposition"),
            )
        )
    tools.append(
        Tool(
            "submit",
            "Hand in the final proof of the task's theorem (a tactic proof, or the theorem with "
            "its proof in Lean 4). It is checked once, after the episode; the episode ends.",
            string_params(proof="the proof"),
        )
    )
    return tools


class LeanTools(EpisodeTools):
    """The Lean tools of one episode on ``task``. ``limiter`` bounds the tactic sessions open
    at once across episodes (the runtime's room)."""

    def __init__(
        self,
        task: Task,
        runtime: Runtime,
        rules: VerificationPolicy,
        limiter: asyncio.Semaphore,
        *,
        max_chars: int = 4000,
        search: bool = True,
    ) -> None:
        super().__init__()
        self.task, self.runtime, self.rules = task, runtime, rules
        self.limiter, self.max_chars = limiter, max_chars
        self._tools = lean_tools(search=search)

    @property
    def tools(self) -> Sequence[Tool]:
        return self._tools

    async def run(self, name: str, args: dict[str, Any]) -> ToolResult:
        if name == "submit":
            answer = read_submission(str(args["proof"]), self.task)
            if answer.proof is None:
                return ToolResult(f"Error: {answer.detail}; nothing was submitted", ok=False)
            self.answer = answer
            return ToolResult("Submitted.", submitted=True)
        t0 = time.perf_counter()
        async with self.limiter:
            self.wait_s += time.perf_counter() - t0
            if name == "check":
                text, ok = await check_code(self.runtime, self.task, str(args["code"]), self.rules)
            elif name == "goals":
                text, ok = await goals_after(
                    self.runtime, self.task, str(args["proof_so_far"]), self.rules
                )
            else:
                text, ok = await search_lean(
                    self.runtime, self.task.header, str(args["query"]), self.rules
                )
        return ToolResult(clip(text, self.max_chars), ok=ok)

    def read_text(self, text: str, finish_reason: str | None) -> Answer | None:
        """A final turn without a tool call: its Lean code block is the answer, read as the
        whole-proof harness reads a completion."""
        ex = extract_proof(text, self.task, finish_reason=finish_reason)
        return Answer(ex.proof, ex.preamble, ex.restated_statement, ex.reason, ex.detail)


# -- the answers ---------------------------------------------------------------------------------


def read_submission(text: str, task: Task) -> Answer:
    """A submitted proof as the judge takes it: Lean code (in a code block or not) declaring
    the task's theorem is read as the whole-proof harness reads a completion (helper lemmas
    become the preamble); anything else is a tactic proof for ``:= by``."""
    body = text.strip()
    if not body:
        return Answer(reason=Reason.NO_PROOF, detail="the submitted proof is empty")
    fenced = "```" in body
    if fenced or re.search(rf"\b(theorem|lemma)\s+{re.escape(task.name)}\b", body):
        ex = extract_proof(body if fenced else f"```lean4\n{body}\n```", task)
        return Answer(ex.proof, ex.preamble, ex.restated_statement, ex.reason, ex.detail)
    return Answer(proof=join_tactics([body]))


async def check_code(
    runtime: Runtime, task: Task, code: str, rules: VerificationPolicy
) -> tuple[str, bool]:
    """Lean's messages on ``code`` elaborated under ``task.header`` (a bare tactic proof goes
    under the task's statement), and whether it had no errors; ``sorry`` is stood in for
    (see the module docstring)."""
    code = code.replace("\r\n", "\n")
    dropped = re.findall(r"(?m)^import\b.*$", code)
    code = re.sub(r"(?m)^import\b.*$", "", code)
    if not code.strip():
        return "Error: no code to check", False
    if not _DECLARATION.search(code):
        code = (
            task.formal_statement.rstrip()
            + "\n"
            + textwrap.indent(textwrap.dedent(code).strip("\n"), "  ")
        )
    text, holes = stand_in_sorries(code)
    st = await _start(runtime, task.header, PROBE, rules, preamble=text)
    lines = text.rstrip().count("\n") + 1
    note = "import lines were left out (the task's header is loaded)\n" if dropped else ""
    if st.error is not None and not st.messages:
        return f"{note}Error: {st.error}", False  # the pre-scan refused it, or Lean failed
    own = [m for m in st.messages if m.pos is None or m.pos.line <= lines]
    out, errors = _describe(own, holes)
    if not out:
        return f"{note}No errors or warnings.", True
    return note + "\n".join(out), errors == 0


def _describe(messages: Sequence[Message], holes: set[int]) -> tuple[list[str], int]:
    out: list[str] = []
    errors = 0
    for m in messages:
        where = f" {m.pos.line}:{m.pos.column}" if m.pos else ""
        data = m.data.strip()
        if m.severity == "error" and m.pos and m.pos.line in holes and "unsolved goals" in data:
            goal = data.split("unsolved goals", 1)[1].strip()
            out.append(f"goal at sorry{where}:\n{goal}")
            continue
        if m.severity == "error":
            errors += 1
        out.append(f"{m.severity}{where}: {data}")
    return out, errors


def stand_in_sorries(code: str) -> tuple[str, set[int]]:
    """``code`` with each ``sorry``/``admit`` replaced by ``done`` (a tactic) or ``(by done)``
    (a term), and the lines they were on; unchanged when it lexes with an error (the pre-scan
    then says what is wrong)."""
    toks = tokenize(code)
    if toks and toks[-1].kind is Kind.ERROR:
        return code, set()
    edits: list[tuple[int, int, str]] = []
    lines: set[int] = set()
    for i, t in enumerate(toks):
        if t.kind is not Kind.IDENT or t.text not in ("sorry", "admit"):
            continue
        prev = toks[i - 1] if i else None
        tactic = prev is None or prev.line < t.line or prev.text in _TACTIC_AFTER
        if prev is not None and prev.text == "=>":
            # `case h => sorry` is a tactic, `fun x => sorry` a term
            same_line = [p.text for p in toks[:i] if p.line == t.line]
            tactic = not ({"fun", "λ"} & set(same_line))
        edits.append((t.start, t.end, "done " if tactic else "(by done)"))
        lines.add(t.line)
    for start, end, new in reversed(edits):
        code = code[:start] + new + code[end:]
    return code, lines


async def goals_after(
    runtime: Runtime, task: Task, proof_so_far: str, rules: VerificationPolicy
) -> tuple[str, bool]:
    """The goals of ``task`` after the tactics ``proof_so_far`` (its first goal when empty)."""
    proof = textwrap.dedent(proof_so_far.replace("\r\n", "\n")).strip("\n")
    opened = await _with_session(runtime, task.header, rules, task.formal_statement, proof)
    if isinstance(opened, str):
        return opened, False
    start, step = opened
    if start.error is not None or start.proof_state is None:
        return f"Error: the theorem's statement did not elaborate: {start.error}", False
    if step is None:
        return "Goals:\n" + _goals(start.goals), True
    if step.error is not None:
        return f"Error: {step.error}", False
    if not step.goals:
        return "No goals remain: the proof is complete. Submit it to have it checked.", True
    return "Goals:\n" + _goals(step.goals), True


async def search_lean(
    runtime: Runtime, header: str, query: str, rules: VerificationPolicy
) -> tuple[str, bool]:
    """A declaration's statement (``#check`` of a name) or lemmas that close a proposition
    (``exact?``), from the Lean of ``header``."""
    q = query.strip()
    if not q:
        return "Error: give a declaration name or a proposition to search for", False
    if "\n" in q:
        return "Error: the query must be one line", False
    name = _IDENT.fullmatch(q)
    code = f"#check @{q.lstrip('@')}" if name else f"example : {q} := by\n  exact?"
    st = await _start(runtime, header, PROBE, rules, preamble=code)
    if st.error is not None and not st.messages:
        return f"Error: {st.error}", False
    shown = [m for m in st.messages if m.pos is None or m.pos.line <= code.count("\n") + 1]
    if not shown:
        return ("No declaration found." if name else "exact? found nothing."), False
    found = [m.data.strip() for m in shown if m.severity != "error"]
    errors = [m.data.strip() for m in shown if m.severity == "error"]
    text = "\n".join(found + [f"error: {e}" for e in errors])
    return text, bool(found)


async def _start(
    runtime: Runtime, header: str, statement: str, rules: VerificationPolicy, preamble: str = ""
) -> TacticState:
    opened = await _with_session(runtime, header, rules, statement, None, preamble)
    if isinstance(opened, str):
        return TacticState(proof_state=None, error=opened.removeprefix("Error: "))
    return opened[0]


async def _with_session(
    runtime: Runtime,
    header: str,
    rules: VerificationPolicy,
    statement: str,
    proof: str | None,
    preamble: str = "",
) -> tuple[TacticState, TacticState | None] | str:
    """One session: start ``statement`` (after ``preamble``) and, with ``proof``, apply it to
    the start's goal. A session that cannot be had, or fails, is an error text."""
    try:
        async with runtime.tactic_session(header, policy=rules) as session:
            start = await session.start(statement, preamble)
            step = None
            if proof and start.error is None and start.proof_state is not None:
                step = await session.apply(start.proof_state, proof)
            return start, step
    except Exception as e:  # noqa: BLE001 - a tool call that fails costs that call only
        return f"Error: Lean is not available for this call ({type(e).__name__}: {e})"


def _goals(goals: Sequence[str]) -> str:
    return "\n\n".join(goals) if goals else "(no goals)"
