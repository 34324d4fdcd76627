#!/usr/bin/env bash
# The GPU checks of the scaling work in one go, on a machine with an NVIDIA GPU (a few minutes):
# bf16 GRPO steps, FSDP2/DDP through a one-rank torchrun-style launch (two ranks with two GPUs),
# LoRA (alone and under FSDP), and the other `gpu` tests of the trainers (the vLLM ones skip
# without vLLM, which cannot be installed on a machine without network access).
#
#   bash benchmarks/gpu_check.sh            # uses .venv/bin/python, else python3
#   PYTHON=/path/to/python bash benchmarks/gpu_check.sh
#
# Needs torch with CUDA, transformers, peft, pytest and leanrl importable (`pip install -e
# '.[dev,lora]'`). Prints the GPU, then pytest's summary; exit status is pytest's.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=1 \
  TOKENIZERS_PARALLELISM=false
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
"$PY" - <<'PY'
import torch
assert torch.cuda.is_available(), "no CUDA GPU visible to torch: these checks need one"
print("torch", torch.__version__, "|", torch.cuda.device_count(), "x", torch.cuda.get_device_name(0))
PY
exec "$PY" -m pytest -q -rs -m gpu -p no:cacheprovider \
  tests/test_gpu_scale.py tests/test_grpo_vllm.py tests/test_es_vllm.py tests/test_vllm_server.py
