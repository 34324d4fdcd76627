"""Spreading an ES population over engines: round-robin out, results back in member order.

Every way leanrl scores a population on more than one engine is the same fan-out:

1. members are assigned round-robin (:func:`~leanrl.train.distributed.round_robin`): engine k
   scores members ``k, k + E, k + 2E, ...`` of the E engines;
2. each engine scores its share with the weights ``θ_{t-1}`` it holds (or rebuilds from the base
   model and the history records, never from weights sent to it);
3. the scores come back and are put in member order, so the update does not depend on which
   engine scored what, nor on how many engines there were.

**The interface is one method**, :meth:`MemberScorer.score` ``(state, members) -> scores``:
``state`` (:class:`~leanrl.train.es.workers.IterationState`) is small and picklable (iteration,
tasks, decoding settings, σ, the history records), and so is each
:class:`~leanrl.train.es.workers.Member` ``(seed, sign)`` and each
:class:`~leanrl.train.es.workers.MemberScore`. ``start``/``close`` are lifecycle hooks with
no-op defaults in :class:`ScorerBase`. Implementations:

- :class:`~leanrl.train.es.workers.InProcessScorer`, ``ProcessPoolScorer``, ``VLLMScorer``: one
  process, one or several local engines;
- :class:`DistributedScorer` (here): one engine per rank of a ``torchrun`` launch, one rank per
  GPU, on one node or many; the scores are gathered by rank over ``torch.distributed``;
- a remote fan-out (a Modal ``Function.map``) implements the same ``score``: it sends each
  container ``(WeightsSource, records, tasks, sampling, σ, member)``, lets the container keep its
  loaded weights warm, and returns the scores in member order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from leanrl.train.distributed import World, round_robin
from leanrl.train.es.workers import IterationState, Member, MemberScore, MemberScorer

__all__ = ["DistributedScorer", "ScorerBase", "in_member_order"]


class ScorerBase:
    """A :class:`MemberScorer` with no-op ``start``/``close``: subclasses write ``score`` only."""

    async def start(self) -> None:
        return None

    async def score(self, state: IterationState, members: Sequence[Member]) -> list[MemberScore]:
        raise NotImplementedError

    async def close(self) -> None:
        return None


def in_member_order(
    shares: Sequence[Sequence[int]], results: Sequence[Sequence[MemberScore]], n: int
) -> list[MemberScore]:
    """The engines' results (``results[k]`` for the members ``shares[k]``) in member order."""
    out: list[MemberScore | None] = [None] * n
    for share, res in zip(shares, results, strict=True):
        if len(share) != len(res):
            raise RuntimeError(f"an engine returned {len(res)} scores for {len(share)} members")
        for i, r in zip(share, res, strict=True):
            out[i] = r
    missing = [i for i, r in enumerate(out) if r is None]
    if missing:
        raise RuntimeError(f"no engine scored members {missing}")
    return [r for r in out if r is not None]


class DistributedScorer(ScorerBase):
    """One engine per rank (``torchrun --nproc_per_node N``): each rank scores its round-robin
    share of the members with its own ``inner`` scorer (the trainer's model on this rank's GPU,
    or a vLLM engine there), and the scores are gathered by rank, so every rank gets all of
    them and applies the same update to its own copy of θ."""

    def __init__(self, inner: MemberScorer, world: World) -> None:
        self.inner = inner
        self.world = world

    async def start(self) -> None:
        await self.inner.start()

    async def score(self, state: IterationState, members: Sequence[Member]) -> list[MemberScore]:
        shares = round_robin(len(members), self.world.size)
        mine = [members[i] for i in shares[self.world.rank]]
        local: list[MemberScore] = await self.inner.score(state, mine) if mine else []
        gathered: list[Any] = self.world.all_gather(local)
        return in_member_order(shares, gathered, len(members))

    async def close(self) -> None:
        await self.inner.close()
