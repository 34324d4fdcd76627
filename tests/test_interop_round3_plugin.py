"""The verifiers plugin uses each environment's own harness (issue 37, items 1 and 6).

Countdown through ``vf-eval leanrl-verifiers --env.taskset.env countdown`` gets Countdown's
prompt and ``<answer>`` extraction and reward (it used to get the Lean prompt and score a correct
answer 0.0); a reply's finish reason reaches the harness (a cut-off Lean reply is ``truncated``,
as in ``leanrl eval``); a runtime that cannot start raises ``LeanrlInfraError``. Against the
real ``verifiers`` package; Lean checks go to the scripted test runtime (never Lean).
"""

from __future__ import annotations

import importlib.util
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

for _mod, _why in (
    ("verifiers", "verifiers is not installed (pip install -e '.[verifiers]', Python 3.11+)"),
    ("fastapi", "the stand-in model endpoint needs fastapi (pip install -e '.[serve]')"),
    ("uvicorn", "the stand-in model endpoint needs uvicorn (pip install -e '.[serve]')"),
):
    if importlib.util.find_spec(_mod) is None:
        pytest.skip(_why, allow_module_level=True)

import uvicorn  # noqa: E402
import verifiers.v1 as vf  # noqa: E402
from _scripted_runtime import ScriptedPolicy  # noqa: E402
from fastapi import FastAPI, Request  # noqa: E402
from test_verifiers_eval import vf_eval  # noqa: E402

from leanrl import SamplingConfig, load_environment  # noqa: E402
from leanrl.errors import ConfigError  # noqa: E402
from leanrl.harness import HarnessConfig  # noqa: E402
from leanrl.interop.verifiers_plugin import (  # noqa: E402
    LeanrlInfraError,
    LeanrlTask,
    LeanrlTaskset,
    LeanrlTasksetConfig,
)

SCRIPTED = "_scripted_runtime:ScriptedRuntime"


def config(**kw: Any) -> LeanrlTasksetConfig:
    kw.setdefault("id", "leanrl-verifiers")
    return LeanrlTasksetConfig(**kw)


def trace_for(task: LeanrlTask, reply: str, finish: str | None = "stop") -> vf.Trace:
    """A trace as a verifiers rollout leaves it: the prompt, the sampled reply, the call."""
    nodes = [
        vf.MessageNode(message={"role": "user", "content": task.data.prompt_text}),
        vf.MessageNode(parent=0, sampled=True, message={"role": "assistant", "content": reply}),
    ]
    return vf.Trace(
        task=vf.TraceTask(type=type(task).__name__, data=task.data),
        agent=vf.AgentInfo(config=vf.AgentConfig()),
        nodes=nodes,
        calls=[vf.ModelCall(node=1, finish_reason=finish)],
    )


def solution_of(prompt: str, solutions: dict[tuple[tuple[int, ...], int], str]) -> str | None:
    m = re.search(r"numbers \[([\d, ]+)\], create an equation that equals (-?\d+)", prompt)
    if m is None:
        return None
    key = (tuple(int(x) for x in m.group(1).split(",")), int(m.group(2)))
    return solutions.get(key)


def countdown_solutions() -> dict[tuple[tuple[int, ...], int], str]:
    tasks = load_environment("countdown", limit=3).tasks()
    return {(tuple(t.extra["numbers"]), t.extra["target"]): str(t.extra["solution"]) for t in tasks}


