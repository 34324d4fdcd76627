"""Faults, round three (issue 36), the smaller items: a huge reward, a model whose config.json
has a field of the wrong type, a misspelt runtime option, `leanrl verify` killed and rerun (and
its stderr in a normal run), SFT on a full disk, a TOML file with a byte-order mark, and a
folder where a file is wanted.

Real processes where it matters: the verify kill is a SIGKILL of a real `leanrl verify` whose
REPL is the stand-in tests/fake_repl.py (it proves nothing; what is tested is leanrl around it).
"""

from __future__ import annotations

import errno
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from leanrl.cli import main
from leanrl.errors import ConfigError
from leanrl.rollout import REWARD_LIMIT, RewardError
from leanrl.train.common import RunDir

REPO = Path(__file__).resolve().parent.parent
FAKE = [sys.executable, str(REPO / "tests" / "fake_repl.py")]


def _one_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run ``leanrl argv``; it must fail with exit code 2 and a single line on stderr."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("leanrl: error: ") and "\n" not in err, err
    return err


def _env() -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


# -- a reward too large to compute with -----------------------------------------------------------


@pytest.mark.parametrize("value", [1e308, -1e20])
def test_grpo_refuses_a_huge_reward_in_one_line(
    tiny_model_dir: Path, tmp_path: Path, value: float
) -> None:
    """1e308 crashed the step's report with OverflowError; 1e20 is finite in float32 but its
    squared spread is not, and the run trained on NaN advantages without a word."""
    from tests.test_grpo_trainer import _config, _train
    from tests.test_nonfinite_rewards import _bad_env

    out = tmp_path / "run"
    cfg = _config(tiny_model_dir, out, steps=2, save_every=1, sampling={"max_tokens": 4})
    with pytest.raises(RewardError) as got:
        _train(cfg, env=_bad_env(value))
    msg = str(got.value)
    assert "\n" not in msg
    assert "step 1, task 't" in msg and f"rollout 1 got reward {value!r}" in msg, msg
    assert f"more than {REWARD_LIMIT:g} in magnitude" in msg
    assert RunDir(out).checkpoints() == []  # nothing trained, nothing NaN saved


def test_grpo_report_spread_never_raises() -> None:
    from leanrl.train.grpo.report import _std

    assert _std([1e308, -1e308]) == math.inf


def test_es_refuses_a_huge_reward_in_one_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    """ES's z-score squared 1e200 (OverflowError); it is refused before, naming the member."""
    from tests.test_es_learning import toy_config
    from tests.test_es_trainer import ScriptedScorer, run_steps

    cfg = toy_config(tiny_model_dir, tmp_path / "r", population=4, save_every=100)
    with pytest.raises(ConfigError, match=r"member 1 .*task .*got reward 1e\+200") as got:
        run_steps(cfg, ScriptedScorer([[0.0, 1e200, 1.0, 0.5]]), 1)
    assert "\n" not in str(got.value) and "within ±1e+15" in str(got.value)


def test_check_rewards_keeps_a_huge_infra_reward_out() -> None:
    from leanrl.rollout import Rollout, check_rewards
    from leanrl.verdict import Reason, Verdict

    r = Rollout(task_id="t", sample=0, prompt="p", reward=1e300)
    r.verdict = Verdict.reject(Reason.INFRA, "sandbox died")
    check_rewards([r], "step 1", "test")
    assert r.reward == 0.0  # the checker did not run: no outcome, and nothing huge goes on


# -- a model's config.json with a field of the wrong type -----------------------------------------


