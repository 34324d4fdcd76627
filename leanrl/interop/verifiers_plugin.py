"""leanrl in PrimeIntellect's verifiers (v1 API): a ``vf.Taskset`` whose reward is leanrl's verdict.

Needs ``pip install -e '.[verifiers]'`` (verifiers 0.4, Python 3.11+). Nothing imports this
module but verifiers (through its plugin id ``leanrl-verifiers``: the top-level module
``leanrl_verifiers`` re-exports it; docs/interop.md) and code that asks for it: ``import
leanrl`` stays free of verifiers.

* :class:`LeanrlTaskset` yields one task per theorem of a leanrl environment (``env``, ``split``,
  ``path`` in its config), prompted in one of leanrl's chat formats (``prompt_format``).
* :class:`LeanrlTask`'s reward ``leanrl`` reads the model's last reply, pulls the proof out of it
  the way leanrl's whole-proof harness does, and has leanrl's checker judge it under the
  taskset's reference statement and policy: through ``leanrl serve`` (``service_url``, one
  service per node, with ``service_token`` or over a unix socket ``service_uds``) or in-process
  (the ``runtime`` named in the config, started in this process on first use). The reward is
  the leanrl taskset's own (1.0 accepted, 0.0 otherwise); the whole verdict goes into the
  trace's ``info["leanrl_verdict"]``.
* An ``infra`` verdict (the checker could not run: not the proof's fault) raises
  :class:`LeanrlInfraError` instead of scoring 0, so the trace is an errored rollout that
  verifiers can retry (``--env.agent.retries.rules '[{"type": "LeanrlInfraError",
  "max_retries": 3}]'``), never a wrong 0 a trainer learns from.
* :class:`LeanrlChatHarness` (the taskset's default harness) is one chat turn run in-process
  through the rollout's interception endpoint, and :class:`LeanrlEnv` is verifiers'
  single-agent env with its seat on the local host (``subprocess``): ``vf-eval
  leanrl-verifiers`` then needs no ``uv``, no container and no Prime account.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import verifiers.v1 as vf
from pydantic import ConfigDict, Field, SerializeAsAny

from leanrl.environment import Environment, load_environment
from leanrl.errors import ConfigError, RuntimeUnavailable
from leanrl.harness import HarnessConfig
from leanrl.harnesses.whole_proof.extract import extract_proof
from leanrl.harnesses.whole_proof.prompts import build_prompt, is_completion_style
from leanrl.runtime import Runtime, RuntimeConfig
from leanrl.task import Task
from leanrl.verdict import Attempt, Reason, Verdict

__all__ = [
    "LeanrlChatHarness",
    "LeanrlChatHarnessConfig",
    "LeanrlEnv",
    "LeanrlEnvConfig",
    "LeanrlInfraError",
    "LeanrlTask",
    "LeanrlTaskData",
    "LeanrlTaskset",
    "LeanrlTasksetConfig",
]


class LeanrlInfraError(vf.TaskError):
    """leanrl's checker could not run (verdict ``infra``): retry the rollout, do not score it."""


class LeanrlTasksetConfig(vf.TasksetConfig):
    """``--env.taskset.*`` of the leanrl taskset."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    # verifiers' own three fields, restated only to carry a docstring (same types and defaults)
    task: SerializeAsAny[vf.TaskConfig] = vf.TaskConfig()
    """verifiers' per-task config (judges, extra rewards), under ``--env.taskset.task.*``."""
    system_prompt: Path | None = None
    """verifiers' option: a file whose text replaces every task's system prompt."""
    id: vf.ID = ""
    """The taskset id verifiers resolved this taskset by (``leanrl-verifiers``)."""

    env: str = "core"
    """leanrl environment id (``leanrl envs``), e.g. ``core`` (ships with leanrl) or ``minif2f``."""
    split: str | None = None
    """Its split (default: the taskset's default split)."""
    path: str | None = None
    """A local copy of its data (default: the taskset's own source)."""
    limit: int | None = Field(default=None, ge=1)
    """At most this many theorems."""
    prompt_format: str = "chat"
    """leanrl's prompt format (docs/harnesses.md): a chat one, ``chat``, ``kimina``,
    ``kimina-preview`` or ``goedel`` (the DeepSeek completion formats need a completion model,
    not a chat harness)."""
    service_url: str | None = None
    """``leanrl serve`` to check through (``http://host:port``); unset: check in-process."""
    service_uds: str | None = None
    """Unix socket of ``leanrl serve`` (instead of ``service_url``)."""
    service_token: str | None = None
    """The service's bearer token (default: ``LEANRL_SERVICE_TOKEN``)."""
    runtime: str = "local"
    """In-process runtime (``leanrl envs`` lists them, or ``module:Class``), when no service."""
    runtime_options: dict[str, Any] = Field(default_factory=dict)
    """That runtime's ``options``."""


