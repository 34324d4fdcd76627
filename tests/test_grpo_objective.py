"""One GRPO training step against the objective computed by hand.

Each test builds a few sequences of a tiny model, fixes their advantages and behaviour
log-probs, runs ``GRPOEngine.train_step`` once and compares the loss (and clip fraction, gradient
norm) it reports with the value of the documented objective computed here. Every option that
changes the objective (loss aggregation, old log-probs, clip bounds, temperature, KL, dual clip)
gets a case whose hand value differs from what the objective would be without that option, so a
trainer that ignores the option fails.
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from leanrl.policy import PolicyConfig, SamplingConfig
from leanrl.rollout import Rollout, Turn
from leanrl.train.common import RunDir
from leanrl.verdict import Reason, Verdict

ADVS = [1.0, -0.5, 0.25]


def _engine(model: Path, out: Path, **kw: Any) -> Any:
    from leanrl.train.grpo import GRPOConfig
    from leanrl.train.grpo.engine import GRPOEngine

    base: dict[str, Any] = dict(
        policy=PolicyConfig(model=str(model)),
        sampling=SamplingConfig(max_tokens=16, top_p=1.0, seed=0),
        out=out,
        steps=10,
        tasks_per_step=1,
        group_size=3,
        lr=1e-3,
        micro_batch_size=2,  # two micro-batches: accumulation must not change the result
    )
    base.update(kw)
    engine = GRPOEngine(GRPOConfig(**base), RunDir(out))
    engine.load(resumed=False)
    return engine


def _samples(engine: Any) -> list[Any]:
    """Three sequences of different lengths (the third with 2 environment tokens, mask 0) whose
    ``old`` is the current model's own log-prob, so that ρ = 1 exactly as given."""
    from leanrl.train.grpo.data import _Sample

    tok = engine.tokenizer
    prompt = tok.encode("theorem t1 : 1 + 1 = 2 := by", add_special_tokens=False)
    body = tok.encode("  nlinarith [sq_nonneg x] omega simp rfl", add_special_tokens=False)
    assert len(body) >= 9
    masks = [[1, 1], [1] * 5, [1, 1, 1, 0, 0, 1, 1, 1, 1]]
    out = [
        _Sample(prompt=prompt[: 4 + k], resp=body[: len(m)], mask=m, old=[], adv=a)
        for k, (m, a) in enumerate(zip(masks, ADVS, strict=True))
    ]
    engine._fill_logprobs(out, "old")
    return out


def _batch(samples: list[Any]) -> Any:
    from leanrl.train.grpo.data import _Batch

    return _Batch(
        step=0, groups=[], kept=[], samples=samples, version=0, t_rollout=0.0, t_generate=0.0
    )


def _hand(samples: list[Any], agg: str, tok_loss: Any, norm_len: int = 16) -> float:
    """The documented aggregation of per-token losses ``tok_loss(sample, t)`` over mask-1 tokens."""
    per_seq = [[tok_loss(s, t) for t, m in enumerate(s.mask) if m] for s in samples]
    if agg == "dapo":
        return sum(map(sum, per_seq)) / sum(map(len, per_seq))
    if agg == "grpo":
        return sum(sum(x) / len(x) for x in per_seq) / len(per_seq)
    return sum(map(sum, per_seq)) / (len(per_seq) * norm_len)


@pytest.mark.parametrize("agg", ["dapo", "grpo", "dr_grpo"])
def test_loss_per_aggregation_matches_hand_value(
    tiny_model_dir: Path, tmp_path: Path, agg: str
) -> None:
    engine = _engine(tiny_model_dir, tmp_path / "r", loss_agg=agg, norm_len=16)
    samples = _samples(engine)
    stats = engine.train_step(_batch(samples))
    # ρ = 1: every loss token is -A of its sequence; lengths 2, 5, 7 loss tokens
    want = _hand(samples, agg, lambda s, t: -s.adv)
    assert want == pytest.approx(
        {"dapo": -(2 - 2.5 + 1.75) / 14, "grpo": -0.25, "dr_grpo": -1.25 / 48}[agg]
    )
    assert stats["loss"] == pytest.approx(want, rel=1e-4, abs=1e-6)
    assert stats["clip_frac"] == 0.0 and stats["optimizer_steps"] == 1
    assert stats["grad_norm"] > 0


