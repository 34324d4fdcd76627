"""leanrl's GRPO trainer against TRL's GRPOTrainer: same model, reward, group size, steps.

Both trainers get the same tiny random Llama model (made here, nothing downloaded; ``--size``
picks 0.1M, 2.4M or 23M parameters), the same 8 prompts, the same reward (the share of digit
characters in the completion: a learnable toy reward, no Lean), group size G, prompts per step,
completion length, learning rate, loss (``dapo`` token mean, group-std advantages, clip
0.2/0.28, no KL, one pass) and number of steps, on the same CPU thread count. The trainers
alternate seed by seed in one invocation, and so does their order (it rotates every seed). The
figures are the per-seed ratios of TRL's to leanrl's median step time and of leanrl's to TRL's
tokens per second (min / median / max over the seeds, with the pooled medians beside them), and
the mean reward of each over the last 5 steps.

Two modes bring the workload closer to proving (issue 23's "Measure"):

- ``--lengths variable``: every completion gets a target length, drawn from a seeded log-normal
  spread around ``--mean-length`` (``--length-sigma``) clipped to 0.25-2x the mean and to
  ``--max-completion-length``; one shared logits processor (:class:`ForceEOS`) forces EOS once a
  sequence reaches it, on both trainers. The target of the k-th completion of a prompt depends
  only on (seed, prompt, k), so both trainers see the same lengths. TRL gets the processor as
  ``generate(logits_processor=...)`` (its ``GRPOConfig.generation_kwargs`` go into a
  ``GenerationConfig``, which cannot carry one); leanrl's sampler takes no logits processor, so
  a forward hook on the generating model feeds the same processor the prompts and token count
  HF's ``generate`` would (and, as rows that ended leave leanrl's decode batch, which rows are
  left), only while the benchmark's harness is generating (a context variable), never in the
  loss forward. A forced EOS is certain to the sampler, so leanrl's sampler log-prob for it is
  0 while TRL's ratio is 1 by construction: one token per sequence is trained slightly
  differently (it is not in the text, so the reward cannot see it).
- ``--lean simulated --lean-s-per-attempt S``: the reward sleeps S seconds per completion in a
  pool of ``--lean-workers`` threads, standing for Lean checking. For leanrl it is the runtime's
  ``check`` (the harness checks the attempts, then the taskset rewards them: the normal reward
  path, so ``rollout_chunks`` and ``async_generation`` can hide it); for TRL the reward function
  blocks the same way.

``--leanrl-modes default,unstreamed,batched,chunks,async,async-clip`` runs leanrl with its
default settings (``async_generation = "auto"``, off for ``hf``; the rollouts stream, each
attempt checked as its row of the batch ends, at most the runtime's ``check_capacity`` (the
``--lean-workers``) in flight and the others in task order, and each group reported final once
its attempts have verdicts, as leanrl's whole-proof harness does; ``stream_training = "auto"``,
on for ``hf``: each group's forward and backward run as soon as it is reported), with the
update after the last verdict (``unstreamed``: ``stream_training = false``, the default before
it), with the rollouts generated and then checked as one batch (``batched``, how TRL does it;
unstreamed too), with ``rollout_chunks = --chunks`` and with
``async_generation = true`` (the one-step pipeline: step t+1 generated and checked on a copy of
the weights while step t trains; its default objective is decoupled PPO, ``is_correction =
"auto"``: the clip around the weights being trained, the stale sampler corrected by the
truncated weight π_old/μ) and with the pipeline's objective before issue 38's fix
(``async-clip``: ``is_correction = "off"``, ρ against the stale sampler's μ and the clip around
it), each against the same seed's TRL run.

Wall time and CPU time, both (issue 38's goal: a leanrl step at <= 0.7x TRL's wall time at equal
reward, and <= 1.0x its CPU time). Wall time is each step's (median per seed, warm-up left out).
CPU time is the process's (every thread) between consecutive step ends, so it is what a step
costs whatever overlaps, and it is far less sensitive than wall time to other work on a shared
machine; it is split into phases, each timed where it runs: leanrl's decode (the sampler's
thread) and update (the trainer's ``train_step``), the rest being the event loop, harness,
checks and bookkeeping (a streamed step's group passes, ``GRPOEngine.accumulate``, count as
update); TRL's ``_generate``, its reward call (the simulated checks) and the rest
of generate-and-score, training being the rest of the step. The report gives the load average
during the runs. The summary line gives, per seed (min / median / max), leanrl/TRL wall step
time and CPU per step, and whether each goal is met. "Equal reward" there means the paired gap
(TRL - leanrl, last 5 steps) is within two of its standard errors and at most 0.05
(``EQUAL_REWARD_TOL``): two standard errors alone pass large gaps with a few seeds (async at 23M,
seeds 1003..1005: 0.39 +- 0.21, two seeds far behind). Read the per-seed rewards
(``reward_last5_per_seed``) as well.

TRL runs in its own virtual environment (it pins its own dependencies)::

    python -m venv /tmp/trl-venv
    echo "$(python -c 'import site; print(site.getsitepackages()[0])')" \
        > /tmp/trl-venv/lib/python3.11/site-packages/leanrl-venv.pth   # reuse torch/transformers
    /tmp/trl-venv/bin/pip install trl==1.16.0

    python benchmarks/grpo_vs_trl.py --trl-python /tmp/trl-venv/bin/python

(The ``.pth`` line lets the TRL venv see this environment's torch and transformers, so both
trainers use the very same builds; pip then installs only TRL and its missing dependencies.)
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

PROMPTS = [f"theorem t{i} : {i} + {i} = {2 * i} := by" for i in range(8)]

#: hidden size and layers of each ``--size`` (make_tiny_model: 4 heads, 2 KV heads, MLP 2x)
SIZES = {"0.1M": (64, 2), "2.4M": (256, 4), "23M": (512, 10)}

#: the largest paired reward gap (TRL - leanrl, last 5 steps) still called "equal reward"
EQUAL_REWARD_TOL = 0.05

#: leanrl configurations ``--leanrl-modes`` can name (fields given to its GRPOConfig)
MODES = ("default", "unstreamed", "batched", "chunks", "async", "async-clip")


def digit_share(text: str) -> float:
    return sum(ch.isdigit() for ch in text) / max(len(text), 1)


def make_model(out: Path, size: str) -> Path:
    from leanrl.testing import make_tiny_model

    hidden, layers = SIZES[size]
    texts = [*PROMPTS, "theorem foo (x : ℝ) : x ^ 2 ≥ 0 := by\n  nlinarith [sq_nonneg x]\n"] * 4
    texts += ["0123456789 12 345 6789", "simp", "omega", "rfl", "norm_num", "linarith"]
    return make_tiny_model(out, texts, vocab_size=512, hidden_size=hidden, layers=layers)


# -- variable lengths: one processor for both trainers ------------------------------------------


class DrawnLengths:
    """Target length (tokens, EOS included) of the k-th completion of each prompt in a run.

    The draw depends only on (seed, prompt tokens, k): both trainers, whatever order and
    batches they generate in, give the k-th completion of a prompt the same target."""

    def __init__(
        self, seed: int, mean: float, sigma: float, cap: int, special_ids: Iterable[int]
    ) -> None:
        self.seed, self.mean, self.sigma, self.cap = seed, mean, sigma, cap
        self.special = set(special_ids)
        self.lo = max(1, round(0.25 * mean))
        self.hi = min(cap, round(2 * mean))
        self._count: dict[tuple[int, ...], int] = {}
        self._lock = threading.Lock()  # leanrl's chunks may assign from several threads
        self.drawn: list[int] = []

    def target(self, prompt: tuple[int, ...], k: int) -> int:
        # str seeds are hashed with SHA-512: the same in every process (no PYTHONHASHSEED)
        rng = random.Random(f"{self.seed}|{','.join(map(str, prompt))}|{k}")
        # mean-preserving log-normal (E[exp(sZ - s^2/2)] = 1), then clipped
        x = self.mean * math.exp(self.sigma * rng.gauss(0.0, 1.0) - self.sigma**2 / 2)
        return min(max(round(x), self.lo), self.hi)

    def check_keys(self, tokenizer: Any, prompts: Sequence[str]) -> None:
        """Every prompt the processor saw is one of ``prompts`` as tokenized here: otherwise
        the trainers' keys (hence their lengths) would differ, and the comparison with them."""
        known = {
            tuple(t for t in tokenizer.encode(p, add_special_tokens=False) if t not in self.special)
            for p in prompts
        }
        unknown = set(self._count) - known
        if unknown or not self._count:
            raise RuntimeError(
                f"the length processor saw {len(self._count)} prompts, {len(unknown)} of them "
                "not the benchmark's as tokenized here: the trainer's generate path or prompt "
                "tokenization changed; make ForceEOS see the prompt ids again"
            )

    def assign(self, prompts: Sequence[Sequence[int]]) -> list[int]:
        """Targets for one batch of prompt rows (padding and special tokens are dropped, so
        either trainer's padding gives the same key)."""
        out = []
        with self._lock:
            for row in prompts:
                key = tuple(int(t) for t in row if int(t) not in self.special)
                k = self._count.get(key, 0)
                self._count[key] = k + 1
                out.append(self.target(key, k))
            self.drawn += out
        return out


