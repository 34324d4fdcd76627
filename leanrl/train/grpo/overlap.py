"""Generation and checking overlapped within one synchronous GRPO step.

A step's rollouts are ``env.rollout(tasks, policy, sampling)``: generate every completion, then
check them all in Lean. :func:`chunked_rollout` cuts the tasks into ``chunks`` pieces and runs
them as concurrent rollouts: generation takes turns on the policy (the ``hf`` and ``vllm``
policies serialize their generate calls, first come first served), so while Lean checks chunk
j's attempts, chunk j+1 is already generating. The result is one group per task, in task order,
as before. Each chunk samples with its own seed, derived from the step's, so a step is still a
pure function of (seed, step) and a resumed run repeats it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from leanrl.environment import Environment
from leanrl.policy import Policy, SamplingConfig
from leanrl.rollout import Rollout
from leanrl.task import Task

__all__ = ["chunked_rollout"]


async def chunked_rollout(
    env: Environment,
    tasks: Sequence[Task],
    policy: Policy,
    sampling: SamplingConfig,
    chunks: int,
) -> list[list[Rollout]]:
    """``env.rollout(tasks, ...)``, in ``chunks`` overlapped pieces (see the module docstring)."""
    n = min(chunks, len(tasks))
    if n <= 1:
        return await env.rollout(tasks, policy, sampling)
    size = -(-len(tasks) // n)
    pieces = [list(tasks[i : i + size]) for i in range(0, len(tasks), size)]

    def seeded(j: int) -> SamplingConfig:
        if sampling.seed is None or j == 0:
            return sampling
        return sampling.model_copy(update={"seed": sampling.seed + 104_729 * j})

    # created in chunk order: the policy's lock is FIFO, so chunk j generates before chunk j+1
    jobs = [asyncio.ensure_future(env.rollout(p, policy, seeded(j))) for j, p in enumerate(pieces)]
    try:
        got = await asyncio.gather(*jobs)
    except BaseException:
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
        raise
    return [g for part in got for g in part]