class LeanrlTaskData(vf.TaskData):
    """A leanrl theorem as verifiers task data (rides on ``trace.task.data``)."""

    leanrl_task: dict[str, Any]
    """The leanrl :class:`~leanrl.Task` (name, header, formal_statement, ...) as JSON."""
    checker: str
    """Which checker scores it (a digest of the taskset config; see :func:`_checker`)."""


class _Checker:
    """One per taskset config per process: the leanrl environment and its way to Lean."""

    def __init__(self, config: LeanrlTasksetConfig) -> None:
        self.config = config
        kw: dict[str, Any] = {
            k: v for k, v in (("split", config.split), ("path", config.path)) if v is not None
        }
        if config.limit is not None:
            kw["limit"] = config.limit
        rt = RuntimeConfig(name=config.runtime, options=dict(config.runtime_options))
        self.env: Environment = load_environment(config.env, runtime=rt, **kw)
        self.harness = HarnessConfig(prompt_format=config.prompt_format)
        if is_completion_style(self.harness):
            raise ConfigError(
                f"prompt_format {config.prompt_format!r} is a completion format; a verifiers "
                "chat harness needs a chat one: chat, kimina, kimina-preview or goedel"
            )
        self._runtime: Runtime | None = None
        self._lock: asyncio.Lock | None = None

    async def check(self, attempt: Attempt) -> Verdict:
        c = self.config
        if c.service_url or c.service_uds:
            from leanrl.service.client import ServiceClient

            token = c.service_token or os.environ.get("LEANRL_SERVICE_TOKEN") or None
            url = c.service_url or "http://leanrl"
            async with ServiceClient(url, token=token, uds=c.service_uds) as client:
                (v,) = await client.check([attempt])
            return v
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:  # one start, however many rollouts score at once
            if self._runtime is None:
                runtime = self.env.runtime
                await runtime.start()
                self._runtime = runtime
        (v,) = await self._runtime.check([attempt])
        return v


_CHECKERS: dict[str, _Checker] = {}
"""Checkers by config digest: tasks carry the digest, not the checker (verifiers copies and
deep-copies tasks; a runtime's processes must not be copied with them)."""


def _checker(config: LeanrlTasksetConfig) -> tuple[str, _Checker]:
    key = hashlib.sha256(config.model_dump_json().encode()).hexdigest()[:16]
    if key not in _CHECKERS:
        _CHECKERS[key] = _Checker(config)
    return key, _CHECKERS[key]


class LeanrlTask(vf.Task[LeanrlTaskData, vf.State, vf.TaskConfig]):
    """A leanrl theorem; its reward is leanrl's verdict on the model's last reply."""

    @property
    def key(self) -> str:
        return f"leanrl:{self.data.leanrl_task.get('id') or self.data.leanrl_task['name']}"

    @vf.reward
    async def leanrl(self, task: LeanrlTaskData, trace: vf.Trace) -> float:
        """1.0 when leanrl accepts the proof in the last reply, else 0.0 (``infra`` raises)."""
        checker = _CHECKERS.get(task.checker)
        if checker is None:
            raise ConfigError(
                "this task's leanrl checker is not loaded in this process; load the taskset "
                "(LeanrlTaskset) before scoring its tasks"
            )
        lt = Task.model_validate(task.leanrl_task)
        ex = extract_proof(trace.last_reply, lt)
        if ex.proof is None:
            verdict = Verdict.reject(ex.reason or Reason.NO_PROOF, ex.detail)
        else:
            attempt = Attempt(
                name=lt.name,
                header=lt.header,
                formal_statement=lt.formal_statement,
                proof=ex.proof,
                preamble=ex.preamble,
                restated_statement=ex.restated_statement,
                policy=checker.env.taskset.config.policy,
                id=f"{lt.id}/{trace.id}",
            )
            try:
                verdict = await checker.check(attempt)
            except RuntimeUnavailable as e:  # the service is unreachable: the checker's fault
                verdict = Verdict.reject(Reason.INFRA, f"{type(e).__name__}: {e}")
        trace.info["leanrl_verdict"] = verdict.model_dump(mode="json")
        if verdict.reason is Reason.INFRA:
            raise LeanrlInfraError(f"leanrl infra: {verdict.detail}")
        return checker.env.taskset.reward(lt, verdict)


