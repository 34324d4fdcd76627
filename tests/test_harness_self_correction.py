"""The self-correction harness: a whole proof, Lean's errors fed back, revisions, token-exact
contexts, and GRPO training on its rollouts.

The test runtime below is not Lean: it accepts a proof containing ``omega`` and otherwise
reports one error, positioned on the first line of the proof in the checked text (as Lean
positions its messages), saying the goals are unsolved. The tiny model is random.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from leanrl import Environment, HarnessConfig, Runtime, RuntimeConfig, Taskset
from leanrl.environment import EnvironmentConfig
from leanrl.harnesses.self_correction import SelfCorrectionHarness, checked_text, render_errors
from leanrl.policy import Policy, PolicyConfig, SamplingConfig
from leanrl.rollout import ChatMessage
from leanrl.task import Task
from leanrl.taskset import RawRow
from leanrl.verdict import Attempt, Message, Position, Reason, Verdict
from tests._scripted_runtime import HoldLastPolicy, ScriptedPolicy

STATEMENT = "theorem t0 (n : Nat) : n + 0 = 0 + n := by"
TASK = Task(name="t0", header="import Mathlib\n\n", formal_statement=STATEMENT)


class ErrorRuntime(Runtime):
    """Accepts proofs containing ``omega``; otherwise an error on the proof's first line."""

    name = "error-test"

    def __init__(self, config: RuntimeConfig | None = None) -> None:
        super().__init__(config or RuntimeConfig(name="error-test"))
        self.batches: list[list[Attempt]] = []

    async def check(self, attempts: Sequence[Attempt]) -> list[Verdict]:
        self.batches.append(list(attempts))
        out = []
        for a in attempts:
            if "omega" in a.proof:
                out.append(Verdict(accepted=True, reason=Reason.OK, id=a.id))
                continue
            task = Task(name=a.name, header=a.header, formal_statement=a.formal_statement)
            lines = checked_text(task, a.proof, a.preamble, a.restated_statement).split("\n")
            line = next(i for i, ln in enumerate(lines) if ln.startswith("  ") and ln.strip())
            col = len(lines[line]) - len(lines[line].lstrip())
            msg = Message(
                severity="error",
                data="unsolved goals\nn : ℕ\n⊢ n + 0 = 0 + n",
                pos=Position(line=line + 1, column=col),
                end_pos=Position(line=line + 1, column=len(lines[line])),
            )
            out.append(Verdict.reject(Reason.ERROR, "unsolved goals", messages=(msg,), id=a.id))
        return out


def _harness(fmt: str = "deepseek", **kw: Any) -> SelfCorrectionHarness:
    return SelfCorrectionHarness(HarnessConfig(name="self-correction", prompt_format=fmt, **kw))


async def test_errors_are_fed_back_and_the_revision_is_accepted() -> None:
    rt = ErrorRuntime()
    policy = ScriptedPolicy([], per_turn=["\n  simp\n", "\n  omega\n"])
    (group,) = await _harness().run([TASK], policy, rt, SamplingConfig(n=1), Taskset())
    (r,) = group
    assert r.verdict is not None and r.verdict.accepted and r.reward == 1.0
    assert r.proof == "\n  omega" and len(r.turns) == 2
    assert r.meta["attempt_reasons"] == ["error", "ok"] and r.meta["revisions"] == 1
    fb = r.turns[0].feedback
    assert fb.startswith("```\n\n/- The proof (Round 0) is not correct.")
    assert f"{STATEMENT}\n  <error>simp</error>\nError Message: unsolved goals\nn : ℕ" in fb
    # the feedback opens the task's code block again, so the model writes a proof as before
    assert fb.endswith(
        f"Complete the following Lean 4 code:\n\n```lean4\nimport Mathlib\n\n{STATEMENT}\n"
    )
    assert r.turns[1].feedback == ""
    assert [len(b) for b in rt.batches] == [1, 1]  # one check batch per round
    second = policy.calls[1][0]
    assert second == policy.calls[0][0] + "\n  simp\n" + fb  # text context: prompt + turn + fb
    assert r.turns[0].feedback_ids == [ord(ch) for ch in fb]  # environment tokens, mask 0
    _, mask, _ = r.token_ids_and_mask()
    assert mask.count(0) == len(fb) and mask.count(1) == len("\n  simp\n") + len("\n  omega\n")


async def test_chat_formats_get_goedels_revision_request() -> None:
    policy = ScriptedPolicy(
        [], per_turn=["```lean4\ntheorem t0 (n : Nat) : n + 0 = 0 + n := by\n  simp\n```"]
    )
    h = _harness("kimina", max_revisions=1)
    (group,) = await h.run([TASK], policy, ErrorRuntime(), SamplingConfig(n=1), Taskset())
    (r,) = group
    assert r.verdict is not None and not r.verdict.accepted and len(r.turns) == 2
    fb = r.turns[0].feedback
    assert fb.startswith(
        "The proof (Round 0) is not correct. Following is the compilation error message, "
        "where we use <error></error> to signal the position of the error.\n\nError 1:\n\n"
        "Corresponding Code:\n```lean4\n"
    )
    assert "  <error>simp</error>\n```\n\nError Message: unsolved goals" in fb
    assert fb.endswith("provide a detailed analysis of the error message.")
    second = policy.calls[1][0]
    assert isinstance(second, list) and second[-2:] == [
        ChatMessage(role="assistant", content=policy.per_turn[0]),
        ChatMessage(role="user", content=fb),
    ]


