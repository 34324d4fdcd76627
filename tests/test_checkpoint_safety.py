"""Checkpoints read back after a crash: no code runs from them, and damage means a clear message
and a fall back to an older checkpoint (or, for ES, to the intact history).

Every test damages real files written by a real training run (tiny model made on the spot):
a pickle payload planted in ``optimizer.pt``, a ``model.safetensors`` cut in half, a
``trainer_state.json`` of garbage.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from test_es_learning import toy_config
from test_grpo_trainer import _config, _train, _weights

from leanrl.errors import ConfigError, PolicyError
from leanrl.integrity import checkpoint_problem, safetensors_problem, torch_file_problem
from leanrl.train.common import CHECKSUMS_FILE, RunDir, checksums_problem, write_checksums
from leanrl.train.es import ESTrainer
from leanrl.train.es.history import master_equal, replay
from leanrl.train.grpo.engine import load_optimizer_file


class _Payload:
    """Pickles as a call of ``os.system``: what a planted checkpoint would run on load."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (self.command,))


def _grpo_run(model: Path, out: Path, steps: int = 3) -> Any:
    return _config(model, out, steps=steps, save_every=1, keep_checkpoints=5, tasks_per_step=2)


def _truncate(path: Path, keep: float = 0.5) -> None:
    size = path.stat().st_size
    with path.open("r+b") as f:
        f.truncate(int(size * keep))


