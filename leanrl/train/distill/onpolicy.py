"""On-policy distillation inside a GRPO run: what the trainer calls.

- :func:`prepare` (from ``GRPOTrainer.check``, before any model loads): resolves every teacher,
  refuses one whose tokenizer is not the student's, and writes each teacher's revision into the
  config's ``distill.revisions`` (so ``config.json`` records it); a resumed run whose teacher
  changed, or a teacher not at its pinned revision, is refused in one line.
- :class:`OnPolicyDistill` (opened after the student loads, on its device): after each step's
  sequences are made, :meth:`OnPolicyDistill.apply` has each sequence's teacher score its
  response tokens and sets the per-token advantages of :mod:`leanrl.train.distill.objective`;
  :meth:`OnPolicyDistill.metrics` is the step's ``distill/...`` figures.

In a mixed run (``envs``) a sequence's teacher is its environment's expert
(``distill.experts``), else ``distill.teacher``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from leanrl.errors import ConfigError, PolicyError
from leanrl.train.distill.config import DistillConfig
from leanrl.train.distill.objective import DistillStats, add_distill_term
from leanrl.train.distill.teacher import (
    LocalTeacher,
    ServerTeacher,
    TeacherSource,
    check_tokenizer,
    describe,
    resolve,
    revision,
)

__all__ = ["OnPolicyDistill", "open_distill", "prepare", "resolve_revisions"]

log = logging.getLogger("leanrl.train.distill")


def _stored(run_path: Path) -> dict[str, str]:
    """The teachers' revisions a run folder that holds a run recorded (empty when none)."""
    cfg_file = run_path / "config.json"
    has_run = (run_path / "metrics.jsonl").is_file() or any(run_path.glob("checkpoint-*"))
    if not has_run or not cfg_file.is_file():
        return {}
    try:
        old = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # bind_config reports a damaged file, with the fix
    if not isinstance(old, dict):
        return {}
    # a GRPO run records them in its `distill` section, `leanrl train distill` at the top
    inner = old.get("distill")
    section: dict[str, Any] = inner if isinstance(inner, dict) else old
    got = section.get("revisions")
    return {str(k): str(v) for k, v in got.items()} if isinstance(got, dict) else {}


def resolve_revisions(
    d: DistillConfig, student: str, run_path: Path, *, tokenizers: bool = True
) -> dict[str, str]:
    """Every teacher of ``d`` resolved, its tokenizer checked against ``student``'s (when
    ``tokenizers``) and its revision taken; a one-line :class:`ConfigError` for a teacher that
    is not at its pinned revision or not at the one ``run_path``'s run recorded."""
    student_tok = None
    if tokenizers:
        from transformers import AutoTokenizer

        try:
            student_tok = AutoTokenizer.from_pretrained(student)
        except (OSError, ValueError) as e:
            raise ConfigError(f"cannot read the student's tokenizer from {student}: {e}") from None
    stored = _stored(run_path)
    out: dict[str, str] = {}
    for spec in d.teachers():
        src = resolve(spec, d)
        if student_tok is not None:
            check_tokenizer(student_tok, src, d)
        rev = revision(src)
        before = stored.get(spec)
        if before is not None and before != rev:
            raise ConfigError(
                f"the teacher {spec} has changed since the run in {run_path} started (revision "
                f"{before} then, {rev} now): a resumed run is scored by the teacher it started "
                "with. Restore that teacher, or start a new run with another --out"
            )
        pinned = d.revisions.get(spec)
        if pinned is not None and pinned != rev:
            raise ConfigError(
                f"the teacher {spec} is at revision {rev}, not the pinned distill.revisions "
                f"value {pinned}: pin the revision it is at, or restore that teacher"
            )
        out[spec] = rev
    return out


def prepare(config: Any, run_path: Path) -> Any:
    """``config`` (a GRPOConfig) with ``distill.revisions`` filled in, after the checks of
    :func:`resolve_revisions` and of what on-policy distillation cannot do yet; unchanged
    when no teacher is named. Loads tokenizers only, never a model."""
    d: DistillConfig = config.distill
    if not d.enabled:
        return config
    import os

    ranks = int(os.environ.get("WORLD_SIZE", "1"))
    if ranks > 1:
        raise ConfigError(
            f"on-policy distillation with {ranks} ranks is not supported yet: run one process "
            "(the teacher scores the whole batch there)"
        )
    revs = resolve_revisions(d, config.policy.model, run_path)
    return config.model_copy(update={"distill": d.model_copy(update={"revisions": revs})})


