"""The tactic tools (``start(theorem)``, ``tactic(state, text)``) over leanrl's tactic sessions,
and their verifiers toolset. Sessions are the scripted test runtime's (a script, not Lean:
``intro``/``have`` add a goal, ``omega`` closes them all, anything else is an error)."""

from __future__ import annotations

import importlib.util
import json

import pytest
from _scripted_runtime import ScriptedRuntime

from leanrl import load_environment
from leanrl.errors import ConfigError
from leanrl.interop.tactics import TacticTools, require_tactic_mode
from leanrl.runtime import RuntimeConfig

SCRIPTED = "_scripted_runtime:ScriptedRuntime"


def core_tasks() -> dict[str, object]:
    return {t.name: t for t in load_environment("core", limit=2).tasks()}


async def test_start_then_tactics_walk_the_goals_and_keep_every_state_usable() -> None:
    tasks = core_tasks()
    name = next(iter(tasks))
    rt = ScriptedRuntime(RuntimeConfig(name="scripted"))
    async with TacticTools(rt, tasks) as tools:  # type: ignore[arg-type]
        s0 = await tools.start(name)
        assert s0["state"] == 0 and len(s0["goals"]) == 1 and s0["error"] is None
        s1 = await tools.tactic(0, "intro x")
        assert s1["state"] == 1 and len(s1["goals"]) == 2 and not s1["solved"]
        bad = await tools.tactic(1, "rfl_wrong")
        assert bad["state"] is None and "unknown tactic" in bad["error"]
        done = await tools.tactic(1, "omega")  # the state before the error still works
        assert done["solved"] is True and done["goals"] == []
        # a second theorem: its own session, ids continue
        other = await tools.start(list(tasks)[1])
        assert other["state"] == 3 and rt.sessions == 2
        assert (await tools.tactic(42, "omega"))["error"].startswith("unknown proof state 42")
        assert "unknown theorem 'nope'" in (await tools.start("nope"))["error"]


async def test_sessions_are_capped_and_screened_by_the_taskset_policy() -> None:
    tasks = core_tasks()
    env = load_environment("core", limit=2)
    rt = ScriptedRuntime(RuntimeConfig(name="scripted"))
    policy = env.taskset.config.policy
    async with TacticTools(rt, tasks, policy, max_sessions=1) as tools:  # type: ignore[arg-type]
        await tools.start(next(iter(tasks)))
        assert "at most 1" in (await tools.start(next(iter(tasks))))["error"]
    assert rt.session_policies == [policy]  # the session judges tactics by the taskset's rules


def test_a_runtime_without_tactic_mode_is_refused() -> None:
    with pytest.raises(ConfigError, match="has no tactic mode"):
        require_tactic_mode(load_environment("countdown").runtime)


@pytest.mark.skipif(
    importlib.util.find_spec("verifiers") is None,
    reason="verifiers is not installed (extra `verifiers`)",
)
@pytest.mark.slow  # verifiers' import
async def test_the_verifiers_toolset_opens_the_rollouts_theorem_by_default() -> None:
    from verifiers.v1.utils.decorators import discover_decorated

    from leanrl.interop.verifiers_plugin import LeanrlTaskset, LeanrlTasksetConfig
    from leanrl.interop.verifiers_tactics import LeanrlTactics, LeanrlTacticsConfig

    toolset = LeanrlTactics(LeanrlTacticsConfig(env="core", runtime=SCRIPTED))
    assert toolset.server_name == "lean"
    assert {fn.__name__ for fn in discover_decorated(toolset, "tool")} == {"start", "tactic"}
    (task,) = LeanrlTaskset(
        LeanrlTasksetConfig(id="leanrl-verifiers", env="core", limit=1, runtime=SCRIPTED)
    )
    await toolset.setup_task(task.data)  # what verifiers does for each rollout
    try:
        s0 = json.loads(await toolset.start())
        assert s0["state"] == 0 and s0["goals"]
        assert json.loads(await toolset.tactic(0, "omega"))["solved"] is True
    finally:
        await toolset.close()
