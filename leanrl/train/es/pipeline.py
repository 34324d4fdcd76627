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
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from leanrl.errors import PolicyError
from leanrl.policy import Completion, Policy, Prompt, SamplingConfig
from leanrl.train.es.workers import (
    IterationState,
    Member,
    MemberScore,
    VLLMScorer,
    score_rollouts,
)

if TYPE_CHECKING:
    from leanrl.environment import Environment
    from leanrl.train.es.weights import ESWeights

__all__ = [
    "Engine",
    "EngineGate",
    "MemberPolicy",
    "PipelinedScorer",
    "PipelinedVLLMScorer",
    "TorchEngine",
    "VLLMEngine",
]


class Engine(Protocol):
    """Weights that can be set to any member's, and a policy generating with them."""

    policy: Policy

    def perturb(self, seed: int, scale: float) -> None:
        """Write ``θ + scale·ε(seed)`` (exactly, from the fp32 master)."""

    def restore(self) -> None:
        """Write ``θ`` back (exactly)."""


class TorchEngine:
    """A transformers model in this process (:class:`~leanrl.train.es.weights.ESWeights`)."""

    def __init__(self, weights: ESWeights, policy: Policy) -> None:
        self.weights = weights
        self.policy = policy

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
                self.busy_s += time.perf_counter() - t0

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


class MemberPolicy(Policy):
    """One member's view of a shared engine: generation takes the gate with this member's
    weights; other calls (``tokenize``, ``render``...) go to the engine's policy."""

    def __init__(self, gate: EngineGate, member: Member, sigma: float) -> None:
        inner = gate.engine.policy
        super().__init__(inner.config)
        self.name = inner.name  # type: ignore[misc]
        self.gate = gate
        self.seed = member.seed
        self.scale = member.sign * sigma

    async def generate(
        self, prompts: Sequence[Prompt], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        return await self.gate.generate(self.seed, self.scale, prompts, sampling)

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
    docstring). ``last_idle_frac`` is the engine's idle fraction of the last ``score`` call."""

    def __init__(self, env: Environment, engine: Engine, depth: int = 2) -> None:
        if depth < 1:
            raise ValueError("depth must be at least 1")
        self.env = env
        self.engine = engine
        self.depth = depth
        self.last_idle_frac: float | None = None

    async def start(self) -> None:
        await self.engine.policy.start()

    async def score(self, state: IterationState, members: Sequence[Member]) -> list[MemberScore]:
        gate = EngineGate(self.engine)
        slots = asyncio.Semaphore(self.depth)
        t0 = time.perf_counter()

        async def one(m: Member) -> MemberScore:
            async with slots:
                policy = MemberPolicy(gate, m, state.sigma)
                res = await score_rollouts(self.env, policy, state.tasks, state.sampling)
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
        return scores

    async def close(self) -> None:
        return None


class PipelinedVLLMScorer(VLLMScorer):
    """The vLLM scorer with members pipelined on its engine (``scorer.pipeline`` in flight)."""

    def __init__(self, *args: Any, depth: int = 2, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.depth = depth
        self.last_idle_frac: float | None = None

    async def score(self, state: IterationState, members: Sequence[Member]) -> list[MemberScore]:
        from leanrl.train.es.workers import _EnginePolicy

        self.sync(state.records)
        engine = VLLMEngine(self.llm, _EnginePolicy(self.llm, self.policy_config))
        inner = PipelinedScorer(self.env, engine, self.depth)
        scores = await inner.score(state, members)
        self.last_idle_frac = inner.last_idle_frac
        return scores
