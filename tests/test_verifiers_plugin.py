"""leanrl in verifiers (v1): the taskset, its verdict reward, infra raising, and that
``import leanrl`` never imports verifiers.

Checking runs on the scripted test runtime (accepts a proof containing ``omega``, never Lean),
in-process or behind the real service on loopback: what is tested is the plumbing between
verifiers' task/trace and leanrl's checker, not Lean's judgement.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _scripted_runtime import ScriptedRuntime
from _service_testing import running_service

from leanrl.runtime import RuntimeConfig

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # a fresh interpreter / a live service / verifiers' plugin scan
def test_import_leanrl_does_not_import_verifiers() -> None:
    code = (
        "import sys, leanrl, leanrl.interop, leanrl.service.app\n"
        # the parts of the interop that need no verifiers, and the environment until it is used
        "import leanrl.interop.traces, leanrl.interop.tactics, leanrl.interop.traces_cli\n"
        "import leanrl.environments.verifiers\n"
        "from leanrl import load_environment\n"
        "load_environment('verifiers', harness={'options': {'env': 'x'}})\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'verifiers')\n"
        "assert not bad, bad\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr


if importlib.util.find_spec("verifiers") is None:
    pytest.skip(
        "verifiers is not installed (pip install -e '.[verifiers]', Python 3.11+)",
        allow_module_level=True,
    )

import verifiers.v1 as vf  # noqa: E402

from leanrl.interop.verifiers_plugin import (  # noqa: E402
    LeanrlInfraError,
    LeanrlTask,
    LeanrlTaskset,
    LeanrlTasksetConfig,
)

SCRIPTED = "_scripted_runtime:ScriptedRuntime"


def config(**kw: Any) -> LeanrlTasksetConfig:
    kw.setdefault("id", "leanrl-verifiers")
    kw.setdefault("env", "core")
    kw.setdefault("runtime", SCRIPTED)
    return LeanrlTasksetConfig(**kw)


def trace_for(task: LeanrlTask, reply: str) -> vf.Trace:
    return vf.Trace(
        task=vf.TraceTask(type=type(task).__name__, data=task.data),
        agent=vf.AgentInfo(config=vf.AgentConfig()),
        root_reply=reply,
    )


def reply(task: LeanrlTask, proof: str) -> str:
    stmt = task.data.leanrl_task["formal_statement"]
    return f"Here is the proof.\n\n```lean4\n{stmt}\n  {proof}\n```\n"


def test_the_taskset_yields_leanrl_theorems_with_leanrls_prompts() -> None:
    tasks = list(LeanrlTaskset(config(split="valid", limit=3, prompt_format="kimina")))
    assert len(tasks) == 3
    t = tasks[0]
    assert (
        t.data.system_prompt == "You are an expert in mathematics and proving theorems in Lean 4."
    )
    assert "# Formal statement:" in t.data.prompt_text
    assert t.data.leanrl_task["formal_statement"] in t.data.prompt_text
    assert len({x.key for x in tasks}) == 3


def test_a_completion_format_is_refused_with_the_ones_that_fit() -> None:
    from leanrl.errors import ConfigError

    with pytest.raises(ConfigError, match="chat, kimina"):
        LeanrlTaskset(config(prompt_format="deepseek"))


async def test_the_reward_is_leanrls_verdict_and_lands_in_the_trace_info() -> None:
    (task,) = list(LeanrlTaskset(config(limit=1)))
    good, bad = trace_for(task, reply(task, "omega")), trace_for(task, reply(task, "simp"))
    await task.score(good)
    await task.score(bad)
    assert good.rewards["leanrl"].score == 1.0
    assert good.info["leanrl_verdict"]["accepted"] is True
    assert bad.rewards["leanrl"].score == 0.0
    assert bad.info["leanrl_verdict"]["reason"] == "error"
    none = trace_for(task, "I could not do it.")
    await task.score(none)
    assert none.rewards["leanrl"].score == 0.0
    assert none.info["leanrl_verdict"]["reason"] == "no_proof"


async def test_an_infra_verdict_raises_so_the_rollout_is_retried_not_scored(
    tmp_path: Path,
) -> None:
    flag = tmp_path / "infra"
    flag.write_text("down")  # the scripted runtime answers `infra` while this file exists
    (task,) = list(LeanrlTaskset(config(limit=1, runtime_options={"infra_file": str(flag)})))
    tr = trace_for(task, reply(task, "omega"))
    with pytest.raises(LeanrlInfraError, match="leanrl infra"):
        await task.score(tr)
    assert tr.info["leanrl_verdict"]["reason"] == "infra"
    assert tr.rewards.get("leanrl") is None  # no score recorded: not a 0 to learn from


@pytest.mark.slow  # a fresh interpreter / a live service / verifiers' plugin scan
async def test_the_reward_can_come_from_leanrl_serve() -> None:
    rt = ScriptedRuntime(RuntimeConfig(name="scripted"))
    async with running_service(rt) as url:
        (task,) = list(LeanrlTaskset(config(limit=1, service_url=url)))
        tr = trace_for(task, reply(task, "omega"))
        await task.score(tr)
    assert tr.rewards["leanrl"].score == 1.0
    (a,) = rt.attempts  # checked by the service's runtime, under the reference statement
    assert a.formal_statement == task.data.leanrl_task["formal_statement"]


@pytest.mark.slow  # verifiers' plugin scan
def test_verifiers_resolves_the_shipped_plugin_by_id() -> None:
    """verifiers imports an id as a top-level module (``leanrl-verifiers`` ->
    ``leanrl_verifiers``, shipped with leanrl) and takes the one Taskset, Harness and Env
    subclass its ``__all__`` exports."""
    from verifiers.v1.utils import loaders

    from leanrl.interop.verifiers_plugin import LeanrlChatHarness, LeanrlEnv

    assert loaders.taskset_class("leanrl-verifiers") is LeanrlTaskset
    assert loaders.harness_class("leanrl-verifiers") is LeanrlChatHarness
    assert loaders.environment_class("leanrl-verifiers") is LeanrlEnv
    # unpinned, the seat plays leanrl's chat harness on the local host (no Prime sandbox)
    env_cfg = loaders.resolve_env_config(
        {"taskset": {"id": "leanrl-verifiers", "env": "core", "runtime": SCRIPTED}}
    )
    assert env_cfg.agent_harnesses() == {"agent": env_cfg.agent_harnesses()["agent"]}
    assert env_cfg.agent_harnesses()["agent"].id == "leanrl-verifiers"
    assert env_cfg.agent.runtime.type == "subprocess"  # type: ignore[attr-defined]
    ts = vf.load_taskset(config(limit=2))
    assert isinstance(ts, LeanrlTaskset) and len(list(ts)) == 2
