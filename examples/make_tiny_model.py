"""Make a tiny random model for a first run: no download, no GPU, a few seconds.

    python examples/make_tiny_model.py runs/tiny-model

A 2-layer Llama-architecture model with random weights and a tokenizer trained here on the core
environment's statements (they ship with leanrl). It writes nonsense, but it is a real
Hugging Face model folder, so every step of `leanrl eval` runs with it:

    leanrl eval --env core --model runs/tiny-model --generate-only --samples 2 --limit 8
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import leanrl
from leanrl.testing import make_tiny_model


def main(out: str) -> Path:
    tasks = leanrl.load_environment("core", split=None).tasks()
    texts = [t.header + t.formal_statement + "\n  omega\n" for t in tasks]
    texts += ["```lean4\n", "```", "Complete the following Lean 4 code:", "decide", "simp", "rfl"]
    return make_tiny_model(out, texts)


if __name__ == "__main__":
    path = main(sys.argv[1] if len(sys.argv) > 1 else "runs/tiny-model")
    print(f"tiny model in {path}")