class ForceEOS:
    """A logits processor in Hugging Face's form, ``(input_ids [n, W + t], scores [n, V]) ->
    scores``: once row r holds ``target_r - 1`` generated tokens, only EOS can come next. One
    instance per generate call: its first call sees the prompts (t = 0) and draws the targets."""

    def __init__(self, lengths: DrawnLengths, eos_id: int) -> None:
        self.lengths, self.eos_id = lengths, eos_id
        self.width = -1
        self.targets: Any = None

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        if self.targets is None:
            self.width = int(input_ids.shape[1])
            self.targets = torch.tensor(self.lengths.assign(input_ids.tolist()))
        return self.force(scores, int(input_ids.shape[1]) - self.width)

    def force(self, scores: Any, generated: int, rows: Any = None) -> Any:
        """``scores`` [m, V] after ``generated`` tokens; with ``rows``: the rows of the first
        call's batch they are (leanrl's sampler drops finished rows)."""
        import torch

        targets = self.targets if rows is None else self.targets[rows]
        force = (targets - 1 <= generated).to(scores.device)
        if not bool(force.any()):
            return scores
        forced = torch.full_like(scores, float("-inf"))
        forced[:, self.eos_id] = 0.0
        return torch.where(force.unsqueeze(-1), forced, scores)


class _Generating:
    """leanrl side: the state of one harness generate call, seen by the model's forward hook."""

    def __init__(self, lengths: DrawnLengths, eos_id: int, sampler: Any) -> None:
        self.lengths, self.eos_id, self.sampler = lengths, eos_id, sampler
        self.proc: ForceEOS | None = None
        self.generated = 0


