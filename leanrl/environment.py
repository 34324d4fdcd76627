"""Environment = Taskset + Harness + Runtime. The eval runner and both trainers consume it.

Subclass :class:`Environment` and set ``taskset_class`` (and ``name``/``description``) for a new
benchmark; override :meth:`Environment.make_harness` or :meth:`Environment.make_runtime` only
when you need something other than the configured built-ins.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from leanrl import registry
from leanrl.errors import ConfigError
from leanrl.harness import Harness, HarnessConfig
from leanrl.policy import Policy, SamplingConfig
from leanrl.rollout import Rollout
from leanrl.runtime import Runtime, RuntimeConfig
from leanrl.task import Task
from leanrl.taskset import Taskset, TasksetConfig

__all__ = ["Environment", "EnvironmentConfig", "load_environment"]


class EnvironmentConfig(BaseModel):
    """An environment: which one, and the config of its three parts."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    id: str = "minif2f"
    """Environment id (``leanrl envs`` lists them) or an import path ``package.module:Class``."""
    taskset: TasksetConfig = Field(default_factory=TasksetConfig)
    """Which theorems, from where, judged how."""
    harness: HarnessConfig = Field(default_factory=HarnessConfig)
    """How the model works on a task."""
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    """Where Lean runs."""


class Environment:
    """A taskset, a harness and a runtime. ``__init__`` builds nothing; parts are made on first
    use and the runtime is started by :meth:`start` (or ``async with``)."""

    name: ClassVar[str] = ""
    """Registry id."""
    description: ClassVar[str] = ""
    """One line for ``leanrl envs``."""
    taskset_class: ClassVar[type[Taskset]] = Taskset
    """The taskset this environment uses."""
    needs_lean: ClassVar[bool] = True
    """False for an environment that judges answers without Lean (Countdown): ``leanrl doctor``
    and ``leanrl setup`` then have nothing to check or set up, the eval summary and report name
    no Lean runtime or version, and ``--dry-run`` plans no Lean checking."""

    def __init__(self, config: EnvironmentConfig | None = None) -> None:
        self.config = config or EnvironmentConfig(id=self.name or "minif2f")
        self._taskset: Taskset | None = None
        self._harness: Harness | None = None
        self._runtime: Runtime | None = None

    # -- hooks ----------------------------------------------------------------------------------

    def check_config(self) -> None:
        """Refuse settings this environment cannot honour, with what it takes instead (default:
        none). Called before the first part is made (and by ``--dry-run`` for an environment
        without Lean); cheap, builds nothing."""

    def make_taskset(self) -> Taskset:
        """Build the taskset (default: ``taskset_class`` with the taskset config)."""
        return self.taskset_class(self.config.taskset)

    def make_harness(self) -> Harness:
        """Build the harness named in the config."""
        cls = registry.resolve("harnesses", self.config.harness.name)
        return _instantiate(cls, Harness, self.config.harness, "harness")

    def make_runtime(self) -> Runtime:
        """Build the runtime named in the config."""
        cls = registry.resolve("runtimes", self.config.runtime.name)
        runtime: Runtime = _instantiate(cls, Runtime, self.config.runtime, "runtime")
        ts = self.taskset
        runtime.taskset_pins = (ts.lean_toolchain, ts.mathlib_rev)
        runtime.env_id = self.config.id
        return runtime

    # -- parts ----------------------------------------------------------------------------------

    @property
    def taskset(self) -> Taskset:
        if self._taskset is None:
            self.check_config()
            taskset = self.make_taskset()
            # Decontamination loads benchmarks as environments: the taskset gets the loader
            # from here, the layer above it, instead of importing it.
            taskset.load_benchmark = load_environment
            self._taskset = taskset
        return self._taskset

    @property
    def harness(self) -> Harness:
        if self._harness is None:
            self.check_config()
            harness = self.make_harness()
            harness.check_config()  # a bad prompt format or few-shot file: before any model loads
            self._harness = harness
        return self._harness

    @property
    def runtime(self) -> Runtime:
        if self._runtime is None:
            self.check_config()
            self._runtime = self.make_runtime()
        return self._runtime

    def tasks(self) -> list[Task]:
        """The taskset's tasks, loaded, validated and filtered."""
        return self.taskset.tasks()

    def check_parts(self) -> None:
        """Refuse, before anything starts, a harness and runtime that cannot work together (a
        tactic-loop harness on a runtime without tactic mode would make every attempt fail)."""
        harness, runtime = self.harness, self.runtime
        if harness.needs_tactic_sessions and not runtime.supports_tactic_sessions():
            mode = getattr(runtime.config, "mode", None)
            hint = (
                " (--env.runtime.mode oneshot has no REPL; use --env.runtime.mode repl)"
                if mode == "oneshot"
                else ""
            )
            raise ConfigError(
                f"harness {harness.name!r} needs Lean's tactic mode, which runtime "
                f"{runtime.name!r} does not offer here{hint}. Use the `whole-proof` harness, or "
                "a runtime with a REPL."
            )

    # -- life cycle and use ---------------------------------------------------------------------

    async def start(self) -> None:
        """Start the runtime (Lean processes, containers, sandboxes)."""
        await self.runtime.start()

    async def close(self) -> None:
        """Stop the runtime. Safe to call twice."""
        if self._runtime is not None:
            await self._runtime.close()

    async def rollout(
        self, tasks: Sequence[Task], policy: Policy, sampling: SamplingConfig
    ) -> list[list[Rollout]]:
        """``sampling.n`` verified, rewarded rollouts per task (the harness does the work)."""
        return await self.harness.run(tasks, policy, self.runtime, sampling, self.taskset)

    async def __aenter__(self) -> Environment:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        c = self.config
        return (
            f"<{type(self).__name__} {c.id!r} harness={c.harness.name!r} "
            f"runtime={c.runtime.name!r}>"
        )


def _instantiate(cls: Any, base: type, config: Any, what: str) -> Any:
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ConfigError(f"{what} {cls!r} is not a subclass of leanrl.{base.__name__}")
    factory: Any = cls
    return factory(config)


def load_environment(
    env: str | EnvironmentConfig = "minif2f",
    *,
    harness: str | HarnessConfig | None = None,
    runtime: str | RuntimeConfig | None = None,
    **taskset: Any,
) -> Environment:
    """Build an environment by id. Keyword arguments go to its :class:`TasksetConfig`.

    >>> env = load_environment("minif2f", split="test", limit=20, path="data/minif2f.jsonl")

    Nothing is loaded or started yet: ``env.tasks()`` loads the theorems and ``await env.start()``
    (or ``async with env``) starts Lean.
    """
    if isinstance(env, EnvironmentConfig):
        if harness is not None or runtime is not None or taskset:
            raise ConfigError("pass either an EnvironmentConfig or keyword arguments, not both")
        config = env
    else:
        hcfg = HarnessConfig(name=harness) if isinstance(harness, str) else harness
        rcfg = RuntimeConfig(name=runtime) if isinstance(runtime, str) else runtime
        config = EnvironmentConfig(
            id=env,
            taskset=TasksetConfig(**taskset),
            harness=hcfg or HarnessConfig(),
            runtime=rcfg or RuntimeConfig(),
        )
    cls = registry.resolve("environments", config.id)
    if isinstance(cls, type) and issubclass(cls, Environment):
        return cls(config)
    if callable(cls):  # a factory function registered instead of a class
        made = cls(config)
        if isinstance(made, Environment):
            return made
    raise ConfigError(
        f"environment {config.id!r} resolved to {cls!r}, which is neither an Environment "
        "subclass nor a function returning one"
    )
