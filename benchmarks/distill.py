"""On-policy distillation on the CPU: a learning check on Countdown, and the teacher's scoring
throughput and peak memory through the tiled head against full logits.

    python benchmarks/distill.py learning [--seeds 3] [--tokens 30000] [--out runs/distill-bench]
        [--teacher sft+grpo|grpo] [--teacher-grpo-steps 100] [--student-sft-steps 0] [--lr 5e-3]
    python benchmarks/distill.py scoring [--vocab 32000 152064] [--seqs 4] [--len 512] [--rounds 3]

**learning.** The student is the tiny random model of tests/test_countdown.py (its tokenizer
trained on Countdown text, made on the spot; hidden 64, 2 layers), after ``--student-sft-steps``
of leanrl SFT on the training puzzles' solutions when that is set (the usual recipe: a short
SFT, then RL or distillation from it). The teacher, trained by leanrl (``--teacher``):

- ``sft+grpo`` (the default): a larger random model with the same tokenizer
  (``--teacher-hidden`` 128, ``--teacher-layers`` 2) after ``leanrl train sft`` on the training
  puzzles' known solutions (``--teacher-sft-steps``), then ``leanrl train grpo`` on the dense
  reward (``--teacher-grpo-steps``);
- ``grpo``: the student's own starting weights after ``--teacher-grpo-steps`` of leanrl GRPO
  alone (a teacher close to the student, as a checkpoint further along is).

From the student's starting weights, three variants run per seed, each to the same budget of generated student
tokens (``budget.tokens``; a run stops at the step boundary nearest it), one torch thread, the
variants of a seed in an order that rotates with the seed:

- ``grpo``: GRPO alone (the dense reward). It runs with the teacher at ``coef = 0``, which
  changes nothing in the update (every token's advantage is the group's) but logs the reverse
  KL to the teacher per step, for the curves;
- ``opd``: the reverse KL alone (``distill.only``, λ = 1);
- ``grpo+opd``: both (``A_j - λ·rkl_t``, λ = 1).

Per step: the training reward and the per-token reverse KL to the teacher at the student's own
samples. After each run: its final weights on 50 held-out puzzles (the test split), 8 samples
each at temperature 1 (mean dense reward, pass@1, pass@8), beside the starting model's and the
teacher's. Writes ``OUT/results.json``, prints min / median / max over seeds, and draws
``docs/img/distill-countdown.png`` (``--plot``).

**scoring.** A random Llama (``--hidden``, 2 layers) at each vocabulary scores ``--seqs``
sequences of ``--len`` response tokens (and a 64-token prompt) without gradients, as an
in-process teacher does: ``tiled`` through :class:`~leanrl.train.distill.teacher.LocalTeacher`
(tiles of ``--rows`` × ``--vocab-tile``), ``full`` the same forward with full logits and
``token_logprobs`` (what scoring without the tiled head costs). Each measurement is a fresh
process (a process's peak RSS only grows): the peak RSS above the RSS with the model loaded,
and scored tokens per second of wall and of CPU time. The modes alternate within a round, the
order rotating with the round. Printed: min / median / max per mode, the full/tiled peak ratio
per round, and whether the two agree.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
DATA = REPO / "environments" / "countdown" / "data"

ENV: dict[str, Any] = {
    "id": "countdown",
    "taskset": {"split": "train", "limit": 64},
    "harness": {"options": {"style": "direct", "reward": "dense"}},
}
"""64 training puzzles, answers only (``direct``), the graded reward a tiny model can learn."""

MAX_TOKENS = 16
BASE: dict[str, Any] = dict(
    steps=10_000,  # the token budget ends each run
    tasks_per_step=4,
    group_size=8,
    lr=5e-3,
    weight_decay=0.0,
    micro_batch_size=32,
    save_every=10_000,
    mask_truncated=False,
    dynamic_sampling="off",  # equal batches for every variant (distill.only needs it off)
)
"""GRPO as benchmarks/grpo_recipes.py trains it on Countdown, every group kept."""

VARIANTS: dict[str, dict[str, Any]] = {
    "grpo": {"coef": 0.0, "only": False},
    "opd": {"coef": 1.0, "only": True},
    "grpo+opd": {"coef": 1.0, "only": False},
}
"""The ``distill`` section of each variant (the teacher is added)."""


# -- learning ------------------------------------------------------------------------------------


def make_student(out: Path, hidden: int, layers: int = 2) -> Path:
    """A tiny random model whose tokenizer is trained on Countdown text (the same tokenizer for
    every size: the texts and vocabulary size are fixed)."""
    from leanrl.testing import make_tiny_model

    texts = []
    for line in (DATA / "countdown_train.jsonl").read_text().splitlines()[:300]:
        r = json.loads(line)
        texts.append(
            f"Using the numbers {r['numbers']}, create an equation that equals "
            f"{r['target']}.\nAnswer: <answer>{r['solution']}</answer>"
        )
    return make_tiny_model(out, texts, vocab_size=400, hidden_size=hidden, layers=layers)


def sft(start: Path, out: Path, steps: int) -> Path:
    """``start`` after ``steps`` of leanrl SFT on the training puzzles' known solutions."""
    from leanrl.policy import PolicyConfig
    from leanrl.train.sft import SFTConfig, SFTTrainer

    cfg = SFTConfig(
        env={**ENV, "taskset": {"split": "train"}},
        policy=PolicyConfig(model=str(start), device="cpu"),
        data={"from_env": True, "proof_column": "solution"},
        out=out,
        epochs=None,
        steps=steps,
        batch_size=16,
        micro_batch_size=16,
        lr=3e-3,
        save_every=10**9,
    )
    trainer = SFTTrainer(cfg)
    if trainer.run.latest_checkpoint() is None:
        trainer.train_sync()
    latest = trainer.run.latest_checkpoint()
    assert latest is not None
    return latest[1]