def test_a_planted_pickle_payload_in_optimizer_pt_never_runs(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "run"
    _train(_grpo_run(tiny_model_dir, out))
    marker = tmp_path / "payload-ran"
    opt = out / "checkpoint-3" / "optimizer.pt"
    blob = torch.load(opt, weights_only=True)
    blob["python_rng"] = _Payload(f"touch {marker}")
    torch.save(blob, opt)
    assert checkpoint_problem(opt.parent) is None  # structurally a whole archive
    # Checksums catch accidents, not someone who can write the folder: with its checksums
    # rewritten too, the planted file passes them, and the loader's refusal is the defence.
    write_checksums(opt.parent)

    with pytest.raises(ConfigError, match="never runs code"):
        load_optimizer_file(opt, torch.device("cpu"))
    assert not marker.exists()

    with caplog.at_level(logging.WARNING, logger="leanrl.train"):
        rows = _train(_grpo_run(tiny_model_dir, out, steps=4))  # resume
    assert not marker.exists()
    assert "checkpoint-3" in caplog.text and "never runs code" in caplog.text
    # resumed from checkpoint-2: steps 3 and 4 redone, none lost or doubled
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [s for s, _ in RunDir(out).checkpoints()] == [1, 2, 3, 4]

    # The payload is live: the old loading (weights_only=False) would have run it.
    bad = tmp_path / "planted.pt"
    torch.save({"python_rng": _Payload(f"touch {marker}")}, bad)
    torch.load(bad, weights_only=False)
    assert marker.exists()


def test_damaged_newest_grpo_checkpoint_falls_back_to_an_older_one(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    straight = tmp_path / "straight"
    want = _train(_grpo_run(tiny_model_dir, straight, steps=4))
    out = tmp_path / "run"
    _train(_grpo_run(tiny_model_dir, out))
    _truncate(out / "checkpoint-3" / "model.safetensors")
    (out / "checkpoint-2" / "trainer_state.json").write_text("{not json")
    assert "model.safetensors is truncated" in (checkpoint_problem(out / "checkpoint-3") or "")

    with caplog.at_level(logging.WARNING, logger="leanrl.train"):
        rows = _train(_grpo_run(tiny_model_dir, out, steps=4))
    assert "checkpoint-3 is damaged: model.safetensors is truncated" in caplog.text
    assert "checkpoint-2 is damaged: trainer_state.json is not valid JSON" in caplog.text
    # from checkpoint-1, exactly as if never interrupted
    assert [r["reward_mean"] for r in rows] == [r["reward_mean"] for r in want]
    wa, wb = _weights(straight / "checkpoint-4"), _weights(out / "checkpoint-4")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_truncated_optimizer_state_falls_back_and_all_damaged_is_an_error(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    _train(_grpo_run(tiny_model_dir, out, steps=2))
    for step in (1, 2):
        _truncate(out / f"checkpoint-{step}" / "optimizer.pt", 0.7)
    why = torch_file_problem(out / "checkpoint-2" / "optimizer.pt")
    assert why and "optimizer.pt is truncated or damaged" in why
    # Starting over from the base model would silently throw the run away: say so instead.
    with pytest.raises(ConfigError, match=r"no checkpoint .* can be resumed from") as e:
        _train(_grpo_run(tiny_model_dir, out, steps=3))
    assert str(e.value).count("optimizer.pt is truncated") == 2


def test_es_falls_back_to_an_older_checkpoint_then_to_the_history(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "es"
    tr = ESTrainer(toy_config(tiny_model_dir, out, steps=4, save_every=2, keep_checkpoints=5))
    tr.train_sync()
    live = tr.weights.master
    _truncate(out / "checkpoint-4" / "model.safetensors")
    with caplog.at_level(logging.WARNING, logger="leanrl.train"):
        _, _, w = replay(out)  # from checkpoint-2 + records 3 and 4
    assert master_equal(live, w.master)
    assert "checkpoint-4 is damaged: model.safetensors is truncated" in caplog.text

    (out / "checkpoint-2" / "trainer_state.json").write_bytes(b"\x00\xff")
    caplog.clear()
    more = ESTrainer(toy_config(tiny_model_dir, out, steps=5, save_every=2, keep_checkpoints=5))
    with caplog.at_level(logging.WARNING, logger="leanrl.train"):
        more.train_sync()  # resumes at iteration 4 from base + history, runs iteration 5
    assert "no intact checkpoint" in caplog.text and "from the base model and the history" in (
        caplog.text
    )
    assert len(more.history) == 5
    straight = ESTrainer(toy_config(tiny_model_dir, tmp_path / "s", steps=5, save_every=100))
    straight.train_sync()
    assert master_equal(straight.weights.master, more.weights.master)


def _flip_a_byte(path: Path) -> None:
    """One bit flipped in the middle of the file (in a safetensors file: inside the tensor
    data, so its header and length stay right)."""
    with path.open("r+b") as f:
        f.seek(path.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x10]))


def test_a_flipped_bit_in_the_weights_is_caught_and_the_run_falls_back(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    straight = tmp_path / "straight"
    _train(_grpo_run(tiny_model_dir, straight, steps=4))
    out = tmp_path / "run"
    _train(_grpo_run(tiny_model_dir, out))
    ckpt = out / "checkpoint-3"
    # the checksums are in sha256sum's format: the standard tool checks a checkpoint too
    listed = (ckpt / CHECKSUMS_FILE).read_text().splitlines()
    assert {line.split("  ", 1)[1] for line in listed} >= {"model.safetensors", "optimizer.pt"}
    if shutil.which("sha256sum"):
        import subprocess

        subprocess.run(["sha256sum", "--quiet", "-c", CHECKSUMS_FILE], cwd=ckpt, check=True)
    _flip_a_byte(ckpt / "model.safetensors")
    # structurally whole: before the checksums this resumed silently from the wrong weights
    assert checkpoint_problem(ckpt) is None
    assert "model.safetensors is not the file that was written" in (checksums_problem(ckpt) or "")

    with caplog.at_level(logging.WARNING, logger="leanrl.train"):
        rows = _train(_grpo_run(tiny_model_dir, out, steps=4))
    assert "checkpoint-3 is damaged: model.safetensors is not the file that was written" in (
        caplog.text
    )
    # from checkpoint-2, exactly as if never interrupted (not from the corrupted weights)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    wa, wb = _weights(straight / "checkpoint-4"), _weights(out / "checkpoint-4")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_checkpoint_without_checksums_is_used_with_a_warning(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Checkpoints written before checksums existed still resume (structure checked only)."""
    out = tmp_path / "run"
    _train(_grpo_run(tiny_model_dir, out, steps=2))
    (out / "checkpoint-2" / CHECKSUMS_FILE).unlink()
    run = RunDir(out)
    with caplog.at_level(logging.WARNING, logger="leanrl.train"):
        assert next(run.resumable_checkpoints()) == (2, out / "checkpoint-2")
    assert f"has no {CHECKSUMS_FILE}" in caplog.text and not run.damaged
    (out / "checkpoint-1" / CHECKSUMS_FILE).write_text("not a checksum line\n")
    assert "checksums.sha256 is damaged (line 1" in (checksums_problem(out / "checkpoint-1") or "")


def test_every_checkpoint_damaged_says_so_not_no_checkpoint_yet(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """ES with every checkpoint damaged rebuilds from the base model and the history; its
    resume line said "no checkpoint yet" and hid why."""
    out = tmp_path / "es"
    ESTrainer(
        toy_config(tiny_model_dir, out, steps=4, save_every=2, keep_checkpoints=5)
    ).train_sync()
    for step in (2, 4):
        _flip_a_byte(out / f"checkpoint-{step}" / "model.safetensors")
    more = ESTrainer(toy_config(tiny_model_dir, out, steps=5, save_every=2, keep_checkpoints=5))
    with caplog.at_level(logging.INFO, logger="leanrl.train"):
        more.train_sync()
    resumed = [
        r.getMessage() for r in caplog.records if "resuming at iteration 4" in r.getMessage()
    ]
    assert resumed and "no checkpoint yet" not in resumed[0]
    assert "every checkpoint in" in resumed[0] and "is damaged" in resumed[0]
    assert "checkpoint-4: model.safetensors is not the file that was written" in resumed[0]
    assert "checkpoint-2: model.safetensors" in resumed[0]
    assert (
        RunDir(out).no_checkpoint_line().endswith("holds no checkpoint yet: starting the run over")
    )


def test_a_non_finite_metric_is_recorded_as_it_is_and_read_back(tmp_path: Path) -> None:
    """A diverged loss is a fact about the run: it was written as ``null`` (read back as "not
    measured"). It is now strict JSON's string spelling, read back as the float."""
    import math

    run = RunDir(tmp_path)
    nan, inf = math.nan, math.inf
    run.log({"step": 1, "loss": nan, "grad_norm": inf, "kl": -inf, "eval/pass@1": None})
    run.log({"step": 1, "reward_mean": 0.5, "total_tokens": 10, "parts": [nan, 1.0]})
    run.log({"step": 2, "reward_mean": nan, "total_tokens": 20, "loss": 0.25})

    def no_bare_constants(name: str) -> None:
        raise AssertionError(f"{name} is not JSON (jq, JavaScript and strict readers refuse it)")

    lines = [
        json.loads(x, parse_constant=no_bare_constants)
        for x in (tmp_path / "metrics.jsonl").read_text().splitlines()
    ]
    assert lines[0] == {
        "step": 1,
        "loss": "NaN",
        "grad_norm": "Infinity",
        "kl": "-Infinity",
        "eval/pass@1": None,
    }
    assert lines[1]["parts"] == ["NaN", 1.0]

    def check(rows: list[dict[str, Any]]) -> None:
        assert math.isnan(rows[0]["loss"]) and rows[0]["grad_norm"] == inf
        assert rows[0]["kl"] == -inf and rows[0]["eval/pass@1"] is None
        assert math.isnan(rows[1]["parts"][0]) and math.isnan(rows[2]["reward_mean"])

    check(run.metrics())
    run.truncate_metrics(2)  # a resume rewrites the file: the values survive it
    check(run.metrics())
    # the readers: the plot draws the finite points; compare's curves read the floats back
    assert run.plot() is not None
    from leanrl.compare import _summary

    curve = _summary("grpo", 0, tmp_path, "total_tokens")["curve"]
    assert curve["reward"][0] == 0.5 and math.isnan(curve["reward"][1])


def test_eval_of_a_truncated_model_says_which_file(tiny_model_dir: Path, tmp_path: Path) -> None:
    from leanrl.policies._common import resolve_model

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    _truncate(model / "model.safetensors", 0.3)
    with pytest.raises(PolicyError, match=r"model.safetensors is truncated \(\d+ of \d+ bytes\)"):
        resolve_model(str(model))
    # a header cut inside its own length field, and bytes past the last tensor
    st = model / "model.safetensors"
    st.write_bytes(b"\x10\x00")
    assert "not even a header" in (safetensors_problem(st) or "")
    shutil.copy(tiny_model_dir / "model.safetensors", st)
    with st.open("ab") as f:
        f.write(b"junk")
    assert "4 bytes past its last tensor" in (safetensors_problem(st) or "")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real file system (tmpfs, 64 MiB until the test shrinks it): writes past its size fail
    with ENOSPC from the kernel."""
    import subprocess

    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)],
                       capture_output=True, text=True)  # fmt: skip
    if r.returncode != 0:
        pytest.skip(f"needs root to mount a small tmpfs (a real full disk): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def test_a_disk_filling_up_during_a_checkpoint_is_one_line_and_loses_nothing(
    tiny_model_dir: Path, small_disk: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import subprocess

    from leanrl.cli import main

    cfg = small_disk.parent / "grpo.toml"
    cfg.write_text(
        'env = { id = "test_grpo_trainer:DigitEnv" }\n'
        "steps = 3\ntasks_per_step = 2\ngroup_size = 2\nsave_every = 1\nlr = 1e-3\n"
        "keep_checkpoints = 5\n[sampling]\nmax_tokens = 8\ntop_p = 1.0\n"
    )
    out = small_disk / "run"
    argv = [
        "train",
        "grpo",
        "--config",
        str(cfg),
        "--model",
        str(tiny_model_dir),
        "--out",
        str(out),
    ]
    # Size the disk from this very run: one step with its checkpoint fits, plus a little
    probe = small_disk / "probe"
    assert main([*argv[:-1], str(probe), "--steps", "1"]) == 0
    room = _du(probe) + _du(probe / "checkpoint-1") // 2
    shutil.rmtree(probe)
    subprocess.run(
        ["mount", "-o", f"remount,size={room // 1024 + 8}k", str(small_disk)], check=True
    )
    capsys.readouterr()
    assert main(argv) == 2  # checkpoint 1 fits, checkpoint 2 does not
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("leanrl: error")]
    assert "Traceback" not in err and len(errors) == 1, err  # (the rest: progress bars)
    assert "no space left on the device" in errors[0] and "checkpoint 2" in errors[0]
    # what was recorded is intact, and no half-written checkpoint was published or left over
    assert [s for s, _ in RunDir(out).checkpoints()] == [1]
    assert checkpoint_problem(out / "checkpoint-1") is None
    assert not list(out.glob(".tmp-checkpoint-*"))
    rows = RunDir(out).metrics()
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1))
    # with room again, the same command finishes the run
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    assert main(argv) == 0
    assert [r["step"] for r in RunDir(out).metrics()] == [1, 2, 3]
