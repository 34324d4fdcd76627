"""A deterministic TEST runtime and TEST policy. Not Lean, and never used outside tests.

``ScriptedRuntime`` judges an attempt by a rule instead of running Lean: accepted iff the proof
contains ``options["accept"]`` (default ``"omega"``) and no ``sorry``. The checker "could not
run" (verdict ``infra``) for every attempt while ``options["infra_file"]`` exists, and for the
samples numbered in ``options["infra_samples"]`` (attempt ids ``task/sample``). It records every attempt
and the time span of every ``check`` call, so tests can assert what reached the runtime and that
verification overlapped generation. Its tactic sessions follow a script: ``intro``-like tactics
(``options["progress"]``) add a goal, the accept tactic closes every goal, anything else errors.

``ScriptedPolicy`` answers every prompt with texts from a fixed list, cycling by sample index
(or chosen by ``pick(prompt, sample)``), and records the time span of every ``generate`` call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from leanrl.policy import (
    Completion,
    Policy,
    PolicyConfig,
    Prompt,
    SamplingConfig,
    StreamCompletion,
    StreamRequest,
)
from leanrl.runtime import Runtime, RuntimeConfig, TacticSession, TacticState
from leanrl.verdict import Attempt, Reason, Verdict, VerificationPolicy

__all__ = ["ScriptedPolicy", "ScriptedRuntime", "ScriptedSession"]


class ScriptedRuntime(Runtime):
    """Accepts a proof iff it contains the accept tactic (a rule, not Lean)."""

    name = "scripted"
    description = "TEST ONLY: judges proofs by a rule, not by Lean"

    def __init__(self, config: RuntimeConfig | None = None) -> None:
        super().__init__(config or RuntimeConfig(name="scripted"))
        opts: dict[str, Any] = self.config.options
        self.accept: str = opts.get("accept", "omega")
        self.progress: tuple[str, ...] = tuple(opts.get("progress", ("intro", "have")))
        self.delay_s: float = float(opts.get("delay_s", 0.0))
        self.fail_start: bool = bool(opts.get("fail_start", False))
        self.attempts: list[Attempt] = []
        self.spans: list[tuple[float, float]] = []
        self.session_policies: list[VerificationPolicy | None] = []
        self.sessions = 0
        self.started = False

    async def start(self) -> None:
        if self.fail_start:
            from leanrl.errors import LeanNotFoundError

            raise LeanNotFoundError("no Lean project (scripted failure); run `leanrl setup`")
        self.started = True

    def metrics(self) -> dict[str, float]:
        return {"checked": float(len(self.attempts)), "sessions": float(self.sessions)}

    def check_piece(self) -> int:
        return int(self.config.options.get("piece", 0))

    async def lean_version(self) -> str | None:
        return self.config.options.get("lean_version")

    async def check(self, attempts: Sequence[Attempt]) -> list[Verdict]:
        t0 = time.perf_counter()
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        out = []
        infra_file = self.config.options.get("infra_file")
        infra_samples = {str(i) for i in self.config.options.get("infra_samples", ())}
        for a in attempts:
            self.attempts.append(a)
            sample = (a.id or "").rpartition("/")[2]
            if (infra_file and Path(infra_file).exists()) or sample in infra_samples:
                out.append(Verdict.reject(Reason.INFRA, "sandbox died twice", id=a.id))
            elif "sorry" in a.proof:
                out.append(Verdict.reject(Reason.SORRY, "uses sorry", id=a.id))
            elif self.accept in a.proof:
                out.append(Verdict(accepted=True, reason=Reason.OK, id=a.id, time_s=0.01))
            else:
                out.append(Verdict.reject(Reason.ERROR, "unsolved goals", id=a.id, time_s=0.01))
        self.spans.append((t0, time.perf_counter()))
        return out

    @asynccontextmanager
    async def _session(self, header: str) -> AsyncIterator[TacticSession]:
        self.sessions += 1
        yield ScriptedSession(self)

    def tactic_session(self, header: str, policy: VerificationPolicy | None = None) -> Any:
        self.session_policies.append(policy)
        return self._session(header)


class ScriptedSession(TacticSession):
    """Goals follow a script: progress tactics add a goal, the accept tactic closes them all."""

    def __init__(self, rt: ScriptedRuntime) -> None:
        self.rt = rt
        self.states: dict[int, tuple[str, ...]] = {}
        self.applied: list[str] = []

    async def start(self, formal_statement: str, preamble: str = "") -> TacticState:
        goal = "⊢ " + formal_statement.split(":", 1)[-1].removesuffix(":= by").strip()
        self.states[0] = (goal,)
        return TacticState(proof_state=0, goals=(goal,))

    async def apply(self, proof_state: int, tactic: str) -> TacticState:
        self.applied.append(tactic)
        goals = self.states[proof_state]
        for line in (ln.strip() for ln in tactic.splitlines() if ln.strip()):
            if line.startswith(self.rt.accept):
                goals = ()
            elif line.startswith(self.rt.progress):
                goals = (*goals, f"case {len(goals)}: ⊢ after {line}")
            else:
                return TacticState(proof_state=None, error=f"unknown tactic '{line}'")
        new = len(self.states)
        self.states[new] = goals
        return TacticState(proof_state=new, goals=goals)


class ScriptedPolicy(Policy):
    """Answers from a fixed list of texts (sample i gets ``texts[i % len]``); tokenizes by
    characters, so token counts are deterministic."""

    name = "scripted"

    def __init__(
        self,
        texts: Sequence[str],
        *,
        finish: str = "stop",
        delay_s: float = 0.0,
        per_turn: Sequence[str] | None = None,
        pick: Callable[[Prompt, int], str] | None = None,
    ) -> None:
        super().__init__(PolicyConfig(model="scripted"))
        self.texts = list(texts)
        self.finish = finish
        self.delay_s = delay_s
        self.per_turn = list(per_turn) if per_turn is not None else None
        self.pick = pick
        self.calls: list[list[Prompt]] = []
        self.spans: list[tuple[float, float]] = []
        self.seeds: list[int | None] = []

    def tokenize(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    async def generate(
        self, prompts: Sequence[Prompt], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        t0 = time.perf_counter()
        self.calls.append(list(prompts))
        self.seeds.append(sampling.seed)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        out = []
        for prompt in prompts:
            row = []
            for i in range(sampling.n):
                if self.pick is not None:
                    text = self.pick(prompt, i)
                elif self.per_turn is not None:
                    text = self.per_turn[min(len(self.calls) - 1, len(self.per_turn) - 1)]
                else:
                    text = self.texts[i % len(self.texts)]
                ids = tuple(ord(c) for c in text)
                row.append(
                    Completion(
                        text=text,
                        token_ids=ids,
                        logprobs=tuple(-0.5 for _ in ids),
                        finish_reason=self.finish,  # type: ignore[arg-type]
                    )
                )
            out.append(row)
        self.spans.append((t0, time.perf_counter()))
        return out


class HoldLastPolicy(ScriptedPolicy):
    """A backend with a stream of its own: every sample of every request is streamed on its
    own, the last one only once ``release`` is set (a slow sequence still generating); a test's
    runtime sets it after it has checked something, so a caller that waited for the whole batch
    before checking would never finish. ``replays``: what ``stream_replays`` answers."""

    def __init__(self, *a: Any, replays: bool = True, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.replays = replays
        self.release = asyncio.Event()
        self.streams = 0

    def stream_replays(self, sampling: SamplingConfig) -> bool:
        return self.replays

    async def stream(self, requests: Sequence[StreamRequest]) -> AsyncIterator[StreamCompletion]:
        self.streams += 1
        got = await self.generate([r.prompt or "" for r in requests], requests[0].sampling)
        out = [(r, i, c) for r, row in zip(requests, got, strict=True) for i, c in enumerate(row)]
        for k, (r, i, c) in enumerate(out):
            if k == len(out) - 1:
                await self.release.wait()
            yield StreamCompletion(r.key, i, c, 0.01)
