"""Streamed training: a synchronous GRPO step learns from each group as soon as it is checked.

A synchronous step used to be generate → check → train, with the trainer idle until the step's
last attempt had its verdict. But a group's advantages need only its own rewards
(``scale_rewards`` ``group`` or ``none``), and every sample's loss is a sum over its tokens
divided by a denominator of the whole batch (``dapo``: its loss tokens; ``grpo``: its sequences;
``dr_grpo``: sequences × ``norm_len``). So with ``stream_training`` each group's forward and
backward run as soon as the harness reports the group final (:func:`leanrl.harness.report_group`),
with the *unnormalised* sums, while later groups are still generated and checked; once the last
group is in, the accumulated gradient is divided by the batch's denominator, and the step clips,
updates and moves on as before::

    ∇J = (1/D) · Σ_groups Σ_j Σ_t c_j ∇l_t        c_j = 1/|o_j| (grpo), 1 (dapo, dr_grpo)

Nothing is stale: the weights do not change until the step's one update, so every group is
trained on the weights that sampled it, and the update is the synchronous step's up to float
rounding (a test checks). Groups are trained in task order (group i waits for groups < i), each
in its own micro-batches, so a run repeats bit for bit whatever the timing, and resumes exactly.

Dynamic sampling's refill rounds stream too: each round's informative groups are trained in
task order until the step has ``tasks_per_step`` of them, the ones ``_collect`` keeps. Where the
sums are not linear in the groups, or the weights are touched between groups, it is off
(:func:`resolve_stream_training` says why): ``scale_rewards = "batch"``, several passes or
mini-batches, async mode (the pipeline already overlaps), failure replay (its groups join the
step's), a distillation teacher (it scores the kept groups after the rollout), several ranks,
and LoRA with a KL term (its reference is the model with the adapters off, which the sampler
would see). With ``hf`` the sampler generates on the model being trained and switches it to
eval mode while it decodes, so whatever depends on that mode is ruled out as well: dropout
(the model's or LoRA's), gradient checkpointing, and ``logprob_chunk`` (its tiles replace the
shared head's forward during a pass).

The groups that finish first are trained first only if the checks finish group by group: a
runtime that says how many attempts it checks at once (:meth:`Runtime.check_capacity`) gets
the whole-proof harness's attempts in task order (:class:`CheckBatcher`), so a step's groups
get their verdicts one after another rather than all near its end.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar, cast

from leanrl.errors import ConfigError, PolicyError
from leanrl.rollout import Rollout, check_rewards
from leanrl.task import Task
from leanrl.train.grpo.data import _Sample
from leanrl.train.grpo.report import _informative
from leanrl.train.shaping import shape_groups

if TYPE_CHECKING:
    from leanrl.train.grpo.config import GRPOConfig

__all__ = ["GroupStream", "StepSums", "StreamChoice", "resolve_stream_training"]

T = TypeVar("T")


class StreamChoice(NamedTuple):
    """What ``stream_training`` resolved to, and why (the line a run logs at its start)."""

    on: bool
    reason: str

    def line(self) -> str:
        return f"stream training: {'on' if self.on else 'off'} ({self.reason})"


def _blockers(cfg: GRPOConfig, world_size: int) -> list[str]:
    """Why groups cannot be trained on before the step's last one is in (empty: they can)."""
    out = []
    if cfg.async_mode:
        out.append("async_generation is on (the pipeline overlaps training already)")
    if world_size > 1:
        out.append(f"{world_size} ranks (each backward is a collective, in step on every rank)")
    if cfg.ppo_epochs != 1 or cfg.minibatches != 1:
        out.append("several passes or mini-batches (the first update lands mid-batch)")
    if cfg.reward_scale == "batch":
        out.append("scale_rewards = 'batch' (advantages need every group's rewards)")
    if cfg.replay.enabled:
        out.append("failure replay (its groups join the step's)")
    if cfg.distill.teacher is not None or cfg.distill.experts:
        out.append("a distillation teacher (it scores the kept groups after the rollout)")
    if cfg.lora.enabled and cfg.beta > 0:
        out.append("LoRA with beta > 0 (the reference turns the adapters off)")
    if cfg.policy.backend == "hf":
        # The hf sampler generates on the very model being trained, in eval mode (it switches
        # the shared model there and back): a group's pass during a decode runs in eval mode.
        shared = "the hf sampler switches the shared model to eval mode mid-pass"
        if not cfg.disable_dropout:
            out.append(f"dropout is on ({shared})")
        if cfg.lora.enabled and cfg.lora.dropout > 0:
            out.append(f"LoRA dropout > 0 ({shared})")
        if cfg.gradient_checkpointing:
            out.append(f"gradient checkpointing ({shared}, which turns checkpointing off)")
        if cfg.logprob_chunk is not None:
            out.append("logprob_chunk (its tiles replace the head's forward that the hf sampler "
                       "shares)")  # fmt: skip
    return out


