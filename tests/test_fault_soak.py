"""benchmarks/fault_soak.py, one round per mode at its smallest size: real `leanrl` subprocesses
killed with SIGKILL, stand-in REPLs (tests/fake_repl.py) killed and failing to start, every run
resumed to the end and compared with an undisturbed one (docs/faults.md). The soak's two phases
(hung starts, session starvation) are tests/test_fault_soak_phases.py's, not run again here;
larger soaks (more rounds, tasks, steps, seeds) are the benchmark's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MODES = ("eval", "grpo", "es")


@pytest.mark.slow
@pytest.mark.timeout(900)  # ~1 min alone; several on a loaded 2-core machine
def test_one_soak_round_per_mode_loses_duplicates_and_miscounts_nothing(tmp_path: Path) -> None:
    out = tmp_path / "soak"
    argv = [sys.executable, str(REPO / "benchmarks" / "fault_soak.py"), "--rounds", "1"]
    argv += ["--tasks", "2", "--steps", "2", "--seed", "0", "--out", str(out)]
    argv += [x for mode in MODES for x in ("--only", mode)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=840)
    tail = (done.stdout + done.stderr)[-4000:]
    assert done.returncode == 0, tail
    report = json.loads((out / "fault_soak.json").read_text())
    assert report["ok"] is True and report["failures"] == [], report["failures"]
    assert set(report["modes"]) == set(MODES) and report["phases"] == {}, report
    for mode, f in report["modes"].items():
        assert f["rounds"] == 1, mode
        assert f["kills"] > 0 and f["run_kills"] == 1, (mode, f)  # the run itself was killed
        assert f["records"] > 0, (mode, f)
        assert (f["lost"], f["duplicated"], f["infra_as_error"]) == (0, 0, 0), (mode, f)
        assert f["identical"] is True and f["resumes"] is True, (mode, f)
    assert "infra-as-error" in done.stdout  # the table was printed
