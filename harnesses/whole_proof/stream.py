"""Streamed whole-proof rollouts: every prompt goes to the policy at once (:meth:`Policy.stream`);
each completion is extracted and sent to Lean as it arrives, small groups of arrivals batched
for the runtime; a group's rewards are computed once all its attempts have verdicts (and the
group is reported: :func:`leanrl.harness.report_group`), and a chunk is handed to ``record``
once all its groups are done. The eval runner streams many chunks (``eval.stream``), the
harness's own ``run`` one (the trainers' rollouts).

What a chunk records does not depend on the order completions arrive in: every attempt is
filed under its (chunk, task, sample), a task's rewards are computed once its group is
complete, and the chunk's rows are handed over in task and sample order.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, cast

from leanrl.errors import PolicyError
from leanrl.harness import Harness, report_group
from leanrl.policy import Policy, SamplingConfig, StreamCompletion, StreamRequest
from leanrl.rollout import Rollout
from leanrl.runtime import Runtime
from leanrl.task import Task
from leanrl.taskset import Taskset

__all__ = ["MAX_WAIT_S", "CheckBatcher", "can_stream", "handle_arrivals", "stream_chunks"]

MAX_WAIT_S = 0.05
"""Longest an arrived attempt waits for others to share its ``runtime.check`` call."""

_INLINE_CHARS = 16 * 1024
"""A completion up to this long is extracted on the event loop (the whole-proof harness's
``INLINE_CHARS``), a longer one in a worker thread."""

_WHOLE_BATCH = 64
"""Attempts per check call for a runtime that takes its batches whole (no ``check_piece``)."""


def can_stream(harness: Harness) -> bool:
    """Whether ``harness`` offers what a streamed rollout needs (``whole-proof`` does)."""
    probe = getattr(harness, "can_stream", None)
    return bool(callable(probe) and probe())


async def handle_arrivals(
    arrivals: AsyncIterator[StreamCompletion],
    handle: Callable[[StreamCompletion], Awaitable[None]],
    ended: Callable[[], None] | None = None,
) -> int:
    """Start ``handle(sc)`` for each completion of ``arrivals`` as it arrives, then wait for
    all of them (``ended()`` is called once the stream has ended, before that wait). Returns how
    many arrived. The stream is closed at once when anything fails, so its policy stops its
    queued work, and the handlers still running are cancelled. A ``NotImplementedError`` from
    the stream before anything arrived passes through as it is (a wrapper that cannot take
    token ids: the caller falls back to text); after that it is a :class:`PolicyError`."""
    jobs: list[asyncio.Future[None]] = []
    try:
        try:
            async for sc in arrivals:
                jobs.append(asyncio.ensure_future(handle(sc)))
        except NotImplementedError as e:
            if jobs:
                raise PolicyError(f"a policy's stream failed part-way: {e}") from e
            raise
        finally:
            close = getattr(arrivals, "aclose", None)
            if close is not None:
                await close()
        if ended is not None:
            ended()
        await asyncio.gather(*jobs)
    except BaseException:
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
        raise
    return len(jobs)


class CheckBatcher:
    """Gathers arrived attempts into ``runtime.check`` calls of up to ``size`` attempts, each
    sent at most ``wait`` seconds after its first attempt arrived; several calls may be in
    flight (the runtime bounds its own workers). ``harness.check_rollouts(items, runtime,
    taskset)`` checks one call's attempts (the whole-proof harness's; the self-correction
    harness streams its rounds through it too).

    ``capacity`` (the runtime's :meth:`~leanrl.runtime.Runtime.check_capacity`, with ``size``
    1): at most that many attempts in flight; the others wait here and go in the order of
    their ``order`` keys (task order), not of arrival. The runtime is as busy either way, but a
    task's attempts are checked together, so groups finish one after another rather than all
    near the end of the step. A cancelled waiter or holder gives its place back at once
    (cancelling comes with a failed stream, whose calls :meth:`close` cancels)."""

    def __init__(
        self,
        harness: Any,
        runtime: Runtime,
        taskset: Taskset,
        size: int,
        wait: float,
        capacity: int = 0,
    ) -> None:
        self.harness, self.runtime, self.taskset = harness, runtime, taskset
        self.size, self.wait = max(1, size), wait
        self.items: list[tuple[Task, Rollout, asyncio.Future[None]]] = []
        self.timer: asyncio.TimerHandle | None = None
        self.jobs: set[asyncio.Future[None]] = set()
        self.capacity = capacity if self.size == 1 else 0
        self.busy = 0
        self.waiting: list[tuple[tuple[int, ...], int, asyncio.Future[None]]] = []  # a heap
        self._arrived = itertools.count()

    async def check(self, task: Task, r: Rollout, order: tuple[int, ...] = ()) -> None:
        if not self.capacity:
            await self._check(task, r)
            return
        await self._turn(order)
        try:
            await self._check(task, r)
        finally:
            self.busy -= 1
            self._pump()

    async def _turn(self, order: tuple[int, ...]) -> None:
        """Wait until this attempt may go: a free place, and no waiting attempt before it."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self.waiting, (order, next(self._arrived), fut))  # ties: arrival order
        self._pump()
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # given a place, then cancelled: give it back
                self.busy -= 1
                self._pump()
            raise

    def _pump(self) -> None:
        while self.waiting and self.busy < self.capacity:
            *_, fut = heapq.heappop(self.waiting)
            if fut.done():  # its waiter was cancelled
                continue
            self.busy += 1
            fut.set_result(None)

    async def _check(self, task: Task, r: Rollout) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.items.append((task, r, fut))
        if len(self.items) >= self.size:
            self.flush()
        elif self.timer is None:
            self.timer = asyncio.get_running_loop().call_later(self.wait, self.flush)
        await fut

    def flush(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        items, self.items = self.items, []
        if items:
            job = asyncio.ensure_future(self._run(items))
            self.jobs.add(job)
            job.add_done_callback(self.jobs.discard)

    async def _run(self, items: list[tuple[Task, Rollout, asyncio.Future[None]]]) -> None:
        try:
            await self.harness.check_rollouts(
                [(t, r) for t, r, _ in items], self.runtime, self.taskset
            )
        except Exception as e:  # noqa: BLE001 - raised where each attempt is awaited
            for _, _, f in items:
                if not f.done():
                    f.set_exception(e)
            return
        for _, _, f in items:
            if not f.done():
                f.set_result(None)

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        for j in list(self.jobs):
            j.cancel()


async def stream_chunks(
    *,
    harness: Any,
    policy: Policy,
    runtime: Runtime,
    taskset: Taskset,
    chunks: Sequence[Sequence[Task]],
    pending: Sequence[int],
    sampling_of: Callable[[int], SamplingConfig],
    checking: bool,
    record: Callable[[int, list[list[Rollout]]], int],
    check_size: int = 0,
    capacity: int = 0,
) -> int:
    """Run the ``pending`` chunks as one stream; ``record(i, groups)`` writes chunk ``i`` once
    all its attempts are done (verdicts and rewards in). Returns what ``record`` wrote.
    ``check_size``: attempts per ``runtime.check`` call (the runtime's ``check_piece``; 0 for
    one that takes batches whole). ``capacity``: the runtime's ``check_capacity`` (attempts
    beyond it wait and go in task order: :class:`CheckBatcher`)."""
    n_of: dict[int, int] = {}
    requests: list[StreamRequest] = []
    prompts: dict[tuple[int, int], Any] = {}
    for i in pending:
        sampling = harness.sampling(sampling_of(i))
        n_of[i] = sampling.n
        for pos, task in enumerate(chunks[i]):
            prompt = harness.prompt(task)
            prompts[(i, pos)] = prompt
            # slot: the task's place in its chunk, so its samples are seeded as in any other run
            requests.append(StreamRequest(key=(i, pos), sampling=sampling, prompt=prompt, slot=pos))
    slots: dict[int, list[list[Rollout | None]]] = {
        i: [[None] * n_of[i] for _ in chunks[i]] for i in pending
    }
    task_left = {(i, pos): n_of[i] for i in pending for pos in range(len(chunks[i]))}
    chunk_left = {i: len(chunks[i]) * n_of[i] for i in pending}
    size = check_size if check_size > 0 else _WHOLE_BATCH
    batcher = CheckBatcher(harness, runtime, taskset, size, MAX_WAIT_S, capacity)
    written = 0

    def done(i: int, pos: int, sample: int, r: Rollout) -> None:
        nonlocal written
        if slots[i][pos][sample] is not None:
            raise PolicyError(
                f"policy {policy.name!r} streamed sample {sample} of {r.task_id!r} twice"
            )
        slots[i][pos][sample] = r
        task_left[(i, pos)] -= 1
        if task_left[(i, pos)] == 0:
            task = chunks[i][pos]
            group = [x for x in slots[i][pos] if x is not None]
            for x, reward in zip(group, taskset.group_rewards(task, group), strict=True):
                x.reward = reward
            report_group(task, group)  # final now: a trainer may start on it (stream_training)
        chunk_left[i] -= 1
        if chunk_left[i] == 0:
            groups = [[x for x in g if x is not None] for g in slots.pop(i)]
            written += record(i, groups)

    async def handle(sc: StreamCompletion) -> None:
        i, pos = cast("tuple[int, int]", sc.key)
        task = chunks[i][pos]
        prompt, c, took = prompts[(i, pos)], sc.completion, sc.elapsed_s
        if len(c.text) <= _INLINE_CHARS:
            r: Rollout = harness.stream_rollout(task, sc.sample, prompt, c, took)
        else:  # a long (or hostile) text is read off the loop, as the harness does it
            r = await asyncio.to_thread(harness.stream_rollout, task, sc.sample, prompt, c, took)
        if checking and r.verdict is None and r.proof is not None:
            await batcher.check(task, r, (i, pos, sc.sample))  # task order, where it matters
        done(i, pos, sc.sample, r)

    handles: set[asyncio.Future[None]] = set()
    failed: list[asyncio.Future[None]] = []

    def finished(h: asyncio.Future[None]) -> None:
        handles.discard(h)
        if not h.cancelled() and h.exception() is not None:
            failed.append(h)

    arrivals = policy.stream(requests)
    try:
        async for sc in arrivals:
            if not isinstance(sc.key, tuple) or sc.key not in prompts:
                raise PolicyError(f"policy {policy.name!r} streamed an unknown request {sc.key!r}")
            h = asyncio.ensure_future(handle(sc))
            handles.add(h)
            h.add_done_callback(finished)
            if failed:  # fail fast: a failed check or write stops the stream
                failed[0].result()
        batcher.flush()
        await asyncio.gather(*handles)
        if failed:
            failed[0].result()
    finally:
        batcher.close()
        for left_over in list(handles):
            left_over.cancel()
        close = getattr(arrivals, "aclose", None)
        if close is not None:  # a failure part-way stops the policy's queued work (and frees
            await close()  # whatever lock its stream holds) now, not when it is collected
    missing = {i: left for i, left in chunk_left.items() if left}
    if missing:
        i, left = next(iter(missing.items()))
        raise PolicyError(
            f"policy {policy.name!r} ended its stream with {left} completion(s) of chunk {i} "
            "missing (does its stream() yield sampling.n completions per request?)"
        )
    return written
