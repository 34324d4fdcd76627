"""What the trainers (GRPO, ES, SFT) share: the config base, data order, and the run folder.

A run folder looks the same whichever trainer wrote it::

    RUN_DIR/config.json          the resolved config (a resume must match it)
    RUN_DIR/metrics.jsonl        one JSON line per step
    RUN_DIR/checkpoint-N/        a Hugging Face model folder (``leanrl eval --model`` loads it)
                                 plus trainer_state.json (step, RNG state, trainer extras) and
                                 checksums.sha256 (every file's sha256, checked on resume)
    RUN_DIR/.lock                held while a run writes the folder (a second run is refused)
    RUN_DIR/quarantined/         damaged checkpoints moved out of the run (checkpoint-N and
                                 checkpoint-N.why.txt: what was wrong), never loaded or pruned
    RUN_DIR/in_use.json          ES: the checkpoint the running run rebuilds its weights from
                                 (never pruned while it runs)
    RUN_DIR/reward_curve.png     written at the end (and whenever ``plot`` is called)
    RUN_DIR/proofs.jsonl         every verified proof, once per distinct proof of a task
    RUN_DIR/eval/step-N/         in-run held-out evaluations (``eval.every``), eval_curve.png

Data order depends only on (seed, step), so a resumed run sees exactly the batches it would have
seen had it never stopped.

Metrics rows are strict JSON: a value that is not finite (a diverged loss) is written as the
string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"`` and read back by :meth:`RunDir.metrics` as
that float, never as ``null`` (which would read as "not measured").
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from leanrl.environment import Environment, EnvironmentConfig, load_environment
from leanrl.errors import ConfigError, disk_errors
from leanrl.integrity import (
    CHECKSUMS_FILE,
    NO_CHECKSUMS,
    checkpoint_problem,
    checksums_problem,
    sha256_file,
)
from leanrl.jsonl import quarantine, quarantine_path, rewrite_log, scan_log
from leanrl.launch.config import LauncherConfig
from leanrl.policy import PolicyConfig, SamplingConfig
from leanrl.runlock import FolderLock
from leanrl.task import Task
from leanrl.train.budget import BudgetConfig
from leanrl.train.inrun_eval_config import InRunEvalConfig

log = logging.getLogger("leanrl.train")

QUARANTINE_DIR = "quarantined"
"""Where damaged checkpoints are moved (``RUN_DIR/quarantined/checkpoint-N``), out of the run."""
IN_USE_FILE = "in_use.json"
"""The checkpoint a running run still reads (ES rebuilds weights from it): never pruned."""

_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
"""How a metrics row spells a float that is not finite (strict JSON has no such numbers)."""

__all__ = [
    "MetricsLogger",
    "RunDir",
    "TrainConfig",
    "batch_for_step",
    "check_model_path",
    "check_runtimes",
    "print_run_summary",
    "resume_line",
    "runtime_metrics",
    "write_checksums",
]


class TrainConfig(BaseModel):
    """Options every trainer shares. ``GRPOConfig``, ``ESConfig`` and ``SFTConfig`` extend it."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    env: EnvironmentConfig = Field(default_factory=EnvironmentConfig)
    """The environment to train on (taskset, harness, runtime)."""
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    """The model to train (``policy.model``: a local folder or hub id) and its backend."""
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    """Sampling during training (``n`` is set by the trainer: group size or samples per task)."""
    out: Path = Path("runs/leanrl")
    """The run folder. Rerunning with the same folder and config resumes the run."""
    steps: int = Field(default=100, ge=1)
    """Optimisation steps (GRPO) or iterations (ES)."""
    tasks_per_step: int = Field(default=8, ge=1)
    """Tasks drawn per step (without replacement within an epoch, reshuffled every epoch)."""
    seed: int = 0
    """Seed of data order, sampling and noise: the same seed and config repeat a CPU run."""
    save_every: int = Field(default=10, ge=1)
    """Write a Hugging Face checkpoint every this many steps (and at the end)."""
    keep_checkpoints: int = Field(default=3, ge=1)
    """Keep only the newest this many checkpoints."""
    log_to: list[Literal["wandb", "tensorboard"]] = Field(default_factory=list)
    """Also log metrics to W&B and/or TensorBoard (each needs its package installed)."""
    run_name: str | None = None
    """Name of the run in W&B/TensorBoard (default: the run folder's name)."""
    eval: InRunEvalConfig = Field(default_factory=InRunEvalConfig)
    """Held-out evaluation every ``eval.every`` steps (off by default): pass@k logged to
    ``metrics.jsonl`` and plotted to ``eval_curve.png``."""
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    """GRPO and ES: stop early once the run has generated ``budget.tokens`` tokens or used
    ``budget.gpu_s`` GPU-seconds (equal budgets for ES and GRPO in ``leanrl compare``). SFT and
    expert iteration refuse one."""
    launcher: LauncherConfig = Field(default_factory=LauncherConfig)
    """Where the run happens (this machine or Modal) and the prices its cost is reported in
    (``cost/...`` in every metrics row, totals in ``summary.json``)."""

    @model_validator(mode="after")
    def _held_out_defaults(self) -> TrainConfig:
        # `--eval.env.taskset.split test` alone means "the training environment, that split":
        # what the held-out config does not name comes from `env`, not from EnvironmentConfig's
        # own defaults (which would silently evaluate on miniF2F with the Lean harness).
        held = self.eval.env
        if held is None or "id" in held.model_fields_set:
            return self
        ts = held.taskset
        src = {k: getattr(self.env.taskset, k) for k in ("path", "hub_id", "revision", "columns")}
        ts = ts.model_copy(update={k: v for k, v in src.items() if k not in ts.model_fields_set})
        upd: dict[str, Any] = {"id": self.env.id, "taskset": ts}
        for part in ("harness", "runtime"):
            if part not in held.model_fields_set:
                upd[part] = getattr(self.env, part)
        new = held.model_copy(update=upd)
        new.model_fields_set.update(upd)
        self.eval = self.eval.model_copy(update={"env": new})
        return self


