"""The GRPO objective variants of issue 25 against direct, obviously-correct implementations.

- PKPO's pass@k transform (``advantage = "pass_at_k"``) against brute force over every k-subset
  of small synthetic groups, binary and graded, ties included; its gradient estimator against
  the exact gradient of max@k of a small categorical policy (every n-tuple enumerated).
- The unlikeliness reward against hand values.
- GSPO, CISPO and the truncated/masked IS correction: loss values and autograd gradients against
  direct per-sequence / per-token implementations.
- The default objective bit for bit as before; config from Python, TOML, the CLI and TRL's names;
  one engine step and a tiny training run with each option.
"""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from leanrl.train.grpo.advantages import (
    max_at_k_estimate,
    pass_at_k_advantages,
    pass_at_k_rewards,
    unlikeliness_rewards,
)
from leanrl.train.grpo.loss import (
    aggregate,
    clipped_token_loss,
    is_correction_weights,
    policy_loss,
)

# -- PKPO: brute force over every k-subset ------------------------------------------------------


def _brute_transformed(values: list[float], k: int) -> list[float]:
    """r̃_i = n/k · mean over the k-subsets S of max(S), counting only the S that hold i
    (PKPO's s_i, scaled by n/k), by enumerating every subset."""
    n = len(values)
    subsets = list(itertools.combinations(range(n), k))
    return [
        n / k * sum(max(values[j] for j in s) for s in subsets if i in s) / len(subsets)
        for i in range(n)
    ]


def _brute_estimate(values: list[float], k: int) -> float:
    subsets = list(itertools.combinations(range(len(values)), k))
    return sum(max(values[j] for j in s) for s in subsets) / len(subsets)


def _groups() -> list[list[float]]:
    rng = random.Random(25)
    out = [[1.0, 0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]]  # binary
    out += [[rng.random() for _ in range(n)] for n in (2, 4, 6, 7)]  # graded
    out += [[0.5, 0.2, 0.5, 0.9, 0.2, 0.5]]  # graded with ties
    out += [[float(rng.random() < 0.3) for _ in range(8)]]  # binary, 8
    return out


@pytest.mark.parametrize("values", _groups())
def test_pass_at_k_rewards_match_brute_force(values: list[float]) -> None:
    for k in range(1, len(values) + 1):
        got = pass_at_k_rewards(values, k)
        assert got == pytest.approx(_brute_transformed(values, k), abs=1e-12), k
        # unbiasedness: the group mean of the transformed rewards is the max@k estimate
        est = _brute_estimate(values, k)
        assert sum(got) / len(got) == pytest.approx(est, abs=1e-12)
        assert max_at_k_estimate(values, k) == pytest.approx(est, abs=1e-12)


def test_binary_pass_at_k_closed_forms() -> None:
    """0/1 rewards: pass@k = 1 - C(n-c,k)/C(n,k) (Chen et al. 2021); PKPO's per-sample rewards
    are k/n (correct) and k/n · ρ(n-1, c, k-1) (wrong), i.e. 1 and ρ(n-1, c, k-1) after × n/k."""
    values = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    n, c = len(values), 2
    for k in range(1, n + 1):
        assert max_at_k_estimate(values, k) == pytest.approx(
            1 - math.comb(n - c, k) / math.comb(n, k)
        )
        wrong = 1 - math.comb(n - 1 - c, k - 1) / math.comb(n - 1, k - 1)
        want = [1.0 if v else wrong for v in values]
        assert pass_at_k_rewards(values, k) == pytest.approx(want)


