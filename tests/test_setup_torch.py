"""`.ci/setup.sh` must install the CPU build of torch on a machine without an NVIDIA GPU.

PyPI's Linux wheel of torch is the CUDA build: `pip install torch==2.13.0` on an ordinary
machine pulls triton, the CUDA toolkit and about 17 ``nvidia-*`` wheels (several GB). The set-up
script therefore asks for the ``+cpu`` local version by name. These tests read the exact
requirement the script asks for and check what pip resolves it to.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

SETUP = Path(__file__).resolve().parents[1] / ".ci" / "setup.sh"
CUDA_PACKAGES = re.compile(r"^(nvidia-|triton$|cuda-)", re.IGNORECASE)


def _cpu_branch() -> str:
    """The lines of setup.sh that run when ``torch_kind`` is ``cpu``."""
    text = SETUP.read_text(encoding="utf-8")
    start = text.index('if [ "$torch_kind" = cpu ]; then')
    end = text.index("  else", start)
    return text[start:end]


def _linux_cpu_spec() -> str:
    m = re.search(r'else torch_cpu="([^"]+)"', _cpu_branch())
    assert m, "setup.sh no longer sets torch_cpu for Linux; update this test with the script"
    return m.group(1)


def test_cpu_branch_names_the_cpu_build() -> None:
    branch = _cpu_branch()
    spec = _linux_cpu_spec()
    assert spec.endswith("+cpu"), f"{spec!r}: without +cpu PyPI serves the CUDA build on Linux"
    # Every pip install in the branch installs that spec, never a bare torch requirement.
    installs = [line for line in branch.splitlines() if "pip install" in line]
    assert installs, "no pip install in the CPU branch"
    assert all('"$torch_cpu"' in line for line in installs), installs
    assert "download.pytorch.org/whl/cpu" in branch


def _dry_run(spec: str, tmp_path: Path, *extra: str) -> list[str] | None:
    """Names pip would install for ``spec`` in an empty environment; None when no source this
    machine can reach offers it."""
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--report", str(report), spec, *extra],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if proc.returncode != 0:
        return None
    data = json.loads(report.read_text(encoding="utf-8"))
    return [item["metadata"]["name"] for item in data["install"]]


@pytest.mark.slow
def test_cpu_spec_resolves_without_cuda_packages(tmp_path: Path) -> None:
    spec = _linux_cpu_spec()
    names = _dry_run(spec, tmp_path)
    if names is None:  # the script's fallback: PyTorch's CPU index
        names = _dry_run(
            spec, tmp_path, "--index-url", "https://download.pytorch.org/whl/cpu",
            "--extra-index-url", "https://pypi.org/simple",
        )  # fmt: skip
    if names is None:
        pytest.skip(f"no package index reachable from here offers {spec}")
    assert "torch" in names
    cuda = [n for n in names if CUDA_PACKAGES.match(n)]
    assert not cuda, f"{spec} would install CUDA packages: {cuda}"
