"""Faults, round three (issue 36), the trainers' side: a finished SFT run rerun does nothing (also
after a real kill past its last checkpoint), damaged checkpoints are quarantined and every
command that loads a leanrl checkpoint checks its checksums, and metrics rows that a damaged
line cost are named when they cannot be redone.

The models are the tiny ones tests/conftest.py makes on the spot; the kill is a real SIGTERM of
a real `leanrl train sft` process.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from leanrl.cli import main
from leanrl.errors import PolicyError
from leanrl.integrity import CHECKSUMS_FILE, content_problem
from leanrl.train.common import RunDir, write_checksums

REPO = Path(__file__).resolve().parent.parent


def _flip_a_byte(path: Path) -> None:
    """One bit flipped in the middle of the file (inside a safetensors file's tensor data, so
    its header and length stay right: structurally whole)."""
    with path.open("r+b") as f:
        f.seek(path.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x10]))


def _one_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run ``leanrl argv``; it must fail with exit code 2 and a single line on stderr."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("leanrl: error: ") and "\n" not in err, err
    return err


# -- 2: a finished SFT run, rerun ------------------------------------------------------------------

_STALL = """
import pathlib, sys, time
import leanrl.train.common as common

def stall(self, *a, **k):
    # Called once training is over and its last checkpoint is written: hold the process here
    # so the test's SIGTERM lands after the last checkpoint, never after a clean exit.
    pathlib.Path(sys.argv[1]).write_text("trained")
    time.sleep(600)

common.RunDir.plot = stall
from leanrl.cli import main
sys.exit(main(sys.argv[2:]))
"""


def test_a_finished_sft_run_killed_after_its_last_checkpoint_reruns_to_nothing(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's command: 6 steps end in the middle of Countdown's first epoch. A rerun
    trained one step more ("step 7/6"), wrote checkpoint-7 and pruned the real final checkpoint
    away (keep_checkpoints 1 here); after a SIGTERM past the last checkpoint the run ended at
    other weights. Now the rerun says the run is finished and changes nothing."""
    out = tmp_path / "run"
    argv = [
        "train",
        "sft",
        "--env",
        "countdown",
        "--env.taskset.split",
        "train",
        "--data.from_env",
        "--data.proof_column",
        "solution",
        "--env.harness.options",
        '{"style":"direct"}',
        "--model",
        str(tiny_model_dir),
        "--out",
        str(out),
        "--steps",
        "6",
        "--batch-size",
        "4",
        "--keep-checkpoints",
        "1",
    ]
    marker = tmp_path / "trained"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    proc = subprocess.Popen(
        [sys.executable, "-c", _STALL, str(marker), *argv],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 300
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), (proc.poll(), proc.stderr.read() if proc.stderr else "")
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGTERM  # killed, not a clean exit
    run = RunDir(out)
    assert [s for s, _ in run.checkpoints()] == [6]
    final = (out / "checkpoint-6" / "model.safetensors").read_bytes()
    metrics = (out / "metrics.jsonl").read_bytes()

    with caplog.at_level(logging.INFO, logger="leanrl"):
        assert main(argv) == 0
    said = caplog.text
    assert f"{out} is finished (checkpoint-6 is step 6 of 6): nothing to train" in said
    assert "raise --steps above 6" in said
    assert [s for s, _ in run.checkpoints()] == [6]  # no checkpoint-7, checkpoint-6 kept
    assert (out / "checkpoint-6" / "model.safetensors").read_bytes() == final
    assert (out / "metrics.jsonl").read_bytes() == metrics
    assert [r["step"] for r in run.metrics()] == [1, 2, 3, 4, 5, 6]


def _sft_config(model: Path, out: Path, **kw: Any) -> Any:
    from leanrl.environment import EnvironmentConfig
    from leanrl.policy import PolicyConfig
    from leanrl.train.sft import SFTConfig

    toy = REPO / "tests" / "fixtures" / "toy_tasks.jsonl"
    base: dict[str, Any] = dict(
        policy=PolicyConfig(model=str(model)),
        env=EnvironmentConfig(id="dataset", taskset={"path": toy, "split": "train"}),
        out=out,
        steps=4,
        batch_size=4,
        micro_batch_size=2,
        lr=3e-3,
        lr_schedule="constant",
        save_every=2,
        keep_checkpoints=2,
        seed=0,
    )
    base.update(kw)
    return SFTConfig(**base)


def _pairs() -> list[Any]:
    from leanrl import load_environment
    from leanrl.train.sft.data import Pair

    toy = REPO / "tests" / "fixtures" / "toy_tasks.jsonl"
    tasks = load_environment("dataset", path=toy, split="train").tasks()[:6]
    return [Pair(t, "\n  omega") for t in tasks]


