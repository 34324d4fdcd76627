"""The tool-use harness: tool calls in the template's format, token-exact rollouts, budgets,
errors as turns, rewards only from the judge; Lean tools on the stand-in REPL (real child
processes that prove nothing); Countdown's calculator; GRPO and the hf backend on a tiny model."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from leanrl import HarnessConfig, Reason, SamplingConfig, Task, Taskset
from leanrl.errors import ConfigError
from leanrl.harnesses.tool_use import ToolUseHarness, detect_parser, parse_turn
from leanrl.harnesses.tool_use.countdown_tools import CountdownTools
from leanrl.harnesses.tool_use.lean_tools import (
    check_code,
    goals_after,
    read_submission,
    search_lean,
    stand_in_sorries,
)
from leanrl.harnesses.tool_use.templates import HERMES_TOOL_TEMPLATE
from leanrl.runtime import RuntimeConfig
from leanrl.verdict import Verdict, VerificationPolicy
from tests._scripted_runtime import ScriptedRuntime
from tests._tool_models import ScriptedTextPolicy, ScriptedToolPolicy, call, make_tool_model

TASK = Task(
    name="t1",
    header="import Mathlib\n\n",
    formal_statement="theorem t1 (x : ℕ) (h : x + 1 = 2) : x = 1 := by",
)
FAKE = [sys.executable, str(Path(__file__).with_name("fake_repl.py"))]


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tool_model(tmp_path_factory.mktemp("tool-model"))


@pytest.fixture(scope="module")
def tok(tool_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tool_model)


def _harness(**options: Any) -> ToolUseHarness:
    turns = options.pop("max_turns", 6)
    tokens = options.pop("max_total_tokens", 100_000)
    return ToolUseHarness(
        HarnessConfig(name="tool-use", max_turns=turns, max_total_tokens=tokens, options=options)
    )


# -- reading calls ---------------------------------------------------------------------------


def test_hermes_calls_content_and_malformed_ones() -> None:
    text = (
        'Thinking.\n<tool_call>\n{"name": "goals", "arguments": {"proof_so_far": "intro"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "check", "arguments": "{\\"code\\": \\"x\\"}"}\n'
        "</tool_call><tool_call>{not json}</tool_call><tool_call>[1]</tool_call>"
        '<tool_call>{"name": "x", "arguments": 3}</tool_call><tool_call>{"name": "y"'
    )
    p = parse_turn(text, "hermes", turn=2)
    assert p.content == "Thinking."
    assert [c.id for c in p.calls] == [f"call_2_{k}" for k in range(6)]
    assert (p.calls[0].name, p.calls[0].arguments) == ("goals", {"proof_so_far": "intro"})
    assert (p.calls[1].name, p.calls[1].arguments) == ("check", {"code": "x"})  # args as a string
    assert "not JSON" in (p.calls[2].error or "")
    assert "JSON object" in (p.calls[3].error or "")
    assert "must be a JSON object" in (p.calls[4].error or "")
    assert "never closed" in (p.calls[5].error or "")
    assert parse_turn("no calls here", "hermes").calls == ()


def test_mistral_and_llama3_layouts() -> None:
    m = parse_turn('ok [TOOL_CALLS] [{"name": "calc", "arguments": {"expr": "1"}}]', "mistral")
    assert m.content == "ok" and m.calls[0].arguments == {"expr": "1"}
    ll = parse_turn(
        '<|python_tag|>{"name": "calc", "parameters": {"expr": "2;3"}}; {"name": "submit", '
        '"parameters": {"expr": "4"}}',
        "llama3-json",
    )
    assert [(c.name, c.arguments) for c in ll.calls] == [
        ("calc", {"expr": "2;3"}),
        ("submit", {"expr": "4"}),
    ]
    assert parse_turn("The answer is 4.", "llama3-json").calls == ()


def test_the_parser_comes_from_the_template() -> None:
    assert detect_parser(HERMES_TOOL_TEMPLATE) == "hermes"
    assert detect_parser("{{ '[TOOL_CALLS]' }}") == "mistral"
    assert detect_parser("<|python_tag|>{{ x }}") == "llama3-json"
    with pytest.raises(ConfigError, match="tool_parser"):
        detect_parser("{% for m in messages %}{{ m.content }}{% endfor %}")
    with pytest.raises(ConfigError, match="no chat template"):
        detect_parser(None)


def test_options_are_checked_up_front() -> None:
    with pytest.raises(ConfigError, match="unknown harness option"):
        _harness(tool_parsr="hermes")
    with pytest.raises(ConfigError, match="tool_parser"):
        _harness(tool_parser="xml").check_config()
    with pytest.raises(ConfigError, match="max_tool_calls"):
        _harness(max_tool_calls=0).check_config()
    with pytest.raises(ConfigError, match="prompt-format"):
        ToolUseHarness(HarnessConfig(name="tool-use", prompt_format="kimina")).check_config()


# -- episodes with the scripted policy -----------------------------------------------------------


async def test_rollouts_are_token_exact_and_tool_results_carry_no_loss(tok: Any) -> None:
    script = [
        "Let me see the goal.\n" + call("goals", proof_so_far="intro y"),
        call("check", code="intro y") + "\n" + call("search", query="Nat.add_comm"),
        call("submit", proof="omega"),
    ]
    policy = ScriptedToolPolicy(tok, script)
    rt = ScriptedRuntime()
    groups = await _harness().run([TASK], policy, rt, SamplingConfig(n=2), Taskset())
    for r in groups[0]:
        assert r.verdict is not None and r.verdict.accepted and r.reward == 1.0
        assert r.proof == "\n  omega" and rt.attempts[-1].proof == "\n  omega"
        assert [len(t.feedback_ids) > 0 for t in r.turns] == [True, True, False]
        assert r.meta["tools"] == {"goals": 1, "check": 1, "search": 1, "submit": 1}
        assert r.meta["context"] == "ids"
        ids, mask, lps = r.token_ids_and_mask()
        turn_ids = [t.completion_ids for t in r.turns]
        assert mask == [
            m for t in r.turns for m in [1] * len(t.completion_ids) + [0] * len(t.feedback_ids)
        ]
        assert [lp is not None for lp in lps] == [m == 1 for m in mask]
        # the model's tokens include the template's tool-call tokens as it wrote them
        assert all(tok.decode(t).startswith(("Let", "<tool_call>")) for t in turn_ids)
        # the whole sequence is the template's rendering of the conversation: the model's
        # turns as it wrote them, the tool results as tool messages
        convo = [m.model_dump() for m in r.prompt]
        for t in r.turns:
            convo.append({"role": "assistant", "content": t.completion})
            for result in re.findall(r"<tool_response>\n(.*?)\n</tool_response>", t.feedback, re.S):
                convo.append({"role": "tool", "content": result})
        text = tok.decode(r.prompt_ids + ids)
        rendered = tok.apply_chat_template(convo, tools=_schemas(), tokenize=False)
        assert text + "\n" == rendered
        assert "<tool_response>\nGoals:\n⊢" in text and "Error" not in text
        assert text.endswith("</tool_call><|im_end|>")


def _schemas() -> list[dict[str, Any]]:
    from leanrl.harnesses.tool_use.lean_tools import lean_tools

    return [t.schema() for t in lean_tools()]


async def test_errors_are_turns_and_budgets_hold(tok: Any) -> None:
    script = [
        "<tool_call>{broken</tool_call>",
        call("nope", x=1),
        call("goals", wrong="a"),
        call("goals", proof_so_far="intro a"),
        call("goals", proof_so_far="intro b"),
        call("submit", proof="intro c"),
    ]
    policy = ScriptedToolPolicy(tok, script)
    h = _harness(max_tool_calls=1, max_turns=6)
    (group,) = await h.run([TASK], policy, ScriptedRuntime(), SamplingConfig(), Taskset())
    r = group[0]
    fb = [t.feedback for t in r.turns]
    assert "not JSON" in fb[0]
    assert "there is no tool 'nope'" in fb[1]
    assert "takes no argument 'wrong'" in fb[2] or "needs the argument" in fb[2]
    assert "Goals:" in fb[3]  # the one call the budget allows
    assert "tool budget (1 calls) is spent" in fb[4]
    # submit stays open past the budget; the judge rejects what the tools never checked
    assert r.verdict is not None and r.verdict.reason == Reason.ERROR and r.reward == 0.0


async def test_turn_and_token_budgets_end_episodes(tok: Any) -> None:
    policy = ScriptedToolPolicy(tok, [call("goals", proof_so_far="intro a")])
    (group,) = await _harness(max_turns=2).run(
        [TASK], policy, ScriptedRuntime(), SamplingConfig(), Taskset()
    )
    assert group[0].verdict is not None and group[0].verdict.reason == Reason.NO_PROOF
    assert len(group[0].turns) == 2 and "2 turns" in group[0].verdict.detail
    (group,) = await _harness(max_total_tokens=60).run(
        [TASK], policy, ScriptedRuntime(), SamplingConfig(), Taskset()
    )
    assert group[0].verdict is not None and group[0].verdict.reason == Reason.TRUNCATED
    assert group[0].meta["tokens"] >= 60


async def test_a_turn_without_a_call_is_read_as_the_answer(tok: Any) -> None:
    policy = ScriptedToolPolicy(
        tok, ["Done:\n```lean4\ntheorem t1 (x : ℕ) (h : x + 1 = 2) : x = 1 := by\n  omega\n```"]
    )
    (group,) = await _harness().run([TASK], policy, ScriptedRuntime(), SamplingConfig(), Taskset())
    assert group[0].proof == "\n  omega" and group[0].reward == 1.0
    policy = ScriptedToolPolicy(tok, ["I give up."])
    (group,) = await _harness().run([TASK], policy, ScriptedRuntime(), SamplingConfig(), Taskset())
    assert group[0].verdict is not None and group[0].verdict.reason == Reason.NO_PROOF


class _Refusing(ScriptedRuntime):
    """Tactic sessions say the proof is complete; the judge rejects every attempt."""

    async def check(self, attempts: Any) -> list[Verdict]:
        await super().check(attempts)
        return [Verdict.reject(Reason.AXIOM, "depends on a bad axiom", id=a.id) for a in attempts]


async def test_the_reward_comes_only_from_the_judge(tok: Any) -> None:
    script = [call("goals", proof_so_far="omega"), call("submit", proof="omega")]
    rt = _Refusing()
    (group,) = await _harness().run(
        [TASK], ScriptedToolPolicy(tok, script), rt, SamplingConfig(), Taskset()
    )
    r = group[0]
    assert "No goals remain" in r.turns[0].feedback  # the tool said the proof was done
    assert r.verdict is not None and r.verdict.reason == Reason.AXIOM and r.reward == 0.0
    assert len(rt.attempts) == 1  # the submitted proof went to the judge, once


async def test_text_mode_for_policies_without_ids(tok: Any) -> None:
    policy = ScriptedTextPolicy(
        tok, [call("goals", proof_so_far=""), call("submit", proof="omega")]
    )
    (group,) = await _harness().run([TASK], policy, ScriptedRuntime(), SamplingConfig(), Taskset())
    assert group[0].reward == 1.0 and group[0].meta["context"] == "text"


class _Slow(ScriptedRuntime):
    """Each tactic session takes 0.3 s to open (a busy pool)."""

    def tactic_session(self, header: str, policy: Any = None) -> Any:
        from contextlib import asynccontextmanager

        @asynccontextmanager
        async def slow() -> Any:
            await asyncio.sleep(0.3)
            async with super(_Slow, self).tactic_session(header, policy) as s:
                yield s

        return slow()


async def test_a_policy_without_a_tokenizer_gets_its_models(tool_model: Path, tok: Any) -> None:
    # GRPO's vLLM server policy generates from ids and carries no tokenizer: the harness loads
    # the model's and stays token-exact
    from leanrl.policy import PolicyConfig

    policy = ScriptedToolPolicy(tok, [call("submit", proof="omega")])
    policy.tokenizer = None
    policy.config = PolicyConfig(model=str(tool_model))
    (group,) = await _harness().run([TASK], policy, ScriptedRuntime(), SamplingConfig(), Taskset())
    assert group[0].meta["context"] == "ids" and group[0].reward == 1.0
    assert len(group[0].prompt_ids) > 10


async def test_pending_turns_of_all_episodes_go_to_the_policy_together(tok: Any) -> None:
    # 6 episodes x 3 turns: the turns pending at once are one batched call, not 18 calls
    script = [
        call("goals", proof_so_far=""),
        call("goals", proof_so_far="intro a"),
        call("submit", proof="omega"),
    ]
    policy = ScriptedToolPolicy(tok, script)
    (group,) = await _harness().run([TASK], policy, _Slow(), SamplingConfig(n=6), Taskset())
    assert all(r.reward == 1.0 for r in group)
    assert policy.calls <= 6, policy.calls
    assert all(r.timings["tools"] >= 0.59 and r.meta["tool_calls"] == 3 for r in group)


async def test_runtime_without_tactic_sessions_is_refused_for_lean_tools(tok: Any) -> None:
    from leanrl.environments.countdown import CountdownChecker

    policy = ScriptedToolPolicy(tok, ["x"])
    with pytest.raises(ConfigError, match="tactic sessions"):
        await _harness(tools="lean").run(
            [TASK], policy, CountdownChecker(), SamplingConfig(), Taskset()
        )


# -- the Lean tools on the stand-in REPL ---------------------------------------------------------


def test_sorries_are_stood_in_for_by_goal_showing_failures() -> None:
    code = (
        "theorem a (x : ℕ) : x = x := by\n  have h : 1 = 1 := by sorry\n  exact sorry\n"
        "theorem b : True := sorry -- sorry in a comment\n"
        "example : True := by\n  cases 1 with\n  | zero => sorry\n  | succ n => exact (fun _ => sorry) 0\n"
        'def s := "sorry"\n'
    )
    out, lines = stand_in_sorries(code)
    assert "sorry" not in out.replace("-- sorry in a comment", "").replace('"sorry"', "")
    assert "have h : 1 = 1 := by done " in out
    assert "exact (by done)" in out and "True := (by done)" in out
    assert "| zero => done " in out and "(fun _ => (by done))" in out
    assert lines == {2, 3, 4, 7, 8}


def test_a_submission_is_read_like_a_completion() -> None:
    assert read_submission("  omega\n", TASK).proof == "\n  omega"
    full = read_submission(
        "lemma helper : 1 = 1 := rfl\n\ntheorem t1 (x : ℕ) (h : x + 1 = 2) : x = 1 := by\n  omega",
        TASK,
    )
    assert full.proof is not None and "omega" in full.proof and "helper" in full.preamble
    assert read_submission("   ", TASK).reason == Reason.NO_PROOF


async def test_lean_tools_through_the_pool_on_the_stand_in_repl() -> None:
    from leanrl.runtimes.local import LocalRuntime

    rt = LocalRuntime(
        RuntimeConfig(workers=1, timeout_s=10.0, options={"repl_command": FAKE, "spares": 0})
    )
    rules = VerificationPolicy()
    async with rt:
        text, ok = await goals_after(rt, TASK, "intro y", rules)
        assert ok and text.startswith("Goals:")  # the stand-in's goal: plumbing, not Lean
        text, ok = await goals_after(
            rt, TASK, "run_tac Lean.Elab.Tactic.evalTactic (← `(tactic| rfl))", rules
        )
        assert not ok and "pre-scan" in text and "run_tac" in text
        text, ok = await check_code(rt, TASK, "theorem x : True := by\n  native_decide", rules)
        assert not ok and "pre-scan" in text
        msg = '-- fake: {"messages": [{"severity": "error", "pos": {"line": 2, "column": 2}, "data": "unknown identifier \'foo\'"}]}'
        text, ok = await check_code(rt, TASK, f"{msg}\ntheorem x : True := by\n  exact foo", rules)
        assert not ok and "error 2:2: unknown identifier 'foo'" in text
        text, ok = await check_code(
            rt, TASK, "import Mathlib\ntheorem y : True := by\n  trivial", rules
        )
        assert text.startswith("import lines were left out")
        text, ok = await search_lean(rt, TASK.header, "Nat.add_comm\nx", rules)
        assert not ok and "one line" in text
        text, ok = await search_lean(rt, TASK.header, "#eval 1", rules)
        assert not ok  # a command smuggled in as a proposition meets the pre-scan


# -- Countdown's calculator ------------------------------------------------------------------------


async def test_countdown_calc_and_submit() -> None:
    tools = CountdownTools(calc_first=True)
    assert (await tools.call("calc", {"expr": "(25 - 5) * 3"})).text == "= 60"
    assert (await tools.call("calc", {"expr": "7 / 2"})).text.startswith("= 7/2")
    assert not (await tools.call("calc", {"expr": "__import__('os')"})).ok
    fresh = CountdownTools(calc_first=True)
    refused = await fresh.call("submit", {"expr": "1 + 2"})
    assert not refused.ok and "calc" in refused.text and fresh.answer is None
    assert not (await fresh.call("calc", {"expr": "1 +"})).ok  # a failed calc counts for nothing
    assert not (await fresh.call("submit", {"expr": "1 + 2"})).ok
    assert (await tools.call("submit", {"expr": "(25-5)*3"})).submitted
    assert tools.answer is not None and tools.answer.proof == "(25-5)*3"


async def test_countdown_environment_runs_the_tool_harness(tool_model: Path, tok: Any) -> None:
    from leanrl import load_environment

    env = load_environment("countdown", harness="tool-use", limit=2)
    env.config.harness.options = {"reward": "paper"}
    assert isinstance(env.harness, ToolUseHarness)
    task = env.tasks()[0]
    nums, target = task.extra["numbers"], task.extra["target"]
    good = task.extra["solution"]
    script = [call("calc", expr=f"{nums[0]} + {nums[1]}"), call("submit", expr=good)]
    async with env:
        (group,) = await env.rollout([task], ScriptedToolPolicy(tok, script), SamplingConfig())
    r = group[0]
    assert r.turns[0].feedback.count(f"= {nums[0] + nums[1]}") == 1
    assert r.verdict is not None and r.verdict.accepted, (good, target)
    assert r.reward == 1.0


# -- real backends -----------------------------------------------------------------------------


async def test_hf_policy_episode_on_a_tiny_model(tool_model: Path) -> None:
    from leanrl.policies.hf import HFPolicy
    from leanrl.policy import PolicyConfig

    policy = HFPolicy(PolicyConfig(model=str(tool_model), device="cpu"))
    await policy.start()
    (group,) = await _harness(max_turns=2).run(
        [TASK], policy, ScriptedRuntime(), SamplingConfig(n=2, max_tokens=8, seed=1), Taskset()
    )
    for r in group:
        assert r.meta["context"] == "ids" and r.turns
        _, mask, lps = r.token_ids_and_mask()
        assert sum(mask) == sum(len(t.completion_ids) for t in r.turns) > 0
        assert all(lp is not None for lp, m in zip(lps, mask, strict=True) if m)
        assert r.turns[0].completion_ids and len(r.prompt_ids) > 10


async def test_grpo_trains_on_tool_rollouts(tool_model: Path, tmp_path: Path) -> None:
    """Two GRPO steps on Countdown through the tool-use harness with a tiny model: the tool
    results' tokens carry no loss and a step trains (the learning check is in benchmarks/)."""
    from leanrl.environment import EnvironmentConfig
    from leanrl.policy import PolicyConfig
    from leanrl.train.grpo import GRPOConfig, GRPOTrainer

    cfg = GRPOConfig(
        policy=PolicyConfig(model=str(tool_model)),
        env=EnvironmentConfig(
            id="countdown",
            harness=HarnessConfig(name="tool-use", max_turns=2, options={"reward": "dense"}),
        ),
        sampling=SamplingConfig(max_tokens=6, top_p=1.0, seed=0),
        out=tmp_path / "run",
        steps=2,
        tasks_per_step=2,
        group_size=2,
        lr=1e-3,
        save_every=2,
        dynamic_sampling="off",
        mask_truncated=False,
    )
    trainer = GRPOTrainer(cfg)
    await asyncio.to_thread(trainer.train_sync)
    rows = [r for r in trainer.run.metrics() if "reward_mean" in r]
    assert len(rows) == 2