class OnPolicyDistill:
    """The teachers of a run and the per-token distillation term (see the module docstring).

    ``env_of``: the environment name of a task id (a mixed run), else None."""

    def __init__(self, cfg: DistillConfig, env_of: Callable[[str], str] | None = None) -> None:
        self.cfg = cfg
        self.env_of = env_of
        self.teachers: dict[str, Any] = {}
        self._rows: dict[int, dict[str, Any]] = {}

    def open(self, device: Any) -> None:
        """Resolve and load every teacher (in-process ones on ``device``, or
        ``distill.device``); blocking."""
        import torch

        dev = torch.device(device if self.cfg.device == "auto" else self.cfg.device)
        precision = self.cfg.precision
        if precision == "auto":
            precision = "bf16" if dev.type == "cuda" else "fp32"
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        for spec in self.cfg.teachers():
            src: TeacherSource = resolve(spec, self.cfg)
            teacher: Any = (
                ServerTeacher(src, self.cfg)
                if src.kind == "server"
                else LocalTeacher(src, self.cfg, dev, dtype)
            )
            teacher.load()
            log.info("distillation teacher: %s (revision %s)", describe(src), revision(src))
            self.teachers[spec] = teacher

    async def apply(self, step: int, samples: Sequence[Any]) -> None:
        """Score ``samples`` (a step's sequences) with their teachers and set their per-token
        advantages; the step's figures are kept for :meth:`metrics`."""
        t0 = time.perf_counter()
        todo: dict[str, list[Any]] = {}
        env_names: dict[int, str | None] = {}
        for s in samples:
            env = self.env_of(s.task_id) if self.env_of is not None and s.task_id else None
            env_names[id(s)] = env
            spec = self.cfg.teacher_for(env)
            if not any(s.mask):  # masked whole (a cut-off attempt): no loss, nothing to score
                continue
            if spec is None:  # an environment without a teacher: its own advantage only
                if self.cfg.only:
                    s.tok_adv = [0.0] * len(s.resp)
                continue
            if any(m and o != o for m, o in zip(s.mask, s.old, strict=True)):  # NaN
                raise PolicyError(
                    "on-policy distillation compares the sampler's log-probs with the teacher's, "
                    "but the policy returned none: use a backend that reports them (hf, vllm)"
                )
            todo.setdefault(spec, []).append(s)
        total = DistillStats()
        for spec, mine in todo.items():
            got = await self.teachers[spec].logprobs([(s.prompt, s.resp) for s in mine])
            for s, lp in zip(mine, got, strict=True):
                try:
                    stats = add_distill_term(s, lp, self.cfg.coef, self.cfg.only)
                except ValueError as e:
                    raise PolicyError(f"teacher {spec}: {e}") from None
                total.add(stats)
                env = env_names[id(s)]
                if env is not None:
                    total.by_env.setdefault(env, DistillStats()).add(stats)
        row = total.row()
        row["distill/time_s"] = time.perf_counter() - t0
        self._rows[step] = row

    def metrics(self, step: int) -> dict[str, Any]:
        """The ``distill/...`` figures of step ``step`` (0-based; once)."""
        return self._rows.pop(step, {})

    async def close(self) -> None:
        for t in self.teachers.values():
            await t.close()
        self.teachers = {}


def open_distill(config: Any, env: Any, device: Any) -> OnPolicyDistill | None:
    """The run's :class:`OnPolicyDistill` with its teachers loaded (``device``: the student's),
    or None when ``config.distill`` names no teacher. ``env``: the training environment (a
    mixed one routes each task to its environment's expert). Blocking."""
    if not config.distill.enabled:
        return None
    env_of = getattr(env, "env_of", None)
    out = OnPolicyDistill(config.distill, env_of if callable(env_of) else None)
    out.open(device)
    return out