@pytest.mark.parametrize("values", _groups())
def test_leave_one_out_baselines_match_brute_force(values: list[float]) -> None:
    n = len(values)
    r = torch.tensor([values])
    for k in range(1, n + 1):
        r_t = _brute_transformed(values, k)
        # loo_minus_one: the others' max@(k-1) (k = 1: the others' max@1, i.e. loo)
        j = max(k - 1, 1)
        want = [r_t[i] - _brute_estimate(values[:i] + values[i + 1 :], j) for i in range(n)]
        got = pass_at_k_advantages(r, k, "loo_minus_one", "none")[0].tolist()
        assert got == pytest.approx(want, abs=1e-6), k
        if k >= 2:  # the same, written as PKPO's Σ_{S∋i} (max S - max S∖{i})
            subsets = list(itertools.combinations(range(n), k))
            alt = [
                n
                / k
                * sum(
                    max(values[q] for q in s) - max(values[q] for q in s if q != i)
                    for s in subsets
                    if i in s
                )
                / len(subsets)
                for i in range(n)
            ]
            assert got == pytest.approx(alt, abs=1e-6)
        if k <= n - 1:
            want = [r_t[i] - _brute_estimate(values[:i] + values[i + 1 :], k) for i in range(n)]
            got = pass_at_k_advantages(r, k, "loo", "none")[0].tolist()
            assert got == pytest.approx(want, abs=1e-6)
        got = pass_at_k_advantages(r, k, "none", "none")[0].tolist()
        assert got == pytest.approx(r_t, abs=1e-6)


@pytest.mark.parametrize("baseline", ["none", "loo", "loo_minus_one"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_pass_at_k_gradient_is_unbiased(baseline: str, k: int) -> None:
    """E over every n-tuple of attempts of k/n · Σ_i A_i ∇log p(x_i) is exactly ∇ max@k of a
    categorical policy over four graded outcomes, for every baseline (n = 4 attempts)."""
    n = 4
    if baseline == "loo" and k > n - 1:
        pytest.skip("loo needs k <= n - 1")
    theta = torch.tensor([0.3, -0.2, 0.5, 0.0], dtype=torch.float64, requires_grad=True)
    reward = [0.0, 0.3, 1.0, 0.6]
    p = torch.softmax(theta, 0)
    # exact max@k: every k-tuple, its probability times its best reward
    terms: list[Any] = [
        math.prod(p[x] for x in xs) * max(reward[x] for x in xs)
        for xs in itertools.product(range(4), repeat=k)
    ]
    exact = torch.stack(terms).sum()
    (want,) = torch.autograd.grad(exact, theta)
    logp = torch.log_softmax(theta, 0)
    est = torch.zeros((), dtype=torch.float64)
    for xs in itertools.product(range(4), repeat=n):
        vals = torch.tensor([[reward[x] for x in xs]], dtype=torch.float64)
        adv = pass_at_k_advantages(vals, k, baseline, "none")[0].to(torch.float64)  # type: ignore[arg-type]
        weight = math.prod(float(p.detach()[x]) for x in xs)
        est = est + weight * k / n * sum(adv[i] * logp[x] for i, x in enumerate(xs))
    (got,) = torch.autograd.grad(est, theta)
    assert torch.allclose(got, want, atol=1e-6), (got, want)


def test_pass_at_k_advantages_scale_and_uncounted() -> None:
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0, 1.0]])
    counted = torch.tensor([[True, True, False, True, True], [True] * 5])
    adv = pass_at_k_advantages(r, 2, "loo_minus_one", "none", counted=counted)
    # the uncounted attempt gets 0 and the others are the 4-attempt group's advantages
    alone = pass_at_k_advantages(torch.tensor([[1.0, 0.0, 1.0, 0.0]]), 2, "loo_minus_one", "none")
    assert adv[0, 2] == 0.0
    assert adv[0, [0, 1, 3, 4]].tolist() == pytest.approx(alone[0].tolist())
    assert adv[1].tolist() == [0.0] * 5  # all equal: no signal with a baseline
    # without a baseline an all-equal group keeps its transformed rewards, not divided by std 0
    flat = pass_at_k_advantages(r[1:], 2, "none", "group")
    assert flat[0].tolist() == pytest.approx([1.0] * 5)
    scaled = pass_at_k_advantages(r, 2, "loo_minus_one", "group", counted=counted)
    a = alone[0]
    assert scaled[0, [0, 1, 3, 4]].tolist() == pytest.approx((a / (a.std() + 1e-4)).tolist())
    # fewer counted attempts than k: k drops to what the group has
    few = pass_at_k_advantages(torch.tensor([[1.0, 0.0]]), 5, "loo_minus_one", "none")
    assert few[0].tolist() == pytest.approx(
        pass_at_k_advantages(torch.tensor([[1.0, 0.0]]), 2, "loo_minus_one", "none")[0].tolist()
    )


