"""GRPO maths against values computed by hand: advantages, clipped loss, KL, each aggregation."""

from __future__ import annotations

import math

import pytest
import torch

from leanrl.rollout import Rollout, Turn
from leanrl.train.grpo.loss import (
    aggregate,
    clipped_token_loss,
    group_advantages,
    kl_k3,
    token_logprobs,
)

# -- advantages ---------------------------------------------------------------------------------

REWARDS = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])


def test_group_advantage_scaled_by_group_std() -> None:
    adv = group_advantages(REWARDS, "group")
    # group 1: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.577350; 0.5 / (0.577350 + 1e-4)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    assert adv[0].tolist() == pytest.approx([a, -a, -a, a], abs=1e-6)
    assert adv[1].tolist() == [0.0, 0.0, 0.0, 0.0]  # all-equal group: no signal


def test_group_advantage_unscaled_dr_grpo() -> None:
    adv = group_advantages(REWARDS, "none")
    assert adv.tolist() == [[0.5, -0.5, -0.5, 0.5], [0.0, 0.0, 0.0, 0.0]]


def test_group_advantage_scaled_by_batch_std() -> None:
    adv = group_advantages(REWARDS, "batch")
    # all 8 rewards: mean 0.25, unbiased var (2 * 0.75^2 + 6 * 0.25^2) / 7 = 1.5 / 7
    a = 0.5 / (math.sqrt(1.5 / 7) + 1e-4)
    assert adv[0].tolist() == pytest.approx([a, -a, -a, a], abs=1e-6)
    assert adv[1].tolist() == [0.0, 0.0, 0.0, 0.0]


def test_group_advantage_continuous_rewards() -> None:
    adv = group_advantages(torch.tensor([[0.0, 0.5, 1.0]]), "group")
    # mean 0.5, unbiased std 0.5
    assert adv[0].tolist() == pytest.approx([-0.5 / 0.5001, 0.0, 0.5 / 0.5001], abs=1e-6)


def test_uncounted_rewards_are_left_out_of_their_group() -> None:
    """Rewards the checker could not judge (infra) get advantage 0 and do not move the group's
    mean or std; a group with fewer than two counted rewards carries no signal."""
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
    counted = torch.tensor(
        [[True, False, True, True], [True, False, False, False], [False, True, False, False]]
    )
    adv = group_advantages(r, "group", counted=counted)
    # group 1 is [1, 0, 1]: mean 2/3, unbiased std sqrt(1/3)
    hi, lo = (1 / 3) / (math.sqrt(1 / 3) + 1e-4), (-2 / 3) / (math.sqrt(1 / 3) + 1e-4)
    assert adv[0].tolist() == pytest.approx([hi, 0.0, lo, hi], abs=1e-6)
    assert adv[1].tolist() == [0.0] * 4 and adv[2].tolist() == [0.0] * 4
    assert group_advantages(r, "none", counted=counted)[0].tolist() == pytest.approx(
        [1 / 3, 0.0, -2 / 3, 1 / 3], abs=1e-6
    )
    # batch: the std of the counted rewards only (1, 0, 1; 1; 1), when no batch is given
    a = group_advantages(r, "batch", counted=counted)[0]
    std = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0]).std().item()
    assert a.tolist() == pytest.approx([(1 / 3) / (std + 1e-4), 0.0, (-2 / 3) / (std + 1e-4),
                                        (1 / 3) / (std + 1e-4)], abs=1e-6)  # fmt: skip


# -- the clipped surrogate ----------------------------------------------------------------------


def test_clipped_loss_all_four_cases() -> None:
    # ratios 1.5 and 0.5 against advantages +1 and -1, eps_low 0.2, eps_high 0.28 (clip-higher)
    ratio = torch.tensor([[1.5, 0.5], [1.5, 0.5]])
    logp = torch.log(ratio)
    old = torch.zeros_like(logp)
    adv = torch.tensor([1.0, -1.0])
    loss, clipped = clipped_token_loss(logp, old, adv, eps_low=0.2, eps_high=0.28)
    # A=+1: r=1.5 -> min(1.5, 1.28) = 1.28 (clipped); r=0.5 -> min(0.5, 0.8) = 0.5
    # A=-1: r=1.5 -> min(-1.5, -1.28) = -1.5; r=0.5 -> min(-0.5, -0.8) = -0.8 (clipped)
    assert loss.flatten().tolist() == pytest.approx([-1.28, -0.5, 1.5, 0.8], abs=1e-6)
    assert clipped.tolist() == [[1.0, 0.0], [0.0, 1.0]]


def test_clipped_loss_gradient_at_ratio_one_is_policy_gradient() -> None:
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, _ = clipped_token_loss(logp, logp.detach(), torch.tensor([2.0]), 0.2, 0.28)
    loss.sum().backward()
    assert logp.grad is not None
    # d/dlogp of -(exp(logp - old) * A) at logp = old is -A
    assert logp.grad.tolist() == [[-2.0, -2.0]]


def test_clipped_tokens_have_no_gradient() -> None:
    logp = torch.tensor([[math.log(1.5)]], requires_grad=True)
    loss, clipped = clipped_token_loss(logp, torch.zeros(1, 1), torch.tensor([1.0]), 0.2, 0.28)
    loss.sum().backward()
    assert clipped.item() == 1.0
    assert logp.grad is not None and logp.grad.item() == 0.0


def test_kl_k3_by_hand() -> None:
    logp = torch.tensor([[0.0, math.log(0.5)]])
    ref = torch.tensor([[math.log(2.0), math.log(0.5)]])
    # d = log 2: 2 - log 2 - 1 = 0.306853; identical log-probs: 0
    assert kl_k3(logp, ref)[0].tolist() == pytest.approx([1.0 - math.log(2.0), 0.0], abs=1e-6)