def check_model_path(model: str, *, hub: bool = True) -> None:
    """Fail early, before loading anything, when ``model`` cannot be loaded here: the check
    eval makes too (:func:`leanrl.policies._common.resolve_model`), so a missing folder gets a
    did-you-mean and an uncached hub id offline fails in seconds with how to fetch it.
    ``hub=False``: the model is not loaded here (a dry run, a launch): local folders only."""
    from leanrl.policies._common import resolve_model

    resolve_model(model, flag="--policy.model", adapters=False, hub=hub)


def check_runtimes(env: Environment | None, eval_config: InRunEvalConfig) -> None:
    """Before any model loads: the runtimes this run will start can start (the runtime's own
    error otherwise, e.g. :class:`~leanrl.LeanNotFoundError` with how to set Lean up), so a
    machine without Lean fails in seconds, not after the model load. Cheap, starts nothing.

    ``env``: the training environment (None when training checks no attempts, as SFT's does
    not); the in-run evaluation's environment too when ``eval.every`` is set. An environment
    that needs no Lean (Countdown) has nothing to check."""
    if env is not None:
        env.runtime.preflight()
    if eval_config.every and eval_config.env is not None:
        held_out = load_environment(eval_config.env)
        held_out.check_parts()  # e.g. a tactic loop on one-shot Lean
        held_out.runtime.preflight()


def resume_line(source: str | Path, done: int, unit: str = "step") -> str:
    """The one line every trainer logs when it resumes a run: where from, and how far it got
    (``resuming from runs/x/checkpoint-20 (step 20)``)."""
    return f"resuming from {source} ({unit} {done})"