def resolve_stream_training(cfg: GRPOConfig, world_size: int) -> StreamChoice:
    """Whether this run's synchronous steps train each group as it is checked, and why.

    ``true`` with a blocker is refused (a :class:`ConfigError` naming it and the fix); ``auto``
    (the default) is on for the ``hf`` backend wherever nothing blocks it (measured faster at
    the same reward: docs/training-grpo.md, "Against TRL"), off otherwise with the reason."""
    want = cfg.stream_training
    if want is False:
        return StreamChoice(False, "stream_training = false")
    blockers = _blockers(cfg, world_size)
    if want is True:
        if blockers:
            raise ConfigError(
                "stream_training = true cannot work here: " + "; ".join(blockers)
                + ". Change that, or set stream_training = 'auto' (off where it cannot work)"
            )  # fmt: skip
        return StreamChoice(True, "stream_training = true")
    if blockers:
        return StreamChoice(False, "auto: " + blockers[0])
    if cfg.policy.backend != "hf":
        return StreamChoice(False, f"auto: measured on the hf backend only, not on "
                            f"{cfg.policy.backend!r}; set stream_training = true to try it")  # fmt: skip
    return StreamChoice(True, "auto: hf, one process, one update per step")


@dataclass
class StepSums:
    """One streamed step's running sums: what ``train_step`` would have seen in one go."""

    acc: dict[str, float] = field(default_factory=dict)  # the loss's metric sums (engine's)
    loss: float = 0.0  # Σ of the unnormalised micro-batch losses
    n_seqs: int = 0  # sequences with a loss token
    n_tokens: int = 0  # loss tokens
    made: list[_Sample] = field(default_factory=list)  # every sample of the kept groups
    seconds: float = 0.0  # wall time of the groups' forward/backward, overlapped or not


