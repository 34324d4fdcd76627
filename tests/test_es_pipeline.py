"""Pipelined member scoring: each member generates with its own weights whatever the order,
generation of member i+1 overlaps member i's checks, rewards equal the serial scorer's, the
weights are restored exactly, and the trainer logs the GPU-idle fraction."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from leanrl.environment import Environment
from leanrl.errors import PolicyError
from leanrl.harness import Harness
from leanrl.policy import Completion, Policy, PolicyConfig, Prompt, SamplingConfig
from leanrl.rollout import Rollout, Turn
from leanrl.runtime import Runtime, run_sync
from leanrl.task import Task
from leanrl.taskset import Taskset
from leanrl.train.es.pipeline import EngineGate, MemberPolicy, PipelinedScorer
from leanrl.train.es.workers import IterationState, Member
from leanrl.verdict import Attempt, Reason, Verdict

EVENTS: list[tuple[str, str, float]] = []


class FakePolicy(Policy):
    """Generates ``"<seed>:<scale>"`` of the weights loaded in its engine (after a pause)."""

    name = "fake"

    def __init__(self, engine: FakeEngine, gen_s: float) -> None:
        super().__init__(PolicyConfig(model="fake"))
        self.engine = engine
        self.gen_s = gen_s

    async def generate(
        self, prompts: Sequence[Prompt], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        key = self.peek()
        EVENTS.append(("gen-start", key, asyncio.get_running_loop().time()))
        await asyncio.sleep(self.gen_s)
        assert self.peek() == key  # nobody switched the weights mid-generation
        text = key
        EVENTS.append(("gen-end", key, asyncio.get_running_loop().time()))
        return [[Completion(text=text) for _ in range(sampling.n)] for _ in prompts]

    def peek(self) -> str:
        return f"{self.engine.current[0]}:{self.engine.current[1]}"


class FakeEngine:
    def __init__(self, gen_s: float) -> None:
        self.current: tuple[int, float] = (0, 0.0)
        self.policy = FakePolicy(self, gen_s)
        self.perturbs = 0

    def perturb(self, seed: int, scale: float) -> None:
        self.current = (seed, scale)
        self.perturbs += 1

    def restore(self) -> None:
        self.current = (0, 0.0)


class SlowChecker(Runtime):
    name = "slow-check"

    async def check(self, attempts: Sequence[Attempt]) -> list[Verdict]:
        key = attempts[0].proof
        EVENTS.append(("check-start", key, asyncio.get_running_loop().time()))
        await asyncio.sleep(float(self.config.options.get("check_s", 0.05)))
        EVENTS.append(("check-end", key, asyncio.get_running_loop().time()))
        return [Verdict(accepted=True, reason=Reason.OK, id=a.id) for a in attempts]


class EchoHarness(Harness):
    """Reward = the member's scale (so each member's reward shows whose weights generated)."""

    name = "echo"

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
            Attempt(name=t.name, header="", formal_statement=t.formal_statement, proof=c[0].text)
            for t, c in zip(tasks, comps, strict=True)
        ]
        verdicts = await runtime.check(atts)
        out = []
        for t, c, v in zip(tasks, comps, verdicts, strict=True):
            seed, scale = c[0].text.split(":")
            out.append(
                [
                    Rollout(
                        task_id=t.id,
                        prompt=t.formal_statement,
                        turns=[Turn.from_completion(c[0])],
                        verdict=v,
                        reward=float(scale) + int(seed) % 7,
                    )
                ]
            )
        return out


class EchoEnv(Environment):
    def make_harness(self) -> Harness:
        return EchoHarness(self.config.harness)

    def make_runtime(self) -> Runtime:
        return SlowChecker(self.config.runtime)


def _state(n_tasks: int = 2) -> IterationState:
    tasks = tuple(
        Task(name=f"t{i}", header="", formal_statement=f"theorem t{i} : True := by")
        for i in range(n_tasks)
    )
    return IterationState(1, tasks, SamplingConfig(temperature=0.0), 0.5, ())


MEMBERS = [Member(11, 1), Member(11, -1), Member(23, 1), Member(23, -1), Member(37, 1)]


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_each_member_generates_with_its_own_weights(depth: int) -> None:
    EVENTS.clear()
    engine = FakeEngine(gen_s=0.01)
    scorer = PipelinedScorer(EchoEnv(), engine, depth)
    scores = run_sync(scorer.score(_state(), MEMBERS))
    want = [m.sign * 0.5 + m.seed % 7 for m in MEMBERS]
    assert [s.reward for s in scores] == want  # in member order, each from its own weights
    assert engine.current == (0, 0.0)  # restored at the end
    assert scorer.last_idle_frac is not None and 0.0 <= scorer.last_idle_frac <= 1.0


def test_member_i_plus_1_generates_while_member_i_is_checked() -> None:
    EVENTS.clear()
    env = EchoEnv()
    env.config.runtime.options["check_s"] = 0.05
    run_sync(PipelinedScorer(env, FakeEngine(gen_s=0.02), depth=2).score(_state(), MEMBERS))
    at = {(kind, key): t for kind, key, t in EVENTS}
    keys = [f"{m.seed}:{m.sign * 0.5}" for m in MEMBERS]
    for a, b in itertools.pairwise(keys):
        assert at[("gen-start", b)] < at[("check-end", a)]
    # serial (depth 1): no generation starts before the previous member's check has ended
    EVENTS.clear()
    run_sync(PipelinedScorer(env, FakeEngine(gen_s=0.02), depth=1).score(_state(), MEMBERS))
    seq = [(k, s) for k, s, _ in EVENTS if k in ("gen-start", "check-end")]
    assert seq == [x for k in keys for x in (("gen-start", k), ("check-end", k))]


def test_weight_dependent_calls_outside_generate() -> None:
    engine = FakeEngine(gen_s=0.0)
    gate = EngineGate(engine)
    p = MemberPolicy(gate, Member(5, -1), 0.25)
    assert p.peek() == "5:-0.25"  # a sync call loads the member's weights first
    assert p.tokenize  # weight-free attributes pass through

    async def while_generating() -> None:
        async with gate.lock:
            with pytest.raises(PolicyError, match="pipeline = 1"):
                p.peek()

    run_sync(while_generating())


def test_trainer_pipelined_matches_serial_and_logs_idle(
    toy_model_dir: Path, tmp_path: Path
) -> None:
    from test_es_learning import toy_config

    from leanrl.train.es import ESTrainer

    rows: dict[int, list[dict[str, Any]]] = {}
    for depth in (1, 3):
        cfg = toy_config(
            toy_model_dir, tmp_path / f"d{depth}", steps=2, population=4, scorer={"pipeline": depth}
        )
        tr = ESTrainer(cfg)
        rows[depth] = tr.train_sync()
    for a, b in zip(rows[1], rows[3], strict=True):
        assert a["reward_mean"] == b["reward_mean"] and a["update_norm"] == b["update_norm"]
        assert 0.0 <= b["gpu_idle_frac"] <= 1.0