_GENERATING: contextvars.ContextVar[_Generating | None] = contextvars.ContextVar(
    "grpo_vs_trl_generating", default=None
)


def _force_hook(module: Any, args: Any, kwargs: dict[str, Any], output: Any) -> Any:
    """Forward hook on leanrl's generating model. The sampler calls the model once with the
    (left-padded) prompts, then once per token with the last token of each live row (rows that
    ended leave the batch; the sampler's ``decode_rows`` says which rows are left); this hands
    :class:`ForceEOS` the prompts on the first call, then the token count and rows, and applies
    it to the last position's logits. Off (returns at once) outside the harness's generate call:
    the context variable is set there and copied into the sampler's worker thread."""
    state = _GENERATING.get()
    if state is None:
        return None

    step: Any = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
    last = output.logits[:, -1, :]
    if step.shape[1] > 1 or state.proc is None:  # the prompts: a new decode begins
        state.proc = ForceEOS(state.lengths, state.eos_id)
        output.logits[:, -1, :] = state.proc(step.cpu(), last)
        state.generated = 0
        return output
    # One token per live row; the sampler says which rows of the batch they are (rows that
    # ended have left it).
    state.generated += 1
    rows = state.sampler.decode_rows
    assert rows is not None and len(rows) == step.shape[0]
    output.logits[:, -1, :] = state.proc.force(last, state.generated, rows)
    return output


def _sampler(policy: Any) -> Any:
    """leanrl's hf sampler behind the trainer's generation policy (its clock wraps it)."""
    seen = policy
    while not hasattr(seen, "model") and hasattr(seen, "inner"):
        seen = seen.inner
    if not hasattr(seen, "decode_rows"):
        raise TypeError(f"variable lengths need leanrl's hf sampler (TrainPolicy); got {policy!r}")
    return seen


# -- CPU time per phase ----------------------------------------------------------------------------


class CpuMeter:
    """CPU seconds per phase of a trainer's steps. ``add(phase, s)`` counts a phase's CPU (each
    phase is timed in the thread that runs it, with ``time.thread_time``, or with the process
    clock where the trainer is one thread); ``mark()`` at the end of every step records the
    process's CPU so far (every thread: the event loop, the sampler's and the trainer's) and the
    phases' running totals. Per step = the difference between consecutive marks, so an
    asynchronous step (step t+1 generating while step t trains) counts what ran between two
    step ends."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}
        self.marks: list[dict[str, float]] = []
        self._lock = threading.Lock()

    def add(self, phase: str, seconds: float) -> None:
        with self._lock:
            self.totals[phase] = self.totals.get(phase, 0.0) + seconds

    def mark(self) -> None:
        with self._lock:
            self.marks.append({"process": time.process_time(), **self.totals})

    def per_step(self, skip: int) -> dict[str, list[float]]:
        """Each phase's CPU seconds in each step from ``skip`` on (``process``: all of it)."""
        keys = sorted({k for m in self.marks for k in m})
        out: dict[str, list[float]] = {k: [] for k in keys}
        first = max(skip, 1)
        for a, b in zip(self.marks[first - 1 : -1], self.marks[first:], strict=True):
            for k in keys:
                out[k].append(b.get(k, 0.0) - a.get(k, 0.0))
        return out


def _timed(meter: CpuMeter, phase: str, fn: Any, clock: Any = time.thread_time) -> Any:
    def wrapper(*a: Any, **k: Any) -> Any:
        t = clock()
        try:
            return fn(*a, **k)
        finally:
            meter.add(phase, clock() - t)

    return wrapper


# -- leanrl ---------------------------------------------------------------------------------------