async def test_a_restated_statement_is_checked_and_shown_as_written() -> None:
    # The model restates the theorem with its own statement: it goes to the runtime as the
    # attempt's restated statement, and Lean's errors are shown against that text.
    own = "theorem t0 (n : Nat) : n + 0 = n := by"
    policy = ScriptedPolicy([], per_turn=[f"```lean4\n{own}\n  simp\n```"])
    rt = ErrorRuntime()
    h = _harness("kimina", max_revisions=1)
    (group,) = await h.run([TASK], policy, rt, SamplingConfig(n=1), Taskset())
    (r,) = group
    (a,) = rt.batches[0]
    assert a.restated_statement == own and a.formal_statement == STATEMENT
    assert r.restated_statement == own
    assert f"{own}\n  <error>simp</error>" in r.turns[0].feedback


async def test_revisions_stop_at_the_limit_and_the_last_verdict_stands() -> None:
    policy = ScriptedPolicy([], per_turn=["\n  simp\n", "\n  ring\n", "\n  linarith\n", "x"])
    h = _harness(max_revisions=2)
    (group,) = await h.run([TASK], policy, ErrorRuntime(), SamplingConfig(n=2), Taskset())
    for r in group:
        assert len(r.turns) == 3 and r.meta["attempt_reasons"] == ["error"] * 3
        assert r.proof == "\n  linarith" and r.reward == 0.0
        assert "Round 1" in r.turns[1].feedback and r.turns[2].feedback == ""
    assert len(policy.calls) == 3


async def test_a_missing_proof_is_explained_without_code() -> None:
    policy = ScriptedPolicy([], per_turn=["I do not know.", "```lean4\nomega\n```"])
    h = _harness("chat", max_revisions=1)
    (group,) = await h.run([TASK], policy, ErrorRuntime(), SamplingConfig(n=1), Taskset())
    (r,) = group
    assert "Lean rejected the proof (no_proof): no Lean code block" in r.turns[0].feedback
    assert r.verdict is not None and r.verdict.accepted


def test_long_spans_and_many_errors_are_cut() -> None:
    text = "theorem x : True := by\n" + "\n".join(f"  tac{i}" for i in range(12))
    msgs = tuple(
        Message(severity="error", data=f"e{i}", pos=Position(line=2, column=2),
                end_pos=Position(line=12, column=7))
        for i in range(3)
    )  # fmt: skip
    v = Verdict.reject(Reason.ERROR, "e", messages=msgs)
    out = render_errors(v, text, 2, fenced=False)
    assert out.count("Error Message:") == 2 and "[Omitted 1 more errors]" in out
    assert "  <error>tac0" in out and "--[Truncated]--" in out and "tac10</error>" in out
    # a position outside the text is shown without code
    far = Verdict.reject(
        Reason.ERROR,
        "e",
        messages=(Message(severity="error", data="boom", pos=Position(line=99, column=0)),),
    )
    assert render_errors(far, text, 8, fenced=True) == "Error 1:\n\nError Message: boom"


# -- token-exact contexts and GRPO ---------------------------------------------------------------


class _Toy(Taskset):
    name = "toy-sc"

    def load_rows(self) -> list[RawRow]:
        return [
            RawRow(origin="t", index=i + 1, data={"name": f"t{i}", "header": "",
                   "formal_statement": f"theorem t{i} (n : Nat) : n + {i} = {i} + n := by"})
            for i in range(4)
        ]  # fmt: skip


class _Env(Environment):
    taskset_class = _Toy

    def make_runtime(self) -> Runtime:
        return ErrorRuntime()


def _env(fmt: str) -> _Env:
    return _Env(
        EnvironmentConfig(
            id="toy-sc",
            harness=HarnessConfig(name="self-correction", prompt_format=fmt, max_revisions=2),
        )
    )


class _Recorder(Policy):
    name = "recorder"

    def __init__(self, inner: Any) -> None:
        super().__init__(inner.config)
        self.inner = inner
        self.tokenizer = inner.tokenizer
        self.calls: list[tuple[str, list[list[Any]]]] = []

    def tokenize(self, text: str) -> list[int]:
        return self.inner.tokenize(text)

    async def generate(self, prompts: Any, sampling: SamplingConfig) -> Any:
        out = await self.inner.generate(prompts, sampling)
        self.calls.append(("text", out))
        return out

    async def generate_from_ids(self, prompt_ids: Any, sampling: SamplingConfig) -> Any:
        out = await self.inner.generate_from_ids(prompt_ids, sampling)
        self.calls.append(("ids", out))
        return out


