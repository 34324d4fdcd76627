"""ES iteration wall time and GPU-idle fraction: members pipelined on one engine vs serial.

A simulated iteration of ``--members`` members (30, the reference population) on one engine:
every member's generation holds the engine for G seconds (fake generation: the engine is busy,
nothing else may use its weights) and its checking takes V seconds (fake Lean: a sandbox batch
that needs no weights). The real :class:`~leanrl.train.es.pipeline.PipelinedScorer`, the real
environment rollout path and a real weights gate run; only generation and checking are sleeps.

- serial (``scorer.pipeline = 1``): generate, check, next member: the engine idles V/(G+V).
- pipelined (``scorer.pipeline = 2``): member i+1 generates while member i is checked: with
  V <= G the engine idles only during the last member's check.

Modes alternate within each repeat; reported are min/median/max of wall time and idle fraction
per mode and the serial/pipelined wall ratio per repeat, for each V/G. Goal: idle <= 20 % when
V <= G.

    python benchmarks/es_pipeline.py                     # G = 0.05 s, V/G in {0.5, 1, 2}
    python benchmarks/es_pipeline.py --gen-s 0.2 --ratios 1 --repeats 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Sequence

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
    members: int, gen_s: float, check_s: float, depth: int
) -> tuple[float, float]:
    """(wall seconds, GPU-idle fraction) of one simulated iteration."""
    env = _Env()
    env.config.runtime.options["check_s"] = check_s
    task = Task(name="t", header="", formal_statement="theorem t : True := by")
    state = IterationState(1, (task,), SamplingConfig(temperature=0.0), 1e-3, ())
    scorer = PipelinedScorer(env, SleepEngine(gen_s), depth)
    t0 = time.perf_counter()
    await scorer.score(state, [Member(i + 1, 1) for i in range(members)])
    assert scorer.last_idle_frac is not None
    return time.perf_counter() - t0, scorer.last_idle_frac


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", type=int, default=30)
    ap.add_argument("--gen-s", type=float, default=0.05, help="G: generation seconds per member")
    ap.add_argument("--ratios", type=float, nargs="+", default=[0.5, 1.0, 2.0], help="V/G")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    out = []
    for ratio in a.ratios:
        v = a.gen_s * ratio
        runs: dict[str, list[tuple[float, float]]] = {"serial": [], "pipelined": []}
        for r in range(a.repeats):
            order = [("serial", 1), ("pipelined", 2)]
            for name, depth in order if r % 2 == 0 else order[::-1]:  # alternate the order
                runs[name].append(asyncio.run(one_iteration(a.members, a.gen_s, v, depth)))
        ratios = [s[0] / p[0] for s, p in zip(runs["serial"], runs["pipelined"], strict=True)]

        def mmm(xs: list[float]) -> list[float]:
            return [round(min(xs), 3), round(statistics.median(xs), 3), round(max(xs), 3)]

        row = {
            "G_s": a.gen_s,
            "V_s": v,
            "members": a.members,
            "serial_wall_s": mmm([w for w, _ in runs["serial"]]),
            "pipelined_wall_s": mmm([w for w, _ in runs["pipelined"]]),
            "serial_over_pipelined": mmm(ratios),
            "serial_idle": mmm([i for _, i in runs["serial"]]),
            "pipelined_idle": mmm([i for _, i in runs["pipelined"]]),
        }
        out.append(row)
        print(json.dumps(row))
    ok = all(r["pipelined_idle"][1] <= 0.2 for r in out if r["V_s"] <= r["G_s"])
    print(f"goal (median pipelined idle <= 20 % when V <= G): {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
