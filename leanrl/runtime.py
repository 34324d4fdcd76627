"""Runtime: where Lean runs. One method matters: ``await runtime.check(attempts)``.

A runtime owns Lean processes (local pool, Docker containers, Modal Sandboxes) and keeps bad proofs
from hurting anything else. Every submitted attempt gets exactly one :class:`~leanrl.Verdict`, in
order; a hang, crash or memory blow-up is a Verdict, never an exception.

Subclass :class:`Runtime` and implement :meth:`Runtime.check`; add :meth:`Runtime.tactic_session`
if the runtime supports REPL tactic mode (the ``tactic-loop`` harness needs it).
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from leanrl._sandbox_config import DockerConfig, ModalConfig
from leanrl.errors import ConfigError
from leanrl.verdict import Attempt, Message, Verdict, VerificationPolicy

__all__ = ["Runtime", "RuntimeConfig", "TacticSession", "TacticState"]


class RuntimeConfig(BaseModel):
    """Where and how Lean runs. Fields apply to every runtime unless they say otherwise."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    name: str = "local"
    """Runtime id: ``local`` (a pool of Lean processes here), ``docker`` or ``modal``, or a
    third-party runtime registered under the ``leanrl.runtimes`` entry-point group."""
    lean_project: Path | None = None
    """A Lean project (with Mathlib built, if the taskset needs it) to run Lean in. Default: the
    ``LEANRL_LEAN_PROJECT`` environment variable, then the project ``leanrl setup`` made."""
    mode: Literal["repl", "oneshot"] = "repl"
    """``repl``: warm Lean REPL processes, header loaded once per process (fast).
    ``oneshot``: one ``lake env lean`` process per attempt (slow; needs no REPL build)."""
    workers: int = Field(default=0, ge=0)
    """Attempts in flight at once (Lean processes in the pool). 0 means one per CPU core."""
    timeout_s: float = Field(default=60.0, gt=0)
    """Per-attempt wall-clock limit; past it the process is killed and replaced."""
    memory_mb: int = Field(default=8192, ge=64)
    """Per-process memory cap (address space / RSS limit), in MiB."""
    recycle_after: int = Field(default=200, ge=1)
    """Replace a REPL process after this many attempts (bounds memory growth)."""
    recycle_memory_mb: int = Field(default=6144, ge=64)
    """Replace a REPL process once its resident memory passes this many MiB."""
    judges: int = Field(default=0, ge=0)
    """Trusted checker processes per header, beside the ``workers`` that elaborate attempts
    (0: one per four workers). A judge only reads compiled constants and replays them through
    the kernel, which takes a fraction of the time elaboration took."""
    isolate: bool | None = None
    """Run each Lean process under bubblewrap: read-only file system, no network, a private
    ``/tmp``, and only its own scratch folder visible (Linux). None (the default): on wherever
    bubblewrap works; where it does not, refuse to start unless ``LEANRL_ALLOW_UNSANDBOXED=1``.
    True: refuse to start without it. False: off -- an attempt that manages to run code while
    it is elaborated then runs as this user and can interfere with the trusted checker; only
    for proofs from a trusted source (docs/verification.md)."""
    startup_timeout_s: float = Field(default=600.0, gt=0)
    """How long a fresh process may take to load its header (``import Mathlib`` is slow)."""
    docker: DockerConfig = Field(default_factory=DockerConfig)
    """Settings used only by the ``docker`` runtime."""
    modal: ModalConfig = Field(default_factory=ModalConfig)
    """Settings used only by the ``modal`` runtime."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Free-form settings for third-party runtimes."""


class TacticState(BaseModel):
    """The result of starting a proof or applying a tactic in REPL tactic mode."""

    model_config = ConfigDict(frozen=True)

    proof_state: int | None
    """The REPL's ``proofState`` id to continue from (None after an error)."""
    goals: tuple[str, ...] = ()
    """Remaining goals, pretty-printed by Lean. Empty means the proof is complete."""
    messages: tuple[Message, ...] = ()
    """Messages Lean emitted for this step."""
    error: str | None = None
    """Why the step failed (a Lean error, a timeout, a crash); None when it succeeded."""

    @property
    def solved(self) -> bool:
        """True when the step succeeded and no goals remain."""
        return self.error is None and not self.goals


class TacticSession(abc.ABC):
    """A proof in progress, pinned to one Lean process (REPL tactic mode)."""

    @abc.abstractmethod
    async def start(self, formal_statement: str, preamble: str = "") -> TacticState:
        """Elaborate ``formal_statement`` (ending in ``:= by``) with a hole and return its goal."""

    @abc.abstractmethod
    async def apply(self, proof_state: int, tactic: str) -> TacticState:
        """Run ``tactic`` on ``proof_state``; return the new state or the error."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release the process. Default: nothing to do."""


