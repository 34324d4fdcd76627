"""What the separate checker process and the kernel replay cost, and what the warm pool saves.

Four ways to check the same attempts, measured in one run, in rotating order, with the memory
watch on (``memory_mb`` 8192, the default):

- ``same_process``: the path before the trusted checker moved out (simulated here with the same
  REPL processes and protocol): each worker process loads the imports *and* the checker, then
  per attempt elaborates, pickles, and runs the check itself -- no replay;
- ``judges``: today's pool -- elaborating processes hand the pickle to separate judge processes
  (one per four workers), with the kernel replay switched off (``trust_elaboration``);
- ``judges_replay``: the same with the kernel replay (the default);
- ``fresh``: today's pool with ``recycle_after=1``: a fresh process for every attempt.

Without a real Lean the processes are the stand-in REPL of ``tests/fake_repl.py`` (NOT Lean):
``--load-time`` models ``import Mathlib``, ``--elab-time`` an attempt's elaboration,
``--check-time`` reading the pickle and comparing, ``--replay-time`` the kernel replay. The
defaults assume a replay at ~10 % of elaboration (the kernel re-checks terms the elaborator
already built; it does not search). So the ratios measure the architecture's own cost (an
extra process hop, the pickle copy, queueing at fewer judges) under those assumptions, not
Lean's speed; rerun on a machine with Lean for real figures (``--real``).

    python benchmarks/verify_throughput.py --attempts 120 --workers 2 --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from leanrl.lean.pool import PoolConfig, ReplPool
from leanrl.lean.project import find_project, repl_command, resolve_lake_env
from leanrl.lean.protocol import CommandRequest, CommandResponse, PickleEnvRequest
from leanrl.lean.repl import ReplProcess
from leanrl.lean.source import assemble
from leanrl.lean.trust.report import check_command, checker_source, parse_report, reference_command
from leanrl.verdict import Attempt, VerificationPolicy

FAKE = Path(__file__).resolve().parent.parent / "tests" / "fake_repl.py"
MEMORY_MB = 8192


def attempts(n: int, elab_s: float, real: bool, policy: VerificationPolicy) -> list[Attempt]:
    out = []
    for i in range(n):
        stmt = f"theorem t{i} (a b : Nat) (h : a = b) : b + {i} = a + {i} := by"
        proof = "omega" if real else f'simp\n  -- fake: {{"delay": {elab_s}}}'
        out.append(
            Attempt(
                name=f"t{i}",
                header="",
                formal_statement=stmt,
                proof=proof,
                id=str(i),
                policy=policy,
            )
        )
    return out


class SameProcess:
    """The earlier path, rebuilt for comparison: the check runs in the elaborating process."""

    def __init__(self, command: list[str], cwd: Path | None, env: dict | None, workers: int):
        self.command, self.cwd, self.env, self.workers = command, cwd, env, workers

    async def run(self, atts: list[Attempt], scratch: Path) -> int:
        queue: asyncio.Queue[Attempt] = asyncio.Queue()
        for a in atts:
            queue.put_nowait(a)
        accepted = [0]

        async def worker(k: int) -> None:
            proc = ReplProcess(self.command, cwd=self.cwd, env=self.env, memory_mb=MEMORY_MB)
            await proc.start()
            try:
                imp = await proc.request(CommandRequest(cmd="import Lean"), 600)
                assert isinstance(imp, CommandResponse)
                chk = await proc.request(CommandRequest(cmd=checker_source(), env=imp.env), 600)
                assert isinstance(chk, CommandResponse)
                while not queue.empty():
                    a = queue.get_nowait()
                    ans = await proc.request(CommandRequest(cmd=assemble(a).text, env=imp.env), 600)
                    assert isinstance(ans, CommandResponse)
                    path = scratch / f"{k}-{a.id}.olean"
                    await proc.request(PickleEnvRequest(pickleTo=str(path), env=ans.env), 600)
                    ref = await proc.request(
                        CommandRequest(cmd=reference_command(a.formal_statement), env=chk.env), 600
                    )
                    assert isinstance(ref, CommandResponse)
                    nonce = secrets.token_hex(16)
                    cmd = check_command(str(path), a.name, nonce, olean=False, replay=False)
                    rep = await proc.request(CommandRequest(cmd=cmd, env=ref.env), 600)
                    assert isinstance(rep, CommandResponse)
                    report = parse_report(rep.messages, nonce)
                    accepted[0] += not isinstance(report, str) and report.status == "ok"
                    path.unlink(missing_ok=True)
            finally:
                await proc.close()

        await asyncio.gather(*(worker(k) for k in range(self.workers)))
        return accepted[0]


async def pooled(
    command: list[str], cwd: Path | None, env: dict | None, atts: list[Attempt], **kw: Any
) -> tuple[int, int]:
    pool = ReplPool(
        PoolConfig(command=command, cwd=cwd, env=env, timeout_s=600, memory_mb=MEMORY_MB, **kw)
    )
    await pool.start()
    try:
        verdicts = await pool.check(atts)
    finally:
        await pool.close()
    return sum(v.accepted for v in verdicts), pool.stats.started


async def measure(mode: str, args: argparse.Namespace, setup: tuple) -> dict[str, Any]:
    command, cwd, env, real = setup
    n = args.attempts if mode != "fresh" else max(args.workers, args.attempts // 4)
    trust = VerificationPolicy(trust_elaboration=True)
    t0 = time.monotonic()
    if mode == "same_process":
        scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"leanrl-bench-{os.getpid()}"
        scratch.mkdir(exist_ok=True)
        ok = await SameProcess(command, cwd, env, args.workers).run(
            attempts(n, args.elab_time, real, trust), scratch
        )
        scratch.rmdir()
        started = args.workers
    elif mode == "judges":
        ok, started = await pooled(
            command, cwd, env, attempts(n, args.elab_time, real, trust), workers=args.workers
        )
    elif mode == "judges_replay":
        ok, started = await pooled(
            command,
            cwd,
            env,
            attempts(n, args.elab_time, real, VerificationPolicy()),
            workers=args.workers,
        )
    else:
        ok, started = await pooled(
            command,
            cwd,
            env,
            attempts(n, args.elab_time, real, VerificationPolicy()),
            workers=args.workers,
            spares=0,
            recycle_after=1,
        )
    wall = time.monotonic() - t0
    return {"attempts": n, "accepted": ok, "processes": started, "per_s": n / wall}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--attempts", type=int, default=120)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--load-time", type=float, default=0.5, help="stand-in header load (s)")
    ap.add_argument("--elab-time", type=float, default=0.2, help="stand-in elaboration (s)")
    ap.add_argument("--check-time", type=float, default=0.005, help="stand-in check (s)")
    ap.add_argument("--replay-time", type=float, default=0.02, help="stand-in replay (s)")
    ap.add_argument("--real", action="store_true", help="use a real Lean REPL (leanrl setup)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    if args.real:
        found, cwd = repl_command(find_project(None))
        command, env = resolve_lake_env(found, cwd)
        setup: tuple = (command, cwd, env, True)
    else:
        command = [
            sys.executable,
            str(FAKE),
            "--load-time",
            str(args.load_time),
            "--check-time",
            str(args.check_time),
            "--replay-time",
            str(args.replay_time),
        ]
        setup = (command, None, None, False)

    modes = ["same_process", "judges", "judges_replay", "fresh"]
    rates: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(args.repeats):
        for m in modes[r % len(modes) :] + modes[: r % len(modes)]:  # rotate the order
            res = await measure(m, args, setup)
            assert res["accepted"] == res["attempts"], (m, res)
            rates[m].append(res["per_s"])

    def stats(xs: list[float]) -> dict[str, float]:
        return {
            "min": round(min(xs), 2),
            "median": round(statistics.median(xs), 2),
            "max": round(max(xs), 2),
        }

    base = statistics.median(rates["same_process"])
    result = {
        "lean": "real" if args.real else "stand-in",
        "assumed_s": {
            "load": args.load_time,
            "elab": args.elab_time,
            "check": args.check_time,
            "replay": args.replay_time,
        },
        "workers": args.workers,
        "judges": max(1, -(-args.workers // 4)),
        "attempts_per_s": {m: stats(v) for m, v in rates.items()},
        "ratio_vs_same_process": {
            m: round(statistics.median(v) / base, 3) for m, v in rates.items()
        },
        "pool_vs_fresh": round(
            statistics.median(rates["judges_replay"]) / statistics.median(rates["fresh"]), 1
        ),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"Lean: {result['lean']}  assumed s: {result['assumed_s']}")
    print(f"workers {args.workers}, judges {result['judges']}, repeats {args.repeats}")
    for m in modes:
        s = result["attempts_per_s"][m]
        ratio = result["ratio_vs_same_process"][m]
        print(
            f"  {m:<14} {s['median']:>7} attempts/s (min {s['min']}, max {s['max']})  "
            f"{ratio:.3f}x the same-process path"
        )
    print(f"  warm pool (with replay) vs a fresh process per attempt: {result['pool_vs_fresh']}x")


if __name__ == "__main__":
    asyncio.run(main())
