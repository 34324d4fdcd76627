"""GRPO through the built-in harnesses (whole-proof, tactic-loop) on the scripted TEST runtime.

The scripted runtime judges proofs by a rule (see tests/_scripted_runtime.py), not by Lean; here
it only has to produce Verdicts and multi-turn feedback so that the trainer's plumbing is
exercised: environment tokens carry no loss, pass rates come from Verdicts, a step trains.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from leanrl import Environment, HarnessConfig, Runtime, RuntimeConfig, Taskset
from leanrl.environment import EnvironmentConfig
from leanrl.policy import PolicyConfig, SamplingConfig
from leanrl.taskset import RawRow
from leanrl.train.common import RunDir
from tests._scripted_runtime import ScriptedRuntime

STATEMENTS = [f"theorem s{i} (n : Nat) : n + {i} = {i} + n := by" for i in range(4)]


class Statements(Taskset):
    name = "test-statements"

    def load_rows(self) -> list[RawRow]:
        return [
            RawRow(origin="test", index=i + 1, data={"name": f"s{i}", "formal_statement": s})
            for i, s in enumerate(STATEMENTS)
        ]


class ScriptedEnv(Environment):
    taskset_class = Statements

    def make_runtime(self) -> Runtime:
        return ScriptedRuntime(RuntimeConfig(name="scripted", options={"accept": "omega"}))


def _env(harness: str) -> ScriptedEnv:
    cfg = EnvironmentConfig(
        id="test-scripted",
        harness=HarnessConfig(name=harness, prompt_format="deepseek", max_turns=3),
    )
    return ScriptedEnv(cfg)


def _config(model: Path, out: Path, **kw: Any) -> Any:
    from leanrl.train.grpo import GRPOConfig

    base: dict[str, Any] = dict(
        policy=PolicyConfig(model=str(model)),
        sampling=SamplingConfig(max_tokens=12, top_p=1.0, seed=0),
        out=out,
        steps=2,
        tasks_per_step=2,
        group_size=2,
        lr=1e-3,
        save_every=2,
        dynamic_sampling="off",
        mask_truncated=False,
    )
    base.update(kw)
    return GRPOConfig(**base)


def test_tactic_loop_feedback_tokens_are_masked(tiny_model_dir: Path, tmp_path: Path) -> None:
    from leanrl.train.grpo.engine import GRPOEngine

    cfg = _config(tiny_model_dir, tmp_path / "run")
    engine = GRPOEngine(cfg, RunDir(tmp_path / "run"))
    engine.load(resumed=False)
    policy = asyncio.run(engine.make_generation_policy())
    env = _env("tactic-loop")

    async def go() -> Any:
        async with env:
            return await env.rollout(
                env.tasks()[:2], policy, cfg.sampling.model_copy(update={"n": 2})
            )

    groups = asyncio.run(go())
    rollouts = [r for g in groups for r in g]
    multi = [r for r in rollouts if len(r.turns) > 1]
    assert multi, "the random model's tactics fail, so episodes must run several turns"
    samples = engine.make_samples(groups)
    for r, s in zip(rollouts, samples, strict=True):
        expect: list[int] = []
        for t in r.turns:
            expect += [1] * len(t.completion_ids) + [0] * len(t.feedback_ids)
        assert s.mask == expect
    assert any(0 in s.mask for s in samples)  # Lean's feedback is context, never loss


@pytest.mark.parametrize("harness", ["whole-proof", "tactic-loop"])
def test_grpo_steps_through_builtin_harness(
    tiny_model_dir: Path, tmp_path: Path, harness: str
) -> None:
    from leanrl.train.grpo import GRPOTrainer

    trainer = GRPOTrainer(_config(tiny_model_dir, tmp_path / "run"), env=_env(harness))
    trainer.train_sync()
    rows = trainer.run.metrics()
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["pass_rate"] is not None and 0.0 <= row["pass_rate"] <= 1.0  # from Verdicts
        assert row["loss_tokens"] > 0
        assert row["time_generate"] > 0.0
    assert RunDir(tmp_path / "run").latest_checkpoint() is not None


class _Spy:
    """Wraps a policy; keeps every batch of completions it returned (their ``prompt_token_ids``
    are the ids the policy fed the model) and which entry point was used."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[tuple[str, list[list[Any]]]] = []

    def make(self) -> Any:
        from leanrl.policy import Policy

        spy = self

        class SpyPolicy(Policy):
            name = "spy"
            tokenizer = spy.inner.tokenizer

            def tokenize(self, text: str) -> list[int]:
                return spy.inner.tokenize(text)

            async def generate(self, prompts: Any, sampling: SamplingConfig) -> Any:
                out = await spy.inner.generate(prompts, sampling)
                spy.calls.append(("text", out))
                return out

            async def generate_from_ids(self, prompt_ids: Any, sampling: SamplingConfig) -> Any:
                out = await spy.inner.generate_from_ids(prompt_ids, sampling)
                spy.calls.append(("ids", out))
                return out

        return SpyPolicy(spy.inner.config)


