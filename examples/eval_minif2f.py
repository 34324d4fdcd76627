"""Evaluate a prover on a few miniF2F problems from Python (what `leanrl eval` does).

    python examples/eval_minif2f.py --model AI-MO/Kimina-Prover-Distill-1.7B --limit 8

Prints the pass@k table; every attempt is in OUT/results.jsonl and the report in OUT/report.md.
Run `leanrl setup --env minif2f` first for the Lean project (the `local` runtime needs it).
"""

from __future__ import annotations

import argparse

from leanrl.eval import EvalConfig, run_eval_sync


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="AI-MO/Kimina-Prover-Distill-1.7B")
    ap.add_argument(
        "--prompt-format", default="kimina", help="deepseek, chat, kimina, kimina-preview, goedel"
    )
    ap.add_argument("--data", default=None, help="local miniF2F JSONL (default: the HF hub)")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument("--runtime", default="local")
    ap.add_argument("--out", default="runs/example-minif2f")
    args = ap.parse_args()

    config = EvalConfig.model_validate(
        {
            "env": {
                "id": "minif2f",
                "taskset": {"path": args.data, "limit": args.limit},
                "harness": {"prompt_format": args.prompt_format},
                "runtime": {"name": args.runtime},
            },
            "policy": {"model": args.model},
            "sampling": {"max_tokens": args.max_tokens, "temperature": 0.6, "seed": 0},
            "samples": args.samples,
            "k": [1, args.samples],
            "out": args.out,
        }
    )
    summary = run_eval_sync(config)
    for group, row in summary["results"]["pass_at_k"].items():
        cells = ", ".join(f"{k}={100 * v:.1f}%" for k, v in row.items() if k.startswith("pass@"))
        print(f"{group:<16} {row['tasks']:>3} tasks  {cells}")
    print(f"report: {summary['out']}/report.md")


if __name__ == "__main__":
    main()
