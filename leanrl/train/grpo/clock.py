"""The GRPO trainer's generation clock: the generation policy, wrapped to measure the wall time
during which at least one generate (or stream) call is in flight (``gen_s`` in the metrics).

It forwards everything a harness calls on a policy, so a harness behaves exactly as with the
bare policy: text prompts, token-id prompts (multi-turn harnesses grow their contexts as ids
only where the policy takes them: :func:`clock_for` picks the wrapper that does exactly when the
inner policy does) and streams (where the inner policy's stream replays ``generate``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from leanrl.policy import (
    Completion,
    Policy,
    SamplingConfig,
    StreamCompletion,
    stream_replays_generate,
)

__all__ = ["GenClock", "clock_for"]


class GenClock(Policy):
    """Wraps the generation policy and measures wall time with a generate call in flight."""

    def __init__(self, inner: Policy) -> None:
        super().__init__(inner.config)
        self.inner = inner
        self.name = inner.name  # type: ignore[misc]
        self.tokenizer: Any = getattr(inner, "tokenizer", None)
        """The inner policy's (chat templates and feedback ids of multi-turn harnesses)."""
        self.busy = 0.0
        self._inflight = 0
        self._since = 0.0

    async def generate(self, prompts: Any, sampling: SamplingConfig) -> Any:
        self._enter()
        try:
            return await self.inner.generate(prompts, sampling)
        finally:
            self._leave()

    def stream_replays(self, sampling: SamplingConfig) -> bool:
        # the rollouts stream (each attempt checked on arrival) where the inner policy's would
        return stream_replays_generate(self.inner, sampling, native=True)

    async def stream(self, requests: Any) -> AsyncIterator[StreamCompletion]:
        self._enter()
        try:
            async for c in self.inner.stream(requests):
                yield c
        finally:
            self._leave()

    def _enter(self) -> None:
        if self._inflight == 0:
            self._since = time.perf_counter()
        self._inflight += 1

    def _leave(self) -> None:
        self._inflight -= 1
        if self._inflight == 0:
            self.busy += time.perf_counter() - self._since

    def tokenize(self, text: str) -> list[int]:
        return self.inner.tokenize(text)

    def take(self) -> float:
        """Seconds generating since the last ``take``."""
        t, self.busy = self.busy, 0.0
        return t


class _IdsGenClock(GenClock):
    """The clock of a policy that generates from token ids: forwards those calls too. (A
    separate class, since harnesses tell an ids policy by its class overriding the method.)"""

    async def generate_from_ids(
        self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        self._enter()
        try:
            return await self.inner.generate_from_ids(prompt_ids, sampling)
        finally:
            self._leave()


def clock_for(inner: Policy) -> GenClock:
    """The clock around ``inner``: it takes token-id prompts exactly when ``inner`` does."""
    takes_ids = type(inner).generate_from_ids is not Policy.generate_from_ids
    return _IdsGenClock(inner) if takes_ids else GenClock(inner)
