"""Failure replay: part of each GRPO step revises the run's own failed attempts.

Kimina-Prover RL (Numina & Kimi Team 2025) fills part of each RL batch with error-correction
prompts: a stored failed attempt plus Lean's errors on it, for one revision, the error text
capped in tokens; Goedel-Prover-V2 (Lin et al. 2025) trains the same revision skill. Here:

1. **Store.** After each step's rollouts, up to ``per_group`` failures of each fresh group go
   into a bounded FIFO buffer (``max_stored``): only attempts Lean judged wrong for one of
   ``reasons`` (``error`` by default), never an ``infra`` verdict (the checker did not run),
   never a cut-off attempt (unfinished, not wrong), never a replay itself (one revision only).
2. **Draw.** Step s takes R = ⌊fraction × tasks_per_step⌋ groups from the buffer (fewer while it
   holds fewer), drawn by a generator seeded with (seed, s): they leave the buffer. The fresh
   groups are the first tasks_per_step − R tasks of the step's batch, so a step still has
   tasks_per_step groups.
3. **Revise.** Each drawn failure becomes one prompt rendered by the ``self-correction``
   harness (:meth:`SelfCorrectionHarness.revision_prompt`: the failure's prompt, its completion,
   and Goedel-Prover-V2's feedback with Lean's errors), sampled ``group_size`` times. Each
   revision is extracted and checked by the runtime like any attempt and rewarded by the
   taskset against the same reference statement, so a group of revisions has its own mean and
   std as any group does (and dynamic sampling treats it the same way).

The training sequence of a revision is the revision prompt's ids as the policy reported them
(``Completion.prompt_token_ids``: what the model conditioned on) followed by the revision's own
tokens; the failed attempt is context there, with no loss.

**Resume.** The buffer the collection of step s starts from is written to
``RUN_DIR/replay/<s>.json`` (atomically) when step s-1's rollouts are in; a resumed run at step
k reads ``replay/<k>.json``, so it draws the same failures and builds the same batch. Files
that no checkpoint can resume from are pruned.

Only the ``whole-proof`` harness is replayed: ``self-correction`` already revises every failure
within its episodes, and a ``tactic-loop`` attempt is no whole proof to revise.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from leanrl.errors import ConfigError
from leanrl.rollout import Rollout, Turn
from leanrl.train.common import _atomic_write
from leanrl.train.grpo.data import ends_truncated

if TYPE_CHECKING:
    from leanrl.environment import Environment
    from leanrl.policy import Policy, SamplingConfig
    from leanrl.task import Task

__all__ = [
    "REPLAY_FOLDER",
    "FailureBuffer",
    "ReplayConfig",
    "Replayer",
    "cap_tokens",
    "check_replay",
    "is_replay",
    "replay_metrics",
    "replay_rollouts",
]

log = logging.getLogger("leanrl.train.grpo")

ReplayReason = Literal[
    "error", "sorry", "axiom", "native", "statement_changed", "forbidden", "timeout", "memory"
]
"""Verdict reasons a stored failure may have: Lean (or the trusted checker) judged the attempt
wrong. ``infra``, ``crash``, ``truncated``, ``no_proof`` and ``too_large`` are no judgement of
a proof and are never stored."""

REPLAY_FOLDER = "replay"
"""Sub-folder of the run folder holding the buffer snapshots."""


class ReplayConfig(BaseModel):
    """Failure replay (Kimina-Prover RL's error-correction prompts): a share of each step's
    groups revises stored failed attempts, shown Lean's errors. Off by default."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    fraction: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Share of each step's ``tasks_per_step`` groups built from stored failures (⌊fraction ×
    tasks_per_step⌋ groups, fewer while the buffer holds fewer). 0 (the default): off."""
    max_stored: int = Field(default=1024, ge=1)
    """Most failures the buffer keeps; the oldest go first."""
    max_error_tokens: int = Field(default=512, ge=1)
    """Cap on the rendered Lean errors in a revision prompt, in the policy's tokens
    (Kimina-Prover RL caps the error text); longer error text is cut at a line end."""
    reasons: tuple[ReplayReason, ...] = ("error",)
    """Verdict reasons that make a failure worth revising (default: Lean reported errors, the
    text the revision prompt shows). ``infra`` and cut-off attempts never qualify."""
    per_group: int = Field(default=1, ge=1)
    """Most failures stored from one group (the lowest-numbered qualifying samples), so one
    hard task does not fill the buffer."""

    @property
    def enabled(self) -> bool:
        """Whether replay is on (``fraction > 0``)."""
        return self.fraction > 0

    def groups_per_step(self, tasks_per_step: int) -> int:
        """R, the replay groups of a full step."""
        return int(self.fraction * tasks_per_step)


def is_replay(group: Sequence[Rollout]) -> bool:
    """Whether ``group`` revises a stored failure (rather than attempting a fresh task)."""
    return bool(group) and bool(group[0].meta.get("replay"))


def qualifies(r: Rollout, cfg: ReplayConfig) -> bool:
    """Whether ``r`` may be stored: a one-turn attempt Lean judged wrong for one of
    ``cfg.reasons``, not cut off, not itself a revision."""
    v = r.verdict
    return (
        v is not None
        and not v.accepted
        and not r.infra
        and v.reason.value in cfg.reasons
        and not r.truncated
        and not ends_truncated(r)
        and len(r.turns) == 1
        and r.proof is not None
        and not r.meta.get("replay")
    )


def _stored(r: Rollout) -> Rollout:
    """What the buffer keeps of a failure: its prompt, text, proof and verdict (no ids)."""
    t = r.turns[0]
    return Rollout(
        task_id=r.task_id,
        sample=r.sample,
        prompt=r.prompt,
        turns=[Turn(completion=t.completion, finish_reason=t.finish_reason)],
        proof=r.proof,
        preamble=r.preamble,
        restated_statement=r.restated_statement,
        verdict=r.verdict,
        reward=r.reward,
    )


class FailureBuffer:
    """The stored failures, oldest first (``entries``: ``(step, rollout)``)."""

    def __init__(self, cfg: ReplayConfig, folder: Path | None = None) -> None:
        self.cfg = cfg
        self.folder = folder
        self.entries: list[tuple[int, Rollout]] = []

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, step: int, groups: Iterable[Sequence[Rollout]]) -> int:
        """Store the qualifying failures of ``groups`` (fresh ones; replays are skipped); returns
        how many were stored. The oldest entries beyond ``max_stored`` are dropped."""
        n = 0
        for g in groups:
            if is_replay(g):
                continue
            picked = [r for r in g if qualifies(r, self.cfg)][: self.cfg.per_group]
            self.entries += [(step, _stored(r)) for r in picked]
            n += len(picked)
        del self.entries[: max(0, len(self.entries) - self.cfg.max_stored)]
        return n

    def draw(self, step: int, seed: int, k: int) -> list[tuple[int, Rollout]]:
        """Take ``k`` entries (at most all) out of the buffer, chosen by a generator seeded with
        ``(seed, step)``: the same buffer gives the same draw. Returned oldest first."""
        k = min(k, len(self.entries))
        if k <= 0:
            return []
        rng = random.Random(seed * 1_000_003 + step * 7919 + 104_729)
        chosen = sorted(rng.sample(range(len(self.entries)), k))
        out = [self.entries[i] for i in chosen]
        keep = set(range(len(self.entries))) - set(chosen)
        self.entries = [e for i, e in enumerate(self.entries) if i in keep]
        return out

    # -- the run folder -------------------------------------------------------------------------

    def to_json(self) -> str:
        """The buffer as JSON (one object: the entries, oldest first)."""
        rows = [{"step": s, "rollout": r.model_dump(mode="json")} for s, r in self.entries]
        return json.dumps({"version": 1, "entries": rows})

    def load_json(self, text: str) -> None:
        """Replace the entries with those of :meth:`to_json`'s output."""
        data = json.loads(text)
        self.entries = [
            (int(e["step"]), Rollout.model_validate(e["rollout"])) for e in data["entries"]
        ]

    def path(self, step: int) -> Path:
        """The snapshot the collection of ``step`` starts from."""
        assert self.folder is not None
        return self.folder / f"{step:08d}.json"

    def save(self, step: int, keep: Iterable[int] = (), newest: int = 2) -> None:
        """Write the snapshot for ``step`` (atomic) and prune every snapshot that is neither
        for a step in ``keep`` (checkpointed steps) nor among the ``newest`` ones."""
        if self.folder is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.path(step), self.to_json())
        have = sorted(int(p.stem) for p in self.folder.glob("*.json") if p.stem.isdigit())
        spare = set(keep) | set(have[-newest:])
        for s in have:
            if s not in spare:
                self.path(s).unlink(missing_ok=True)

    def load(self, step: int) -> bool:
        """Read the snapshot for ``step``; False (and an empty buffer) when there is none."""
        self.entries = []
        if self.folder is None or not self.path(step).is_file():
            return False
        try:
            self.load_json(self.path(step).read_text(encoding="utf-8"))
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigError(
                f"{self.path(step)} is damaged ({type(e).__name__}: {e}): the failure-replay "
                "buffer cannot be restored, so the resumed batches would differ. Delete the "
                "file to resume with an empty buffer, or use a new --out folder"
            ) from None
        return True


