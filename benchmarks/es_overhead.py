"""ES overhead, measured in one run on one random Llama-architecture model (no download).

    python benchmarks/es_overhead.py [--hidden 512 --layers 8 --vocab 4096 --threads 1]

Reports:

1. perturb + restore time as a fraction of one member's scoring time (greedy generation of
   ``--new-tokens`` tokens for ``--prompts`` prompts, the work a member does besides Lean);
2. replay time per iteration (applying one history record of ``--population`` seeds), and the
   same relative to a member's scoring time;
3. peak memory of one ES step (fp32 master copy + perturb + forward + restore + update) against a
   generic gradient step (one forward + backward + AdamW step on a language-modelling loss, the
   memory shape of a GRPO step; it is *not* leanrl's GRPO trainer, which adds a reference model,
   generation and more) on the same batch, each measured in a fresh process as the rise of peak
   RSS over the process's RSS after loading the model;
4. the history's size per iteration for ``--population`` members (plain and mirrored), written
   by the real :class:`~leanrl.train.es.history.ESHistory`.

Ratios are the figures to compare across machines; absolute times depend on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any


def _rss_peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _rss_now_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def make_model(args: argparse.Namespace) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 2,
        num_hidden_layers=args.layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
    )
    return LlamaForCausalLM(cfg).eval()


def batch(args: argparse.Namespace) -> Any:
    import torch

    g = torch.Generator().manual_seed(1)
    return torch.randint(2, args.vocab, (args.prompts, args.seq), generator=g)


def memory_child(args: argparse.Namespace) -> None:
    """Run one step kind in this (fresh) process and print its peak RSS rise as JSON."""
    import torch

    from leanrl.train.es.weights import ESWeights

    torch.set_num_threads(args.threads)
    model = make_model(args)
    ids = batch(args)
    base_now = _rss_now_mb()
    base_peak = _rss_peak_mb()
    if args.child == "es":
        w = ESWeights.from_model(model)
        w.perturb(7, 1e-3)
        with torch.no_grad():
            model(input_ids=ids)
        w.restore()
        w.apply_update([(1000 + i, 1e-5) for i in range(args.population)])
    else:  # a generic gradient step: forward + backward + AdamW (GRPO's memory shape)
        for p in model.parameters():
            p.requires_grad_(True)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
    peak = _rss_peak_mb()
    print(
        json.dumps(
            {"kind": args.child, "rise_mb": peak - max(base_now, 0.0), "base_peak_mb": base_peak}
        )
    )


def timing(args: argparse.Namespace) -> dict[str, float]:
    import torch

    from leanrl.train.es.weights import ESWeights

    torch.set_num_threads(args.threads)
    model = make_model(args)
    ids = batch(args)[:, : args.prompt_len]
    w = ESWeights.from_model(model)
    mask = torch.ones_like(ids)

    def score() -> None:
        with torch.no_grad():
            model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=args.new_tokens,
                min_new_tokens=args.new_tokens,
                do_sample=False,
                pad_token_id=0,
            )

    score()  # warm-up
    coeffs = [(5000 + i, 1e-5) for i in range(args.population)]
    # Interleaved, so that load from other processes hits all three alike; ratios per repeat.
    t_pr, t_score, t_rep = [], [], []
    for i in range(args.repeats):
        t0 = time.perf_counter()
        w.perturb(i, 1e-3)
        t1 = time.perf_counter()
        score()
        t2 = time.perf_counter()
        w.restore()
        t3 = time.perf_counter()
        w.apply_update(coeffs)
        t4 = time.perf_counter()
        t_pr.append((t1 - t0) + (t3 - t2))
        t_score.append(t2 - t1)
        t_rep.append(t4 - t3)
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    return {
        "params_m": w.numel() / 1e6,
        "perturb_restore_s": med(t_pr),
        "member_score_s": med(t_score),
        "replay_per_iteration_s": med(t_rep),
        "perturb_restore_fraction_of_member": med(
            [a / b for a, b in zip(t_pr, t_score, strict=True)]
        ),
        "replay_fraction_of_member": med([a / b for a, b in zip(t_rep, t_score, strict=True)]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--population", type=int, default=30)
    ap.add_argument("--prompts", type=int, default=8, help="prompts per member (batch)")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--seq", type=int, default=128, help="tokens per sequence in the memory step")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--child", choices=["es", "adamw"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    if args.child:
        memory_child(args)
        return
    t = timing(args)
    mem = {}
    for kind in ("es", "adamw"):
        argv = [sys.executable, __file__, "--child", kind, *sys.argv[1:]]
        res = subprocess.run(argv, capture_output=True, text=True, check=True)
        mem[kind] = json.loads(res.stdout.strip().splitlines()[-1])["rise_mb"]
    model_mb = t["params_m"] * 4
    report = {
        **t,
        "model_fp32_mb": model_mb,
        "es_step_peak_rise_mb": mem["es"],
        "adamw_step_peak_rise_mb": mem["adamw"],
        "es_over_adamw_step_memory": mem["es"] / mem["adamw"],
        **history_bytes(args.population),
    }
    print(json.dumps(report, indent=2))
    print(
        f"\nmodel {t['params_m']:.1f}M params ({model_mb:.0f} MB fp32), {args.threads} threads\n"
        f"perturb+restore: {t['perturb_restore_s'] * 1e3:.1f} ms = "
        f"{t['perturb_restore_fraction_of_member']:.1%} of one member's scoring "
        f"({t['member_score_s']:.2f} s: {args.prompts} prompts x {args.new_tokens} greedy tokens)\n"
        f"replay: {t['replay_per_iteration_s'] * 1e3:.0f} ms per iteration (N={args.population})"
        f" = {t['replay_fraction_of_member']:.2f} member-scorings\n"
        f"peak memory over the loaded model: ES step {mem['es']:.0f} MB vs a generic "
        f"forward+backward+AdamW step (GRPO-like, not leanrl's GRPO trainer) {mem['adamw']:.0f} MB "
        f"(ratio {report['es_over_adamw_step_memory']:.2f})\n"
        f"history: {report['history_bytes_per_iteration']} bytes per iteration "
        f"({report['history_bytes_per_iteration_mirrored']} with mirrored pairs)"
    )


def history_bytes(population: int) -> dict[str, int]:
    """Bytes one iteration adds to a real history file, plain and mirrored (K = N/2)."""
    import tempfile
    from pathlib import Path

    from leanrl.train.es.history import ESHistory, HistoryMeta, HistoryRecord, draw_seeds

    out = {}
    for key, k in (("", population), ("_mirrored", population // 2)):
        with tempfile.TemporaryDirectory() as d:
            h = ESHistory(Path(d) / "h.bin")
            h.open(HistoryMeta(0, "cpu", "float32"))
            before = h.path.stat().st_size
            h.append(HistoryRecord(1, tuple((s, 1e-4) for s in draw_seeds(0, 1, k))))
            out[f"history_bytes_per_iteration{key}"] = h.path.stat().st_size - before
    return out


if __name__ == "__main__":
    main()
