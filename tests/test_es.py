"""ES unit tests: noise, exact restore, the fp32 update, shaping, coefficients, history file."""

from __future__ import annotations

import math
import struct
from pathlib import Path

import pytest
import torch
from torch import nn

from leanrl.errors import ConfigError
from leanrl.train.es.history import (
    MAGIC_V1,
    ESHistory,
    HistoryMeta,
    HistoryRecord,
    draw_seeds,
    f32,
)
from leanrl.train.es.trainer import ESConfig, es_coefficients, population, shape_rewards
from leanrl.train.es.weights import ESWeights, noise, noise_seed
from leanrl.train.es.workers import Member


def two_layer(dtype: torch.dtype = torch.float32) -> nn.Module:
    """Two Linear layers of the same shape (the case a per-shape noise bug would miss)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16)).to(dtype)


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


# -- noise -----------------------------------------------------------------------------------------


def test_noise_reproducible_per_seed_and_tensor() -> None:
    a = noise(7, "0.weight", (16, 16), "cpu")
    b = noise(7, "0.weight", (16, 16), "cpu")
    assert a.dtype == torch.float32 and a.shape == (16, 16)
    assert torch.equal(a, b)
    assert not torch.equal(a, noise(8, "0.weight", (16, 16), "cpu"))
    # standard normal, roughly
    big = noise(1, "x", (100_000,), "cpu")
    assert abs(float(big.mean())) < 0.02 and abs(float(big.std()) - 1) < 0.02


def test_noise_independent_across_same_shaped_tensors() -> None:
    a = noise(7, "0.weight", (16, 16), "cpu").flatten()
    b = noise(7, "1.weight", (16, 16), "cpu").flatten()
    assert not torch.equal(a, b)
    corr = float(torch.corrcoef(torch.stack([a, b]))[0, 1])
    assert abs(corr) < 0.25  # 256 samples: independent streams, not shifted copies
    assert noise_seed(7, "0.weight") != noise_seed(7, "1.weight")
    # and the perturbation a model receives differs between its two same-shaped layers
    m = two_layer()
    w = ESWeights.from_model(m)
    base = snapshot(m)
    w.perturb(123, 1.0)
    d0 = m[0].weight - base["0.weight"]
    d1 = m[1].weight - base["1.weight"]
    assert not torch.allclose(d0, d1)


# -- perturb / restore -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_restore_is_bit_exact(dtype: torch.dtype) -> None:
    m = two_layer(dtype)
    w = ESWeights.from_model(m)
    base = snapshot(m)
    for seed in (1, 2, 3):
        w.perturb(seed, 1e-3)
        assert any(not torch.equal(p, base[n]) for n, p in m.named_parameters())
        w.restore()
        for n, p in m.named_parameters():
            assert torch.equal(p, base[n]), n


def test_subtracting_noise_is_not_exact() -> None:
    """Why restore re-casts the master: θ + σε - σε drifts from θ in floating point."""
    m = two_layer()
    theta = m[0].weight.detach().clone()
    eps = noise(5, "0.weight", theta.shape, "cpu")
    back = (theta + 1e-3 * eps) - 1e-3 * eps
    assert not torch.equal(back, theta)


def test_master_is_a_copy() -> None:
    m = two_layer()
    w = ESWeights.from_model(m)
    for n, p in m.named_parameters():
        assert w.master[n].data_ptr() != p.data_ptr()


# -- update ----------------------------------------------------------------------------------------


def test_update_matches_hand_computation() -> None:
    m = two_layer()
    base = snapshot(m)
    w = ESWeights.from_model(m)
    # population of 4 members, rewards by hand: z-scores of [1, 0, 0, 1] are [1, -1, -1, 1]
    members = [Member(11), Member(22), Member(33), Member(44)]
    z = shape_rewards([1.0, 0.0, 0.0, 1.0])
    assert z == [1.0, -1.0, -1.0, 1.0]
    alpha = 0.01
    coeffs = es_coefficients(members, z, alpha)
    assert coeffs == [(11, f32(0.0025)), (22, f32(-0.0025)), (33, f32(-0.0025)), (44, f32(0.0025))]
    norm = w.apply_update(coeffs)
    sq = 0.0
    for name, p in m.named_parameters():
        # independent computation in float64 with fresh generators
        expect = base[name].double()
        step = torch.zeros_like(expect)
        for seed, c in [(11, 1), (22, -1), (33, -1), (44, 1)]:
            g = torch.Generator().manual_seed(noise_seed(seed, name))
            eps = torch.randn(base[name].shape, generator=g, dtype=torch.float32).double()
            step += alpha / 4 * c * eps
        sq += float(step.square().sum())
        assert torch.allclose(w.master[name].double(), expect + step, atol=1e-7, rtol=0)
        assert torch.equal(p.detach(), w.master[name])  # fp32 model: params are the master
    assert norm == pytest.approx(sq**0.5, rel=1e-5)


def test_mirrored_coefficients_combine_pairs() -> None:
    members = [Member(5, 1), Member(5, -1), Member(9, 1), Member(9, -1)]
    z = shape_rewards([3.0, 1.0, 2.0, 2.0])
    assert z is not None
    coeffs = es_coefficients(members, z, alpha=0.4)
    # c_k = α/N (z+ - z-): seed 5 gets (z0 - z1)·0.1, seed 9 gets 0
    assert coeffs[0] == (5, f32(0.1 * (z[0] - z[1])))
    assert coeffs[1] == (9, 0.0)


def test_update_survives_in_bf16_model() -> None:
    """A ~1e-5 step is kept in the fp32 master even where bf16 cannot represent it."""
    m = two_layer(torch.bfloat16)
    base = {n: p.detach().float().clone() for n, p in m.named_parameters()}
    w = ESWeights.from_model(m)
    coeffs = [(3, f32(1e-5))]
    w.apply_update(coeffs)
    moved = w.master["0.weight"] - base["0.weight"]
    eps = noise(3, "0.weight", moved.shape, "cpu")
    assert torch.allclose(moved, 1e-5 * eps, atol=2e-7)
    # the naive bf16 update loses most of the step: the bf16 param barely changes
    naive = (m[0].weight.detach().clone().float().bfloat16() + (1e-5 * eps).bfloat16()).float()
    assert float((naive - base["0.weight"]).abs().gt(0).float().mean()) < 0.5
    assert float(moved.abs().gt(0).float().mean()) > 0.99


def test_update_of_many_members_is_accumulated_in_fp32() -> None:
    """30 small coefficients on a bf16 model: the fp32 master matches a float64 reference to
    fp32 precision, which accumulating Σ c_k ε_k (or θ) in bf16 misses by orders of magnitude."""
    m = two_layer(torch.bfloat16)
    w = ESWeights.from_model(m)
    base = {n: t.double() for n, t in w.master.items()}
    seeds = draw_seeds(1, 1, 30)
    coeffs = [(s, f32((-1) ** i * 1e-4 * (1 + i / 30))) for i, s in enumerate(seeds)]
    w.apply_update(coeffs)
    worst = 0.0
    for name, theta in w.master.items():
        ref = base[name].clone()
        for s, c in coeffs:
            ref += c * noise(s, name, theta.shape, "cpu").double()
        worst = max(worst, float((theta.double() - ref).abs().max()))
        # what a bf16 accumulator gives, for scale: the same sum, rounded to bf16 as it goes
        delta16 = torch.zeros(theta.shape, dtype=torch.bfloat16)
        for s, c in coeffs:
            delta16 += (c * noise(s, name, theta.shape, "cpu")).bfloat16()
        bf16_err = float((base[name] + delta16.double() - ref).abs().max())
        assert bf16_err > 1e-6, name  # bf16 accumulation is visibly wrong at this tolerance
    assert worst < 1e-7  # fp32: rounding of θ (|θ| < 0.3) and of the sum, nothing more


# -- shaping ---------------------------------------------------------------------------------------


def test_non_finite_rewards_are_refused() -> None:
    for bad in ([-math.inf] * 3, [0.0, math.nan, 1.0], [0.0, -math.inf, 1.0]):
        with pytest.raises(ConfigError, match="must return finite rewards"):
            shape_rewards(bad)
        with pytest.raises(ConfigError, match="finite"):
            shape_rewards(bad, "rank")


def test_equal_scores_give_no_update_signal() -> None:
    assert shape_rewards([0.0, 0.0, 0.0]) is None
    assert shape_rewards([1.0] * 30) is None
    assert shape_rewards([1.0, 1.0], "rank") is None


def test_rank_shaping() -> None:
    z = shape_rewards([10.0, -5.0, 1000.0, 0.0], "rank")
    assert z is not None
    # ranks 2, 0, 3, 1 -> equally spaced; the outlier 1000 counts like any best score
    zz = shape_rewards([2.0, 0.0, 3.0, 1.0])
    assert z == pytest.approx(zz)
    ties = shape_rewards([1.0, 1.0, 0.0], "rank")
    assert ties is not None and ties[0] == ties[1]
    with pytest.raises(ConfigError):
        shape_rewards([1.0, 2.0], "bogus")


def test_config_defaults_and_validation() -> None:
    cfg = ESConfig()
    assert (cfg.population, cfg.sigma, cfg.lr, cfg.greedy) == (30, 1e-3, 5e-4, True)
    with pytest.raises(ValueError, match="even population"):
        ESConfig(population=7, mirrored=True)
    members = population(ESConfig(population=6, mirrored=True), 1)
    assert [m.sign for m in members] == [1, -1] * 3
    assert len({m.seed for m in members}) == 3
    assert population(ESConfig(population=6), 1) == population(ESConfig(population=6), 1)
    assert population(ESConfig(population=6), 1) != population(ESConfig(population=6), 2)


# -- history file ----------------------------------------------------------------------------------


META = HistoryMeta(run_seed=0, device_type="cpu", dtype="float32")


def _recs() -> list[HistoryRecord]:
    seeds = draw_seeds(0, 1, 30)
    return [
        HistoryRecord(1, tuple((s, f32(0.001 * i)) for i, s in enumerate(seeds))),
        HistoryRecord(2, (), skipped=True),
        HistoryRecord(3, ((draw_seeds(0, 3, 1)[0], f32(-0.25)),)),
    ]


def test_history_roundtrip_size_and_torn_tail(tmp_path: Path) -> None:
    h = ESHistory(tmp_path / "h.bin")
    assert h.open(META) == []
    header = (tmp_path / "h.bin").stat().st_size
    recs = _recs()
    for r in recs:
        h.append(r)
    size = (tmp_path / "h.bin").stat().st_size
    # seeds are regenerated from (run seed, iteration): 16 + 4·K bytes, 136 for N = 30
    assert size == header + 136 + 16 + 20
    again = ESHistory(tmp_path / "h.bin")
    assert again.open() == recs and again.meta == META
    # a crash mid-append leaves a torn record (shorter than one record): it is cut off
    with (tmp_path / "h.bin").open("ab") as f:
        f.write(recs[0].encode(version=2, run_seed=0)[:40])
    h2 = ESHistory(tmp_path / "h.bin")
    assert h2.open() == recs
    assert (tmp_path / "h.bin").stat().st_size == size
    h2.append(HistoryRecord(4, ((draw_seeds(0, 4, 1)[0], 1.0),)))
    assert len(ESHistory(tmp_path / "h.bin").open()) == 4
    with pytest.raises(ValueError, match="expects iteration"):
        h2.append(HistoryRecord(9, ()))
    with pytest.raises(ValueError, match="draw_seeds"):  # seeds the file could not regenerate
        h2.append(HistoryRecord(5, ((5, 1.0),)))


def _corrupt(path: Path, offset: int) -> bytes:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))
    return bytes(data)


def test_corrupt_record_mid_file_is_refused_not_truncated(tmp_path: Path) -> None:
    path = tmp_path / "h.bin"
    h = ESHistory(path)
    h.open(META)
    for r in _recs():
        h.append(r)
    # flip a bit inside the coefficients of iteration 1: records 2 and 3 follow it
    first = len(path.read_bytes()) - 136 - 16 - 20
    data = _corrupt(path, first + 30)
    with pytest.raises(
        ConfigError, match=rf"corrupt at byte offset {first}\b.*truncate -s {first}"
    ):
        ESHistory(path).open()
    with pytest.raises(ConfigError, match="checksum mismatch in the record of iteration 1"):
        ESHistory(path).open(read_only=True)
    assert path.read_bytes() == data  # nothing was cut off


def test_corrupt_whole_last_record_is_refused(tmp_path: Path) -> None:
    """A whole-length last record with a bad CRC is corruption, not a torn write."""
    path = tmp_path / "h.bin"
    h = ESHistory(path)
    h.open(META)
    for r in _recs():
        h.append(r)
    data = _corrupt(path, len(path.read_bytes()) - 6)
    with pytest.raises(ConfigError, match="iteration 3"):
        ESHistory(path).open()
    assert path.read_bytes() == data


def test_read_only_open_never_writes(tmp_path: Path) -> None:
    path = tmp_path / "h.bin"
    with pytest.raises(ConfigError, match="does not exist"):
        ESHistory(path).open(read_only=True)
    assert not path.exists()
    h = ESHistory(path)
    h.open(META)
    for r in _recs():
        h.append(r)
    with path.open("ab") as f:
        f.write(b"ESIT\x04\x00")
    torn = path.read_bytes()
    assert ESHistory(path).open(read_only=True) == _recs()
    assert path.read_bytes() == torn  # the torn tail is ignored, not cut


def test_format_1_history_still_reads_and_appends(tmp_path: Path) -> None:
    path = tmp_path / "h.bin"
    recs = [HistoryRecord(1, ((5, 0.5), (6, -0.5))), HistoryRecord(2, (), skipped=True)]
    path.write_bytes(MAGIC_V1 + b"".join(r.encode(version=1) for r in recs))
    h = ESHistory(path)
    assert h.open() == recs and h.version == 1 and h.meta is None
    h.append(HistoryRecord(3, ((7, 0.25),)))
    assert ESHistory(path).open()[-1] == HistoryRecord(3, ((7, 0.25),))


def test_history_rejects_foreign_file(tmp_path: Path) -> None:
    (tmp_path / "h.bin").write_bytes(b"not a history file at all")
    with pytest.raises(ConfigError, match=r"not an ES history.*--out"):
        ESHistory(tmp_path / "h.bin").open()


def test_f32_and_seeds() -> None:
    assert f32(0.1) == struct.unpack("<f", struct.pack("<f", 0.1))[0]
    s = draw_seeds(3, 7, 30)
    assert len(set(s)) == 30 and all(0 <= x < 2**32 for x in s)
    assert s == draw_seeds(3, 7, 30) and s != draw_seeds(4, 7, 30)


def test_history_not_starting_at_1_says_how_to_fix(tmp_path: Path) -> None:
    path = tmp_path / "h.bin"
    path.write_bytes(MAGIC_V1 + HistoryRecord(2, ((5, 0.5),)).encode(version=1))
    with pytest.raises(ConfigError, match=r"iteration 2 where iteration 1 was expected.*truncate"):
        ESHistory(path).open()


def test_master_from_another_model_says_how_to_fix() -> None:
    w = ESWeights.from_model(two_layer())
    with pytest.raises(ConfigError, match=r"lack 2 of the model's tensors.*policy\.model"):
        w.load_master({"0.weight": w.master["0.weight"], "0.bias": w.master["0.bias"]})
    bad = dict(w.master)
    bad["0.bias"] = torch.zeros(3)
    with pytest.raises(ConfigError, match="different model"):
        w.load_master(bad)