async def test_countdown_tasks_carry_countdowns_prompt_and_score_its_answers() -> None:
    ts = LeanrlTaskset(config(env="countdown", limit=3))
    tasks = list(ts)
    assert len(tasks) == 3
    t = tasks[0]
    assert t.data.system_prompt is None  # Countdown's prompt has no system turn
    assert "Using the numbers" in t.data.prompt_text and "Lean" not in t.data.prompt_text
    assert t.data.prompt_text.endswith("<think>")  # the TinyZero prompt, as `leanrl eval` sends
    assert t.data.env == "countdown"
    solution = str(t.data.leanrl_task["extra"]["solution"])
    good = trace_for(t, f"Let me add.</think>\n<answer> {solution} </answer>")
    await t.score(good)
    assert good.rewards["leanrl"].score == 1.0
    assert good.info["leanrl_verdict"]["accepted"] is True
    wrong = trace_for(t, "</think> <answer> 1 + 1 </answer>")
    await t.score(wrong)
    assert wrong.rewards["leanrl"].score == 0.1  # Countdown's paper reward: an answer, wrong
    nothing = trace_for(t, "I give up.")
    await t.score(nothing)
    assert nothing.rewards["leanrl"].score == 0.0
    assert nothing.info["leanrl_verdict"]["reason"] == "no_proof"


async def test_the_harness_options_reach_countdowns_harness() -> None:
    ts = LeanrlTaskset(config(env="countdown", limit=1, harness_options={"style": "direct"}))
    (t,) = list(ts)
    assert t.data.prompt_text.endswith("Answer: <answer>")
    solution = str(t.data.leanrl_task["extra"]["solution"])
    tr = trace_for(t, f"{solution}</answer> and some more text the model went on with")
    await t.score(tr)
    assert tr.rewards["leanrl"].score == 1.0  # the harness's stop string cut the reply


def test_countdown_takes_no_prompt_format_and_no_service() -> None:
    with pytest.raises(ConfigError, match="countdown harness writes its own prompt"):
        LeanrlTaskset(config(env="countdown", prompt_format="kimina"))
    with pytest.raises(ConfigError, match="checked without Lean"):
        LeanrlTaskset(config(env="countdown", service_url="http://127.0.0.1:1"))


@pytest.mark.parametrize("env", ["countdown", "core"])
async def test_the_plugins_reward_is_leanrl_evals_reward(env: str) -> None:
    """The same reply, scored by the plugin and by the environment's own rollout (what `leanrl
    eval` runs), gives the same reward and verdict."""
    runtime = {} if env == "countdown" else {"runtime": SCRIPTED}
    (t,) = list(LeanrlTaskset(config(env=env, limit=1, **runtime)))
    lt = load_environment(env, limit=1).tasks()[0]
    if env == "countdown":
        replies = [f"</think><answer> {lt.extra['solution']} </answer>", "<answer>3</answer>", "?"]
    else:
        block = f"```lean4\n{lt.formal_statement}\n  {{}}\n```"
        replies = [block.format("omega"), block.format("simp"), "no idea"]
    # what `leanrl eval --env ENV` runs (core: a chat model, as the plugin prompts it)
    if env == "countdown":
        leanrl_env = load_environment(env, limit=1)
    else:
        chat = HarnessConfig(prompt_format="chat")
        leanrl_env = load_environment(env, limit=1, runtime=SCRIPTED, harness=chat)
    async with leanrl_env:
        for reply in replies:
            tr = trace_for(t, reply)
            await t.score(tr)
            (group,) = await leanrl_env.rollout(
                [lt], ScriptedPolicy([reply]), SamplingConfig(n=1, temperature=0)
            )
            (r,) = group
            assert r.verdict is not None
            assert tr.rewards["leanrl"].score == r.reward, reply
            assert tr.info["leanrl_verdict"]["reason"] == r.verdict.reason.value, reply
            assert tr.info["leanrl_verdict"]["accepted"] == r.verdict.accepted


async def test_a_reply_cut_off_by_the_token_limit_is_truncated_as_in_leanrl_eval() -> None:
    (t,) = list(LeanrlTaskset(config(env="core", limit=1, runtime=SCRIPTED)))
    stmt = t.data.leanrl_task["formal_statement"]
    cut = f"Here is the proof.\n```lean4\n{stmt}\n  intro h\n  omeg"
    tr = trace_for(t, cut, finish="length")
    await t.score(tr)
    assert tr.info["leanrl_verdict"]["reason"] == "truncated"
    assert tr.rewards["leanrl"].score == 0.0


