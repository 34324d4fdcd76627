"""The README's first run without Lean works offline, as written (after `bash .ci/setup.sh`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _first_run_block() -> list[str]:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = [b.strip() for b in re.findall(r"```bash\n(.*?)```", readme, flags=re.S)]
    block = next(b for b in blocks if "--generate-only" in b)
    return block.splitlines()


@pytest.mark.slow
def test_readme_first_run_works_offline(tmp_path: Path) -> None:
    lines = _first_run_block()
    assert lines[0] == "bash .ci/setup.sh"  # done: this suite runs in the venv it made
    # Run the rest verbatim from a folder laid out like the repository root.
    (tmp_path / "examples").symlink_to(REPO / "examples")
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "PATH": "/usr/bin:/bin",  # no lean, no elan: the run must not need them
        "HOME": str(tmp_path),
    }
    for line in lines[1:]:
        done = subprocess.run(
            ["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True,
            timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, f"{line}\n{done.stderr[-3000:]}"
    out = tmp_path / "runs" / "first-run"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["generate_only"] and summary["results"]["attempts"] == 16
    assert (out / "completions.jsonl").is_file() and (out / "report.md").is_file()
    # The README's next step names the file that was written.
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "leanrl verify runs/first-run/completions.jsonl --env core" in readme
