"""Whole-proof rollouts through ``Policy.stream`` (the harness's own ``run``, used by the
trainers): each completion checked on arrival, groups equal to the batched path's, and streams
used only where they stand for ``generate``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from leanrl import EnvironmentConfig, RuntimeConfig, SamplingConfig, TasksetConfig, load_environment
from leanrl.environment import Environment
from leanrl.policy import (
    Completion,
    Policy,
    Prompt,
    StreamCompletion,
    StreamRequest,
    stream_replays_generate,
)
from tests._scripted_runtime import ScriptedPolicy

RT = "tests._scripted_runtime:ScriptedRuntime"
TEXTS = ["\n  omega\n", "\n  simp\n", "\n  linarith\n"]


def env_of(data: Path) -> Environment:
    return load_environment(
        EnvironmentConfig(
            id="minif2f",
            taskset=TasksetConfig(path=data, limit=3),
            runtime=RuntimeConfig(name=RT),
        )
    )


class HeldBack(ScriptedPolicy):
    """A backend with a stream of its own: every completion but the last is yielded at once;
    the last waits until the runtime has checked something (a slow sequence still decoding)."""

    def __init__(self, texts: Sequence[str], env: Environment | None = None) -> None:
        super().__init__(texts)
        self.env, self.streams = env, 0

    async def generate(
        self, prompts: Sequence[Prompt], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        return await super().generate(prompts, sampling)  # its own generate: a real backend

    async def stream(self, requests: Sequence[StreamRequest]) -> AsyncIterator[StreamCompletion]:
        self.streams += 1
        got = await self.generate([r.prompt or "" for r in requests], requests[0].sampling)
        items = [
            StreamCompletion(r.key, s, c, 0.01)
            for r, comps in zip(requests, got, strict=True)
            for s, c in enumerate(comps)
        ]
        for sc in items[:-1]:
            yield sc
        if self.env is not None:
            rt: Any = self.env.runtime
            while not rt.attempts:  # checked before the last completion exists
                await asyncio.sleep(0.01)
        yield items[-1]


def summary(groups: list[list[Any]]) -> list[Any]:
    return [
        [(r.task_id, r.sample, r.proof, r.reward, r.verdict and r.verdict.reason) for r in g]
        for g in groups
    ]


async def test_streamed_rollouts_are_checked_on_arrival_and_equal_batched_ones(
    bench_data: Path,
) -> None:
    sampling = SamplingConfig(n=3, seed=5, temperature=0.0)
    async with env_of(bench_data) as env:
        tasks = env.tasks()
        batched = await env.rollout(tasks, ScriptedPolicy(TEXTS), sampling)
    async with env_of(bench_data) as env:
        policy = HeldBack(TEXTS, env)
        streamed = await asyncio.wait_for(env.rollout(env.tasks(), policy, sampling), 30)
        assert policy.streams == 1
    assert summary(streamed) == summary(batched)
    assert any(r.reward == 1.0 for g in streamed for r in g)  # omega passes the scripted check
    assert all(r.token_ids_and_mask()[0] for g in streamed for r in g)  # trainable rollouts


async def test_a_wrapper_that_changes_generate_is_not_skipped(bench_data: Path) -> None:
    class Recording(HeldBack):
        seen = 0

        async def generate(
            self, prompts: Sequence[Prompt], sampling: SamplingConfig
        ) -> list[list[Completion]]:
            type(self).seen += len(prompts)
            return await super().generate(prompts, sampling)

    async with env_of(bench_data) as env:
        policy = Recording(TEXTS)
        await env.rollout(env.tasks(), policy, SamplingConfig(n=2, temperature=0.0))
    assert policy.streams == 0 and Recording.seen == 3  # generate ran, the stream did not


def test_when_a_stream_stands_for_generate() -> None:
    greedy, sampled = SamplingConfig(temperature=0.0), SamplingConfig(temperature=1.0, seed=1)

    class NoReplay(HeldBack):
        def stream_replays(self, sampling: SamplingConfig) -> bool:
            return sampling.temperature == 0

    class Wrapper(HeldBack):
        async def generate_from_ids(self, prompt_ids: Any, sampling: SamplingConfig) -> Any:
            raise NotImplementedError

    base = ScriptedPolicy(TEXTS)
    assert stream_replays_generate(base, greedy)  # the base stream is generate in pieces
    assert not stream_replays_generate(base, greedy, native=True)  # ... and no gain in one call
    assert stream_replays_generate(HeldBack(TEXTS), sampled, native=True)
    assert stream_replays_generate(NoReplay(TEXTS), greedy, native=True)
    assert not stream_replays_generate(NoReplay(TEXTS), sampled)
    assert not stream_replays_generate(Wrapper(TEXTS), greedy, ids=True)  # changed below it
    assert stream_replays_generate(Wrapper(TEXTS), greedy)  # text prompts: generate unchanged
    assert isinstance(base, Policy)


async def test_the_grpo_generation_clock_streams_what_its_policy_streams(bench_data: Path) -> None:
    from leanrl.train.grpo.clock import clock_for

    assert not clock_for(ScriptedPolicy(TEXTS)).stream_replays(SamplingConfig(temperature=1.0))
    async with env_of(bench_data) as env:
        inner = HeldBack(TEXTS, env)
        clock = clock_for(inner)
        assert clock.stream_replays(SamplingConfig(temperature=1.0, seed=2))
        groups = await asyncio.wait_for(
            env.rollout(env.tasks(), clock, SamplingConfig(n=2, temperature=1.0, seed=2)), 30
        )
    assert inner.streams == 1 and clock.take() > 0  # streamed, and the busy time was counted
    assert [len(g) for g in groups] == [2, 2, 2]


class IdsPolicy(ScriptedPolicy):
    """Takes token-id prompts (as the hf and vllm policies do)."""

    tokenizer = None
    seen: list[list[int]]

    async def generate_from_ids(
        self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        self.seen = [list(x) for x in prompt_ids]
        return [[Completion(text=TEXTS[0]) for _ in range(sampling.n)] for _ in prompt_ids]


async def test_the_grpo_generation_clock_takes_ids_exactly_when_its_policy_does() -> None:
    """Multi-turn harnesses grow ids contexts only for a policy that takes ids: the clock must
    not hide that (it did: under GRPO they fell back to re-tokenised text contexts)."""
    from harnesses.tactic_loop.context import ids_capable
    from leanrl.train.grpo.clock import clock_for

    ids = IdsPolicy(TEXTS)
    clock = clock_for(ids)
    assert ids_capable(clock, chat=False)
    got = await clock.generate_from_ids([[5, 6, 7]], SamplingConfig(n=2))
    assert ids.seen == [[5, 6, 7]] and [c.text for c in got[0]] == [TEXTS[0]] * 2
    assert clock.take() > 0  # counted as generation time
    assert not ids_capable(clock_for(ScriptedPolicy(TEXTS)), chat=False)


async def test_each_group_is_reported_once_final_before_the_rollout_ends(bench_data: Path) -> None:
    """The streamed whole-proof rollout reports every group (``report_group``) as soon as its
    rewards are set, with exactly the rollouts and rewards it then returns; with the last
    completion held back until Lean has checked something, the groups that do not wait for it
    are reported before it even exists (what lets GRPO's stream_training start on them)."""
    from leanrl.harness import listen_for_groups

    seen: list[tuple[str, list[Any], list[float], bool]] = []
    sampling = SamplingConfig(n=3, seed=5, temperature=0.0)
    policy_state: dict[str, bool] = {"last": False}  # has the last completion been sent?
    async with env_of(bench_data) as env:
        policy = HeldBack(TEXTS, env)
        inner_stream = policy.stream

        async def stream(requests: Sequence[StreamRequest]) -> AsyncIterator[StreamCompletion]:
            items = inner_stream(requests)
            n = len(requests) * sampling.n
            k = 0
            async for sc in items:
                k += 1
                if k == n:  # the last completion waits for a report (else: the timeout below)
                    while not seen:
                        await asyncio.sleep(0.01)
                    policy_state["last"] = True
                yield sc

        policy.stream = stream  # type: ignore[method-assign]

        def listener(task: Any, group: Sequence[Any]) -> None:
            seen.append((task.id, list(group), [r.reward for r in group], policy_state["last"]))

        with listen_for_groups(listener):
            groups = await asyncio.wait_for(env.rollout(env.tasks(), policy, sampling), 30)
    assert sorted(t for t, *_ in seen) == sorted(g[0].task_id for g in groups)  # once each
    final = {g[0].task_id: g for g in groups}
    for task_id, group, rewards, _ in seen:
        assert [id(r) for r in group] == [id(r) for r in final[task_id]]
        assert rewards == [r.reward for r in final[task_id]]
    assert any(not after_last for *_, after_last in seen)  # reported before the last arrived


async def test_attempts_beyond_the_runtimes_capacity_go_in_task_order() -> None:
    """CheckBatcher with a capacity: never more attempts in flight than that; the waiting ones
    go by their order key (task, sample), not by arrival; a cancelled waiter or holder gives
    its place back."""
    from leanrl import Rollout, Task
    from leanrl.harnesses.whole_proof.stream import CheckBatcher

    started: list[str] = []
    live = [0, 0]  # in flight now, most ever
    gate = asyncio.Event()

    class Slow:
        async def check_rollouts(self, items: Any, runtime: Any, taskset: Any) -> None:
            live[0] += 1
            live[1] = max(live)
            started.extend(r.task_id for _, r in items)
            try:
                await gate.wait()
            finally:
                live[0] -= 1

    batcher = CheckBatcher(Slow(), Any, Any, 1, 0.0, capacity=2)  # type: ignore[arg-type]
    task = Task(id="t", name="t", header="", formal_statement="theorem t : True := by")

    def go(name: str, order: tuple[int, ...]) -> asyncio.Future[None]:
        return asyncio.ensure_future(
            batcher.check(task, Rollout(task_id=name, sample=0, prompt="p"), order)
        )

    jobs = [go("late-a", (3, 0)), go("late-b", (3, 1))]  # these take both places
    await asyncio.sleep(0.01)
    jobs += [go("t2", (2, 0)), go("t0", (0, 1)), go("t1", (1, 0)), go("t0-first", (0, 0))]
    jobs.append(go("cancelled", (0, 0)))
    await asyncio.sleep(0.01)
    jobs[-1].cancel()  # waiting: it must not hold a place
    await asyncio.sleep(0.01)
    assert live[1] == 2 and started == ["late-a", "late-b"]
    # A holder cancelled (the stream failed): its place goes to the next by order at once (its
    # call, if still running, is the batcher's to cancel on close).
    jobs[0].cancel()
    await asyncio.sleep(0.01)
    assert started[2:] == ["t0-first"]
    gate.set()
    await asyncio.gather(*jobs, return_exceptions=True)
    assert started == ["late-a", "late-b", "t0-first", "t0", "t1", "t2"]
    assert batcher.busy == 0 and not batcher.waiting
    batcher.close()
