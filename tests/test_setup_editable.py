"""What `.ci/setup.sh` leaves behind besides torch: the editable install must win over a folder
named ``leanrl`` in the current directory (the clone itself, seen from the folder holding it)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import leanrl

REPO = Path(__file__).resolve().parents[1]
FIRST = Path(sysconfig.get_paths()["purelib"]) / "leanrl-editable-first.pth"


@pytest.mark.skipif(
    not FIRST.is_file(),
    reason="leanrl was not installed by .ci/setup.sh (no leanrl-editable-first.pth)",
)
def test_import_from_the_folder_holding_the_clone(tmp_path: Path) -> None:
    # The folder that holds the clone: it has an entry `leanrl` (the clone, no __init__.py), which
    # Python's own path search would take as a namespace package before the editable finder.
    (tmp_path / "leanrl").symlink_to(REPO, target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-c", "import leanrl; print(leanrl.__file__); leanrl.load_environment"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()) == Path(leanrl.__file__), out.stdout


def test_setup_writes_the_finder_first_line() -> None:
    text = (REPO / ".ci" / "setup.sh").read_text(encoding="utf-8")
    assert "leanrl-editable-first.pth" in text
    # The .pth must sort after setuptools' own `__editable__.leanrl-*.pth`, or it runs too early.
    assert sorted(["__editable__.leanrl-0.1.0.pth", FIRST.name])[-1] == FIRST.name
