"""ES run state: bitwise replay from base + history (+ checkpoints), resume, skipped updates."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
from test_es_learning import toy_config

from leanrl.errors import ConfigError
from leanrl.train.common import RunDir
from leanrl.train.es import ESTrainer
from leanrl.train.es.history import DIGEST_KEY, ESHistory, HistoryMeta, master_equal, replay
from leanrl.train.es.weights import MASTER_FILE


def run_steps(cfg, n: int) -> ESTrainer:  # type: ignore[no-untyped-def]
    """Start a trainer and run ``n`` iterations without closing the history (like a kill)."""
    from leanrl.runtime import run_sync

    tr = ESTrainer(cfg)

    async def go() -> None:
        await tr.start()
        for _ in range(n):
            await tr.step()
        await tr.close()

    run_sync(go())
    return tr


@pytest.fixture(scope="module")
def full_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> ESTrainer:
    out = tmp_path_factory.mktemp("es") / "full"
    tr = ESTrainer(toy_config(tiny_model_dir, out, steps=5, save_every=2))
    tr.train_sync()
    return tr


def test_replay_is_bitwise_identical(full_run: ESTrainer) -> None:
    run = full_run.run.path
    live = full_run.weights.master
    assert [s for s, _ in full_run.run.checkpoints()] == [2, 4, 5]
    # from the base model + all 5 records
    _, _, w = replay(run, use_checkpoints=False)
    assert master_equal(live, w.master)
    # from checkpoint-4 + record 5
    _, _, w = replay(run)
    assert master_equal(live, w.master)
    # and an earlier iteration equals the checkpoint written live at that iteration
    _, _, w3 = replay(run, upto=4, use_checkpoints=False)
    _, _, c4 = replay(run, upto=4)
    assert master_equal(w3.master, c4.master)
    assert not master_equal(w3.master, live)
    with pytest.raises(ConfigError, match="has 5 iterations"):
        replay(run, upto=9)


def test_history_is_small_and_metrics_complete(full_run: ESTrainer) -> None:
    run = full_run.run.path
    recs = ESHistory(run / "es_history.bin").open()
    assert [r.iteration for r in recs] == [1, 2, 3, 4, 5]
    assert all(len(r.coeffs) == 6 for r in recs)  # population 6
    rows = full_run.run.metrics()
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    keys = {
        "reward_mean",
        "reward_std",
        "reward_max",
        "pass_rate",
        "skipped",
        "update_norm",
        "time_perturb_s",
        "time_score_s",
        "time_update_s",
        "tokens_per_s",
    }
    assert keys <= set(rows[0])
    assert all(r["update_norm"] > 0 and r["skipped"] is False for r in rows)
    state = json.loads((run / "checkpoint-5" / "trainer_state.json").read_text())
    assert state["step"] == 5 and state["trainer"] == "es"


def test_checkpoint_is_a_loadable_hf_model(full_run: ESTrainer) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ck = full_run.run.path / "checkpoint-5"
    model = AutoModelForCausalLM.from_pretrained(ck)
    AutoTokenizer.from_pretrained(ck)
    for name, p in model.named_parameters():
        assert p.detach().equal(full_run.weights.master[name]), name


def test_resume_after_kill_loses_nothing(
    full_run: ESTrainer, tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "killed"
    # "killed" after iteration 3: checkpoint-2 exists, iteration 3 lives only in the history
    run_steps(toy_config(tiny_model_dir, out, steps=5, save_every=2), 3)
    assert [s for s, _ in ESTrainer(toy_config(tiny_model_dir, out)).run.checkpoints()] == [2]
    # killed while writing iteration 4: its metrics line is out, its history record torn
    with (out / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 4, "reward_mean": 123.0}) + "\n")
    with (out / "es_history.bin").open("ab") as f:
        f.write(b"ESIT\x04\x00\x00")
    resumed = ESTrainer(toy_config(tiny_model_dir, out, steps=5, save_every=2))
    with caplog.at_level(logging.INFO, logger="leanrl"):
        rows = resumed.train_sync()
    said = f"resuming from {out / 'checkpoint-2'} (iteration 2), then 1 iteration(s) replayed"
    assert [m for m in caplog.messages if m.startswith(said)], caplog.messages
    assert [r["step"] for r in rows] == [4, 5]
    assert master_equal(full_run.weights.master, resumed.weights.master)
    assert [r["step"] for r in resumed.run.metrics()] == [1, 2, 3, 4, 5]
    a = [r["reward_mean"] for r in full_run.run.metrics()]
    b = [r["reward_mean"] for r in resumed.run.metrics()]
    assert a == b


def test_resume_needs_same_config(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "r"
    run_steps(toy_config(tiny_model_dir, out, steps=2), 1)
    with pytest.raises(ConfigError, match="different config"):
        ESTrainer(toy_config(tiny_model_dir, out, sigma=0.5)).train_sync()


@pytest.mark.slow
def test_resume_with_more_steps_and_another_scorer(
    full_run: ESTrainer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A run of 2 steps, extended to 3 and continued by worker processes instead of in-process,
    ends with exactly the weights and rewards of the uninterrupted in-process run."""
    out = tmp_path / "longer"
    ESTrainer(toy_config(tiny_model_dir, out, steps=2, save_every=2)).train_sync()
    more = toy_config(
        tiny_model_dir, out, steps=3, save_every=2, scorer={"backend": "processes", "workers": 2}
    )
    tr = ESTrainer(more)
    assert [r["step"] for r in tr.train_sync()] == [3]
    _, _, ref = replay(full_run.run.path, upto=3, use_checkpoints=False)
    assert master_equal(ref.master, tr.weights.master)
    a = [r["reward_mean"] for r in full_run.run.metrics()[:3]]
    assert [r["reward_mean"] for r in tr.run.metrics()] == a