def test_a_wrong_typed_model_config_field_is_one_line(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    cfg = json.loads((model / "config.json").read_text())
    cfg["hidden_size"] = "big"
    (model / "config.json").write_text(json.dumps(cfg))
    want = f"cannot load model {model}: {model / 'config.json'} is refused by transformers"
    for argv in (
        ["eval", "--env", "countdown", "--model", str(model), "--out", str(tmp_path / "e")],
        [
            "train",
            "grpo",
            "--env",
            "countdown",
            "--model",
            str(model),
            "--out",
            str(tmp_path / "g"),
        ],
    ):
        err = _one_line(capsys, argv)
        assert want in err and "'hidden_size' expected int, got str (value: 'big')" in err


# -- runtime.options: a misspelt key --------------------------------------------------------------


def test_a_misspelt_runtime_option_is_refused_with_a_suggestion(
    bench_data: Path,
    tiny_model_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from leanrl.runtime import RuntimeConfig
    from leanrl.runtimes.local import LocalRuntime

    rt = LocalRuntime(RuntimeConfig(options={"repl_command": FAKE, "start_retires": 3}))
    with pytest.raises(ConfigError, match=r"'start_retires'.*did you mean 'start_retries'"):
        rt.preflight()
    with pytest.raises(ConfigError, match=r"runtime.options.start_backoff_s = 'soon'"):
        LocalRuntime(RuntimeConfig(options={"start_backoff_s": "soon"})).preflight()
    argv = [
        "eval",
        "--env",
        "minif2f",
        "--env.taskset.path",
        str(bench_data / "minif2f.jsonl"),
        "--model",
        str(tiny_model_dir),
        "--env.runtime.options",
        json.dumps({"repl_command": FAKE, "start_retires": 3}),
        "--out",
        str(tmp_path / "e"),
    ]
    err = _one_line(capsys, argv)
    assert "did you mean 'start_retries'?" in err


# -- leanrl verify: resumable, and quiet --------------------------------------------------------


def _verify_setup(bench_data: Path, tmp_path: Path, n: int, delay: float) -> tuple[Path, Path]:
    names = [
        json.loads(line)["name"]
        for line in (bench_data / "minif2f.jsonl").read_text().splitlines()[:n]
    ]
    proofs = tmp_path / "p.jsonl"
    with proofs.open("w") as f:
        for i, name in enumerate(names):
            proof = "sorry" if i % 3 == 0 else f'nlinarith\n  -- fake: {{"delay": {delay}}}'
            f.write(json.dumps({"name": name, "proof": proof}) + "\n")
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[env.taskset]\npath = "{bench_data / "minif2f.jsonl"}"\n'
        "[env.runtime]\nworkers = 1\nisolate = false\n"
        f"[env.runtime.options]\nrepl_command = {json.dumps(FAKE)}\nspares = 0\n"
    )
    return proofs, cfg


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def test_verify_killed_midway_continues_where_it_stopped(
    bench_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`leanrl verify` wrote nothing until the end, so a kill lost all of it. Now each chunk's
    verdicts are on disk as it ends; a SIGKILL after the first chunk, then the same command
    checks only the rest, and the file ends as an uninterrupted run's: one verdict per row."""
    n = 16
    proofs, cfg = _verify_setup(bench_data, tmp_path, n, delay=0.15)
    out = tmp_path / "p.verdicts.jsonl"
    argv = ["verify", str(proofs), "--env", "minif2f", "--config", str(cfg), "--chunk", "4"]
    cmd = [sys.executable, "-m", "leanrl.cli", *argv]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while _lines(out) < 4 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    written = _lines(out)
    assert 4 <= written < n, written  # the first chunk is on disk, the run was not done

    assert main([*argv, "--print_json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["rows"] == n and summary["taken_from_earlier_run"] >= 4
    assert summary["checked"] == n - summary["taken_from_earlier_run"]
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["row"] for r in recs] == list(range(1, n + 1))  # once each, in order
    assert [r["reason"] for r in recs] == ["sorry" if i % 3 == 0 else "ok" for i in range(n)]
    assert summary["accepted"] == sum(r["accepted"] for r in recs)

    # a finished file is taken whole; a row whose proof changed is checked again
    assert main([*argv, "--print_json"]) == 0
    assert json.loads(capsys.readouterr().out)["checked"] == 0
    rows = proofs.read_text().splitlines()
    rows[1] = json.dumps({**json.loads(rows[1]), "proof": "sorry"})
    proofs.write_text("\n".join(rows) + "\n")
    assert main([*argv, "--print_json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["checked"] == 1 and again["reasons"]["sorry"] == summary["reasons"]["sorry"] + 1


def test_verify_leaves_no_unknown_child_warning(
    bench_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A normal `leanrl verify` printed "Unknown child process pid N, will report returncode
    255": killing a REPL called Popen.send_signal, which polls, and that waitpid reaped the
    child behind asyncio's child watcher. The kill now signals without reaping."""
    import asyncio

    from leanrl.runtime import RuntimeConfig
    from leanrl.runtimes.local import LocalRuntime
    from leanrl.verdict import Attempt

    signalled: list[int] = []
    real = subprocess.Popen.send_signal

    def spy(self: subprocess.Popen[Any], sig: int) -> None:
        signalled.append(self.pid)
        real(self, sig)

    monkeypatch.setattr(subprocess.Popen, "send_signal", spy)
    attempts = [
        Attempt(
            name="t",
            header="import Mathlib\n",
            formal_statement="theorem t : 1 = 1 := by",
            proof=proof,
            id=str(i),
        )
        for i, proof in enumerate(["rfl", 'rfl\n  -- fake: {"hang": true}', "rfl"])
    ]

    async def run() -> list[Any]:
        rt = LocalRuntime(
            RuntimeConfig(workers=2, timeout_s=1.0, isolate=False, options={"repl_command": FAKE})
        )
        async with rt:
            return await rt.check(attempts)  # the hang is killed at its timeout

    verdicts = asyncio.run(run())
    assert [v.reason.value for v in verdicts] == ["ok", "timeout", "ok"]
    assert signalled == []

    # and the command itself, as a user runs it
    proofs, cfg = _verify_setup(bench_data, tmp_path, 6, delay=0.0)
    verify = [sys.executable, "-m", "leanrl.cli", "verify", str(proofs), "--env", "minif2f"]
    for _ in range(3):
        done = subprocess.run(
            [*verify, "--config", str(cfg), "--out", str(tmp_path / "v.jsonl")],
            cwd=tmp_path,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        (tmp_path / "v.jsonl").unlink()
        assert done.returncode == 0, done.stderr
        assert "Unknown child process" not in done.stderr, done.stderr


# -- SFT on a full disk ---------------------------------------------------------------------------


def test_sft_on_a_full_disk_names_the_checkpoint_and_a_rerun_finishes(
    toy_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from transformers import Trainer

    out = tmp_path / "run"
    argv = ["train", "sft", "--env", "countdown", "--env.taskset.split", "train"]
    argv += ["--data.from_env", "--data.proof_column", "solution"]
    argv += ["--env.harness.options", '{"style":"direct"}', "--model", str(toy_model_dir)]
    argv += ["--out", str(out), "--steps", "2", "--save-every", "1", "--batch-size", "2"]
    real = Trainer._save_rng_state

    def full(self: Any, output_dir: Any) -> None:
        if self.state.global_step == 2:  # the disk fills up while checkpoint-2 is written
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, output_dir)

    monkeypatch.setattr(Trainer, "_save_rng_state", full)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after transformers' progress bars
    assert err.startswith("leanrl: error: "), err
    assert "no space left on the device" in err
    assert f"while writing SFT checkpoint 2 ({out / 'checkpoint-2'})" in err
    monkeypatch.setattr(Trainer, "_save_rng_state", real)  # space freed
    assert main(argv) == 0
    assert [s for s, _ in RunDir(out).checkpoints()] == [1, 2]
    assert [r["step"] for r in RunDir(out).metrics()] == [1, 2]


# -- TOML with a byte-order mark; a folder where a file is wanted ----------------------------------


def test_a_toml_file_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    from leanrl.config import load_toml

    toml = tmp_path / "run.toml"
    toml.write_bytes(b'\xef\xbb\xbfsteps = 2\n[env]\nid = "countdown"\n')  # as Notepad saves it
    assert load_toml(toml) == {"steps": 2, "env": {"id": "countdown"}}


def test_a_folder_as_config_or_proofs_is_called_a_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "configs"
    folder.mkdir()
    err = _one_line(capsys, ["eval", "--config", str(folder), "--env", "countdown"])
    assert f"config file {folder} is a folder: --config takes a TOML file" in err
    err = _one_line(capsys, ["verify", str(folder), "--env", "minif2f"])
    assert f"proofs file {folder} is a folder" in err
    assert "does not exist" not in err