def runtime_metrics(env: Any) -> dict[str, float]:
    """The environment's runtime counters and costs, keys prefixed ``runtime/`` for a metrics row.

    Cumulative since the runtime started (sandbox- and CPU-seconds for Docker/Modal, processes
    started/killed/recycled for the local pool). Empty when the runtime was never built here
    (e.g. when scoring happens in worker processes).
    """
    rt = getattr(env, "_runtime", None)  # do not build a runtime just to ask it for numbers
    if rt is None:
        return {}
    return {f"runtime/{k}": v for k, v in rt.metrics().items()}


def batch_for_step(tasks: Sequence[Task], step: int, per_step: int, seed: int) -> list[Task]:
    """The tasks of ``step`` (0-based): epochs of a seeded permutation, cut into batches.

    Depends only on its arguments, so a resumed run gets the same batches.
    """
    if not tasks:
        raise ConfigError("the taskset is empty: check the split, names, pattern and limit")
    n = len(tasks)
    out: list[Task] = []
    start = step * per_step
    for pos in range(start, start + per_step):
        epoch, idx = divmod(pos, n)
        perm = list(range(n))
        random.Random(seed * 1_000_003 + epoch).shuffle(perm)
        out.append(tasks[perm[idx]])
    return out


class RunDir:
    """The run folder: config, metrics, checkpoints, plot. Writes are atomic."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        self.metrics_path = self.path / "metrics.jsonl"
        self.damaged: list[tuple[Path, str]] = []
        """Checkpoints :meth:`resumable_checkpoints` skipped, with what was wrong with each."""
        self._lock: FolderLock | None = None
        self._unverified: set[Path] = set()  # checkpoints already warned about (no checksums)

    # -- one run at a time ----------------------------------------------------------------------

    def lock(self, kind: str, *, writer: bool = True) -> None:
        """Hold ``RUN_DIR/.lock`` for this run (``kind``: ``"GRPO run"``, ``"ES run"``...), or
        raise a one-line :class:`ConfigError` when another process's run holds it. Call it at
        the start of a run, before anything is written. ``writer``: whether this process writes
        the folder; on a torchrun launch only rank 0 does and takes the lock (the other ranks'
        call is a no-op, so ranks never wait on each other).

        Released by :meth:`unlock` (the run's :class:`MetricsLogger` closing calls it), when
        this object is garbage-collected, or when the process dies (even by SIGKILL: the kernel
        drops an flock with its process). Runs in one process share the lock, so a trainer that
        failed to start can be retried in the same notebook or script."""
        if not writer:
            return
        if self._lock is None:
            self._lock = FolderLock(self.path, kind, reentrant=True)
            weakref.finalize(self, self._lock.release)  # a RunDir that goes lets the lock go
        self._lock.acquire()

    def unlock(self) -> None:
        """Let the run folder's lock go (a no-op when not held)."""
        if self._lock is not None:
            self._lock.release()

    # -- config ---------------------------------------------------------------------------------

    def bind_config(self, config: BaseModel, *, ignore: Sequence[str] = ("steps",)) -> bool:
        """Write ``config.json``, or check that a resumed run uses the same config.

        Returns True when the folder already held a run (resume). ``ignore`` lists fields that may
        differ on resume (by default ``steps``, so a finished run can be extended); ``launcher``
        and ``budget`` always may (where a run happens, and when it stops early).
        """
        self.path.mkdir(parents=True, exist_ok=True)
        cfg_file = self.path / "config.json"
        new = json.loads(config.model_dump_json())
        if cfg_file.is_file():
            try:
                old = json.loads(cfg_file.read_text(encoding="utf-8"))
                if not isinstance(old, dict):
                    raise ValueError("not a JSON object")
            except (ValueError, UnicodeDecodeError) as e:
                raise ConfigError(
                    f"{cfg_file} is damaged ({type(e).__name__}: {e}), so this run cannot be "
                    "checked against the config before resuming. If this command uses the "
                    f"run's settings, delete {cfg_file} and rerun (it is written again and the "
                    "run resumes from its checkpoints); otherwise use a new --out folder."
                ) from None
            skip = {*ignore, "launcher", "budget"}
            diff = sorted(k for k in _changed(old, new, config) if k.split(".")[0] not in skip)
            if diff:
                raise ConfigError(
                    f"{self.path} holds a run with a different config (fields {diff}). Use a new "
                    "--out folder, or delete the old one to start over."
                )
            resumed = True
        else:
            resumed = False
        _atomic_write(cfg_file, json.dumps(new, indent=2, default=str))
        return resumed

    # -- metrics --------------------------------------------------------------------------------

    def log(self, row: dict[str, Any]) -> None:
        """Append one metrics line (flushed and fsynced: a crash loses at most this line).

        A value that is not finite (a diverged loss) is recorded as it is, spelled as the string
        ``"NaN"``, ``"Infinity"`` or ``"-Infinity"`` (strict JSON, which other tools read too);
        :meth:`metrics` reads it back as the float. ``None`` stays ``null``: not measured."""
        self.path.mkdir(parents=True, exist_ok=True)
        line = json.dumps({k: _encode_metric(v) for k, v in row.items()}, allow_nan=False)
        with disk_errors(self.metrics_path, "a metrics row"):
            with self.metrics_path.open("a", encoding="utf-8") as f:
                f.write(line + "\n")
                f.flush()
                os.fsync(f.fileno())

    def metrics(self) -> list[dict[str, Any]]:
        """Every readable metrics row written so far. A torn last line is ignored; a complete
        line that cannot be read is skipped (with a warning), never the rows after it."""
        scan = scan_log(self.metrics_path, _metrics_row)
        if scan.bad:
            log.warning(
                "%s: skipped %d unreadable line(s) (first: line %d, %s); the next resume moves "
                "them to %s",
                self.metrics_path,
                len(scan.bad),
                scan.bad[0].line,
                scan.bad[0].why,
                quarantine_path(self.metrics_path),
            )
        return [row for _, row in scan.good]

    def truncate_metrics(self, after_step: int) -> list[int]:
        """Drop rows of steps after ``after_step`` (written after the last checkpoint) and a torn
        last line. Unreadable lines are moved to ``metrics.jsonl.quarantined``, not dropped.

        A moved row of a step after ``after_step`` is written again when the resume redoes that
        step. One of a step the checkpoint already holds cannot be: its numbers came from the
        weights and rollouts of that step, which are gone. Returns those steps (1 to
        ``after_step`` with no row left), which a warning names, so the gap in the curves is
        explained rather than silent."""
        scan = scan_log(self.metrics_path, _metrics_row)
        keep = {i for i, row in scan.good if int(row["step"]) <= after_step}
        if len(keep) == len(scan.good) and not scan.bad and not scan.torn:
            return []
        qpath = quarantine(self.metrics_path, scan.bad, "metrics row")
        rewrite_log(self.metrics_path, keep, "metrics.jsonl")
        if qpath is None:
            return []
        have = {int(row["step"]) for i, row in scan.good if i in keep}
        lost = [s for s in range(1, after_step + 1) if s not in have]
        if lost:
            shown = ", ".join(map(str, lost[:20])) + (", ..." if len(lost) > 20 else "")
            log.warning(
                "%s: no row is left for step(s) %s (damaged; the lines are in %s). They are not "
                "redone: the run resumes after step %d, and their numbers came from the weights "
                "and rollouts of those steps, which are gone. The curves have a gap there.",
                self.metrics_path,
                shown,
                qpath,
                after_step,
            )
        return lost

    # -- checkpoints ----------------------------------------------------------------------------

    def checkpoint_path(self, step: int) -> Path:
        return self.path / f"checkpoint-{step}"

    def checkpoints(self) -> list[tuple[int, Path]]:
        """Complete checkpoints, oldest first (a folder without trainer_state.json is partial)."""
        found = []
        for p in self.path.glob("checkpoint-*"):
            suffix = p.name.split("-", 1)[1]
            if suffix.isdigit() and (p / "trainer_state.json").is_file():
                found.append((int(suffix), p))
        return sorted(found)

    def latest_checkpoint(self) -> tuple[int, Path] | None:
        cks = self.checkpoints()
        return cks[-1] if cks else None

    def resumable_checkpoints(self) -> Iterator[tuple[int, Path]]:
        """Complete checkpoints that look whole, newest first, checked one at a time as the
        caller asks for the next. A damaged one (truncated weights or optimizer state, a JSON
        file that does not parse) is skipped with a warning naming the file and what is wrong;
        its name goes to :attr:`damaged`, and the run holding the folder's lock moves it to
        ``quarantined/`` (:meth:`quarantine_checkpoint`), where it no longer counts toward
        ``keep_checkpoints`` and no command takes it for a checkpoint of the run.

        The content is checked too: every file against its sha256 in ``checksums.sha256`` (a
        flipped bit in the weights loads without complaint otherwise). A checkpoint written
        before leanrl recorded checksums has none; it is used, with a warning that its content
        is unverified. Checkpoints quarantined by an earlier run are in :attr:`damaged` too, so
        a run whose every checkpoint is damaged still says so when it is run again."""
        self._note_quarantined()
        for step, path in reversed(self.checkpoints()):
            why = checkpoint_problem(path) or self._content_problem(path)
            if why is None and not path.is_dir():  # moved aside meanwhile (by rank 0)
                why = "it was moved away while it was checked"
            if why is None:
                yield step, path
                continue
            moved = self.quarantine_checkpoint(path, why)
            if not any(p.name == path.name and w == why for p, w in self.damaged):
                self.damaged.append((moved or path, why))
            if moved is not None:
                log.warning(
                    "%s is damaged: %s. Moved it to %s (not counted as a checkpoint of the "
                    "run); skipping it for an older checkpoint.",
                    path,
                    why,
                    moved,
                )
            else:
                log.warning("%s is damaged: %s. Skipping it for an older checkpoint.", path, why)

    def quarantine_checkpoint(self, checkpoint: Path, why: str) -> Path | None:
        """Move the damaged ``checkpoint`` to ``RUN_DIR/quarantined/`` (``checkpoint-N``, or
        ``checkpoint-N.2`` ... when that name is taken), with ``why`` beside it in
        ``checkpoint-N.why.txt``; returns where it went. Only the run holding the folder's lock
        moves anything (other ranks of a torchrun launch, or a reader such as ES's replay,
        only skip it), and a problem that may pass (a file that cannot be read now) leaves the
        folder where it is: None then. Nothing is deleted: a checkpoint wrongly judged
        damaged is moved back by hand."""
        if self._lock is None or not self._lock.held or "cannot be read" in why:
            return None
        dest_dir = self.path / QUARANTINE_DIR
        target = dest_dir / checkpoint.name
        n = 1
        while target.exists() or target.with_name(f"{target.name}.why.txt").exists():
            n += 1
            target = dest_dir / f"{checkpoint.name}.{n}"
        try:
            dest_dir.mkdir(exist_ok=True)
            os.replace(checkpoint, target)
        except OSError as e:
            log.warning("%s could not be moved to %s (%s): left in place", checkpoint, target, e)
            return None
        try:
            target.with_name(f"{target.name}.why.txt").write_text(why + "\n", encoding="utf-8")
        except OSError:
            pass  # the move is what matters; the reason was logged
        return target

    def quarantined(self) -> list[tuple[Path, str]]:
        """Checkpoints moved to ``quarantined/`` by this or an earlier run, with why."""
        folder = self.path / QUARANTINE_DIR
        if not folder.is_dir():
            return []
        out = []
        for p in sorted(folder.glob("checkpoint-*")):
            if not p.is_dir():
                continue
            try:
                why = p.with_name(f"{p.name}.why.txt").read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError):
                why = ""
            out.append((p, why or "quarantined by an earlier run"))
        return out

    def _note_quarantined(self) -> None:
        for path, why in self.quarantined():
            if not any(p == path for p, _ in self.damaged):
                self.damaged.append((path, why))

    def no_checkpoint_line(self, then: str = "starting the run over") -> str:
        """What a resume that found no usable checkpoint logs: that there is none yet, or that
        every one is damaged, and why (:attr:`damaged`), then what happens (``then``)."""
        if not self.damaged:
            return f"{self.path} holds no checkpoint yet: {then}"
        why = "; ".join(f"{p.name}: {reason}" for p, reason in self.damaged)
        return f"every checkpoint in {self.path} is damaged ({why}): {then}"

    def _content_problem(self, checkpoint: Path) -> str | None:
        """Why ``checkpoint``'s files are not what was written (None when they are, or when it
        has no checksums: then a warning, once)."""
        why = checksums_problem(checkpoint)
        if why is _NO_CHECKSUMS:
            if checkpoint not in self._unverified and _holds_weights(checkpoint):
                self._unverified.add(checkpoint)
                log.warning(
                    "%s has no %s (written by an older leanrl, or a kill came between its save "
                    "and its checksums): its content cannot be verified, only its structure",
                    checkpoint,
                    CHECKSUMS_FILE,
                )
            return None
        return why

    def pin(self, checkpoint: Path | None) -> None:
        """Record the checkpoint this run still reads after its start (ES rebuilds its weights
        from it when it saves or starts a worker); :meth:`save_checkpoint` never prunes it, in
        this process or another (a launched function saving into the folder). ``None``: the
        run reads none (it started from the base model). Each start rewrites the record, and
        only the run holding the folder's lock writes it, so an old one never lingers."""
        target = self.path / IN_USE_FILE
        if checkpoint is None:
            target.unlink(missing_ok=True)
            return
        self.path.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"checkpoint": Path(checkpoint).name, "why": "the run reads it"})
        _atomic_write(target, text)

    def pinned(self) -> set[str]:
        """Names of checkpoints :meth:`pin` protects from pruning."""
        try:
            data = json.loads((self.path / IN_USE_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError):
            return set()
        name = data.get("checkpoint") if isinstance(data, dict) else None
        return {name} if isinstance(name, str) else set()

    def save_checkpoint(
        self,
        step: int,
        model: Any,
        tokenizer: Any,
        state: dict[str, Any],
        keep: int = 3,
        extra: Callable[[Path], None] | None = None,
    ) -> Path:
        """Save a HF model folder + ``trainer_state.json`` atomically; prune old checkpoints.

        ``extra(folder)`` may write more files (optimizer state) into the folder before it is
        made visible, so they appear together with the model or not at all. Last of all goes
        ``checksums.sha256`` (every file's sha256, checked on resume). Pruning keeps the newest
        ``keep`` checkpoints and the one a running run still reads (:meth:`pin`).
        """
        final = self.checkpoint_path(step)
        # Leftovers of saves a crash interrupted (never published): one trainer per run folder,
        # so no other save is in progress here.
        for leftover in self.path.glob(".tmp-checkpoint-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-checkpoint-{step}-", dir=self.path))
        tmp.chmod(0o755)  # mkdtemp makes it private; a published checkpoint is an ordinary folder
        try:
            with disk_errors(final, f"checkpoint {step}"):
                model.save_pretrained(tmp)
                if tokenizer is not None:
                    tokenizer.save_pretrained(tmp)
                if extra is not None:
                    extra(tmp)
                state_file = tmp / "trainer_state.json"
                state_file.write_text(json.dumps({"step": step, **state}, default=str))
                write_checksums(tmp)  # after every file: it covers them all
        except Exception:
            # A half-written checkpoint is never published; older ones stay as they were. Its
            # folder goes at once (on a full disk that frees the space); after a kill the next
            # save removes it.
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        in_use = self.pinned()
        for _, old in self.checkpoints()[:-keep]:
            if old.name not in in_use:
                shutil.rmtree(old, ignore_errors=True)
        return final

    @staticmethod
    def load_state(checkpoint: Path) -> dict[str, Any]:
        """``trainer_state.json`` of ``checkpoint`` (a ConfigError naming it when damaged)."""
        path = checkpoint / "trainer_state.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
        except (ValueError, UnicodeDecodeError) as e:
            raise ConfigError(
                f"{path} is damaged ({type(e).__name__}: {e}); delete {checkpoint} to resume "
                "from an older checkpoint"
            ) from None
        return data

    # -- plot -----------------------------------------------------------------------------------

    def plot(
        self, key: str = "reward_mean", title: str = "reward", filename: str = "reward_curve.png"
    ) -> Path | None:
        """Write ``filename`` (default ``reward_curve.png``) from the metrics (None when there is
        nothing to plot)."""
        # a non-finite value (a diverged loss) is in metrics.jsonl; a curve cannot draw it
        rows = [
            r
            for r in self.metrics()
            if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])
        ]
        if not rows:
            return None
        try:
            import matplotlib
        except ImportError:
            from leanrl._dist import install_hint

            logging.getLogger("leanrl.train").warning(
                "reward_curve.png not drawn: matplotlib is missing (%s)", install_hint("train")
            )
            return None

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator

        steps = [r["step"] for r in rows]
        vals = [r[key] for r in rows]
        fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
        ax.plot(steps, vals, marker=".", lw=1, label=key)
        if len(vals) >= 5:  # a moving average makes noisy RL curves readable
            w = max(2, len(vals) // 10)
            avg = [
                sum(vals[max(0, i - w + 1) : i + 1]) / len(vals[max(0, i - w + 1) : i + 1])
                for i in range(len(vals))
            ]
            ax.plot(steps, avg, lw=2, label=f"{key} (moving avg, {w})")
        ax.set_xlabel("step")
        # steps are whole numbers: no 2.5 tick on a short run
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(key)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        out = self.path / filename
        try:
            with disk_errors(out, "a plot of the metrics"):
                fig.savefig(out)
        finally:
            plt.close(fig)
        return out


def _short(v: Any) -> str:
    """A metric as a person reads it: 4 significant digits for a float (not 0.1234567891)."""
    if isinstance(v, float):
        return format(v, ".4g")
    return "-" if v is None else str(v)


def print_run_summary(run: RunDir, keys: Sequence[str]) -> None:
    """What both training commands print at the end: the folder, the last step, the checkpoint."""
    rows = run.metrics()
    print(f"run folder: {run.path}")
    if rows:
        last = rows[-1]
        print(f"step {last.get('step')}: " + " ".join(f"{k}={_short(last.get(k))}" for k in keys))
    from leanrl.train.infra import infra_summary

    infra = infra_summary(rows)
    if infra["mostly_infra"]:
        steps = infra["mostly_infra_steps"]
        print(
            f"WARNING: most attempts of {len(steps)} step(s) could not be checked (`infra`; "
            f"steps {', '.join(map(str, steps[:10]))}{', ...' if len(steps) > 10 else ''}): "
            "those steps learned from few or no attempts. Check the runtime (`leanrl doctor`)"
        )
    latest = run.latest_checkpoint()
    if latest is not None:
        print(f"latest checkpoint: {latest[1]}  (leanrl eval --model {latest[1]})")


class MetricsLogger:
    """Fans metrics out to the run folder and, when asked, W&B and TensorBoard."""

    def __init__(self, run: RunDir, targets: Sequence[str], name: str | None, config: dict) -> None:
        self.run = run
        self.targets = list(targets)
        self.name = name or run.path.name
        self.config = config
        self._wandb: Any = None
        self._tb: Any = None

    def start(self) -> None:
        """Open the optional loggers (clear error if the package is missing)."""
        if "wandb" in self.targets:
            from leanrl.train.wandb_run import start_wandb

            # The id is the folder's own (stored in it), not its name: see wandb_run.py.
            self._wandb = start_wandb(self.run.path, self.name, self.config)
        if "tensorboard" in self.targets:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise ConfigError(
                    "log_to includes 'tensorboard' but tensorboard is not "
                    "installed: pip install tensorboard"
                ) from None
            self._tb = SummaryWriter(str(self.run.path / "tensorboard"))

    def log(self, row: dict[str, Any]) -> None:
        self.run.log(row)
        step = int(row.get("step", 0))
        scalars = {k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "step"}
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, step)

    def close(self) -> None:
        """Close the loggers; the run is over, so its folder's lock goes too."""
        if self._wandb is not None:
            self._wandb.finish()
        if self._tb is not None:
            self._tb.close()
        self.run.unlock()


