"""Low-rank ES perturbations (``perturbation = "lowrank"``, EGGROLL): the factors, exact
perturb/restore, the update against a direct Σ c_k·A_k·B_kᵀ/√r, its rank, and a low-rank run
that trains, resumes and replays bit for bit on CPU; other settings on resume are refused."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from test_es_learning import toy_config
from test_es_replay import run_steps

from leanrl.errors import ConfigError
from leanrl.train.es import ESTrainer
from leanrl.train.es.history import ESHistory, HistoryMeta, HistoryRecord, master_equal, replay
from leanrl.train.es.lowrank import (
    LowRankSpec,
    LowRankWeights,
    factors,
    lowrank_delta,
    make_weights,
)
from leanrl.train.es.weights import ESWeights, noise

LOWRANK = {"perturbation": "lowrank", "rank": 2}


def _net(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """Two linear layers (2-D weights, 1-D biases) and a norm (1-D weight and bias)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(12, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 9)
    )
    return net.to(dtype)


def _direct(seed: int, shape: tuple[int, ...], name: str, rank: int) -> torch.Tensor:
    """E = A·Bᵀ/√r with a plain float64 matmul: the obviously-correct reference."""
    a, b = factors(seed, name, shape, rank, "cpu")
    return (a.double() @ b.double().T) / math.sqrt(rank)


def _direct_sum(
    coeffs: list[tuple[int, float]], shape: tuple[int, ...], name: str, rank: int
) -> torch.Tensor:
    """Σ_k c_k·A_k·B_kᵀ/√r in float64."""
    out = torch.zeros(shape, dtype=torch.float64)
    for seed, c in coeffs:
        out += c * _direct(seed, shape, name, rank)
    return out


