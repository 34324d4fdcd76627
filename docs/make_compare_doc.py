"""Regenerate docs/compare.md's SmolLM2 figures from the run they come from, instead of retyping.

    python docs/make_compare_doc.py --run runs/compare-smollm2 [--command-s 1296]

reads the compare run (``OUT/compare.json``, each run's ``metrics.jsonl`` and its held-out
evaluations' ``results.jsonl``), stores what the doc quotes in
``docs/data/compare-smollm2.json``, draws ``docs/img/compare-countdown-smollm2.png`` again from
``OUT/compare.json`` (the run's ``compare.png`` with today's plotting code), and rewrites the block of ``docs/compare.md``
between the ``compare-smollm2`` markers from that file. ``--check`` rewrites nothing: it exits
1 when the doc's block is not what the stored file gives (``tests/test_new_user_round3.py``
checks the same). ``--command-s``: the whole command's wall time, measured outside (the run
records its steps' and evaluations' times, not the command's).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent
DOC = DOCS / "compare.md"
DATA = DOCS / "data" / "compare-smollm2.json"
PNG = DOCS / "img" / "compare-countdown-smollm2.png"
BEGIN = (
    "<!-- compare-smollm2: made by docs/make_compare_doc.py from docs/data/compare-smollm2.json -->"
)
END = "<!-- /compare-smollm2 -->"
_EXAMPLES = 2  # held-out answers quoted per method, at the start and at the end


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def _step_s(row: dict[str, Any]) -> float:
    """A step's wall seconds (ES writes ``step_time_s``, GRPO ``time_step``)."""
    return float(row.get("step_time_s") or row.get("time_step") or 0.0)


def collect(run: Path, command_s: float | None = None) -> dict[str, Any]:
    """What the doc quotes, from the compare run in ``run``."""
    report = json.loads((run / "compare.json").read_text(encoding="utf-8"))
    runs: list[dict[str, Any]] = []
    for r in report["runs"]:
        folder = run / Path(r["run"]).name
        metrics = _rows(folder / "metrics.jsonl")
        steps = [m for m in metrics if m.get("step", 0) > 0 and "reward_mean" in m]
        evals = []
        for d in sorted((folder / "eval").glob("step-*"), key=lambda p: int(p.name[5:])):
            recs = _rows(d / "results.jsonl")
            recs.sort(key=lambda x: (x["task_id"], x["sample"]))
            evals.append(
                {
                    "step": int(d.name[5:]),
                    "pass@1": sum(bool(x["accepted"]) for x in recs) / len(recs),
                    "reward": statistics.fmean(float(x["reward"]) for x in recs),
                    "answers": [x["completion"] for x in recs[:_EXAMPLES]],
                }
            )
        runs.append(
            {
                **{k: r[k] for k in ("method", "seed", "steps", "spent", "usd", "wall_s")},
                **{k: r[k] for k in ("acc_start", "acc_end", "acc_best")},
                "train_reward_first": steps[0]["reward_mean"] if steps else None,
                "train_reward_last": steps[-1]["reward_mean"] if steps else None,
                "step_s_median": statistics.median(_step_s(m) for m in steps) if steps else None,
                "skipped": sum(bool(m.get("skipped")) for m in steps),
                "evals": evals,
            }
        )
    return {
        "budget_tokens": report["budget"].get("tokens"),
        "seeds": report["seeds"],
        "command_s": command_s,
        "runs": runs,
    }


