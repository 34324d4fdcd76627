"""A test runtime that judges attempts by a simple rule on the proof text (never Lean).

It stands in for the Lean runtime behind the verification service, so the service, client, pool
and sandbox runtimes are tested with real processes and real HTTP. Proof texts:

=================  =====================================================================
``ok`` / ``rfl``   accepted
contains ``sorry`` rejected, reason ``sorry``
``sleep S``        sleeps S seconds, then accepted
``hang``           never returns (the caller's timeouts must deal with it)
``die``            kills the whole process at once (``os._exit``): a sandbox dying mid-batch
``die-once:PATH``  dies if PATH does not exist yet (creating it first), otherwise accepted
``raise``          raises (a runtime bug; the service must not answer 500)
anything else      rejected, reason ``error``
=================  =====================================================================

Tactic sessions: a header containing ``import Broken`` cannot open one (``RuntimeUnavailable``);
the tactic ``raise`` raises (a runtime bug); ``hang`` never returns.

``config.options``: ``startup_s`` (sleep in :meth:`start`, like loading Mathlib), ``start_error``
(:meth:`start` raises it as ``RuntimeUnavailable``), ``log_path``
(append ``pid id`` for every attempt checked, to count checks across processes), ``closed_path``
(written by :meth:`close`, to see that a process shut its runtime down), ``session_open_s``
(sleep while opening a tactic session, like starting a Lean process), ``isolated`` (what
:meth:`isolation` reports, so ``GET /health`` says the processes are isolated or not; unset: it
says nothing, like a runtime without the report).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path

from leanrl.errors import RuntimeUnavailable
from leanrl.runtime import Runtime, TacticSession, TacticState
from leanrl.verdict import Attempt, Message, Reason, Verdict, VerificationPolicy


class EchoRuntime(Runtime):
    """Judges attempts by the rule in this module's docstring."""

    name = "echo-test"
    description = "test runtime: judges proofs by a fixed rule on the text (no Lean)"

    def __init__(self, config=None) -> None:  # type: ignore[no-untyped-def]
        super().__init__(config)
        self.started = False
        self.closed = False
        self.checked = 0
        self.warmed: list[str] = []
        self.sessions_opened = 0
        self.session_policies: list[VerificationPolicy | None] = []

    async def start(self) -> None:
        if self.config.options.get("start_error"):
            raise RuntimeUnavailable(str(self.config.options["start_error"]))
        delay = float(self.config.options.get("startup_s", 0.0))
        if delay:
            await asyncio.sleep(delay)
        self.started = True

    async def close(self) -> None:
        self.closed = True
        closed_path = self.config.options.get("closed_path")
        if closed_path:
            Path(closed_path).write_text("closed")

    def metrics(self) -> dict[str, float]:
        return {
            "checked": self.checked,
            "restarts": 0,
            "warmed": len(self.warmed),
            "sessions_opened": self.sessions_opened,
        }

    def isolation(self) -> tuple[bool | None, str]:
        flag = self.config.options.get("isolated")
        if flag is None:
            return None, ""
        return bool(flag), "" if flag else "the echo test runtime was told to say so"

    async def warm(self, header: str) -> None:
        """Like loading a header's imports: takes ``warm_s`` seconds."""
        await asyncio.sleep(float(self.config.options.get("warm_s", 0.0)))
        if "import Broken" in header:
            raise RuntimeUnavailable("unknown module Broken")
        self.warmed.append(header)

    async def check(self, attempts: Sequence[Attempt]) -> list[Verdict]:
        log_path = self.config.options.get("log_path")
        return [await self._one(a, log_path) for a in attempts]

    async def _one(self, a: Attempt, log_path: str | None) -> Verdict:
        t0 = time.monotonic()
        proof = a.proof.strip()
        if log_path:
            with open(log_path, "a") as f:
                f.write(f"{os.getpid()} {a.id}\n")
        self.checked += 1
        if proof == "die":
            os._exit(17)
        if proof.startswith("die-once:"):
            marker = Path(proof.split(":", 1)[1])
            if not marker.exists():
                marker.write_text("died")
                os._exit(17)
            proof = "ok"
        if proof == "hang":
            await asyncio.sleep(3600)
        if proof == "raise":
            raise RuntimeError("echo runtime asked to raise")
        if proof.startswith("sleep "):
            await asyncio.sleep(float(proof.split()[1]))
            proof = "ok"
        dt = time.monotonic() - t0
        if proof in ("ok", "rfl"):
            return Verdict(accepted=True, reason=Reason.OK, time_s=dt, id=a.id)
        if "sorry" in proof:
            return Verdict.reject(Reason.SORRY, "declaration uses 'sorry'", time_s=dt, id=a.id)
        msg = Message(severity="error", data=f"unknown tactic {proof!r}")
        return Verdict.reject(
            Reason.ERROR, f"unknown tactic {proof!r}", messages=(msg,), time_s=dt, id=a.id
        )

    def tactic_session(
        self, header: str, policy: VerificationPolicy | None = None
    ) -> AbstractAsyncContextManager[TacticSession]:
        self.session_policies.append(policy)

        @contextlib.asynccontextmanager
        async def session() -> AsyncIterator[TacticSession]:
            delay = float(self.config.options.get("session_open_s", 0.0))
            if delay:
                await asyncio.sleep(delay)
            if "import Broken" in header:
                raise RuntimeUnavailable("no Lean process for this header: unknown module Broken")
            self.sessions_opened += 1
            yield _EchoSession(header)

        return session()


class _EchoSession(TacticSession):
    def __init__(self, header: str) -> None:
        self.header = header
        self.goal = ""
        self.next_state = 0

    async def start(self, formal_statement: str, preamble: str = "") -> TacticState:
        self.goal = "⊢ " + formal_statement.removesuffix(":= by").strip()
        return TacticState(proof_state=self._new(), goals=(self.goal,))

    async def apply(self, proof_state: int, tactic: str) -> TacticState:
        if proof_state >= self.next_state:
            return TacticState(proof_state=None, error=f"unknown proof state {proof_state}")
        if tactic == "hang":
            await asyncio.sleep(3600)
        if tactic == "raise":
            raise RuntimeError("echo session asked to raise")
        if tactic in ("done", "rfl"):
            return TacticState(proof_state=self._new(), goals=())
        if tactic == "fail":
            return TacticState(proof_state=None, error="tactic 'fail' failed")
        return TacticState(proof_state=self._new(), goals=(self.goal,))

    def _new(self) -> int:
        self.next_state += 1
        return self.next_state - 1
