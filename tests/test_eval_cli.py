"""`leanrl eval` from the command line: bad input, TOML, and a real kill-and-resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from leanrl.cli import main, parse_command
from leanrl.eval.cli import EvalCommand

REPO = Path(__file__).resolve().parent.parent
RT = "tests._scripted_runtime:ScriptedRuntime"


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    # No wall-clock assertion here: a hang is caught by pytest-timeout (pyproject), and speed
    # is not what these tests measure.
    code = main(argv)
    err = capsys.readouterr().err
    return code, err


def test_bad_input_stops_early_with_a_clear_message(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, bench_data: Path, tiny_model_dir: Path
) -> None:
    base = ["eval", "--env.taskset.path", str(bench_data), "--out", str(tmp_path / "o")]
    code, err = run_cli([*base, "--env", "nosuch", "--model", str(tiny_model_dir)], capsys)
    assert code == 2 and "unknown environment 'nosuch'. Known:" in err and "minif2f" in err
    code, err = run_cli(
        [*base, "--env", "minif2f", "--model", str(tiny_model_dir), "--runtime", "nosuch"], capsys
    )
    assert code == 2 and "unknown runtime 'nosuch'" in err
    code, err = run_cli(
        [*base, "--env", "minif2f", "--model", str(tiny_model_dir), "--harness", "nosuch"], capsys
    )
    assert (
        code == 2
        and "unknown harness 'nosuch'. Known: external, self-correction, tactic-loop, tool-use, whole-proof"
        in err
    )
    code, err = run_cli([*base, "--env", "minif2f", "--model", "./no/such/folder"], capsys)
    assert code == 2 and "model folder" in err and "does not exist" in err
    code, err = run_cli(
        [*base, "--env", "minif2f", "--model", str(tiny_model_dir), "--samples", "4", "--k", "1,8"],
        capsys,
    )
    assert code == 2 and "k=[8] is larger than samples=4" in err
    code, err = run_cli([*base, "--env", "minif2f"], capsys)
    assert code == 2 and "no model given" in err
    assert not (tmp_path / "o").exists()  # nothing was started or written


def test_offline_machine_says_what_is_missing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny_model_dir: Path, monkeypatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf"))  # empty
    out = ["--out", str(tmp_path / "o")]
    code, err = run_cli(
        ["eval", "--env", "minif2f", "--model", "AI-MO/Kimina-Prover-Distill-1.7B", *out], capsys
    )
    assert code == 2 and "not in the local Hugging Face cache" in err
    assert "--model DIR" in err  # how to supply a local model folder
    assert "--env.taskset.path" in err  # and the dataset is missing too: both are reported
    # a local model but no local copy of the dataset
    code, err = run_cli(["eval", "--env", "minif2f", "--model", str(tiny_model_dir), *out], capsys)
    assert code == 2 and "--env.taskset.path" in err


def test_missing_lean_surfaces_as_a_clean_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, bench_data: Path, tiny_model_dir: Path
) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text(f'[env.runtime]\nname = "{RT}"\noptions = {{ fail_start = true }}\n')
    code, err = run_cli(
        [
            "eval",
            "--config",
            str(toml),
            "--env",
            "minif2f",
            "--env.taskset.path",
            str(bench_data),
            "--model",
            str(tiny_model_dir),
            "--out",
            str(tmp_path / "o"),
        ],
        capsys,
    )
    assert code == 2 and err.startswith("leanrl: error:") and "leanrl setup" in err
    assert "Traceback" not in err


def test_toml_and_flags_make_one_config() -> None:
    cmd = parse_command(
        EvalCommand,
        [
            "eval",
            "--config",
            str(REPO / "examples/eval_minif2f.toml"),
            "--limit",
            "3",
            "--k",
            "1,2",
        ][1:],
    )
    cfg = cmd.to_eval_config()
    assert cfg.policy.model == "AI-MO/Kimina-Prover-Distill-1.7B"
    assert cfg.env.harness.prompt_format == "kimina" and cfg.env.taskset.limit == 3
    assert cfg.samples == 8 and cfg.ks == [1, 2] and cfg.sampling.max_tokens == 8192
    cfg.check()
    cmd2 = parse_command(EvalCommand, ["--env", "proofnet", "--backend", "openai", "--model", "m"])
    cfg2 = cmd2.to_eval_config()
    assert cfg2.env.id == "proofnet" and cfg2.policy.backend == "openai" and cfg2.ks == [1]


def test_kill_midway_and_rerun_continues(
    tmp_path: Path, bench_data: Path, tiny_model_dir: Path
) -> None:
    """A real SIGKILL of `leanrl eval` midway; the same command then finishes the run, and the
    result equals an uninterrupted run's (same per-chunk seeds, nothing lost or done twice)."""
    from leanrl.eval import run_eval_sync

    toml = tmp_path / "run.toml"
    toml.write_text(
        f"""samples = 2
k = [1, 2]
chunk_tasks = 1
pipeline_depth = 1
progress = false
[env]
id = "minif2f"
[env.taskset]
path = "{bench_data}"
limit = 5
[env.runtime]
name = "{RT}"
options = {{ delay_s = 0.6, accept = "" }}
[policy]
model = "{tiny_model_dir}"
batch_size = 4
[sampling]
max_tokens = 12
stop = [" ", "e", "t", "a", "o", "i", "n", "s", "\\n"]
"""
    )
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "leanrl.cli", "eval", "--config", str(toml), "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    results = out / "results.jsonl"
    try:
        while proc.poll() is None and not (results.is_file() and results.read_text()):
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    killed = [json.loads(x) for x in results.read_text().splitlines() if x.strip()]
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode() if proc.stderr else ""
    assert 0 < len(killed) < 10
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    recs = [json.loads(x) for x in results.read_text().splitlines()]
    keys = [(r["task_id"], r["sample"]) for r in recs]
    assert len(keys) == 10 and len(set(keys)) == 10
    assert recs[: len(killed)] == killed  # what was recorded before the kill is kept as is
    # The uninterrupted reference run, in this process.
    ref_cfg = parse_command(EvalCommand, ["--config", str(toml)]).to_eval_config()
    ref_cfg.out = tmp_path / "ref"
    ref_cfg.env.runtime.options = {"accept": ""}  # every extracted proof passes
    run_eval_sync(ref_cfg.model_copy(update={"env": ref_cfg.env}))
    ref = {
        (r["task_id"], r["sample"]): r
        for r in map(json.loads, (tmp_path / "ref" / "results.jsonl").read_text().splitlines())
    }
    for r in recs:
        twin = ref[(r["task_id"], r["sample"])]
        assert (r["completion"], r["accepted"]) == (twin["completion"], twin["accepted"])
    summary = json.loads((out / "summary.json").read_text())
    ref_summary = json.loads((tmp_path / "ref" / "summary.json").read_text())
    assert summary["results"]["pass_at_k"] == ref_summary["results"]["pass_at_k"]
    assert "pass@2" in summary["results"]["pass_at_k"]["all"]
    assert {r["accepted"] for r in recs} == {True, False}  # both kinds were compared