class GroupStream:
    """One step's groups, trained in task order as they are reported final.

    ``listener`` is what :func:`leanrl.harness.listen_for_groups` gets: it files a reported
    group under its task's place (tasks are matched by identity; an unknown or repeated task is
    ignored and taken at the end). A worker task trains group i once groups < i are done: it
    checks and shapes the rewards as ``_collect`` does, keeps the group if informative, and
    accumulates its gradient (``engine.accumulate`` in a thread). :meth:`finish` hands over the
    rollout's final groups (the ones never reported are trained then), waits for the worker and
    checks that no reported group changed after it was reported."""

    def __init__(
        self,
        engine: Any,
        cfg: GRPOConfig,
        label: str,
        tasks: Sequence[Task],
        sums: StepSums,
        room: int | None = None,
    ) -> None:
        """``label``: the round, for messages (``step 3``, ``step 3 (refill round 1)``);
        ``sums``: the step's, shared by its refill rounds; ``room``: how many more groups
        the step keeps (refill: the first informative ones in task order; None: no limit)."""
        self.engine, self.cfg, self.label = engine, cfg, label
        self.n = len(tasks)
        self.room = room
        ids = [id(t) for t in tasks]
        # A task twice in one batch (an epoch boundary, a small taskset): which of its groups
        # a report is cannot be told, so both are taken at the end (and the groups after them
        # wait: task order).
        self.where = {i: k for k, i in enumerate(ids) if ids.count(i) == 1}
        self.ready: dict[int, list[Rollout]] = {}
        self.reported: dict[int, list[Rollout]] = {}
        self.rewards: dict[int, list[float]] = {}  # after shaping, as trained
        self.kept: list[list[Rollout]] = []
        self.sums = sums
        self._next = 0
        self._wake = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        self._pass: asyncio.Future[None] | None = None  # the group pass running in a thread
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._worker = asyncio.ensure_future(self._run())

    async def guard(self, rollout: Awaitable[T]) -> T:
        """Await ``rollout`` (started in the listener's context), failing as soon as a group's
        pass fails (out of memory, a NaN reward) instead of after the whole rollout."""
        job = asyncio.ensure_future(rollout)
        worker = self._worker
        assert worker is not None
        # The worker ends before the rollout only when it failed, or when every group was
        # reported and trained already; it normally outlives the rollout (finish() ends it).
        await asyncio.wait({job, worker}, return_when=asyncio.FIRST_COMPLETED)
        if not job.done() and worker.exception() is not None:
            job.cancel()
            await asyncio.gather(job, return_exceptions=True)
            raise cast(BaseException, worker.exception())
        return await job

    def listener(self, task: Task, group: Sequence[Rollout]) -> None:
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:  # reported from a harness's worker thread
            on_loop = False
        if not on_loop:
            assert self._loop is not None  # start() ran before the rollout
            self._loop.call_soon_threadsafe(self._file, task, list(group))
            return
        self._file(task, list(group))

    def _file(self, task: Task, group: list[Rollout]) -> None:
        k = self.where.get(id(task))
        if k is None or k in self.reported or k < self._next:
            return
        self.reported[k] = self.ready[k] = group
        self._wake.set()

    async def finish(self, groups: Sequence[Sequence[Rollout]]) -> None:
        """The rollout's groups, in task order: train those not reported, wait for all."""
        if len(groups) != self.n:
            await self.cancel()
            raise PolicyError(f"the harness returned {len(groups)} groups for {self.n} tasks")
        for k, g in enumerate(groups):
            got = self.reported.get(k)
            if got is None:
                self.ready[k] = list(g)
            elif [id(x) for x in got] != [id(x) for x in g]:
                await self.cancel()
                raise PolicyError(
                    f"the harness reported a group of task {g[0].task_id if g else k!r} "
                    "(report_group) and then returned other rollouts for it: report a group "
                    "only once it is final"
                )
        self._wake.set()
        assert self._worker is not None
        await self._worker
        for k, g in self.reported.items():
            if [x.reward for x in g] != self.rewards[k]:
                raise PolicyError(
                    f"a reward of task {g[0].task_id!r} changed after its group was reported "
                    "(report_group) and trained on: report a group only once its rewards are set"
                )

    async def cancel(self) -> None:
        if self._worker is not None and not self._worker.done():
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
        if self._pass is not None:  # a thread cannot be stopped: let its pass end first, so
            await asyncio.gather(self._pass, return_exceptions=True)  # nothing writes later

    async def _run(self) -> None:
        while self._next < self.n:
            if self._next not in self.ready:
                self._wake.clear()
                await self._wake.wait()
                continue
            await self._train(self._next, self.ready.pop(self._next))
            self._next += 1

    async def _train(self, k: int, g: list[Rollout]) -> None:
        cfg = self.cfg
        check_rewards(g, self.label, "a NaN or inf would make every weight NaN")
        shape_groups([g], cfg.format_reward, cfg.overlong, cfg.sampling.max_tokens)
        self.rewards[k] = [x.reward for x in g]
        if not _informative(g, cfg.dynamic_sampling):
            return  # dropped, as _collect drops it
        if self.room is not None and len(self.kept) >= self.room:
            return  # refill: past the step's tasks_per_step, cut off as _collect cuts it
        self.kept.append(g)
        samples = self.engine.make_samples([g])
        self.sums.made += samples  # the batch's samples, as _collect would make them
        loop = asyncio.get_running_loop()
        self._pass = loop.run_in_executor(None, self.engine.accumulate, self.sums, samples)
        await asyncio.shield(self._pass)  # cancelled: cancel() still waits for the thread
