"""Attempts per second through the warm REPL pool vs one fresh process per attempt, same run.

With a real Lean (a REPL found by ``leanrl setup`` / ``LEANRL_LEAN_PROJECT``) it checks real core
Lean proofs. Without one it uses the stand-in REPL processes of ``tests/fake_repl.py`` (NOT Lean)
with a simulated header load time (``--load-time``, default 0.5 s, modelling ``import Mathlib``),
so the figures measure the pool's own overhead and the cost it saves, not Lean's speed.

The baseline runs the very same check steps through the same code, but with ``recycle_after=1``
and no spare: every attempt starts a fresh process and pays the header load, as a checker without
process reuse does. Anchor (Kimina Lean Server): ~4.3 proofs/s on 60 CPUs; 1000 Mathlib proofs in
584 s with REPL reuse vs 1052 s without (1.8x).

    python benchmarks/verify_throughput.py --attempts 200 --workers 2 --load-time 0.5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from leanrl.errors import LeanNotFoundError
from leanrl.lean.pool import PoolConfig, ReplPool
from leanrl.lean.project import find_project, repl_command
from leanrl.verdict import Attempt

FAKE = Path(__file__).resolve().parent.parent / "tests" / "fake_repl.py"


def attempts(n: int, real: bool) -> list[Attempt]:
    out = []
    for i in range(n):
        stmt = f"theorem t{i} (a b : Nat) (h : a = b) : b + {i} = a + {i} := by"
        proof = "omega" if real else "simp"
        out.append(Attempt(name=f"t{i}", header="", formal_statement=stmt, proof=proof, id=str(i)))
    return out


async def run(command: list[str], cwd: Path | None, atts: list[Attempt], **kw: Any) -> dict:
    pool = ReplPool(PoolConfig(command=command, cwd=cwd, timeout_s=600, memory_mb=None, **kw))
    await pool.start()
    try:
        t0 = time.monotonic()
        verdicts = await pool.check(atts)
        wall = time.monotonic() - t0
    finally:
        await pool.close()
    return {
        "attempts": len(atts),
        "accepted": sum(v.accepted for v in verdicts),
        "wall_s": round(wall, 3),
        "attempts_per_s": round(len(atts) / wall, 2),
        "processes_started": pool.stats.started,
        "mean_start_s": round(pool.stats.start_seconds / max(pool.stats.started, 1), 3),
    }


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--attempts", type=int, default=200)
    ap.add_argument("--baseline-attempts", type=int, default=None, help="default: attempts/4")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--load-time", type=float, default=0.5, help="stand-in header load (s)")
    ap.add_argument("--fake", action="store_true", help="use the stand-in even if Lean exists")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    real = False
    cwd: Path | None = None
    if not args.fake:
        try:
            command, cwd = repl_command(find_project(None))
            real = True
        except LeanNotFoundError as e:
            print(f"no real Lean REPL ({e}); using the stand-in processes", file=sys.stderr)
    if not real:
        command = [sys.executable, str(FAKE), "--load-time", str(args.load_time)]

    n_base = args.baseline_attempts or max(args.workers, args.attempts // 4)
    pooled = await run(command, cwd, attempts(args.attempts, real), workers=args.workers)
    fresh = await run(
        command,
        cwd,
        attempts(n_base, real),
        workers=args.workers,
        spares=0,
        recycle_after=1,
    )
    result = {
        "lean": "real" if real else f"stand-in (load {args.load_time} s)",
        "workers": args.workers,
        "pool": pooled,
        "fresh_process_per_attempt": fresh,
        "speedup": round(pooled["attempts_per_s"] / fresh["attempts_per_s"], 2),
        "pool_overhead_ms_per_attempt": round(
            1000 * pooled["wall_s"] * args.workers / pooled["attempts"], 2
        ),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"Lean: {result['lean']}, workers: {args.workers}")
    for name in ("pool", "fresh_process_per_attempt"):
        r = result[name]
        print(
            f"  {name:<26} {r['attempts_per_s']:>8} attempts/s  ({r['attempts']} in {r['wall_s']} s, "
            f"{r['processes_started']} processes, {r['accepted']} accepted)"
        )
    print(f"  speedup of the pool: {result['speedup']}x")
    print(f"  worker-time per attempt in the pool: {result['pool_overhead_ms_per_attempt']} ms")


if __name__ == "__main__":
    asyncio.run(main())
