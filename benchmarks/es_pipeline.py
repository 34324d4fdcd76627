"""ES iteration wall time and GPU-idle fraction: members pipelined on one engine vs serial.

A scheduler simulation, not a training run: an iteration of ``--members`` members (30, the
reference population) on one engine, every member's generation holding the engine for G seconds
(fake generation, a sleep: the engine is busy, nothing else may use its weights) and its
checking taking V seconds (fake Lean, a sleep: a sandbox batch that needs no weights), with
unlimited checking capacity (every member's check sleeps at once; no Lean pool or sandbox
limits how many run). The real :class:`~leanrl.train.es.pipeline.PipelinedScorer`, the real
environment rollout path and a real weights gate run; only generation and checking are sleeps.
Quote its idle fractions as those of this simulation: a real run's also depend on its checker's
capacity (which caps the depth) and on real generation and checking times.

- serial (``scorer.pipeline = 1``): generate, check, next member: the engine idles V/(G+V).
- depth 2 (``scorer.pipeline = 2``, the old default): member i+1 generates while member i is
  checked: with V <= G the engine idles only during the last member's check; with V > G it
  waits for checks;
- depth 4 (``scorer.pipeline = 4``): three members checked while one generates;
- auto (``scorer.pipeline = "auto"``): the scorer's second iteration, after the first (at
  depth 2) measured G and V and set the depth to ``ceil(1 + V/G)``.

Modes alternate within each repeat; reported are min/median/max of wall time and idle fraction
per mode, the serial/mode wall ratio per repeat and the depth auto chose, for each V/G.
Goal: auto idle <= 20 % at the seed workflow's ratio (Lean checking 2.66x generation).

    python benchmarks/es_pipeline.py                     # G = 0.05 s, V/G in {1, 2.66}
    python benchmarks/es_pipeline.py --gen-s 0.2 --ratios 0.5 1 2 2.66 --repeats 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Sequence
from typing import Literal

from leanrl.environment import Environment
from leanrl.harness import Harness
from leanrl.policy import Completion, Policy, PolicyConfig, Prompt, SamplingConfig
from leanrl.rollout import Rollout, Turn
from leanrl.runtime import Runtime
from leanrl.task import Task
from leanrl.taskset import Taskset
from leanrl.train.es.pipeline import PipelinedScorer
from leanrl.train.es.workers import IterationState, Member
from leanrl.verdict import Attempt, Reason, Verdict


class SleepEngine:
    """BENCHMARK ONLY: an engine whose generation takes ``gen_s`` seconds."""

    def __init__(self, gen_s: float) -> None:
        self.policy = _SleepPolicy(gen_s)

    def perturb(self, seed: int, scale: float) -> None:
        return None

    def restore(self) -> None:
        return None


class _SleepPolicy(Policy):
    name = "sleep"

    def __init__(self, gen_s: float) -> None:
        super().__init__(PolicyConfig(model="sleep"))
        self.gen_s = gen_s

    async def generate(
        self, prompts: Sequence[Prompt], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        await asyncio.to_thread(time.sleep, self.gen_s)  # like a GPU call in a worker thread
        return [[Completion(text="p")] for _ in prompts]


class _SleepChecker(Runtime):
    """BENCHMARK ONLY: a batch check that takes ``check_s`` seconds (a Lean sandbox batch)."""

    name = "sleep-check"

    async def check(self, attempts: Sequence[Attempt]) -> list[Verdict]:
        await asyncio.sleep(float(self.config.options["check_s"]))
        return [Verdict.reject(Reason.ERROR, "simulated", id=a.id) for a in attempts]


class _OneTurn(Harness):
    name = "one-turn"

    async def run(
        self,
        tasks: Sequence[Task],
        policy: Policy,
        runtime: Runtime,
        sampling: SamplingConfig,
        taskset: Taskset,
    ) -> list[list[Rollout]]:
        comps = await policy.generate([t.formal_statement for t in tasks], sampling)
        atts = [
            Attempt(name=t.name, header="", formal_statement=t.formal_statement, proof="p")
            for t in tasks
        ]
        await runtime.check(atts)
        return [
            [Rollout(task_id=t.id, prompt=t.formal_statement, turns=[Turn.from_completion(c[0])])]
            for t, c in zip(tasks, comps, strict=True)
        ]


class _Env(Environment):
    def make_harness(self) -> Harness:
        return _OneTurn(self.config.harness)

    def make_runtime(self) -> Runtime:
        return _SleepChecker(self.config.runtime)


async def one_iteration(
    members: int, gen_s: float, check_s: float, depth: int | Literal["auto"]
) -> tuple[float, float, int]:
    """(wall seconds, GPU-idle fraction, depth used) of one simulated iteration. ``auto``: the
    second iteration of a scorer (the first runs at depth 2 and is measured)."""
    env = _Env()
    env.config.runtime.options["check_s"] = check_s
    task = Task(name="t", header="", formal_statement="theorem t : True := by")
    state = IterationState(1, (task,), SamplingConfig(temperature=0.0), 1e-3, ())
    scorer = PipelinedScorer(env, SleepEngine(gen_s), depth)
    pop = [Member(i + 1, 1) for i in range(members)]
    if depth == "auto":
        await scorer.score(state, pop)  # the measuring iteration
    t0 = time.perf_counter()
    await scorer.score(state, pop)
    assert scorer.last_idle_frac is not None and scorer.last_depth is not None
    return time.perf_counter() - t0, scorer.last_idle_frac, scorer.last_depth


MODES: list[tuple[str, int | Literal["auto"]]] = [
    ("serial", 1),
    ("depth2", 2),
    ("depth4", 4),
    ("auto", "auto"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", type=int, default=30)
    ap.add_argument("--gen-s", type=float, default=0.05, help="G: generation seconds per member")
    ap.add_argument(
        "--ratios", type=float, nargs="+", default=[1.0, 2.66], help="V/G (2.66: the seed's)"
    )
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    out = []

    def mmm(xs: list[float]) -> list[float]:
        return [round(min(xs), 3), round(statistics.median(xs), 3), round(max(xs), 3)]

    for ratio in a.ratios:
        v = a.gen_s * ratio
        runs: dict[str, list[tuple[float, float, int]]] = {name: [] for name, _ in MODES}
        for r in range(a.repeats):
            for name, depth in MODES if r % 2 == 0 else MODES[::-1]:  # alternate the order
                runs[name].append(asyncio.run(one_iteration(a.members, a.gen_s, v, depth)))
        row: dict[str, object] = {"G_s": a.gen_s, "V_over_G": ratio, "members": a.members}
        for name, _ in MODES:
            row[f"{name}_wall_s"] = mmm([w for w, _, _ in runs[name]])
            row[f"{name}_idle"] = mmm([i for _, i, _ in runs[name]])
            row[f"serial_over_{name}"] = mmm(
                [s[0] / x[0] for s, x in zip(runs["serial"], runs[name], strict=True)]
            )
        row["auto_depth"] = sorted({d for _, _, d in runs["auto"]})
        out.append(row)
        print(json.dumps(row))
    print(
        "\nA scheduler simulation: generation and checking are sleeps, checking capacity is "
        "unlimited (every member's check at once); the idle shares are the simulation's."
    )
    print(f"{'V/G':>5} {'mode':>7} {'depth':>6} {'wall s (min/med/max)':>22} "
          f"{'GPU idle % (min/med/max)':>26} {'serial/mode':>12}")  # fmt: skip
    for row in out:
        for name, depth in MODES:
            d = row["auto_depth"] if depth == "auto" else depth
            w = "/".join(f"{x:.2f}" for x in row[f"{name}_wall_s"])  # type: ignore[attr-defined]
            i = "/".join(f"{100 * x:.1f}" for x in row[f"{name}_idle"])  # type: ignore[attr-defined]
            sp = row[f"serial_over_{name}"][1]  # type: ignore[index]
            print(f"{row['V_over_G']:>5} {name:>7} {d!s:>6} {w:>22} {i:>26} {sp:>11.2f}x")
    ok = all(r["auto_idle"][1] <= 0.2 for r in out)  # type: ignore[index]
    print(f"goal (median auto idle <= 20 % at every V/G, in this simulation): "
          f"{'met' if ok else 'NOT met'}")  # fmt: skip


if __name__ == "__main__":
    main()
