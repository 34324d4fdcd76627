"""What the REPL pool (:mod:`leanrl.lean.pool`) is configured with and what it counts."""

from __future__ import annotations

import math
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["PoolConfig", "PoolStats", "tactic_capacity"]


class PoolConfig(BaseModel):
    """How the pool runs its REPL processes (built by the local runtime from RuntimeConfig)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    command: list[str]
    """The REPL command line (for example ``["/path/to/repl"]`` with ``env`` from ``lake env``)."""
    cwd: Path | None = None
    """Folder to run it in (the Lean project)."""
    env: dict[str, str] | None = None
    """Where the processes' environment comes from (None: this process's). Only the variables
    in :data:`~leanrl.lean.trust.containment.ENV_KEYS` are passed on; ``HOME`` and ``TMPDIR``
    point at each process's private folder."""
    workers: int = Field(default=1, ge=1)
    """Attempts in elaboration at once."""
    spares: int = Field(default=1, ge=0)
    """Warm processes kept beside the busy ones, so a kill does not stall the queue."""
    judges: int | None = Field(default=None, ge=1)
    """Trusted checker processes per set of imports (None: one per four workers, at least one)."""
    timeout_s: float = Field(default=60.0, gt=0)
    """Per-attempt wall-clock limit for elaboration and the trusted check together (the check
    gets at least :data:`CHECK_FLOOR_S`); waiting for a free process is not counted."""
    memory_mb: int | None = Field(default=8192, ge=16)
    """Per-process memory cap in MiB (None: no cap)."""
    recycle_after: int = Field(default=200, ge=1)
    """Replace a process after this many attempts (1: a fresh process for every attempt)."""
    recycle_memory_mb: int = Field(default=6144, ge=16)
    """Replace a process once its resident memory passes this many MiB (measured when it is
    released and again before it is handed out; at most 3/4 of ``memory_mb``, so every process
    handed to an attempt has at least a quarter of its cap free)."""
    isolate: bool = False
    """Run each process under bubblewrap: read-only file system, no network, only its own
    private folder visible."""
    startup_timeout_s: float = Field(default=600.0, gt=0)
    """How long a process may take to load its imports (and, for a judge, the checker)."""
    start_retries: int = Field(default=2, ge=1)
    """Failed starts in a row (not caused by the header) before a key's attempts get ``infra``
    instead of waiting. The key is not given up: starts go on after a back-off, and the first
    one that succeeds heals it."""
    start_backoff_s: float = Field(default=1.0, ge=0)
    """Wait before the next start once ``start_retries`` starts in a row have failed; doubled
    for each further failure, up to ``max_start_backoff_s``."""
    max_start_backoff_s: float = Field(default=60.0, ge=0)
    """Longest wait between two starts of a key whose starts keep failing."""
    check_reserve: int = Field(default=1, ge=0)
    """Elaborating processes that tactic sessions can never take: sessions may pin at most
    ``workers + spares - check_reserve`` processes (at least one; the cap is raised by one
    where needed), so checks always have a process, however many sessions are held open."""
    crash_retries: int = Field(default=1, ge=0)
    """Times an attempt whose process died under it (exited or closed its output) is run again
    on a fresh process before it gets ``crash``. A process can die of
    something outside the attempt (killed by an operator or another program's memory pressure,
    or dead while idle before the attempt reached it); only a death that repeats on a fresh
    process is the attempt's own doing. Timeouts and memory overruns are never retried."""
    max_output_mb: float = Field(default=64.0, gt=0)
    """Most output one request may produce before the process is killed (``memory``)."""
    max_pickle_mb: int = Field(default=512, ge=1)
    """Largest compiled environment handed from an elaborating process to a judge."""
    scratch_parent: Path | None = None
    """Where the pool's scratch root is made (None: the system's temporary folder)."""

    @property
    def judge_count(self) -> int:
        """``judges``, or its default for ``workers``."""
        return self.judges or max(1, math.ceil(self.workers / 4))

    @property
    def tactic_cap(self) -> int:
        """Tactic processes that sessions may pin at once (see ``check_reserve``)."""
        return tactic_capacity(self.workers, self.spares, self.check_reserve)

    @property
    def work_cap(self) -> int:
        """Elaborating and tactic processes alive at once: ``workers + spares``, or one more
        where that would leave a session no process beside ``check_reserve``."""
        return max(self.workers + self.spares, self.tactic_cap + self.check_reserve)

    @property
    def recycle_mb(self) -> float:
        """``recycle_memory_mb``, at most 3/4 of ``memory_mb``."""
        if self.memory_mb is None:
            return float(self.recycle_memory_mb)
        return min(float(self.recycle_memory_mb), 0.75 * self.memory_mb)


def tactic_capacity(workers: int, spares: int, check_reserve: int = 1) -> int:
    """Processes tactic sessions may pin at once in a pool of ``workers + spares``: all but
    ``check_reserve`` (which only checks use), and at least one."""
    return max(1, workers + spares - check_reserve)


class PoolStats(BaseModel):
    """Counters, for tests, logs and the benchmark."""

    started: int = 0
    """Processes started successfully (all roles)."""
    start_failures: int = 0
    """Processes that failed to start."""
    killed: int = 0
    """Processes killed after a timeout, memory overrun, flood, crash or protocol error."""
    recycled: int = 0
    """Processes retired after ``recycle_after`` attempts or above the memory threshold."""
    evicted: int = 0
    """Idle processes closed to make room for another header's imports."""
    checked: int = 0
    """Attempts that reached an elaborating process."""
    judged: int = 0
    """Attempts that reached a judge."""
    strays_killed: int = 0
    """Processes an attempt's code started inside an elaborating or tactic process, killed when
    the attempt (or session) ended."""
    start_seconds: float = 0.0
    """Total time spent starting processes."""
    healed: int = 0
    """Keys whose starts had failed ``start_retries`` times in a row and then started again."""
    crash_retried: int = 0
    """Attempts run again on a fresh process after theirs died under them (``crash_retries``)."""
    judge_limits: int = 0
    """Attempts whose trusted check killed, stalled or filled its judge (``judge_limit``); each
    such judge was replaced."""
    max_busy: int = 0
    """Most attempts that were in elaborating processes at the same time."""