def test_token_logprobs_with_temperature() -> None:
    logits = torch.tensor([[[2.0, 0.0, 0.0]]])
    # temperature 2: softmax([1, 0, 0]) -> p0 = e / (e + 2)
    got = token_logprobs(logits, torch.tensor([[0]]), temperature=2.0)
    assert got.item() == pytest.approx(math.log(math.e / (math.e + 2)), abs=1e-6)


# -- aggregation --------------------------------------------------------------------------------

PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 100.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # the 100 is an environment token


def test_aggregate_grpo_sequence_mean_then_batch_mean() -> None:
    got = aggregate(PER_TOKEN, MASK, "grpo", n_seqs=2, n_tokens=5, norm_len=4)
    assert got.item() == pytest.approx((6 / 3 + 9 / 2) / 2)  # 3.25


def test_aggregate_dapo_token_mean() -> None:
    got = aggregate(PER_TOKEN, MASK, "dapo", n_seqs=2, n_tokens=5, norm_len=4)
    assert got.item() == pytest.approx(15 / 5)


def test_aggregate_dr_grpo_constant_length() -> None:
    got = aggregate(PER_TOKEN, MASK, "dr_grpo", n_seqs=2, n_tokens=5, norm_len=4)
    assert got.item() == pytest.approx(15 / (2 * 4))


@pytest.mark.parametrize("mode", ["grpo", "dapo", "dr_grpo"])
def test_micro_batches_sum_to_the_mini_batch_loss(mode: str) -> None:
    whole = aggregate(PER_TOKEN, MASK, mode, n_seqs=2, n_tokens=5, norm_len=4)  # type: ignore[arg-type]
    parts = sum(
        aggregate(PER_TOKEN[i : i + 1], MASK[i : i + 1], mode, n_seqs=2, n_tokens=5, norm_len=4)  # type: ignore[arg-type]
        for i in range(2)
    )
    assert float(parts) == pytest.approx(float(whole))


# -- rollouts to loss sequences -----------------------------------------------------------------


def _rollout(reward: float, turns: list[Turn], prompt_ids: list[int] | None = None) -> Rollout:
    return Rollout(
        task_id="t", prompt="p", prompt_ids=prompt_ids or [1, 2], turns=turns, reward=reward
    )


def test_samples_mask_environment_tokens_and_truncated_rollouts(tmp_path: object) -> None:
    from leanrl.policy import PolicyConfig
    from leanrl.train.common import RunDir
    from leanrl.train.grpo import GRPOConfig
    from leanrl.train.grpo.engine import GRPOEngine

    cfg = GRPOConfig(policy=PolicyConfig(model="x"), group_size=2, scale_rewards="none")
    engine = GRPOEngine(cfg, RunDir(str(tmp_path)))
    multi = _rollout(
        1.0,
        [
            Turn(completion="a", completion_ids=[10, 11], logprobs=[-0.1, -0.2], feedback_ids=[90]),
            Turn(completion="b", completion_ids=[12], logprobs=[-0.3], finish_reason="stop"),
        ],
    )
    cut = _rollout(
        0.0,
        [
            Turn(
                completion="c",
                completion_ids=[13, 14],
                logprobs=[-1.0, -1.0],
                finish_reason="length",
            )
        ],
    )
    s1, s2 = engine.make_samples([[multi, cut]])
    assert s1.prompt == [1, 2]
    assert s1.resp == [10, 11, 90, 12]
    assert s1.mask == [1, 1, 0, 1]  # the feedback token is context, not loss
    assert s1.old[:2] == [-0.1, -0.2] and math.isnan(s1.old[2]) and s1.old[3] == -0.3
    assert s1.adv == pytest.approx(0.5) and s2.adv == pytest.approx(-0.5)
    assert s2.mask == [0, 0]  # truncated: masked (DAPO overlong filtering), reward still counted

    keep = GRPOConfig(policy=PolicyConfig(model="x"), group_size=2, mask_truncated=False)
    _, s2b = GRPOEngine(keep, RunDir(str(tmp_path))).make_samples([[multi, cut]])
    assert s2b.mask == [1, 1]


def test_dual_clip_caps_only_negative_advantages() -> None:
    # ratios 5 and 1.5 with A = -1 and A = +1, dual clip c = 3 (Ye et al. 2020)
    logp = torch.log(torch.tensor([[5.0, 1.5], [5.0, 1.5]])).requires_grad_(True)
    adv = torch.tensor([-1.0, 1.0])
    loss, clipped = clipped_token_loss(logp, torch.zeros(2, 2), adv, 0.2, 0.28, dual_clip=3.0)
    # A=-1: r=5 -> -min(-5, -1.28) = 5, capped at 3·|A| = 3; r=1.5 -> 1.5 (below the cap)
    # A=+1: r=5 -> -1.28 (ordinary clip); r=1.5 -> -1.28: dual clip never touches A > 0
    assert loss.flatten().tolist() == pytest.approx([3.0, 1.5, -1.28, -1.28], abs=1e-6)
    assert clipped.tolist() == [[1.0, 0.0], [1.0, 1.0]]
    loss.sum().backward()
    assert logp.grad is not None
    assert logp.grad[0, 0] == 0.0 and logp.grad[0, 1] != 0.0  # a capped token has no gradient
    plain, _ = clipped_token_loss(logp.detach(), torch.zeros(2, 2), adv, 0.2, 0.28)
    assert plain[0, 0] == pytest.approx(5.0)  # without dual clip the loss grows with ρ