def test_unlikeliness_reward_by_hand() -> None:
    r = torch.tensor([[1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    lp = torch.tensor([[-1.0, -3.0, -2.0, -0.5], [-1.0, -1.0, -2.0, -0.1]])
    got = unlikeliness_rewards(r, lp, 0.25)
    # ranks by likelihood (0 = least likely): [2, 0, 1, 3]; ties share their mean rank
    assert got[0].tolist() == pytest.approx([1 - 0.25 * 2 / 4, 1.0, 0.0, 1 - 0.25 * 3 / 4])
    assert got[1].tolist() == pytest.approx([1 - 0.25 * 1.5 / 4] * 2 + [1.0, 1 - 0.25 * 3 / 4])
    counted = torch.tensor([[True, False, True, True], [True] * 4])
    part = unlikeliness_rewards(r, lp, 0.25, counted)  # ranks among the 3 counted: [1, -, 0, 2]
    assert part[0].tolist() == pytest.approx([1 - 0.25 / 3, 1.0, 0.0, 1 - 0.25 * 2 / 3])


# -- GSPO, CISPO, IS correction against direct implementations ----------------------------------


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    logp = (-torch.rand(3, 5, generator=g, dtype=torch.float64) * 2).requires_grad_()
    old = (logp.detach() + torch.randn(3, 5, generator=g, dtype=torch.float64) * 0.3).clone()
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 1, 0]], dtype=torch.float64)
    adv = torch.tensor([1.0, -0.5, 0.7], dtype=torch.float64)
    return logp, old, mask, adv


def test_gspo_loss_and_gradient_match_the_paper() -> None:
    """GSPO (Zheng et al. 2025, eq. 5): J = 1/G Σ_i min(s_i A_i, clip(s_i) A_i), s_i =
    exp(mean_t(logp - old)); with loss_agg = "grpo" the trainer's loss is -J, gradient too. The
    GSPO-token form sg[s_i]·π/sg[π] gives the same gradient."""
    logp, old, mask, adv = _batch()
    eps_lo, eps_hi = 0.05, 0.08
    per_tok, clipped, w, _ = policy_loss(
        logp, old, adv, mask, level="sequence", eps_low=eps_lo, eps_high=eps_hi
    )
    assert w is None
    got = aggregate(per_tok, mask, "grpo", n_seqs=3, n_tokens=0, norm_len=1)
    (g_got,) = torch.autograd.grad(got, logp)

    def direct(token_form: bool) -> torch.Tensor:
        total = torch.zeros((), dtype=torch.float64)
        for i in range(3):
            idx = mask[i] > 0
            s = torch.exp((logp[i][idx] - old[i][idx]).mean())
            if token_form:  # per token, sg[s]·π/sg[π], then the sequence mean
                si = s.detach() * torch.exp(logp[i][idx] - logp[i][idx].detach())
                lo, hi = si * adv[i], torch.clamp(si, 1 - eps_lo, 1 + eps_hi) * adv[i]
                total = total + torch.minimum(lo, hi).mean()
            else:
                lo, hi = s * adv[i], torch.clamp(s, 1 - eps_lo, 1 + eps_hi) * adv[i]
                total = total + torch.minimum(lo, hi)
        return -total / 3

    want = direct(False)
    assert float(got.detach()) == pytest.approx(float(want.detach()), abs=1e-12)
    for form in (False, True):
        (g_want,) = torch.autograd.grad(direct(form), logp)
        assert torch.allclose(g_got, g_want, atol=1e-12)
    # the clip acts on the sequence: a sequence is clipped on all its tokens or none
    for i in range(3):
        vals = clipped[i][mask[i] > 0].unique()
        assert len(vals) == 1