async def test_a_runtime_that_cannot_start_raises_the_retryable_infra_error() -> None:
    ts = LeanrlTaskset(
        config(env="core", limit=1, runtime=SCRIPTED, runtime_options={"fail_start": True})
    )
    (t,) = list(ts)
    tr = trace_for(t, f"```lean4\n{t.data.leanrl_task['formal_statement']}\n  omega\n```")
    with pytest.raises(LeanrlInfraError, match="LeanNotFoundError"):
        await t.score(tr)
    assert tr.info["leanrl_verdict"]["reason"] == "infra"
    assert tr.rewards.get("leanrl") is None


async def test_without_lean_the_local_runtime_is_a_retryable_infra_error(no_lean: None) -> None:
    """The real ``local`` runtime on a machine without Lean (issue 37: it was a plain
    ``TaskError``, to which the documented retry rule does not apply)."""
    (t,) = list(LeanrlTaskset(config(env="core", limit=1, runtime="local")))
    tr = trace_for(t, f"```lean4\n{t.data.leanrl_task['formal_statement']}\n  omega\n```")
    with pytest.raises(LeanrlInfraError, match="LeanNotFoundError"):
        await t.score(tr)
    assert tr.info["leanrl_verdict"]["reason"] == "infra"


# -- the real vf-eval, end to end ----------------------------------------------------------------


@contextmanager
def standin(answer: Any, seen: list[dict[str, Any]]) -> Iterator[str]:
    """An OpenAI-compatible ``/v1/chat/completions`` on loopback, in a thread (so that the
    vf-eval subprocess can call it), answering ``answer(messages)``."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(req: Request) -> dict[str, Any]:
        body = await req.json()
        seen.append(body)
        return {
            "id": f"cmpl-{len(seen)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "standin"),
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": answer(body["messages"])},
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    server = uvicorn.Server(uvicorn.Config(app, log_level="critical", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    for _ in range(1000):
        if server.started:
            break
        time.sleep(0.01)
    try:
        assert server.started, "the stand-in model endpoint did not start"
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@pytest.mark.slow  # a vf-eval process (verifiers' import takes seconds) and a server
def test_vf_eval_on_countdown_scores_a_correct_answer_one(tmp_path: Path) -> None:
    solutions = countdown_solutions()
    first = sorted(solutions)[0]

    def answer(messages: list[dict[str, Any]]) -> str:
        prompt = messages[-1]["content"]
        sol = solution_of(prompt, solutions)
        # one puzzle answered wrongly, the others with their known solution
        if sol is None or f"{list(first[0])}" in prompt:
            return "Let me think.</think>\n<answer> 1 + 2 </answer>"
        return f"Let me think.</think>\n<answer> {sol} </answer>"

    seen: list[dict[str, Any]] = []
    with standin(answer, seen) as url:
        r = vf_eval(
            [
                "leanrl-verifiers",
                "--env.taskset.env",
                "countdown",
                "--env.taskset.limit",
                "3",
                "--client.base-url",
                url,
                "-m",
                "standin",
                "--no-push",
                "--no-rich",
                "-o",
                str(tmp_path / "outputs"),
                "--run.name",
                "countdown",
            ],
            cwd=tmp_path,
        )
    assert r.returncode == 0, r.stderr[-4000:]
    out = tmp_path / "outputs" / "countdown" / "traces.jsonl"
    traces = [json.loads(x)["traces"][0] for x in out.read_text().splitlines()]
    assert len(traces) == 3 and len(seen) == 3
    scores = sorted(t["rewards"]["leanrl"]["score"] for t in traces)
    assert scores == [0.1, 1.0, 1.0]  # two right, one wrong answer in the tags (paper reward)
    for t in traces:
        v = t["info"]["leanrl_verdict"]
        assert v["accepted"] is (t["rewards"]["leanrl"]["score"] == 1.0)
    # the model saw Countdown's own prompt, no Lean and no system turn
    for body in seen:
        assert [m["role"] for m in body["messages"]] == ["user"]
        assert "Lean" not in body["messages"][0]["content"]
        assert "Using the numbers" in body["messages"][0]["content"]
