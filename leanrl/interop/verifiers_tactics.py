"""A verifiers (v1) toolset: Lean's tactic mode over leanrl's tactic sessions.

Tools ``lean_start(theorem)`` and ``lean_tactic(state, text)`` for verifiers' agentic harnesses
(an MCP server verifiers launches per rollout): see :class:`~leanrl.interop.tactics.TacticTools`.
Without a ``theorem``, ``start`` opens the rollout's own task (verifiers hands the toolset the
task of the rollout through ``setup_task``). The reward is unchanged: leanrl's verdict on the
final whole proof (:class:`~leanrl.interop.verifiers_plugin.LeanrlTask`).

A taskset offers it from its task class::

    class MyTask(LeanrlTask):
        @classmethod
        def toolsets(cls, config):
            return [LeanrlTactics(LeanrlTacticsConfig(env="minif2f"))]
"""

from __future__ import annotations

import json
from typing import Any

import verifiers.v1 as vf
from pydantic import ConfigDict, Field

from leanrl.environment import Environment, load_environment
from leanrl.interop.tactics import TacticTools, require_tactic_mode
from leanrl.runtime import RuntimeConfig

__all__ = ["LeanrlTactics", "LeanrlTacticsConfig"]


class LeanrlTacticsConfig(vf.ToolsetConfig):
    """The leanrl environment whose theorems the tools open, and its runtime."""

    # Attribute docstrings become field descriptions, as in leanrl's own configs.
    model_config = ConfigDict(use_attribute_docstrings=True)

    env: str = "core"
    """leanrl environment id (``leanrl envs``)."""
    split: str | None = None
    """Its split (default: the taskset's default)."""
    path: str | None = None
    """A local copy of its data."""
    runtime: str = "local"
    """The runtime with tactic mode (``local`` in ``repl`` mode, ``docker``, ``modal``)."""
    runtime_options: dict[str, Any] = Field(default_factory=dict)
    """That runtime's ``options``."""
    max_sessions: int = Field(default=8, ge=1)
    """Most theorems one rollout may open."""


class LeanrlTactics(vf.Toolset[LeanrlTacticsConfig, vf.State]):
    """Lean's tactic mode: open a theorem, apply tactics, read the goals."""

    TOOL_PREFIX = "lean"

    def __init__(self, config: LeanrlTacticsConfig) -> None:
        super().__init__(config)
        self._tools: TacticTools | None = None
        self._env: Environment | None = None
        self._theorem = ""

    async def _ready(self) -> TacticTools:
        if self._tools is None:
            c = self.config
            kw = {k: v for k, v in (("split", c.split), ("path", c.path)) if v is not None}
            rt = RuntimeConfig(name=c.runtime, options=dict(c.runtime_options))
            env = load_environment(c.env, runtime=rt, **kw)
            require_tactic_mode(env.runtime)
            await env.start()
            self._env = env
            tasks = {t.name: t for t in env.tasks()}
            policy = env.taskset.config.policy
            self._tools = TacticTools(env.runtime, tasks, policy, c.max_sessions)
        return self._tools

    async def setup_task(self, task: Any) -> None:
        """Remember the rollout's theorem (a leanrl task's name), the default of ``start``."""
        lt = getattr(task, "leanrl_task", None) or {}
        self._theorem = str(lt.get("name") or getattr(task, "name", "") or "")

    @vf.tool
    async def start(self, theorem: str = "") -> str:
        """Open a theorem in Lean's tactic mode (default: this task's). Returns JSON: `state`
        (the proof state id to apply tactics to) and `goals`."""
        tools = await self._ready()
        return json.dumps(await tools.start(theorem or self._theorem))

    @vf.tool
    async def tactic(self, state: int, text: str) -> str:
        """Apply a Lean tactic to proof state `state`. Returns JSON: the new `state` and its
        `goals` (`solved` when none remain), or Lean's `error`."""
        tools = await self._ready()
        return json.dumps(await tools.tactic(state, text))

    async def close(self) -> None:
        """Close the sessions and the runtime."""
        if self._tools is not None:
            await self._tools.close()
        if self._env is not None:
            await self._env.close()