@pytest.mark.parametrize("fmt", ["deepseek", "chat"])
def test_revisions_condition_on_exactly_the_ids_a_trainer_replays(
    toy_model_dir: Path, tmp_path: Path, fmt: str
) -> None:
    from leanrl.train.common import RunDir
    from leanrl.train.grpo import GRPOConfig
    from leanrl.train.grpo.engine import GRPOEngine

    cfg = GRPOConfig(policy=PolicyConfig(model=str(toy_model_dir)), out=tmp_path / "run")
    engine = GRPOEngine(cfg, RunDir(tmp_path / "run"))
    engine.load(resumed=False)
    spy = _Recorder(asyncio.run(engine.make_generation_policy()))
    env = _env(fmt)
    sampling = SamplingConfig(n=2, max_tokens=8, top_p=1.0, seed=0)

    async def go() -> Any:
        async with env:
            return await env.rollout(env.tasks()[:1], spy, sampling)

    (group,) = asyncio.run(go())
    assert [how for how, _ in spy.calls] == ["text", "ids", "ids"]  # the random model never wins
    tok = spy.tokenizer
    for i, r in enumerate(group):
        assert r.meta["context"] == "ids" and len(r.turns) == 3
        context = list(r.prompt_ids)
        conversation = [m.model_dump() for m in r.prompt] if fmt == "chat" else []
        for k, (turn, (_, batch)) in enumerate(zip(r.turns, spy.calls, strict=True)):
            c = batch[i][0] if k else batch[0][i]
            assert list(c.prompt_token_ids) == context
            assert list(c.token_ids) == turn.completion_ids
            if fmt == "chat":
                # what the model conditioned on is the chat template's rendering of the
                # conversation so far (a broken separator between turns would not be)
                want = tok.apply_chat_template(
                    conversation, tokenize=False, add_generation_prompt=True
                )
                assert tok.decode(context, skip_special_tokens=False) == want
                conversation += [
                    {"role": "assistant", "content": turn.completion},
                    {"role": "user", "content": turn.feedback},
                ]
            context += turn.completion_ids + turn.feedback_ids
        ids, mask, _ = r.token_ids_and_mask()
        assert list(r.prompt_ids) + ids == context
        assert mask.count(0) == sum(len(t.feedback_ids) for t in r.turns) > 0


def test_grpo_trains_on_self_correction_rollouts(toy_model_dir: Path, tmp_path: Path) -> None:
    from leanrl.train.common import RunDir
    from leanrl.train.grpo import GRPOConfig, GRPOTrainer

    cfg = GRPOConfig(
        policy=PolicyConfig(model=str(toy_model_dir)),
        sampling=SamplingConfig(max_tokens=8, top_p=1.0, seed=0),
        env=EnvironmentConfig(id="toy-sc", harness=HarnessConfig(name="self-correction")),
        out=tmp_path / "run",
        steps=2,
        tasks_per_step=2,
        group_size=2,
        lr=1e-3,
        save_every=2,
        dynamic_sampling="off",
        mask_truncated=False,
    )
    trainer = GRPOTrainer(cfg, env=_env("deepseek"))
    rows = trainer.train_sync()
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["pass_rate"] == 0.0 and row["loss_tokens"] > 0  # from Verdicts
    assert RunDir(tmp_path / "run").latest_checkpoint() is not None


class _Releasing(ErrorRuntime):
    """Sets ``policy.release`` once ``after`` attempts have been checked."""

    def __init__(self, policy: HoldLastPolicy, after: int) -> None:
        super().__init__()
        self.policy, self.after = policy, after

    async def check(self, attempts: Sequence[Attempt]) -> list[Verdict]:
        out = await super().check(attempts)
        if sum(map(len, self.batches)) >= self.after:
            self.policy.release.set()
        return out


async def test_a_streamed_round_checks_each_attempt_as_it_arrives() -> None:
    # The round's last completion is held back until two attempts were checked: a round that
    # waited for all its completions before checking would never finish (wait_for fails it).
    policy = HoldLastPolicy(["\n  omega\n"])
    rt = _Releasing(policy, after=2)
    groups = await asyncio.wait_for(
        _harness().run([TASK], policy, rt, SamplingConfig(n=3, seed=1), Taskset()), 30
    )
    assert policy.streams == 1 and sum(map(len, rt.batches)) == 3
    assert [r.reward for r in groups[0]] == [1.0, 1.0, 1.0]


async def test_streamed_and_batched_rounds_record_the_same_rollouts() -> None:
    got = []
    for replays in (True, False):
        policy = HoldLastPolicy([], per_turn=["\n  simp\n", "\n  nlinarith\n", "\n  omega\n"],
                            replays=replays)  # fmt: skip
        policy.release.set()
        groups = await _harness().run(
            [TASK], policy, ErrorRuntime(), SamplingConfig(n=2, seed=3), Taskset()
        )
        assert policy.streams == (3 if replays else 0)  # one stream per round, or none
        got.append(
            [
                (
                    r.proof,
                    r.reward,
                    r.meta["attempt_reasons"],
                    [(t.completion, t.feedback) for t in r.turns],
                )
                for r in groups[0]
            ]
        )
    assert got[0] == got[1]
    assert got[0][0][2] == ["error", "error", "ok"]  # two revisions, the last accepted
