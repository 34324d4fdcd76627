"""Where the ``real_model`` tests (and ``benchmarks/gpu_check.sh``) get SmolLM2-135M-Instruct.

``$LEANRL_REAL_MODEL`` names a converted model folder to use as it is (a machine the package
cannot reach, e.g. a GPU machine given the folder). Otherwise the folder
``leanrl.models.get_model("smollm2")`` makes once under ``$LEANRL_CACHE/models`` (about a
minute on a CPU, then reused by every later session). Without the packages the tests skip and
say what to install.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

__all__ = ["real_model_dir"]


def real_model_dir() -> Path:
    """The SmolLM2 folder, made if needed; skips the calling test when it cannot be had."""
    from leanrl.models import CATALOGUE, folder_problem, get_model

    given = os.environ.get("LEANRL_REAL_MODEL")
    if given:
        path = Path(given).expanduser()
        if not (path / "config.json").is_file():
            pytest.fail(f"LEANRL_REAL_MODEL={given} is not a model folder (no config.json)")
        return path
    spec = CATALOGUE["smollm2"]
    pairs = ((spec.module, spec.distribution), ("gguf", "gguf"))
    missing = [dist for mod, dist in pairs if importlib.util.find_spec(mod) is None]
    if missing:
        pytest.skip(f"needs {' and '.join(missing)}: {spec.install} (or bash .ci/setup.sh)")
    folder = get_model("smollm2")
    assert folder_problem(folder) is None
    return folder
