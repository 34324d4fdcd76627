"""leanrl's SFT (``leanrl train sft``) against plain TRL ``SFTTrainer``: training tokens per second.

Both train the same small random Llama model (made here, nothing downloaded) on the same
(prompt, proof) examples: ``whole-proof`` prompts in the ``deepseek`` format for toy theorems of
varied length, with proofs of 1 to 24 tactic lines (real proof lengths vary this much). Both get
the same text: leanrl builds it from the pairs; TRL gets the very same prompt and answer strings
as a prompt-completion dataset (its default ``completion_only_loss``, so the loss is on the
proof in both). Same batch size, learning rate, constant schedule, epochs, fp32, one CPU thread,
no checkpoint saving inside the timed steps, TRL's defaults otherwise (no packing, no
padding-free batches). leanrl batches by length (its default ``group_by_length``); a third
mode, leanrl with ``group_by_length = false``, shows how much of the difference that is.

The figure: real (non-padding) tokens trained per second, measured the same way for both, from
one logged step to the next (every step logs), leaving out the first ``--skip`` steps. The two
trainers alternate run by run; min / median / max over the runs and the ratio of the medians are
printed.

TRL runs in its own virtual environment that sees this one's torch and transformers::

    python -m venv /tmp/trl-venv
    echo "$(python -c 'import site; print(site.getsitepackages()[0])')" \\
        > /tmp/trl-venv/lib/python3.11/site-packages/leanrl-venv.pth
    /tmp/trl-venv/bin/pip install trl==1.16.0

    OMP_NUM_THREADS=1 python benchmarks/sft_vs_trl.py --trl-python /tmp/trl-venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TACTICS = ["simp", "ring_nf", "nlinarith [sq_nonneg (a - b)]", "omega", "norm_num", "linarith"]


def examples(n: int, seed: int = 0) -> list[tuple[str, str, str]]:
    """``n`` (name, statement, proof) triples of varied lengths (fixed by ``seed``)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        hyps = " ".join(f"(h{j} : a{j} + {j} ≤ b{j})" for j in range(rng.randint(0, 6)))
        stmt = f"theorem bench_{i} (a b : ℕ) {hyps} : a + b + {i} = b + a + {i} := by"
        lines = [f"  {rng.choice(TACTICS)}" for _ in range(rng.randint(1, 24))]
        out.append((f"bench_{i}", stmt, "\n" + "\n".join(lines)))
    return out


def make_model(out: Path, hidden: int, layers: int) -> Path:
    from leanrl.testing import make_tiny_model

    texts = [s + p for _, s, p in examples(64)] + ["Complete the following Lean 4 code:\n```"]
    return make_tiny_model(out, texts * 2, vocab_size=1024, hidden_size=hidden, layers=layers)


def texts(n: int) -> list[tuple[str, str]]:
    """(prompt, answer) strings exactly as leanrl's SFT builds them (for TRL)."""
    from leanrl import HarnessConfig, Task
    from leanrl.harnesses.whole_proof.prompts import build_prompt
    from leanrl.train.sft.data import Pair, target_text

    harness = HarnessConfig(prompt_format="deepseek")
    out = []
    for name, stmt, proof in examples(n):
        task = Task(name=name, header="", formal_statement=stmt)
        out.append((str(build_prompt(task, harness)), target_text(Pair(task, proof), harness)))
    return out


def rate(rows: list[tuple[int, float]], skip: int) -> float:
    """Tokens per second over logged steps ``skip+1..``: (tokens, seconds) per step."""
    kept = rows[skip:]
    return sum(t for t, _ in kept) / sum(s for _, s in kept)


# -- leanrl --------------------------------------------------------------------------------------


def run_leanrl(
    model: Path, args: argparse.Namespace, out: Path, by_length: bool = True
) -> dict[str, Any]:
    from leanrl import Task
    from leanrl.policy import PolicyConfig
    from leanrl.train.sft import SFTConfig, SFTTrainer
    from leanrl.train.sft.data import Pair

    pairs = [
        Pair(Task(name=n, header="", formal_statement=s), p) for n, s, p in examples(args.examples)
    ]
    cfg = SFTConfig(
        policy=PolicyConfig(model=str(model)),
        out=out,
        epochs=args.epochs,
        batch_size=args.batch,
        micro_batch_size=args.batch,
        lr=args.lr,
        lr_schedule="constant",
        save_every=10**9,
        seed=args.seed,
        group_by_length=by_length,
    )
    t0 = time.perf_counter()
    rows = SFTTrainer(cfg, pairs=pairs).train_sync()
    wall = time.perf_counter() - t0
    steps = [(int(r["tokens"]), r["tokens"] / r["tokens_per_s"]) for r in rows]
    return {"steps": steps, "wall_s": wall, "losses": [float(r["loss"]) for r in rows]}


# -- TRL (in the TRL venv, as a child process) ---------------------------------------------------


