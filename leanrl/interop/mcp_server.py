"""leanrl's Lean tools as an MCP server (``leanrl mcp --env minif2f``).

Agents people already use (Claude Code, Codex, any MCP client) get four tools on an
environment's Lean, through its runtime (the local pool by default, or ``docker``/``modal``):

============  ==================================================================================
``check``     Lean's errors, warnings and the goal at each ``sorry`` for a snippet under the
              header of a theorem of the taskset (or the taskset's first header)
``goals``     the goals of a taskset theorem after a partial tactic proof
``search``    a declaration's statement (``#check``) or lemmas closing a proposition (``exact?``)
``verify``    the trusted judge's verdict on a proof of a taskset theorem, against the taskset's
              reference statement and under the taskset's rules: the same check every leanrl
              attempt gets, so a proof it accepts cannot have changed the statement, used
              ``sorry``, an unlisted axiom or native code, or tampered with the checker
============  ==================================================================================

``check``, ``goals`` and ``search`` are the ``tool-use`` harness's tools (text for the model,
no verdict); only ``verify`` says accepted, and only about the taskset's own theorems, named
exactly (``theorem`` is a task's name; ``leanrl mcp`` lists them in its instructions up to a
few hundred). The server speaks MCP over stdio (what MCP clients start) or streamable HTTP on
loopback.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from leanrl._cli_help import suggest
from leanrl._dist import require
from leanrl.environment import Environment
from leanrl.harnesses.tool_use.lean_tools import (
    check_code,
    goals_after,
    read_submission,
    search_lean,
)
from leanrl.task import Task
from leanrl.verdict import Attempt, Verdict

if TYPE_CHECKING:
    import asyncio

__all__ = ["LeanToolService", "build_server", "verdict_json"]

_LISTED = 300  # theorem names the instructions list (a benchmark of more is listed in part)


class LeanToolService:
    """The four tools over one environment (its taskset's theorems, its runtime)."""

    def __init__(self, env: Environment) -> None:
        self.env = env
        self.tasks: dict[str, Task] = {}
        self._limiter: asyncio.Semaphore | None = None

    def load(self) -> None:
        """Read the taskset (names -> tasks)."""
        self.tasks = {t.name: t for t in self.env.tasks()}

    @property
    def limiter(self) -> asyncio.Semaphore:
        """Tactic sessions open at once (the runtime's room)."""
        import asyncio

        if self._limiter is None:
            cap = getattr(self.env.runtime, "max_tactic_sessions", None)
            self._limiter = asyncio.Semaphore(cap if isinstance(cap, int) and cap else 8)
        return self._limiter

    def task(self, theorem: str) -> Task:
        """The taskset's theorem called ``theorem`` (a :class:`ValueError` naming close ones)."""
        t = self.tasks.get(theorem.strip())
        if t is not None:
            return t
        close = suggest(theorem.strip(), list(self.tasks))
        hint = f" (did you mean {close!r}?)" if close else ""
        raise ValueError(
            f"no theorem {theorem!r} in taskset {self.env.config.id!r}{hint}; the instructions "
            "list the names"
        )

    def default_task(self) -> Task:
        """A task whose header is the taskset's (for snippets that name no theorem)."""
        if not self.tasks:
            raise ValueError(f"taskset {self.env.config.id!r} has no theorems")
        first = next(iter(self.tasks.values()))
        return Task(name="snippet", header=first.header, formal_statement="")

    def _needs_sessions(self) -> None:
        if not self.env.runtime.supports_tactic_sessions():
            raise ValueError(
                f"runtime {self.env.runtime.name!r} has no tactic sessions, so check, goals and "
                "search cannot run; verify still can (use the local runtime in repl mode)"
            )

    async def check(self, code: str, theorem: str = "") -> str:
        self._needs_sessions()
        task = self.task(theorem) if theorem.strip() else self.default_task()
        rules = self.env.taskset.config.policy
        async with self.limiter:
            text, _ = await check_code(self.env.runtime, task, code, rules)
        return text

    async def goals(self, theorem: str, proof_so_far: str = "") -> str:
        self._needs_sessions()
        task = self.task(theorem)
        rules = self.env.taskset.config.policy
        async with self.limiter:
            text, _ = await goals_after(self.env.runtime, task, proof_so_far, rules)
        return text

    async def search(self, query: str, theorem: str = "") -> str:
        self._needs_sessions()
        task = self.task(theorem) if theorem.strip() else self.default_task()
        rules = self.env.taskset.config.policy
        async with self.limiter:
            text, _ = await search_lean(self.env.runtime, task.header, query, rules)
        return text

    async def verify(self, theorem: str, proof: str) -> dict[str, Any]:
        task = self.task(theorem)
        answer = read_submission(proof, task)
        if answer.proof is None:
            assert answer.reason is not None
            return verdict_json(Verdict.reject(answer.reason, answer.detail), task)
        attempt = Attempt(
            name=task.name,
            header=task.header,
            formal_statement=task.formal_statement,
            proof=answer.proof,
            preamble=answer.preamble,
            restated_statement=answer.restated_statement,
            policy=self.env.taskset.config.policy,
            id=f"mcp/{task.name}",
        )
        (verdict,) = await self.env.runtime.check([attempt])
        return verdict_json(verdict, task)

    def instructions(self) -> str:
        names = list(self.tasks)
        shown = ", ".join(names[:_LISTED]) + (
            f", ... ({len(names)} in all)" if names[_LISTED:] else ""
        )
        return (
            f"Lean 4 tools on leanrl's {self.env.config.id!r} taskset. check, goals and search "
            "help write a proof (their output is Lean's, no verdict); verify gives the trusted "
            "judge's verdict on a proof of one of the taskset's theorems, against its reference "
            f"statement. Theorems: {shown}"
        )


def verdict_json(v: Verdict, task: Task) -> dict[str, Any]:
    """A verdict as the ``verify`` tool answers it."""
    return {
        "theorem": task.name,
        "accepted": v.accepted,
        "reason": v.reason.value,
        "detail": v.detail,
        "messages": [
            {
                "severity": m.severity,
                "line": m.pos.line if m.pos else None,
                "column": m.pos.column if m.pos else None,
                "text": m.data,
            }
            for m in v.messages[:20]
        ],
        "axioms": list(v.axioms),
    }


def build_server(env: Environment) -> Any:
    """An ``mcp`` server (``MCPServer``) serving the tools on ``env``; the runtime starts when
    the server does and closes with it."""
    require("mcp", "mcp", "leanrl mcp")
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    svc = LeanToolService(env)
    svc.load()

    @asynccontextmanager
    async def lifespan(_server: Any) -> AsyncIterator[None]:
        await env.start()
        try:
            yield None
        finally:
            await env.close()

    server: Any = MCPServer("leanrl", instructions=svc.instructions(), lifespan=lifespan)

    async def guarded(coro: Any) -> Any:
        try:
            return await coro
        except ValueError as e:
            raise ToolError(str(e)) from None

    @server.tool(
        description="Elaborate Lean 4 code under a taskset theorem's header (or the taskset's "
        "header); returns Lean's errors and warnings and the goal at each `sorry`. The code may "
        "be declarations, or (with theorem) a bare tactic proof of that theorem."
    )
    async def check(code: str, theorem: str = "") -> str:
        return str(await guarded(svc.check(code, theorem)))

    @server.tool(
        description="The goals of a taskset theorem after a partial tactic proof (its first "
        "goal when proof_so_far is empty)."
    )
    async def goals(theorem: str, proof_so_far: str = "") -> str:
        return str(await guarded(svc.goals(theorem, proof_so_far)))

    @server.tool(
        description="Look up a declaration's statement (give its name) or lemmas that prove a "
        "proposition (give the proposition; runs exact?)."
    )
    async def search(query: str, theorem: str = "") -> str:
        return str(await guarded(svc.search(query, theorem)))

    @server.tool(
        description="The trusted judge's verdict on a proof of a taskset theorem (a tactic "
        "proof, or the theorem with its proof), against the taskset's reference statement."
    )
    async def verify(theorem: str, proof: str) -> dict[str, Any]:
        out: dict[str, Any] = await guarded(svc.verify(theorem, proof))
        return out

    del check, goals, search, verify  # registered on the server
    return server
