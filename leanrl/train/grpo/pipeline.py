"""The order in which a GRPO run makes its batches and trains on them.

Synchronous (``lag`` None): batch s is made (generated, checked, rewarded) on the weights that
just finished step s - 1, then trained on: each step a pure function of (seed, step).

Asynchronous (``lag`` k = ``max_staleness``): a producer task makes batch s on the generation
copy of the weights while the trainer trains the steps before it, at most k batches ahead of
the trainer; with k = 1 it is a one-step pipeline (step s + 1 generated and checked while step s
trains). The producer takes the weights for batch s when version s - k is finished, and the
trainer does not start step s - k's update until they are taken, so batch s is made on exactly
version max(s - k, start): the same batches whatever the timing, hence a repeatable run, and a
run killed and resumed from a checkpoint makes what a run resumed there on purpose makes. (A
resumed pipeline starts fresh: its first batches are less stale than an uninterrupted run's.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from leanrl.train.grpo.data import _Batch

__all__ = ["Pipeline"]


class Pipeline:
    """Batches for steps ``start`` .. ``steps - 1``, in order, and the update of each.

    ``engine``: the GRPO engine (``step``: finished steps; ``sync_generation_weights``;
    ``train_step``). ``collect(s)``: batch s on the generation weights as they are."""

    def __init__(
        self,
        engine: Any,
        collect: Callable[[int], Awaitable[_Batch]],
        start: int,
        steps: int,
        lag: int | None,
    ) -> None:
        self.engine = engine
        self.collect = collect
        self.start, self.steps, self.lag = start, steps, lag
        self._cond = asyncio.Condition()
        self._taken = start - 1  # the newest batch whose generation weights were taken
        self._failed: BaseException | None = None
        self._queue: asyncio.Queue[_Batch | BaseException] = asyncio.Queue(maxsize=lag or 1)
        self._producer: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Pipeline:
        if self.lag is not None and self.start < self.steps:
            self._producer = asyncio.create_task(self._produce())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._producer is not None:
            self._producer.cancel()
            await asyncio.gather(self._producer, return_exceptions=True)

    async def batch(self, step: int) -> _Batch:
        """Step ``step``'s batch (steps are asked for in order)."""
        if self.lag is None:
            await asyncio.to_thread(self.engine.sync_generation_weights)
            return await self.collect(step)
        got = await self._queue.get()
        if isinstance(got, BaseException):
            raise got
        if got.step != step:
            raise RuntimeError(f"the pipeline made step {got.step + 1}'s batch, not {step + 1}'s")
        return got

    async def train(self, batch: _Batch) -> dict[str, Any]:
        """Train on ``batch`` (the engine's next step). Asynchronous: first wait until the
        producer has taken the generation weights the batch ``lag`` steps on is made with
        (this step's starting weights), so that the update cannot land before that copy."""
        if self.lag is not None:
            due = min(batch.step + self.lag, self.steps - 1)
            async with self._cond:
                await self._cond.wait_for(lambda: self._taken >= due or self._failed is not None)
            if self._failed is not None and self._taken < due:
                raise self._failed
        stats: dict[str, Any] = await asyncio.to_thread(self.engine.train_step, batch)
        async with self._cond:
            self._cond.notify_all()
        return stats

    def _trained_to(self, version: int) -> Callable[[], bool]:
        return lambda: self.engine.step >= version

    async def _produce(self) -> None:
        assert self.lag is not None
        lag = self.lag
        try:
            for s in range(self.start, self.steps):
                async with self._cond:  # bounded staleness: batch s on weights >= s - lag
                    await self._cond.wait_for(self._trained_to(s - lag))
                await asyncio.to_thread(self.engine.sync_generation_weights)
                async with self._cond:
                    self._taken = s
                    self._cond.notify_all()
                await self._queue.put(await self.collect(s))
        except Exception as e:  # noqa: BLE001 - the trainer re-raises it
            async with self._cond:
                self._failed = e
                self._cond.notify_all()
            await self._queue.put(e)
