"""Eval wall time against the time its slower side needs: chunk by chunk (one after the other,
overlapped) and streamed.

All evals run in this one process on the same tasks, model, seed and runtime; only the mode
differs: ``depth1`` (``pipeline_depth`` 1: generate chunk i, verify chunk i, generate chunk
i+1, ...), ``depth2`` (today's default: chunk i+1 generates while chunk i is verified) and
``stream`` (``eval.stream``: every task to the policy at once, each completion checked as it
arrives, chunks written as they complete). Each mode runs ``--rounds`` times, the order
alternating round by round; one torch thread by default.

Reported per mode: wall time, the model's generating time (inside the worker thread, so time a
chunk waits for the model does not count), the verification time the pool needs at least
(attempts x ``--verify-s`` / ``--workers``, its capacity), and wall / max(generation,
verification): 1.0 is a perfect overlap, where the eval takes as long as its slower side; it
is also shown less the eval's fixed cost (tasks loaded, report and plot written: the same eval
rerun with nothing left to do), which is neither side's.
``--case gen`` makes generation the slower side (short checks), ``--case verify`` verification
(long checks), ``--case both`` runs the two one after the other.

The model is a small random transformer made on the spot (CPU). Verification is, by default, a
simulated Lean pool: ``--workers`` slots, each attempt holding one for ``--verify-s`` seconds
(waiting, not computing, like a Lean process on other cores). With a real Lean setup, pass
``--runtime local`` to verify with the local runtime instead.

    python benchmarks/eval_pipeline.py --case both          # simulated Lean pool
    python benchmarks/eval_pipeline.py --runtime local      # real Lean (needs `leanrl setup`)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from leanrl import EnvironmentConfig, RuntimeConfig, SamplingConfig, TasksetConfig
from leanrl.environment import load_environment
from leanrl.eval import EvalConfig, run_eval
from leanrl.policy import Completion, Policy, PolicyConfig, Prompt, StreamCompletion, StreamRequest
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
        self.checked = 0  # attempts that reached the pool (an empty completion never does)
        self._slots: asyncio.Semaphore | None = None

    async def check(self, attempts: Sequence[Attempt]) -> list[Verdict]:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.config.workers or 4)
        t0 = time.perf_counter()
        self.checked += len(attempts)

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
        make_sampler = inner.sampler

        def timed_sampler() -> Any:
            sampler = make_sampler()
            run = sampler.run

            def timed_run(*a: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return run(*a)
                finally:
                    self.busy_s += time.perf_counter() - t0

            sampler.run = timed_run
            return sampler

        inner.sampler = timed_sampler

    async def stream(self, requests: Sequence[StreamRequest]) -> AsyncIterator[StreamCompletion]:
        async for sc in self.inner.stream(requests):
            c = sc.completion.model_copy(update={"finish_reason": "stop"})  # as in generate
            yield StreamCompletion(sc.key, sc.sample, c, sc.elapsed_s)

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


CASES = {"gen": 0.4, "verify": 2.5}
"""Verification time / generation time of each case: checks 0.4 times as long as generating
(generation the slower side) or 2.5 times (verification the slower side). The check time per
attempt is set from the generation time measured at warm-up (the fastest of three probes, so a
busy moment does not inflate it), so each case stays what it says on a faster or slower
machine; each run prints which side was the slower one."""

MODES = ("depth1", "depth2", "stream")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data"))
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--chunk-tasks", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument(
        "--mean-tokens",
        type=float,
        default=None,
        help="spread the completion lengths: an EOS bias ends them after a geometric number of "
        "tokens with this mean (cut at --max-tokens); default: every one runs to --max-tokens",
    )
    ap.add_argument("--case", choices=["gen", "verify", "both"], default=None)
    ap.add_argument("--verify-s", type=float, default=None, help="overrides the case's")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--runtime", default="simulated", help="simulated, or a real runtime id")
    ap.add_argument("--model", default=None, help="a model folder (default: a tiny random one)")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated, of " + str(MODES))
    ap.add_argument("--rounds", type=int, default=3, help="runs of each mode, order alternated")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)

    from leanrl.policies import make_policy
    from leanrl.testing import make_tiny_model

    tmp = Path(tempfile.mkdtemp(prefix="leanrl-bench-"))
    data = Path(args.data)
    if not (data / "minif2f.jsonl").is_file():
        data = REPO / "tests" / "fixtures" / "data"
    model = args.model
    if model is None:
        rows = [json.loads(x) for x in (data / "minif2f.jsonl").open()]
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
    if args.mean_tokens:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from stream_throughput import eos_bias

        eos_bias(policy.inner, args.mean_tokens)
    # Warm-up, so that one-time costs do not land on whichever mode runs first; it also
    # measures what generating the eval's prompts costs here (chunk by chunk).
    probe = load_environment(
        EnvironmentConfig(id="minif2f", taskset=TasksetConfig(path=data, limit=args.tasks))
    )
    prompts = [probe.harness.prompt(t) for t in probe.tasks()]
    sampling = SamplingConfig(max_tokens=args.max_tokens, stop=["\x00"], n=args.samples)
    asyncio.run(policy.generate(prompts[: args.chunk_tasks], sampling))
    probes = []
    for _ in range(3):
        policy.busy_s = 0.0
        asyncio.run(policy.generate(prompts[: 2 * args.chunk_tasks], sampling))
        probes.append(policy.busy_s)
    # the whole eval's generation, chunk by chunk, at the fastest probe's pace
    gen_s = min(probes) * len(prompts) / (2 * args.chunk_tasks)
    modes = [m for m in args.modes.split(",") if m]
    cases = ["gen", "verify"] if args.case == "both" else [args.case or "verify"]
    for case in cases:
        verify_s = args.verify_s
        if verify_s is None:
            verify_s = CASES[case] * gen_s * args.workers / (args.tasks * args.samples)
        _case(args, case, verify_s, modes, model, policy, data, tmp)


def _case(
    args: Any,
    case: str,
    verify_s: float,
    modes: list[str],
    model: str,
    policy: Timed,
    data: Path,
    tmp: Path,
) -> None:
    walls: dict[str, list[float]] = {m: [] for m in modes}
    over: dict[str, list[float]] = {m: [] for m in modes}
    net: dict[str, list[float]] = {m: [] for m in modes}
    idle: dict[str, list[float]] = {m: [] for m in modes}
    attempts = args.tasks * args.samples
    tasks_present = 0
    for r in range(args.rounds):
        # Alternate which mode goes first, so drift (caches, other load) hits all alike.
        for mode in modes if r % 2 == 0 else list(reversed(modes)):
            env_cfg = EnvironmentConfig(
                id="minif2f",
                taskset=TasksetConfig(path=data, limit=args.tasks),
                runtime=RuntimeConfig(
                    name=args.runtime, workers=args.workers, options={"verify_s": verify_s}
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
                out=tmp / f"{case}-round{r}-{mode}",
                chunk_tasks=args.chunk_tasks,
                pipeline_depth=1 if mode == "depth1" else 2,
                stream=mode == "stream",
                progress=False,
            )
            policy.busy_s = 0.0
            t0 = time.perf_counter()
            summary = asyncio.run(run_eval(cfg, env=env, policy=policy))
            wall = time.perf_counter() - t0
            # The eval's fixed cost (loading the tasks, opening the store, writing report.md and
            # its plot), neither generating nor verifying: the same eval again, nothing to redo.
            t1 = time.perf_counter()
            asyncio.run(run_eval(cfg, env=env, policy=policy))
            fixed = time.perf_counter() - t1
            tasks_present = summary["results"]["pass_at_k"]["all"]["tasks"]
            attempts = tasks_present * args.samples
            # what the pool needs at least: its slots full from start to end, for the attempts
            # that reach it (one with no proof in its text is rejected before Lean)
            checked = getattr(env.runtime, "checked", attempts)
            verify = checked * verify_s / args.workers
            bound = max(policy.busy_s, verify)
            walls[mode].append(wall)
            over[mode].append(wall / bound)
            net[mode].append((wall - fixed) / bound)
            idle[mode].append(100 * (1 - policy.busy_s / wall))
            print(
                f"{case} round {r} {mode:>6}: wall {wall:6.2f} s, generating "
                f"{policy.busy_s:6.2f} s, verifying needs {verify:6.2f} s, wall / max "
                f"{wall / bound:4.2f}, less the fixed {fixed:4.2f} s {(wall - fixed) / bound:4.2f} "
                f"({'generation' if policy.busy_s > verify else 'verification'} the slower side)",
                flush=True,
            )
    print(
        f"case {case}: {attempts} attempts ({tasks_present} tasks x {args.samples}), "
        f"{-(-tasks_present // args.chunk_tasks)} chunks, verify {verify_s:.3f} s x {args.workers} "
        f"workers, {args.rounds} rounds, {args.threads} torch thread(s)"
    )
    for mode in modes:
        w, o = walls[mode], over[mode]
        print(
            f"  {mode:>6}: wall min {min(w):.2f} s, median {statistics.median(w):.2f} s, "
            f"max {max(w):.2f} s; wall / max(gen, verify) min {min(o):.2f}, median "
            f"{statistics.median(o):.2f}, max {max(o):.2f}; less the fixed cost min "
            f"{min(net[mode]):.2f}, median {statistics.median(net[mode]):.2f}, max "
            f"{max(net[mode]):.2f}; model idle median {statistics.median(idle[mode]):.0f}%"
        )


if __name__ == "__main__":
    main()