def _quote(text: str, most: int = 72) -> str:
    """A completion as inline code on one line (at most ``most`` characters)."""
    one = " ".join(text.split()).replace("`", "'")
    return f"`{one if len(one) <= most else one[: most - 1] + '…'}`"


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def render(data: dict[str, Any]) -> str:
    """The doc's block (between the markers, markers included) from the stored data."""
    runs = data["runs"]
    n_evals = sum(len(r["evals"]) for r in runs)
    took = (
        f"{data['command_s'] / 60:.1f} minutes for the whole command"
        if data.get("command_s")
        else "the whole command's time was not measured"
    )
    lines = [
        BEGIN,
        "",
        "| method | seed | steps | generated tokens | held-out pass@1 start → end (best) | $ "
        "| wall s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in runs:
        lines.append(
            f"| {r['method']} | {r['seed']} | {r['steps']} | {r['spent']:.0f} | "
            f"{_f(r['acc_start'])} → {_f(r['acc_end'])} ({_f(r['acc_best'])}) | "
            f"{r['usd']:.4f} | {r['wall_s']:.1f} |"
        )
    lines += [
        "",
        f"({took}: {len(runs)} runs and {n_evals} held-out evaluations. The table is the run's "
        "`report.md`; wall s counts each run's training steps and evaluations.) The held-out "
        "*dense* reward, from the evaluations' `results.jsonl` (not in the report):",
        "",
    ]
    steps = sorted({e["step"] for r in runs for e in r["evals"]})
    lines.append("| held-out mean dense reward at step | " + " | ".join(map(str, steps)) + " |")
    lines.append("| --- " * (len(steps) + 1) + "|")
    for r in runs:
        by_step = {e["step"]: e["reward"] for e in r["evals"]}
        cells = [_f(by_step.get(s)) for s in steps]
        lines.append(f"| {r['method'].upper()} | " + " | ".join(cells) + " |")
    lines += ["", "From the same run:", ""]
    for r in runs:
        first, last = r["evals"][0], r["evals"][-1]
        quote = "; ".join(_quote(a) for a in last["answers"])
        before = "; ".join(_quote(a) for a in first["answers"])
        skipped = (
            f", {r['skipped']} of its {r['steps']} updates skipped (all members tied)"
            if r["method"] == "es"
            else ""
        )
        lines.append(
            f"- **{r['method'].upper()}**: training reward {_f(r['train_reward_first'])} at step "
            f"1, {_f(r['train_reward_last'])} at step {r['steps']}{skipped}; "
            f"{r['step_s_median']:.0f} s per step (median); held-out answers to the first "
            f"{len(first['answers'])} test puzzles at step {first['step']}: {before}; at step "
            f"{last['step']}: {quote}."
        )
    lines += ["", END]
    return "\n".join(lines)


def _draw(run: Path, path: Path) -> None:
    """The run's plot, drawn again from its ``compare.json`` with today's plotting code (a run
    made before a change to the plot keeps its numbers, not its old picture)."""
    from leanrl.compare import _plot

    report = json.loads((run / "compare.json").read_text(encoding="utf-8"))
    x_label = "generated tokens" if report["x"] == "total_tokens" else "GPU-seconds"
    _plot(report["runs"], x_label, path)


def block_of(doc: str) -> str:
    """The generated block of ``doc`` (markers included)."""
    start, end = doc.index(BEGIN), doc.index(END) + len(END)
    return doc[start:end]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, help="the compare run's OUT folder")
    ap.add_argument("--command-s", type=float, default=None, help="the command's wall seconds")
    ap.add_argument("--check", action="store_true", help="only check the doc against the data")
    args = ap.parse_args()
    doc = DOC.read_text(encoding="utf-8")
    if args.check:
        want = render(json.loads(DATA.read_text(encoding="utf-8")))
        if block_of(doc) != want:
            print(f"{DOC}: the compare-smollm2 block is not what {DATA} gives", file=sys.stderr)
            return 1
        return 0
    if args.run is None:
        ap.error("give --run OUT (or --check)")
    data = collect(args.run, args.command_s)
    DATA.parent.mkdir(exist_ok=True)
    DATA.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    _draw(args.run, PNG)
    DOC.write_text(doc.replace(block_of(doc), render(data)), encoding="utf-8")
    print(f"wrote {DATA}, {PNG} and the block in {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