def test_cispo_loss_and_gradient_match_minimax() -> None:
    """CISPO (MiniMax-M1): J = 1/Σ|o_i| Σ_i Σ_t sg(clip(ρ_t, lo, hi)) A_i log π_θ(o_t); every
    token keeps its gradient, also where ρ is outside the clip (unlike PPO's clip)."""
    logp, old, mask, adv = _batch()
    lo, hi = 0.9, 1.1
    per_tok, clipped, _, _ = policy_loss(
        logp, old, adv, mask, loss="cispo", cispo_min=lo, cispo_max=hi
    )
    n_tok = int(mask.sum())
    got = aggregate(per_tok, mask, "dapo", n_seqs=3, n_tokens=n_tok, norm_len=1)
    total = torch.zeros((), dtype=torch.float64)
    hits = 0
    for i in range(3):
        for t in range(5):
            if mask[i, t]:
                rho = math.exp(float(logp.detach()[i, t]) - float(old[i, t]))
                hits += rho > hi or rho < lo
                total = total - min(max(rho, lo), hi) * adv[i] * logp[i, t]
    want = total / n_tok
    assert float(got.detach()) == pytest.approx(float(want.detach()), abs=1e-12)
    (g_got,) = torch.autograd.grad(got, logp)
    (g_want,) = torch.autograd.grad(want, logp)
    assert torch.allclose(g_got, g_want, atol=1e-12)
    assert hits > 0 and float((clipped * mask).sum()) == hits  # some weights were clipped
    assert bool((g_got[mask > 0] != 0).all())  # ... and still every token has a gradient
    # the PPO clip, by contrast, zeroes the gradient of some of the same tokens
    ppo, _, _, _ = policy_loss(logp, old, adv, mask, eps_low=0.1, eps_high=0.1)
    (g_ppo,) = torch.autograd.grad((ppo * mask).sum(), logp)
    assert bool((g_ppo[mask > 0] == 0).any())


@pytest.mark.parametrize(
    "mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
)
def test_is_correction_matches_a_direct_implementation(mode: str) -> None:
    """The loss is the clipped surrogate against π_old times w = π_old/μ (per token, or the
    product over the sequence), truncated at the cap or masked outside [floor, cap]."""
    logp, old, mask, adv = _batch()
    g = torch.Generator().manual_seed(9)
    mu = old + torch.randn(3, 5, generator=g, dtype=torch.float64) * 0.8  # a sloppy sampler
    cap, floor = 1.5, 0.5
    per_tok, _, w, hit = policy_loss(
        logp, old, adv, mask, sampler_logp=mu, is_mode=mode, is_cap=cap, is_floor=floor
    )
    assert w is not None and hit is not None
    plain, _ = clipped_token_loss(logp, old, adv, 0.2, 0.28)
    hits = 0
    for i in range(3):
        seq_w = math.exp(sum(float(old[i, t] - mu[i, t]) for t in range(5) if mask[i, t]))
        for t in range(5):
            if not mask[i, t]:
                continue
            raw = seq_w if mode.startswith("sequence") else math.exp(float(old[i, t] - mu[i, t]))
            if mode.endswith("truncate"):
                want_w, h = min(raw, cap), raw > cap
            else:
                h = raw > cap or raw < floor
                want_w = 0.0 if h else raw
            hits += h
            assert float(w[i, t]) == pytest.approx(want_w, rel=1e-12)
            assert float(hit[i, t]) == float(h)
            assert float(per_tok.detach()[i, t]) == pytest.approx(
                float(plain.detach()[i, t]) * want_w, abs=1e-12
            )
    assert hits > 0  # the case exercises the cap
    # the weight carries no gradient: the gradient is the weighted clipped-surrogate gradient
    (g_got,) = torch.autograd.grad((per_tok * mask).sum(), logp)
    (g_want,) = torch.autograd.grad((plain * w.detach() * mask).sum(), logp)
    assert torch.allclose(g_got, g_want)