def make_teacher(out: Path, a: argparse.Namespace, student: Path) -> Path:
    """The teacher (cached in ``out``). ``--teacher sft+grpo``: a larger random model with the
    student's tokenizer (``--teacher-hidden``, ``--teacher-layers``) after leanrl SFT on the
    training puzzles' solutions and leanrl GRPO on the dense reward. ``--teacher grpo``: the
    student's own starting weights after leanrl GRPO alone (``--teacher-grpo-steps``, the
    variants' learning rate)."""
    from leanrl.policy import PolicyConfig, SamplingConfig
    from leanrl.train.grpo import GRPOConfig, GRPOTrainer

    sft_steps, grpo_steps = a.teacher_sft_steps, a.teacher_grpo_steps
    done = out / "grpo" / f"checkpoint-{grpo_steps}"
    if done.is_dir():
        return done
    if a.teacher == "grpo":
        warm, lr = student, BASE["lr"]
    else:
        start = make_student(out / "init", a.teacher_hidden, a.teacher_layers)
        warm, lr = sft(start, out / "sft", sft_steps), 1e-3
    grpo = GRPOConfig(
        env=ENV,
        policy=PolicyConfig(model=str(warm), device="cpu"),
        sampling=SamplingConfig(max_tokens=MAX_TOKENS, top_p=1.0, seed=0),
        out=out / "grpo",
        seed=0,
        **{**BASE, "steps": grpo_steps, "save_every": grpo_steps, "lr": lr},
    )
    GRPOTrainer(grpo).train_sync()
    return done


def train(student: Path, teacher: Path, out: Path, seed: int, tokens: int, variant: str) -> Any:
    from leanrl.policy import PolicyConfig, SamplingConfig
    from leanrl.train.grpo import GRPOConfig, GRPOTrainer

    cfg = GRPOConfig(
        env=ENV,
        policy=PolicyConfig(model=str(student), device="cpu"),
        sampling=SamplingConfig(max_tokens=MAX_TOKENS, top_p=1.0, seed=seed),
        out=out,
        seed=seed,
        budget={"tokens": tokens},
        distill={"teacher": str(teacher), **VARIANTS[variant]},
        **BASE,
    )
    trainer = GRPOTrainer(cfg)
    trainer.train_sync()
    return trainer


def evaluate(model: Path, out: Path, limit: int, seed: int) -> dict[str, float]:
    """Mean dense reward, pass@1 and pass@8 of 8 samples per held-out puzzle."""
    from leanrl.eval.config import EvalConfig
    from leanrl.eval.runner import run_eval_sync

    cfg = EvalConfig(
        env={**ENV, "taskset": {"split": "test", "limit": limit}},
        policy={"model": str(model), "device": "cpu"},
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
        "eval_reward": sum(rewards) / len(rewards),
        "pass@1": float(passk["pass@1"]),
        "pass@8": float(passk["pass@8"]),
    }


