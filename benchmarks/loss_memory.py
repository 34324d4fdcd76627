"""Peak memory of the GRPO loss's log-probs: full logits (today's default) vs vocabulary tiles.

``full`` is what ``GRPOEngine._micro_step`` does without ``logprob_chunk``: the head makes the
logits [n, R, V] (``h·Wᵀ``), ``token_logprobs`` takes the chosen tokens' log-probs, the logged
entropy is computed row by row without gradients, and the backward pass goes to ``h`` and
``W``. ``tiled`` is the same with :func:`leanrl.train.grpo.tiled.tiled_logprobs` (``rows`` ×
``vocab_tile`` tiles, logits recomputed in the backward pass). Both start from the same
hidden states ``h`` [n, R, H] and head weight ``W`` [V, H] (what the model has anyway) and
measure the peak above that: the loss's own memory.

On a GPU (``--device cuda``): ``torch.cuda.max_memory_allocated`` above the memory allocated
before the loss, in one process, modes alternating, under bf16 autocast as ``bf16-mixed``
training runs (``--fp32`` for fp32). On the CPU: each measurement in a fresh process (a
process's peak RSS only grows), the peak RSS above the RSS just before the loss. One torch
thread. Printed: min/median/max per mode and vocabulary, the full/tiled ratio round by round
(min/median/max; each round runs the two back to back, the order alternating) and of the
medians, the seconds per forward+backward (not the point here, shown for the cost of the
recompute), and whether the two agree (log-probs and both gradients).

    python benchmarks/loss_memory.py [--seqs 4 --len 1024 --hidden 512 --vocab 32000 152064]
                                     [--rows 1024 --vocab-tile 8192 --rounds 3 --device cpu]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

MODES = ("full", "tiled")


def measure(mode: str, a: argparse.Namespace, vocab: int) -> dict[str, float]:
    """One forward+backward of ``mode``; its peak memory above the start (MB), its time and
    checksums of what it computed."""
    import torch

    from leanrl.train.grpo.loss import token_logprobs
    from leanrl.train.grpo.tiled import full_entropy, tiled_logprobs

    torch.set_num_threads(1)
    dev = torch.device(a.device)
    g = torch.Generator(device="cpu").manual_seed(0)
    h = (torch.randn(a.seqs, a.len, a.hidden, generator=g) * 0.5).to(dev).requires_grad_()
    w = (torch.randn(vocab, a.hidden, generator=g) * 0.05).to(dev).requires_grad_()
    targets = torch.randint(0, vocab, (a.seqs, a.len), generator=g).to(dev)
    adv = torch.randn(a.seqs, 1, generator=g).to(dev)
    cuda = dev.type == "cuda"
    bf16 = cuda and not a.fp32
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() / 2**20
    else:
        before = _rss_mb()
    t0 = time.perf_counter()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        if mode == "full":
            logits = torch.nn.functional.linear(h, w)  # the head: [n, R, V]
            logp = token_logprobs(logits, targets, a.temperature)
            ent = full_entropy(logits, a.temperature)
        else:
            logp, ent = tiled_logprobs(
                h, w, targets, temperature=a.temperature, rows=a.rows, vocab_tile=a.vocab_tile
            )
            ent = ent.detach()
    (-(logp * adv).mean()).backward()
    del logp
    if cuda:
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    secs = time.perf_counter() - t0
    assert h.grad is not None and w.grad is not None
    return {
        "peak_above_mb": peak - before,
        "seconds": secs,
        "entropy": float(ent.double().mean()),
        "grad_h": float(h.grad.double().norm()),
        "grad_w": float(w.grad.double().norm()),
    }


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _child_args(a: argparse.Namespace, mode: str, vocab: int) -> list[str]:
    args = [sys.executable, __file__, "--child", mode, "--vocab", str(vocab)]
    for k in ("seqs", "len", "hidden", "rows", "vocab_tile", "temperature", "device"):
        args += [f"--{k.replace('_', '-')}", str(getattr(a, k))]
    return args + (["--fp32"] if a.fp32 else [])


def run(a: argparse.Namespace, mode: str, vocab: int) -> dict[str, float]:
    if a.device == "cuda":  # one process: the CUDA peak counter can be reset
        import torch

        try:
            return measure(mode, a, vocab)
        except torch.OutOfMemoryError:  # the full path on a smaller GPU: that is the finding
            torch.cuda.empty_cache()
            return {"peak_above_mb": math.inf, "seconds": math.nan, "oom": 1.0}
    out = subprocess.run(
        _child_args(a, mode, vocab),
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def _stats(v: list[float]) -> str:
    return f"min {min(v):9.1f}  median {statistics.median(v):9.1f}  max {max(v):9.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seqs", type=int, default=4, help="sequences per micro-batch (n)")
    ap.add_argument("--len", type=int, default=1024, help="response tokens per sequence (R)")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--vocab", type=int, nargs="+", default=[32000, 152064])
    ap.add_argument("--rows", type=int, default=1024, help="tiled: tokens per tile")
    ap.add_argument("--vocab-tile", type=int, default=8192, help="tiled: vocabulary per tile")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--fp32", action="store_true", help="CUDA: no bf16 autocast")
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(measure(a.child, a, a.vocab[0])))
        return
    prec = "fp32" if a.device != "cuda" or a.fp32 else "bf16 autocast"
    print(
        f"{a.seqs} x {a.len} tokens, hidden {a.hidden}, {a.device} ({prec}), tiles {a.rows} x "
        f"{a.vocab_tile}, {a.rounds} rounds, modes alternating"
    )
    report: dict[str, Any] = {"args": {k: v for k, v in vars(a).items() if k != "child"}}
    if a.device == "cuda":  # warm-up, not counted: cuBLAS's workspace, the kernels' first load
        for m in MODES:
            measure(m, a, min(a.vocab))
    for vocab in a.vocab:
        res: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
        for r in range(a.rounds):
            for m in MODES if r % 2 == 0 else MODES[::-1]:
                res[m].append(run(a, m, vocab))
        logits_mb = a.seqs * a.len * vocab * 4 / 2**20
        print(f"V = {vocab}: fp32 logits [n, R, V] = {logits_mb:.0f} MB")
        for m in MODES:
            peaks = [x["peak_above_mb"] for x in res[m]]
            secs = [x["seconds"] for x in res[m]]
            print(f"  {m:5}: peak above start MB {_stats(peaks)}  | s {_stats(secs)}")
        med = {m: statistics.median(x["peak_above_mb"] for x in res[m]) for m in MODES}
        ratio = med["full"] / max(med["tiled"], 1e-9)
        # round by round (the two ran back to back, in alternating order): the figure to quote
        rounds = [
            f["peak_above_mb"] / max(t["peak_above_mb"], 1e-9)
            for f, t in zip(res["full"], res["tiled"], strict=True)
        ]
        f, t = res["full"][0], res["tiled"][0]
        tol = 1e-3 if prec == "fp32" else 2e-2
        keys = ("entropy", "grad_h", "grad_w")
        agree: bool | str = all(abs(f[k] - t[k]) <= tol * max(1.0, abs(f[k])) for k in keys)
        if "oom" in f or "oom" in t:
            agree = "n/a (out of memory)"
        print(
            f"  full / tiled peak per round: min {min(rounds):.1f}x, median "
            f"{statistics.median(rounds):.1f}x, max {max(rounds):.1f}x (ratio of the medians "
            f"{ratio:.1f}x; full = {med['full'] / logits_mb:.2f}x the fp32 logits); entropy and "
            f"gradients agree: {agree}"
        )
        report[str(vocab)] = {"runs": res, "ratio": ratio, "ratio_per_round": rounds,
                              "agree": agree, "logits_mb": logits_mb}  # fmt: skip
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(report, fh, indent=1)


if __name__ == "__main__":
    main()