# -- rendering and rolling out ------------------------------------------------------------------


def cap_tokens(text: str, limit: int, tokenize: Callable[[str], list[int]]) -> str:
    """``text`` cut to at most ``limit`` tokens of ``tokenize``, at a line end where one fits
    (else mid-line), with a note that it was cut. A policy that cannot tokenize: 4 characters
    per token."""

    def count(s: str) -> int:
        try:
            return len(tokenize(s))
        except NotImplementedError:
            return -(-len(s) // 4)

    if count(text) <= limit:
        return text
    lo, hi = 0, len(text)  # the longest prefix that fits, by bisection
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(text[:mid]) <= limit:
            lo = mid
        else:
            hi = mid - 1
    cut = text[:lo]
    if "\n" in cut:
        cut = cut[: cut.rindex("\n")]
    return cut.rstrip() + "\n... [error text cut]"


def check_replay(replay: ReplayConfig, env: Environment, distributed: bool) -> None:
    """Refuse a replay config the environment cannot run (before the model loads)."""
    if not replay.enabled:
        return
    harness = env.harness.name
    if harness != "whole-proof":
        why = (
            "self-correction already revises every failed attempt inside its episodes"
            if harness == "self-correction"
            else "its attempts are not one whole proof a revision prompt can show"
        )
        raise ConfigError(
            f"replay.fraction = {replay.fraction} needs the whole-proof harness, but the "
            f"environment uses {harness!r} ({why}); set --replay.fraction 0 or use "
            "--env.harness.name whole-proof"
        )
    if distributed:
        raise ConfigError(
            "replay.fraction > 0 with several ranks is not supported yet: run one process, or "
            "set --replay.fraction 0"
        )


async def replay_rollouts(
    drawn: Sequence[tuple[int, Rollout]],
    tasks: Mapping[str, Task],
    env: Environment,
    policy: Policy,
    sampling: SamplingConfig,
    max_error_tokens: int,
) -> list[list[Rollout]]:
    """One group of ``sampling.n`` revisions per drawn failure, checked and rewarded."""
    from leanrl.harnesses.self_correction.harness import SelfCorrectionHarness
    from leanrl.harnesses.whole_proof.harness import (
        WholeProofHarness,
        check_and_reward,
        rollout_of,
    )

    if not drawn:
        return []
    whole = env.harness
    if not isinstance(whole, WholeProofHarness):
        raise ConfigError(f"failure replay needs the whole-proof harness, not {whole.name!r}")
    render = SelfCorrectionHarness(whole.config.model_copy(update={"name": "self-correction"}))

    def cap(text: str) -> str:
        return cap_tokens(text, max_error_tokens, policy.tokenize)

    targets = [tasks[r.task_id] for _, r in drawn]
    prompts = [render.revision_prompt(t, r, cap) for t, (_, r) in zip(targets, drawn, strict=True)]
    completions = await policy.generate(prompts, whole.sampling(sampling))
    groups: list[list[Rollout]] = []
    for task, prompt, (step, failed), comps in zip(
        targets, prompts, drawn, completions, strict=True
    ):
        group = []
        for i, c in enumerate(comps):
            meta = {"replay": True, "replay_of": {"step": step, "sample": failed.sample}}
            r = rollout_of(task, i, prompt, c, whole.extract(task, c), meta=meta)
            group.append(r)
        groups.append(group)
    await check_and_reward(targets, groups, env.runtime, env.taskset)
    return groups


class Replayer:
    """The replay side of one GRPO run: the buffer, each step's draw and revisions, the store.

    ``config`` is the run's :class:`~leanrl.train.grpo.GRPOConfig` (typed loosely: the config
    module imports this one). ``start``: the step the run (re)starts at, whose buffer snapshot
    is read back."""

    def __init__(self, config: Any, folder: Path, start: int) -> None:
        self.config = config
        self.buffer = FailureBuffer(config.replay, folder)
        self._stored: dict[int, int] = {}  # step -> buffer size after its rollouts
        if start > 0 and not self.buffer.load(start):
            log.warning(
                "no failure-replay buffer for step %d in %s: replay restarts empty, so these "
                "batches differ from an uninterrupted run's",
                start,
                folder,
            )

    async def rollouts(
        self, step: int, env: Environment, tasks: Sequence[Task], policy: Policy
    ) -> list[list[Rollout]]:
        """Draw this step's failures and revise each ``group_size`` times (checked, rewarded)."""
        cfg = self.config
        drawn = self.buffer.draw(step, cfg.seed, cfg.replay.groups_per_step(cfg.tasks_per_step))
        base = cfg.sampling.seed
        # a seed of its own: from (seed, step), apart from every refill round's
        seed = None if base is None else base + cfg.seed * 1_000_003 + step * 101 + 500_009
        sampling = cfg.sampling.model_copy(update={"n": cfg.group_size, "seed": seed})
        by_id = {t.id: t for t in tasks}
        drawn = [d for d in drawn if d[1].task_id in by_id]  # a task the taskset no longer has
        return await replay_rollouts(
            drawn, by_id, env, policy, sampling, cfg.replay.max_error_tokens
        )

    def store(self, step: int, groups: Sequence[Sequence[Rollout]], keep: set[int] | None) -> None:
        """Store the step's qualifying failures. ``keep`` (the checkpointed steps; None on ranks
        that write nothing): write the buffer step + 1 starts from, prune the rest."""
        self.buffer.add(step, groups)
        self._stored[step] = len(self.buffer)
        if keep is not None:
            # async mode collects ahead of the checkpoint it may later resume from
            self.buffer.save(step + 1, keep, newest=self.config.max_staleness + 2)

    def metrics(self, step: int, groups: Sequence[Sequence[Rollout]]) -> dict[str, Any]:
        """The replay columns of step ``step``'s metrics row (:func:`replay_metrics`)."""
        return replay_metrics(groups, self._stored.pop(step, len(self.buffer)))


def replay_metrics(groups: Sequence[Sequence[Rollout]], stored: int) -> dict[str, Any]:
    """The step's replay columns: ``replay_groups`` (groups revising stored failures),
    ``replay_pass_rate`` (accepted revisions per judged one; None without any) and
    ``replay_stored`` (the buffer's size after the step)."""
    mine = [r for g in groups if is_replay(g) for r in g if not r.infra]
    passed = sum(1 for r in mine if r.verdict is not None and r.verdict.accepted)
    return {
        "replay_groups": sum(1 for g in groups if is_replay(g)),
        "replay_pass_rate": passed / len(mine) if mine else None,
        "replay_stored": stored,
    }
