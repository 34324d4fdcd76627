"""What the pool's memory watch costs: reading one process tree from /proc vs psutil's scan.

The watch samples a Lean process's private memory every 50 ms while it works. It used to find the
process's descendants with ``psutil.Process.children(recursive=True)``, which reads every process
on the machine; now it reads only ``/proc/PID/task/*/children`` and ``/proc/PID/statm`` of the
tree (``leanrl.lean.repl._tree`` / ``_private_bytes``). This times both on a live stand-in REPL
process, with ``--others`` idle processes started beside it (a busy machine), in alternating
order, and reports min/median/max microseconds per sample and the ratio.

    python benchmarks/memory_watch.py --others 300 --samples 2000 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

from leanrl.lean.repl import _private_bytes, _tree

FAKE = Path(__file__).resolve().parent.parent / "tests" / "fake_repl.py"


def by_proc(pid: int) -> int:
    return sum(_private_bytes(p) for p in _tree(pid))


def by_psutil(pid: int) -> int:
    p = psutil.Process(pid)
    total = 0
    for q in [p, *p.children(recursive=True)]:
        info = q.memory_info()
        total += info.rss - getattr(info, "shared", 0)
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--others", type=int, default=300, help="idle processes beside it")
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    others = [subprocess.Popen(sleeper) for _ in range(args.others)]
    repl = subprocess.Popen([sys.executable, str(FAKE)], stdin=subprocess.PIPE)
    try:
        time.sleep(0.5)
        modes = {"proc_tree": by_proc, "psutil_scan": by_psutil}
        per: dict[str, list[float]] = {m: [] for m in modes}
        for r in range(args.repeats):
            order = list(modes) if r % 2 == 0 else list(reversed(modes))
            for m in order:
                t0 = time.perf_counter()
                for _ in range(args.samples):
                    modes[m](repl.pid)
                per[m].append((time.perf_counter() - t0) / args.samples * 1e6)
        print(
            f"{len(psutil.pids())} processes on the machine, {args.samples} samples x "
            f"{args.repeats} repeats (alternating order)"
        )
        for m, xs in per.items():
            print(
                f"  {m:<12} {statistics.median(xs):8.1f} us/sample "
                f"(min {min(xs):.1f}, max {max(xs):.1f})"
            )
        ratios = [b / a for a, b in zip(per["proc_tree"], per["psutil_scan"], strict=True)]
        print(
            f"  psutil scan / proc tree: median {statistics.median(ratios):.1f}x "
            f"(min {min(ratios):.1f}, max {max(ratios):.1f})"
        )
    finally:
        repl.kill()
        for p in others:
            p.kill()
        for p in [repl, *others]:
            p.wait()


if __name__ == "__main__":
    main()
