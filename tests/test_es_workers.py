"""ES population scoring: worker processes give exactly the in-process rewards."""

from __future__ import annotations

import pickle
from dataclasses import fields, is_dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from test_es_learning import toy_config

from leanrl.environment import EnvironmentConfig, load_environment
from leanrl.errors import ConfigError, PolicyError
from leanrl.policy import PolicyConfig, SamplingConfig
from leanrl.train.es.history import HistoryRecord, WeightsSource, load_weights
from leanrl.train.es.policy import TorchPolicy
from leanrl.train.es.trainer import ESTrainer, population
from leanrl.train.es.workers import (
    ESVLLMWorkerExtension,
    InProcessScorer,
    IterationState,
    MemberScorer,
    ProcessPoolScorer,
    VLLMScorer,
    _WorkerInit,
    engine_memory_fraction,
    vllm_engine_kwargs,
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
    pool._conns = [_SpyConn(c) for c in pool._conns]
    spies = list(pool._conns)
    try:
        remote = await pool.score(state, members)
        again = await pool.score(state, members)  # nothing new to apply: same numbers
    finally:
        await pool.close()
    _assert_no_weights_sent(source, spies, r1)
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


class _SpyConn:
    """Wraps a worker pipe and keeps the pickled size of everything sent through it."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.sent: list[bytes] = []

    def send(self, msg: Any) -> None:
        self.sent.append(pickle.dumps(msg))
        self.conn.send(msg)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


def _has_tensor(obj: Any) -> bool:
    if isinstance(obj, torch.Tensor):
        return True
    if is_dataclass(obj) and not isinstance(obj, type):
        return any(_has_tensor(getattr(obj, f.name)) for f in fields(obj))
    if isinstance(obj, dict):
        return any(_has_tensor(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(_has_tensor(v) for v in obj)
    return False


def _assert_no_weights_sent(source: WeightsSource, spies: list[Any], r1: HistoryRecord) -> None:
    """Workers get a model path and history records, never weight tensors: not at start (the
    init) and not per iteration (each message a few KB, whatever the model's size)."""
    init = _WorkerInit(source, (r1,), EnvironmentConfig(id="x"), PolicyConfig(), 1)
    assert not _has_tensor(init) and len(pickle.dumps(init)) < 4096
    sent = [m for s in spies for m in s.sent if b"score" in m[:40]]
    assert len(sent) == 4  # one message per worker per iteration
    n_weights = sum(p.numel() for p in load_weights(source)[0].parameters())
    for blob in sent:
        assert not _has_tensor(pickle.loads(blob))
        assert b"torch" not in blob  # no tensor (nor storage) pickled anywhere inside
        assert len(blob) < 8192 < n_weights  # a few KB against a model of n_weights floats


async def test_a_killed_worker_is_reported_and_the_pool_shut_down(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    cfg = toy_config(tiny_model_dir, tmp_path / "run", population=4)
    source = WeightsSource(str(tiny_model_dir), "float32", "cpu")
    pool = ProcessPoolScorer(source, cfg.env, cfg.policy, workers=2)
    await pool.start()
    procs = list(pool._procs)
    procs[0].kill()  # what the OOM killer does
    procs[0].join(10)
    env = load_environment(cfg.env)
    state = IterationState(1, tuple(env.tasks()[:1]), SamplingConfig(max_tokens=2), 0.01, ())
    with pytest.raises(PolicyError, match=r"worker 0 died \(exit code -9\).*lower scorer.workers"):
        await pool.score(state, population(cfg, 1))
    # the other worker's reply was read and the pool shut down: nothing left running or unread
    assert pool._procs == [] and not any(p.is_alive() for p in procs)
    await pool.close()  # and closing again is harmless


def test_vllm_engine_kwargs_merge_options() -> None:
    source = WeightsSource("m", "bfloat16", "cuda")
    kw = vllm_engine_kwargs(source, PolicyConfig(model="m"), 0.5)
    assert kw["enable_prefix_caching"] is False and kw["gpu_memory_utilization"] == 0.5
    assert kw["worker_extension_cls"].endswith("ESVLLMWorkerExtension")
    # an option that is also a default is merged, not passed twice (TypeError before)
    pol = PolicyConfig(model="m", options={"enable_prefix_caching": True, "max_model_len": 512})
    kw = vllm_engine_kwargs(source, pol, 0.5)
    assert kw["enable_prefix_caching"] is True and kw["max_model_len"] == 512
    with pytest.raises(ConfigError, match=r"policy\.gpu_memory_utilization"):
        vllm_engine_kwargs(source, PolicyConfig(options={"gpu_memory_utilization": 0.9}), 0.5)


def test_engine_memory_fraction_leaves_room_for_the_master() -> None:
    gib = 2**30
    seven_b = dict(total_bytes=80 * gib, free_bytes=79 * gib, n_params=7 * 10**9)
    # fp32 master of 7B = 26 GiB outside the engine: 0.85 would not fit, a lower one is chosen
    f = engine_memory_fraction(**seven_b, largest_tensor=5 * 10**8, requested=None)
    assert f < 0.85 and (1 - f) * 80 * gib >= 4 * 7 * 10**9 + 1 * gib
    # an explicit value that cannot fit fails early and says what would
    with pytest.raises(PolicyError, match=rf"gpu_memory_utilization <= {f:.2f}"):
        engine_memory_fraction(**seven_b, largest_tensor=5 * 10**8, requested=0.85)
    assert engine_memory_fraction(**seven_b, largest_tensor=5 * 10**8, requested=0.5) == 0.5
    # a small model keeps the default
    small = engine_memory_fraction(
        total_bytes=80 * gib,
        free_bytes=79 * gib,
        n_params=10**8,
        largest_tensor=10**7,
        requested=None,
    )
    assert small == 0.85
    with pytest.raises(PolicyError, match="GPU with more memory"):
        engine_memory_fraction(
            total_bytes=24 * gib,
            free_bytes=23 * gib,
            n_params=7 * 10**9,
            largest_tensor=10**8,
            requested=None,
        )


def test_engine_master_is_saved_by_rank_0_only(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    master = {"w": torch.arange(4, dtype=torch.float32)}
    for rank in (1, 2, 0):
        worker = SimpleNamespace(rank=rank, es_master=master)
        wrote = ESVLLMWorkerExtension.es_save_master(worker, str(tmp_path / f"m{rank}"))  # type: ignore[arg-type]
        assert wrote is (rank == 0)
        assert (tmp_path / f"m{rank}").exists() is (rank == 0)
    assert load_file(str(tmp_path / "m0"))["w"].equal(master["w"])


async def test_vllm_scorer_close_shuts_the_engine_down() -> None:
    class FakeLLM:
        stopped = 0

        def shutdown(self) -> None:
            FakeLLM.stopped += 1

    scorer = VLLMScorer(None, WeightsSource("m", "float32", "cuda"), PolicyConfig(), None)  # type: ignore[arg-type]
    scorer.llm = FakeLLM()
    await scorer.close()
    await scorer.close()
    assert FakeLLM.stopped == 1 and scorer.llm is None