def test_factors_are_a_function_of_seed_and_name() -> None:
    a1, b1 = factors(7, "0.weight", (16, 12), 3, "cpu")
    a2, b2 = factors(7, "0.weight", (16, 12), 3, "cpu")
    assert a1.shape == (16, 3) and b1.shape == (12, 3) and a1.dtype == torch.float32
    assert torch.equal(a1, a2) and torch.equal(b1, b2)
    assert not torch.equal(factors(8, "0.weight", (16, 12), 3, "cpu")[0], a1)  # another seed
    assert not torch.equal(factors(7, "2.weight", (16, 12), 3, "cpu")[0], a1)  # another tensor
    e = lowrank_delta(7, "0.weight", (16, 12), 3, "cpu")
    assert torch.allclose(e.double(), _direct(7, (16, 12), "0.weight", 3), atol=1e-6)
    assert int(torch.linalg.matrix_rank(e)) == 3
    with pytest.raises(ValueError, match="2-D"):
        factors(7, "1.weight", (16,), 3, "cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_perturb_writes_the_lowrank_member_and_restore_is_bit_exact(dtype: torch.dtype) -> None:
    net = _net(dtype)
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    w = make_weights(net, lowrank=LowRankSpec(2, "frozen"))
    assert isinstance(w, LowRankWeights)
    sigma = 0.05
    w.perturb(11, -sigma)
    params = dict(net.named_parameters())
    for name, p in params.items():
        theta = w.master[name]
        if p.dim() == 2:
            want = (theta.double() - sigma * _direct(11, tuple(p.shape), name, 2)).to(dtype)
            assert torch.allclose(
                p.detach().float(), want.float(), atol=1e-5 if dtype == torch.float32 else 1e-2
            ), name
            assert not torch.equal(p.detach(), before[name]), name
        else:  # frozen: norms and biases keep their weights
            assert torch.equal(p.detach(), before[name]), name
    w.restore()
    for name, p in params.items():
        assert torch.equal(p.detach(), before[name]), name


def test_lowrank_other_full_perturbs_1d_tensors_with_full_noise() -> None:
    net, ref = _net(), _net()
    w = make_weights(net, lowrank=LowRankSpec(1, "full"))
    w.perturb(5, 0.1)
    full_w = make_weights(ref)
    full_w.perturb(5, 0.1)  # full-rank ES on the same weights
    mine, full = dict(net.named_parameters()), dict(ref.named_parameters())
    for name, p in mine.items():
        if p.dim() == 1:  # exactly the full-rank member's noise
            assert torch.equal(p.detach(), full[name].detach()), name
        else:
            assert not torch.equal(p.detach(), full[name].detach()), name
    # and the update moves them exactly as full-rank ES does, bit for bit
    coeffs = [(5, 0.5), (6, -0.25)]
    w.restore()
    w.apply_update(coeffs)
    full_w.restore()
    full_w.apply_update(coeffs)
    for name, t in w.master.items():
        if t.dim() == 1:
            assert torch.equal(t, full_w.master[name]), name
    assert w.numel() == sum(p.numel() for p in net.parameters())
    frozen = make_weights(_net(), lowrank=LowRankSpec(1, "frozen"))
    assert frozen.numel() == sum(p.numel() for p in net.parameters() if p.dim() == 2)


@pytest.mark.parametrize("other", ["frozen", "full"])
def test_update_is_the_direct_sum_and_has_rank_at_most_n_r(other: str) -> None:
    net = _net()
    with torch.no_grad():  # θ = 0 (2-D): the new master *is* the step, no rounding of θ + Δ
        for p in net.parameters():
            if p.dim() == 2:
                p.zero_()
    rank = 2
    w = make_weights(net, lowrank=LowRankSpec(rank, other))  # type: ignore[arg-type]
    before = {n: t.clone() for n, t in w.master.items()}
    coeffs = [(101, 0.25), (202, -0.5), (303, 0.125)]
    norm = w.apply_update(coeffs)
    sq = 0.0
    for name, theta in w.master.items():
        step = (theta - before[name]).double()
        if theta.dim() == 2:
            want = _direct_sum(coeffs, tuple(theta.shape), name, rank)
            assert torch.allclose(step, want, atol=1e-5), name
            # three rank-2 terms: rank exactly N·r = 6 here (both sides exceed it); the
            # tolerance sits above fp32 rounding (~1e-7), far below the 6th singular value
            got = int(torch.linalg.matrix_rank(step, rtol=1e-5))
            assert got == len(coeffs) * rank, name
        elif other == "full":
            want = torch.zeros(theta.shape, dtype=torch.float64)
            for s, c in coeffs:
                want += c * noise(s, name, theta.shape, "cpu").double()
            assert torch.allclose(step, want, atol=1e-6), name
        else:
            assert torch.equal(theta, before[name]), name  # frozen: never updated
        sq += float(step.square().sum())
        assert torch.equal(dict(net.named_parameters())[name].detach(), theta)  # cast into model
    assert norm == pytest.approx(math.sqrt(sq), rel=1e-5)


def test_update_bits_do_not_depend_on_the_thread_count() -> None:
    # a BLAS matmul may round differently with another thread count: the update must not
    results = []
    old = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            net = torch.nn.Linear(256, 192)
            torch.nn.init.zeros_(net.weight)
            w = make_weights(net, lowrank=LowRankSpec(4))
            w.apply_update([(s, 0.01 * (s % 7 - 3)) for s in range(1, 31)])
            results.append(w.master["weight"].clone())
    finally:
        torch.set_num_threads(old)
    assert torch.equal(results[0], results[1])


def test_full_mode_is_unchanged() -> None:
    assert type(make_weights(_net())) is ESWeights
    assert LowRankSpec.from_config(toy_config(Path("m"), Path("o"))) is None
    # a full-rank history header holds no low-rank keys: its bytes are what they always were
    head = json.loads(HistoryMeta(0, "cpu", "float32").to_json())
    assert head == {"run_seed": 0, "device_type": "cpu", "dtype": "float32"}
    meta = HistoryMeta(0, "cpu", "float32", LowRankSpec(4, "full"))
    assert json.loads(meta.to_json())["rank"] == 4


def test_config_refuses_lowrank_settings_where_they_mean_nothing() -> None:
    with pytest.raises(ValidationError, match="only apply to low-rank perturbations"):
        toy_config(Path("m"), Path("o"), rank=4)
    with pytest.raises(ValidationError, match="members_per_batch = 2 needs"):
        toy_config(
            Path("m"), Path("o"), scorer={"backend": "processes", "members_per_batch": 2}, **LOWRANK
        )
    with pytest.raises(ValidationError, match=r"scorer\.backend = 'vllm' needs lowrank_targets"):
        toy_config(
            Path("m"), Path("o"), scorer={"backend": "vllm"},
            policy={"model": "m", "backend": "vllm"}, **LOWRANK,
        )  # fmt: skip


@pytest.fixture(scope="module")
def lowrank_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> ESTrainer:
    out = tmp_path_factory.mktemp("es-lowrank") / "run"
    tr = ESTrainer(toy_config(tiny_model_dir, out, steps=3, save_every=2, **LOWRANK))
    tr.train_sync()
    return tr


def test_lowrank_run_trains_and_replays_bit_for_bit(lowrank_run: ESTrainer) -> None:
    run = lowrank_run.run.path
    live = lowrank_run.weights
    assert isinstance(live, LowRankWeights) and live.spec == LowRankSpec(2, "frozen")
    rows = lowrank_run.run.metrics()
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["update_norm"] > 0 for r in rows)
    assert all(0.0 <= r["gpu_idle_frac"] <= 1.0 for r in rows)  # pipelined scoring, as before
    hist = ESHistory(run / "es_history.bin")
    recs = hist.open(read_only=True)
    assert hist.meta is not None and hist.meta.lowrank == LowRankSpec(2, "frozen")
    # the record is the same few bytes as a full-rank one: 16 + 4 per seed
    body = recs[0].encode(hist.version, hist.meta.run_seed, b"\0" * 32)
    assert len(body) == 16 + 4 * 6
    for use_ckpt in (False, True):  # base + 3 records, and checkpoint-2 + record 3
        _, _, w = replay(run, use_checkpoints=use_ckpt)
        assert isinstance(w, LowRankWeights)
        assert master_equal(live.master, w.master)
    # the 1-D tensors were frozen: they are still the base model's
    _, _, base = replay(run, upto=0, use_checkpoints=False)
    for name, t in live.master.items():
        if t.dim() != 2:
            assert torch.equal(t, base.master[name]), name
    assert not master_equal(live.master, base.master)