def test_a_finished_sft_run_in_epochs_reruns_to_nothing(
    toy_model_dir: Path, tmp_path: Path
) -> None:
    """A run given as epochs ends where the Trainer counted its steps; 1.5 epochs of 6 examples
    in batches of 4 end mid-epoch (step 3), where the Trainer's own resume trained a step more."""
    from leanrl.train.sft import SFTTrainer

    cfg = _sft_config(toy_model_dir, tmp_path / "run", steps=None, epochs=1.5)
    rows = SFTTrainer(cfg, pairs=_pairs()).train_sync()
    assert [r["step"] for r in rows] == [1, 2, 3]
    again = SFTTrainer(cfg, pairs=_pairs())
    assert again.train_sync() == []
    assert [s for s, _ in again.run.checkpoints()] == [2, 3]


# -- 4: damaged checkpoints are quarantined; every loader checks checksums -------------------------


def test_sft_writes_checksums_and_quarantines_a_flipped_checkpoint(
    toy_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SFT's checkpoints had no checksums: a flipped bit in the newest one was resumed from.
    Now it is moved to quarantined/ (out of keep_checkpoints and of the Trainer's sight), the
    run resumes from the one before and ends with the weights it had written."""
    from safetensors.torch import load_file

    from leanrl.train.sft import SFTTrainer

    out = tmp_path / "run"
    SFTTrainer(_sft_config(toy_model_dir, out), pairs=_pairs()).train_sync()
    ckpt = out / "checkpoint-4"
    listed = {line.split("  ", 1)[1] for line in (ckpt / CHECKSUMS_FILE).read_text().splitlines()}
    assert {"model.safetensors", "optimizer.pt", "trainer_state.json"} <= listed
    # copied: load_file maps the file, and the flip below would reach these tensors too
    want = {k: v.clone() for k, v in load_file(ckpt / "model.safetensors").items()}
    _flip_a_byte(ckpt / "model.safetensors")

    with caplog.at_level(logging.WARNING, logger="leanrl"):
        rows = SFTTrainer(_sft_config(toy_model_dir, out), pairs=_pairs()).train_sync()
    assert [r["step"] for r in rows] == [3, 4]  # from checkpoint-2
    moved = out / "quarantined" / "checkpoint-4"
    assert "model.safetensors is not the file that was written" in caplog.text
    assert f"Moved it to {moved}" in caplog.text
    assert (
        "not the file that was written"
        in (out / "quarantined" / "checkpoint-4.why.txt").read_text()
    )
    assert [s for s, _ in RunDir(out).checkpoints()] == [2, 4]
    got = load_file(out / "checkpoint-4" / "model.safetensors")
    assert got.keys() == want.keys() and all((got[k] == want[k]).all() for k in want)


def test_quarantine_needs_the_lock_and_is_remembered(
    toy_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A reader without the run's lock (another rank, ES's replay) only skips a damaged
    checkpoint. Once the run moved every checkpoint aside, a later resume still knows they were
    damaged (GRPO refuses instead of restarting from the base model)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(toy_model_dir)
    out = tmp_path / "run"
    writer = RunDir(out)
    writer.lock("test run")
    for step in (1, 2):
        writer.save_checkpoint(step, model, None, {}, keep=5)
    for step in (1, 2):
        _flip_a_byte(out / f"checkpoint-{step}" / "model.safetensors")

    reader = RunDir(out)
    with caplog.at_level(logging.WARNING, logger="leanrl.train"):
        assert list(reader.resumable_checkpoints()) == []
    assert [s for s, _ in reader.checkpoints()] == [1, 2]  # moved nothing
    assert not (out / "quarantined").exists()

    assert list(writer.resumable_checkpoints()) == []
    assert writer.checkpoints() == []
    assert sorted(p.name for p in (out / "quarantined").iterdir()) == [
        "checkpoint-1",
        "checkpoint-1.why.txt",
        "checkpoint-2",
        "checkpoint-2.why.txt",
    ]
    writer.unlock()

    later = RunDir(out)
    assert list(later.resumable_checkpoints()) == []
    assert [p.name for p, _ in later.damaged] == ["checkpoint-1", "checkpoint-2"]
    assert all("not the file that was written" in why for _, why in later.damaged)
    assert later.no_checkpoint_line().startswith(f"every checkpoint in {out} is damaged")

    # the same step damaged again later goes beside the first, never over it
    later.lock("test run")
    later.save_checkpoint(2, model, None, {}, keep=5)
    _flip_a_byte(out / "checkpoint-2" / "model.safetensors")
    assert list(later.resumable_checkpoints()) == []
    assert (out / "quarantined" / "checkpoint-2.2").is_dir()
    later.unlock()


def _leanrl_checkpoint(model: Path, where: Path) -> Path:
    """A copy of ``model`` with the checksums a leanrl checkpoint carries."""
    shutil.copytree(model, where)
    write_checksums(where)
    return where


def test_eval_refuses_a_checkpoint_whose_weights_changed(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from leanrl.policies._common import resolve_model

    ckpt = _leanrl_checkpoint(tiny_model_dir, tmp_path / "run" / "checkpoint-3")
    assert resolve_model(str(ckpt)) == str(ckpt)
    _flip_a_byte(ckpt / "model.safetensors")
    with pytest.raises(PolicyError, match=r"model\.safetensors is not the file that was written"):
        resolve_model(str(ckpt))
    argv = ["eval", "--env", "countdown", "--model", str(ckpt), "--out", str(tmp_path / "e")]
    err = _one_line(capsys, argv)
    assert f"cannot load model {ckpt}: model.safetensors is not the file that was written" in err
    assert f"delete {ckpt / CHECKSUMS_FILE}" in err
    assert not (tmp_path / "e" / "results.jsonl").exists()
    # the way out the message gives: without the list the folder is an ordinary model folder
    (ckpt / CHECKSUMS_FILE).unlink()
    assert content_problem(ckpt) is None and resolve_model(str(ckpt)) == str(ckpt)


def test_average_refuses_a_checkpoint_whose_weights_changed(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = _leanrl_checkpoint(tiny_model_dir, tmp_path / "run" / "checkpoint-2")
    bad = _leanrl_checkpoint(tiny_model_dir, tmp_path / "run" / "checkpoint-4")
    _flip_a_byte(bad / "model.safetensors")
    err = _one_line(capsys, ["average", str(good), str(bad), "--out", str(tmp_path / "avg")])
    assert f"{bad} is damaged: model.safetensors is not the file that was written" in err
    assert not (tmp_path / "avg").exists()


def test_training_from_a_flipped_checkpoint_is_refused(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A run started from another run's checkpoint (--model RUN/checkpoint-N) checks it too."""
    from leanrl.train.common import check_model_path

    ckpt = _leanrl_checkpoint(tiny_model_dir, tmp_path / "run" / "checkpoint-3")
    config = ckpt / "config.json"  # any listed file, not only the weights: valid, but edited
    config.write_text(config.read_text().replace('"num_hidden_layers": ', '"num_hidden_layers": 1'))
    with pytest.raises(PolicyError, match=r"config\.json is not the file that was written"):
        check_model_path(str(ckpt))


# -- 5: metrics rows lost to a damaged line -------------------------------------------------------


def test_metrics_a_resume_cannot_redo_are_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A damaged row of a step after the checkpoint is redone with its step; one of a step the
    checkpoint already holds cannot be (its weights are gone): the resume names those steps."""
    run = RunDir(tmp_path)
    for step in range(1, 8):
        run.log({"step": step, "reward_mean": step / 10})
    lines = run.metrics_path.read_bytes().splitlines(keepends=True)
    lines[2] = b"\xde\xad garbage\n"  # step 3: before the checkpoint
    lines[5] = b'{"step": 6, "rew\n'  # step 6: after it (redone by the resume)
    run.metrics_path.write_bytes(b"".join(lines))
    with caplog.at_level(logging.WARNING, logger="leanrl.train"):
        lost = run.truncate_metrics(5)
    assert lost == [3]
    assert [r["step"] for r in run.metrics()] == [1, 2, 4, 5]
    assert "no row is left for step(s) 3" in caplog.text and "They are not redone" in caplog.text
    assert run.truncate_metrics(5) == []  # nothing new the second time


def test_expert_iteration_publishes_a_round_whose_sft_finished_before_a_kill(
    toy_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kill between a round's SFT end and its publish: the rerun finds the SFT finished (it
    trains nothing) and publishes exactly the weights that SFT ended with."""
    from safetensors.torch import load_file

    from leanrl.environment import EnvironmentConfig
    from leanrl.policy import PolicyConfig, SamplingConfig
    from leanrl.train.sft.expert_iteration import ExpertIteration, ExpertIterationConfig

    toy = REPO / "tests" / "fixtures" / "toy_tasks.jsonl"
    run = tmp_path / "run"
    cfg = ExpertIterationConfig(
        policy=PolicyConfig(model=str(toy_model_dir)),
        env=EnvironmentConfig(
            id="dataset",
            taskset={"path": toy, "split": "train"},
            # the scripted checker (not Lean) with an empty "accept": every answer passes
            runtime={"name": "tests._scripted_runtime:ScriptedRuntime", "options": {"accept": ""}},
        ),
        out=run,
        rounds=1,
        samples=2,
        sampling=SamplingConfig(temperature=1.0, max_tokens=6, seed=0),
        sft={"steps": 3, "batch_size": 2, "micro_batch_size": 2, "lr": 3e-3},
    )
    ended: dict[str, Any] = {}

    def killed(self: Any, r: int, trainer: Any) -> None:
        latest = trainer.run.latest_checkpoint()
        weights = load_file(latest[1] / "model.safetensors")
        ended.update({k: v.clone() for k, v in weights.items()})
        raise RuntimeError("killed between the SFT's end and the publish")

    monkeypatch.setattr(ExpertIteration, "_publish", killed)
    with pytest.raises(RuntimeError, match="killed"):
        ExpertIteration(cfg).train_sync()
    monkeypatch.undo()
    [row] = ExpertIteration(cfg).train_sync()
    assert row["step"] == 1 and row["sft_steps"] == 3
    got = load_file(run / "checkpoint-1" / "model.safetensors")
    assert ended and got.keys() == ended.keys()
    assert all((got[k] == ended[k]).all() for k in ended)
