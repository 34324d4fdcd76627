"""ES with one engine per rank (torch.distributed, gloo, 2 real processes over loopback).

Members are scored round-robin on the two ranks and the scores gathered by rank; every rank
applies the same update. Greedy decoding makes a member's score a pure function of its weights,
so the run must record exactly the history of a one-process run, and only rank 0 may write.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from test_es_learning import toy_config

from leanrl.policy import SamplingConfig
from leanrl.runtime import run_sync
from leanrl.train.distributed import World
from leanrl.train.es.fanout import DistributedScorer, ScorerBase, in_member_order
from leanrl.train.es.history import ESHistory
from leanrl.train.es.workers import IterationState, Member, MemberScore
from tests._ranks import run_ranks

pytestmark = pytest.mark.slow


def _train(cfg: Any) -> None:
    from leanrl.train.es import ESTrainer

    ESTrainer(cfg).train_sync()


def test_two_ranks_record_the_one_rank_history(own_tiny_model: Path, tmp_path: Path) -> None:
    kw: dict[str, Any] = {"steps": 3, "population": 5, "save_every": 2}
    one, two = tmp_path / "one", tmp_path / "two"
    _train(toy_config(own_tiny_model, one, **kw))
    run_ranks(2, _train, toy_config(own_tiny_model, two, **kw))
    h1 = ESHistory(one / "es_history.bin").open(read_only=True)
    h2 = ESHistory(two / "es_history.bin").open(read_only=True)
    assert h1 == h2 and len(h1) == 3 and any(r.coeffs for r in h1)
    m1 = [json.loads(x) for x in (one / "metrics.jsonl").read_text().splitlines()]
    m2 = [json.loads(x) for x in (two / "metrics.jsonl").read_text().splitlines()]
    assert [r["reward_mean"] for r in m1] == [r["reward_mean"] for r in m2]
    assert [r["step"] for r in m2] == [1, 2, 3]  # rank 1 wrote no line
    assert (two / "checkpoint-2").is_dir() and (two / "checkpoint-3").is_dir()


class _Recorder(ScorerBase):
    """Scores member i as its seed and remembers which members it saw."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    async def score(self, state: IterationState, members: Sequence[Member]) -> list[MemberScore]:
        self.seen += [m.seed for m in members]
        return [MemberScore(reward=float(m.seed), pass_rate=0.0) for m in members]


def test_distributed_scorer_without_ranks_scores_everything_in_order() -> None:
    inner = _Recorder()
    scorer = DistributedScorer(inner, World())
    members = [Member(s) for s in (5, 3, 9)]
    state = IterationState(1, (), SamplingConfig(), 0.1, ())
    got = run_sync(scorer.score(state, members))
    assert [s.reward for s in got] == [5.0, 3.0, 9.0] and inner.seen == [5, 3, 9]


def test_in_member_order() -> None:
    a, b, c = (MemberScore(reward=float(i), pass_rate=0.0) for i in range(3))
    assert in_member_order([[0, 2], [1]], [[a, c], [b]], 3) == [a, b, c]
    with pytest.raises(RuntimeError, match="returned 1 scores for 2 members"):
        in_member_order([[0, 2], [1]], [[a], [b]], 3)