def _old_clipped_token_loss(
    logp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, lo: float, hi: float, c: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """The clipped loss exactly as leanrl computed it before issue 25 (a verbatim copy)."""
    ratio = torch.exp(logp - old)
    a = adv.unsqueeze(-1)
    unclipped = ratio * a
    clipped = torch.clamp(ratio, 1.0 - lo, 1.0 + hi) * a
    loss = -torch.minimum(unclipped, clipped)
    was_clipped = clipped < unclipped
    if c is not None:
        cap = (-c * a).expand_as(loss)
        capped = (a < 0) & (loss > cap)
        loss = torch.where(capped, cap, loss)
        was_clipped = was_clipped | capped
    return loss, was_clipped.float()


@pytest.mark.parametrize("dual", [None, 3.0])
def test_default_objective_is_bitwise_unchanged(dual: float | None) -> None:
    g = torch.Generator().manual_seed(1)
    logp = -torch.rand(4, 7, generator=g) * 3
    old = logp + torch.randn(4, 7, generator=g) * 0.5
    mask = (torch.rand(4, 7, generator=g) > 0.3).float()
    adv = torch.randn(4, generator=g)
    a = logp.clone().requires_grad_()
    b = logp.clone().requires_grad_()
    got, got_clip, w, hit = policy_loss(a, old, adv, mask, dual_clip=dual)
    want, want_clip = _old_clipped_token_loss(b, old, adv, 0.2, 0.28, dual)
    assert w is None and hit is None
    assert torch.equal(got, want) and torch.equal(got_clip, want_clip)
    la = aggregate(got, mask, "dapo", n_seqs=4, n_tokens=int(mask.sum()), norm_len=1)
    lb = aggregate(want, mask, "dapo", n_seqs=4, n_tokens=int(mask.sum()), norm_len=1)
    la.backward()
    lb.backward()
    assert torch.equal(la, lb) and torch.equal(a.grad, b.grad)  # type: ignore[arg-type]
    # the default config selects exactly this path
    from leanrl.train.grpo import GRPOConfig

    cfg = GRPOConfig()
    assert (cfg.advantage, cfg.importance_sampling_level, cfg.loss, cfg.is_mode) == (
        "group", "token", "clip", "off",
    )  # fmt: skip


def test_is_correction_weights_reject_an_unknown_mode() -> None:
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="unknown importance-sampling correction"):
        is_correction_weights(x, x, torch.ones(1, 2), "token_clip", 2.0)


# -- configuration ------------------------------------------------------------------------------


def test_config_validation_and_trl_names() -> None:
    from pydantic import ValidationError

    from leanrl.train.grpo import GRPOConfig

    with pytest.raises(ValidationError, match="pass_k = 5 is more than 4"):
        GRPOConfig(advantage="pass_at_k", pass_k=5, group_size=4)
    with pytest.raises(ValidationError, match="'loo' baseline"):
        GRPOConfig(advantage="pass_at_k", pass_k=4, group_size=4, pass_k_baseline="loo")
    assert GRPOConfig(advantage="pass_at_k", pass_k=4, group_size=4).pass_k == 4
    assert GRPOConfig(pass_k=99, group_size=4).pass_k == 99  # unused unless pass_at_k
    with pytest.raises(ValidationError, match="set scale_rewards = 'none'"):
        GRPOConfig(advantage="pass_at_k", pass_k=2, pass_k_baseline="none")
    raw = GRPOConfig(advantage="pass_at_k", pass_k=2, pass_k_baseline="none", scale_rewards="none")
    assert raw.pass_k_baseline == "none"
    with pytest.raises(ValidationError):
        GRPOConfig(is_correction="token_clip")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        GRPOConfig(is_cap=0.5)
    # TRL's names
    trl: dict[str, Any] = {
        "importance_sampling_level": "sequence",
        "vllm_importance_sampling_correction": True,
        "vllm_importance_sampling_mode": "token_truncate",
        "vllm_importance_sampling_cap": 2.0,
    }
    cfg = GRPOConfig.model_validate(trl)
    assert (cfg.importance_sampling_level, cfg.is_correction, cfg.is_cap) == (
        "sequence", "token_truncate", 2.0,
    )  # fmt: skip
    flag = {"vllm_importance_sampling_correction": True}
    assert GRPOConfig.model_validate(flag).is_correction == "sequence_mask"  # TRL's default mode
    off = GRPOConfig.model_validate(
        {"vllm_importance_sampling_correction": False, "vllm_importance_sampling_mode": "x"}
    )
    assert off.is_correction == "off"
    cispo = GRPOConfig.model_validate({"loss_type": "cispo", "epsilon_high": 5.0})
    assert (cispo.loss, cispo.loss_agg, cispo.cispo_max, cispo.eps_high) == (
        "cispo", "dapo", 5.0, 0.28,
    )  # fmt: skip
    with pytest.raises(ValidationError, match="keep one"):
        GRPOConfig.model_validate(
            {"vllm_importance_sampling_mode": "token_mask", "is_correction": "token_mask"}
        )


