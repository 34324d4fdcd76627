"""The external harness: a real agent program (tests/agents/openai_agent.py, the `openai`
client and httpx) per episode against the loopback endpoint; recorded turns are token-exact;
bounds (time, turns, tokens) hold; a crash or hang costs its episode only; the endpoint speaks
OpenAI's chat API to the real client (also as the `openai` backend of the tool-use harness)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from leanrl import HarnessConfig, Reason, SamplingConfig, Task, Taskset
from leanrl.errors import ConfigError
from leanrl.harnesses.external import ExternalHarness
from leanrl.harnesses.external.endpoint import Endpoint
from leanrl.harnesses.external.session import Session
from leanrl.harnesses.tool_use.chat import ChatFormat, TokenBackend
from leanrl.harnesses.tool_use.lean_tools import LeanTools
from leanrl.verdict import VerificationPolicy
from tests._scripted_runtime import ScriptedRuntime
from tests._tool_models import ScriptedToolPolicy, call, make_tool_model

pytest.importorskip("openai")
pytest.importorskip("uvicorn")

TASK = Task(
    name="t1",
    header="import Mathlib\n\n",
    formal_statement="theorem t1 (x : ℕ) (h : x + 1 = 2) : x = 1 := by",
)
AGENT = [sys.executable, str(Path(__file__).parent / "agents" / "openai_agent.py")]
SOLVE = [call("goals", proof_so_far="intro y"), call("submit", proof="omega")]


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(make_tool_model(tmp_path_factory.mktemp("tool-model")))


def _harness(command: list[str], max_turns: int = 6, **options: Any) -> ExternalHarness:
    options.setdefault("timeout_s", 120.0)
    return ExternalHarness(
        HarnessConfig(name="external", max_turns=max_turns, options={"command": command, **options})
    )


async def test_an_agent_program_solves_through_the_endpoint(tok: Any) -> None:
    rt = ScriptedRuntime()
    policy = ScriptedToolPolicy(tok, SOLVE)
    (group,) = await _harness(AGENT).run([TASK], policy, rt, SamplingConfig(n=2), Taskset())
    for r in group:
        assert r.verdict is not None and r.verdict.accepted and r.reward == 1.0, r.meta
        assert r.proof == "\n  omega" and r.meta["exit_code"] == 0
        assert r.meta["requests"] == 2 and r.meta["segments"] == 1 and r.meta["turns"] == 2
        assert r.meta["tools"] == {"goals": 1, "submit": 1}
        # token-exact: the recorded ids are the template's rendering of the agent's
        # conversation, the model's turns (tool-call tokens included) with loss, the rest without
        ids, mask, lps = r.token_ids_and_mask()
        assert [lp is not None for lp in lps] == [m == 1 for m in mask]
        assert sum(mask) == sum(len(t.completion_ids) for t in r.turns)
        text = tok.decode(r.prompt_ids + ids)
        assert text.count("<tool_call>") >= 3  # the template's example + the model's two calls
        assert "<tool_response>\nGoals:" in r.turns[0].feedback
        assert text.endswith("</tool_call><|im_end|>")
    assert len(rt.attempts) == 2  # one judged proof per episode


async def test_a_crash_costs_its_episode_only(tok: Any) -> None:
    h = _harness(AGENT, env={"AGENT_MODE": "crash", "AGENT_ONLY_SAMPLE": "1"})
    (group,) = await h.run(
        [TASK], ScriptedToolPolicy(tok, SOLVE), ScriptedRuntime(), SamplingConfig(n=2), Taskset()
    )
    ok, crashed = group
    assert ok.reward == 1.0
    assert crashed.verdict is not None and crashed.verdict.reason == Reason.NO_PROOF
    assert "exited with status 3" in crashed.verdict.detail and crashed.meta["exit_code"] == 3
    assert crashed.meta["requests"] == 1 and crashed.meta["turns"] == 1  # its turn is kept


async def test_a_hanging_program_and_its_children_are_killed(tmp_path: Path, tok: Any) -> None:
    pid_file = tmp_path / "child.pid"
    prog = (
        "import subprocess, sys, time; "
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
        f"open({str(pid_file)!r}, 'w').write(str(c.pid)); time.sleep(600)"
    )
    h = _harness([sys.executable, "-c", prog], timeout_s=2.0)
    t0 = time.perf_counter()
    (group,) = await h.run(
        [TASK], ScriptedToolPolicy(tok, SOLVE), ScriptedRuntime(), SamplingConfig(), Taskset()
    )
    assert time.perf_counter() - t0 < 30
    r = group[0]
    assert r.meta["timed_out"] and "time limit" in (r.verdict.detail if r.verdict else "")
    child = int(pid_file.read_text())
    for _ in range(100):
        if not _alive(child):
            break
        time.sleep(0.05)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


async def test_a_program_that_cannot_start_is_one_failed_episode(tok: Any) -> None:
    h = _harness(["/no/such/agent-program"])
    (group,) = await h.run(
        [TASK], ScriptedToolPolicy(tok, SOLVE), ScriptedRuntime(), SamplingConfig(), Taskset()
    )
    assert "could not start" in (group[0].verdict.detail if group[0].verdict else "")


async def test_turn_budget_refuses_further_requests(tok: Any) -> None:
    forever = [call("goals", proof_so_far="intro y")]  # never submits
    h = _harness(AGENT, max_turns=3, env={"AGENT_MODE": "greedy"})
    (group,) = await h.run(
        [TASK], ScriptedToolPolicy(tok, forever), ScriptedRuntime(), SamplingConfig(), Taskset()
    )
    r = group[0]
    assert r.meta["requests"] == 3 and r.meta["refused_requests"] == 1
    assert r.verdict is not None and r.verdict.reason == Reason.NO_PROOF


async def test_stdout_is_read_when_nothing_is_submitted_and_streams_work(tok: Any) -> None:
    h = _harness(AGENT, env={"AGENT_MODE": "stdout"})
    (group,) = await h.run(
        [TASK], ScriptedToolPolicy(tok, SOLVE), ScriptedRuntime(), SamplingConfig(), Taskset()
    )
    assert group[0].proof == "\n  omega" and group[0].meta["requests"] == 0
    h = _harness(AGENT, env={"AGENT_MODE": "stream"})
    (group,) = await h.run(
        [TASK], ScriptedToolPolicy(tok, SOLVE), ScriptedRuntime(), SamplingConfig(), Taskset()
    )
    assert group[0].reward == 1.0 and group[0].meta["requests"] == 2


async def test_a_failing_policy_fails_the_run_not_just_the_episodes(tok: Any) -> None:
    from leanrl.errors import PolicyError

    class Broken(ScriptedToolPolicy):
        async def generate_from_ids(self, prompt_ids: Any, sampling: Any) -> Any:
            raise PolicyError("the model is gone")

    h = _harness(AGENT)
    with pytest.raises(PolicyError, match="the model is gone"):
        await h.run([TASK], Broken(tok, SOLVE), ScriptedRuntime(), SamplingConfig(), Taskset())


def test_the_command_is_required() -> None:
    with pytest.raises(ConfigError, match="command"):
        ExternalHarness(HarnessConfig(name="external")).check_config()
    with pytest.raises(ConfigError, match="timeout_s"):
        _harness(AGENT, timeout_s=-1).check_config()


# -- the endpoint on its own -----------------------------------------------------------------------


async def _endpoint(tok: Any, script: list[str]) -> tuple[Endpoint, Session, ScriptedRuntime]:
    policy = ScriptedToolPolicy(tok, script)
    fmt = ChatFormat(tok, [])
    ep = Endpoint(policy, SamplingConfig(), TokenBackend(policy, fmt, ids=True), fmt, "hermes")
    await ep.start()
    rt = ScriptedRuntime()
    import asyncio

    tools = LeanTools(TASK, rt, VerificationPolicy(), asyncio.Semaphore(2))
    s = Session(0, TASK, tools, max_turns=5, max_total_tokens=10_000, max_tool_calls=4)
    ep.open(s)
    return ep, s, rt


async def test_keys_histories_and_tools_over_http(tok: Any) -> None:
    ep, s, _ = await _endpoint(tok, [call("goals", proof_so_far=""), "plain answer"])
    base = ep.base_url
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            auth = {"Authorization": f"Bearer {s.key}"}
            bad = await client.get(f"{base}/v1/models", headers={"Authorization": "Bearer nope"})
            assert bad.status_code == 401
            task = (await client.get(f"{base}/leanrl/task", headers=auth)).json()
            assert task["formal_statement"] == TASK.formal_statement
            tools = (await client.get(f"{base}/leanrl/tools", headers=auth)).json()
            assert [t["function"]["name"] for t in tools] == ["check", "goals", "search", "submit"]
            msgs: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
            one = (
                await client.post(
                    f"{base}/v1/chat/completions",
                    headers=auth,
                    json={"model": "m", "messages": msgs, "tools": tools},
                )
            ).json()
            reply = one["choices"][0]["message"]
            assert one["choices"][0]["finish_reason"] == "tool_calls"
            (tc,) = reply["tool_calls"]
            assert tc["function"]["name"] == "goals"
            assert json.loads(tc["function"]["arguments"]) == {"proof_so_far": ""}
            result = (
                await client.post(
                    f"{base}/leanrl/tools/goals", headers=auth, json={"proof_so_far": ""}
                )
            ).json()
            assert result["ok"] and result["result"].startswith("Goals:")
            # the history comes back re-spelt (arguments re-serialised, content null): same turn
            tc2 = {**tc, "function": {**tc["function"], "arguments": '{"proof_so_far":""}'}}
            msgs += [
                {"role": "assistant", "content": None, "tool_calls": [tc2]},
                {"role": "tool", "tool_call_id": tc["id"], "content": result["result"]},
            ]
            two = await client.post(
                f"{base}/v1/chat/completions",
                headers=auth,
                json={"model": "m", "messages": msgs, "tools": tools},
            )
            assert two.json()["choices"][0]["message"]["content"] == "plain answer"
            assert len(s.segments) == 1 and len(s.segments[0].turns) == 2
            # a rewritten history is another segment
            three = await client.post(
                f"{base}/v1/chat/completions",
                headers=auth,
                json={"model": "m", "messages": [{"role": "user", "content": "other"}]},
            )
            assert three.status_code == 200 and len(s.segments) == 2
            assert s.best() is s.segments[0]
            n2 = await client.post(
                f"{base}/v1/chat/completions",
                headers=auth,
                json={"model": "m", "messages": msgs, "n": 2},
            )
            assert n2.status_code == 400 and "n must be 1" in n2.text
            ep.close_session(s)
            gone = await client.get(f"{base}/leanrl/task", headers=auth)
            assert gone.status_code == 401
    finally:
        await ep.close()


async def test_the_endpoint_is_the_openai_backend_of_the_tool_use_harness(tok: Any) -> None:
    # The tool-use harness's `messages` mode (the openai backend: structured tool_calls, no
    # token ids here) against a real OpenAI-compatible server: this endpoint.
    from leanrl.harnesses.tool_use import ToolUseHarness
    from leanrl.policies.openai import OpenAIPolicy
    from leanrl.policy import PolicyConfig

    ep, s, _ = await _endpoint(tok, SOLVE)
    os.environ["LEANRL_TEST_KEY"] = s.key
    try:
        policy = OpenAIPolicy(
            PolicyConfig(
                model="m",
                backend="openai",
                base_url=f"{ep.base_url}/v1",
                api_key_env="LEANRL_TEST_KEY",
            )
        )
        h = ToolUseHarness(HarnessConfig(name="tool-use", max_turns=4))
        rt = ScriptedRuntime()
        (group,) = await h.run([TASK], policy, rt, SamplingConfig(), Taskset())
        await policy.close()
    finally:
        os.environ.pop("LEANRL_TEST_KEY", None)
        await ep.close()
    r = group[0]
    assert r.meta["context"] == "messages"
    assert r.reward == 1.0 and r.meta["tools"] == {"goals": 1, "submit": 1}
    assert '"name": "goals"' in r.turns[0].completion and "Goals:" in r.turns[0].feedback
