"""The ``whole-proof`` harness: one turn, the model writes the whole proof."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from leanrl.errors import RuntimeUnavailable
from leanrl.harness import Harness
from leanrl.policy import Completion, Policy, Prompt, SamplingConfig, stream_replays_generate
from leanrl.rollout import Rollout, Turn
from leanrl.runtime import Runtime
from leanrl.task import Task
from leanrl.taskset import Taskset
from leanrl.verdict import Attempt, Verdict

from .extract import Extracted, extract_proof
from .prompts import build_prompt, default_stop, is_completion_style
from .prompts import check_config as check_prompt
from .stream import stream_chunks

__all__ = ["INLINE_CHARS", "WholeProofHarness", "check_and_reward", "off_loop", "rollout_of"]


class WholeProofHarness(Harness):
    """One turn: prompt, sample, extract the proof, check it under the reference statement."""

    name = "whole-proof"
    description = "one turn: the model writes the whole proof (completion or chat prompts)"
    option_keys = frozenset()

    def check_config(self) -> None:
        """The prompt format, its template and the few-shot file, checked up front."""
        check_prompt(self.config)

    def prompt(self, task: Task) -> Prompt:
        """The prompt for ``task`` in the configured format."""
        return build_prompt(task, self.config)

    def sampling(self, sampling: SamplingConfig) -> SamplingConfig:
        """``sampling`` plus the stop strings the prompt format implies (when none are set)."""
        if sampling.stop:
            return sampling
        return sampling.model_copy(update={"stop": default_stop(self.config)})

    def extract(self, task: Task, completion: Completion) -> Extracted:
        """The proof in one completion, or why there is none."""
        return extract_proof(
            completion.text,
            task,
            finish_reason=completion.finish_reason,
            completion_style=is_completion_style(self.config),
        )

    async def run(
        self,
        tasks: Sequence[Task],
        policy: Policy,
        runtime: Runtime,
        sampling: SamplingConfig,
        taskset: Taskset,
    ) -> list[list[Rollout]]:
        if self.can_stream() and stream_replays_generate(
            policy, self.sampling(sampling), native=True
        ):
            return await self._run_streamed(tasks, policy, runtime, sampling, taskset)
        groups = await self.generate(tasks, policy, sampling)
        await check_and_reward(tasks, groups, runtime, taskset)
        return groups

    async def _run_streamed(
        self,
        tasks: Sequence[Task],
        policy: Policy,
        runtime: Runtime,
        sampling: SamplingConfig,
        taskset: Taskset,
    ) -> list[list[Rollout]]:
        """``run`` through :meth:`Policy.stream`: each completion is extracted and checked as
        it arrives (a group is rewarded once its last attempt has its verdict), while the rest
        still generate. Only where the stream gives what ``generate`` would, so the groups
        are the same as the batched path's."""
        out: list[list[Rollout]] = []

        def record(_chunk: int, groups: list[list[Rollout]]) -> int:
            out.extend(groups)
            return 0

        await stream_chunks(
            harness=self,
            policy=policy,
            runtime=runtime,
            taskset=taskset,
            chunks=[tasks],
            pending=[0],
            sampling_of=lambda _chunk: sampling,
            checking=True,
            record=record,
            check_size=runtime.check_piece(),
            capacity=runtime.check_capacity(),
        )
        return out

    async def generate(
        self, tasks: Sequence[Task], policy: Policy, sampling: SamplingConfig
    ) -> list[list[Rollout]]:
        """Sample and extract the proofs, without checking them (``run`` checks them next)."""
        prompts = [self.prompt(t) for t in tasks]
        t0 = time.perf_counter()
        completions = await policy.generate(prompts, self.sampling(sampling))
        gen_s = time.perf_counter() - t0
        per_sample = gen_s / max(1, sum(len(c) for c in completions))

        def extract_all() -> list[list[Extracted]]:
            return [
                [self.extract(task, c) for c in comps]
                for task, comps in zip(tasks, completions, strict=True)
            ]

        size = sum(len(c.text) for comps in completions for c in comps)
        extracted = await off_loop(size, extract_all)
        timings = {"generate": per_sample, "generate_batch": gen_s}
        return [
            [
                rollout_of(task, i, prompt, c, ex, dict(timings))
                for i, (c, ex) in enumerate(zip(comps, exs, strict=True))
            ]
            for task, prompt, comps, exs in zip(tasks, prompts, completions, extracted, strict=True)
        ]

    def can_stream(self) -> bool:
        """Whether the eval may stream this harness (``eval.stream``): each completion made into
        a Rollout by :meth:`stream_rollout` and checked by :meth:`check_rollouts` as it arrives.
        True for this harness as it is; False for a subclass that changes ``run`` or
        ``generate``, since the stream would skip what it does there."""
        cls = type(self)
        return cls.run is WholeProofHarness.run and cls.generate is WholeProofHarness.generate

    def stream_rollout(
        self, task: Task, sample: int, prompt: Prompt, completion: Completion, elapsed_s: float
    ) -> Rollout:
        """The Rollout of one streamed completion, its proof extracted (a rejecting verdict
        when there is none), not checked yet: what :meth:`generate` makes of it."""
        ex = self.extract(task, completion)
        return rollout_of(task, sample, prompt, completion, ex, {"generate": elapsed_s})

    async def check_rollouts(
        self, items: Sequence[tuple[Task, Rollout]], runtime: Runtime, taskset: Taskset
    ) -> None:
        """Check, in one ``runtime.check`` call, every rollout of ``items`` that has a proof and
        no verdict yet (rewards are left to the caller, once a task's group is complete)."""
        await _check(items, runtime, taskset)