def _shift(samples: list[Any], log_ratio: float) -> list[float]:
    """Lower every ``old`` by ``log_ratio`` (so ρ = e^log_ratio); returns the true ones."""
    true = [list(s.old) for s in samples]
    for s in samples:
        s.old = [o - log_ratio for o in s.old]
    return [x for row in true for x in row]


def test_ratio_against_the_sampler_logprobs(tiny_model_dir: Path, tmp_path: Path) -> None:
    """ρ = 1.1 (inside the clip): the loss is 1.1 × the ρ = 1 loss, not the ρ = 1 loss."""
    engine = _engine(tiny_model_dir, tmp_path / "r")
    samples = _samples(engine)
    _shift(samples, math.log(1.1))
    stats = engine.train_step(_batch(samples))
    assert stats["loss"] == pytest.approx(1.1 * _hand(samples, "dapo", lambda s, t: -s.adv), 1e-4)
    assert stats["clip_frac"] == 0.0


def test_recompute_replaces_the_sampler_logprobs(tiny_model_dir: Path, tmp_path: Path) -> None:
    """old_logprobs = recompute: stale sampler numbers (ρ would be 1.65) are ignored, ρ = 1."""
    engine = _engine(tiny_model_dir, tmp_path / "r", old_logprobs="recompute")
    samples = _samples(engine)
    for s in samples:
        s.adv = abs(s.adv)
    _shift(samples, 0.5)
    want = _hand(samples, "dapo", lambda s, t: -s.adv)
    stats = engine.train_step(_batch(samples))
    assert stats["loss"] == pytest.approx(want, rel=1e-4)
    assert stats["clip_frac"] == 0.0