class LeanrlTaskset(vf.Taskset[LeanrlTask, LeanrlTasksetConfig]):
    """The theorems of a leanrl environment as verifiers tasks."""

    def __init__(self, config: LeanrlTasksetConfig) -> None:
        super().__init__(config)
        self.checker_key, self.checker = _checker(config)

    def load(self) -> Iterator[LeanrlTask]:
        for t in self.checker.env.tasks():
            prompt = build_prompt(t, self.checker.harness)
            assert not isinstance(prompt, str)  # a chat format (checked in _Checker)
            system = next((m.content for m in prompt if m.role == "system"), None)
            user = "\n\n".join(m.content for m in prompt if m.role == "user")
            data = LeanrlTaskData(
                id=t.id,
                name=t.name,
                prompt=user,
                system_prompt=system,
                leanrl_task=t.model_dump(mode="json"),
                checker=self.checker_key,
            )
            yield LeanrlTask(data, self.config.task)


class LeanrlChatHarnessConfig(vf.HarnessConfig):
    """``--env.agent.harness.*`` of the leanrl chat harness (id ``leanrl-verifiers``)."""

    # Attribute docstrings become field descriptions, as in leanrl's own configs.
    model_config = ConfigDict(use_attribute_docstrings=True)

    id: vf.ID = "leanrl-verifiers"
    """The harness id (the plugin's own: the default harness of the leanrl taskset)."""
    timeout_s: float = Field(default=600.0, gt=0)
    """Seconds one model call may take."""


class LeanrlChatHarness(vf.Harness[LeanrlChatHarnessConfig]):
    """One chat turn, in-process: the task's prompt to the model, its reply is the trace.

    leanrl's whole-proof harness as a verifiers harness. It runs no program and needs no
    runtime tooling (verifiers' ``null`` harness starts a ``uv run`` script, which needs uv
    and a package index): the call goes to the rollout's interception ``endpoint`` with its
    ``secret``, as verifiers' harness contract asks, so verifiers records the turn, applies
    the eval's sampling and relays it to the model endpoint (``--client.base-url``).
    """

    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False
    SUPPORTS_RESUME = True

    async def launch(
        self,
        ctx: vf.ModelContext,
        trace: vf.Trace,
        runtime: vf.Runtime,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: vf.TaskData,
    ) -> vf.ProgramResult:
        system, prompt = self.resolve_prompt(data)
        messages: list[dict[str, Any]] = []
        if system:
            messages.append({"role": "system", "content": system})
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        elif prompt is not None:  # a resumed exchange: the conversation so far
            messages.extend(
                {"role": m.role, "content": m.content or ""}
                for m in prompt
                if getattr(m, "content", None) is not None
            )
        body = {"model": ctx.model, "messages": messages}
        async with httpx.AsyncClient(timeout=self.config.timeout_s) as client:
            r = await client.post(
                f"{endpoint.rstrip('/')}/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {secret}"},
            )
        if r.status_code != 200:
            # stderr carries the cause; verifiers turns a non-zero exit into a HarnessError
            return vf.ProgramResult(1, "", f"model call failed: HTTP {r.status_code}: {r.text}")
        choices = r.json().get("choices") or [{}]
        text = (choices[0].get("message") or {}).get("content") or ""
        return vf.ProgramResult(0, text, "")


class LeanrlEnvConfig(vf.SingleAgentEnvConfig):
    """The leanrl taskset's env: verifiers' single-agent env, its seat on the local host."""

    # Attribute docstrings become field descriptions, as in leanrl's own configs.
    model_config = ConfigDict(use_attribute_docstrings=True)

    agent: vf.AgentConfig = vf.AgentConfig(runtime=vf.SubprocessConfig())
    """The one seat. Its runtime defaults to ``subprocess`` (verifiers' own default is a
    Prime sandbox, which needs an account and the network): the leanrl chat harness runs
    nothing in it, and leanrl's checker brings its own isolation. Pin
    ``--env.agent.runtime.type`` / ``--env.agent.harness.id`` for other harnesses."""


class LeanrlEnv(vf.Env[LeanrlEnvConfig]):
    """verifiers' single-agent episode (one seat plays the task) with the local default seat."""

    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        await agents.agent.run(task)
