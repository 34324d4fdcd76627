"""The ``local`` runtime: a pool of warm Lean REPL processes on this machine (or one-shot ``lean``).

Configured by :class:`~leanrl.RuntimeConfig` (``mode``, ``workers``, ``judges``, ``timeout_s``,
``memory_mb``, ``recycle_after``, ``recycle_memory_mb``, ``isolate``, ``lean_project``). Keys
understood in ``RuntimeConfig.options``: ``spares`` (warm spare processes, default 1),
``repl_command`` and ``lean_command`` (explicit command lines, for custom installs and for
tests), ``cwd``, and the pool's start back-off (``start_retries``, ``start_backoff_s``,
``max_start_backoff_s``; see :class:`~leanrl.lean.pool.PoolConfig`).

Lean processes are started directly (``lake env`` is resolved once, here), with a minimal
environment, and under bubblewrap wherever it works (see
:mod:`leanrl.lean.trust.containment`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections.abc import AsyncIterator, Coroutine, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, ClassVar

from leanrl.errors import ConfigError, LeanNotFoundError, RuntimeUnavailable
from leanrl.lean.oneshot import OneShotChecker
from leanrl.lean.pool import PoolConfig, PoolError, ReplPool, tactic_capacity
from leanrl.lean.project import find_project, lean_command, repl_command, resolve_lake_env
from leanrl.lean.protocol import ProtocolError
from leanrl.lean.repl import ReplDied, ReplMemory, ReplTimeout
from leanrl.lean.tactic_input import prescan_tactic
from leanrl.lean.trust.containment import isolation_problem
from leanrl.lean.worker import ReplWorker
from leanrl.runtime import Runtime, RuntimeConfig, TacticSession, TacticState
from leanrl.verdict import Attempt, Verdict, VerificationPolicy

__all__ = [
    "ALLOW_UNSANDBOXED",
    "OPTIONS",
    "LocalRuntime",
    "LocalTacticSession",
    "isolation_refused",
    "resolve_isolation",
]

log = logging.getLogger("leanrl.runtime")


POOL_OPTIONS = ("start_retries", "start_backoff_s", "max_start_backoff_s", "check_reserve")
"""Keys of ``RuntimeConfig.options`` passed on to the pool's :class:`PoolConfig` as they are."""
OPTIONS = ("spares", "repl_command", "lean_command", "cwd", *POOL_OPTIONS)
"""Every key the local runtime reads from ``RuntimeConfig.options``."""


def check_options(options: dict[str, Any]) -> None:
    """A one-line :class:`ConfigError` for a key of ``runtime.options`` the local runtime does
    not read (a typo such as ``start_retires`` was ignored without a word, and the pool ran on
    its default), with the nearest known key, or for a value of the wrong type."""
    import difflib

    from pydantic import TypeAdapter, ValidationError

    for key, value in options.items():
        if key not in OPTIONS:
            close = difflib.get_close_matches(str(key), OPTIONS, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"runtime.options has the key {key!r}, which the local runtime does not read"
                f"{hint}. It reads: {', '.join(OPTIONS)}"
            )
        field = PoolConfig.model_fields.get(key) if key in (*POOL_OPTIONS, "spares") else None
        if field is None:
            continue
        try:
            kind: Any = Annotated[(field.annotation, *field.metadata)]  # with its bounds
            TypeAdapter(kind).validate_python(value)
        except ValidationError as e:
            why = e.errors()[0]["msg"]
            raise ConfigError(f"runtime.options.{key} = {value!r}: {why}") from None


ALLOW_UNSANDBOXED = "LEANRL_ALLOW_UNSANDBOXED"
"""Set to ``1`` to run Lean without a sandbox where bubblewrap does not work (the environment
form of ``runtime.isolate = false``; leanrl's Docker and Modal images set it, as the container
is their boundary to the host)."""


def resolve_isolation(isolate: bool | None) -> bool:
    """``RuntimeConfig.isolate`` made definite: True/False as given (True fails without
    bubblewrap), None as "wherever bubblewrap works". Where it does not, None refuses to start
    unless :data:`ALLOW_UNSANDBOXED` is set: without a sandbox, an attempt that manages to run
    code while it is elaborated (the pre-scan blocks the known ways, not every way) runs as this
    user, next to the trusted checker processes, and can interfere with them."""
    if isolate is False:
        log.warning(
            "Lean processes run WITHOUT a sandbox (runtime.isolate = false): use this only for "
            "proofs from a trusted source"
        )
        return False
    problem = isolation_problem()
    if problem is None:
        return True
    refused = isolation_refused(isolate)
    if refused is not None:
        raise refused
    log.warning(
        "\n%s\nLean processes run WITHOUT a sandbox: %s.\nAn attempt that manages to run code "
        "while it is elaborated can read this user's files, reach the network and interfere "
        "with the trusted checker processes, so verdicts are only as safe as the pre-scan. %s"
        "\n%s",
        "!" * 78,
        problem,
        _ISOLATION_FIX,
        "!" * 78,
    )
    return False


