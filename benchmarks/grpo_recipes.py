"""GRPO recipes learning check on Countdown (CPU): plain GRPO against a difficulty curriculum
and the pass@k advantage, at equal generated tokens.

    python benchmarks/grpo_recipes.py [--out runs/grpo-recipes] [--seeds 3] [--tokens 60000]
        [--model PATH]                      # default: a tiny model made on the spot
        [--lr 1e-5] [--max-tokens 32]       # for a real model

Every variant is plain GRPO plus a dict of config overrides (``VARIANTS``); each runs once per
seed, the variants of a seed one after the other in an order that rotates with the seed, all
with one torch thread and the same budget of generated tokens (``budget.tokens``: a run stops
at the step boundary nearest it). The final weights of each run are then evaluated on held-out
Countdown puzzles (the test split) with ``leanrl eval``'s runner: pass@1 and pass@8 from 8
samples at temperature 1, and the mean reward of those samples.

Writes ``OUT/results.json`` (every run's curve and figures), prints a table (min / median / max
over seeds) and draws ``docs/img/grpo-recipes-countdown.png`` (training reward against
generated tokens, mean over seeds; ``--plot`` to put it elsewhere). docs/training-grpo.md,
"Recipes learning check", holds the figures of the last run.

The default model is the tiny random model of tests/test_countdown.py (its tokenizer trained on
Countdown text, ~0.1M weights). It cannot solve a puzzle, so pass@k stays 0 there and the
comparison rests on the ``dense`` reward (an answer that uses the given numbers and comes close
scores higher). ``--model`` takes a real model folder (SmolLM2-135M, ``leanrl models get
smollm2``); a real model needs far more tokens than fit in a CPU minute.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "environments" / "countdown" / "data"

ENV: dict[str, Any] = {
    "id": "countdown",
    "taskset": {"split": "train", "limit": 64},
    "harness": {"options": {"style": "direct", "reward": "dense"}},
}
"""64 training puzzles, answers only (``direct``), the graded reward a tiny model can learn."""

BASE: dict[str, Any] = dict(
    steps=10_000,  # the token budget ends each run
    tasks_per_step=4,
    group_size=8,
    lr=5e-3,
    weight_decay=0.0,
    micro_batch_size=32,
    save_every=10_000,  # one checkpoint, when the budget is spent
    mask_truncated=False,  # 16-token completions are often cut: keep their loss
    dynamic_sampling="drop",
)
"""Plain GRPO as tests/test_countdown.py trains it (DAPO loss, group-std scaling)."""

VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {},
    "curriculum": {
        # frontier tasks (some attempt scored above the bare-answer 0.1, none mostly right)
        # drawn 4x as often as the tasks every attempt of which scored 0.1 or less
        "curriculum": {
            "mode": "frontier",
            "signal": "reward",
            "hard_at_most": 0.1,
            "easy_above": 0.5,
            "min_attempts": 8,
            "frontier_weight": 4.0,
        }
    },
    "pass@k": {"advantage": "pass_at_k", "pass_k": 4},
}
"""Each variant: config overrides on top of ``BASE`` (pass@k only where GRPOConfig has it)."""


def make_model(out: Path) -> Path:
    """The tiny Countdown model of tests/test_countdown.py (made here, no download)."""
    from leanrl.testing import make_tiny_model

    texts = []
    for line in (DATA / "countdown_train.jsonl").read_text().splitlines()[:300]:
        r = json.loads(line)
        texts.append(
            f"Using the numbers {r['numbers']}, create an equation that equals "
            f"{r['target']}.\nAnswer: <answer>{r['solution']}</answer>"
        )
    return make_tiny_model(out, texts, vocab_size=400)


MAX_TOKENS = 16
"""Completion length in training and eval (``--max-tokens``)."""


def train(model: Path, out: Path, seed: int, tokens: int, overrides: dict[str, Any]) -> Any:
    from leanrl.policy import PolicyConfig, SamplingConfig
    from leanrl.train.grpo import GRPOConfig, GRPOTrainer

    cfg = GRPOConfig(
        env=ENV,
        policy=PolicyConfig(model=str(model), device="cpu"),
        sampling=SamplingConfig(max_tokens=MAX_TOKENS, top_p=1.0, seed=seed),
        out=out,
        seed=seed,
        budget={"tokens": tokens},
        **{**BASE, **overrides},
    )
    trainer = GRPOTrainer(cfg)
    trainer.train_sync()
    return trainer


def evaluate(checkpoint: Path, out: Path, limit: int, seed: int) -> dict[str, float]:
    """pass@1, pass@8 and the mean reward of 8 samples per held-out puzzle."""
    from leanrl.eval.config import EvalConfig
    from leanrl.eval.runner import run_eval_sync

    env = {**ENV, "taskset": {"split": "test", "limit": limit}}
    cfg = EvalConfig(
        env=env,
        policy={"model": str(checkpoint), "device": "cpu"},
        sampling={"max_tokens": MAX_TOKENS, "temperature": 1.0, "top_p": 1.0, "seed": seed},
        samples=8,
        k=[1, 8],
        out=out,
        progress=False,
    )
    summary = run_eval_sync(cfg)
    passk = summary["results"]["pass_at_k"]["all"]
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines() if x]
    rewards = [float(r["reward"]) for r in rows if isinstance(r.get("reward"), (int, float))]
    return {
        "pass@1": float(passk["pass@1"]),
        "pass@8": float(passk["pass@8"]),
        "eval_reward": sum(rewards) / len(rewards),
    }


def curve(rows: list[dict[str, Any]]) -> tuple[list[int], list[float]]:
    """Training reward against cumulative generated tokens, one point per step."""
    xs, ys, total = [], [], 0
    for r in rows:
        if r.get("reward_mean") is None:
            continue
        total += int(r.get("tokens") or 0)
        xs.append(total)
        ys.append(float(r["reward_mean"]))
    return xs, ys


def plot(results: dict[str, list[dict[str, Any]]], path: Path, tokens: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = [tokens * i / 40 for i in range(1, 41)]
    fig, ax = plt.subplots(figsize=(6.5, 3.8), dpi=120)
    for (name, runs), color in zip(results.items(), ("C0", "C1", "C2", "C3"), strict=False):
        per_seed = []
        for run in runs:
            xs, ys = run["curve"]
            ax.plot(xs, ys, color=color, alpha=0.18, lw=0.8)
            # the reward of the step that was running at each grid point
            per_seed.append(
                [next((y for x, y in zip(xs, ys, strict=True) if x >= g), ys[-1]) for g in grid]
            )
        w = 5  # a moving average over steps makes the seed mean readable
        mean = [statistics.fmean(v) for v in zip(*per_seed, strict=True)]
        smooth = [statistics.fmean(mean[max(0, i - w + 1) : i + 1]) for i in range(len(mean))]
        ax.plot(grid, smooth, color=color, lw=2, label=f"{name} (mean of {len(runs)} seeds)")
    ax.set_xlabel("generated tokens")
    ax.set_ylabel("training reward (dense)")
    ax.set_title("GRPO recipes on Countdown, tiny CPU model")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="run folders (default: a temp dir)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=60_000, help="generated tokens per run")
    ap.add_argument("--eval-limit", type=int, default=50, help="held-out puzzles")
    ap.add_argument("--model", type=Path, default=None, help="model folder (default: tiny)")
    ap.add_argument("--plot", type=Path, default=REPO / "docs/img/grpo-recipes-countdown.png")
    ap.add_argument(
        "--variants", default=None, help="comma-separated subset of the variants ('none': base)"
    )
    ap.add_argument("--lr", type=float, default=None, help="learning rate (default: BASE's)")
    ap.add_argument("--max-tokens", type=int, default=16, help="completion length")
    args = ap.parse_args(argv)
    global MAX_TOKENS
    MAX_TOKENS = args.max_tokens
    if args.lr is not None:
        BASE["lr"] = args.lr

    import torch

    torch.set_num_threads(1)
    from leanrl.train.grpo import GRPOConfig

    variants = dict(VARIANTS)
    if "advantage" not in GRPOConfig.model_fields:
        print("GRPOConfig has no `advantage` option here: pass@k left out", file=sys.stderr)
        variants.pop("pass@k")
    if args.variants:
        wanted = [] if args.variants == "none" else args.variants.split(",")
        variants = {k: variants[k] for k in wanted}
    out = args.out or Path(tempfile.mkdtemp(prefix="grpo-recipes-"))
    model = args.model or make_model(out / "tiny-model")
    names = list(variants)
    results: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    t_all = time.perf_counter()
    base = []  # the starting model on the same held-out puzzles: where training starts from
    for seed in range(args.seeds):
        base.append(evaluate(model, out / f"base-eval-seed{seed}", args.eval_limit, seed))
    print(
        "starting model: eval reward "
        + "/".join(f"{b['eval_reward']:.3f}" for b in base)
        + ", pass@1 "
        + "/".join(f"{b['pass@1']:.3f}" for b in base)
        + ", pass@8 "
        + "/".join(f"{b['pass@8']:.3f}" for b in base)
        + " (seeds "
        + ", ".join(map(str, range(args.seeds)))
        + ")",
        flush=True,
    )
    for seed in range(args.seeds):
        order = names[seed % len(names) :] + names[: seed % len(names)]  # rotates per seed
        for name in order:
            t0 = time.perf_counter()
            run_dir = out / f"{name.replace('@', 'at')}-seed{seed}"
            trainer = train(model, run_dir, seed, args.tokens, variants[name])
            rows = [r for r in trainer.run.metrics() if "reward_mean" in r]
            latest = trainer.run.latest_checkpoint()
            assert latest is not None, "the run saved no checkpoint"
            figures = evaluate(latest[1], run_dir / "eval", args.eval_limit, seed)
            xs, ys = curve(rows)
            tail = ys[-5:]
            results[name].append(
                {
                    "seed": seed,
                    "steps": len(rows),
                    "tokens": xs[-1] if xs else 0,
                    "train_reward_last5": statistics.fmean(tail) if tail else None,
                    "train_reward_first5": statistics.fmean(ys[:5]) if ys else None,
                    **figures,
                    "seconds": time.perf_counter() - t0,
                    "curve": [xs, ys],
                }
            )
            r = results[name][-1]
            print(
                f"{name:>10} seed {seed}: {r['steps']} steps, {r['tokens']} tokens, train reward "
                f"{r['train_reward_first5']:.3f} -> {r['train_reward_last5']:.3f}, eval reward "
                f"{r['eval_reward']:.3f}, pass@1 {r['pass@1']:.3f}, pass@8 {r['pass@8']:.3f} "
                f"({r['seconds']:.0f} s)",
                flush=True,
            )
    (out / "results.json").write_text(json.dumps({"base": base, **results}, indent=1))
    if not names:
        return 0
    print(f"\n{len(names)} variants x {args.seeds} seeds, {time.perf_counter() - t_all:.0f} s")
    print("figure: min / median / max over seeds")
    keys = ("train_reward_last5", "eval_reward", "pass@1", "pass@8", "tokens")
    print(f"{'variant':>10} " + " ".join(f"{k:>22}" for k in keys))
    for name, runs in results.items():
        cells = []
        for k in keys:
            v = sorted(float(r[k]) for r in runs)
            cells.append(f"{v[0]:.3g}/{statistics.median(v):.3g}/{v[-1]:.3g}".rjust(22))
        print(f"{name:>10} " + " ".join(cells))
    plot(results, args.plot, args.tokens)
    print(f"plot: {args.plot}")
    print(f"runs and results.json: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
