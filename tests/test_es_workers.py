"""ES population scoring: worker processes give exactly the in-process rewards."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_es_learning import toy_config

from leanrl.environment import EnvironmentConfig, load_environment
from leanrl.errors import PolicyError
from leanrl.train.es import ESTrainer, population
from leanrl.train.es_history import HistoryRecord, WeightsSource, load_weights
from leanrl.train.es_policy import TorchPolicy
from leanrl.train.es_workers import (
    InProcessScorer,
    IterationState,
    MemberScorer,
    ProcessPoolScorer,
)


@pytest.mark.slow
async def test_process_pool_matches_in_process(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = toy_config(tiny_model_dir, tmp_path / "run", population=4)
    tr = ESTrainer(cfg)
    source = WeightsSource(str(tiny_model_dir), "float32", "cpu")
    # two iterations of history: one known before the workers start, one sent later
    r1 = HistoryRecord(1, ((101, 0.01), (102, -0.01)))
    r2 = HistoryRecord(2, ((201, 0.02),))
    pool = ProcessPoolScorer(source, cfg.env, cfg.policy, workers=2, records=[r1])
    assert isinstance(pool, MemberScorer)
    env = load_environment(cfg.env)
    tasks = tuple(env.tasks()[:2])
    members = population(cfg, 3)
    state = IterationState(3, tasks, tr.sampling_for(3), cfg.sigma, (r1, r2))
    await pool.start()
    try:
        remote = await pool.score(state, members)
        again = await pool.score(state, members)  # nothing new to apply: same numbers
    finally:
        await pool.close()
    model, tok, weights = load_weights(source, [r1, r2])
    local = InProcessScorer(env, TorchPolicy(model, tok, cfg.policy), weights)
    await local.start()
    here = await local.score(state, members)
    assert [s.reward for s in remote] == [s.reward for s in here]
    assert [s.rewards for s in again] == [s.rewards for s in here]
    assert len({s.reward for s in here}) == len(members)  # members really differ
    # and the weights were restored exactly after scoring
    _, _, fresh = load_weights(source, [r1, r2])
    assert all(weights.master[k].equal(fresh.master[k]) for k in fresh.master)
    assert all(p.detach().equal(fresh.master[n]) for n, p in weights.params.items())


async def test_worker_failure_is_reported(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = toy_config(tiny_model_dir, tmp_path / "run")
    source = WeightsSource(str(tiny_model_dir), "float32", "cpu")
    bad = EnvironmentConfig(id="no_such_module_xyz:Env")
    pool = ProcessPoolScorer(source, bad, cfg.policy, workers=1)
    with pytest.raises(PolicyError, match="no_such_module_xyz"):
        await pool.start()
    await pool.close()


@pytest.mark.slow
def test_trainer_with_processes_matches_inprocess(tiny_model_dir: Path, tmp_path: Path) -> None:
    a = ESTrainer(toy_config(tiny_model_dir, tmp_path / "a", steps=2))
    b = ESTrainer(
        toy_config(
            tiny_model_dir, tmp_path / "b", steps=2, scorer={"backend": "processes", "workers": 2}
        )
    )
    ra, rb = a.train_sync(), b.train_sync()
    assert [r["reward_mean"] for r in ra] == [r["reward_mean"] for r in rb]
    assert all(a.weights.master[k].equal(b.weights.master[k]) for k in a.weights.master)
