"""`leanrl train grpo|es` print one line per step with the key metrics (the CLI sets up
logging), run as a user runs them: the console entry point in a fresh process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _train(
    kind: str, toml: str, model: Path, out: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "examples")}  # the examples' environment
    return subprocess.run(
        [sys.executable, "-m", "leanrl.cli", "train", kind, "--config", str(REPO / "examples" / toml),
         "--model", str(model), "--out", str(out), "--steps", "2", *extra],
        capture_output=True, text=True, env=env, cwd=out.parent, timeout=600,
    )  # fmt: skip


@pytest.mark.slow
def test_es_prints_a_line_per_iteration(tiny_model_dir: Path, tmp_path: Path) -> None:
    done = _train("es", "train-es-cpu.toml", tiny_model_dir, tmp_path / "es", "--population", "4")
    assert done.returncode == 0, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if " iteration " in ln]
    assert len(lines) == 2, done.stderr
    assert "iteration 1/2: reward " in lines[0] and "iteration 2/2: reward " in lines[1]
    # The example's environment gives rewards, no verdicts: no pass rate (it used to say 0.000)
    assert "pass " not in lines[0] and "population 4" in lines[0]


@pytest.mark.slow
def test_grpo_prints_a_line_per_step(tiny_model_dir: Path, tmp_path: Path) -> None:
    done = _train("grpo", "train-grpo-cpu.toml", tiny_model_dir, tmp_path / "grpo")
    assert done.returncode == 0, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if " step " in ln and "/2:" in ln]
    assert len(lines) == 2, done.stderr
    assert "step 1/2: reward " in lines[0] and "step 2/2: reward " in lines[1]
