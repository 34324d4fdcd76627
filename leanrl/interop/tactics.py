"""Lean's tactic mode as two tools, ``start(theorem)`` and ``tactic(state, text)``, over
leanrl's tactic sessions (:meth:`leanrl.Runtime.tactic_session`).

For agentic harnesses that want to try tactics before answering (verifiers' toolset is
:mod:`leanrl.interop.verifiers_tactics`; this module imports nothing of verifiers). Each tactic
is screened by the taskset's verification policy before it reaches Lean, as in leanrl's
``tactic-loop`` harness. What the tools say is feedback only: a rollout is still rewarded by the
checker's verdict on its final whole proof, never by a tool having reported "no goals".
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

from leanrl.errors import ConfigError
from leanrl.runtime import Runtime, TacticSession, TacticState
from leanrl.task import Task
from leanrl.verdict import VerificationPolicy

__all__ = ["TacticTools"]


class TacticTools:
    """Tactic sessions on the theorems of one taskset. Proof states get ids unique across the
    sessions this object opened (a session's own ids restart at 0)."""

    def __init__(
        self,
        runtime: Runtime,
        tasks: Mapping[str, Task],
        policy: VerificationPolicy | None = None,
        max_sessions: int = 8,
    ) -> None:
        self.runtime = runtime
        self.tasks = dict(tasks)
        """The theorems that can be opened, by task name."""
        self.policy = policy
        self.max_sessions = max_sessions
        self._stack = contextlib.AsyncExitStack()
        self._sessions: list[TacticSession] = []
        self._states: list[tuple[TacticSession, int]] = []
        self._lock = asyncio.Lock()

    def _answer(self, session: TacticSession, st: TacticState) -> dict[str, Any]:
        state = None
        if st.proof_state is not None:
            self._states.append((session, st.proof_state))
            state = len(self._states) - 1
        return {
            "state": state,
            "goals": list(st.goals),
            "solved": st.solved,
            "error": st.error,
        }

    async def start(self, theorem: str) -> dict[str, Any]:
        """Open ``theorem`` (a task name) in tactic mode: ``state`` (the id to apply tactics
        to) and its ``goals``."""
        task = self.tasks.get(theorem)
        if task is None:
            known = ", ".join(sorted(self.tasks)[:5])
            return {
                "state": None,
                "goals": [],
                "solved": False,
                "error": f"unknown theorem {theorem!r} (known: {known}, ...)",
            }
        async with self._lock:
            if len(self._sessions) >= self.max_sessions:
                return {
                    "state": None,
                    "goals": [],
                    "solved": False,
                    "error": f"at most {self.max_sessions} theorems may be opened",
                }
            session = await self._stack.enter_async_context(
                self.runtime.tactic_session(task.header, self.policy)
            )
            self._sessions.append(session)
        return self._answer(session, await session.start(task.formal_statement))

    async def tactic(self, state: int, text: str) -> dict[str, Any]:
        """Apply the tactic ``text`` to proof state ``state``: the new ``state`` and ``goals``
        (``solved`` when none remain), or Lean's ``error`` (the old state is still usable)."""
        if not 0 <= state < len(self._states):
            return {
                "state": None,
                "goals": [],
                "solved": False,
                "error": f"unknown proof state {state}; use an id that start or tactic returned",
            }
        session, local = self._states[state]
        return self._answer(session, await session.apply(local, text))

    async def close(self) -> None:
        """Close every session (idempotent)."""
        await self._stack.aclose()
        self._sessions.clear()
        self._states.clear()

    async def __aenter__(self) -> TacticTools:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def require_tactic_mode(runtime: Runtime) -> None:
    """Refuse a runtime without tactic mode before any tool is offered."""
    if not runtime.supports_tactic_sessions():
        raise ConfigError(
            f"runtime {runtime.name!r} has no tactic mode, which the tactic tools need; use "
            "`local` in `repl` mode, `docker` or `modal`"
        )
