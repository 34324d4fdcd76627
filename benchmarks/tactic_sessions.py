"""Tactic-session latency: the pool's warm tactic sub-pool vs retiring each session's process.

A process that ran model tactics never checks proofs (docs/verification.md). Two ways to keep
that rule: give tactic sessions a warm sub-pool of their own (what the pool does), or kill each
process after its session (the baseline here: ``release(..., broken=True)``, so every session
waits for a fresh process and its header load). Both run the very same sessions (start a proof,
then a two-line tactic block, then a closing tactic) through the same local runtime, in the same
run, on the stand-in REPL processes of ``tests/fake_repl.py`` (NOT Lean) with a simulated header
load (``--load-time``, modelling ``import Mathlib``): the figures measure process reuse, not
Lean's speed.

    python benchmarks/tactic_sessions.py --sessions 20 --load-time 0.5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from leanrl.runtime import RuntimeConfig
from leanrl.runtimes.local import LocalRuntime, LocalTacticSession

FAKE = Path(__file__).resolve().parent.parent / "tests" / "fake_repl.py"
HEADER = "import Mathlib\n"


async def run(sessions: int, load_time: float, retire: bool) -> float:
    """Seconds per session (open, start, two steps, close), sessions one after another."""
    cmd = [sys.executable, str(FAKE), "--load-time", str(load_time)]
    rt = LocalRuntime(
        RuntimeConfig(workers=1, timeout_s=30, options={"repl_command": cmd, "spares": 0})
    )
    async with rt:
        pool = rt.pool
        assert pool is not None
        await pool.release(HEADER, await pool.acquire(HEADER))  # first process: not counted
        t0 = time.perf_counter()
        for _ in range(sessions):
            async with rt.tactic_session(HEADER) as s:
                assert isinstance(s, LocalTacticSession)
                st = await s.start("theorem t (p : Prop) (hp : p) : p := by")
                mid = await s.apply(st.proof_state or 0, "intro x\nintro y")
                done = await s.apply(mid.proof_state or 0, "simp")
                assert done.solved, done.error
                if retire:
                    s.broken = "retired after its session (baseline)"
        return (time.perf_counter() - t0) / sessions


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--load-time", type=float, default=0.5, help="simulated header load (s)")
    ap.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    a = ap.parse_args()
    sub = await run(a.sessions, a.load_time, retire=False)
    base = await run(a.sessions, a.load_time, retire=True)
    if a.json:
        print(json.dumps({"subpool_s": sub, "retire_s": base, "speedup": base / sub}))
        return
    print(
        f"{a.sessions} sessions, simulated load {a.load_time:g} s: warm tactic sub-pool "
        f"{sub * 1000:.1f} ms/session, retire-after-session {base * 1000:.1f} ms/session "
        f"({base / sub:.1f}x slower)"
    )


if __name__ == "__main__":
    asyncio.run(main())