_ISOLATION_FIX = (
    "Install bubblewrap (apt-get install bubblewrap) or use the docker runtime. For proofs "
    "from a trusted source only, set --env.runtime.isolate false (or "
    f"{ALLOW_UNSANDBOXED}=1)."
)


def _not_isolated_why(isolate: bool | None) -> str:
    """Why :func:`resolve_isolation` gave False, in one line for ``GET /health``."""
    if isolate is False:
        return "runtime.isolate = false"
    return f"{isolation_problem()} ({ALLOW_UNSANDBOXED}=1)"


def isolation_refused(isolate: bool | None) -> RuntimeUnavailable | None:
    """The error :func:`resolve_isolation` raises for ``isolate`` here, without its warnings
    (None when it would not raise), so that a preflight can report it before anything starts."""
    if isolate is False:
        return None
    problem = isolation_problem()
    if problem is None or (not isolate and os.environ.get(ALLOW_UNSANDBOXED) == "1"):
        return None
    return RuntimeUnavailable(
        f"Lean processes cannot be sandboxed here: {problem}. Without a sandbox, an attempt "
        "that manages to run code while it is elaborated can interfere with the trusted "
        f"checker and forge verdicts. {_ISOLATION_FIX}"
    )


class LocalRuntime(Runtime):
    """Lean on this machine: warm REPL pool (``repl`` mode) or one ``lean`` per attempt."""

    name: ClassVar[str] = "local"
    description: ClassVar[str] = (
        "Lean on this machine: a pool of warm REPL processes per header (or one-shot `lean`)"
    )

    def __init__(self, config: RuntimeConfig | None = None) -> None:
        super().__init__(config)
        self.pool: ReplPool | None = None
        self.oneshot: OneShotChecker | None = None
        self._isolated: tuple[bool, str] | None = None
        """What :meth:`start` resolved ``isolate`` to, and why not isolated (None: not started)."""

    def _workers(self) -> int:
        return self.config.workers or os.cpu_count() or 1

    def _option_command(self, key: str) -> list[str] | None:
        v = self.config.options.get(key)
        if v is None:
            return None
        if isinstance(v, str):
            return v.split()
        if isinstance(v, list) and all(isinstance(x, str) for x in v):
            return list(v)
        raise ConfigError(f"runtime.options.{key} must be a command line (a string or a list)")

    def _cwd(self, default: Path | None) -> Path | None:
        cwd = self.config.options.get("cwd")
        return Path(cwd) if cwd else default

    def preflight(self) -> None:
        """Check ``options``, find the Lean project and the REPL (or ``lean``), and check that
        Lean can be sandboxed as configured, without starting anything."""
        check_options(self.config.options)
        self._find_lean()
        refused = isolation_refused(self.config.isolate)
        if refused is not None:
            raise refused

    def _project(self) -> Path | None:
        return find_project(self.config.lean_project, env_id=self.env_id)

    def _find_lean(self) -> None:
        # Lean before the sandbox: without Lean nothing runs, so its LeanNotFoundError (with how
        # to set Lean up) is the first thing a new machine should be told.
        cfg = self.config
        if cfg.mode == "repl" and self._option_command("repl_command") is None:
            repl_command(self._project(), env_id=self.env_id)
        elif cfg.mode == "oneshot" and self._option_command("lean_command") is None:
            lean_command(self._project())

    async def lean_version(self) -> str | None:
        """What ``lean --version`` says in the Lean project (or ``options.lean_command``); the
        project's ``lean-toolchain`` file when Lean cannot be asked; None without a project."""
        cmd = self._option_command("lean_command")
        cwd: Path | None = None
        project = None
        try:
            project = self._project()
            if cmd is None:
                cmd, cwd = lean_command(project)
        except LeanNotFoundError:
            pass
        if cmd is not None:
            found = await _ask_version([*cmd, "--version"], self._cwd(cwd))
            if found:
                return found
        pin = project / "lean-toolchain" if project is not None else None
        if pin is not None and pin.is_file():
            return pin.read_text(encoding="utf-8").strip() or None
        return None

    def check_piece(self) -> int:
        """1: the pool checks each attempt on its own process anyway."""
        return 1

    def check_capacity(self) -> int:
        """The pool's elaborating workers and its judges (an attempt that is being judged no
        longer holds a worker); one-shot mode: its ``workers``."""
        workers = self._workers()
        if self.config.mode != "repl":
            return workers
        return workers + (self.config.judges or max(1, math.ceil(workers / 4)))

    def supports_tactic_sessions(self) -> bool:
        """Only warm REPL processes have tactic mode (not one-shot ``lean``)."""
        return self.config.mode == "repl"

    def problems(self) -> list[str]:
        """The pool's keys that cannot start processes now (see :meth:`ReplPool.problems`)."""
        return self.pool.problems() if self.pool is not None else []

    def isolation(self) -> tuple[bool | None, str]:
        """``(True, "")`` once started with every Lean process under bubblewrap (each sees only
        its own scratch folder, in its own namespaces); ``(False, why)`` once started without
        it; ``(None, "")`` before :meth:`start` and after :meth:`close`."""
        if (self.pool is None and self.oneshot is None) or self._isolated is None:
            return None, ""
        return self._isolated

    def metrics(self) -> dict[str, float]:
        """The pool's counters: processes started, killed, recycled, attempts checked, ..."""
        if self.pool is None:
            return {}
        return {k: float(v) for k, v in self.pool.stats.model_dump().items()}

    async def start(self) -> None:
        """Find Lean and set up the pool (processes start on first use). Idempotent."""
        if self.pool is not None or self.oneshot is not None:
            return
        cfg = self.config
        check_options(cfg.options)
        await asyncio.to_thread(self._find_lean)
        isolate = await asyncio.to_thread(resolve_isolation, cfg.isolate)
        self._isolated = (isolate, "" if isolate else _not_isolated_why(cfg.isolate))
        if cfg.mode == "repl":
            found = self._option_command("repl_command")
            cwd: Path | None = None
            if found is None:
                found, cwd = repl_command(self._project(), env_id=self.env_id)
            # Run the REPL itself, not `lake env` around it: lake could write to the project
            # (read-only in the sandbox), and the REPL must be the child that dies with us.
            cmd, env = await asyncio.to_thread(resolve_lake_env, found, cwd)
            spares = int(cfg.options.get("spares", 1))
            backoff = {k: cfg.options[k] for k in POOL_OPTIONS if k in cfg.options}
            self.pool = ReplPool(
                PoolConfig(
                    **backoff,  # type: ignore[arg-type]
                    command=cmd,
                    cwd=self._cwd(cwd),
                    env=env,
                    workers=self._workers(),
                    spares=spares,
                    judges=cfg.judges or None,
                    timeout_s=cfg.timeout_s,
                    memory_mb=cfg.memory_mb,
                    recycle_after=cfg.recycle_after,
                    recycle_memory_mb=cfg.recycle_memory_mb,
                    isolate=isolate,
                    startup_timeout_s=cfg.startup_timeout_s,
                )
            )
            await self.pool.start()
        else:
            found = self._option_command("lean_command")
            cwd = None
            if found is None:
                found, cwd = lean_command(self._project())
            cmd, env = await asyncio.to_thread(resolve_lake_env, found, cwd)
            self.oneshot = OneShotChecker(
                cmd,
                cwd=self._cwd(cwd),
                env=env,
                workers=self._workers(),
                timeout_s=cfg.timeout_s,
                memory_mb=cfg.memory_mb,
                isolate=isolate,
            )
            try:
                await self.oneshot.start()
            except OSError as e:
                self.oneshot = None
                raise LeanNotFoundError(f"cannot run {cmd[0]!r}: {e}") from e

    async def close(self) -> None:
        """Stop every Lean process. Idempotent."""
        if self.pool is not None:
            await self.pool.close()
            self.pool = None
        if self.oneshot is not None:
            await self.oneshot.close()
            self.oneshot = None

    async def check(self, attempts: Sequence[Attempt]) -> list[Verdict]:
        """One verdict per attempt, in order (starts the runtime if needed)."""
        await self.start()
        if self.pool is not None:
            return await self.pool.check(attempts)
        assert self.oneshot is not None
        return await self.oneshot.check(attempts)

    @property
    def max_tactic_sessions(self) -> int | None:
        """Tactic sessions that can be open at once: each pins a process, and the pool lets
        sessions pin all of its ``workers + spares`` but those kept for checks
        (``options.check_reserve``, 1; at least one session;
        :func:`~leanrl.lean.pool.tactic_capacity`); a caller holding more while waiting
        for another would wait forever. None in one-shot mode (no sessions)."""
        if self.config.mode != "repl":
            return None
        return tactic_capacity(
            self._workers(),
            int(self.config.options.get("spares", 1)),
            int(self.config.options.get("check_reserve", 1)),
        )

    def tactic_session(
        self, header: str, policy: VerificationPolicy | None = None
    ) -> AbstractAsyncContextManager[TacticSession]:
        """A REPL tactic-mode session under ``header``, pinned to one warm process.

        Every tactic (and preamble) is pre-scanned under ``policy`` (default: the strict
        :class:`~leanrl.VerificationPolicy`) and never sent when it holds a construct that runs
        code; the process comes from the pool's tactic sub-pool and never checks proofs.
        """
        if self.config.mode != "repl":
            return super().tactic_session(header)
        return self._session(header, policy or VerificationPolicy())

    @asynccontextmanager
    async def _session(
        self, header: str, policy: VerificationPolicy
    ) -> AsyncIterator[TacticSession]:
        await self.start()
        pool = self.pool
        assert pool is not None
        try:
            worker = await pool.acquire(header)
        except PoolError as e:
            raise RuntimeUnavailable(f"no Lean process for this header: {e}") from e
        session = LocalTacticSession(worker, header, self.config.timeout_s, policy)
        try:
            yield session
        finally:
            await pool.release(header, worker, broken=session.broken is not None)


