"""The ``tactic-loop`` harness: the model sends tactics, Lean answers with goals or an error.

Each attempt is an episode on one REPL tactic session. Every turn, all live episodes of a wave
generate together, and each episode's tactics are applied as soon as its completion is done
(``Policy.stream``, where that gives what one batched ``generate`` call would; else one
``generate`` call, then every episode's tactics at once).
An episode ends when no goals remain, after ``max_turns`` turns, or when its tokens (model and
environment) reach ``max_total_tokens``. A solved episode's tactics are joined into one proof and
checked again as a whole with ``runtime.check`` under the reference statement and the taskset's
rules, so the reward never rests on tactic mode alone.

After the first turn, an episode's context is kept as token ids (prompt ids, then each turn's
completion and feedback ids) and generated from with ``policy.generate_from_ids`` when the policy
has it, so the ids a trainer replays are exactly those the model saw (``context.py``); other
policies get the growing text (or message list). ``Rollout.meta["context"]`` says which.
"""

from __future__ import annotations

import asyncio
import textwrap
import time
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass, field
from typing import cast

from leanrl.harness import Harness, SFTEpisode, SFTTurn
from leanrl.policy import (
    Completion,
    Policy,
    Prompt,
    SamplingConfig,
    StreamCompletion,
    StreamRequest,
    stream_replays_generate,
)
from leanrl.rollout import ChatMessage, Rollout, Turn
from leanrl.runtime import Runtime, TacticSession, TacticState
from leanrl.task import Task
from leanrl.taskset import Taskset
from leanrl.verdict import Reason, Verdict, VerificationPolicy

from ..whole_proof.extract import strip_reasoning
from ..whole_proof.harness import check_and_reward, off_loop
from ..whole_proof.stream import handle_arrivals
from .context import ids_capable, record_turn

__all__ = ["TacticLoopHarness", "extract_tactics", "join_tactics"]

_SYSTEM = (
    "You are proving a theorem in Lean 4 with Mathlib, interactively. Each turn, reply with the "
    "next tactic(s) in a ```lean4 block. Lean answers with the remaining goals or an error."
)


# What a turn that applied nothing is told (also how SFT tells such a turn apart).
_CUT_OFF = "Your output was cut off before the tactics ended."
_NO_TACTICS = "No tactics found. Reply with Lean tactics in a ```lean4 block."
_ERROR = "Error: "


def extract_tactics(text: str, chat: bool) -> str:
    """The tactics in one turn's output ('' when there are none)."""
    body, problem = strip_reasoning(text)
    if problem is not None:
        return ""
    if not chat:
        return textwrap.dedent(body.split("```", 1)[0]).strip("\n").rstrip()
    block = _last_block(body)
    code = body if block is None else block
    return textwrap.dedent(code).strip("\n").rstrip()


def _last_block(body: str) -> str | None:
    """The last fenced block's text: from the line after a ```` ``` ```` (whatever follows it on
    that line) to the next ```` ``` ````; None when there is none. Read with ``str.find``, so a
    text of a thousand backticks and no newline costs its length once (a pattern retried at
    every ```` ``` ```` costs its length each time)."""
    last: str | None = None
    pos = 0
    while (tick := body.find("```", pos)) >= 0:
        newline = body.find("\n", tick + 3)
        if newline < 0:
            break  # no line after it: no block opens here, nor at any later backticks
        end = body.find("```", newline + 1)
        if end < 0:
            break  # never closed: nor is any block opened after it
        last = body[newline + 1 : end]
        pos = end + 3
    return last


def _read_tactics(texts: list[str], chat: bool) -> list[str]:
    # (looked up at call time, so a test can watch `extract_tactics`)
    return [extract_tactics(t, chat) for t in texts]


def join_tactics(steps: Sequence[str]) -> str:
    """Accepted steps as one tactic block for ``:= by`` (leading newline, indented by 2)."""
    lines = [ln for s in steps for ln in textwrap.dedent(s).strip("\n").split("\n")]
    return "\n" + "\n".join(("  " + ln) if ln.strip() else "" for ln in lines)


def _goals_text(goals: Sequence[str]) -> str:
    return "\n\n".join(goals) if goals else "(no goals)"


