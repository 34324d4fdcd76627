"""GRPO failure replay (issue 25): a share of each step's groups revises the run's own failures.

What is checked: the buffer keeps only verified-wrong, finished, one-turn failures; the draw is
a function of (seed, step, buffer) and the buffer round-trips through the run folder; the
revision prompt is exactly the self-correction harness's own context before its first revision;
revisions are checked by the runtime and rewarded by the taskset in groups of their own; the
replay fraction is honoured in a real (tiny) GRPO run, and a resumed run builds the same batch.
The runtimes here are TEST runtimes (not Lean).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from leanrl import Environment, HarnessConfig, Runtime, Taskset
from leanrl.environment import EnvironmentConfig
from leanrl.errors import ConfigError
from leanrl.harnesses.self_correction import SelfCorrectionHarness
from leanrl.policy import Completion, Policy, SamplingConfig
from leanrl.rollout import ChatMessage, Rollout, Turn
from leanrl.task import Task
from leanrl.taskset import RawRow
from leanrl.train.grpo.replay import (
    FailureBuffer,
    ReplayConfig,
    Replayer,
    cap_tokens,
    check_replay,
    is_replay,
    qualifies,
    replay_metrics,
    replay_rollouts,
)
from leanrl.verdict import Message, Position, Reason, Verdict
from tests._scripted_runtime import ScriptedPolicy
from tests.test_harness_self_correction import TASK, ErrorRuntime

WRONG = Verdict.reject(Reason.ERROR, "unsolved goals")


def _r(
    verdict: Verdict | None,
    *,
    sample: int = 0,
    finish: str = "stop",
    turns: int = 1,
    meta: dict[str, Any] | None = None,
    task_id: str = TASK.id,
) -> Rollout:
    return Rollout(
        task_id=task_id,
        sample=sample,
        prompt="P",
        turns=[Turn(completion=f"  simp{i}", finish_reason=finish) for i in range(turns)],
        proof="  simp",
        verdict=verdict,
        meta=meta or {},
    )


# -- the buffer ---------------------------------------------------------------------------------


def test_only_verified_wrong_finished_one_turn_failures_are_stored() -> None:
    cfg = ReplayConfig(fraction=0.5, per_group=10)
    good = _r(WRONG, sample=0)
    others = [
        _r(Verdict(accepted=True, reason=Reason.OK), sample=1),  # a pass
        _r(Verdict.reject(Reason.INFRA, "sandbox died"), sample=2),  # checker did not run
        _r(WRONG, sample=3, finish="length"),  # cut off: unfinished, not wrong
        _r(Verdict.reject(Reason.TRUNCATED, "cut"), sample=4),
        _r(Verdict.reject(Reason.NO_PROOF, "no code"), sample=5),  # nothing Lean judged
        _r(WRONG, sample=6, turns=2),  # multi-turn: no single attempt to revise
        _r(WRONG, sample=7, meta={"replay": True}),  # a revision is never revised again
        _r(None, sample=8),
        _r(Verdict.reject(Reason.SORRY, "sorry"), sample=9),  # not in the default reasons
    ]
    assert qualifies(good, cfg) and not any(qualifies(r, cfg) for r in others)
    buf = FailureBuffer(cfg)
    assert buf.add(3, [[*others, good]]) == 1
    assert [(s, r.sample) for s, r in buf.entries] == [(3, 0)]
    assert buf.entries[0][1].turns[0].completion_ids == []  # no ids kept, only the text
    wider = ReplayConfig(fraction=0.5, per_group=10, reasons=("error", "sorry"))
    assert qualifies(others[-1], wider)


def test_per_group_cap_fifo_bound_and_replay_groups_skipped() -> None:
    buf = FailureBuffer(ReplayConfig(fraction=0.5, max_stored=3, per_group=2))
    buf.add(0, [[_r(WRONG, sample=i) for i in range(4)]])  # at most 2 of one group
    assert [r.sample for _, r in buf.entries] == [0, 1]
    buf.add(1, [[_r(WRONG, sample=i, task_id=f"t{i}")] for i in range(2)])
    assert [(s, r.task_id) for s, r in buf.entries] == [(0, TASK.id), (1, "t0"), (1, "t1")]
    buf.add(2, [[_r(WRONG, meta={"replay": True})], [_r(WRONG, task_id="new")]])
    assert [r.task_id for _, r in buf.entries] == ["t0", "t1", "new"]  # oldest dropped


def test_draw_is_a_function_of_seed_step_and_buffer_and_removes_what_it_takes() -> None:
    def filled() -> FailureBuffer:
        b = FailureBuffer(ReplayConfig(fraction=0.5, max_stored=50))
        b.add(0, [[_r(WRONG, task_id=f"t{i}")] for i in range(20)])
        return b

    a, b = filled(), filled()
    da, db = a.draw(5, 3, 4), b.draw(5, 3, 4)
    assert [r.task_id for _, r in da] == [r.task_id for _, r in db] and len(da) == 4
    assert len(a) == 16 and not {r.task_id for _, r in da} & {r.task_id for _, r in a.entries}
    others = {tuple(r.task_id for _, r in filled().draw(s, 3, 4)) for s in range(6, 12)}
    assert len(others) > 1  # the step changes the draw
    assert len(filled().draw(0, 0, 99)) == 20  # never more than it holds


def test_the_buffer_round_trips_and_prunes_snapshots(tmp_path: Path) -> None:
    cfg = ReplayConfig(fraction=0.5)
    buf = FailureBuffer(cfg, tmp_path / "replay")
    msg = Message(severity="error", data="unsolved goals", pos=Position(line=2, column=2))
    chat = [ChatMessage(role="user", content="prove it")]
    r = Rollout(task_id="t", prompt=chat, turns=[Turn(completion="x", finish_reason="stop")],
                proof="  simp", verdict=Verdict.reject(Reason.ERROR, "e", messages=(msg,)))  # fmt: skip
    buf.add(0, [[r]])
    for step in range(1, 6):
        buf.save(step, keep={2}, newest=2)
    names = sorted(p.name for p in (tmp_path / "replay").iterdir())
    assert names == ["00000002.json", "00000004.json", "00000005.json"]  # no temp files left
    back = FailureBuffer(cfg, tmp_path / "replay")
    assert back.load(2) and back.entries == buf.entries
    assert back.entries[0][1].prompt == chat and back.entries[0][1].verdict == r.verdict
    assert not back.load(3) and len(back) == 0
    (tmp_path / "replay" / "00000004.json").write_text("{not json")
    with pytest.raises(ConfigError, match="damaged"):
        back.load(4)


# -- rendering and revising ---------------------------------------------------------------------


def test_cap_tokens_cuts_at_a_line_end_within_the_limit() -> None:
    def chars(s: str) -> list[int]:
        return [ord(c) for c in s]

    text = "Error 1:\nline two is long\nthird"
    assert cap_tokens(text, 100, chars) == text
    assert cap_tokens(text, 20, chars) == "Error 1:\n... [error text cut]"  # 2nd line won't fit
    assert cap_tokens("x" * 50, 10, chars) == "x" * 10 + "\n... [error text cut]"

    def cannot(s: str) -> list[int]:
        raise NotImplementedError

    assert cap_tokens("y" * 50, 5, cannot) == "y" * 20 + "\n... [error text cut]"


class _Statements(Taskset):
    name = "test-replay-statements"

    def load_rows(self) -> list[RawRow]:
        return [RawRow(origin="test", index=1,
                       data={"name": TASK.name, "formal_statement": TASK.formal_statement,
                             "header": TASK.header})]  # fmt: skip


class _ErrorEnv(Environment):
    taskset_class = _Statements

    def make_runtime(self) -> Runtime:
        return ErrorRuntime()


def _env(harness: str = "whole-proof", prompt_format: str = "deepseek") -> _ErrorEnv:
    hc = HarnessConfig(name=harness, prompt_format=prompt_format, max_revisions=1)
    return _ErrorEnv(EnvironmentConfig(id="test-replay", harness=hc))


@pytest.mark.parametrize("fmt", ["deepseek", "chat"])
def test_the_revision_prompt_is_the_self_correction_context(fmt: str) -> None:
    """The self-correction harness (text contexts) asks for its first revision with exactly the
    prompt failure replay builds from the same failed whole-proof attempt."""
    env = _env("self-correction", fmt)
    sc = env.harness
    task = env.tasks()[0]
    chat = f"```lean4\n{TASK.formal_statement}\n  simp\n```"
    first = chat if fmt == "chat" else "  simp\n"
    policy = ScriptedPolicy([], per_turn=[first, "  omega\n"])
    rt = ErrorRuntime()
    (group,) = asyncio.run(sc.run([task], policy, rt, SamplingConfig(n=1), env.taskset))
    assert group[0].meta["revisions"] == 1
    asked = policy.calls[1][0]  # what the harness showed the model for its revision
    # the same attempt, as the whole-proof harness would have stored it
    wp = _env("whole-proof", fmt)
    failed = asyncio.run(_one_whole_proof(wp, task, first))
    assert failed.verdict is not None and failed.verdict.reason == Reason.ERROR
    assert failed.verdict.messages  # positioned errors: the rendering shows code around them
    render = SelfCorrectionHarness(wp.harness.config.model_copy(update={"name": "self-correction"}))
    assert render.revision_prompt(task, failed) == asked


async def _one_whole_proof(env: Environment, task: Task, text: str) -> Rollout:
    async with env:
        (group,) = await env.rollout([task], ScriptedPolicy([text]), SamplingConfig(n=1))
    return group[0]


def test_revisions_are_checked_and_rewarded_in_groups_of_their_own() -> None:
    env = _env()
    task = env.tasks()[0]
    failed = asyncio.run(_one_whole_proof(env, task, "  simp\n"))
    policy = ScriptedPolicy(["  omega\n", "  simp\n", "  ring\n"])
    sampling = SamplingConfig(n=3, seed=1)

    async def go() -> list[list[Rollout]]:
        async with env:
            return await replay_rollouts([(4, failed)], {task.id: task}, env, policy, sampling, 64)

    (group,) = asyncio.run(go())
    cap = lambda s: cap_tokens(s, 64, policy.tokenize)  # noqa: E731
    render = SelfCorrectionHarness(
        env.harness.config.model_copy(update={"name": "self-correction"})
    )
    assert policy.calls == [[render.revision_prompt(task, failed, cap)]]  # one prompt, n = 3
    assert (
        is_replay(group) and [r.meta["replay_of"] for r in group] == [{"step": 4, "sample": 0}] * 3
    )
    # the verdicts come from the runtime on the revised proofs, the rewards from the taskset
    assert [r.verdict.accepted for r in group if r.verdict] == [True, False, False]
    assert [r.reward for r in group] == [1.0, 0.0, 0.0]
    rt = env.runtime
    assert isinstance(rt, ErrorRuntime) and [a.proof for a in rt.batches[-1]] == [
        r.proof for r in group
    ]
    assert all(a.formal_statement == task.formal_statement for a in rt.batches[-1])
    assert all(r.prompt == policy.calls[0][0] for r in group)
    m = replay_metrics([[_r(WRONG)], group], stored=7)
    assert m == {"replay_groups": 1, "replay_pass_rate": pytest.approx(1 / 3), "replay_stored": 7}


def test_the_error_text_cap_applies_to_the_rendered_errors() -> None:
    env = _env()
    task = env.tasks()[0]
    failed = asyncio.run(_one_whole_proof(env, task, "  simp\n"))
    render = SelfCorrectionHarness(
        env.harness.config.model_copy(update={"name": "self-correction"})
    )
    full = render.revision_prompt(task, failed)
    short = render.revision_prompt(task, failed, lambda s: cap_tokens(s, 10, list))
    assert isinstance(full, str) and isinstance(short, str)
    assert "[error text cut]" in short and "[error text cut]" not in full
    assert len(short) < len(full) and short.startswith(failed.prompt + "  simp\n")


def test_replay_needs_the_whole_proof_harness_and_one_process() -> None:
    on = ReplayConfig(fraction=0.5)
    check_replay(on, _env(), distributed=False)
    check_replay(ReplayConfig(), _env("tactic-loop"), distributed=True)  # off: nothing checked
    with pytest.raises(ConfigError, match="self-correction already revises"):
        check_replay(on, _env("self-correction"), distributed=False)
    with pytest.raises(ConfigError, match="whole-proof harness"):
        check_replay(on, _env("tactic-loop"), distributed=False)
    with pytest.raises(ConfigError, match="several ranks"):
        check_replay(on, _env(), distributed=True)


# -- the config ---------------------------------------------------------------------------------


def test_replay_options_from_toml_and_flags(tmp_path: Path) -> None:
    from leanrl.cli import parse_command
    from leanrl.config import merge
    from leanrl.train.grpo import GRPOConfig
    from leanrl.train.grpo.cli import GRPOCommand

    assert not GRPOConfig(policy={"model": "m"}).replay.enabled  # off by default
    toml = tmp_path / "r.toml"
    toml.write_text('tasks_per_step = 4\n[replay]\nfraction = 0.25\nreasons = ["error", "sorry"]\n')
    cfg = merge(GRPOCommand, toml, {"model": "m"}).to_grpo_config()
    assert cfg.replay.fraction == 0.25 and cfg.replay.reasons == ("error", "sorry")
    assert cfg.replay.groups_per_step(cfg.tasks_per_step) == 1
    flags = ["--model", "m", "--tasks-per-step", "4", "--replay.fraction", "0.5",
             "--replay.max-error-tokens", "64", "--replay.max-stored", "9"]  # fmt: skip
    cfg = parse_command(GRPOCommand, flags).to_grpo_config()
    assert (cfg.replay.fraction, cfg.replay.max_error_tokens, cfg.replay.max_stored) == (
        0.5, 64, 9)  # fmt: skip
    with pytest.raises(ConfigError, match="less than one group per step"):
        parse_command(GRPOCommand, [*flags[:4], "--replay.fraction", "0.1"]).to_grpo_config()
    with pytest.raises(ConfigError, match=r"replay\.reasons"):
        parse_command(GRPOCommand, [*flags[:4], "--replay.reasons", '["infra"]']).to_grpo_config()


# -- a tiny GRPO run ----------------------------------------------------------------------------


class _Finishing(Policy):
    """The engine's generation policy, but every completion reports ``stop``: a random tiny
    model never ends within max_tokens, and cut-off attempts are never stored."""

    def __init__(self, inner: Policy, log: list[tuple[Any, Completion]]) -> None:
        super().__init__(inner.config)
        self.inner = inner
        self.tokenizer = getattr(inner, "tokenizer", None)
        self.log = log

    def tokenize(self, text: str) -> list[int]:
        return self.inner.tokenize(text)

    async def generate(self, prompts: Any, sampling: SamplingConfig) -> Any:
        out = await self.inner.generate(prompts, sampling)
        fixed = [[c.model_copy(update={"finish_reason": "stop"}) for c in g] for g in out]
        self.log += [(p, g[0]) for p, g in zip(prompts, fixed, strict=True)]
        return fixed

    async def close(self) -> None:
        await self.inner.close()


_ORIGINAL: dict[str, Any] = {}


def _run(model: Path, out: Path, monkeypatch: pytest.MonkeyPatch, steps: int, log: list) -> Any:
    from leanrl.train.grpo import GRPOConfig, GRPOTrainer
    from leanrl.train.grpo.engine import GRPOEngine
    from tests.test_grpo_harnesses import ScriptedEnv

    make = _ORIGINAL.setdefault("make", GRPOEngine.make_generation_policy)  # never nested

    async def finishing(self: Any) -> Policy:
        return _Finishing(await make(self), log)

    monkeypatch.setattr(GRPOEngine, "make_generation_policy", finishing)
    cfg = GRPOConfig(
        policy={"model": str(model)},
        sampling=SamplingConfig(max_tokens=8, top_p=1.0, seed=0),
        env=EnvironmentConfig(id="test-scripted", harness=HarnessConfig(prompt_format="deepseek")),
        out=out, steps=steps, tasks_per_step=2, group_size=2, lr=1e-3, save_every=1,
        dynamic_sampling="off", replay=ReplayConfig(fraction=0.5, max_error_tokens=16),
    )  # fmt: skip
    trainer = GRPOTrainer(cfg, env=ScriptedEnv(cfg.env))
    trainer.train_sync()
    return trainer


def test_grpo_run_replays_a_share_of_each_step(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log: list[tuple[Any, Completion]] = []
    trainer = _run(tiny_model_dir, tmp_path / "a", monkeypatch, 2, log)
    rows = trainer.run.metrics()
    # step 1: nothing stored yet; then ⌊0.5 × 2⌋ = 1 of the 2 groups revises a stored failure
    assert [r["replay_groups"] for r in rows] == [0, 1]
    assert [r["groups"] for r in rows] == [2, 2] and rows[1]["loss_tokens"] > 0
    assert rows[1]["replay_pass_rate"] is not None
    assert rows[0]["replay_stored"] == 2  # one failure per group (per_group = 1)
    # step 2 generated one revision prompt (a rendered failure of step 1) and one fresh task
    kinds = ["revise" if "is not correct" in str(p) else "fresh" for p, _ in log]
    assert kinds == ["fresh", "fresh", "revise", "fresh"]
    assert (tmp_path / "a" / "replay" / "00000002.json").is_file()


def test_a_revision_trains_on_the_ids_the_model_was_conditioned_on(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from leanrl.train.common import RunDir
    from leanrl.train.grpo.engine import GRPOEngine
    from leanrl.train.hf_policy import TrainPolicy
    from tests.test_grpo_harnesses import _config

    engine = GRPOEngine(_config(tiny_model_dir, tmp_path / "run"), RunDir(tmp_path / "run"))
    engine.load(resumed=False)
    policy = asyncio.run(engine.make_generation_policy())
    env = _env()
    task = env.tasks()[0]
    failed = asyncio.run(_one_whole_proof(env, task, "  simp\n"))
    sampling = SamplingConfig(n=2, max_tokens=6, top_p=1.0, seed=0)

    async def go() -> list[list[Rollout]]:
        async with env:
            return await replay_rollouts([(0, failed)], {task.id: task}, env, policy, sampling, 32)

    groups = asyncio.run(go())
    tp = TrainPolicy(engine.config.policy, engine.model, engine.tokenizer)
    samples = engine.make_samples(groups)
    for r, s in zip(groups[0], samples, strict=True):
        assert r.prompt_ids and s.prompt == r.prompt_ids == tp.prompt_ids(r.prompt)
        assert s.resp == r.turns[0].completion_ids and all(s.mask)  # only the revision has loss
    assert "is not correct" in str(groups[0][0].prompt)


def test_a_resumed_replay_run_builds_the_same_batch(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log: list[tuple[Any, Completion]] = []
    whole = _run(tiny_model_dir, tmp_path / "a", monkeypatch, 3, log)
    rows = whole.run.metrics()
    assert [r["replay_groups"] for r in rows] == [0, 1, 1]

    # resume: 2 steps, then on to 3 from checkpoint 2, gives the third step of the whole run
    log2: list[tuple[Any, Completion]] = []
    _run(tiny_model_dir, tmp_path / "b", monkeypatch, 2, log2)
    resumed = _run(tiny_model_dir, tmp_path / "b", monkeypatch, 3, log2)
    a3, b3 = rows[2], resumed.run.metrics()[2]
    for key in ("replay_groups", "replay_pass_rate", "replay_stored", "reward_mean", "loss"):
        assert a3[key] == pytest.approx(b3[key]), key
    snap = "replay/00000003.json"
    assert json.loads((tmp_path / "a" / snap).read_text()) == json.loads(
        (tmp_path / "b" / snap).read_text()
    )
    assert len(log) == 6 and len(log2) == 6  # per step: (replay prompt,) fresh prompt
    a_prompts = [p for p, _ in log[-3:]]
    assert a_prompts == [p for p, _ in log2[-3:]]  # the same prompts, revision prompt included


def test_replayer_reads_the_snapshot_of_its_start_step(tmp_path: Path) -> None:
    from leanrl.train.grpo import GRPOConfig

    cfg = GRPOConfig(policy={"model": "m"}, tasks_per_step=2, replay=ReplayConfig(fraction=0.5))
    first = Replayer(cfg, tmp_path, 0)
    first.store(0, [[_r(WRONG, task_id="a")], [_r(WRONG, task_id="b")]], keep=set())
    again = Replayer(cfg, tmp_path, 1)
    assert [r.task_id for _, r in again.buffer.entries] == ["a", "b"]
    assert first.metrics(0, [])["replay_stored"] == 2