def test_options_from_toml_and_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from leanrl.cli import main, parse_command
    from leanrl.config import merge
    from leanrl.train.grpo.cli import GRPOCommand

    toml = tmp_path / "objective.toml"
    toml.write_text(
        'advantage = "pass_at_k"\npass_k = 4\npass_k_baseline = "loo"\n'
        'importance_sampling_level = "sequence"\nloss = "cispo"\ncispo_max = 4.0\n'
        'is_correction = "token_mask"\nis_cap = 2.5\nis_floor = 0.125\n'
        "unlikeliness_beta = 0.5\ncispo_min = 0.1\n"
    )
    cfg = merge(GRPOCommand, toml, {"model": "m"}).to_grpo_config()
    assert (cfg.advantage, cfg.pass_k, cfg.pass_k_baseline) == ("pass_at_k", 4, "loo")
    assert (cfg.importance_sampling_level, cfg.loss, cfg.cispo_max, cfg.cispo_min) == (
        "sequence", "cispo", 4.0, 0.1,
    )  # fmt: skip
    assert (cfg.is_correction, cfg.is_cap, cfg.is_floor) == ("token_mask", 2.5, 0.125)
    assert cfg.unlikeliness_beta == 0.5
    argv = [
        "--model", "m", "--advantage", "unlikeliness", "--unlikeliness-beta", "0.1",
        "--importance-sampling-level", "sequence", "--loss", "cispo", "--cispo-max", "3",
        "--is-correction", "sequence_truncate", "--is-cap", "2", "--pass-k", "2",
        "--pass-k-baseline", "none",
    ]  # fmt: skip
    cli = parse_command(GRPOCommand, argv).to_grpo_config()
    assert (cli.advantage, cli.unlikeliness_beta, cli.importance_sampling_level) == (
        "unlikeliness", 0.1, "sequence",
    )  # fmt: skip
    assert (cli.loss, cli.cispo_max, cli.is_correction, cli.is_cap) == (
        "cispo", 3.0, "sequence_truncate", 2.0,
    )  # fmt: skip
    assert (cli.pass_k, cli.pass_k_baseline) == (2, "none")
    # flags override the file
    both = parse_command(GRPOCommand, ["--config", str(toml), "--pass-k", "2", "--model", "m"])
    assert both.to_grpo_config().pass_k == 2
    # a TRL flag on the command line names leanrl's
    assert main(["train", "grpo", "--vllm-importance-sampling-mode", "token_mask"]) == 2
    assert "leanrl: --is-correction" in capsys.readouterr().err


# -- the engine: one step per option, and a tiny run --------------------------------------------