def run_leanrl(model: Path, args: argparse.Namespace, out: Path, mode: str) -> dict[str, Any]:
    from leanrl import Environment, Harness, Rollout, Runtime, Task, Taskset, Turn
    from leanrl.harness import report_group
    from leanrl.harnesses.whole_proof.stream import CheckBatcher
    from leanrl.policy import (
        Policy,
        PolicyConfig,
        SamplingConfig,
        StreamRequest,
        stream_replays_generate,
    )
    from leanrl.taskset import RawRow
    from leanrl.train.grpo import GRPOConfig, GRPOTrainer
    from leanrl.verdict import Attempt, Reason, Verdict

    lengths: DrawnLengths | None = None
    eos_id = -1
    if args.lengths == "variable":
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model)
        eos_id = int(tok.eos_token_id)
        lengths = DrawnLengths(
            args.seed, args.mean_length, args.length_sigma, args.max_tokens, tok.all_special_ids
        )
    hooked: set[int] = set()
    pool = ThreadPoolExecutor(args.lean_workers) if args.lean == "simulated" else None

    class Prompts(Taskset):
        def load_rows(self) -> Iterable[RawRow]:
            for i, p in enumerate(PROMPTS):
                data = {"name": f"t{i}", "header": "", "formal_statement": p}
                yield RawRow(origin="bench", index=i + 1, data=data)

        def group_rewards(self, task: Task, rollouts: Sequence[Rollout]) -> list[float]:
            return [digit_share(r.completion) for r in rollouts]

    class OneTurn(Harness):
        async def run(
            self,
            tasks: Sequence[Task],
            policy: Policy,
            runtime: Runtime,
            sampling: SamplingConfig,
            taskset: Taskset,
        ) -> list[list[Rollout]]:
            prompts = [t.formal_statement for t in tasks]
            # As leanrl's own harnesses do: where the policy streams what generate would give,
            # each attempt goes to Lean as it arrives ("batched" mode: never).
            streams = mode != "batched" and stream_replays_generate(policy, sampling, native=True)
            checks: list[Any] = []
            token = None
            if lengths is not None:
                sampler = _sampler(policy)
                if id(sampler.model) not in hooked:  # async mode generates on its own copy
                    sampler.model.register_forward_hook(_force_hook, with_kwargs=True)
                    hooked.add(id(sampler.model))
                token = _GENERATING.set(_Generating(lengths, eos_id, sampler))

            def group_of(task: Task, cs: Sequence[Any]) -> list[Rollout]:
                return [
                    Rollout(
                        task_id=task.id,
                        sample=j,
                        prompt=task.formal_statement,
                        prompt_ids=list(c.prompt_token_ids),
                        turns=[
                            Turn(
                                completion=c.text,
                                completion_ids=list(c.token_ids),
                                logprobs=list(c.logprobs or ()),
                                finish_reason=c.finish_reason,
                            )
                        ],
                    )
                    for j, c in enumerate(cs)
                ]

            # leanrl's whole-proof harness's CheckBatcher with the runtime's check_capacity: at
            # most that many attempts in flight, the others handed over in task order, so that
            # groups get their verdicts one after another.
            batcher = CheckBatcher(
                SimulatedChecks(), runtime, taskset, 1, 0.0, runtime.check_capacity()
            )
            finished: dict[int, list[Rollout]] = {}
            got: list[list[Any]] = [[None] * sampling.n for _ in prompts]
            left = [sampling.n] * len(prompts)

            async def checked(i: int, j: int, c: Any) -> None:
                # As leanrl's whole-proof harness does: the attempt is checked as it arrives,
                # and a group whose attempts all have verdicts gets its rewards and is reported
                # final (report_group: stream_training trains on it while the rest go on).
                got[i][j] = c
                if pool is not None:
                    await batcher.check(tasks[i], group_of(tasks[i], [c])[0], (i, j))
                left[i] -= 1
                if left[i] == 0:
                    g = finished[i] = group_of(tasks[i], got[i])
                    for r, w in zip(g, taskset.group_rewards(tasks[i], g), strict=True):
                        r.reward = w
                    report_group(tasks[i], g)

            try:
                if streams:
                    requests = [
                        StreamRequest(key=i, prompt=p, sampling=sampling, slot=i)
                        for i, p in enumerate(prompts)
                    ]
                    async for sc in policy.stream(requests):
                        i = cast(int, sc.key)
                        checks.append(asyncio.ensure_future(checked(i, sc.sample, sc.completion)))
                    comps = got
                else:
                    comps = await policy.generate(prompts, sampling)
            finally:
                if token is not None:
                    _GENERATING.reset(token)
            try:
                await asyncio.gather(*checks)
            finally:
                batcher.close()
            out = [
                finished.get(i) or group_of(task, cs)
                for i, (task, cs) in enumerate(zip(tasks, comps, strict=True))
            ]
            if pool is not None and not streams:  # check every attempt, then reward
                attempts = [
                    Attempt(
                        name=task.name,
                        header="",
                        formal_statement=task.formal_statement,
                        proof=r.completion,
                        id=f"{task.id}/{r.sample}",
                    )
                    for task, g in zip(tasks, out, strict=True)
                    for r in g
                ]
                verdicts = iter(await runtime.check(attempts))
                for g in out:
                    for r in g:
                        r.verdict = next(verdicts)
            for i, (task, g) in enumerate(zip(tasks, out, strict=True)):
                if i not in finished:
                    for r, w in zip(g, taskset.group_rewards(task, g), strict=True):
                        r.reward = w
            return out

    class SimulatedLean(Runtime):
        """Each attempt holds one of the pool's threads for ``--lean-s-per-attempt`` s."""

        def check_capacity(self) -> int:
            return int(args.lean_workers)

        async def check(self, attempts: Sequence[Attempt]) -> list[Verdict]:
            assert pool is not None
            loop = asyncio.get_running_loop()
            s = args.lean_s_per_attempt
            await asyncio.gather(*(loop.run_in_executor(pool, time.sleep, s) for _ in attempts))
            return [Verdict(accepted=True, reason=Reason.OK, time_s=s, id=a.id) for a in attempts]

    class SimulatedChecks:
        """What CheckBatcher calls to check a piece: one simulated Lean check per attempt."""

        async def check_rollouts(self, items: Sequence[Any], runtime: Runtime, _: Any) -> None:
            a = Attempt(name="t", header="", formal_statement="t", proof="")
            await runtime.check([a for _ in items])

    class NoLean(Runtime):
        async def check(self, attempts: Sequence[Attempt]) -> list[Verdict]:
            raise AssertionError("no Lean in this benchmark (see --lean simulated)")

    class Env(Environment):
        taskset_class = Prompts

        def make_harness(self) -> Harness:
            return OneTurn()

        def make_runtime(self) -> Runtime:
            return SimulatedLean() if pool is not None else NoLean()

    extra: dict[str, Any] = {}
    if mode == "chunks":
        extra["rollout_chunks"] = args.chunks
    elif mode in ("unstreamed", "batched"):  # every group trained after the last verdict
        extra["stream_training"] = False
    elif mode == "async":
        extra["async_generation"] = True
    elif mode == "async-clip":  # the pipeline's objective before issue 38: the clip around μ
        extra.update(async_generation=True, is_correction="off")
    cfg = GRPOConfig(
        policy=PolicyConfig(model=str(model), batch_size=64),
        sampling=SamplingConfig(max_tokens=args.max_tokens, temperature=1.0, top_p=1.0, seed=0),
        out=out,
        steps=args.steps,
        tasks_per_step=args.tasks_per_step,
        group_size=args.group_size,
        lr=args.lr,
        weight_decay=0.0,
        warmup_steps=0,
        micro_batch_size=args.tasks_per_step * args.group_size,
        save_every=10**6,
        mask_truncated=False,
        dynamic_sampling="off",  # TRL trains on every group
        seed=args.seed,
        **extra,
    )
    from leanrl.train.grpo.engine import GRPOEngine
    from leanrl.train.hf_policy import TrainPolicy

    # CPU per phase: the sampler's decode and the trainer's update, each in its own thread
    meter = CpuMeter()
    plain = TrainPolicy.generate_ids_sync, GRPOEngine.train_step, GRPOEngine.accumulate
    timed_train = _timed(meter, "train", plain[1])

    def train_step(self: Any, batch: Any) -> Any:
        try:
            return timed_train(self, batch)
        finally:
            meter.mark()

    TrainPolicy.generate_ids_sync = _timed(meter, "generate", plain[0])  # type: ignore[method-assign]
    GRPOEngine.train_step = train_step  # type: ignore[method-assign]
    # stream_training: a group's forward and backward, in a worker thread during the rollout
    GRPOEngine.accumulate = _timed(meter, "train", plain[2])  # type: ignore[method-assign]
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    try:
        trainer = GRPOTrainer(cfg, env=Env())
        trainer.train_sync()
    finally:
        TrainPolicy.generate_ids_sync, GRPOEngine.train_step, GRPOEngine.accumulate = plain  # type: ignore[method-assign]
        if pool is not None:
            pool.shutdown()
    wall = time.perf_counter() - t0
    if lengths is not None:
        lengths.check_keys(tok, PROMPTS)
    rows = trainer.run.metrics()
    return {
        "cpu": meter.per_step(args.skip),
        "load": (load0 + os.getloadavg()[0]) / 2,
        "step_times": [r["time_step"] for r in rows],
        "rewards": [r["reward_mean"] for r in rows],
        "tokens": [r["completion_len"] * args.tasks_per_step * args.group_size for r in rows],
        "parts": {k: [r.get(f"time_{k}", 0.0) for r in rows] for k in ("generate", "verify")},
        "wall_s": wall,
        "mean_target": statistics.fmean(lengths.drawn) if lengths and lengths.drawn else None,
    }


