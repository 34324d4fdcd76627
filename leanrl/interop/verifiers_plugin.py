"""leanrl in PrimeIntellect's verifiers (v1 API): a ``vf.Taskset`` whose reward is leanrl's verdict.

Needs ``pip install -e '.[verifiers]'`` (verifiers 0.4, Python 3.11+). Nothing imports this
module but verifiers (through its plugin id ``leanrl-verifiers``: the top-level module
``leanrl_verifiers`` re-exports it; docs/interop.md) and code that asks for it: ``import
leanrl`` stays free of verifiers.

* :class:`LeanrlTaskset` yields one task per task of a leanrl environment (``env``, ``split``,
  ``path``, ``limit`` in its config), prompted by **that environment's own harness**: the
  whole-proof harness in one of leanrl's chat formats (``prompt_format``, default ``chat``) for
  the Lean environments, Countdown's own prompt for ``countdown``, a third party's one-turn
  harness for its environment (``harness_options`` are the harness's options).
* :class:`LeanrlTask`'s reward ``leanrl`` runs that same harness on the model's last reply
  (:mod:`leanrl.interop.replay`): its extraction (Lean block, ``<answer>`` tags, ...), its
  stop strings, the finish reason verifiers recorded (a reply cut by the token limit is
  ``truncated``, as in ``leanrl eval``), its check and the taskset's own reward. Lean
  environments are checked through ``leanrl serve`` (``service_url``, one service per node,
  with ``service_token`` or over a unix socket ``service_uds``) or in-process (the ``runtime``
  named in the config, started in this process on first use); Countdown's checker is Python.
  The whole verdict goes into the trace's ``info["leanrl_verdict"]``.
* An ``infra`` verdict (the checker could not run: not the proof's fault), a service that
  cannot be reached, or a runtime that cannot start (no Lean here) raises
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
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import httpx
import verifiers.v1 as vf
from pydantic import ConfigDict, Field, SerializeAsAny

from leanrl.environment import Environment, load_environment
from leanrl.errors import ConfigError, LeanNotFoundError, RuntimeUnavailable
from leanrl.harness import HarnessConfig
from leanrl.harnesses.whole_proof.harness import WholeProofHarness
from leanrl.harnesses.whole_proof.prompts import is_completion_style
from leanrl.interop.replay import ReplyPolicy, chat_parts, one_turn_harness, replay_run
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

_INFRA = (LeanNotFoundError, RuntimeUnavailable, OSError)
"""What a runtime raises when the checker cannot run here (no Lean, a lost service): the
rollout is retried, never scored."""


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
    """leanrl environment id (``leanrl envs``), e.g. ``core`` (ships with leanrl), ``minif2f``
    or ``countdown``."""
    split: str | None = None
    """Its split (default: the taskset's default split)."""
    path: str | None = None
    """A local copy of its data (default: the taskset's own source)."""
    limit: int | None = Field(default=None, ge=1)
    """At most this many tasks."""
    prompt_format: str | None = None
    """leanrl's prompt format for an environment on the whole-proof harness (docs/harnesses.md):
    a chat one, ``chat`` (the default), ``kimina``, ``kimina-preview`` or ``goedel`` (the
    DeepSeek completion formats need a completion model, not a chat harness). Environments with
    a harness of their own (``countdown``) write their own prompt: leave it unset."""
    harness_options: dict[str, Any] = Field(default_factory=dict)
    """The environment's harness options (``--env.harness.options`` of ``leanrl eval``), e.g.
    ``{"style": "direct"}`` for ``countdown``."""
    service_url: str | None = None
    """``leanrl serve`` to check through (``http://host:port``); unset: check in-process."""
    service_uds: str | None = None
    """Unix socket of ``leanrl serve`` (instead of ``service_url``)."""
    service_token: str | None = None
    """The service's bearer token (default: ``LEANRL_SERVICE_TOKEN``)."""
    runtime: str = "local"
    """In-process runtime (``leanrl envs`` lists them, or ``module:Class``), when no service.
    Environments that check without Lean (``countdown``) use their own."""
    runtime_options: dict[str, Any] = Field(default_factory=dict)
    """That runtime's ``options``."""


class LeanrlTaskData(vf.TaskData):
    """A leanrl task as verifiers task data (rides on ``trace.task.data``)."""

    leanrl_task: dict[str, Any]
    """The leanrl :class:`~leanrl.Task` (name, header, formal_statement, ...) as JSON."""
    checker: str
    """Which checker scores it (a digest of the taskset config; see :func:`_checker`)."""
    env: str = ""
    """The leanrl environment the task is of (``core``, ``countdown``, ...; empty in traces
    written before it was recorded: a Lean environment)."""
    harness: dict[str, Any] = Field(default_factory=dict)
    """The leanrl harness config (its fields that were set) that prompts the task and pulls the
    answer out of a reply: the trace converters rebuild the harness from it."""


def _configured_harness(env: Environment) -> bool:
    """Whether ``env`` works with the harness its config names (every Lean environment: the
    whole-proof harness by default) rather than one of its own (``countdown``)."""
    return type(env).make_harness is Environment.make_harness


class _ServiceRuntime(Runtime):
    """``leanrl serve`` as the runtime the harness checks on (one client per batch)."""

    name = "leanrl-serve"

    def __init__(self, url: str, token: str | None, uds: str | None) -> None:
        super().__init__(RuntimeConfig(name="local"))
        self.url, self.token, self.uds = url, token, uds

    async def check(self, attempts: Sequence[Attempt]) -> list[Verdict]:
        from leanrl.service.client import ServiceClient

        async with ServiceClient(self.url, token=self.token, uds=self.uds) as client:
            return list(await client.check(list(attempts)))


class _Checker:
    """One per taskset config per process: the leanrl environment, its harness and its way to
    a checker."""

    def __init__(self, config: LeanrlTasksetConfig) -> None:
        self.config = config
        kw: dict[str, Any] = {
            k: v for k, v in (("split", config.split), ("path", config.path)) if v is not None
        }
        if config.limit is not None:
            kw["limit"] = config.limit
        rt = RuntimeConfig(name=config.runtime, options=dict(config.runtime_options))
        fields: dict[str, Any] = {"options": dict(config.harness_options)}
        if config.prompt_format is not None:
            fields["prompt_format"] = config.prompt_format
        env = load_environment(config.env, runtime=rt, harness=HarnessConfig(**fields), **kw)
        if config.prompt_format is None and _configured_harness(env):
            fields["prompt_format"] = "chat"  # the whole-proof harness, as a chat model sees it
            env = load_environment(config.env, runtime=rt, harness=HarnessConfig(**fields), **kw)
        self.env: Environment = env
        self.harness_fields = fields
        harness = one_turn_harness(env)
        if isinstance(harness, WholeProofHarness) and is_completion_style(harness.config):
            raise ConfigError(
                f"prompt_format {harness.config.prompt_format!r} is a completion format; a "
                "verifiers chat harness needs a chat one: chat, kimina, kimina-preview or goedel"
            )
        if (config.service_url or config.service_uds) and not env.needs_lean:
            raise ConfigError(
                f"environment {config.env!r} is checked without Lean, in this process; leave "
                "service_url and service_uds out (they are for Lean environments)"
            )
        self._runtime: Runtime | None = None
        self._lock: asyncio.Lock | None = None

    async def runtime(self) -> Runtime:
        """Where attempts are checked: the service, or the environment's runtime (started
        once, however many rollouts score at once)."""
        c = self.config
        if c.service_url or c.service_uds:
            token = c.service_token or os.environ.get("LEANRL_SERVICE_TOKEN") or None
            return _ServiceRuntime(c.service_url or "http://leanrl", token, c.service_uds)
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._runtime is None:
                runtime = self.env.runtime
                await runtime.start()
                self._runtime = runtime
        return self._runtime


_CHECKERS: dict[str, _Checker] = {}
"""Checkers by config digest: tasks carry the digest, not the checker (verifiers copies and
deep-copies tasks; a runtime's processes must not be copied with them)."""


def _checker(config: LeanrlTasksetConfig) -> tuple[str, _Checker]:
    key = hashlib.sha256(config.model_dump_json().encode()).hexdigest()[:16]
    if key not in _CHECKERS:
        _CHECKERS[key] = _Checker(config)
    return key, _CHECKERS[key]


def _reply_of(trace: vf.Trace) -> tuple[str, Literal["stop", "length"], int | None]:
    """The model's last reply as it sent it (not stripped), why it ended, and its tokens as
    the provider counted them: from the last model call verifiers recorded, else the trace's
    ``last_reply`` (a trace scored offline carries only that)."""
    text: str | None = None
    msgs = trace.assistant_messages
    if msgs:
        content: Any = msgs[-1].content
        if isinstance(content, list):  # content parts: their text
            content = "".join(str(getattr(p, "text", "") or "") for p in content)
        text = content if isinstance(content, str) else None
    if text is None:
        text = trace.root_reply if trace.root_reply is not None else trace.last_reply
    call = next((c for c in reversed(trace.calls) if c.error is None), None)
    finish: Literal["stop", "length"] = (
        "length" if call is not None and call.finish_reason == "length" else "stop"
    )
    used = call.usage.completion_tokens if call is not None and call.usage else None
    return text, finish, used


class LeanrlTask(vf.Task[LeanrlTaskData, vf.State, vf.TaskConfig]):
    """A leanrl task; its reward is leanrl's verdict on the model's last reply, reached by the
    environment's own harness."""

    @property
    def key(self) -> str:
        return f"leanrl:{self.data.leanrl_task.get('id') or self.data.leanrl_task['name']}"

    @vf.reward
    async def leanrl(self, task: LeanrlTaskData, trace: vf.Trace) -> float:
        """The environment's reward for the last reply (Lean: 1.0 when leanrl accepts the proof,
        else 0.0); a checker that cannot run raises :class:`LeanrlInfraError`."""
        checker = _CHECKERS.get(task.checker)
        if checker is None:
            raise ConfigError(
                "this task's leanrl checker is not loaded in this process; load the taskset "
                "(LeanrlTaskset) before scoring its tasks"
            )
        lt = Task.model_validate(task.leanrl_task)
        reply, finish, used = _reply_of(trace)
        reward: float | None = None
        try:
            runtime = await checker.runtime()
            rollout = await replay_run(checker.env, lt, ReplyPolicy(reply, finish, used), runtime)
            verdict = rollout.verdict or Verdict.reject(Reason.INFRA, "the harness gave no verdict")
            reward = rollout.reward
        except _INFRA as e:  # no Lean here, the service unreachable: the checker's fault
            verdict = Verdict.reject(Reason.INFRA, f"{type(e).__name__}: {e}")
        trace.info["leanrl_verdict"] = verdict.model_dump(mode="json")
        if verdict.reason is Reason.INFRA or reward is None:
            raise LeanrlInfraError(f"leanrl infra: {verdict.detail}")
        return float(reward)


class LeanrlTaskset(vf.Taskset[LeanrlTask, LeanrlTasksetConfig]):
    """The tasks of a leanrl environment as verifiers tasks."""

    def __init__(self, config: LeanrlTasksetConfig) -> None:
        super().__init__(config)
        self.checker_key, self.checker = _checker(config)

    def load(self) -> Iterator[LeanrlTask]:
        harness = self.checker.harness_fields
        env = self.checker.env
        prompt_of = one_turn_harness(env).prompt  # type: ignore[attr-defined]
        for t in env.tasks():
            system, user = chat_parts(prompt_of(t))
            data = LeanrlTaskData(
                id=t.id,
                name=t.name,
                prompt=user,
                system_prompt=system,
                leanrl_task=t.model_dump(mode="json"),
                checker=self.checker_key,
                env=env.config.id,
                harness=harness,
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