def _engine(model: Path, out: Path, **kw: Any) -> Any:
    from leanrl.policy import PolicyConfig, SamplingConfig
    from leanrl.train.common import RunDir
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
        micro_batch_size=2,
    )
    base.update(kw)
    engine = GRPOEngine(GRPOConfig(**base), RunDir(out))
    engine.load(resumed=False)
    return engine


def _samples(engine: Any, advs: list[float]) -> list[Any]:
    """Three sequences whose ``old`` is the model's own log-prob (ρ = 1)."""
    from leanrl.train.grpo.data import _Sample

    tok = engine.tokenizer
    prompt = tok.encode("theorem t1 : 1 + 1 = 2 := by", add_special_tokens=False)
    body = tok.encode("  nlinarith [sq_nonneg x] omega simp rfl", add_special_tokens=False)
    masks = [[1, 1], [1] * 5, [1, 1, 1, 0, 0, 1, 1, 1, 1]]
    out = [
        _Sample(prompt=prompt[: 4 + k], resp=body[: len(m)], mask=m, old=[], adv=a)
        for k, (m, a) in enumerate(zip(masks, advs, strict=True))
    ]
    engine._fill_logprobs(out, "old")
    return out


def _batch_of(samples: list[Any]) -> Any:
    from leanrl.train.grpo.data import _Batch

    return _Batch(
        step=0, groups=[], kept=[], samples=samples, version=0, t_rollout=0.0, t_generate=0.0
    )


ADVS = [1.0, -0.5, 0.25]


def _dapo(samples: list[Any], tok_loss: Any) -> float:
    vals = [tok_loss(s, t) for s in samples for t, m in enumerate(s.mask) if m]
    return sum(vals) / len(vals)


