"""An ES population fanned out over launched functions: one ``es_member`` call per member.

:class:`MapScorer` implements the one-method member-scorer interface (``score(state, members)
-> scores``, in member order) over ``Function.map``: every member is one input carrying only
(base model or checkpoint on the Volume, history records, its seed and sign, the task batch,
the decoding settings); results stream back as containers finish them and are put back in
member order. Containers keep their engine warm between iterations and apply only the records
they lack; each takes ``members_per_container`` members at once and pipelines them on its
engine. The orchestrator holds no weights: checkpoints are built by ``es_checkpoint`` on a GPU.

It also accounts what the containers cost: GPU-seconds per container (from its start to its
last call's end, gaps longer than the scale-down window not billed), the Lean sandboxes they
used, and the GPU-idle fraction of each iteration.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, Protocol

from leanrl.costs import Usage, sandbox_usage
from leanrl.environment import EnvironmentConfig
from leanrl.errors import PolicyError
from leanrl.launch.specs import CheckpointCall, MemberCall, MemberResult
from leanrl.policy import PolicyConfig
from leanrl.train.common import RunDir
from leanrl.train.es.fanout import ScorerBase, in_member_order
from leanrl.train.es.history import HistoryRecord, WeightsSource
from leanrl.train.es.pipeline import PipelineDepth
from leanrl.train.es.workers import IterationState, Member, MemberScore

__all__ = ["Functions", "MapScorer"]


class Functions(Protocol):
    """What the scorer needs from a launched app (Modal's, or :class:`LocalFunctions`)."""

    async def start(self) -> None: ...

    def map(self, name: str, inputs: Sequence[Any]) -> Any:
        """An async iterator of ``(index, result)`` as calls finish."""
        ...

    async def call(self, name: str, payload: Any) -> Any: ...

    def with_concurrency(self, name: str, max_inputs: int) -> None:
        """From now on, containers of ``name`` take ``max_inputs`` calls at once."""
        ...

    async def close(self) -> None: ...


class _ContainerBill:
    """Billed GPU time of one container: its start-up, then every call stretched by the
    scale-down window (an idle container stays up, and billed, that long)."""

    def __init__(self, t0: float, kind: str | None, gpus: int) -> None:
        self.t0 = t0
        self.kind = kind
        self.gpus = gpus
        self.spans: list[tuple[float, float]] = []
        self.sandbox: dict[str, float] = {}

    def seconds(self, window: float) -> float:
        spans = sorted(self.spans)
        if not spans:
            return 0.0
        total, (lo, hi) = 0.0, (self.t0, spans[0][1] + window)
        for a, b in spans[1:]:
            if a <= hi:
                hi = max(hi, b + window)
            else:
                total += hi - lo
                lo, hi = a, b + window
        # the last window has not necessarily passed yet: count up to now at most
        return total + min(hi, max(time.time(), spans[-1][1])) - lo


class MapScorer(ScorerBase):
    """Scores members with one ``es_member`` call each (see the module docstring)."""

    remote_weights = True
    """The trainer holds no weights: the engines in the containers do."""

    def __init__(
        self,
        functions: Functions,
        env: EnvironmentConfig,
        policy: PolicyConfig,
        *,
        device: str,
        engine: Literal["inprocess", "vllm"] = "inprocess",
        scaledown_window_s: float = 60.0,
        members_per_container: int | Literal["auto"] = 2,
        path_map: tuple[str, str] | None = None,
        sync: Callable[[], Any] | None = None,
    ) -> None:
        self.functions = functions
        self.env_config = env
        self.policy_config = policy
        self.device = device
        """Where members generate (``cuda`` on Modal): it decides which noise a seed draws."""
        self.engine = engine
        self.window = scaledown_window_s
        self.path_map = path_map
        """(prefix here, prefix on the Volume): paths the orchestrator sees under the first are
        sent as the second (a local orchestrator's mirror of a run folder on the Volume)."""
        self.sync = sync
        """Called before each iteration's fan-out and each checkpoint: makes the run folder's
        state durable on the Volume (mirror it there, or commit the Volume)."""
        self.source: WeightsSource | None = None
        """Set by the trainer: the base model or checkpoint the members start from."""
        self._bills: dict[str, _ContainerBill] = {}
        self.last_idle_frac: float | None = None
        self.control = PipelineDepth(members_per_container)
        """Members per container: fixed, or measured from the containers' G and V."""
        self.last_depth: int | None = None

    @property
    def device_kind(self) -> str:
        return self.device.split(":", 1)[0]

    def _remote(self, path: str | None) -> str | None:
        if path is None or self.path_map is None:
            return path
        here, there = self.path_map
        try:
            rel = Path(path).resolve().relative_to(Path(here).resolve())
        except ValueError:
            return path
        return str(Path(there) / rel)

    async def start(self) -> None:
        await self.functions.start()

    async def score(self, state: IterationState, members: Sequence[Member]) -> list[MemberScore]:
        if self.source is None:
            raise PolicyError("MapScorer.score before the trainer set its weights source")
        if self.sync is not None:
            self.sync()  # the history of the iterations before this one is on the Volume
        src = replace(
            self.source, checkpoint=self._remote(self.source.checkpoint), device=self.device
        )
        calls = [
            MemberCall(
                index=i,
                member=m,
                source=src,
                records=tuple(state.records),
                iteration=state.iteration,
                tasks=tuple(state.tasks),
                sampling=state.sampling,
                sigma=state.sigma,
                env=self.env_config,
                policy=self.policy_config,
                engine=self.engine,
            )
            for i, m in enumerate(members)
        ]
        shares: list[list[int]] = []
        results: list[list[MemberScore]] = []
        windows: dict[str, tuple[float, float]] = {}
        busy = 0.0
        gen: list[float] = []
        check: list[float] = []
        self.last_depth = self.control.depth
        async for index, result in self.functions.map("es_member", calls):
            r: MemberResult = result
            if r.index != index or any(index in sh for sh in shares):
                raise PolicyError(f"es_member answered input {index} with member {r.index}")
            shares.append([index])  # one member per call: results arrive as they finish
            results.append([r.score])
            bill = self._bills.setdefault(
                r.container, _ContainerBill(r.container_t0, r.gpu_kind, r.gpus)
            )
            bill.spans.append((r.t_start, r.t_end))
            bill.sandbox = r.sandbox
            lo, hi = windows.get(r.container, (r.t_start, r.t_end))
            windows[r.container] = (min(lo, r.t_start), max(hi, r.t_end))
            busy += r.busy_s
            gen.append(r.gen_s)
            check.append(r.check_s)
        held = sum(hi - lo for lo, hi in windows.values())
        self.last_idle_frac = max(0.0, 1.0 - busy / held) if held > 0 else None
        self._follow(gen, check)
        return in_member_order(shares, results, len(members))  # member order, or an error

    def _follow(self, gen: list[float], check: list[float]) -> None:
        """An ``auto`` members-per-container follows this iteration's measurement. Sandboxes
        scale out, so only the population caps it; the new concurrency reaches the containers
        through ``Functions.with_concurrency`` (on Modal, a Function that autoscales apart)."""
        if not gen or sum(gen) <= 0:
            return  # nothing measured (containers of an older leanrl): keep the depth
        before = self.control.depth
        self.control.observe(
            statistics.fmean(gen), statistics.fmean(check), items=len(gen), capacity=None
        )
        if self.control.depth != before:
            self.functions.with_concurrency("es_member", self.control.depth)

    def usage(self) -> Usage:
        """GPU-seconds and sandboxes of every container so far (cumulative)."""
        u = Usage()
        for b in self._bills.values():
            if b.kind and b.gpus:
                u = u.add(Usage(gpu_s={b.kind: b.seconds(self.window) * b.gpus}))
            u = u.add(sandbox_usage(b.sandbox))
        return u

    async def checkpoint(
        self,
        run: RunDir,
        iteration: int,
        records: Sequence[HistoryRecord],
        state: dict[str, Any],
        keep: int,
    ) -> Path:
        """Have ``es_checkpoint`` build and save ``checkpoint-<iteration>`` on the Volume."""
        assert self.source is not None
        if self.sync is not None:
            self.sync()
        src = replace(
            self.source, checkpoint=self._remote(self.source.checkpoint), device=self.device
        )
        call = CheckpointCall(
            run_dir=self._remote(str(run.path)) or str(run.path),
            source=src,
            records=tuple(records),
            iteration=iteration,
            state=state,
            keep=keep,
        )
        return Path(str(await self.functions.call("es_checkpoint", call)))

    async def close(self) -> None:
        await self.functions.close()
