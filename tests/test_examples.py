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