# -- TRL (runs in the TRL venv, as a child process) -------------------------------------------------


def run_trl(model: Path, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    from datasets import Dataset
    from transformers import AutoTokenizer, LogitsProcessorList, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    step_times: list[float] = []
    rewards: list[float] = []
    tokens: list[float] = []
    n = args.tasks_per_step * args.group_size
    meter = CpuMeter()
    pool = ThreadPoolExecutor(args.lean_workers) if args.lean == "simulated" else None

    class Clock(TrainerCallback):  # type: ignore[misc]
        t = 0.0

        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.t = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            step_times.append(time.perf_counter() - self.t)
            meter.mark()

        def on_log(self, *a: Any, logs: dict[str, Any] | None = None, **k: Any) -> None:
            if logs and "reward" in logs:
                rewards.append(float(logs["reward"]))
                tokens.append(float(logs["completions/mean_length"]) * n)

    def reward(completions: list[str], **kw: Any) -> list[float]:
        if pool is not None:  # the same simulated Lean as leanrl's runtime: blocks the step
            list(pool.map(time.sleep, [args.lean_s_per_attempt] * len(completions)))
        return [digit_share(c) for c in completions]

    config = GRPOConfig(
        output_dir=str(out),
        use_cpu=True,
        per_device_train_batch_size=n,
        num_generations=args.group_size,
        max_completion_length=args.max_tokens,
        max_steps=args.steps,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        warmup_steps=0,
        beta=0.0,
        loss_type="dapo",
        epsilon=0.2,
        epsilon_high=0.28,
        scale_rewards="group",
        num_iterations=1,
        temperature=1.0,
        top_p=1.0,
        mask_truncated_completions=False,
        # leanrl does not checkpoint activations by default (GRPOConfig.gradient_checkpointing);
        # TRL's GRPOConfig turns it on, which recomputes the forward pass in the backward: off
        # by default here, so both trainers do the same work.
        gradient_checkpointing=args.trl_gradient_checkpointing,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        seed=args.seed,
        bf16=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    tok = AutoTokenizer.from_pretrained(model)
    data = Dataset.from_dict({"prompt": PROMPTS * (args.steps * args.tasks_per_step)})
    trainer = GRPOTrainer(
        model=str(model),
        reward_funcs=reward,
        args=config,
        train_dataset=data,
        processing_class=tok,
        callbacks=[Clock()],
    )
    lengths: DrawnLengths | None = None
    if args.lengths == "variable":
        lengths = DrawnLengths(
            args.seed, args.mean_length, args.length_sigma, args.max_tokens, tok.all_special_ids
        )
        # TRL calls unwrapped_model.generate(...); on one CPU process that is trainer.model
        # itself, so an instance attribute adds the processor to every generate call.
        gen_model = trainer.model
        plain_generate = gen_model.generate
        eos_id = int(tok.eos_token_id)

        def generate(*a: Any, **k: Any) -> Any:
            procs = LogitsProcessorList(k.pop("logits_processor", None) or [])
            procs.append(ForceEOS(lengths, eos_id))  # a fresh one per call (it holds targets)
            return plain_generate(*a, logits_processor=procs, **k)

        gen_model.generate = generate
    # CPU per phase. TRL's step runs in one thread (the simulated checks sleep in the pool), so
    # the process clock times its phases: generation (`_generate`), the rewards (the checks),
    # and everything else of generate-and-score (advantages, log-prob bookkeeping); training is
    # the rest of the step.
    proc = time.process_time
    trainer._generate = _timed(meter, "generate", trainer._generate, proc)
    trainer._calculate_rewards = _timed(meter, "reward", trainer._calculate_rewards, proc)
    trainer._generate_and_score_completions = _timed(
        meter, "generate_and_score", trainer._generate_and_score_completions, proc
    )
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    try:
        trainer.train()
    finally:
        if pool is not None:
            pool.shutdown()
    wall = time.perf_counter() - t0
    checkpointing = bool(getattr(trainer.model, "is_gradient_checkpointing", False))
    if lengths is not None:
        lengths.check_keys(tok, PROMPTS)
    cpu = meter.per_step(args.skip)
    score = cpu.pop("generate_and_score", [0.0] * len(cpu["process"]))
    cpu["train"] = [p - g for p, g in zip(cpu["process"], score, strict=True)]
    cpu["score_other"] = [
        g - a - b for g, a, b in zip(score, cpu["generate"], cpu["reward"], strict=True)
    ]
    return {
        "cpu": cpu,
        "load": (load0 + os.getloadavg()[0]) / 2,
        "step_times": step_times,
        "rewards": rewards,
        "tokens": tokens,
        "wall_s": wall,
        "gradient_checkpointing": checkpointing,
        "mean_target": statistics.fmean(lengths.drawn) if lengths else None,
    }


# -- driver ------------------------------------------------------------------------------------


def _sem(xs: Sequence[float]) -> float:
    """Standard error of the mean (0 for fewer than two values)."""
    return statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else 0.0


def summary(name: str, runs: list[dict[str, Any]], skip: int) -> dict[str, Any]:
    times = [t for r in runs for t in r["step_times"][skip:]]
    last5 = [statistics.fmean(r["rewards"][-5:]) for r in runs]
    tokens = sum(sum(r["tokens"][skip:]) for r in runs)
    out = {
        "trainer": name,
        "median_step_s": statistics.median(times),
        "mean_step_s": statistics.fmean(times),
        "tokens_per_s": tokens / sum(times),
        "completion_tokens_per_step": tokens / sum(len(r["tokens"][skip:]) for r in runs),
        "reward_first5": statistics.fmean(statistics.fmean(r["rewards"][:5]) for r in runs),
        "reward_last5": statistics.fmean(last5),
        "reward_last5_sem": _sem(last5),
        "reward_last5_per_seed": [round(statistics.fmean(r["rewards"][-5:]), 3) for r in runs],
        "steps_per_seed": [len(r["step_times"]) for r in runs],
        "reward_curve_mean_over_seeds": [
            round(statistics.fmean(r["rewards"][i] for r in runs), 3)
            for i in range(min(len(r["rewards"]) for r in runs))
        ],
        "train_wall_s": sum(r["wall_s"] for r in runs),
    }
    if runs[0].get("mean_target") is not None:
        out["mean_target_length"] = statistics.fmean(r["mean_target"] for r in runs)
    # CPU seconds per step, each phase's mean over every seed's steps (``process``: the total)
    out["cpu_per_step_s"] = {
        k: statistics.fmean(x for r in runs for x in r["cpu"][k]) for k in runs[0]["cpu"]
    }
    out["load_average"] = statistics.fmean(r["load"] for r in runs)
    if "parts" in runs[0]:  # leanrl's own split of a step (generation, then checking)
        for part in runs[0]["parts"]:
            out[f"median_{part}_s"] = statistics.median(
                t for r in runs for t in r["parts"][part][skip:]
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trl-python", default="/tmp/trl-venv/bin/python")
    ap.add_argument("--size", choices=list(SIZES), default="0.1M", help="model parameters")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--tasks-per-step", type=int, default=4)
    ap.add_argument(
        "--max-tokens", "--max-completion-length", dest="max_tokens", type=int, default=32
    )
    ap.add_argument("--lengths", choices=["fixed", "variable"], default="fixed")
    ap.add_argument(
        "--mean-length",
        type=float,
        help="--lengths variable: mean target length in tokens (default: half the cap)",
    )
    ap.add_argument(
        "--length-sigma", type=float, default=0.6, help="--lengths variable: log-normal sigma"
    )
    ap.add_argument("--lean", choices=["none", "simulated"], default="none")
    ap.add_argument("--lean-s-per-attempt", type=float, default=0.05)
    ap.add_argument("--lean-workers", type=int, default=4, help="simulated Lean: pool threads")
    ap.add_argument("--lr", type=float, default=3e-3)
    # Seeds 1000.. were never used while the trainer was developed (0-7 were, and on them TRL
    # happens to be ahead by more than on other seeds), so the default set is not cherry-picked.
    ap.add_argument("--seed", type=int, default=1000, help="first seed")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=16, help="seeds per trainer (alternating)")
    ap.add_argument(
        "--leanrl-modes",
        default="default",
        help=f"comma-separated leanrl configurations, each against TRL: {', '.join(MODES)}",
    )
    ap.add_argument("--chunks", type=int, default=4, help="rollout_chunks of the chunks mode")
    ap.add_argument(
        "--with-async",
        action="store_true",
        help="also run leanrl with async_generation (same as adding async to --leanrl-modes)",
    )
    ap.add_argument("--skip", type=int, default=2, help="warm-up steps left out of step times")
    ap.add_argument(
        "--trl-gradient-checkpointing",
        action="store_true",
        help="let TRL checkpoint activations (its default; leanrl's is off)",
    )
    ap.add_argument("--part", choices=["driver", "trl"], default="driver", help=argparse.SUPPRESS)
    ap.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mean_length is None:
        args.mean_length = args.max_tokens / 2
    modes = [m.strip() for m in args.leanrl_modes.split(",") if m.strip()]
    if args.with_async and "async" not in modes:
        modes.append("async")
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        sys.exit(f"--leanrl-modes {args.leanrl_modes!r}: give some of {', '.join(MODES)}")

    import torch

    torch.set_num_threads(args.threads)
    if args.part == "trl":
        res = run_trl(args.model, args, args.result.parent / "trl-out")
        args.result.write_text(json.dumps(res))
        return

    if not Path(args.trl_python).exists():
        sys.exit(f"TRL venv python {args.trl_python} not found; see the module docstring")
    work = Path(tempfile.mkdtemp(prefix="grpo-vs-trl-"))
    names = [f"leanrl-{m}" if m != "default" else "leanrl" for m in modes]
    runs: dict[str, list[dict[str, Any]]] = {"trl": [], **{n: [] for n in names}}
    try:
        model = make_model(work / "model", args.size)
        # Alternate the trainers seed by seed and rotate their order, so that load on a shared
        # machine (and whatever the run before leaves warm) hits every trainer alike.
        order: list[Any] = [*zip(names, modes, strict=True), "trl"]
        first = args.seed
        for i, seed in enumerate(range(first, first + args.repeats)):
            args.seed = seed
            k = i % len(order)
            for item in order[k:] + order[:k]:
                if item == "trl":
                    runs["trl"].append(_trl_run(model, args, work, seed))
                else:
                    name, mode = item
                    shutil.rmtree(work / name, ignore_errors=True)
                    runs[name].append(run_leanrl(model, args, work / name, mode))
                print(f"seed {seed}: {item if item == 'trl' else item[0]} done", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _report(args, runs, names)


def _trl_run(model: Path, args: argparse.Namespace, work: Path, seed: int) -> dict[str, Any]:
    """One TRL run in the TRL venv (a child process)."""
    result = work / "trl.json"
    cmd = [args.trl_python, __file__, "--part", "trl", "--model", str(model)]
    if args.trl_gradient_checkpointing:
        cmd.append("--trl-gradient-checkpointing")
    cmd += ["--result", str(result), "--steps", str(args.steps)]
    cmd += ["--group-size", str(args.group_size)]
    cmd += ["--tasks-per-step", str(args.tasks_per_step)]
    cmd += ["--max-tokens", str(args.max_tokens), "--lr", str(args.lr)]
    cmd += ["--seed", str(seed), "--threads", str(args.threads)]
    cmd += ["--lengths", args.lengths, "--mean-length", str(args.mean_length)]
    cmd += ["--length-sigma", str(args.length_sigma), "--lean", args.lean]
    cmd += ["--lean-s-per-attempt", str(args.lean_s_per_attempt)]
    cmd += ["--lean-workers", str(args.lean_workers), "--skip", str(args.skip)]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    return json.loads(result.read_text())  # type: ignore[no-any-return]


def _spread(xs: Sequence[float]) -> str:
    return f"{min(xs):.2f} / {statistics.median(xs):.2f} / {max(xs):.2f}"


def _per_seed(
    a: list[dict[str, Any]], b: list[dict[str, Any]], skip: int
) -> tuple[list[float], list[float]]:
    """Seed by seed (each pair ran back to back, so their spread is the noise): b/a median
    step time, and a/b completion tokens per second of step time."""
    steps = [
        statistics.median(t["step_times"][skip:]) / statistics.median(le["step_times"][skip:])
        for le, t in zip(a, b, strict=True)
    ]
    toks = [
        (sum(le["tokens"][skip:]) / sum(le["step_times"][skip:]))
        / (sum(t["tokens"][skip:]) / sum(t["step_times"][skip:]))
        for le, t in zip(a, b, strict=True)
    ]
    return steps, toks


def _cpu_ratio(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[float]:
    """Seed by seed: a's mean CPU seconds per step over b's (whole process, every thread)."""
    return [
        statistics.fmean(x["cpu"]["process"]) / statistics.fmean(y["cpu"]["process"])
        for x, y in zip(a, b, strict=True)
    ]


def _cpu_line(c: dict[str, float]) -> str:
    parts = ", ".join(f"{k} {v:.2f}" for k, v in sorted(c.items()) if k != "process")
    return f"{c['process']:.2f} s ({parts})"


def _gap(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> tuple[float, float]:
    """Paired by seed (both saw the same seed, so the difference's s.e. is the fair one): mean
    reward of the last 5 steps, b - a, and its s.e."""
    diffs = [
        statistics.fmean(t["rewards"][-5:]) - statistics.fmean(le["rewards"][-5:])
        for le, t in zip(a, b, strict=True)
    ]
    return statistics.fmean(diffs), _sem(diffs)


def _report(
    args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]], names: list[str]
) -> None:
    b = summary("trl", runs["trl"], args.skip)
    report: dict[str, Any] = {n: summary(n, runs[n], args.skip) for n in names}
    report["trl"] = b
    print(json.dumps(report, indent=2))
    lean = (
        f"simulated, {args.lean_s_per_attempt:g} s per attempt, {args.lean_workers} threads"
        if args.lean == "simulated"
        else "none"
    )
    lengths = (
        f"variable (log-normal sigma {args.length_sigma:g} around {args.mean_length:g}, "
        f"clipped to 0.25-2x and {args.max_tokens})"
        if args.lengths == "variable"
        else "fixed cap"
    )
    print(
        f"\n{args.size} model, G={args.group_size}, {args.tasks_per_step} prompts/step, "
        f"{args.max_tokens} tokens, lengths {lengths}, Lean {lean}, {args.steps} steps "
        f"({args.skip} warm-up left out), seeds {args.seed - args.repeats + 1}..{args.seed}, "
        f"{args.threads} thread(s), TRL gradient checkpointing "
        f"{'on' if runs['trl'][0].get('gradient_checkpointing') else 'off'}, load average "
        f"during the runs {statistics.fmean(r['load'] for rs in runs.values() for r in rs):.1f} "
        f"on {os.cpu_count()} cores\n"
        f"TRL: CPU per step {_cpu_line(b['cpu_per_step_s'])}\n"
        f"TRL: step {b['median_step_s'] * 1e3:.1f} ms (median), {b['tokens_per_s']:.0f} "
        f"completion tokens/s, {b['completion_tokens_per_step'] / args.tasks_per_step / args.group_size:.1f}"
        f" tokens per completion, reward last 5 {b['reward_last5']:.3f} ± "
        f"{b['reward_last5_sem']:.3f}"
    )
    quotes = []
    for name in names:
        a = report[name]
        steps, toks = _per_seed(runs[name], runs["trl"], args.skip)
        inverse = [1 / x for x in steps]  # leanrl/TRL: the direction of issue 23's goal
        gap, gap_sem = _gap(runs[name], runs["trl"])
        cpu = _cpu_ratio(runs[name], runs["trl"])
        a["per_seed_leanrl_over_trl_cpu"] = [round(x, 3) for x in cpu]
        a["per_seed_leanrl_over_trl_step"] = [round(x, 3) for x in inverse]
        a["reward_gap_trl_minus_this"] = {"mean": gap, "sem": gap_sem}
        per_completion = a["completion_tokens_per_step"] / args.tasks_per_step / args.group_size
        print(
            f"{name}: step {a['median_step_s'] * 1e3:.1f} ms (median; generate "
            f"{a['median_generate_s'] * 1e3:.0f} ms, checking {a['median_verify_s'] * 1e3:.0f} "
            f"ms), {per_completion:.1f} tokens per completion\n"
            f"  leanrl/TRL step time per seed (min / median / max): {_spread(inverse)}; "
            f"pooled medians {a['median_step_s'] / b['median_step_s']:.2f}\n"
            f"  TRL/leanrl step time per seed: {_spread(steps)}; leanrl/TRL tokens per second "
            f"per seed: {_spread(toks)}\n"
            f"  CPU per step {_cpu_line(a['cpu_per_step_s'])}; leanrl/TRL CPU per step per "
            f"seed: {_spread(cpu)}\n"
            f"  reward last 5: {a['reward_last5']:.3f} ± {a['reward_last5_sem']:.3f} (first 5: "
            f"{a['reward_first5']:.3f} / TRL {b['reward_first5']:.3f}); paired gap TRL - this: "
            f"{gap:.3f} ± {gap_sem:.3f} (z = {gap / gap_sem if gap_sem else float('nan'):.2f})"
        )
        # "at equal reward": not behind TRL's by more than two standard errors of the gap, nor by
        # more than EQUAL_REWARD_TOL (with 3 seeds two standard errors let 0.39 +- 0.21 pass)
        equal = gap <= 2 * gap_sem and gap <= EQUAL_REWARD_TOL
        wall_met = statistics.median(inverse) <= 0.7 and equal
        cpu_met = statistics.median(cpu) <= 1.0
        quotes.append(
            f"{name} wall {_spread(inverse)} ({'met' if wall_met else 'not met'}), CPU "
            f"{_spread(cpu)} ({'met' if cpu_met else 'not met'}), reward "
            f"{a['reward_last5']:.3f} vs TRL {b['reward_last5']:.3f} "
            f"({'equal' if equal else 'lower'})"
        )
    print(
        json.dumps(
            {
                n: {
                    k: report[n][k]
                    for k in (
                        "per_seed_leanrl_over_trl_step",
                        "per_seed_leanrl_over_trl_cpu",
                        "reward_gap_trl_minus_this",
                    )
                }
                for n in names
            }
        )
    )
    print(
        f"\nSUMMARY: leanrl/TRL GRPO per seed (min / median / max), wall step time (goal <= 0.7 "
        f"at equal reward) and CPU per step (goal <= 1.0), "
        f"{args.size}, lengths {args.lengths}, Lean {lean}, {args.repeats} seeds x "
        f"{args.steps} steps: " + "; ".join(quotes)
    )


if __name__ == "__main__":
    main()