class LocalTacticSession(TacticSession):
    """A proof in progress in one REPL process. A timeout or crash ends the session: later
    steps answer with an error instead of raising. Model text (tactics, preamble) is pre-scanned
    under ``policy`` and a rejected one is answered with an error without reaching Lean."""

    def __init__(
        self,
        worker: ReplWorker,
        header: str,
        timeout_s: float,
        policy: VerificationPolicy | None = None,
    ) -> None:
        self.worker = worker
        self.header = header
        self.timeout_s = timeout_s
        self.policy = policy or VerificationPolicy()
        self.broken: str | None = None

    async def start(self, formal_statement: str, preamble: str = "") -> TacticState:
        """Elaborate ``formal_statement`` with a ``sorry`` hole and return its goal."""
        rejected = await _prescan(preamble, self.policy) if preamble.strip() else None
        if rejected is not None:
            return TacticState(proof_state=None, error=rejected)
        return await self._guard(
            self.worker.tactic_start(self.header, formal_statement, preamble, self.timeout_s)
        )

    async def apply(self, proof_state: int, tactic: str) -> TacticState:
        """Run ``tactic`` (one tactic or a block of them) on ``proof_state``."""
        rejected = await _prescan(tactic, self.policy)
        if rejected is not None:
            return TacticState(proof_state=None, error=rejected)
        return await self._guard(self.worker.tactic_apply(proof_state, tactic, self.timeout_s))

    async def _guard(self, coro: Coroutine[Any, Any, TacticState]) -> TacticState:
        if self.broken:
            coro.close()
            return TacticState(proof_state=None, error=f"session ended: {self.broken}")
        try:
            return await coro
        except asyncio.CancelledError:
            # The REPL may still be writing the answer to the cancelled step; the next reader
            # would take it for its own. The process is killed, not returned to the pool.
            self.broken = "cancelled mid-step"
            await asyncio.shield(self.worker.proc.kill())
            raise
        except ReplTimeout as e:
            self.broken = f"timeout ({e})"
        except ReplMemory as e:
            self.broken = f"memory ({e})"
        except (ReplDied, ProtocolError, OSError) as e:
            self.broken = f"crash ({e})"
        await self.worker.proc.kill()
        return TacticState(proof_state=None, error=self.broken)


_INLINE_CHARS = 16_000
"""Tactic text up to this size is pre-scanned on the event loop (a few ms at most); a longer
one goes to a thread, so a hostile megabyte of tactic cannot stall every other session."""


async def _prescan(text: str, policy: VerificationPolicy) -> str | None:
    if len(text) <= _INLINE_CHARS:
        return prescan_tactic(text, policy)
    return await asyncio.to_thread(prescan_tactic, text, policy)


async def _ask_version(cmd: list[str], cwd: Path | None) -> str | None:
    """``4.24.0`` from ``Lean (version 4.24.0, x86_64-unknown-linux-gnu, ...)``, or None."""
    import re

    try:
        proc = await asyncio.create_subprocess_exec(
            *cmd,
            cwd=cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
    except OSError:
        return None
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 60.0)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        return None
    m = re.search(r"version (\d+\.\d+\.\d+(?:-rc\d+)?)", out.decode(errors="replace"))
    return m.group(1) if m else None
