"""The CPU examples in examples/ run as documented (no Lean, no GPU, no download)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.parametrize("script", ["train_grpo_cpu.py", "train_es_cpu.py"])
def test_cpu_trainer_example_runs_and_writes_a_run_folder(script: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        str(REPO / "examples" / script),
        "--out",
        str(out),
        "--model-dir",
        str(tmp_path / "tiny"),
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows and rows[-1]["step"] == len(rows)
    assert (out / "reward_curve.png").is_file()
    assert any((out / p.name / "config.json").is_file() for p in out.glob("checkpoint-*"))
    # It says what it does as it goes, as the CLI does (it used to print nothing of its own
    # until the end), and names only files it wrote.
    unit = "step" if "grpo" in script else "iteration"
    assert f"{unit} 1/" in res.stderr and f"{unit} {len(rows)}/{len(rows)}" in res.stderr
    assert "reward_curve.png" in res.stdout.splitlines()[-1]
    # A rerun resumes, and says so.
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"resuming from {out}" in res.stderr
