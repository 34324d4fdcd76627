"""The pool's book of one role and set of imports: its processes, and when it may start one.

Start failures are infrastructure unless Lean said the header does not elaborate; while they
last, starts are rationed (:meth:`KeyState.may_start`) so that no number of waiting attempts can
turn a REPL that hangs or dies at start-up into a storm of starts, and every attempt that waits
is woken by the end of a bounded start.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Literal

__all__ = ["KeyState", "PoolError", "Role", "group_of"]

Role = Literal["elab", "judge", "tactic"]


class KeyState:
    """Processes of one role and set of imports, and whether they can be started.

    Two kinds of start failure are told apart, by Lean's answer and nothing else:

    * ``header_error``: Lean answered that the imports (or, for a judge, the checker's
      preconditions) do not elaborate. Starting again cannot help: every attempt of the key gets
      ``error``, the taskset's fault, for as long as the pool lives.
    * ``fails``/``infra_error``: the process died, hung, or answered garbage while starting (a
      kill during start-up, a full disk, a sandbox going away). These are infrastructure: after
      ``start_retries`` in a row, waiting attempts get ``infra`` (redone on resume, never a
      reward), further starts wait ``retry_at`` (exponential back-off), and the first start that
      succeeds clears the streak. Such a failure never turns into ``error``.
    """

    def __init__(self, role: Role) -> None:
        self.role = role
        self.ready: deque[Any] = deque()
        self.starting = 0
        self.waiting = 0
        self.fails = 0
        self.infra_error: str | None = None
        self.header_error: str | None = None
        self.retry_at = 0.0
        self.level = 0
        """Back-offs waited out in this streak: the next one lasts ``2 ** level`` times
        ``start_backoff_s``."""
        self.last_used = 0.0

    def failing(self, retries: int) -> bool:
        """Starts of this key have failed ``retries`` times in a row (infra, not the header)."""
        return self.fails >= retries

    def may_start(self, retries: int) -> bool:
        """Whether a start may begin now. Healthy keys start as many as they need at once;
        once a start has failed, one at a time until one succeeds, and once ``retries`` have
        failed in a row, not before the back-off (``retry_at``) is over -- however many
        attempts wait."""
        if self.header_error is not None:
            return False
        if self.fails == 0:
            return True
        if self.starting:
            return False
        return not self.failing(retries) or time.monotonic() >= self.retry_at


class PoolError(RuntimeError):
    """No process can be started for these imports (the detail says why)."""

    def __init__(self, detail: str, *, header_fault: bool) -> None:
        super().__init__(detail)
        self.header_fault = header_fault


def group_of(role: Role) -> str:
    """Elaborating and tactic processes share one cap; judges have their own."""
    return "judge" if role == "judge" else "work"