def test_clip_higher_keeps_gradient_between_eps_low_and_eps_high(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """ρ = 1.25 with A > 0: inside 1 + eps_high = 1.28 but above 1 + eps_low = 1.2, so the token
    is not clipped and still gets gradient (DAPO's clip-higher)."""
    engine = _engine(tiny_model_dir, tmp_path / "r", eps_low=0.2, eps_high=0.28)
    samples = _samples(engine)
    for s in samples:
        s.adv = abs(s.adv)
    _shift(samples, math.log(1.25))
    stats = engine.train_step(_batch(samples))
    assert stats["loss"] == pytest.approx(1.25 * _hand(samples, "dapo", lambda s, t: -s.adv), 1e-4)
    assert stats["clip_frac"] == 0.0
    assert stats["grad_norm"] > 1e-3

    # the same token above 1 + eps_high is clipped: loss at 1.28, no gradient
    engine = _engine(tiny_model_dir, tmp_path / "r2", eps_low=0.2, eps_high=0.28)
    samples = _samples(engine)
    for s in samples:
        s.adv = abs(s.adv)
    _shift(samples, math.log(1.5))
    stats = engine.train_step(_batch(samples))
    assert stats["loss"] == pytest.approx(1.28 * _hand(samples, "dapo", lambda s, t: -s.adv), 1e-4)
    assert stats["clip_frac"] == 1.0 and stats["grad_norm"] == 0.0


def test_dual_clip_caps_negative_advantage_loss(tiny_model_dir: Path, tmp_path: Path) -> None:
    """ρ = 5, A < 0: the loss per token is 5·|A| without dual clip, capped at 3·|A| with it."""
    for c, want_factor in ((0.0, 5.0), (3.0, 3.0)):
        engine = _engine(tiny_model_dir, tmp_path / f"r{c}", dual_clip=c)
        samples = _samples(engine)
        for s in samples:
            s.adv = -abs(s.adv)
        _shift(samples, math.log(5.0))
        stats = engine.train_step(_batch(samples))
        want = want_factor * _hand(samples, "dapo", lambda s, t: -s.adv)
        assert stats["loss"] == pytest.approx(want, rel=1e-4)
        if c:
            assert stats["clip_frac"] == 1.0 and stats["grad_norm"] == 0.0
        else:
            assert stats["grad_norm"] > 1e-3


def test_kl_term_enters_the_loss(tiny_model_dir: Path, tmp_path: Path) -> None:
    """β = 0.5 against a reference that differs from the current model: the loss is the
    surrogate plus β·mean k3(π_θ, π_ref) over loss tokens."""
    beta = 0.5
    engine = _engine(tiny_model_dir, tmp_path / "r", beta=beta)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in engine.ref_model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    samples = _samples(engine)
    ref = _samples(engine)
    engine._fill_logprobs(ref, "ref")

    def k3(i: int, t: int) -> float:
        d = ref[i].ref[t] - samples[i].old[t]
        return math.exp(d) - d - 1.0

    idx = {id(s): i for i, s in enumerate(samples)}
    kl_mean = _hand(samples, "dapo", lambda s, t: k3(idx[id(s)], t))
    assert beta * kl_mean > 1e-3  # the term is measurable at the tolerance below
    want = _hand(samples, "dapo", lambda s, t: -s.adv + beta * k3(idx[id(s)], t))
    stats = engine.train_step(_batch(samples))
    assert stats["loss"] == pytest.approx(want, rel=1e-4)
    assert stats["kl"] == pytest.approx(kl_mean, rel=1e-4)


def test_training_logprobs_use_the_sampling_temperature(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Completions sampled at T = 0.7 carry log softmax(logits / 0.7); the first pass must see
    ρ = 1 (no clipping, behaviour KL 0, loss = the ρ = 1 value)."""
    from leanrl.train.grpo.data import _Sample

    sampling = SamplingConfig(max_tokens=12, top_p=1.0, temperature=0.7, seed=3)
    engine = _engine(tiny_model_dir, tmp_path / "r", sampling=sampling)
    policy = asyncio.run(engine.make_generation_policy())
    prompts = ["theorem t1 : 1 + 1 = 2 := by", "omega"]
    comps = policy.generate_sync(prompts, sampling.model_copy(update={"n": 2}))
    samples = [
        _Sample(
            prompt=list(c.prompt_token_ids),
            resp=list(c.token_ids),
            mask=[1] * len(c.token_ids),
            old=list(c.logprobs or ()),
            adv=a,
        )
        for g in comps
        for c, a in zip(g, (1.0, -1.0), strict=True)
    ]
    stats = engine.train_step(_batch(samples))
    assert stats["kl_behaviour"] < 1e-6 and stats["clip_frac"] == 0.0
    assert stats["loss"] == pytest.approx(_hand(samples, "dapo", lambda s, t: -s.adv), abs=1e-4)


# -- advantages and masks -------------------------------------------------------------------------


def _rollout(reward: float, turns: list[tuple[str, str]], reason: Reason | None = None) -> Rollout:
    return Rollout(
        task_id="t",
        prompt="p",
        prompt_ids=[1, 2, 3],
        turns=[
            Turn(
                completion="x",
                completion_ids=[5, 6],
                logprobs=[-1.0, -1.0],
                feedback=fb,
                feedback_ids=[7] if fb else [],
                finish_reason=fin,
            )
            for fin, fb in turns
        ],
        verdict=None if reason is None else Verdict(accepted=reason == Reason.OK, reason=reason),
        reward=reward,
    )


def test_truncation_mask_follows_the_final_outcome(tiny_model_dir: Path, tmp_path: Path) -> None:
    engine = _engine(tiny_model_dir, tmp_path / "r", mask_truncated=True)
    group = [
        # turn 1 cut off, the episode went on and proved the theorem: a real outcome, trained
        _rollout(1.0, [("length", "error"), ("stop", "")], Reason.OK),
        # the last turn was cut off: unfinished, masked
        _rollout(0.0, [("stop", "goals"), ("length", "")], Reason.ERROR),
        # ran out of the episode's total token budget: masked although no turn says "length"
        _rollout(0.0, [("stop", "goals"), ("stop", "")], Reason.TRUNCATED),
        _rollout(0.0, [("stop", "")], Reason.ERROR),
    ]
    samples = engine.make_samples([group])
    assert [s.mask for s in samples] == [
        [1, 1, 0, 1, 1],
        [0, 0, 0, 0, 0],
        [0, 0, 0, 0, 0],
        [1, 1],
    ]


def test_dr_grpo_alone_does_not_scale_by_std(tiny_model_dir: Path, tmp_path: Path) -> None:
    from leanrl.train.grpo import GRPOConfig

    assert GRPOConfig(loss_agg="dr_grpo").reward_scale == "none"
    assert GRPOConfig().reward_scale == "group"
    assert GRPOConfig(loss_agg="dr_grpo", scale_rewards="group").reward_scale == "group"
    engine = _engine(tiny_model_dir, tmp_path / "r", loss_agg="dr_grpo", group_size=4)
    group = [_rollout(r, [("stop", "")], Reason.OK) for r in (1.0, 0.0, 0.0, 1.0)]
    assert [s.adv for s in engine.make_samples([group])] == [0.5, -0.5, -0.5, 0.5]


def test_batch_scale_uses_every_reward_of_the_step(tiny_model_dir: Path, tmp_path: Path) -> None:
    """scale_rewards = batch: the std of the whole step's rewards, dropped groups included."""
    engine = _engine(tiny_model_dir, tmp_path / "r", scale_rewards="batch", group_size=4)
    kept = [_rollout(r, [("stop", "")], Reason.OK) for r in (1.0, 0.0, 0.0, 1.0)]
    everything = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]  # a dropped all-zero group too
    a = 0.5 / (math.sqrt(1.5 / 7) + 1e-4)
    got = [s.adv for s in engine.make_samples([kept], everything)]
    assert got == pytest.approx([a, -a, -a, a], abs=1e-6)


def test_infra_rollouts_get_no_sequence_and_no_say(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A rollout the checker could not judge (infra) is not trained on, and its reward of 0 is
    not compared against: the group is the judged rollouts."""
    engine = _engine(tiny_model_dir, tmp_path / "r", loss_agg="dr_grpo", group_size=4)
    group = [
        _rollout(1.0, [("stop", "")], Reason.OK),
        _rollout(0.0, [("stop", "")], Reason.INFRA),
        _rollout(0.0, [("stop", "")], Reason.ERROR),
        _rollout(1.0, [("stop", "")], Reason.OK),
    ]
    samples = engine.make_samples([group])
    assert [s.adv for s in samples] == pytest.approx([1 / 3, -2 / 3, 1 / 3])
    # one judged rollout left: nothing to compare it with
    lone = [_rollout(0.0, [("stop", "")], Reason.INFRA)] * 3 + [group[0]]
    assert [s.adv for s in engine.make_samples([lone])] == [0.0]


# -- dropout ------------------------------------------------------------------------------------------


def test_dropout_is_off_in_the_loss_forward(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A model with attention dropout 0.1: with ``disable_dropout`` (the default) the training
    forward reproduces the sampler's log-probs; without it, it does not."""
    from leanrl.train.grpo.data import _Sample
    from leanrl.train.grpo.loss import token_logprobs

    drop = tmp_path / "tiny-dropout"
    shutil.copytree(tiny_model_dir, drop)
    cfg = json.loads((drop / "config.json").read_text())
    cfg["attention_dropout"] = 0.1
    (drop / "config.json").write_text(json.dumps(cfg))

    def max_gap(disable: bool) -> float:
        engine = _engine(drop, tmp_path / f"r{disable}", disable_dropout=disable)
        assert engine.model.training  # the loss forward runs in train mode
        policy = asyncio.run(engine.make_generation_policy())
        comps = policy.generate_sync(["theorem t1 : 1 + 1 = 2 := by"], engine.config.sampling)
        samples = [
            _Sample(prompt=list(c.prompt_token_ids), resp=list(c.token_ids),
                    mask=[1] * len(c.token_ids), old=list(c.logprobs or ()), adv=1.0)
            for c in comps[0]
        ]  # fmt: skip
        torch.manual_seed(0)
        with torch.no_grad():
            logits, targets = engine._forward(samples, engine.model)
        lp = token_logprobs(logits, targets)
        return max(
            float((lp[k, lp.shape[1] - len(s.resp) :] - torch.tensor(s.old)).abs().max())
            for k, s in enumerate(samples)
        )

    assert max_gap(True) < 1e-4
    assert max_gap(False) > 1e-3  # the test model really has dropout
