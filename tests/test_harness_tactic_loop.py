"""The tactic-loop harness against a scripted (test) runtime: turns, budgets, masks, re-check."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from leanrl import HarnessConfig, Reason, SamplingConfig, Task, Taskset, TasksetConfig
from leanrl.harnesses.tactic_loop import TacticLoopHarness, extract_tactics, join_tactics
from tests._scripted_runtime import HoldLastPolicy, ScriptedPolicy, ScriptedRuntime

TASK = Task(
    name="t1",
    header="import Mathlib\n\n",
    formal_statement="theorem t1 (x : ℕ) (h : x + 1 = 2) : x = 1 := by",
)


def test_extract_and_join_tactics() -> None:
    assert extract_tactics("<think>hmm</think>```lean4\n  intro h\n  simp\n```", chat=True) == (
        "intro h\nsimp"
    )
    assert extract_tactics("omega", chat=True) == "omega"
    assert extract_tactics("  intro h\n```", chat=False) == "intro h"
    assert extract_tactics("<think>never done", chat=True) == ""
    assert join_tactics(["intro h", "constructor\n· simp\n· omega"]) == (
        "\n  intro h\n  constructor\n  · simp\n  · omega"
    )


async def test_solved_episode_is_rechecked_as_a_whole() -> None:
    # turn 1: a goal-adding tactic; turn 2: a bad tactic (error, state unchanged); turn 3: solve
    policy = ScriptedPolicy([], per_turn=["```lean4\nintro y\n```", "```lean4\nfoo\n```", "omega"])
    rt = ScriptedRuntime()
    h = TacticLoopHarness(HarnessConfig(name="tactic-loop", prompt_format="chat", max_turns=5))
    groups = await h.run([TASK], policy, rt, SamplingConfig(n=2, seed=3), Taskset(TasksetConfig()))
    assert rt.sessions == 2
    for r in groups[0]:
        assert len(r.turns) == 3
        assert "after intro y" in r.turns[0].feedback
        assert r.turns[1].feedback.startswith("Error: unknown tactic 'foo'")
        assert r.turns[2].feedback.startswith("No goals remain")
        assert r.proof == "\n  intro y\n  omega"  # the failed step is not part of the proof
        assert r.verdict is not None and r.verdict.accepted and r.reward == 1.0
        ids, mask, lps = r.token_ids_and_mask()
        t = r.turns
        assert ids == [
            *t[0].completion_ids,
            *t[0].feedback_ids,
            *t[1].completion_ids,
            *t[1].feedback_ids,
            *t[2].completion_ids,
            *t[2].feedback_ids,
        ]
        assert mask == [1] * len(t[0].completion_ids) + [0] * len(t[0].feedback_ids) + [1] * len(
            t[1].completion_ids
        ) + [0] * len(t[1].feedback_ids) + [1] * len(t[2].completion_ids) + [0] * len(
            t[2].feedback_ids
        )
        assert all(lp is None for lp, m in zip(lps, mask, strict=True) if m == 0)
        assert t[0].feedback_ids == [ord(ch) for ch in t[0].feedback]
    # the whole proof went to runtime.check under the reference statement
    assert [a.proof for a in rt.attempts] == ["\n  intro y\n  omega"] * 2
    assert all(a.formal_statement == TASK.formal_statement for a in rt.attempts)
    # chat context grows by assistant + user messages per turn; turns use distinct seeds
    assert [len(c[0]) for c in policy.calls] == [2, 4, 6]
    assert policy.seeds == [3, 4, 5]


async def test_turn_and_token_budgets() -> None:
    policy = ScriptedPolicy(["```lean4\nintro z\n```"])
    rt = ScriptedRuntime()
    h = TacticLoopHarness(HarnessConfig(name="tactic-loop", prompt_format="chat", max_turns=3))
    g = (await h.run([TASK], policy, rt, SamplingConfig(n=1), Taskset()))[0][0]
    assert len(g.turns) == 3 and g.verdict is not None
    assert g.verdict.reason == Reason.ERROR and "after 3 turns" in g.verdict.detail
    assert g.reward == 0.0 and rt.attempts == []  # nothing to re-check
    h2 = TacticLoopHarness(
        HarnessConfig(name="tactic-loop", prompt_format="chat", max_turns=8, max_total_tokens=60)
    )
    g2 = (await h2.run([TASK], policy, rt, SamplingConfig(n=1), Taskset()))[0][0]
    assert g2.verdict is not None and g2.verdict.reason == Reason.TRUNCATED
    assert g2.meta["tokens"] >= 60 and len(g2.turns) < 8


async def test_text_mode_context_is_a_growing_string() -> None:
    policy = ScriptedPolicy([], per_turn=["intro a\n", "omega\n"])
    rt = ScriptedRuntime()
    h = TacticLoopHarness(HarnessConfig(name="tactic-loop", prompt_format="deepseek"))
    r = (await h.run([TASK], policy, rt, SamplingConfig(n=1), Taskset()))[0][0]
    first, second = policy.calls[0][0], policy.calls[1][0]
    assert isinstance(first, str) and first.endswith("Next tactics:\n```lean4\n")
    assert second == first + "intro a\n" + r.turns[0].feedback
    assert r.turns[0].feedback.startswith("```\nGoals:")
    assert r.verdict is not None and r.verdict.accepted


async def test_runtime_without_tactic_mode_costs_attempts_not_the_run() -> None:
    from leanrl.runtime import Runtime

    class NoTactics(Runtime):
        name = "none"

        async def check(self, attempts):  # pragma: no cover - never reached
            raise AssertionError

    h = TacticLoopHarness(HarnessConfig(name="tactic-loop"))
    groups = await h.run(
        [TASK], ScriptedPolicy(["omega"]), NoTactics(), SamplingConfig(n=2), Taskset()
    )
    assert [r.verdict.reason for r in groups[0]] == [Reason.INFRA, Reason.INFRA]
    assert "tactic mode" in groups[0][0].verdict.detail


@pytest.mark.lean
async def test_tactic_loop_with_real_lean() -> None:
    from leanrl.environment import load_environment

    env = load_environment("core", harness="tactic-loop", runtime="local", limit=1)
    async with env:
        task = env.tasks()[0]
        policy = ScriptedPolicy(["```lean4\nomega\n```"])
        groups = await env.harness.run(
            [task], policy, env.runtime, SamplingConfig(n=1), env.taskset
        )
        v = groups[0][0].verdict
        assert v is not None and v.reason != Reason.INFRA  # Lean really ran the session


async def test_tiny_model_turns_keep_model_and_environment_tokens_apart(tiny_model_dir) -> None:
    from leanrl import PolicyConfig
    from leanrl.policies import make_policy

    policy = make_policy(PolicyConfig(model=str(tiny_model_dir)))
    await policy.start()
    rt = ScriptedRuntime()
    h = TacticLoopHarness(HarnessConfig(name="tactic-loop", prompt_format="chat", max_turns=2))
    groups = await h.run([TASK], policy, rt, SamplingConfig(n=2, max_tokens=8, seed=0), Taskset())
    for r in groups[0]:
        assert r.verdict is not None and len(r.turns) == 2  # random text: errors, then budget
        ids, mask, lps = r.token_ids_and_mask()
        assert r.meta["context"] == "ids"
        for t in r.turns:
            # A chat turn's feedback ids: end of turn, the user message, the generation prompt.
            assert len(t.feedback_ids) > len(policy.tokenize(t.feedback))
            assert t.feedback in policy.tokenizer.decode(t.feedback_ids)
            assert len(t.completion_ids) == len(t.logprobs or [])
        assert sum(mask) == sum(len(t.completion_ids) for t in r.turns)
        assert len(ids) - sum(mask) == sum(len(t.feedback_ids) for t in r.turns) > 0
        assert [lp is not None for lp in lps] == [m == 1 for m in mask]


@pytest.mark.parametrize("allow_native", [False, True])
async def test_tactics_are_prescanned_under_the_taskset_rules(allow_native: bool) -> None:
    # The local runtime on the stand-in REPL (tests/fake_repl.py parses one tactic per request).
    import sys
    from pathlib import Path

    from leanrl import RuntimeConfig, VerificationPolicy
    from leanrl.runtimes.local import LocalRuntime

    fake = [sys.executable, str(Path(__file__).with_name("fake_repl.py"))]
    rt = LocalRuntime(
        RuntimeConfig(workers=1, timeout_s=5.0, options={"repl_command": fake, "spares": 0})
    )
    policy = ScriptedPolicy(
        [],
        per_turn=[
            "```lean4\nrun_tac Lean.Elab.Tactic.evalTactic (← `(tactic| rfl))\n```",
            "```lean4\nintro x\nnative_decide\n```",
            "```lean4\nsimp\n```",
        ],
    )
    h = TacticLoopHarness(HarnessConfig(name="tactic-loop", prompt_format="chat", max_turns=3))
    rules = VerificationPolicy(allow_native_decide=allow_native)
    async with rt:
        groups = await h.run(
            [TASK], policy, rt, SamplingConfig(n=1), Taskset(TasksetConfig(policy=rules))
        )
    t = groups[0][0].turns
    assert t[0].feedback.startswith("Error: pre-scan") and "run_tac" in t[0].feedback
    if allow_native:  # the taskset's rules reached the session; the two lines ran as one tactic
        assert t[1].feedback.startswith("Goals:")
        assert t[2].feedback.startswith("No goals remain")
    else:
        assert t[1].feedback.startswith("Error: pre-scan") and "native_decide" in t[1].feedback


async def test_more_samples_than_processes_do_not_wait_forever() -> None:
    # One process in the pool, three episodes: a wave that opened all three sessions at once
    # would hold one process and wait forever for the next. Waves follow the runtime's room.
    import asyncio
    import sys
    from pathlib import Path

    from leanrl import RuntimeConfig
    from leanrl.runtimes.local import LocalRuntime

    fake = [sys.executable, str(Path(__file__).with_name("fake_repl.py"))]
    rt = LocalRuntime(
        RuntimeConfig(workers=1, timeout_s=5.0, options={"repl_command": fake, "spares": 0})
    )
    assert rt.max_tactic_sessions == 1
    h = TacticLoopHarness(HarnessConfig(name="tactic-loop", prompt_format="chat", max_turns=2))
    async with rt:
        run = h.run([TASK], ScriptedPolicy(["simp"]), rt, SamplingConfig(n=3), Taskset())
        # The guard only turns a hang into a failure; the run itself takes well under a second.
        (group,) = await asyncio.wait_for(run, timeout=120)
    assert [r.verdict.reason for r in group if r.verdict] == [Reason.OK] * 3


async def test_the_session_gets_the_tasksets_rules() -> None:
    from leanrl import VerificationPolicy

    rt = ScriptedRuntime()
    policy = ScriptedPolicy([], per_turn=["```lean4\nsimp\n```"])
    rules = VerificationPolicy(allow_native_decide=True)
    h = TacticLoopHarness(HarnessConfig(name="tactic-loop", prompt_format="chat", max_turns=1))
    async with rt:
        await h.run([TASK], policy, rt, SamplingConfig(n=1), Taskset(TasksetConfig(policy=rules)))
    assert rt.session_policies == [rules]


class _Watching(ScriptedRuntime):
    """Sets ``policy.release`` once ``after`` tactics have been applied."""

    def __init__(self, policy: HoldLastPolicy, after: int) -> None:
        super().__init__()
        self.policy, self.after, self.count = policy, after, 0

    def tactic_session(self, header: str, policy: Any = None) -> Any:
        cm = super().tactic_session(header, policy)
        rt = self

        class Wrapped:
            async def __aenter__(self) -> Any:
                s = await cm.__aenter__()
                inner = s.apply

                async def apply(state: int, tactic: str) -> Any:
                    out = await inner(state, tactic)
                    rt.count += 1
                    if rt.count >= rt.after:
                        rt.policy.release.set()
                    return out

                s.apply = apply
                return s

            async def __aexit__(self, *exc: Any) -> Any:
                return await cm.__aexit__(*exc)

        return Wrapped()


async def test_a_streamed_turn_applies_each_tactic_as_its_completion_arrives() -> None:
    # The last completion of the turn is held back until the others' tactics were applied:
    # waiting for the whole batch first would never finish (the guard turns that into a
    # failure instead of a hang).
    policy = HoldLastPolicy(["omega"])
    rt = _Watching(policy, after=2)
    h = TacticLoopHarness(HarnessConfig(name="tactic-loop", prompt_format="chat", max_turns=2))
    groups = await asyncio.wait_for(
        h.run([TASK], policy, rt, SamplingConfig(n=3, seed=1), Taskset(TasksetConfig())), 30
    )
    assert policy.streams == 1 and rt.count == 3
    assert [r.reward for r in groups[0]] == [1.0, 1.0, 1.0]
    assert all(r.verdict is not None and r.verdict.accepted for r in groups[0])


async def test_streamed_and_batched_turns_record_the_same_rollouts() -> None:
    script = ["```lean4\nintro y\n```", "```lean4\nfoo\n```", "omega"]
    got = []
    for replays in (True, False):
        policy = HoldLastPolicy([], per_turn=script, replays=replays)
        policy.release.set()
        h = TacticLoopHarness(HarnessConfig(name="tactic-loop", prompt_format="chat", max_turns=5))
        groups = await h.run(
            [TASK], policy, ScriptedRuntime(), SamplingConfig(n=2, seed=3), Taskset()
        )
        assert policy.streams == (3 if replays else 0)  # one stream per turn, or none
        got.append(
            [(r.proof, r.reward, [(t.completion, t.feedback) for t in r.turns]) for r in groups[0]]
        )
    assert got[0] == got[1]