def test_lowrank_resume_after_kill_equals_the_uninterrupted_run(
    lowrank_run: ESTrainer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "killed"
    run_steps(toy_config(tiny_model_dir, out, steps=3, save_every=2, **LOWRANK), 1)
    resumed = ESTrainer(toy_config(tiny_model_dir, out, steps=3, save_every=2, **LOWRANK))
    rows = resumed.train_sync()
    assert [r["step"] for r in rows] == [2, 3]
    assert master_equal(lowrank_run.weights.master, resumed.weights.master)
    a = [r["reward_mean"] for r in lowrank_run.run.metrics()]
    assert a == [r["reward_mean"] for r in resumed.run.metrics()]


def test_resume_or_replay_with_other_perturbation_settings_is_refused(
    lowrank_run: ESTrainer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(lowrank_run.run.path, out)
    (out / ".lock").unlink(missing_ok=True)
    cfg_before = (out / "config.json").read_text()
    for other in ({"perturbation": "lowrank", "rank": 3}, {}, {**LOWRANK, "lowrank_other": "full"}):
        tr = ESTrainer(toy_config(tiny_model_dir, out, steps=4, **other))
        with pytest.raises(ConfigError, match=r"was trained with perturbation lowrank \(rank 2"):
            tr.train_sync()
        assert (out / "config.json").read_text() == cfg_before  # refused before it was rewritten
    # replay follows the history's header, and refuses a config.json that disagrees with it
    cfg = json.loads(cfg_before)
    cfg.update(perturbation="full", rank=1)
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"config\.json says full"):
        replay(out)


def test_full_run_from_before_lowrank_still_resumes(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "old"
    run_steps(toy_config(tiny_model_dir, out, steps=2), 1)
    # config.json as a run written before the low-rank fields existed holds it
    cfg = json.loads((out / "config.json").read_text())
    for key in ("perturbation", "rank", "lowrank_other"):
        cfg.pop(key)
    (out / "config.json").write_text(json.dumps(cfg))
    rows = ESTrainer(toy_config(tiny_model_dir, out, steps=2)).train_sync()
    assert [r["step"] for r in rows] == [2]
    _, _, w = replay(out)
    assert type(w) is ESWeights


def test_history_header_round_trips_the_lowrank_settings(tmp_path: Path) -> None:
    h = ESHistory(tmp_path / "es_history.bin")
    h.open(HistoryMeta(0, "cpu", "float32", LowRankSpec(2)))
    h.append(HistoryRecord(1, ()))
    data = (tmp_path / "es_history.bin").read_bytes()
    assert b'"lowrank"' in data
    again = ESHistory(tmp_path / "es_history.bin")
    again.open(read_only=True)
    assert again.meta is not None and again.meta.lowrank == LowRankSpec(2, "frozen")


@pytest.mark.slow
def test_process_workers_score_the_same_lowrank_members(
    lowrank_run: ESTrainer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    # the workers rebuild θ from the base model + history with the source's low-rank spec: the
    # run they score is the in-process one, reward for reward and bit for bit
    scorer = {"backend": "processes", "workers": 1}
    cfg = toy_config(
        tiny_model_dir, tmp_path / "p", steps=3, save_every=2, scorer=scorer, **LOWRANK
    )
    tr = ESTrainer(cfg)
    tr.train_sync()
    a = [r["reward_mean"] for r in lowrank_run.run.metrics()]
    assert a == [r["reward_mean"] for r in tr.run.metrics()]
    assert master_equal(lowrank_run.weights.master, tr.weights.master)


def test_cli_trains_lowrank_and_resumes(
    tiny_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from leanrl.cli import main

    repo = Path(__file__).resolve().parent.parent
    monkeypatch.syspath_prepend(str(repo / "examples"))  # the example defines its environment
    out = tmp_path / "cli"
    args = ["train", "es", "--config", str(repo / "examples" / "train-es-cpu.toml")]
    args += ["--model", str(tiny_model_dir), "--out", str(out), "--population", "4"]
    args += ["--perturbation", "lowrank", "--rank", "4", "--save_every", "1"]
    assert main([*args, "--steps", "1"]) == 0
    assert main([*args, "--steps", "2"]) == 0  # resumes at iteration 1
    hist = ESHistory(out / "es_history.bin")
    assert len(hist.open(read_only=True)) == 2
    assert hist.meta is not None and hist.meta.lowrank == LowRankSpec(4, "frozen")
    assert json.loads((out / "config.json").read_text())["perturbation"] == "lowrank"
    monkeypatch.chdir(tmp_path)  # replay must find the example's environment module too
    _, _, w = replay(out, use_checkpoints=False)
    _, _, c = replay(out)  # from checkpoint-2
    assert master_equal(w.master, c.master)
    # the same folder with --rank 2 is refused, naming the run's settings
    assert main([*args[:-4], "--perturbation", "lowrank", "--rank", "2", "--steps", "3"]) == 2
    assert "--perturbation lowrank --rank 4" in capsys.readouterr().err


def test_lowrank_with_lora_perturbs_the_adapters_and_replays(
    own_tiny_model: Path, tmp_path: Path
) -> None:
    pytest.importorskip("peft", reason="LoRA needs peft (the lora extra)")
    out = tmp_path / "lora"
    cfg = toy_config(
        own_tiny_model, out, steps=2, population=4, sigma=0.05, alpha=0.1, save_every=1,
        lora={"rank": 4}, perturbation="lowrank", rank=1,
    )  # fmt: skip
    tr = ESTrainer(cfg)
    tr.train_sync()
    w = tr.weights
    assert isinstance(w, LowRankWeights)
    assert w.names() and all(".lora_A." in n or ".lora_B." in n for n in w.names())
    # the base weights are exactly the base model's: ES never touched them
    from transformers import AutoModelForCausalLM

    ref = dict(AutoModelForCausalLM.from_pretrained(own_tiny_model).named_parameters())
    live = {n: p for n, p in tr.model.named_parameters() if ".base_layer." in n}
    assert live
    for n, p in live.items():
        want = ref[n.replace("base_model.model.", "").replace(".base_layer.", ".")]
        assert torch.equal(p.detach(), want.detach()), n
    # iteration 1 moved each adapter matrix by exactly Σ_k c_k·A_k·B_kᵀ/√r of its own factors
    rec = ESHistory(out / "es_history.bin").open(read_only=True)[0]
    _, _, base = replay(out, upto=0, use_checkpoints=False)
    _, _, one = replay(out, upto=1, use_checkpoints=False)
    for name, t in one.master.items():
        want = _direct_sum(list(rec.coeffs), tuple(t.shape), name, 1)
        step = (t - base.master[name]).double()
        assert torch.allclose(step, want, atol=1e-5), name
    for use_ckpt in (False, True):
        _, _, again = replay(out, use_checkpoints=use_ckpt)
        assert again.equal(w.master)
