"""Issue 38: why the one-step pipeline learned far less than synchronous steps at 23M, and the fix.

The pipeline's bookkeeping was right (batch s made on exactly version s - 1, its μ that
version's log-probs to 1e-6; tests/test_grpo_speed_pipeline.py). What stalled it was the
objective: ρ = π_θ/μ with μ one update behind, and the PPO clip around μ. Where one update moves
token probabilities past 1 ± eps (on the 23M benchmark 30-50% of every stale step's loss
tokens), the clip zeroes the gradient of each token the last update already moved in its
advantage's direction. Async mode now defaults to decoupled PPO (``is_correction = "auto"``:
``token_truncate``): the clip around the weights at the step's start, the stale sampler
corrected by the detached weight π_old/μ; with one pass of one mini-batch π_old is the loss
forward's own log-probs, so it costs no extra forward.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from test_grpo_objectives_ext import _batch_of, _dapo, _engine, _samples


def _stale(samples: list[Any], shift: Any) -> None:
    """Make the sampler's μ look one update behind: log μ = log π - shift(sample, token)."""
    for s in samples:
        s.old = [o - shift(s, t) for t, o in enumerate(s.old)]


def test_a_stale_batch_keeps_its_gradient_in_async_mode(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """As if the last update had doubled the probability of every sampled token, all of them
    with a positive advantage: the clip around μ (the old default, ``is_correction = "off"``)
    leaves no gradient at all, the async default learns from every token with weight 2."""
    advs = [1.0, 0.5, 0.25]
    clip = _engine(tiny_model_dir, tmp_path / "clip", async_generation=True, is_correction="off")
    samples = _samples(clip, advs)
    _stale(samples, lambda s, t: math.log(2.0))
    stats = clip.train_step(_batch_of(samples))
    assert stats["clip_frac"] == 1.0 and stats["grad_norm"] == 0.0  # the step learns nothing

    engine = _engine(tiny_model_dir, tmp_path / "auto", async_generation=True)
    assert engine.config.is_mode == "token_truncate"
    samples = _samples(engine, advs)
    _stale(samples, lambda s, t: math.log(2.0))
    stats = engine.train_step(_batch_of(samples))
    assert stats["clip_frac"] == 0.0 and stats["grad_norm"] > 0.0
    assert stats["is_weight_mean"] == pytest.approx(2.0, rel=1e-4)
    assert stats["is_capped_frac"] == 0.0  # 2 < is_cap = 3
    assert stats["loss"] == pytest.approx(_dapo(samples, lambda s, t: -2.0 * s.adv), rel=1e-4)


def test_the_clip_is_around_the_current_weights(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Mixed advantages, μ behind by a factor 2 on some tokens and ahead on others: the async
    default's loss is the truncated-IS policy gradient -min(π/μ, cap)·A at ρ = 1 exactly."""
    engine = _engine(tiny_model_dir, tmp_path / "auto", async_generation=True, is_cap=3.0)
    samples = _samples(engine, [1.0, -0.5, 0.25])
    shifts = {0: math.log(5.0), 1: -math.log(2.0)}  # w = 5 (capped at 3), w = 0.5, else 2

    def shift(s: Any, t: int) -> float:
        return shifts.get(t, math.log(2.0))

    _stale(samples, shift)
    stats = engine.train_step(_batch_of(samples))

    def w(t: int) -> float:
        return min(math.exp(shift(None, t)), 3.0)

    assert stats["loss"] == pytest.approx(_dapo(samples, lambda s, t: -w(t) * s.adv), rel=1e-4)
    assert stats["clip_frac"] == 0.0
    assert stats["is_capped_frac"] == pytest.approx(3 / 14)  # token 0 of each of 3 sequences


def _count_forwards(model: Any) -> list[int]:
    calls = [0]

    def hook(*_: Any) -> None:
        calls[0] += 1

    model.register_forward_pre_hook(hook)
    return calls


def test_pi_old_from_the_loss_forward_equals_the_recomputed_one(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """One pass of one mini-batch: π_old is taken from the loss forward itself (one forward per
    micro-batch instead of two) and the step is the recomputing one's within float rounding.
    (``disable_dropout = false`` takes the recomputing path; the tiny model has no dropout.)"""
    rng = random.Random(0)
    noise = {(k, t): rng.uniform(-1.0, 1.0) for k in range(3) for t in range(9)}
    got = {}
    for name, kw in {"inline": {}, "recompute": {"disable_dropout": False}}.items():
        engine = _engine(tiny_model_dir, tmp_path / name, async_generation=True, **kw)
        samples = _samples(engine, [1.0, -0.5, 0.25])
        for k, s in enumerate(samples):
            s.old = [o - noise[(k, t)] for t, o in enumerate(s.old)]
        calls = _count_forwards(engine.model)
        stats = engine.train_step(_batch_of(samples))
        params = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
        got[name] = (stats, params, calls[0])
    (a, wa, na), (b, wb, nb) = got["inline"], got["recompute"]
    assert (na, nb) == (2, 4)  # 3 sequences in micro-batches of 2: 2 forwards, or 2 + 2
    for key in ("loss", "is_weight_mean", "is_capped_frac", "grad_norm"):
        assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), key
    assert a["clip_frac"] == 0.0
    for n in wa:
        assert torch.allclose(wa[n], wb[n], atol=1e-6, rtol=0), n


def test_more_passes_still_recompute_pi_old(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Two mini-batches: the second is trained after the first's update, so π_old (the weights
    at the step's start) needs its own forward, as before."""
    engine = _engine(
        tiny_model_dir, tmp_path / "mb", async_generation=True, group_size=4, minibatches=2
    )
    samples = _samples(engine, [1.0, -0.5, 0.25])
    samples.append(_samples(engine, [0.5, 0.5, 0.5])[0])
    _stale(samples, lambda s, t: math.log(2.0))
    calls = _count_forwards(engine.model)
    stats = engine.train_step(_batch_of(samples))
    assert stats["optimizer_steps"] == 2
    assert calls[0] == 2 + 2  # the recompute (4 sequences in 2 micro-batches) + the 2 passes
    assert stats["is_weight_mean"] == pytest.approx(2.0, rel=1e-4)


def test_the_default_resolves_with_the_mode(tmp_path: Path) -> None:
    from leanrl.policy import PolicyConfig
    from leanrl.train.grpo import GRPOConfig

    base = dict(policy=PolicyConfig(model="m"), out=tmp_path)
    assert GRPOConfig(**base).is_correction == "auto"
    assert GRPOConfig(**base).is_mode == "off"  # hf: synchronous steps, ρ against μ as before
    assert GRPOConfig(**base, async_generation=True).is_mode == "token_truncate"
    assert GRPOConfig(**base, async_generation=True, is_correction="off").is_mode == "off"
    assert GRPOConfig(**base, is_correction="token_mask").is_mode == "token_mask"


def test_an_async_run_trains_decoupled(tiny_model_dir: Path, tmp_path: Path) -> None:
    """End to end on the hf pipeline: every step after the first is one step stale, ρ is exactly
    1 on the first pass (nothing clipped) and the IS weights are logged; a synchronous run keeps
    the plain objective (no IS metrics)."""
    from test_grpo_trainer import _config, _train

    kw: dict[str, Any] = dict(steps=3, tasks_per_step=2, group_size=2, micro_batch_size=4)
    rows = _train(_config(tiny_model_dir, tmp_path / "a", async_generation=True, **kw))
    assert [r["staleness"] for r in rows] == [0, 1, 1]
    trained = [r for r in rows if not r["skipped"]]
    assert trained and all(r["clip_frac"] == 0.0 for r in trained)
    assert all(r["is_weight_mean"] is not None for r in trained)
    sync = _train(_config(tiny_model_dir, tmp_path / "s", **kw))
    assert all("is_weight_mean" not in r for r in sync)
