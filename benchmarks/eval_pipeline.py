"""Eval wall time with generation and verification overlapped vs one after the other.

Both evals run in this one process on the same tasks, model, seed and runtime; only
``pipeline_depth`` differs (1: generate chunk i, verify chunk i, generate chunk i+1, ...;
2: chunk i+1 generates while chunk i is verified). Reported: both wall times, their ratio, and
how much of the wall time the model spent generating (the rest it sat idle). Each mode runs
``--rounds`` times, the order alternating round by round; one torch thread by default.

The model is a small random transformer made on the spot (CPU). Verification is, by default, a
simulated Lean pool: ``--workers`` slots, each attempt holding one for ``--verify-s`` seconds
(waiting, not computing, like a Lean process on other cores). With a real Lean setup, pass
``--runtime local`` to verify with the local runtime instead.

    python benchmarks/eval_pipeline.py                      # simulated Lean pool
    python benchmarks/eval_pipeline.py --runtime local      # real Lean (needs `leanrl setup`)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from leanrl import EnvironmentConfig, RuntimeConfig, SamplingConfig, TasksetConfig
from leanrl.environment import load_environment
from leanrl.eval import EvalConfig, run_eval
from leanrl.policy import Completion, Policy, PolicyConfig, Prompt
from leanrl.runtime import Runtime
from leanrl.verdict import Attempt, Reason, Verdict

REPO = Path(__file__).resolve().parent.parent


class SimulatedLeanPool(Runtime):
    """BENCHMARK ONLY: each attempt occupies one of ``workers`` slots for ``verify_s`` seconds,
    then is rejected. Stands in for a warm Lean pool where no Lean is installed."""

    name = "simulated"

    def __init__(self, config: RuntimeConfig | None = None) -> None:
        super().__init__(config or RuntimeConfig(name="simulated"))
        self.verify_s = float(self.config.options.get("verify_s", 0.25))
        self.busy_s = 0.0
        self._slots: asyncio.Semaphore | None = None

    async def check(self, attempts: Sequence[Attempt]) -> list[Verdict]:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.config.workers or 4)
        t0 = time.perf_counter()

        async def one(a: Attempt) -> Verdict:
            assert self._slots is not None
            async with self._slots:
                await asyncio.sleep(self.verify_s)
            return Verdict.reject(Reason.ERROR, "simulated", id=a.id, time_s=self.verify_s)

        out = list(await asyncio.gather(*(one(a) for a in attempts)))
        self.busy_s += time.perf_counter() - t0
        return out


class Timed(Policy):
    """Wraps the hf policy and adds up the time its model spends generating (inside the worker
    thread, so time a chunk waits for the model does not count)."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner.config)
        self.inner = inner
        self.busy_s = 0.0
        real = inner._generate_sync

        def timed(*a: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return real(*a)
            finally:
                self.busy_s += time.perf_counter() - t0

        inner._generate_sync = timed

    async def start(self) -> None:
        await self.inner.start()

    async def generate(
        self, prompts: Sequence[Prompt], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        result: list[list[Completion]] = await self.inner.generate(prompts, sampling)
        # A random model never closes its proof; count every sample as finished so that every
        # attempt goes to verification, as a trained prover's would.
        return [[c.model_copy(update={"finish_reason": "stop"}) for c in row] for row in result]

    def tokenize(self, text: str) -> list[int]:
        return list(self.inner.tokenize(text))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data"))
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--chunk-tasks", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--verify-s", type=float, default=0.5)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--runtime", default="simulated", help="simulated, or a real runtime id")
    ap.add_argument("--model", default=None, help="a model folder (default: a tiny random one)")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each mode, order alternated")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)

    from leanrl.policies import make_policy
    from leanrl.testing import make_tiny_model

    tmp = Path(tempfile.mkdtemp(prefix="leanrl-bench-"))
    model = args.model
    if model is None:
        rows = [json.loads(x) for x in (Path(args.data) / "minif2f.jsonl").open()]
        model = str(
            make_tiny_model(
                tmp / "model",
                [r["header"] + r["formal_statement"] for r in rows],
                hidden_size=256,
                layers=4,
            )
        )
    policy = Timed(make_policy(PolicyConfig(model=model, batch_size=8)))
    asyncio.run(policy.start())
    # Warm-up, so that one-time costs do not land on whichever mode runs first.
    asyncio.run(policy.generate(["theorem x"] * 8, SamplingConfig(max_tokens=args.max_tokens)))

    walls: dict[int, list[float]] = {1: [], 2: []}
    idle: dict[int, list[float]] = {1: [], 2: []}
    for r in range(args.rounds):
        # Alternate which mode goes first, so drift (caches, other load) hits both alike.
        for depth in (1, 2) if r % 2 == 0 else (2, 1):
            env_cfg = EnvironmentConfig(
                id="minif2f",
                taskset=TasksetConfig(path=Path(args.data), limit=args.tasks),
                runtime=RuntimeConfig(
                    name=args.runtime, workers=args.workers, options={"verify_s": args.verify_s}
                ),
            )
            env = load_environment(env_cfg)
            if args.runtime == "simulated":
                env._runtime = SimulatedLeanPool(env_cfg.runtime)
            cfg = EvalConfig(
                env=env_cfg,
                policy=PolicyConfig(model=model),
                # no stop string: every sample runs to max_tokens, so each chunk costs the same
                sampling=SamplingConfig(max_tokens=args.max_tokens, seed=0, stop=["\x00"]),
                samples=args.samples,
                out=tmp / f"round{r}-depth{depth}",
                chunk_tasks=args.chunk_tasks,
                pipeline_depth=depth,
                progress=False,
            )
            policy.busy_s = 0.0
            t0 = time.perf_counter()
            asyncio.run(run_eval(cfg, env=env, policy=policy))
            wall = time.perf_counter() - t0
            walls[depth].append(wall)
            idle[depth].append(100 * (1 - policy.busy_s / wall))
            verify = getattr(env.runtime, "busy_s", float("nan"))
            print(
                f"round {r} pipeline_depth={depth}: wall {wall:6.2f} s, generating "
                f"{policy.busy_s:6.2f} s ({100 * policy.busy_s / wall:4.1f}% of wall), "
                f"verifying {verify:6.2f} s"
            )
    attempts = args.tasks * args.samples
    print(f"{attempts} attempts, {args.tasks // args.chunk_tasks} chunks, {args.rounds} rounds, "
          f"{args.threads} torch thread(s)")  # fmt: skip
    for depth in (1, 2):
        w = walls[depth]
        print(
            f"  depth {depth}: wall min {min(w):.2f} s, median {statistics.median(w):.2f} s, "
            f"max {max(w):.2f} s; model idle median {statistics.median(idle[depth]):.0f}%"
        )
    ratios = [a / b for a, b in zip(walls[1], walls[2], strict=True)]
    print(
        f"sequential / overlapped wall time: min {min(ratios):.2f}x, median "
        f"{statistics.median(ratios):.2f}x, max {max(ratios):.2f}x"
    )


if __name__ == "__main__":
    main()