@pytest.mark.parametrize("fmt", ["deepseek", "chat"])
@pytest.mark.parametrize("kind", ["hf", "train"])
def test_tactic_loop_records_exactly_the_ids_the_model_saw(
    tiny_model_dir: Path, tmp_path: Path, kind: str, fmt: str
) -> None:
    from leanrl.policies.hf import HFPolicy

    if kind == "hf":
        inner: Any = HFPolicy(PolicyConfig(model=str(tiny_model_dir)))
        asyncio.run(inner.start())
    else:
        from leanrl.train.grpo.engine import GRPOEngine

        engine = GRPOEngine(_config(tiny_model_dir, tmp_path / "run"), RunDir(tmp_path / "run"))
        engine.load(resumed=False)
        inner = asyncio.run(engine.make_generation_policy())
    spy = _Spy(inner)
    cfg = EnvironmentConfig(
        id="test-scripted",
        harness=HarnessConfig(name="tactic-loop", prompt_format=fmt, max_turns=3),
    )
    env = ScriptedEnv(cfg)
    sampling = SamplingConfig(n=2, max_tokens=10, top_p=1.0, seed=0)

    async def go() -> Any:
        async with env:
            return await env.rollout(env.tasks()[:1], spy.make(), sampling)

    (group,) = asyncio.run(go())
    assert [how for how, _ in spy.calls] == ["text", "ids", "ids"]
    tok = inner.tokenizer
    for i, r in enumerate(group):
        assert r.meta["context"] == "ids" and len(r.turns) == 3
        assert r.prompt_ids  # the first prompt as the policy tokenized it
        context = list(r.prompt_ids)
        conversation = [m.model_dump() for m in r.prompt] if fmt == "chat" else []
        for turn, (_, batch) in zip(r.turns, spy.calls, strict=True):
            (c,) = batch[i]
            assert list(c.prompt_token_ids) == context  # what the model conditioned on
            assert list(c.token_ids) == turn.completion_ids
            if fmt == "chat":  # the chat template's rendering of the conversation so far
                want = tok.apply_chat_template(
                    conversation, tokenize=False, add_generation_prompt=True
                )
                assert tok.decode(context, skip_special_tokens=False) == want
                conversation += [
                    {"role": "assistant", "content": turn.completion},
                    {"role": "user", "content": turn.feedback},
                ]
            context += turn.completion_ids + turn.feedback_ids
        ids, _, _ = r.token_ids_and_mask()
        assert list(r.prompt_ids) + ids == context  # what a trainer replays


async def test_a_policy_without_ids_uses_text_contexts() -> None:
    from leanrl import Taskset
    from leanrl.harnesses.tactic_loop import TacticLoopHarness
    from leanrl.task import Task
    from tests._scripted_runtime import ScriptedPolicy

    task = Task(name="s0", header="import Mathlib\n", formal_statement=STATEMENTS[0])
    h = TacticLoopHarness(HarnessConfig(name="tactic-loop", prompt_format="deepseek"))
    policy = ScriptedPolicy([], per_turn=["intro a\n", "omega\n"])
    (group,) = await h.run([task], policy, ScriptedRuntime(), SamplingConfig(n=1), Taskset())
    assert group[0].meta["context"] == "text" and len(policy.calls) == 2


def test_chat_feedback_ids_drop_only_an_end_of_turn_the_model_wrote(tiny_model_dir: Path) -> None:
    """The separator after a chat turn starts with the template's end-of-turn token, which is
    left out only when the completion's last token is that very token, not when its text
    merely begins the marker (a plain "<" before "<|im_end|>")."""
    from leanrl.harnesses.tactic_loop.context import feedback_ids
    from leanrl.policies.hf import HFPolicy
    from leanrl.policy import Completion

    pol = HFPolicy(PolicyConfig(model=str(tiny_model_dir)))
    asyncio.run(pol.start())
    tok = pol.tokenizer
    end = tok.convert_tokens_to_ids("<|im_end|>")
    sep = pol.tokenize("<|im_end|>\n<|im_start|>user\nno<|im_end|>\n<|im_start|>assistant\n")
    assert sep[0] == end
    lt = pol.tokenize("<")
    assert len(lt) == 1 and lt[0] != end
    for last, want in ((lt, sep), ([end], sep[1:]), ([], sep)):
        c = Completion(text="x", token_ids=tuple(pol.tokenize("x") + last))
        assert feedback_ids(pol, c, "no", chat=True) == want