def test_engine_is_correction_recomputes_old_and_weights_tokens(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """token_mask with cap 2: the sampler's log-probs are shifted so that w = π_old/μ is e^1 on
    the first token of each sequence (masked) and 1 elsewhere. π_old is recomputed, so ρ = 1
    and the loss is the mean of -A·w; the step reports the masked share."""
    engine = _engine(tiny_model_dir, tmp_path / "r", is_correction="token_mask", is_cap=2.0)
    samples = _samples(engine, ADVS)
    for s in samples:
        s.old = [o - (1.0 if t == 0 else 0.0) for t, o in enumerate(s.old)]  # sampler's μ
    stats = engine.train_step(_batch_of(samples))
    want = _dapo(samples, lambda s, t: -s.adv * (0.0 if t == 0 else 1.0))
    assert stats["loss"] == pytest.approx(want, rel=1e-4, abs=1e-6)
    assert stats["is_capped_frac"] == pytest.approx(3 / 14)
    assert stats["is_weight_mean"] == pytest.approx(11 / 14, rel=1e-4)
    assert samples[0].sampler is not None and samples[0].sampler[0] == pytest.approx(
        samples[0].old[0] - 1.0, abs=1e-4
    )  # the sampler's log-probs kept apart, old recomputed


@pytest.mark.parametrize(
    ("kw", "scale"),
    [
        ({"importance_sampling_level": "sequence"}, 1.1),  # GSPO: s_i = 1.1 inside the clip
        ({"loss": "cispo"}, None),
    ],
    ids=["gspo", "cispo"],
)
def test_engine_step_per_loss(
    tiny_model_dir: Path, tmp_path: Path, kw: dict[str, Any], scale: float | None
) -> None:
    engine = _engine(tiny_model_dir, tmp_path / "r", **kw)
    samples = _samples(engine, ADVS)
    true = [list(s.old) for s in samples]
    for s in samples:  # ρ = 1.1 on every token
        s.old = [o - math.log(1.1) for o in s.old]
    stats = engine.train_step(_batch_of(samples))
    if scale is not None:
        want = _dapo(samples, lambda s, t: -scale * s.adv)
    else:  # CISPO: -1.1 · A · log π(o_t), with the model's log-probs before the update
        lp = {id(s): row for s, row in zip(samples, true, strict=True)}
        want = _dapo(samples, lambda s, t: -1.1 * s.adv * lp[id(s)][t])
    assert stats["loss"] == pytest.approx(want, rel=1e-4, abs=1e-6)
    assert stats["clip_frac"] == 0.0 and stats["grad_norm"] > 0
    assert "is_capped_frac" not in stats  # correction off: no such metric


def _rollout(reward: float, lps: list[float]) -> Any:
    from leanrl.rollout import Rollout, Turn

    return Rollout(
        task_id="t",
        prompt="p",
        prompt_ids=[1, 2],
        turns=[
            Turn(
                completion="x",
                completion_ids=[5] * len(lps),
                logprobs=lps,
                finish_reason="stop",
            )
        ],
        reward=reward,
    )


def test_make_samples_uses_the_chosen_advantage(tmp_path: Path) -> None:
    from leanrl.errors import PolicyError
    from leanrl.policy import PolicyConfig
    from leanrl.train.common import RunDir
    from leanrl.train.grpo import GRPOConfig
    from leanrl.train.grpo.engine import GRPOEngine

    group = [_rollout(r, lps) for r, lps in
             [(1.0, [-1.0, -1.0]), (0.0, [-0.2]), (1.0, [-3.0, -2.0]), (0.0, [-0.1])]]  # fmt: skip
    rewards = torch.tensor([[1.0, 0.0, 1.0, 0.0]])

    def advs(**kw: Any) -> list[float]:
        cfg = GRPOConfig(policy=PolicyConfig(model="x"), group_size=4, **kw)
        return [s.adv for s in GRPOEngine(cfg, RunDir(str(tmp_path))).make_samples([group])]

    pk = advs(advantage="pass_at_k", pass_k=2, scale_rewards="none")
    assert pk == pytest.approx(pass_at_k_advantages(rewards, 2, "loo_minus_one", "none")[0])
    # unlikeliness: mean log-probs [-1, -0.2, -2.5, -0.1] rank [1, 2, 0, 3]
    un = advs(advantage="unlikeliness", unlikeliness_beta=0.5, scale_rewards="none")
    shaped = [1 - 0.5 / 4, 0.0, 1.0, 0.0]
    mean = sum(shaped) / 4
    assert un == pytest.approx([x - mean for x in shaped])
    group[1].turns[0].logprobs = [None]  # type: ignore[list-item]
    with pytest.raises(PolicyError, match="sampler's log-probs"):
        advs(advantage="unlikeliness")


@pytest.mark.parametrize(
    "kw",
    [
        {"advantage": "pass_at_k", "pass_k": 2},
        {"advantage": "unlikeliness", "dynamic_sampling": "off"},
        {"importance_sampling_level": "sequence", "eps_low": 3e-4, "eps_high": 4e-4,
         "loss_agg": "grpo"},
        {"loss": "cispo", "ppo_epochs": 2},
        {"is_correction": "sequence_truncate"},
    ],
    ids=["pass_at_k", "unlikeliness", "gspo", "cispo", "is_correction"],
)  # fmt: skip
def test_tiny_run_with_each_option(
    tiny_model_dir: Path, tmp_path: Path, kw: dict[str, Any]
) -> None:
    from tests.test_grpo_trainer import DigitEnv, _config, _train

    rows = _train(_config(tiny_model_dir, tmp_path / "run", steps=2, **kw), DigitEnv())
    assert len(rows) == 2
    last = rows[-1]
    trained = [r for r in rows if not r["skipped"]]
    assert trained and all(math.isfinite(r["loss"]) for r in trained)
    assert last["optimizer_steps"] == (2 if kw.get("ppo_epochs") == 2 else 1) or last["skipped"]
    if "is_correction" in kw:  # the hf sampler reproduces the trainer: weights of 1, none cut
        assert all("is_capped_frac" in r for r in rows)
        assert all(r["is_capped_frac"] == 0.0 for r in trained)
        assert all(r["is_weight_mean"] == pytest.approx(1.0, abs=1e-3) for r in trained)