def run_trl(model: Path, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    steps: list[tuple[int, float]] = []
    losses: list[float] = []

    class Clock(TrainerCallback):  # type: ignore[misc]
        """Tokens and seconds from one logged step to the next (as leanrl's rows measure)."""

        def __init__(self) -> None:
            self.t = time.perf_counter()
            self.tokens = 0.0

        def on_log(self, *a: Any, logs: dict[str, Any] | None = None, **k: Any) -> None:
            if logs and "loss" in logs:
                now = time.perf_counter()
                steps.append((int(logs["num_tokens"] - self.tokens), now - self.t))
                losses.append(float(logs["loss"]))  # this step's, as leanrl's rows log it
                self.t, self.tokens = now, float(logs["num_tokens"])

    pairs = json.loads(args.data.read_text())  # leanrl is not importable in the TRL venv
    data = Dataset.from_dict({"prompt": [p for p, _ in pairs], "completion": [c for _, c in pairs]})
    config = SFTConfig(
        output_dir=str(out),
        use_cpu=True,
        per_device_train_batch_size=args.batch,
        num_train_epochs=args.epochs,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        warmup_steps=0,
        max_length=None,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        seed=args.seed,
        bf16=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    tok = AutoTokenizer.from_pretrained(model)
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(model),
        args=config,
        train_dataset=data,
        processing_class=tok,
        callbacks=[Clock()],
    )
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    return {"steps": steps, "wall_s": wall, "losses": losses}


# -- driver ---------------------------------------------------------------------------------------


def last_epoch_loss(losses: list[float], args: argparse.Namespace) -> float:
    """The mean of the per-step losses (each a step's token-mean loss, as both trainers log it)
    over the last epoch's steps: the same measure on both sides, over every example once. (The
    run's average, TRL's ``training_loss``, would weigh the first steps in; one last step
    would be one batch, which differs between the trainers.) The batches themselves still
    differ (order, length grouping), so it checks that both learn alike, no more."""
    per_epoch = max(1, math.ceil(args.examples / args.batch))
    return statistics.fmean(losses[-per_epoch:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trl-python", default="/tmp/trl-venv/bin/python")
    ap.add_argument("--examples", type=int, default=64)
    ap.add_argument("--epochs", type=float, default=2.0)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5, help="runs per trainer (alternating)")
    ap.add_argument("--skip", type=int, default=2, help="warm-up steps left out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--part", choices=["driver", "trl"], default="driver", help=argparse.SUPPRESS)
    ap.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    if args.part == "trl":
        args.result.write_text(json.dumps(run_trl(args.model, args, args.result.parent / "trl")))
        return
    if not Path(args.trl_python).exists():
        sys.exit(f"TRL venv python {args.trl_python} not found; see the module docstring")
    work = Path(tempfile.mkdtemp(prefix="sft-vs-trl-"))
    modes = ["leanrl", "trl", "leanrl-random-order"]
    rates: dict[str, list[float]] = {m: [] for m in modes}
    losses: dict[str, list[float]] = {m: [] for m in modes}
    totals: dict[str, list[int]] = {m: [] for m in modes}
    try:
        model = make_model(work / "model", args.hidden, args.layers)
        data = work / "data.json"
        data.write_text(json.dumps(texts(args.examples)))
        for i in range(args.repeats):
            # alternate which goes first, so that load on a shared machine hits both alike
            order = modes if i % 2 == 0 else modes[::-1]
            for who in order:
                if who.startswith("leanrl"):
                    shutil.rmtree(work / "leanrl-run", ignore_errors=True)
                    res = run_leanrl(model, args, work / "leanrl-run", who == "leanrl")
                else:
                    result = work / "trl.json"
                    cmd = [args.trl_python, __file__, "--part", "trl", "--model", str(model)]
                    cmd += ["--result", str(result), "--data", str(data)]
                    cmd += ["--epochs", str(args.epochs), "--batch", str(args.batch)]
                    cmd += ["--lr", str(args.lr), "--seed", str(args.seed)]
                    cmd += ["--threads", str(args.threads)]
                    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
                    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
                    res = json.loads(result.read_text())
                rates[who].append(rate([tuple(x) for x in res["steps"]], args.skip))
                losses[who].append(last_epoch_loss(res["losses"], args))
                totals[who].append(sum(int(t) for t, _ in res["steps"]))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def mmm(xs: list[float]) -> str:
        return f"min {min(xs):.0f} / median {statistics.median(xs):.0f} / max {max(xs):.0f}"

    ratio = statistics.median(rates["leanrl"]) / statistics.median(rates["trl"])
    plain = statistics.median(rates["leanrl-random-order"]) / statistics.median(rates["trl"])
    report = {"tokens_per_s": rates, "tokens_trained": totals, "last_epoch_loss": losses}
    print(json.dumps(report, indent=2))
    print(
        f"\n{args.examples} examples x {args.epochs:g} epochs, batch {args.batch}, model "
        f"{args.layers}x{args.hidden}, {args.threads} thread(s), {args.repeats} runs each\n"
        f"training tokens/s  leanrl:              {mmm(rates['leanrl'])}\n"
        f"                   TRL SFTTrainer:      {mmm(rates['trl'])}\n"
        f"                   leanrl, random order: {mmm(rates['leanrl-random-order'])}\n"
        f"leanrl / TRL (medians): {ratio:.2f}x   (without length grouping: {plain:.2f}x)\n"
        f"mean per-step loss over the last epoch (a sanity check: the batches differ)  leanrl "
        f"{statistics.median(losses['leanrl']):.3f}, TRL {statistics.median(losses['trl']):.3f}, "
        f"leanrl random order {statistics.median(losses['leanrl-random-order']):.3f} (medians)"
    )


if __name__ == "__main__":
    main()