class Runtime(abc.ABC):
    """Base class of every runtime. ``__init__`` does no work; call :meth:`start` (or use
    ``async with``) before :meth:`check`."""

    name: ClassVar[str] = ""
    """Registry id of the runtime (``local``, ``docker``, ...)."""
    description: ClassVar[str] = ""
    """One line for ``leanrl envs``."""

    def __init__(self, config: RuntimeConfig | None = None) -> None:
        self.config = config or RuntimeConfig(name=self.name or "local")
        self.taskset_pins: tuple[str | None, str | None] = (None, None)
        """(Lean toolchain, Mathlib revision) the taskset is written for; set by the
        Environment, so that sandbox images default to the taskset's Lean."""
        self.env_id: str | None = None
        """The environment this runtime serves (set by the Environment): errors name the
        ``leanrl setup --env ID`` to run."""

    def preflight(self) -> None:  # noqa: B027 - optional hook
        """Cheap checks, without starting anything: raise the error :meth:`start` would raise
        (e.g. :class:`~leanrl.LeanNotFoundError` for a missing Lean project), so that callers
        can report every problem at once before loading a model. Default: nothing to check."""

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Start processes, containers or sandboxes. Idempotent."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Stop everything :meth:`start` started. Idempotent; safe after a crash."""

    def supports_tactic_sessions(self) -> bool:
        """Whether :meth:`tactic_session` works here (the ``tactic-loop`` harness needs it).
        Default: when the runtime overrides it."""
        return type(self).tactic_session is not Runtime.tactic_session

    def check_piece(self) -> int:
        """How many attempts of a batch may be sent in one :meth:`check` call without changing
        how the runtime works (1 for a pool that checks attempts one by one anyway; the batch
        size of a runtime that batches). The eval runner splits batches this way so that its
        progress bar moves per attempt. 0 (the default): keep batches whole."""
        return 0

    def check_capacity(self) -> int:
        """About how many attempts this runtime checks at once (its Lean processes); 0 (the
        default): unknown. A streaming harness that knows it keeps about that many attempts in
        flight and hands over the others in task order, so that a step's groups get their
        verdicts one after another instead of all near the end (GRPO's ``stream_training``
        then trains each early group while the later ones are checked); 0 sends every attempt
        at once, in the order it arrived."""
        return 0

    async def lean_version(self) -> str | None:
        """The version of the Lean that checks attempts, as that Lean reports it (e.g.
        ``4.24.0``), so that reports show what ran rather than what the taskset asked for.
        None when unknown (the default). Called after :meth:`start`."""
        return None

    def problems(self) -> list[str]:
        """What keeps this runtime from checking attempts right now, one line each, prefixed
        ``infra:`` (a fault of the machinery, which retrying or a new sandbox may fix) or
        ``header:`` (Lean refuses a taskset header). ``GET /health`` of ``leanrl serve`` reports
        them, and answers ``degraded`` while an ``infra:`` one lasts, so that a sandbox pool
        replaces the sandbox. Default: none."""
        return []

    def isolation(self) -> tuple[bool | None, str]:
        """Whether this runtime's Lean processes are isolated from each other, and if not, why.

        ``(True, "")``: each runs in its own sandbox (the ``local`` runtime under bubblewrap:
        own namespaces, read-only file system, only its own scratch folder), so code that one
        attempt manages to run while it is elaborated cannot reach the processes or files that
        check later attempts. ``(False, why)``: they are not. ``(None, "")``: the runtime cannot
        tell, or has not started (the default). ``GET /health`` of ``leanrl serve`` reports it,
        and the sandbox pools give a sandbox more than one batch only when it is True
        (``PoolConfig.reuse``)."""
        return None, ""

    def metrics(self) -> dict[str, float]:
        """Counters and costs so far, numbers only (processes started and killed, sandbox- and
        CPU-seconds, ...). The eval runner writes them to ``summary.json`` and the trainers to
        every ``metrics.jsonl`` row, prefixed ``runtime/``. Default: none."""
        return {}

    @abc.abstractmethod
    async def check(self, attempts: Sequence[Attempt]) -> list[Verdict]:
        """Check every attempt; return one Verdict per attempt, in the same order."""

    def tactic_session(
        self, header: str, policy: VerificationPolicy | None = None
    ) -> AbstractAsyncContextManager[TacticSession]:
        """A REPL tactic-mode session under ``header``; tactics are judged by ``policy`` (the
        taskset's rules; default: the strict :class:`~leanrl.VerificationPolicy`) before they reach
        Lean. Runtimes without tactic mode raise."""
        raise ConfigError(
            f"runtime {self.name!r} does not support tactic mode; use the `whole-proof` harness "
            "or a runtime with a REPL (`local` in `repl` mode, `docker`, `modal`)"
        )

    def check_sync(self, attempts: Sequence[Attempt]) -> list[Verdict]:
        """Blocking :meth:`check` for scripts and notebooks (starts and closes the runtime).

        Inside a running event loop (Jupyter), it runs on a private loop in a worker thread.
        """

        async def go() -> list[Verdict]:
            async with self:
                return await self.check(attempts)

        return run_sync(go())

    async def __aenter__(self) -> Runtime:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


def run_sync(coro: Any) -> Any:
    """Run a coroutine to completion from sync code, also inside Jupyter's running loop."""
    try:
        asyncio.get_running_loop()
        running = True
    except RuntimeError:
        running = False
    if not running:
        # Outside the `except` block: an error of the run must not be shown as raised "during
        # handling of" the no-running-loop RuntimeError (a confusing first traceback).
        return asyncio.run(coro)
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()
