"""Batch latency from a warm sandbox pool against cold starts, measured in one run.

Sandboxes are real ``leanrl serve`` processes on this machine (the local implementation of the
sandbox interface, as the ``modal`` runtime uses with ``backend = "local"``), each wrapping the
echo test runtime from ``tests/_echo_runtime.py`` (no Lean here). ``--startup-s`` adds a
simulated runtime start-up (Lean importing Mathlib takes seconds) on top of the real process
start.

* cold: ``warm_sandboxes = 0``; every batch waits for a fresh sandbox (``max_uses = 1``).
* warm: ``warm_sandboxes = 2``; every batch takes a ready sandbox; between batches the pool is
  given time to refill (in training, generation runs between verification batches).

Both use a fresh sandbox per batch, so the only difference is whether it was started ahead of
time. Run::

    python benchmarks/pool_latency.py --batches 8 --batch-size 64 --startup-s 0

``--reuse`` instead compares "before" (``max_uses = 1``) with "after" (``max_uses = 0``, reused
sandboxes whose service reports isolated Lean processes) and "unisolated" (``max_uses = 0``, but
the service reports its Lean processes as not isolated, so ``pool.reuse = "auto"`` gives each
sandbox one batch), all 2 warm, in alternating order over ``--rounds``, and reports billed
sandbox-seconds per 1,000 attempts and batch latency (min/median/max).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from leanrl._sandbox_config import ModalConfig, PoolConfig  # noqa: E402
from leanrl.runtime import RuntimeConfig  # noqa: E402
from leanrl.runtimes.modal import ModalRuntime  # noqa: E402
from leanrl.verdict import Attempt  # noqa: E402


def make_runtime(
    warm: int, startup_s: float, batch_size: int, max_uses: int = 1, isolated: bool | None = None
) -> ModalRuntime:
    options: dict[str, str | int | float | bool] = {"startup_s": startup_s} if startup_s else {}
    if isolated is not None:  # what the echo runtime's /health says about its processes
        options["isolated"] = isolated
    cfg = ModalConfig(
        backend="local",
        local_runtime="_echo_runtime:EchoRuntime",
        local_pythonpath=[REPO / "tests"],
        warm_sandboxes=warm,
        batch_size=batch_size,
        cpu=1.0,
        pool=PoolConfig(max_sandboxes=max(2, warm + 1), max_uses=max_uses, health_interval_s=60),
        inner_options=options,
    )
    return ModalRuntime(RuntimeConfig(name="modal", modal=cfg))


async def run_mode(
    warm: int,
    batches: int,
    batch_size: int,
    startup_s: float,
    max_uses: int = 1,
    isolated: bool | None = None,
) -> dict[str, float | list[float]]:
    rt = make_runtime(warm, startup_s, batch_size, max_uses, isolated)
    attempts = [
        Attempt(name="t", header="", formal_statement="theorem t : True := by", proof=p, id=str(i))
        for i, p in enumerate(["ok", "bad"] * (batch_size // 2) + ["ok"] * (batch_size % 2))
    ]
    latencies: list[float] = []
    refill_waits: list[float] = []
    async with rt:
        assert rt.pool is not None
        for _ in range(batches):
            t_wait = time.perf_counter()
            while warm and rt.pool.state()["ready"] < min(
                warm, rt.pool.target_ready()
            ):  # steady state: pool refilled
                await asyncio.sleep(0.01)
            refill_waits.append(time.perf_counter() - t_wait)
            t0 = time.perf_counter()
            verdicts = await rt.check(attempts)
            latencies.append(time.perf_counter() - t0)
            assert len(verdicts) == batch_size and all(v.reason.value != "infra" for v in verdicts)
        m = rt.metrics()
    return {
        "latencies_s": latencies,
        "median_s": statistics.median(latencies),
        "max_s": max(latencies),
        "mean_refill_wait_s": statistics.mean(refill_waits),
        "sandbox_s": float(m["pool_sandbox_s"]),
        "sandbox_s_per_1k": 1000.0 * float(m["pool_sandbox_s"]) / (batches * batch_size),
        "busy_sandbox_s": float(m["batch_sandbox_s"]),
        "cold_acquires": float(m["pool_cold_acquires"]),
        "warm_acquires": float(m["pool_warm_acquires"]),
        "created": float(m["pool_created"]),
    }


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--startup-s", type=float, default=0.0, help="simulated runtime start-up")
    ap.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    ap.add_argument(
        "--reuse",
        action="store_true",
        help="compare before (a fresh sandbox per batch, 2 warm) with after (reused sandboxes, "
        "2 warm), alternating, over --rounds rounds",
    )
    ap.add_argument("--rounds", type=int, default=2, help="rounds of --reuse (each runs both)")
    a = ap.parse_args()
    if a.reuse:
        await compare_reuse(a.batches, a.batch_size, a.startup_s, a.rounds, a.json)
        return
    cold = await run_mode(0, a.batches, a.batch_size, a.startup_s)
    warm = await run_mode(2, a.batches, a.batch_size, a.startup_s)
    ratio = float(cold["median_s"]) / float(warm["median_s"])  # type: ignore[arg-type]
    if a.json:
        print(json.dumps({"cold": cold, "warm": warm, "cold_over_warm_median": ratio}, indent=2))
        return
    print(
        f"pool latency: {a.batches} batches of {a.batch_size}, simulated start-up "
        f"{a.startup_s:g} s, one fresh sandbox per batch"
    )
    print(f"{'mode':<6}{'median s':>10}{'max s':>9}{'billed sandbox-s':>18}{'busy sandbox-s':>16}")
    for name, r in (("cold", cold), ("warm", warm)):
        print(
            f"{name:<6}{r['median_s']:>10.3f}{r['max_s']:>9.3f}"
            f"{r['sandbox_s']:>18.1f}{r['busy_sandbox_s']:>16.1f}"
        )
    print(f"cold/warm median batch latency: {ratio:.1f}x")
    print(
        f"warm acquires in warm mode: {warm['warm_acquires']:g} of {a.batches}; "
        f"mean wait for refill between batches: {warm['mean_refill_wait_s']:.2f} s"
    )


async def compare_reuse(
    batches: int, batch_size: int, startup_s: float, rounds: int, as_json: bool
) -> None:
    """Billed sandbox-seconds per 1,000 attempts and batch latency, before and after reuse."""
    # (max_uses, what the service says about isolation)
    modes: dict[str, tuple[int, bool | None]] = {
        "before": (1, None),
        "after": (0, True),
        "unisolated": (0, False),
    }
    runs: dict[str, list[dict[str, float | list[float]]]] = {m: [] for m in modes}
    for r in range(rounds):
        order = list(modes) if r % 2 == 0 else list(reversed(modes))  # alternate the order
        for m in order:
            uses, isolated = modes[m]
            runs[m].append(await run_mode(2, batches, batch_size, startup_s, uses, isolated))
    if as_json:
        print(json.dumps(runs, indent=2))
        return
    print(
        f"sandbox reuse: {rounds} rounds x {batches} batches of {batch_size}, simulated "
        f"start-up {startup_s:g} s, 2 warm; before: max_uses 1; after: max_uses 0, isolated; "
        "unisolated: max_uses 0, service reports no isolation"
    )
    print(
        f"{'mode':<11}{'sandbox-s / 1k attempts  min/med/max':>38}{'batch s  min/med/max':>26}"
        f"{'sandboxes':>11}"
    )
    for m, rs in runs.items():
        per = sorted(float(x["sandbox_s_per_1k"]) for x in rs)  # type: ignore[arg-type]
        lat = sorted(t for x in rs for t in x["latencies_s"])  # type: ignore[union-attr]
        made = statistics.median(float(x["created"]) for x in rs)  # type: ignore[arg-type]
        print(
            f"{m:<11}{per[0]:>14.1f}{statistics.median(per):>12.1f}{per[-1]:>12.1f}"
            f"{lat[0]:>10.3f}{statistics.median(lat):>8.3f}{lat[-1]:>8.3f}{made:>11g}"
        )
    b = statistics.median(float(x["sandbox_s_per_1k"]) for x in runs["before"])  # type: ignore[arg-type]
    f = statistics.median(float(x["sandbox_s_per_1k"]) for x in runs["after"])  # type: ignore[arg-type]
    u = statistics.median(float(x["sandbox_s_per_1k"]) for x in runs["unisolated"])  # type: ignore[arg-type]
    print(f"before/after median sandbox-s per 1k attempts: {b / f:.2f}x")
    print(f"unisolated/before: {u / b:.2f}x (reuse refused without isolation)")


if __name__ == "__main__":
    asyncio.run(main())