@dataclass
class _Episode:
    task: Task
    sample: int
    prompt: Prompt
    context: Prompt
    turns: list[Turn] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)
    state: int | None = None
    goals: tuple[str, ...] = ()
    tokens: int = 0
    done: bool = False
    verdict: Verdict | None = None
    session: TacticSession | None = None
    gen_s: float = 0.0
    apply_s: float = 0.0
    mode: str = "text"  # "ids": the context after turn 1 is kept as token ids
    prompt_ids: list[int] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)


class TacticLoopHarness(Harness):
    """Many turns against REPL tactic mode; the finished proof is re-checked as a whole."""

    name = "tactic-loop"
    needs_tactic_sessions = True
    description = "many turns: send tactics, see goals and errors, continue (REPL tactic mode)"
    option_keys = frozenset({"max_sessions"})

    def check_config(self) -> None:
        """An unknown prompt format (a typo would silently give chat prompts), up front."""
        from ..whole_proof.prompts import FORMATS

        if self.config.prompt_format not in FORMATS:
            from ..whole_proof.prompts import check_config as check_prompt

            check_prompt(self.config)  # raises, with a did-you-mean

    @property
    def chat(self) -> bool:
        """Chat prompts (messages) unless the prompt format is a completion format."""
        return self.config.prompt_format not in ("deepseek", "custom")

    @property
    def wave_size(self) -> int:
        """Episodes (tactic sessions) open at once: ``options["max_sessions"]`` (default 16),
        lowered to the runtime's ``max_tactic_sessions`` where it has one."""
        return int(self.config.options.get("max_sessions", 16))

    def first_prompt(self, task: Task, goals: Sequence[str]) -> Prompt:
        """The opening prompt: the theorem and its goals."""
        code = f"```lean4\n{task.header}{task.formal_statement}\n```"
        informal = (
            f"Problem: {task.informal_statement.strip()}\n\n" if task.informal_statement else ""
        )
        if self.config.prompt_format == "custom" and self.config.template:
            return self.config.template.format(
                header=task.header,
                formal_statement=task.formal_statement,
                informal_statement=task.informal_statement or "",
                name=task.name,
                goals=_goals_text(goals),
            )
        if not self.chat:
            return (
                "Prove the theorem below in Lean 4, a few tactics at a time. After each step Lean "
                f"shows the remaining goals or an error.\n\n{informal}{code}\n"
                f"Goals:\n{_goals_text(goals)}\n\nNext tactics:\n```lean4\n"
            )
        return [
            ChatMessage(role="system", content=self.config.system_prompt or _SYSTEM),
            ChatMessage(
                role="user",
                content=f"{informal}Prove this theorem:\n\n{code}\n\nGoals:\n{_goals_text(goals)}",
            ),
        ]

    def feedback(self, state: TacticState | None, goals: Sequence[str], note: str = "") -> str:
        """What the environment says after a turn (goals, or the error and unchanged goals)."""
        if state is None:
            msg = f"{note}\nGoals:\n{_goals_text(goals)}"
        elif state.error is not None:
            msg = (
                f"{_ERROR}{state.error}\nThe proof state is unchanged. Goals:\n{_goals_text(goals)}"
            )
        elif not state.goals:
            msg = "No goals remain. The proof is complete."
        else:
            msg = f"Goals:\n{_goals_text(state.goals)}"
        if self.chat:
            return msg
        return f"```\n{msg}\n\nNext tactics:\n```lean4\n"

    def sft_episode(self, rollout: Rollout) -> SFTEpisode | None:
        """A solved episode for SFT: the opening prompt (theorem and goals), every turn and
        Lean's answer to it. The turns whose tactics Lean applied are targets; a turn that
        applied nothing (an error, no tactics, cut off) is context only, so the model learns to
        go on from Lean's error message rather than to make the error."""
        if not rollout.turns:
            return None
        stop = "" if self.chat else "```"
        accepted = rollout.verdict is not None and rollout.verdict.accepted
        return SFTEpisode(
            prompt=rollout.prompt,
            turns=tuple(
                SFTTurn(
                    completion=t.completion,
                    feedback=t.feedback,
                    train=accepted and not self._applied_nothing(t.feedback),
                    end=None if t.finish_reason == "length" else stop,
                )
                for t in rollout.turns
            ),
        )

    def _applied_nothing(self, feedback: str) -> bool:
        """Whether :meth:`feedback` said the turn changed nothing (an error, no tactics)."""
        msg = feedback if self.chat else feedback.removeprefix("```\n")
        return msg.startswith((_ERROR, _CUT_OFF, _NO_TACTICS))

    async def run(
        self,
        tasks: Sequence[Task],
        policy: Policy,
        runtime: Runtime,
        sampling: SamplingConfig,
        taskset: Taskset,
    ) -> list[list[Rollout]]:
        episodes = [_Episode(t, i, "", "") for t in tasks for i in range(sampling.n)]
        wave = self.wave_size
        # A wave holds all its sessions until it ends: never more than the runtime can hold at
        # once, or the last ones would wait forever for a process (``local``: workers + spares
        # less the processes kept for checks).
        cap = getattr(runtime, "max_tactic_sessions", None)
        if isinstance(cap, int) and cap > 0:
            wave = min(wave, cap)
        for start in range(0, len(episodes), wave):
            await self._wave(
                episodes[start : start + wave],
                policy,
                runtime,
                sampling,
                taskset.config.policy,
            )
        groups: list[list[Rollout]] = []
        for k, _task in enumerate(tasks):
            group = []
            for ep in episodes[k * sampling.n : (k + 1) * sampling.n]:
                solved = ep.verdict is None
                group.append(
                    Rollout(
                        task_id=ep.task.id,
                        sample=ep.sample,
                        prompt=ep.prompt,
                        prompt_ids=ep.prompt_ids,
                        turns=ep.turns,
                        proof=join_tactics(ep.steps) if solved else None,
                        verdict=ep.verdict,
                        timings={"generate": ep.gen_s, "tactics": ep.apply_s},
                        meta={"turns": len(ep.turns), "tokens": ep.tokens, "context": ep.mode},
                    )
                )
            groups.append(group)
        await check_and_reward(tasks, groups, runtime, taskset)
        return groups

    async def _wave(
        self,
        eps: list[_Episode],
        policy: Policy,
        runtime: Runtime,
        sampling: SamplingConfig,
        rules: VerificationPolicy,
    ) -> None:
        cfg = self.config
        turn_sampling = sampling.model_copy(update={"n": 1})
        if not sampling.stop and not self.chat:
            turn_sampling.stop = ["```"]
        mode = "ids" if ids_capable(policy, self.chat) else "text"
        async with AsyncExitStack() as stack:
            for ep in eps:
                ep.mode = mode
                try:
                    ep.session = await stack.enter_async_context(
                        _open_session(runtime, ep.task.header, rules)
                    )
                except Exception as e:  # noqa: BLE001 - one lost session costs one attempt
                    self._end(ep, Reason.INFRA, f"could not open a tactic session: {e}")
            starts = await asyncio.gather(*(self._start(ep) for ep in eps if not ep.done))
            del starts
            for turn in range(cfg.max_turns):
                live = [ep for ep in eps if not ep.done]
                if not live:
                    break
                if sampling.seed is not None:
                    turn_sampling.seed = sampling.seed + turn
                ids = turn > 0 and all(ep.mode == "ids" for ep in live)
                if stream_replays_generate(
                    policy, turn_sampling, native=True, ids=ids
                ) and await self._stream_turn(live, policy, turn_sampling, first=turn == 0):
                    continue
                t0 = time.perf_counter()
                outs = await self._generate(live, policy, turn_sampling, first=turn == 0)
                gen_s = (time.perf_counter() - t0) / len(live)
                # Reading the tactics is CPU work on model text: long texts are read off the
                # event loop, for the whole turn at once, before the steps start in order.
                texts = [out[0].text for out in outs]
                tactics = await off_loop(sum(map(len, texts)), _read_tactics, texts, self.chat)
                await asyncio.gather(
                    *(
                        self._step(ep, out[0], policy, gen_s, tac)
                        for ep, out, tac in zip(live, outs, tactics, strict=True)
                    )
                )
            for ep in eps:
                if not ep.done:
                    self._end(
                        ep,
                        Reason.ERROR,
                        f"{len(ep.goals)} goal(s) left after {cfg.max_turns} turns",
                    )

    async def _stream_turn(
        self, live: list[_Episode], policy: Policy, sampling: SamplingConfig, first: bool
    ) -> bool:
        """One turn through :meth:`Policy.stream`: each episode's tactics go to its session as
        soon as its completion arrives, while the others still generate. Used only where the
        stream gives what one batched ``generate`` would (``Policy.stream_replays``), so a
        turn's completions are the same either way. False, with nothing done, when the policy
        turns out unable to take token ids (the caller then generates from text)."""
        use_ids = not first and all(ep.mode == "ids" for ep in live)
        requests = [
            StreamRequest(key=k, sampling=sampling, prompt_ids=tuple(ep.ids), slot=k)
            if use_ids
            else StreamRequest(key=k, sampling=sampling, prompt=ep.context, slot=k)
            for k, ep in enumerate(live)
        ]

        async def arrived(sc: StreamCompletion) -> None:
            ep, c = live[cast(int, sc.key)], sc.completion
            (tactics,) = await off_loop(len(c.text), _read_tactics, [c.text], self.chat)
            await self._step(ep, c, policy, sc.elapsed_s, tactics)

        try:
            await handle_arrivals(policy.stream(requests), arrived)
        except NotImplementedError:
            if not use_ids:
                raise
            return False  # a wrapper that cannot take ids after all: text from here on
        return True

    async def _generate(
        self, live: list[_Episode], policy: Policy, sampling: SamplingConfig, first: bool
    ) -> list[list[Completion]]:
        """One batched generation for the live episodes: from their token ids when they all
        keep them (see ``context.py``), else from their text contexts."""
        if not first and all(ep.mode == "ids" for ep in live):
            try:
                return await policy.generate_from_ids([ep.ids for ep in live], sampling)
            except NotImplementedError:
                pass  # a wrapper that cannot after all: text from here on
        for ep in live:
            if not first:
                ep.mode = "text"
        return await policy.generate([ep.context for ep in live], sampling)

    async def _start(self, ep: _Episode) -> None:
        assert ep.session is not None
        try:
            st = await ep.session.start(ep.task.formal_statement)
        except Exception as e:  # noqa: BLE001 - a crashed session costs this attempt only
            self._end(ep, Reason.INFRA, f"tactic session failed to start: {e}")
            return
        if st.error is not None or st.proof_state is None:
            self._end(ep, Reason.ERROR, f"the statement did not elaborate: {st.error}")
            return
        ep.state, ep.goals = st.proof_state, st.goals
        ep.prompt = ep.context = self.first_prompt(ep.task, st.goals)

    async def _step(
        self, ep: _Episode, c: Completion, policy: Policy, gen_s: float, tactics: str
    ) -> None:
        """One turn of ``ep``: ``tactics`` (read from ``c`` by :func:`extract_tactics`) applied."""
        assert ep.session is not None and ep.state is not None
        ep.gen_s += gen_s
        state: TacticState | None = None
        note = ""
        if not tactics:
            note = _CUT_OFF if c.finish_reason == "length" else _NO_TACTICS
        else:
            t0 = time.perf_counter()
            try:
                state = await ep.session.apply(ep.state, tactics)
            except Exception as e:  # noqa: BLE001 - a crashed session costs this attempt only
                ep.apply_s += time.perf_counter() - t0
                record_turn(ep, c, "", policy, self.chat)
                self._end(ep, Reason.INFRA, f"tactic session failed: {e}")
                return
            ep.apply_s += time.perf_counter() - t0
            if state.error is None and state.proof_state is not None:
                ep.steps.append(tactics)
                ep.state, ep.goals = state.proof_state, state.goals
        text = self.feedback(state, ep.goals, note)
        record_turn(ep, c, text, policy, self.chat)
        if state is not None and state.solved:
            ep.done = True  # verified as a whole afterwards
        elif ep.tokens >= self.config.max_total_tokens:
            self._end(
                ep,
                Reason.TRUNCATED,
                f"token budget ({self.config.max_total_tokens}) ran out with "
                f"{len(ep.goals)} goal(s) left",
            )

    def _end(self, ep: _Episode, reason: Reason, detail: str) -> None:
        ep.done = True
        ep.verdict = Verdict.reject(reason, detail)


def _open_session(
    runtime: Runtime, header: str, rules: VerificationPolicy
) -> AbstractAsyncContextManager[TacticSession]:
    """A tactic session whose tactics are pre-scanned under the taskset's rules."""
    return runtime.tactic_session(header, policy=rules)
