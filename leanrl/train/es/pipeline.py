"""Pipelined member scoring: member i+1 generates while member i's attempts are in Lean.

A member needs its perturbed weights only while it *generates*; checking its attempts (Lean, a
sandbox, a pure-Python reward) needs no weights at all. So one engine (a model on a GPU) can
serve several members at once if generation takes turns:

- an :class:`EngineGate` owns the engine's weights: a member's ``generate`` takes the gate,
  writes that member's perturbation (only if another member's is loaded: perturbation is exact
  from the fp32 master, so switching never drifts), generates, and lets go;
- each member runs the environment as usual with a :class:`MemberPolicy`, its view of the
  shared engine, so any harness works unchanged (multi-turn ones take the gate once per turn);
- :class:`PipelinedScorer` keeps ``depth`` members in flight: while member i waits for Lean,
  member i+1 already holds the gate. With ``depth = 1`` it is the one-after-another scorer.

Rewards do not depend on ``depth``: each generate call runs with exactly its member's weights
(and sampling seed), whatever ran before it. The gate measures how long the engine worked, so
the scorer reports the **GPU-idle fraction** of each iteration (``gpu_idle_frac`` in
``metrics.jsonl``): 1 - engine-busy seconds / wall seconds of the iteration.

``depth = "auto"`` (``scorer.pipeline``, the default) measures it: the first iteration runs at
depth 2, and after each iteration :class:`PipelineDepth` sets the next one from the measured
generation seconds G and checking seconds V per member (a running mean) with :func:`depth_for`:
``ceil(1 + V/G)`` members in flight keep the engine busy (one generating while ``V/G`` are
checked), capped by what the checker can serve at once (:func:`check_capacity`) and the number
of members. Each change is logged, and the depth each iteration used is ``pipeline_depth`` in
``metrics.jsonl``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from leanrl.errors import ConfigError, PolicyError
from leanrl.policy import (
    Completion,
    Policy,
    Prompt,
    SamplingConfig,
    StreamCompletion,
    StreamRequest,
    closing_stream,
    stream_replays_generate,
)
from leanrl.train.es.workers import (
    IterationState,
    Member,
    MemberScore,
    VLLMScorer,
    score_rollouts,
)

if TYPE_CHECKING:
    from leanrl.environment import Environment
    from leanrl.runtime import Runtime
    from leanrl.train.es.config import ESConfig
    from leanrl.train.es.population import LowRankPopulation
    from leanrl.train.es.weights import ESWeights

__all__ = [
    "BatchGate",
    "Engine",
    "EngineGate",
    "MemberPolicy",
    "PipelineDepth",
    "PipelinedScorer",
    "PipelinedVLLMScorer",
    "TorchEngine",
    "VLLMEngine",
    "check_capacity",
    "depth_for",
    "inprocess_scorer",
]

log = logging.getLogger("leanrl.train")

#: Depth of the first iteration of an ``auto`` run, before anything is measured.
AUTO_FIRST_DEPTH = 2


def depth_for(check_s: float, gen_s: float, capacity: int | None, items: int) -> int:
    """Members (or batches) to keep in flight so one engine never waits for the checker.

    While one item generates for ``gen_s`` seconds, the ones before it are checked, each for
    ``check_s`` seconds: ``ceil(1 + check_s / gen_s)`` in flight keep the engine busy. Capped by
    ``capacity`` (items checking can serve at once, plus the one generating; None: unbounded)
    and by ``items`` (no more in flight than there are). Ratio 2.66 gives 4.
    """
    if check_s < 0 or gen_s < 0 or items < 1 or (capacity is not None and capacity < 1):
        raise ValueError(
            f"depth_for needs check_s, gen_s >= 0 and items, capacity >= 1 (got check_s="
            f"{check_s}, gen_s={gen_s}, capacity={capacity}, items={items})"
        )
    cap = items if capacity is None else min(capacity, items)
    if gen_s == 0:
        return cap if check_s > 0 else 1
    # the epsilon keeps a ratio measured as 1.0000001 from asking for one more than 1.0 does
    want = math.ceil(1 + check_s / gen_s - 1e-6)
    return max(1, min(want, cap))


def check_capacity(runtime: Runtime, attempts_per_item: int) -> int | None:
    """Items (members, or batches of members) in flight that ``runtime`` can serve: the one
    generating plus as many checking at once as its Lean processes fit (``local``/``docker``:
    ``workers`` attempts at once, one per CPU core when 0). None: no known bound (a sandbox
    runtime scales out; a checker of the user's own is not known)."""
    if getattr(runtime, "name", None) not in ("local", "docker"):
        return None
    workers = runtime.config.workers or os.cpu_count() or 1
    return 1 + max(1, workers // max(1, attempts_per_item))


class PipelineDepth:
    """The depth of a scorer: fixed (an int), or ``"auto"``: measured after every iteration.

    Kept on the object that lives for the whole run (a vLLM scorer rebuilds its inner scorer
    each iteration), so the running means carry over."""

    def __init__(self, setting: int | Literal["auto"] = "auto") -> None:
        if setting != "auto" and (not isinstance(setting, int) or setting < 1):
            raise ValueError(
                f"the pipeline depth must be a whole number >= 1 or 'auto', got {setting!r}"
            )
        self.auto = setting == "auto"
        self.depth: int = AUTO_FIRST_DEPTH if setting == "auto" else int(setting)
        """Items in flight for the next ``score``."""
        self.gen_s: float | None = None
        """Running mean of the engine seconds per item (member, or batch of members)."""
        self.check_s: float | None = None
        """Running mean of the checking seconds per item (its wall time, less generation)."""

    def observe(self, gen_s: float, check_s: float, items: int, capacity: int | None) -> None:
        """Fold one iteration's measurement in; an ``auto`` depth follows it."""
        if not self.auto or items < 1:
            return
        # an even mean with the past: one slow iteration (a cold cache) does not swing it
        self.gen_s = gen_s if self.gen_s is None else (self.gen_s + gen_s) / 2
        self.check_s = check_s if self.check_s is None else (self.check_s + check_s) / 2
        new = depth_for(self.check_s, self.gen_s, capacity, items)
        if new != self.depth:
            ratio = self.check_s / self.gen_s if self.gen_s > 0 else float("inf")
            log.info(
                "ES pipeline depth %d -> %d: checking %.3gs / generation %.3gs per member "
                "(ratio %.2f, measured), capacity %s",
                self.depth,
                new,
                self.check_s,
                self.gen_s,
                ratio,
                "unbounded" if capacity is None else capacity,
            )
        self.depth = new


class Engine(Protocol):
    """Weights that can be set to any member's, and a policy generating with them."""

    policy: Policy

    def perturb(self, seed: int, scale: float) -> None:
        """Write ``θ + scale·ε(seed)`` (exactly, from the fp32 master)."""

    def restore(self) -> None:
        """Write ``θ`` back (exactly)."""


class TorchEngine:
    """A transformers model in this process (:class:`~leanrl.train.es.weights.ESWeights`).

    With a ``population`` (low-rank runs, ``scorer.members_per_batch > 1``) it also decodes
    several members in one call without writing their weights (:meth:`generate_members`)."""

    def __init__(
        self, weights: ESWeights, policy: Policy, population: LowRankPopulation | None = None
    ) -> None:
        self.weights = weights
        self.policy = policy
        self.population = population
        self._lock = threading.Lock()

    def generate_members(
        self,
        requests: Sequence[tuple[tuple[int, float], Sequence[Prompt]]],
        sampling: SamplingConfig,
    ) -> list[list[list[Completion]]]:
        """Blocking: one batched generate for ((seed, scale), prompts) requests (weights = θ)."""
        from leanrl.train.es.population import generate_members

        assert self.population is not None
        with self._lock:
            return generate_members(self.policy, self.population, requests, sampling)

    def call_member(self, seed: int, scale: float, fn: Any, *args: Any, **kw: Any) -> Any:
        """Run a blocking forward-based call (``continuation_logprob``...) as member (seed,
        scale): every row of every forward inside gets that member's low-rank term."""
        assert self.population is not None
        # the hooks are the modules' own: one population call at a time, whichever thread
        with self._lock, self.population.active([(seed, scale)]):
            return fn(*args, **kw)

    def forget(self, seed: int) -> None:
        if self.population is not None:
            self.population.forget(seed)

    def perturb(self, seed: int, scale: float) -> None:
        self.weights.perturb(seed, scale)

    def restore(self) -> None:
        self.weights.restore()


class VLLMEngine:
    """A vLLM engine whose workers perturb their weights in place (the ES worker extension)."""

    def __init__(self, llm: Any, policy: Policy) -> None:
        self.llm = llm
        self.policy = policy

    def perturb(self, seed: int, scale: float) -> None:
        self.llm.collective_rpc("es_perturb", args=(seed, scale))
        self.llm.reset_prefix_cache()  # no KV block computed under other weights is reused

    def restore(self) -> None:
        self.llm.collective_rpc("es_restore")
        self.llm.reset_prefix_cache()


class EngineGate:
    """Takes turns on one engine: one member's weights and one generate call at a time."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.lock = asyncio.Lock()
        self.loaded: tuple[int, float] | None = None
        """(seed, scale) written into the engine now; None: the unperturbed θ."""
        self.busy_s = 0.0
        """Seconds the engine spent perturbing or generating."""
        self.perturb_s: dict[tuple[int, float], float] = {}
        """Seconds spent writing each member's weights (and restoring at the end)."""
        self.turn_s: dict[tuple[int, float], float] = {}
        """Engine seconds of each member's generate calls (its weights written included)."""

    def _load(self, seed: int, scale: float) -> None:
        if self.loaded == (seed, scale):
            return
        t0 = time.perf_counter()
        self.engine.perturb(seed, scale)
        self.loaded = (seed, scale)
        dt = time.perf_counter() - t0
        self.perturb_s[(seed, scale)] = self.perturb_s.get((seed, scale), 0.0) + dt

    async def generate(
        self, seed: int, scale: float, prompts: Sequence[Prompt], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        async with self.lock:
            t0 = time.perf_counter()
            try:
                self._load(seed, scale)
                return await self.engine.policy.generate(prompts, sampling)
            finally:
                dt = time.perf_counter() - t0
                self.busy_s += dt
                self.turn_s[(seed, scale)] = self.turn_s.get((seed, scale), 0.0) + dt

    async def stream(
        self, seed: int, scale: float, requests: Sequence[StreamRequest]
    ) -> AsyncIterator[StreamCompletion]:
        """The engine policy's stream of ``requests`` with this member's weights: the gate is
        held from the first request to the last completion, so the weights cannot change under
        it, while the caller checks each completion as it arrives."""
        async with self.lock:
            t0 = time.perf_counter()
            try:
                self._load(seed, scale)
                async with closing_stream(self.engine.policy.stream(requests)) as items:
                    async for item in items:
                        yield item
            finally:
                dt = time.perf_counter() - t0
                self.busy_s += dt
                self.turn_s[(seed, scale)] = self.turn_s.get((seed, scale), 0.0) + dt

    def call_now(self, seed: int, scale: float, fn: Any, *args: Any, **kw: Any) -> Any:
        """Run a blocking weight-dependent call (``continuation_logprob``...) for a member, now.

        Only possible while no generate call is in flight (it runs in a worker thread with
        another member's weights): then nothing else can touch the weights until this returns.
        """
        if self.lock.locked():
            raise PolicyError(
                f"{getattr(fn, '__name__', fn)} needs the member's weights while another member "
                "is generating: this harness calls the policy outside generate() after an await. "
                "Score members one after another (scorer.pipeline = 1)"
            )
        t0 = time.perf_counter()
        try:
            self._load(seed, scale)
            return fn(*args, **kw)
        finally:
            self.busy_s += time.perf_counter() - t0

    def restore(self) -> None:
        if self.loaded is not None:
            t0 = time.perf_counter()
            self.engine.restore()
            self.busy_s += time.perf_counter() - t0
            self.loaded = None


@dataclass
class _Request:
    key: tuple[int, float]  # (seed, scale) of the member
    prompts: Sequence[Prompt]
    sampling: SamplingConfig
    done: asyncio.Future[list[list[Completion]]]


class BatchGate:
    """Takes turns on one engine that decodes several members per call (low-rank ES).

    Members ask as with :class:`EngineGate`; their requests wait in a FIFO queue and each engine
    call takes up to ``members_per_batch`` members' requests (same decoding settings). A call
    waits for the members admitted but not yet heard from, unless enough members are already
    queued: members are admitted a whole batch at a time (:meth:`admit`), so the members of one
    batch meet in one call, whatever the timing of their harnesses.
    """

    def __init__(self, engine: Any, members_per_batch: int) -> None:
        self.engine = engine
        self.members_per_batch = members_per_batch
        self.pending: list[_Request] = []
        self.fresh: set[tuple[int, float]] = set()
        """Admitted members that have not asked for a generate yet (their first is coming)."""
        self.running = False
        self.busy_s = 0.0
        self.perturb_s: dict[tuple[int, float], float] = {}
        """Seconds drawing factors, split evenly among the members of each call."""
        self.calls: list[list[tuple[int, float]]] = []
        """The members of each engine call, in order (for tests and logs)."""
        self._wake = asyncio.Event()

    def admit(self, keys: Sequence[tuple[int, float]]) -> None:
        self.fresh.update(keys)
        self._wake.set()

    def finish(self, key: tuple[int, float]) -> None:
        """Member ``key`` is done: it will ask for nothing more."""
        self.fresh.discard(key)
        self._wake.set()

    async def generate(
        self, seed: int, scale: float, prompts: Sequence[Prompt], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        req = _Request((seed, scale), prompts, sampling, asyncio.get_running_loop().create_future())
        self.fresh.discard(req.key)
        self.pending.append(req)
        self._wake.set()
        return await req.done

    def _take(self) -> list[_Request] | None:
        if not self.pending:
            return None
        keys = {r.key for r in self.pending}
        if len(keys) < self.members_per_batch and self.fresh:
            return None  # the rest of the batch is on its way
        first = self.pending[0].sampling
        batch: list[_Request] = []
        chosen: set[tuple[int, float]] = set()
        for r in self.pending:
            if r.sampling != first:
                continue
            if r.key not in chosen and len(chosen) == self.members_per_batch:
                continue
            chosen.add(r.key)
            batch.append(r)
        self.pending = [r for r in self.pending if r not in batch]
        return batch

    async def run(self) -> None:
        """The dispatcher: one engine call at a time, until cancelled."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while (batch := self._take()) is not None:
                await self._call(batch)

    async def _call(self, batch: list[_Request]) -> None:
        keys = list(dict.fromkeys(r.key for r in batch))
        self.calls.append(keys)
        pop = getattr(self.engine, "population", None)
        f0 = pop.factor_s if pop is not None else 0.0
        t0 = time.perf_counter()
        self.running = True
        try:
            outs = await asyncio.to_thread(
                self.engine.generate_members, [(r.key, r.prompts) for r in batch], batch[0].sampling
            )
        except Exception as e:  # noqa: BLE001 - each member of the call gets it (its harness raises)
            for r in batch:
                if not r.done.done():
                    r.done.set_exception(e)
            return
        except BaseException:
            for r in batch:
                r.done.cancel()
            raise
        finally:
            self.running = False
            self.busy_s += time.perf_counter() - t0
            share = ((pop.factor_s if pop is not None else 0.0) - f0) / len(keys)
            for k in keys:
                self.perturb_s[k] = self.perturb_s.get(k, 0.0) + share
        for r, out in zip(batch, outs, strict=True):
            if not r.done.done():
                r.done.set_result(out)
        # Let the members just answered run up to their next await before the next call starts:
        # a harness that reads the weights right after generate (``continuation_logprob``) then
        # does so while the engine is free (else :meth:`call_now` waits for the call to end).
        # A few turns of the loop: a member's wake-up may pass through wrapping tasks.
        for _ in range(8):
            await asyncio.sleep(0)

    def call_now(self, seed: int, scale: float, fn: Any, *args: Any, **kw: Any) -> Any:
        """A blocking weight-dependent call for a member, now. The weights are never written
        in batched mode, so this is possible at any time; should a batched call be in flight in
        its worker thread, the engine's lock makes this wait for it (the event loop with it)."""
        t0 = time.perf_counter()
        try:
            return self.engine.call_member(seed, scale, fn, *args, **kw)
        finally:
            self.busy_s += time.perf_counter() - t0

    def restore(self) -> None:
        """Nothing to restore: batched decoding never writes the weights."""


class MemberPolicy(Policy):
    """One member's view of a shared engine: generation takes the gate with this member's
    weights; other calls (``tokenize``, ``render``...) go to the engine's policy."""

    def __init__(self, gate: EngineGate | BatchGate, member: Member, sigma: float) -> None:
        inner = gate.engine.policy
        super().__init__(inner.config)
        self.name = inner.name  # type: ignore[misc]
        self.gate = gate
        self.seed = member.seed
        self.scale = member.sign * sigma
        self.generate_s = 0.0
        """Seconds this member spent in ``generate`` (waiting for the gate included): its wall
        time less this is the time its attempts spent being checked."""

    async def generate(
        self, prompts: Sequence[Prompt], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        t0 = time.perf_counter()
        try:
            return await self.gate.generate(self.seed, self.scale, prompts, sampling)
        finally:
            self.generate_s += time.perf_counter() - t0

    def stream_replays(self, sampling: SamplingConfig) -> bool:
        """Streams (each attempt checked while the member's other sequences still decode)
        where the engine's policy has a stream of its own that replays its ``generate`` (the
        vLLM engine); never through a batched population gate."""
        return isinstance(self.gate, EngineGate) and stream_replays_generate(
            self.gate.engine.policy, sampling, native=True
        )

    async def stream(self, requests: Sequence[StreamRequest]) -> AsyncIterator[StreamCompletion]:
        if not isinstance(self.gate, EngineGate):
            raise PolicyError("a batched population gate has no stream; use generate()")
        t0 = time.perf_counter()
        try:
            async with closing_stream(self.gate.stream(self.seed, self.scale, requests)) as items:
                async for item in items:
                    yield item
        finally:
            self.generate_s += time.perf_counter() - t0

    def tokenize(self, text: str) -> list[int]:
        return self.gate.engine.policy.tokenize(text)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.gate.engine.policy, name)
        if name.startswith("_") or not callable(attr) or name in _WEIGHT_FREE:
            return attr
        gate, seed, scale = self.gate, self.seed, self.scale

        def with_weights(*args: Any, **kw: Any) -> Any:
            return gate.call_now(seed, scale, attr, *args, **kw)

        return with_weights


#: Policy methods that do not read the weights (no need to load the member's).
_WEIGHT_FREE = frozenset({"render", "tokenize", "start", "close"})


class PipelinedScorer:
    """Scores members on one engine with up to ``depth`` members in flight (see the module
    docstring). ``last_idle_frac`` is the engine's idle fraction of the last ``score`` call,
    ``last_depth`` the depth it ran at."""

    def __init__(
        self,
        env: Environment,
        engine: Engine,
        depth: int | Literal["auto"] | PipelineDepth = 2,
        members_per_batch: int = 1,
        batched: bool = False,
    ) -> None:
        self.control = depth if isinstance(depth, PipelineDepth) else PipelineDepth(depth)
        if members_per_batch < 1:
            raise ValueError("members_per_batch must be at least 1")
        if (members_per_batch > 1 or batched) and not hasattr(engine, "generate_members"):
            raise ConfigError(
                f"scorer.members_per_batch = {members_per_batch} needs an engine that decodes "
                f"several members per call; {type(engine).__name__} does not"
            )
        self.env = env
        self.engine = engine
        self.members_per_batch = members_per_batch
        self.batched = batched or members_per_batch > 1
        """Members go through ``engine.generate_members`` (even one per call: an engine whose
        weights are never written, such as the LoRA one), not perturb/generate/restore."""
        self.last_idle_frac: float | None = None
        self.last_depth: int | None = None
        self.last_calls: list[list[tuple[int, float]]] = []
        """Batched mode: the members of each engine call of the last ``score``."""
        self.check_s: list[float] = []
        """Checking seconds of each member of the last ``score`` (wall less generation)."""

    @property
    def depth(self) -> int:
        """Items (members, or batches of ``members_per_batch``) in flight in the next ``score``."""
        return self.control.depth

    def _measured(self, busy_s: float, items: int, state: IterationState) -> None:
        """Pass the iteration's per-item generation and checking seconds to the depth."""
        if not self.control.auto or not self.check_s:
            return
        per_item = max(1, -(-len(self.check_s) // items)) * len(state.tasks) * state.sampling.n
        capacity = check_capacity(self.env.runtime, per_item)
        check = sum(self.check_s) / len(self.check_s)
        self.control.observe(busy_s / items, check, items, capacity)

    async def start(self) -> None:
        await self.engine.policy.start()

    async def score(self, state: IterationState, members: Sequence[Member]) -> list[MemberScore]:
        if self.batched:
            return await self._score_batched(state, members)
        gate = EngineGate(self.engine)
        self.last_depth = depth = self.depth
        slots = asyncio.Semaphore(depth)
        self.check_s = []
        t0 = time.perf_counter()

        async def one(m: Member) -> MemberScore:
            async with slots:
                policy = MemberPolicy(gate, m, state.sigma)
                m0 = time.perf_counter()
                res = await score_rollouts(self.env, policy, state.tasks, state.sampling)
                self.check_s.append(max(0.0, time.perf_counter() - m0 - policy.generate_s))
                res.perturb_s = gate.perturb_s.get((m.seed, m.sign * state.sigma), 0.0)
                return res

        # Tasks are created in member order and the semaphore and the gate's lock are FIFO,
        # so members generate in order: member i+1 right after member i, during i's checks.
        jobs = [asyncio.ensure_future(one(m)) for m in members]
        try:
            scores = list(await asyncio.gather(*jobs))
        except BaseException:
            for j in jobs:
                j.cancel()
            await asyncio.gather(*jobs, return_exceptions=True)
            raise
        finally:
            gate.restore()  # θ back in the engine before the update (or an error) goes on
        wall = time.perf_counter() - t0
        self.last_idle_frac = max(0.0, 1.0 - gate.busy_s / wall) if wall > 0 else 0.0
        self._measured(gate.busy_s, len(members), state)
        return scores

    async def _score_batched(
        self, state: IterationState, members: Sequence[Member]
    ) -> list[MemberScore]:
        """Members in batches of ``members_per_batch`` per engine call, ``depth`` batches in
        flight: batch b+1 decodes while batch b's attempts are checked."""
        size = self.members_per_batch
        gate = BatchGate(self.engine, size)
        keys = [(m.seed, m.sign * state.sigma) for m in members]
        chunks = [list(range(i, min(i + size, len(members)))) for i in range(0, len(keys), size)]
        admitted = [asyncio.Event() for _ in members]
        left = [len(c) for c in chunks]  # members of each chunk still scoring
        seed_left: dict[int, int] = {}
        for m in members:
            seed_left[m.seed] = seed_left.get(m.seed, 0) + 1
        nxt = 0

        def admit_chunk() -> None:
            # whole chunks at a time: admitting members one by one as others finish would let
            # the dispatcher run a call for the first of them alone
            nonlocal nxt
            if nxt < len(chunks):
                gate.admit([keys[i] for i in chunks[nxt]])
                for i in chunks[nxt]:
                    admitted[i].set()
                nxt += 1

        self.last_depth = depth = self.depth
        for _ in range(depth):
            admit_chunk()
        self.check_s = []
        t0 = time.perf_counter()

        async def one(i: int) -> MemberScore:
            m = members[i]
            await admitted[i].wait()
            try:
                policy = MemberPolicy(gate, m, state.sigma)
                m0 = time.perf_counter()
                res = await score_rollouts(self.env, policy, state.tasks, state.sampling)
                self.check_s.append(max(0.0, time.perf_counter() - m0 - policy.generate_s))
                res.perturb_s = gate.perturb_s.get(keys[i], 0.0)
                return res
            finally:
                gate.finish(keys[i])
                seed_left[m.seed] -= 1
                if seed_left[m.seed] == 0:  # its mirrored twin is done too
                    forget = getattr(self.engine, "forget", None)
                    if forget is not None:
                        forget(m.seed)
                c = i // size
                left[c] -= 1
                if left[c] == 0:
                    admit_chunk()

        dispatcher = asyncio.ensure_future(gate.run())
        jobs = [asyncio.ensure_future(one(i)) for i in range(len(members))]
        try:
            scores = list(await asyncio.gather(*jobs))
        except BaseException:
            for j in jobs:
                j.cancel()
            await asyncio.gather(*jobs, return_exceptions=True)
            raise
        finally:
            dispatcher.cancel()
            await asyncio.gather(dispatcher, return_exceptions=True)
        wall = time.perf_counter() - t0
        self.last_idle_frac = max(0.0, 1.0 - gate.busy_s / wall) if wall > 0 else 0.0
        self.last_calls = gate.calls
        self._measured(gate.busy_s, len(chunks), state)
        return scores

    async def close(self) -> None:
        return None


def inprocess_scorer(
    env: Environment, weights: ESWeights, policy: Policy, config: ESConfig
) -> PipelinedScorer:
    """The ``inprocess`` scorer for ``config``: members one per call, or, for a low-rank run
    with ``scorer.members_per_batch > 1``, several per batched call (``population``)."""
    sc = config.scorer
    if sc.members_per_batch == 1:
        return PipelinedScorer(env, TorchEngine(weights, policy), sc.pipeline)
    if config.perturbation != "lowrank":
        raise ConfigError(
            f"scorer.members_per_batch = {sc.members_per_batch} needs perturbation = 'lowrank' "
            "(full-rank members cannot share a forward pass): set perturbation = 'lowrank', or "
            "scorer.members_per_batch = 1"
        )
    from leanrl.train.es.population import LowRankPopulation

    model = getattr(policy, "model", None)
    if model is None:
        raise ConfigError("scorer.members_per_batch > 1 needs the in-process torch policy")
    names = getattr(weights, "lowrank_names", None)
    targets = names() if callable(names) and config.lowrank_targets == "linear" else None
    pop = LowRankPopulation(model, weights.params, config.rank, config.lowrank_other, targets)
    return PipelinedScorer(
        env, TorchEngine(weights, policy, pop), sc.pipeline, members_per_batch=sc.members_per_batch
    )


class PipelinedVLLMScorer(VLLMScorer):
    """The vLLM scorer with members pipelined on its engine (``scorer.pipeline`` in flight)."""

    def __init__(self, *args: Any, depth: int | Literal["auto"] = 2, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.control = PipelineDepth(depth)
        """Lives for the run: the inner scorer is rebuilt each iteration, the measurement not."""
        self.last_idle_frac: float | None = None
        self.last_depth: int | None = None

    async def score(self, state: IterationState, members: Sequence[Member]) -> list[MemberScore]:
        from leanrl.train.es.workers import _EnginePolicy

        self.sync(state.records)
        engine = VLLMEngine(self.llm, _EnginePolicy(self.llm, self.policy_config))
        inner = PipelinedScorer(self.env, engine, self.control)
        scores = await inner.score(state, members)
        self.last_idle_frac, self.last_depth = inner.last_idle_frac, inner.last_depth
        return scores