def test_example_script_runs(tmp_path: Path, bench_data: Path, tiny_model_dir: Path) -> None:
    out = tmp_path / "ex"
    done = subprocess.run(
        [
            sys.executable,
            "examples/eval_minif2f.py",
            "--model",
            str(tiny_model_dir),
            "--prompt-format",
            "deepseek",
            "--data",
            str(bench_data),
            "--limit",
            "2",
            "--samples",
            "2",
            "--max-tokens",
            "4",
            "--runtime",
            RT,
            "--out",
            str(out),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "pass@1=" in done.stdout and (out / "report.md").is_file()
    assert len((out / "results.jsonl").read_text().splitlines()) == 4


def test_openai_backend_end_to_end(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, bench_data: Path
) -> None:
    from tests.test_policy_openai import Server

    class Prover(Server):
        def answer(self, path: str, body: dict) -> dict:
            texts = ["\n  omega\n", "\n  simp\n"]
            return {
                "choices": [
                    {
                        "index": i,
                        "text": texts[i % 2],
                        "finish_reason": "stop",
                        # no token ids (hosted APIs send none); one logprob per token
                        "logprobs": {"token_logprobs": [-0.5] * (3 + i)},
                    }
                    for i in range(body["n"])
                ]
            }

    with Prover(fail=1) as srv:
        code = main(
            [
                "eval",
                "--env",
                "minif2f",
                "--env.taskset.path",
                str(bench_data),
                "--limit",
                "3",
                "--backend",
                "openai",
                "--model",
                "served-prover",
                "--policy.base_url",
                srv.url,
                "--runtime",
                RT,
                "--samples",
                "2",
                "--k",
                "1,2",
                "--out",
                str(tmp_path / "o"),
            ]
        )
    out = capsys.readouterr().out
    assert code == 0 and "pass@1=50.0%" in out and "pass@2=100.0%" in out
    assert all(b["model"] == "served-prover" and b["n"] == 2 for b in srv.bodies)
    recs = [json.loads(x) for x in (tmp_path / "o" / "results.jsonl").read_text().splitlines()]
    assert len(recs) == 6
    # token counts come from the logprobs when the server sends no ids; unknown is None, not 0
    assert sorted({(r["sample"], r["completion_tokens"]) for r in recs}) == [(0, 3), (1, 4)]
    assert {r["prompt_tokens"] for r in recs} == {None}


def test_missing_lean_project_is_reported_with_the_other_problems(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Offline with nothing set up: the model, the dataset AND the Lean project are all named in
    one message, before anything loads (the local runtime's preflight finds no project)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.delenv("LEANRL_LEAN_PROJECT", raising=False)
    monkeypatch.setenv("LEANRL_CACHE", str(tmp_path / "cache"))  # no project `leanrl setup` made
    monkeypatch.setenv("PATH", str(tmp_path))  # and no `repl` on PATH
    code, err = run_cli(
        [
            "eval",
            "--env",
            "minif2f",
            "--model",
            "AI-MO/Kimina-Prover-Distill-1.7B",
            "--out",
            str(tmp_path / "o"),
        ],
        capsys,
    )
    assert code == 2
    assert "PolicyError" in err and "DatasetError" in err
    assert "LeanNotFoundError" in err and "leanrl setup --env" in err