def _curves(rows: list[dict[str, Any]]) -> dict[str, list[float]]:
    xs: list[float] = []
    total = 0
    out: dict[str, list[float]] = {"tokens": xs, "reward": [], "kl": []}
    for r in rows:
        if r.get("reward_mean") is None:
            continue
        total += int(r.get("tokens") or 0)
        xs.append(total)
        out["reward"].append(float(r["reward_mean"]))
        out["kl"].append(float(r.get("distill/reverse_kl") or float("nan")))
    return out


def _mean5(v: list[float]) -> float:
    return statistics.fmean(v[-5:]) if v else float("nan")


def _first5(v: list[float]) -> float:
    return statistics.fmean(v[:5]) if v else float("nan")


def plot(results: dict[str, list[dict[str, Any]]], ref: dict[str, float], path: Path,
         tokens: int) -> None:  # fmt: skip
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = [tokens * i / 40 for i in range(1, 41)]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), dpi=120)
    for (name, runs), color in zip(results.items(), ("C0", "C1", "C2"), strict=False):
        for ax, key in zip(axes, ("reward", "kl"), strict=True):
            per_seed = []
            for run in runs:
                xs, ys = run["curves"]["tokens"], run["curves"][key]
                ax.plot(xs, ys, color=color, alpha=0.15, lw=0.8)
                per_seed.append(
                    [next((y for x, y in zip(xs, ys, strict=True) if x >= g), ys[-1]) for g in grid]
                )
            mean = [statistics.fmean(v) for v in zip(*per_seed, strict=True)]
            w = 4
            smooth = [statistics.fmean(mean[max(0, i - w + 1) : i + 1]) for i in range(len(mean))]
            ax.plot(grid, smooth, color=color, lw=2, label=f"{name} (mean of {len(runs)})")
    axes[0].axhline(ref["teacher_train_reward"], color="k", ls="--", lw=1, label="teacher")
    axes[0].set_ylabel("training reward (dense)")
    axes[1].set_ylabel("reverse KL to the teacher, nats/token")
    for ax in axes:
        ax.set_xlabel("generated student tokens")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("On-policy distillation on Countdown, tiny CPU student")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def learning(a: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(1)
    out = a.out or Path(tempfile.mkdtemp(prefix="distill-bench-"))
    if a.lr is not None:
        BASE["lr"] = a.lr
    t_all = time.perf_counter()
    student = make_student(out / "student", a.hidden)
    if a.student_sft_steps:  # the usual recipe: a short SFT, then distillation or RL from it
        student = sft(student, out / "student-sft", a.student_sft_steps)
    t0 = time.perf_counter()
    teacher = make_teacher(out / "teacher", a, student)
    t_teacher = time.perf_counter() - t0
    teacher_rows = [
        r for r in json.loads("[" + ",".join((out / "teacher" / "grpo" / "metrics.jsonl")
                              .read_text().splitlines()) + "]") if "reward_mean" in r
    ]  # fmt: skip
    ref = {
        "teacher_train_reward": _mean5([float(r["reward_mean"]) for r in teacher_rows]),
        "teacher_seconds": t_teacher,
    }
    print(f"teacher: {teacher} ({t_teacher:.0f} s), training reward over its last 5 GRPO "
          f"steps {ref['teacher_train_reward']:.3f}", flush=True)  # fmt: skip
    base = evaluate(student, out / "eval-student", a.eval_limit, 0)
    held = evaluate(teacher, out / "eval-teacher", a.eval_limit, 0)
    print(f"held-out: starting student {base}, teacher {held}", flush=True)
    names = list(VARIANTS)
    results: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for seed in range(a.seeds):
        order = names[seed % len(names) :] + names[: seed % len(names)]
        for name in order:
            t0 = time.perf_counter()
            c0 = time.process_time()
            run_dir = out / f"{name.replace('+', '-')}-seed{seed}"
            trainer = train(student, teacher, run_dir, seed, a.tokens, name)
            rows = [r for r in trainer.run.metrics() if "reward_mean" in r]
            latest = trainer.run.latest_checkpoint()
            assert latest is not None
            figures = evaluate(latest[1], run_dir / "eval", a.eval_limit, seed)
            cur = _curves(rows)
            r = {
                "seed": seed,
                "steps": len(rows),
                "tokens": cur["tokens"][-1] if cur["tokens"] else 0,
                "reward_first5": _first5(cur["reward"]),
                "reward_last5": _mean5(cur["reward"]),
                "kl_first5": _first5(cur["kl"]),
                "kl_last5": _mean5(cur["kl"]),
                "teacher_s": sum(float(x.get("distill/time_s") or 0.0) for x in rows),
                **figures,
                "seconds": time.perf_counter() - t0,
                "cpu_s": time.process_time() - c0,
                "curves": cur,
            }
            results[name].append(r)
            print(f"{name:>9} seed {seed}: {r['steps']} steps, {r['tokens']} tokens, reward "
                  f"{r['reward_first5']:.3f} -> {r['reward_last5']:.3f}, reverse KL "
                  f"{r['kl_first5']:.3f} -> {r['kl_last5']:.3f}, held-out reward "
                  f"{r['eval_reward']:.3f} pass@1 {r['pass@1']:.3f} pass@8 {r['pass@8']:.3f} "
                  f"({r['seconds']:.0f} s, teacher {r['teacher_s']:.1f} s)", flush=True)  # fmt: skip
    (out / "results.json").write_text(
        json.dumps({"student": base, "teacher": held, **ref, **results}, indent=1)
    )
    print(f"\n{len(names)} variants x {a.seeds} seeds, {time.perf_counter() - t_all:.0f} s")
    print("min / median / max over seeds")
    keys = ("reward_last5", "kl_first5", "kl_last5", "eval_reward", "pass@1", "pass@8", "tokens")
    print(f"{'variant':>9} " + " ".join(f"{k:>20}" for k in keys))
    for name, runs in results.items():
        cells = []
        for k in keys:
            v = sorted(float(x[k]) for x in runs)
            cells.append(f"{v[0]:.3g}/{statistics.median(v):.3g}/{v[-1]:.3g}".rjust(20))
        print(f"{name:>9} " + " ".join(cells))
    plot(results, ref, a.plot, a.tokens)
    print(f"plot: {a.plot}\nruns: {out}")
    return 0


# -- scoring -------------------------------------------------------------------------------------


def _rss_mb() -> float:
    with open("/proc/self/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return float(line.split()[1]) / 1024
    return float("nan")


def measure(mode: str, a: argparse.Namespace, vocab: int, folder: Path) -> dict[str, float]:
    """One scoring pass of ``mode`` in this (fresh) process."""
    import torch

    from leanrl.train.distill.config import DistillConfig
    from leanrl.train.distill.teacher import LocalTeacher, TeacherSource

    torch.set_num_threads(1)
    cfg = DistillConfig(teacher=str(folder), micro_batch_size=a.seqs, logprob_chunk=a.rows,
                        vocab_tile=a.vocab_tile)  # fmt: skip
    t = LocalTeacher(TeacherSource(str(folder), "local", str(folder)), cfg, torch.device("cpu"),
                     torch.float32)  # fmt: skip
    t.load()
    g = torch.Generator().manual_seed(0)
    seqs = [
        (torch.randint(0, vocab, (64,), generator=g).tolist(),
         torch.randint(0, vocab, (a.len,), generator=g).tolist())
        for _ in range(a.seqs)
    ]  # fmt: skip
    if mode == "full":
        t._checked = True  # tiles None: the forward keeps full logits (as without the tiled head)
    else:
        t._check_tiles(seqs[0])
        assert t.tiles is not None
    before = _rss_mb()
    t0, c0 = time.perf_counter(), time.process_time()
    got = t._forward(seqs) if mode == "full" else t.score(seqs)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    n = sum(len(x) for x in got)
    return {
        "peak_above_mb": peak - before,
        "tok_per_s": n / wall,
        "tok_per_cpu_s": n / max(cpu, 1e-9),
        "checksum": float(sum(sum(x) for x in got)),
    }


def make_scoring_model(folder: Path, vocab: int, hidden: int) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if (folder / "config.json").is_file():
        return folder
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 2,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=4096, tie_word_embeddings=True)  # fmt: skip
    LlamaForCausalLM(cfg).save_pretrained(folder)
    return folder


def scoring(a: argparse.Namespace) -> int:
    out = a.out or Path(tempfile.mkdtemp(prefix="distill-scoring-"))
    print(f"{a.seqs} sequences x {a.len} response tokens (+64 prompt), hidden {a.hidden}, "
          f"tiles {a.rows} x {a.vocab_tile}, one torch thread, fresh process per measurement")  # fmt: skip
    for vocab in a.vocab:
        folder = make_scoring_model(out / f"model-{vocab}", vocab, a.hidden)
        res: dict[str, list[dict[str, float]]] = {"full": [], "tiled": []}
        ratios = []
        for k in range(a.rounds):
            order = ["full", "tiled"] if k % 2 == 0 else ["tiled", "full"]
            got = {}
            for mode in order:
                argv = [sys.executable, __file__, "_measure", mode, str(vocab), str(folder),
                        "--seqs", str(a.seqs), "--len", str(a.len), "--rows", str(a.rows),
                        "--vocab-tile", str(a.vocab_tile)]  # fmt: skip
                p = subprocess.run(argv, capture_output=True, text=True, check=False)
                if p.returncode != 0:
                    print(p.stderr[-2000:], file=sys.stderr)
                    return 1
                got[mode] = json.loads(p.stdout.strip().splitlines()[-1])
                res[mode].append(got[mode])
            ratios.append(got["full"]["peak_above_mb"] / max(got["tiled"]["peak_above_mb"], 1e-9))
        print(f"V = {vocab}:")
        for mode, runs in res.items():
            cells = []
            for key, unit in (("peak_above_mb", "MB"), ("tok_per_s", "tok/s"),
                              ("tok_per_cpu_s", "tok/CPU-s")):  # fmt: skip
                v = sorted(r[key] for r in runs)
                cells.append(f"{unit} {v[0]:.0f}/{statistics.median(v):.0f}/{v[-1]:.0f}")
            print(f"  {mode:5}: peak above start " + " | ".join(cells))
        r = sorted(ratios)
        agree = abs(res["full"][0]["checksum"] - res["tiled"][0]["checksum"])
        print(f"  full / tiled peak per round: {r[0]:.1f}x / {statistics.median(r):.1f}x / "
              f"{r[-1]:.1f}x; |sum of log-probs full - tiled| = {agree:.3g}")  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    ln = sub.add_parser("learning")
    ln.add_argument("--out", type=Path, default=None)
    ln.add_argument("--seeds", type=int, default=3)
    ln.add_argument("--tokens", type=int, default=30_000, help="generated student tokens per run")
    ln.add_argument("--eval-limit", type=int, default=50)
    ln.add_argument("--hidden", type=int, default=64)
    ln.add_argument("--student-sft-steps", type=int, default=0)
    ln.add_argument("--lr", type=float, default=None, help="the variants' (default: BASE's)")
    ln.add_argument("--teacher", choices=("sft+grpo", "grpo"), default="sft+grpo")
    ln.add_argument("--teacher-hidden", type=int, default=128)
    ln.add_argument("--teacher-layers", type=int, default=2)
    ln.add_argument("--teacher-sft-steps", type=int, default=1500)
    ln.add_argument("--teacher-grpo-steps", type=int, default=100)
    ln.add_argument("--plot", type=Path, default=REPO / "docs/img/distill-countdown.png")
    sc = sub.add_parser("scoring")
    sc.add_argument("--out", type=Path, default=None)
    sc.add_argument("--vocab", type=int, nargs="+", default=[32000, 152064])
    for p in (sc, sub.add_parser("_measure")):
        p.add_argument("--seqs", type=int, default=4)
        p.add_argument("--len", type=int, default=512)
        p.add_argument("--rows", type=int, default=1024)
        p.add_argument("--vocab-tile", type=int, default=8192)
    sc.add_argument("--hidden", type=int, default=256)
    sc.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    if a.what == "learning":
        return learning(a)
    if a.what == "scoring":
        return scoring(a)
    return 2


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_measure":
        mode, vocab, folder = sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
        ns = argparse.Namespace(seqs=4, len=512, rows=1024, vocab_tile=8192)
        rest = sys.argv[5:]
        for k in range(0, len(rest), 2):
            setattr(ns, rest[k].lstrip("-").replace("-", "_"), int(rest[k + 1]))
        print(json.dumps(measure(mode, ns, vocab, folder)))
        raise SystemExit(0)
    raise SystemExit(main())
