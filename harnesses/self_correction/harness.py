"""The ``self-correction`` harness: a whole proof, then revisions that see Lean's errors.

Goedel-Prover-V2's self-correction mode (Lin et al. 2025): the model writes a whole proof; when
Lean rejects it, Lean's errors (the code around each error marked with ``<error>``, the message,
the unsolved goals the message holds) are fed back and the model writes a revised proof, up to
``max_revisions`` times. An episode ends at the first accepted attempt, after the last revision,
or when its tokens (model and environment) reach ``max_total_tokens``. The rollout's proof and
Verdict are those of its last attempt; every attempt is checked under the reference statement.

- Chat formats: the context is a message list; the feedback is a user message in Goedel-Prover-V2's
  wording ("The proof (Round N) is not correct. ...").
- Completion formats (``deepseek``, ``deepseek-cot``, a completion ``custom`` template): the
  feedback closes the code block, gives the errors in a Lean comment and opens the task's code
  block again, so the model continues with a proof as it was prompted to the first time.

Every round, the live episodes generate together and their attempts are checked in one
``runtime.check`` batch, or, where the policy's stream gives what one batched ``generate`` would
(``Policy.stream_replays``: vLLM, a vLLM server, greedy ``hf``), each attempt is extracted and
checked as soon as its completion arrives, small groups of arrivals sharing a check call, while
the others still generate; the round ends when every live episode has its verdict. After the first turn the context is kept as token ids when the policy
can generate from ids (the tactic loop's ``context.py``), so the sequence a trainer replays,
``Rollout.prompt_ids + Rollout.token_ids_and_mask()[0]``, is exactly what the model saw; the
feedback's tokens carry mask 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

from leanrl.errors import PolicyError
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
from leanrl.rollout import Rollout, Turn
from leanrl.runtime import Runtime
from leanrl.task import Task
from leanrl.taskset import Taskset
from leanrl.verdict import Verdict

from ..tactic_loop.context import extend_context, ids_capable, record_turn
from ..whole_proof.extract import extract_proof
from ..whole_proof.harness import check_and_reward, off_loop
from ..whole_proof.prompts import (
    DEEPSEEK_INSTRUCTION,
    build_prompt,
    default_stop,
    informal_comment,
)
from ..whole_proof.prompts import check_config as check_prompt
from ..whole_proof.prompts import is_completion_style as _completion_style
from ..whole_proof.stream import MAX_WAIT_S, CheckBatcher, handle_arrivals
from .feedback import checked_text, render_errors

__all__ = ["SelfCorrectionHarness"]


class _Checks:
    """What :class:`CheckBatcher` calls: one ``runtime.check`` for a batch of arrived attempts,
    under the reference statements (the probes' rewards are not used)."""

    async def check_rollouts(
        self, items: Sequence[tuple[Task, Rollout]], runtime: Runtime, taskset: Taskset
    ) -> None:
        await check_and_reward([t for t, _ in items], [[r] for _, r in items], runtime, taskset)


# Goedel-Prover-V2's revision request, word for word (its models were trained on it).
_CHAT_FEEDBACK = (
    "The proof (Round {round}) is not correct. Following is the compilation error message, "
    "where we use <error></error> to signal the position of the error.\n\n{errors}\n\nBefore "
    "producing the Lean 4 code to formally prove the given theorem, provide a detailed "
    "analysis of the error message."
)


@dataclass
class _Episode:
    task: Task
    sample: int
    prompt: Prompt
    context: Prompt
    mode: str = "text"  # "ids": the context after turn 1 is kept as token ids
    prompt_ids: list[int] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    tokens: int = 0
    done: bool = False
    proof: str | None = None
    preamble: str = ""
    restated_statement: str = ""
    verdict: Verdict | None = None
    history: list[str] = field(default_factory=list)
    gen_s: float = 0.0
    verify_s: float = 0.0


class SelfCorrectionHarness(Harness):
    """A whole-proof attempt, then up to ``max_revisions`` revisions shown Lean's errors."""

    name = "self-correction"
    description = "a whole proof, then revisions shown Lean's errors (Goedel-Prover-V2 style)"
    option_keys = frozenset()

    def check_config(self) -> None:
        """The prompt format, its template and the few-shot file, checked up front."""
        check_prompt(self.config)

    @property
    def chat(self) -> bool:
        """Chat prompts (messages) unless the prompt format is a completion format."""
        return not _completion_style(self.config)

    def feedback(
        self, ep: _Episode, verdict: Verdict, round_: int, cap: Callable[[str], str] | None = None
    ) -> str:
        """What the model is told after attempt ``round_`` (0-based) was rejected. ``cap``
        shortens the rendered errors (GRPO's failure replay caps them in tokens)."""
        text = checked_text(ep.task, ep.proof or "", ep.preamble, ep.restated_statement)
        errors = render_errors(verdict, text, self.config.feedback_errors, fenced=self.chat)
        if cap is not None:
            errors = cap(errors)
        if self.chat:
            return _CHAT_FEEDBACK.format(round=round_, errors=errors)
        task = ep.task
        note = errors.replace("-/", "- /")  # must not end the comment
        # The same instruction the first prompt used (custom templates: DeepSeek's plain one).
        first = ep.prompt if isinstance(ep.prompt, str) else ""
        instruction = next(
            (ln for ln in first.split("\n") if ln.startswith("Complete the following")),
            DEEPSEEK_INSTRUCTION,
        )
        return (
            f"```\n\n/- The proof (Round {round_}) is not correct. Lean's errors, with "
            f"<error></error> around where each one is:\n\n{note}\n\nA corrected proof "
            f"follows. -/\n\n{instruction}\n\n```lean4\n{task.header}{informal_comment(task)}"
            f"{task.formal_statement.rstrip()}\n"
        )

    def revision_prompt(
        self, task: Task, failed: Rollout, cap: Callable[[str], str] | None = None
    ) -> Prompt:
        """The text context a revision of ``failed`` starts from: its prompt, its completion and
        the feedback on it, exactly what an episode of this harness holds (as text) before its
        first revision. ``failed`` is a rejected one-turn attempt at ``task`` (GRPO's failure
        replay renders stored failures with this)."""
        if failed.verdict is None or failed.verdict.accepted or len(failed.turns) != 1:
            raise ValueError("revision_prompt needs a rejected attempt of exactly one turn")
        ep = _Episode(task=task, sample=failed.sample, prompt=failed.prompt,
                      context=failed.prompt, proof=failed.proof, preamble=failed.preamble,
                      restated_statement=failed.restated_statement)  # fmt: skip
        text = self.feedback(ep, failed.verdict, 0, cap)
        return extend_context(failed.prompt, failed.turns[0].completion, text)

    async def run(
        self,
        tasks: Sequence[Task],
        policy: Policy,
        runtime: Runtime,
        sampling: SamplingConfig,
        taskset: Taskset,
    ) -> list[list[Rollout]]:
        cfg = self.config
        prompts = [build_prompt(t, cfg) for t in tasks]
        mode = "ids" if ids_capable(policy, self.chat) else "text"
        episodes = [
            _Episode(task=t, sample=i, prompt=p, context=p, mode=mode)
            for t, p in zip(tasks, prompts, strict=True)
            for i in range(sampling.n)
        ]
        turn_sampling = sampling
        if not sampling.stop:
            turn_sampling = sampling.model_copy(update={"stop": default_stop(cfg)})
        for round_ in range(cfg.max_revisions + 1):
            live = [ep for ep in episodes if not ep.done]
            if not live:
                break
            seed = None if sampling.seed is None else sampling.seed + round_
            ids = round_ > 0 and all(ep.mode == "ids" for ep in live)
            if stream_replays_generate(
                policy, turn_sampling, native=True, ids=ids
            ) and await self._stream_round(live, policy, turn_sampling, seed, round_, runtime,
                                           taskset):  # fmt: skip
                continue
            t0 = time.perf_counter()
            if round_ == 0:
                got = await policy.generate(
                    prompts, turn_sampling.model_copy(update={"seed": seed})
                )
                outs = [c for group in got for c in group]
            else:
                outs = await self._revise(live, policy, turn_sampling, seed)
            gen_s = (time.perf_counter() - t0) / max(1, len(live))
            for ep in live:
                ep.gen_s += gen_s
            # Extraction is CPU work on model text: long texts are read off the event loop.
            await off_loop(sum(len(c.text) for c in outs), self._attempt_all, live, outs)
            await self._check(live, runtime, taskset)
            for ep, c in zip(live, outs, strict=True):
                self._after(ep, c, policy, round_)
        groups: list[list[Rollout]] = []
        for k, _task in enumerate(tasks):
            group = [self._rollout(ep) for ep in episodes[k * sampling.n : (k + 1) * sampling.n]]
            for r, reward in zip(group, taskset.group_rewards(_task, group), strict=True):
                r.reward = reward
            groups.append(group)
        return groups

    async def _stream_round(
        self,
        live: list[_Episode],
        policy: Policy,
        sampling: SamplingConfig,
        seed: int | None,
        round_: int,
        runtime: Runtime,
        taskset: Taskset,
    ) -> bool:
        """One round through :meth:`Policy.stream`: each attempt is extracted, checked and
        given its feedback as soon as its completion arrives. The requests are those of the
        batched round (round 0: one per task with ``sampling.n`` samples, slot = the task's
        place; later: one per live episode, slot = its place), so the completions are the
        same. False, with nothing done, when the policy turns out unable to take token ids."""
        if round_ == 0:
            n = sampling.n
            first = sampling.model_copy(update={"seed": seed})
            requests = [
                StreamRequest(key=k, sampling=first, prompt=live[k * n].prompt, slot=k)
                for k in range(len(live) // n)
            ]
        else:
            n = 1
            one = sampling.model_copy(update={"n": 1, "seed": seed})
            use_ids = all(ep.mode == "ids" for ep in live)
            requests = [
                StreamRequest(key=k, sampling=one, prompt_ids=tuple(ep.ids), slot=k)
                if use_ids
                else StreamRequest(key=k, sampling=one, prompt=ep.context, slot=k)
                for k, ep in enumerate(live)
            ]
            if not use_ids:
                for ep in live:
                    ep.mode = "text"
        batcher = CheckBatcher(_Checks(), runtime, taskset, runtime.check_piece() or 64, MAX_WAIT_S)

        async def handle(ep: _Episode, c: Completion, took: float) -> None:
            ep.gen_s += took
            await off_loop(len(c.text), self._attempt, ep, c)
            if ep.verdict is None and ep.proof is not None:
                probe = Rollout(task_id=ep.task.id, sample=ep.sample, prompt="", proof=ep.proof,
                                preamble=ep.preamble, restated_statement=ep.restated_statement)  # fmt: skip
                t0 = time.perf_counter()
                await batcher.check(ep.task, probe)
                ep.verify_s += time.perf_counter() - t0
                ep.verdict = probe.verdict
            self._after(ep, c, policy, round_)

        seen: set[int] = set()

        async def arrived(sc: StreamCompletion) -> None:
            at = cast(int, sc.key) * n + sc.sample
            if at in seen or not 0 <= at < len(live):
                raise PolicyError(
                    f"policy {policy.name!r} streamed {sc.key!r}/{sc.sample} twice or for no "
                    "request"
                )
            seen.add(at)
            await handle(live[at], sc.completion, sc.elapsed_s)

        try:
            await handle_arrivals(policy.stream(requests), arrived, batcher.flush)
        except NotImplementedError:
            if round_ == 0 or live[0].mode != "ids":
                raise
            return False  # a wrapper that cannot take ids after all: text from here on
        finally:
            batcher.close()
        if len(seen) != len(live):
            raise PolicyError(
                f"policy {policy.name!r} ended its stream with {len(live) - len(seen)} "
                "completion(s) missing (does its stream() yield sampling.n per request?)"
            )
        return True

    async def _revise(
        self, live: list[_Episode], policy: Policy, sampling: SamplingConfig, seed: int | None
    ) -> list[Completion]:
        """One batched generation for the live episodes' revisions: from their token ids when
        they all keep them, else from their text contexts."""
        one = sampling.model_copy(update={"n": 1, "seed": seed})
        if all(ep.mode == "ids" for ep in live):
            try:
                got = await policy.generate_from_ids([ep.ids for ep in live], one)
                return [g[0] for g in got]
            except NotImplementedError:
                pass  # a wrapper that cannot after all: text from here on
        for ep in live:
            ep.mode = "text"
        got = await policy.generate([ep.context for ep in live], one)
        return [g[0] for g in got]

    def _attempt_all(self, live: list[_Episode], outs: list[Completion]) -> None:
        for ep, c in zip(live, outs, strict=True):
            self._attempt(ep, c)

    def _attempt(self, ep: _Episode, c: Completion) -> None:
        """Pull the proof out of this turn's completion (a failed extraction is a verdict)."""
        ex = extract_proof(
            c.text, ep.task, finish_reason=c.finish_reason, completion_style=not self.chat
        )
        ep.proof, ep.preamble, ep.restated_statement = ex.proof, ex.preamble, ex.restated_statement
        ep.verdict = None if ex.reason is None else Verdict.reject(ex.reason, ex.detail)

    async def _check(self, live: list[_Episode], runtime: Runtime, taskset: Taskset) -> None:
        """Check this round's extracted proofs in one batch, under the reference statements."""
        pending = [ep for ep in live if ep.verdict is None and ep.proof is not None]
        if not pending:
            return
        probes = [
            [Rollout(task_id=ep.task.id, sample=ep.sample, prompt="", proof=ep.proof,
                     preamble=ep.preamble, restated_statement=ep.restated_statement)]
            for ep in pending
        ]  # fmt: skip
        t0 = time.perf_counter()
        await check_and_reward([ep.task for ep in pending], probes, runtime, taskset)
        share = (time.perf_counter() - t0) / len(pending)
        for ep, [probe] in zip(pending, probes, strict=True):
            ep.verdict = probe.verdict
            ep.verify_s += share

    def _after(self, ep: _Episode, c: Completion, policy: Policy, round_: int) -> None:
        """Record the turn; end the episode or give it Lean's errors for the next revision."""
        assert ep.verdict is not None
        ep.history.append(ep.verdict.reason.value)
        last = round_ >= self.config.max_revisions
        if ep.verdict.accepted or last:
            record_turn(ep, c, "", policy, self.chat)
            ep.done = True
            return
        text = self.feedback(ep, ep.verdict, round_)
        record_turn(ep, c, text, policy, self.chat)
        if ep.tokens >= self.config.max_total_tokens:
            ep.done = True  # no room for another attempt: the last verdict stands

    def sft_episode(self, rollout: Rollout) -> SFTEpisode | None:
        """A verified revision chain for SFT: the first prompt, every attempt with Lean's errors
        on it, and the accepted revision. Only the accepted attempt is a target; the rejected
        ones are context (Goedel-Prover-V2 trains the revision given the failed proof and the
        compiler's feedback: training on the failed proofs would teach them). None for a
        one-attempt episode: its first turn is the whole-proof layout (:meth:`sft_example`)."""
        if len(rollout.turns) < 2:
            return None
        stop = "" if self.chat else default_stop(self.config)[0]
        accepted = rollout.verdict is not None and rollout.verdict.accepted
        last = len(rollout.turns) - 1
        return SFTEpisode(
            prompt=rollout.prompt,
            turns=tuple(
                SFTTurn(
                    completion=t.completion,
                    feedback=t.feedback,
                    train=accepted and k == last,
                    end=None if t.finish_reason == "length" else stop,
                )
                for k, t in enumerate(rollout.turns)
            ),
        )

    def _rollout(self, ep: _Episode) -> Rollout:
        return Rollout(
            task_id=ep.task.id,
            sample=ep.sample,
            prompt=ep.prompt,
            prompt_ids=ep.prompt_ids,
            turns=ep.turns,
            proof=ep.proof,
            preamble=ep.preamble,
            restated_statement=ep.restated_statement,
            verdict=ep.verdict,
            timings={"generate": ep.gen_s, "verify": ep.verify_s},
            meta={
                "attempts": len(ep.history),
                "revisions": max(0, len(ep.history) - 1),
                "attempt_reasons": list(ep.history),
                "tokens": ep.tokens,
                "context": ep.mode,
            },
        )