def _metrics_row(value: Any) -> dict[str, Any]:
    """A metrics line's row; a ValueError/KeyError/TypeError when it is not one."""
    if not isinstance(value, dict):
        raise TypeError("not a JSON object")
    int(value["step"])  # every row has its step; a row without one cannot be placed
    return {k: _decode_metric(v) for k, v in value.items()}


def _encode_metric(value: Any) -> Any:
    """``value`` for a strict-JSON metrics line: a non-finite float as its string spelling."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _encode_metric(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode_metric(v) for v in value]
    return value


def _decode_metric(value: Any) -> Any:
    """What :func:`_encode_metric` wrote, back (``"NaN"`` -> nan; old files' ``NaN`` too)."""
    if isinstance(value, str):
        return _NON_FINITE.get(value, value)
    if isinstance(value, dict):
        return {k: _decode_metric(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode_metric(v) for v in value]
    return value


# -- checkpoint checksums -------------------------------------------------------------------------

_NO_CHECKSUMS = NO_CHECKSUMS  # the name this module used before the check moved to integrity
_sha256 = sha256_file

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def write_checksums(folder: Path) -> Path:
    """Write ``folder/checksums.sha256``: the sha256 of every file under ``folder`` (in
    ``sha256sum`` format), fsynced and renamed into place, so it exists only whole."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))
    lines = [
        f"{_sha256(p)}  {p.relative_to(folder).as_posix()}\n"
        for p in files
        if p.name != CHECKSUMS_FILE
    ]
    target = folder / CHECKSUMS_FILE
    _atomic_write(target, "".join(lines))
    return target


def _holds_weights(folder: Path) -> bool:
    """Whether ``folder`` holds weight files (a mirrored stub holds only its JSON)."""
    return any(p.suffix in _WEIGHT_SUFFIXES for p in folder.rglob("*") if p.is_file())


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with disk_errors(path, path.name):
        with tmp.open("w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)


_ABSENT = object()


def _changed(old: dict[str, Any], new: dict[str, Any], model: BaseModel, at: str = "") -> list[str]:
    """Dotted names of the fields where a stored config (``old``, JSON) and ``new`` (the dump
    of ``model``) differ. A field missing from ``old`` counts as unchanged when ``new`` holds its
    default: it was added to leanrl after the run started, and its default is what the run did
    (every new option defaults to the old behaviour), so such a run still resumes."""
    out: list[str] = []
    for k in sorted(set(old) | set(new)):
        nv = new.get(k)
        if k not in old:
            if _default_dump(type(model), k) != nv:
                out.append(at + k)
            continue
        ov, sub = old[k], getattr(model, k, None)
        if isinstance(ov, dict) and isinstance(nv, dict) and isinstance(sub, BaseModel):
            out.extend(_changed(ov, nv, sub, f"{at}{k}."))
        elif ov != nv:
            out.append(at + k)
    return out


def _default_dump(cls: type[BaseModel], name: str) -> Any:
    """The JSON form of field ``name``'s default, or a marker that equals nothing."""
    field = cls.model_fields.get(name)
    if field is None or field.is_required():
        return _ABSENT
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return json.loads(value.model_dump_json())
    kind: Any = field.annotation if field.annotation is not None else Any
    return json.loads(TypeAdapter(kind).dump_json(value))