def test_replay_never_changes_the_run_folder(full_run: ESTrainer, tmp_path: Path) -> None:
    out = tmp_path / "ro"
    shutil.copytree(full_run.run.path, out)
    with (out / "es_history.bin").open("ab") as f:
        f.write(b"ESIT\x06\x00")  # a torn record, as a kill mid-append leaves it
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    _, _, w = replay(out)
    assert master_equal(full_run.weights.master, w.master)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    # no history: an error, and replay does not create one
    (out / "es_history.bin").unlink()
    with pytest.raises(ConfigError, match="does not exist"):
        replay(out)
    assert not (out / "es_history.bin").exists()


def _relabel_device(run: Path, device_type: str) -> None:
    """Rewrite a run's history as if its noise had been drawn on ``device_type``."""
    old = ESHistory(run / "es_history.bin")
    records = old.open(read_only=True)
    assert old.meta is not None
    (run / "es_history.bin").unlink()
    new = ESHistory(run / "es_history.bin")
    new.open(HistoryMeta(old.meta.run_seed, device_type, old.meta.dtype))
    for r in records:
        new.append(r)
    # the header is part of the hash chain: a run that really drew CUDA noise has checkpoints
    # recording the digests of *its* history
    for step, ck in RunDir(run).checkpoints():
        state = json.loads((ck / "trainer_state.json").read_text())
        state[DIGEST_KEY] = new.digest(step)
        (ck / "trainer_state.json").write_text(json.dumps(state))


def test_other_device_kind_is_refused(full_run: ESTrainer, tmp_path: Path) -> None:
    """A history drawn with CUDA noise must not be resumed or replayed with CPU noise."""
    out = tmp_path / "gpu-run"
    shutil.copytree(full_run.run.path, out)
    meta = ESHistory(out / "es_history.bin")
    meta.open(read_only=True)
    assert meta.meta == HistoryMeta(0, "cpu", "float32")  # what the CPU run recorded
    _relabel_device(out, "cuda")
    cfg = full_run.config.model_copy(update={"out": out, "steps": 6})
    with pytest.raises(ConfigError, match=r"noise drawn on 'cuda'.*'cpu'"):
        ESTrainer(cfg).train_sync()
    with pytest.raises(ConfigError, match="allow_other_device"):
        replay(out, device="cpu")
    _, _, w = replay(out, device="cpu", allow_other_device=True, use_checkpoints=False)
    assert master_equal(full_run.weights.master, w.master)  # (only because it *was* CPU noise)


def test_checkpoint_without_history_is_refused(full_run: ESTrainer, tmp_path: Path) -> None:
    out = tmp_path / "copy"
    shutil.copytree(full_run.run.path, out)
    (out / "es_history.bin").unlink()
    cfg = full_run.config.model_copy(update={"out": out})
    with pytest.raises(ConfigError, match="history"):
        ESTrainer(cfg).train_sync()


def test_equal_scores_skip_the_update(tiny_model_dir: Path, tmp_path: Path) -> None:
    tr = ESTrainer(toy_config(tiny_model_dir, tmp_path / "c", steps=2, mode="constant"))
    rows = tr.train_sync()
    assert [r["skipped"] for r in rows] == [True, True]
    assert all(r["update_norm"] == 0.0 and r["reward_std"] == 0.0 for r in rows)
    recs = ESHistory(tmp_path / "c" / "es_history.bin").open()
    assert [(r.skipped, r.coeffs) for r in recs] == [(True, ()), (True, ())]
    _, _, base = replay(tmp_path / "c", upto=0)
    assert master_equal(base.master, tr.weights.master)


def test_bf16_checkpoint_keeps_exact_master(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = toy_config(tiny_model_dir, tmp_path / "bf", steps=2, save_every=1)
    cfg = cfg.model_copy(update={"policy": cfg.policy.model_copy(update={"dtype": "bfloat16"})})
    tr = ESTrainer(cfg)
    tr.train_sync()
    assert (tmp_path / "bf" / "checkpoint-2" / MASTER_FILE).is_file()
    _, _, w = replay(tmp_path / "bf")  # from checkpoint-2's fp32 master
    assert master_equal(tr.weights.master, w.master)
    _, _, w0 = replay(tmp_path / "bf", use_checkpoints=False)
    assert master_equal(tr.weights.master, w0.master)
