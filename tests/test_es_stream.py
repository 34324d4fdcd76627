"""ES members stream where the engine's policy has a stream that replays its generate (the
vLLM engine): each attempt is checked while the member's other sequences still decode, the
member's weights stay in the engine for the whole stream, and rewards equal the batched ones."""

from __future__ import annotations

import asyncio
import sys
import types
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from leanrl.environment import Environment
from leanrl.policy import (
    PolicyConfig,
    Prompt,
    SamplingConfig,
    StreamCompletion,
    StreamRequest,
)
from leanrl.runtime import run_sync
from leanrl.train.es.pipeline import EngineGate, MemberPolicy, PipelinedScorer
from leanrl.train.es.workers import IterationState, Member, _EnginePolicy
from tests._scripted_runtime import ScriptedPolicy
from tests.test_stream_rollouts import env_of

MEMBERS = [Member(11, 1), Member(11, -1), Member(24, 1), Member(24, -1)]


class _Engine:
    """Weights that can be switched (a key), and a streaming policy whose text reads them."""

    def __init__(self, replays: bool, env: Environment | None = None) -> None:
        self.current: tuple[int, float] = (0, 0.0)
        self.policy = _StreamingPolicy(self, replays, env)

    def perturb(self, seed: int, scale: float) -> None:
        self.current = (seed, scale)

    def restore(self) -> None:
        self.current = (0, 0.0)


class _StreamingPolicy(ScriptedPolicy):
    """Odd seeds write ``omega`` (accepted by the scripted runtime), even ones ``simp``. Its
    stream holds back each request's last completion until the runtime has checked one of this
    stream's attempts (a slow sequence still decoding), when given ``env``."""

    def __init__(self, engine: _Engine, replays: bool, env: Environment | None) -> None:
        super().__init__([], pick=lambda _p, _i: self._text())
        self.engine, self.replays, self.env, self.streams = engine, replays, env, 0

    def _text(self) -> str:
        return "\n  omega\n" if self.engine.current[0] % 2 else "\n  simp\n"

    def stream_replays(self, sampling: SamplingConfig) -> bool:
        return self.replays

    async def generate(self, prompts: Sequence[Prompt], sampling: SamplingConfig) -> Any:
        return await super().generate(prompts, sampling)  # its own generate: a real backend

    async def stream(self, requests: Sequence[StreamRequest]) -> AsyncIterator[StreamCompletion]:
        self.streams += 1
        weights = self.engine.current
        rt: Any = self.env.runtime if self.env is not None else None
        before = len(rt.attempts) if rt is not None else 0
        got = await self.generate([r.prompt or "" for r in requests], requests[0].sampling)
        items = [
            StreamCompletion(r.key, s, c, 0.01)
            for r, comps in zip(requests, got, strict=True)
            for s, c in enumerate(comps)
        ]
        for sc in items[:-1]:
            yield sc
        while rt is not None and len(rt.attempts) == before:  # checked on arrival, or stuck
            await asyncio.sleep(0.01)
        assert self.engine.current == weights  # nobody switched the weights mid-stream
        yield items[-1]


async def _score(env: Environment, engine: _Engine, depth: int) -> list[float]:
    state = IterationState(1, tuple(env.tasks()), SamplingConfig(n=2, temperature=0.0), 0.5, ())
    scores = await asyncio.wait_for(PipelinedScorer(env, engine, depth).score(state, MEMBERS), 60)
    return [s.reward for s in scores]


def test_a_member_streams_and_its_attempts_are_checked_on_arrival(bench_data: Path) -> None:
    async def run() -> tuple[list[float], int]:
        async with env_of(bench_data) as env:
            engine = _Engine(replays=True, env=env)
            state = IterationState(1, tuple(env.tasks()), SamplingConfig(n=2), 0.5, ())
            scorer = PipelinedScorer(env, engine, 1)
            got = await asyncio.wait_for(scorer.score(state, MEMBERS), 60)
            return [s.reward for s in got], engine.policy.streams

    rewards, streams = run_sync(run())
    assert streams == len(MEMBERS)  # one stream per member
    assert rewards == [1.0, 1.0, 0.0, 0.0]  # each member's own weights wrote its proofs


def test_streamed_members_score_as_batched_ones(bench_data: Path) -> None:
    async def both() -> tuple[list[float], list[float]]:
        async with env_of(bench_data) as env:
            streamed = await _score(env, _Engine(True), 2)
        async with env_of(bench_data) as env:
            engine = _Engine(False)
            batched = await _score(env, engine, 2)
            assert engine.policy.streams == 0
        return streamed, batched

    streamed, batched = run_sync(both())
    assert streamed == batched == [1.0, 1.0, 0.0, 0.0]


def test_a_population_gate_never_streams() -> None:
    from leanrl.train.es.pipeline import BatchGate

    engine = _Engine(True)
    assert MemberPolicy(EngineGate(engine), Member(3, 1), 0.1).stream_replays(SamplingConfig())
    batch = BatchGate(engine, 2)
    assert not MemberPolicy(batch, Member(3, 1), 0.1).stream_replays(SamplingConfig())


async def test_the_vllm_engine_policy_streams_finished_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The glue only (vLLM's engine replaced by a stand-in finishing one request per step,
    last first); real vLLM is the GPU check."""

    from tests._vllm_engine_standin import Engine, Params

    llm = types.SimpleNamespace(
        llm_engine=Engine(step_s=0.02, show_top_p=True), get_tokenizer=lambda: None
    )
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(SamplingParams=Params))
    p = _EnginePolicy(llm, PolicyConfig(model="m"))
    assert p.stream_replays(SamplingConfig(temperature=1.0))  # each request keeps its seed
    s = SamplingConfig(n=2, seed=9, temperature=0.0, top_p=0.5)
    reqs = [StreamRequest(key=i, prompt=f"p{i}", sampling=s) for i in range(3)]
    got = [(sc.key, sc.sample, sc.completion.text) async for sc in p.stream(reqs)]
    assert [(k, i) for k, i, _ in got] == [(2, 0), (2, 1), (1, 0), (1, 1), (0, 0), (0, 1)]
    assert got[0][2] == "p2/0/9/1.0"  # the engine's own params: greedy ignores top-p
    agen = p.stream(reqs)
    await agen.__anext__()
    await agen.aclose()  # a consumer that stops early aborts what the engine still holds
    assert llm.llm_engine.aborted
