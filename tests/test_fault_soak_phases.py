"""benchmarks/fault_soak.py's two phases (issue 36, items 1 and 3): ``leanrl eval`` and
``leanrl serve`` with several workers while every REPL start hangs or fails, and tactic sessions
held and then abandoned by a killed client (docs/faults.md). Real subprocesses throughout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.timeout(600)  # ~1.5 min alone; more on a loaded 2-core machine
def test_the_hung_start_and_session_starvation_phases_hold(tmp_path: Path) -> None:
    out = tmp_path / "soak"
    argv = [sys.executable, str(REPO / "benchmarks" / "fault_soak.py"), "--tasks", "2"]
    argv += ["--only", "hung-start", "--only", "session-starvation", "--out", str(out)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=560)
    tail = (done.stdout + done.stderr)[-4000:]
    assert done.returncode == 0, tail
    report = json.loads((out / "fault_soak.json").read_text())
    assert report["ok"] is True and report["modes"] == {}, report["failures"]
    hung, sessions = report["phases"]["hung-start"], report["phases"]["session-starvation"]
    assert hung["ok"] and sessions["ok"], report["phases"]
    ev = hung["eval"]
    assert ev["outage_infra"] > 0 and ev["identical"] and ev["infra_as_error"] == 0, ev
    assert ev["outage_starts"] <= ev["outage_start_bound"], ev
    assert hung["serve_hang"]["status"] == 200, hung
    assert hung["serve_hang"]["starts"] <= hung["serve_hang"]["start_bound"], hung
    assert hung["serve_fail"]["starts"] <= hung["serve_fail"]["start_bound"], hung
    assert sessions["client_statuses"] == [200, 200, 429], sessions
    assert sessions["check_status"] == 200 and sessions["sessions_left_after_kill"] == 0
