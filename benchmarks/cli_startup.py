"""How much CPU the ``leanrl`` command spends before it does anything, against the old way.

Until issue 43, ``leanrl`` imported every command's module at start-up (the trainers', the
service's, httpx, rich...), for ``leanrl --version`` too. Now it imports only the command
asked for, and ``leanrl --help`` reads the commands' summaries from their sources.

This runs a few commands in fresh Python processes, each twice per round: ``new``, the
``leanrl`` entry point as it is, and ``old``, the same entry point after importing every
command module first (what start-up used to cost: ``leanrl.cli._tree()``, which loads them
all, then ``main``). Modes alternate within each round; each process's CPU time (user + system,
from ``getrusage(RUSAGE_CHILDREN)``) and wall time are measured, and the table gives min /
median / max over the rounds and the ratio of the medians (new / old). One thread per process
(``OMP_NUM_THREADS=1``); nothing here loads torch.

    .venv/bin/python benchmarks/cli_startup.py --rounds 7

Measured 2026-12-06 on the 2-core development machine, shared (load average 10-12), 7 rounds,
median CPU seconds old -> new (new/old): ``--version`` 0.66 -> 0.30 (0.45), ``--help`` 0.73 ->
0.40 (0.56), ``eval --help`` 0.72 -> 0.38 (0.53), ``train grpo --help`` 0.71 -> 0.52 (0.73),
``models list`` 0.74 -> 0.40 (0.54); wall-time ratios alike (0.44-0.75). The old mode here
already has the lazy httpx import of ``leanrl.policies.openai``; the code before these changes
(``/usr/bin/time leanrl --version``) took 0.69-0.78 CPU seconds. What is left (~0.3 s) is Python,
pydantic and ``import leanrl``'s config classes.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

COMMANDS: list[list[str]] = [
    ["--version"],
    ["--help"],
    ["eval", "--help"],
    ["train", "grpo", "--help"],
    ["models", "list"],
]

_RUN = "import sys; from leanrl.cli import main; sys.exit(main(sys.argv[1:]))"
_OLD = "import sys; from leanrl.cli import _tree, main; _tree(); sys.exit(main(sys.argv[1:]))"


def _once(code: str, args: list[str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", code, *args],
        check=True,
        stdout=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def _mmm(xs: list[float]) -> str:
    return f"{min(xs):.2f} / {statistics.median(xs):.2f} / {max(xs):.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="rounds (each runs old and new once)")
    args = ap.parse_args()
    print(f"{args.rounds} rounds; CPU and wall seconds per process: min / median / max")
    print("| command | old CPU | new CPU | CPU new/old | old wall | new wall | wall new/old |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for argv in COMMANDS:
        got: dict[str, list[tuple[float, float]]] = {"old": [], "new": []}
        for r in range(args.rounds):
            order = ("old", "new") if r % 2 == 0 else ("new", "old")  # alternate
            for mode in order:
                got[mode].append(_once(_OLD if mode == "old" else _RUN, argv))
        cpu = {m: [c for c, _ in v] for m, v in got.items()}
        wall = {m: [w for _, w in v] for m, v in got.items()}
        ratio_cpu = statistics.median(cpu["new"]) / statistics.median(cpu["old"])
        ratio_wall = statistics.median(wall["new"]) / statistics.median(wall["old"])
        print(
            f"| leanrl {' '.join(argv)} | {_mmm(cpu['old'])} | {_mmm(cpu['new'])} | "
            f"{ratio_cpu:.2f} | {_mmm(wall['old'])} | {_mmm(wall['new'])} | {ratio_wall:.2f} |"
        )


if __name__ == "__main__":
    main()