def rollout_of(
    task: Task,
    sample: int,
    prompt: Prompt,
    c: Completion,
    ex: Extracted,
    timings: dict[str, float] | None = None,
    meta: dict[str, Any] | None = None,
) -> Rollout:
    """The one-turn Rollout of completion ``c`` of ``prompt``, its proof as ``ex`` extracted
    it; rejected at once when extraction failed (no proof to check), else no verdict yet."""
    r = Rollout(
        task_id=task.id,
        sample=sample,
        prompt=prompt,
        prompt_ids=list(c.prompt_token_ids),
        turns=[Turn.from_completion(c)],
        proof=ex.proof,
        preamble=ex.preamble,
        restated_statement=ex.restated_statement,
        timings=timings or {},
        meta=meta or {},
    )
    if ex.reason is not None:
        r.verdict = Verdict.reject(ex.reason, ex.detail)
    return r


INLINE_CHARS = 16 * 1024
"""Model text up to this many characters in all is read on the event loop (milliseconds); more
goes to a worker thread, so a batch of long or hostile completions cannot stall everything
else the loop serves (sessions, other chunks, a service's requests)."""

T = TypeVar("T")


async def off_loop(size: int, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, CPU work on ``size`` characters of model text: inline when small, else in
    a worker thread (one hand-off for the whole batch; what it returns, and its order, are the
    same either way)."""
    if size <= INLINE_CHARS:
        return fn(*args)
    return await asyncio.to_thread(fn, *args)


async def check_and_reward(
    tasks: Sequence[Task], groups: list[list[Rollout]], runtime: Runtime, taskset: Taskset
) -> None:
    """Check every rollout that has a proof and no verdict yet (one batch), then reward.

    The proof goes under the task's reference statement (or under the model's own restatement,
    which the trusted checker compares with the reference), judged by the taskset's
    verification policy.
    """
    await _check(
        [(task, r) for task, group in zip(tasks, groups, strict=True) for r in group],
        runtime,
        taskset,
    )
    for task, group in zip(tasks, groups, strict=True):
        for r, reward in zip(group, taskset.group_rewards(task, group), strict=True):
            r.reward = reward


async def _check(items: Sequence[tuple[Task, Rollout]], runtime: Runtime, taskset: Taskset) -> None:
    """Verdicts for the rollouts of ``items`` that have a proof and none yet, in one batch."""
    pending: list[Rollout] = []
    attempts: list[Attempt] = []
    for task, r in items:
        if r.verdict is None and r.proof is not None:
            pending.append(r)
            attempts.append(
                Attempt(
                    name=task.name,
                    header=task.header,
                    formal_statement=task.formal_statement,
                    proof=r.proof,
                    preamble=r.preamble,
                    restated_statement=r.restated_statement,
                    policy=taskset.config.policy,
                    id=f"{task.id}/{r.sample}",
                )
            )
    if attempts:
        t0 = time.perf_counter()
        verdicts = await runtime.check(attempts)
        batch_s = time.perf_counter() - t0
        if len(verdicts) != len(attempts):
            raise RuntimeUnavailable(
                f"runtime {runtime.name!r} returned {len(verdicts)} verdicts for "
                f"{len(attempts)} attempts"
            )
        verdicts = _in_attempt_order(runtime.name, attempts, verdicts)
        for r, v in zip(pending, verdicts, strict=True):
            r.verdict = v
            r.timings["verify"] = v.time_s
            r.timings["verify_batch"] = batch_s


def _in_attempt_order(
    runtime: str, attempts: Sequence[Attempt], verdicts: Sequence[Verdict]
) -> list[Verdict]:
    """The verdicts in the order of the attempts. A verdict echoes its attempt's id; one that
    carries another attempt's id would otherwise be credited to the wrong proof."""
    if all(v.id == a.id for a, v in zip(attempts, verdicts, strict=True)):
        return list(verdicts)
    by_id: dict[str | None, Verdict] = {v.id: v for v in verdicts if v.id is not None}
    if len(by_id) == len(verdicts) and set(by_id) == {a.id for a in attempts}:
        return [by_id[a.id] for a in attempts]
    if all(v.id is None for v in verdicts):
        return list(verdicts)  # a runtime that echoes no ids answers in order
    raise RuntimeUnavailable(
        f"runtime {runtime!r} returned verdicts whose ids do not match the attempts "
        f"(first attempt {attempts[0].id!r}, first verdict {verdicts[0].id!r})"
    )
