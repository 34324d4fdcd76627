"""The eval runner: chunks of tasks through the harness, pipelined, resumable, reported.

Work is cut into chunks of ``chunk_tasks`` tasks (all their samples). Up to ``pipeline_depth``
chunks are in flight: while Lean checks chunk i, the model generates chunk i+1 (the ``hf`` and
``vllm`` policies serialize generation themselves, the runtime bounds its own workers). Every
attempt is written to ``results.jsonl`` as soon as its chunk is verified; a rerun skips what is
there and redoes the rest with the same per-chunk seeds. With ``stream``
(:mod:`leanrl.harnesses.whole_proof.stream`) all pending tasks go to the policy at once and each completion is
checked as it arrives; chunks stay the unit of writing.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import logging
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

from leanrl._sandbox_config import REDACTED
from leanrl.environment import Environment, load_environment
from leanrl.errors import ConfigError, LeanrlError, PolicyError
from leanrl.eval.config import EvalConfig
from leanrl.eval.progress import Progress
from leanrl.eval.report import package_versions, run_warnings, summarize, write_report
from leanrl.eval.store import ResultStore
from leanrl.harness import Harness
from leanrl.harnesses.whole_proof.stream import can_stream, stream_chunks
from leanrl.jsonl import cut_text, json_text
from leanrl.policy import (
    Policy,
    PolicyConfig,
    Prompt,
    SamplingConfig,
    stream_replays_generate,
)
from leanrl.proofs import PROOFS_FILE, ProofStore, completion_cap, proof_digest
from leanrl.rollout import Rollout, check_rewards
from leanrl.runtime import Runtime, TacticSession
from leanrl.task import Task
from leanrl.verdict import Attempt, Verdict, VerificationPolicy

log = logging.getLogger(__name__)

__all__ = ["chunk_seed", "run_eval", "run_eval_sync"]


def chunk_seed(seed: int | None, chunk: int) -> int | None:
    """The sampling seed of chunk ``chunk`` (fixed by the config, so resumes replay it)."""
    if seed is None:
        return None
    return (seed * 1_000_003 + chunk * 7_919) % (2**31 - 1)


async def run_eval(
    config: EvalConfig,
    *,
    env: Environment | None = None,
    policy: Policy | None = None,
    progress_label: str | None = None,
) -> dict[str, Any]:
    """Run (or resume) an evaluation; return the summary also written to ``summary.json``.

    ``env`` and ``policy`` may be passed in ready-made (notebooks, tests, trainers); otherwise
    they are built from the config. A policy passed in is started if needed but not closed.
    Bad input fails here, before any model or Lean process starts. ``progress_label``: report
    progress as log lines of ``leanrl.eval`` starting with it (a trainer's held-out
    evaluation), instead of the bar ``config.progress`` asks for
    (:mod:`leanrl.eval.progress`).
    """
    config.check()
    if config.samples > 1 and config.sampling.temperature == 0:
        # Greedy decoding gives every sample of a task the same completion: the extra samples
        # cost generation and checking and add nothing (pass@k = pass@1).
        log.warning(
            "samples=%d with temperature 0 (greedy): every sample of a task will be the same "
            "completion, so pass@k for k > 1 equals pass@1. Set --sampling.temperature (e.g. "
            "0.6) for pass@k, or --samples 1 for a greedy pass@1.",
            config.samples,
        )
    own_policy = policy is None  # close only what this call made; callers own what they pass
    env = env or load_environment(config.env)
    harness, runtime = env.harness, env.runtime  # unknown ids fail here, listing known ones
    checking = not config.generate_only
    if checking:
        env.check_parts()  # e.g. a tactic loop on one-shot Lean: refused before any work
    elif type(harness).generate is Harness.generate:
        await harness.generate([], policy or _NoPolicy(), config.sampling)  # raises, says why
    # The cheap checks all run before anything starts, and every problem is reported at once
    # (an offline machine may lack both the model and the dataset).
    problems: list[LeanrlError] = []
    tasks: list[Task] = []
    if policy is None:
        try:
            policy = _make_policy(config)
        except LeanrlError as e:
            problems.append(e)
    try:
        tasks = env.tasks()
    except LeanrlError as e:
        problems.append(e)
    try:
        if checking:
            runtime.preflight()  # e.g. no Lean project: say so now, not after loading the model
    except LeanrlError as e:
        problems.append(e)
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise ConfigError(
            "cannot start the eval:\n" + "\n".join(f"  - {type(p).__name__}: {p}" for p in problems)
        )
    assert policy is not None
    if not tasks:
        raise ConfigError(
            f"no tasks to evaluate in {config.env.id!r} with the taskset filters given "
            "(split/names/pattern/limit)"
        )
    store = ResultStore(config.out_dir)
    command = shlex.join(sys.argv) if sys.argv and sys.argv[0] else ""
    for secret in config.env.runtime.docker.env.values():  # given on the command line
        if secret:
            command = command.replace(secret, REDACTED)
    store.open(config.fingerprint(), config.fingerprint_data(), command)
    kept = _kept_proofs(config, tasks, store)
    caps = _Caps.of(config)
    n = config.samples
    chunks = [tasks[i : i + config.chunk_tasks] for i in range(0, len(tasks), config.chunk_tasks)]
    pending = [
        i
        for i, ch in enumerate(chunks)
        if any(not store.has((t.id, s)) for t in ch for s in range(n))
    ]
    recorded = sum(1 for t in tasks for s in range(n) if store.has((t.id, s)))
    if recorded:
        total = len(tasks) * n
        log.info(
            "resuming %s: %d of %d attempts already recorded, %s",
            config.out_dir,
            recorded,
            total,
            f"{total - recorded} to go" if pending else "nothing to redo (reporting only)",
        )
    model_name = policy.config.model or config.policy.model
    t_start = time.perf_counter()
    new = 0
    versions: dict[str, Any] = {}
    runtime_metrics: dict[str, float] = {}
    try:
        if pending:
            if policy.name == "openai":
                # Connecting is a cheap probe: a server that is not there fails in seconds,
                # before a Lean pool spends its start-up loading Mathlib.
                await policy.start()
            if checking:
                await runtime.start()  # a missing Lean project fails here, before the model loads
            await policy.start()

            def sampling_of(i: int) -> SamplingConfig:
                return config.sampling.model_copy(
                    update={"n": n, "seed": chunk_seed(config.sampling.seed, i)}
                )

            # Decided (and logged) before the progress bar is drawn, so the line is not
            # written into it.
            streamed = _resolve_stream(config.stream, harness, policy, sampling_of(pending[0]))
            # Without Lean verdicts to wait for, an attempt is as good as done once generated.
            by_generation = not checking or not env.needs_lean
            progress = Progress(
                config, tasks, store, by_generation=by_generation, label=progress_label
            )
            counted = _CountingRuntime(runtime, progress.checked)
            policy.on_completions = progress.generated
            policy.on_tokens = progress.generated_tokens
            ticker = asyncio.ensure_future(progress.ticker())
            sem = asyncio.Semaphore(config.pipeline_depth)

            async def one(i: int) -> int:
                async with sem:
                    sampling = sampling_of(i)
                    if checking:
                        groups = await harness.run(
                            chunks[i], policy, counted, sampling, env.taskset
                        )
                    else:
                        groups = await harness.generate(chunks[i], policy, sampling)
                return record(i, groups)

            def record(i: int, groups: list[list[Rollout]]) -> int:
                _check_groups(harness.name, chunks[i], groups, n, verdicts=checking)
                check_rewards(
                    (r for g in groups for r in g),
                    f"eval {config.out_dir}, chunk {i}",
                    "a NaN or inf is no score, and results.jsonl must stay valid JSON",
                    unit="attempt",
                )
                # Proofs first: an accepted record in results.jsonl then always has its proof
                # kept already (by the process that saw Lean accept it), so a resume never
                # copies proofs from results.jsonl, whose verdicts anyone could have edited.
                kept.add_rollouts(
                    chunks[i], (r for g in groups for r in g), source="eval", model=model_name
                )
                written = store.append(
                    _record(t, r, i, caps)
                    for t, g in zip(chunks[i], groups, strict=True)
                    for r in g
                )
                tokens = sum(t.num_tokens for g in groups for r in g for t in r.turns)
                progress.update(chunks[i], written, tokens)
                return written

            jobs = [] if streamed else [asyncio.ensure_future(one(i)) for i in pending]
            try:
                if streamed:
                    new = await stream_chunks(
                        harness=harness,
                        policy=policy,
                        runtime=counted,
                        taskset=env.taskset,
                        chunks=chunks,
                        pending=pending,
                        sampling_of=sampling_of,
                        checking=checking,
                        record=record,
                        check_size=counted.piece,
                        capacity=counted.inner.check_capacity(),  # chunks finish in order
                    )
                else:
                    new = sum(await asyncio.gather(*jobs))
            finally:
                for j in jobs:
                    j.cancel()
                ticker.cancel()
                policy.on_completions = None
                policy.on_tokens = None
                progress.close()
        versions = await _versions(
            policy.config.model or config.policy.model,
            env,
            runtime,
            ran_lean=checking and bool(pending),
        )
        runtime_metrics = runtime.metrics()  # cost and counters (sandbox/CPU-seconds, restarts)
    finally:
        store.close()
        if pending:
            if checking:
                await runtime.close()
            if own_policy:
                await policy.close()
    wall = time.perf_counter() - t_start
    summary: dict[str, Any] = {
        "out": str(config.out_dir),
        "fingerprint": config.fingerprint(),
        "ks": config.ks,
        "config": config.model_dump(mode="json"),
        "versions": versions,
        "results": summarize(
            list(store.records.values()),
            [t.id for t in tasks],
            {t.id: t.category for t in tasks},
            n,
            config.ks,
        ),
        # the harness and runtime that ran, which an environment may choose itself (Countdown's
        # are its own whatever the config names)
        "harness": {"name": harness.name or type(harness).__name__},
        "runtime": {"name": runtime.name or type(runtime).__name__, "metrics": runtime_metrics},
        "lean": env.needs_lean,  # False: answers are judged without Lean (Countdown)
        "cost": _cost(config, runtime_metrics, wall),
        "timing": {
            "wall_s": wall,
            "attempts_this_run": new,
            "attempts_per_s": new / wall if wall > 0 else 0.0,
        },
    }
    if config.generate_only:
        summary["generate_only"] = True
        # whole records from disk: the store keeps only an index in memory
        summary["completions"] = str(_write_completions(config.out_dir, store.full_records()))
    summary["warnings"] = run_warnings(summary)
    write_report(config.out_dir, summary)
    return summary


def _cost(config: EvalConfig, runtime_metrics: dict[str, float], wall: float) -> dict[str, Any]:
    """GPU-seconds (this process's GPU for the whole run), sandbox-seconds and dollars."""
    from leanrl.costs import Usage, local_gpus, sandbox_usage

    device = config.policy.device
    if config.policy.backend == "vllm":
        device = "cuda"
    elif config.policy.backend != "hf":
        device = "cpu"  # a remote server's GPUs are not this run's to count
    elif device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    kind, count = local_gpus(device, config.launcher.gpu)
    usage = Usage(gpu_s={kind: wall * count} if kind else {})
    return usage.add(sandbox_usage(runtime_metrics)).as_dict(config.launcher.prices)


def _write_completions(out: Path, records: Iterable[dict[str, Any]]) -> Path:
    """``completions.jsonl``: one row per extracted proof, in the format ``leanrl verify``
    reads (``name``, ``proof``, ``preamble``, ``id``), written whole (a resume rewrites it)."""
    path = out / "completions.jsonl"
    # One row per attempt (a later record of the same attempt replaces an earlier one); only
    # the rows are held, not the whole records.
    latest: dict[tuple[str, int], dict[str, Any] | None] = {}
    for r in records:
        latest[(str(r["task_id"]), int(r["sample"]))] = (
            None
            if r.get("proof") is None
            else {
                "name": r["name"],
                "id": f"{r['task_id']}/{r['sample']}",
                "task_id": r["task_id"],
                "sample": r["sample"],
                "proof": r["proof"],
                "preamble": r.get("preamble") or "",
            }
        )
    rows = [row for _, row in sorted(latest.items()) if row is not None]
    tmp = path.with_name(path.name + ".tmp")
    text = "".join(json_text(r, str(path), ensure_ascii=False) + "\n" for r in rows)
    tmp.write_text(text, "utf-8")
    tmp.replace(path)
    return path


def run_eval_sync(config: EvalConfig, **kw: Any) -> dict[str, Any]:
    """Blocking :func:`run_eval` (scripts; inside Jupyter it runs on a worker thread)."""
    from leanrl.runtime import run_sync

    result: dict[str, Any] = run_sync(run_eval(config, **kw))
    return result


def _make_policy(config: EvalConfig) -> Policy:
    from leanrl.policies import make_policy
    from leanrl.policies._common import resolve_model

    policy = make_policy(config.policy)
    if config.policy.backend in ("hf", "vllm"):
        resolve_model(config.policy.model)  # a missing folder or offline hub id fails now
    return policy


def _kept_proofs(config: EvalConfig, tasks: Sequence[Task], store: ResultStore) -> ProofStore:
    """``proofs.jsonl`` of the run (a bad line in it is moved aside, never a reason to stop).

    Proofs are kept only from attempts this process saw the checker accept; ``results.jsonl``
    is never copied in: its verdicts are plain text that a hand edit (or any other program) can
    change, and ``proofs.jsonl`` is training data. An accepted record without its kept proof (a
    run from before proofs were kept, or an edited verdict) gets a warning instead."""
    cap = completion_cap(config.env.taskset.policy.max_proof_chars)
    kept = ProofStore(config.out_dir / PROOFS_FILE, completion_chars=cap).open()
    wanted = {t.id for t in tasks}
    missing = 0
    for rec in store.full_records():  # from disk: the store keeps only an index in memory
        if str(rec.get("task_id")) not in wanted or not rec.get("accepted"):
            continue
        proof = rec.get("proof")
        digest = proof_digest(proof, rec.get("preamble") or "") if isinstance(proof, str) else ""
        if not kept.has(str(rec["task_id"]), digest):
            missing += 1
    if missing:
        log.warning(
            "%s: %d accepted attempt(s) have no kept proof in %s (a run from before proofs were "
            "kept, or a verdict edited by hand). They are not copied: results.jsonl is not "
            "checked input. Run the eval again in a new --out folder to keep their proofs.",
            store.results_path,
            missing,
            kept.path,
        )
    return kept


def _check_groups(
    harness: str,
    tasks: Sequence[Task],
    groups: Sequence[Sequence[Rollout]],
    n: int,
    *,
    verdicts: bool = True,
) -> None:
    """Every task came back with samples 0..n-1, once each, each with a Verdict; otherwise the
    chunk is not recorded (a silent gap would leave the task out of pass@k for good)."""
    if len(groups) != len(tasks):
        raise PolicyError(
            f"harness {harness!r} returned {len(groups)} groups for {len(tasks)} tasks"
        )
    for task, group in zip(tasks, groups, strict=True):
        samples = sorted(r.sample for r in group)
        if samples != list(range(n)):
            raise PolicyError(
                f"harness {harness!r} returned samples {samples[:8]} for task {task.id!r}, "
                f"expected 0..{n - 1} once each (does the policy honour sampling.n?)"
            )
        missing = [r.sample for r in group if r.verdict is None]
        if missing and verdicts:
            raise PolicyError(
                f"harness {harness!r} left samples {missing[:8]} of task {task.id!r} without a "
                "verdict"
            )


class _Caps:
    """The longest texts a record stores (see :func:`_record`)."""

    def __init__(self, proof: int, completion: int) -> None:
        self.proof = proof
        self.completion = completion

    @classmethod
    def of(cls, config: EvalConfig) -> _Caps:
        limit = config.env.taskset.policy.max_proof_chars
        # One character over the checker's limit: a stored proof that long is still refused as
        # too_large when `leanrl verify` checks it again, as the whole one was.
        return cls(proof=limit + 1, completion=completion_cap(limit))


def _record(task: Task, r: Rollout, chunk: int, caps: _Caps | None = None) -> dict[str, Any]:
    v = r.verdict
    prompt: Any = r.prompt if isinstance(r.prompt, str) else [m.model_dump() for m in r.prompt]
    cuts: dict[str, dict[str, Any]] = {}

    def cap(field: str, text: str | None, limit: int | None) -> str | None:
        """``text`` as stored: a huge completion (an API that ignored max_tokens) is cut, with
        its length and sha256 under ``text_cut``, rather than written in full (twice, with
        ``turns``)."""
        if text is None or limit is None:
            return text
        stored, cut = cut_text(text, limit)
        if cut is not None:
            cuts[field] = cut
        return stored

    proof_cap = caps.proof if caps else None
    text_cap = caps.completion if caps else None
    rec: dict[str, Any] = {
        "task_id": task.id,
        "name": task.name,
        "category": task.category,
        "sample": r.sample,
        "chunk": chunk,
        "accepted": bool(v is not None and v.accepted),
        "reward": r.reward,
        "verdict": v.model_dump(mode="json") if v is not None else None,
        "proof": cap("proof", r.proof, proof_cap),
        "preamble": cap("preamble", r.preamble, proof_cap),
        "restated_statement": cap("restated_statement", r.restated_statement, proof_cap),
        "completion": cap("completion", r.completion, text_cap),
        "finish_reason": r.turns[-1].finish_reason if r.turns else None,
        "prompt": prompt,
        # An HTTP backend may return no token ids; one logprob per generated token still
        # counts them. A prompt whose tokens nobody reported is None, not 0.
        "prompt_tokens": len(r.prompt_ids) if r.prompt_ids else None,
        "completion_tokens": sum(t.num_tokens for t in r.turns),
        "feedback_tokens": sum(len(t.feedback_ids) for t in r.turns),
        "timings": r.timings,
        "meta": r.meta,
    }
    if len(r.turns) > 1 or any(t.feedback for t in r.turns):
        rec["turns"] = [
            {
                "completion": cap(f"turns[{k}].completion", t.completion, text_cap),
                "feedback": cap(f"turns[{k}].feedback", t.feedback, text_cap),
                "finish_reason": t.finish_reason,
            }
            for k, t in enumerate(r.turns)
        ]
    if cuts:
        rec["text_cut"] = cuts
    return rec


def _resolve_stream(
    want: bool | str, harness: Any, policy: Policy, sampling: SamplingConfig
) -> bool:
    """``eval.stream`` resolved for this run (see its docstring), with the reason logged."""
    if want is False:
        return False
    if not can_stream(harness):
        if want is True:
            log.info(
                "eval.stream: harness %r cannot be streamed; running it chunk by chunk",
                harness.name,
            )
        return False
    if want is True:
        return True
    if stream_replays_generate(policy, harness.sampling(sampling)):
        log.info(
            "eval.stream auto: streaming (%s streams the completions generate would)", policy.name
        )
        return True
    log.info(
        "eval.stream auto: chunk by chunk (%s's stream would not give what its generate "
        "gives for this sampling; --stream streams anyway)",
        policy.name,
    )
    return False


async def _versions(
    model: str, env: Environment, runtime: Any, *, ran_lean: bool = False
) -> dict[str, Any]:
    out: dict[str, Any] = dict(package_versions())
    ts = env.taskset
    if not env.needs_lean:  # no Lean version, taskset pin or Lean project applies
        out["model"] = model
        out["model_revision"] = _model_revision(model)
        return out
    if ran_lean:  # what really ran, from the runtime; None when it cannot tell
        try:
            out["lean_ran"] = await runtime.lean_version()
        except Exception as e:  # noqa: BLE001 - versions are informative, never fatal
            out["lean_ran"] = None
            out["lean_ran_error"] = f"{type(e).__name__}: {e}"
    out["lean_toolchain"] = ts.lean_toolchain  # a `dataset` taskset may take its file's
    out["mathlib_rev"] = type(ts).mathlib_rev
    out["model"] = model
    out["model_revision"] = _model_revision(model)
    out.update(_project_versions(runtime))
    # A runtime may report what it really runs (`async def versions() -> dict`).
    fn = getattr(runtime, "versions", None)
    if callable(fn):
        try:
            got = fn()
            if inspect.isawaitable(got):
                got = await got
            if isinstance(got, dict):
                out.update({f"runtime_{k}": v for k, v in got.items()})
        except Exception as e:  # noqa: BLE001 - versions are informative, never fatal
            out["runtime_versions_error"] = f"{type(e).__name__}: {e}"
    return out


def _project_versions(runtime: Any) -> dict[str, Any]:
    """The toolchain and Mathlib revision of the Lean project the runtime uses, when known, read
    from its files: found the way the local runtime finds it (``runtime.config.lean_project``,
    ``LEANRL_LEAN_PROJECT``, else the project ``leanrl setup`` made the default)."""
    from leanrl.lean.project import find_project

    cfg = getattr(runtime, "config", None)
    configured = getattr(cfg, "lean_project", None)
    try:
        root = find_project(Path(configured) if configured else None)
    except LeanrlError:
        return {}
    if root is None or not root.is_dir():
        return {}
    out: dict[str, Any] = {"lean_project": str(root)}
    tc = root / "lean-toolchain"
    if tc.is_file():
        out["lean_project_toolchain"] = tc.read_text(encoding="utf-8").strip()
    manifest = root / "lake-manifest.json"
    if manifest.is_file():
        try:
            pkgs = json.loads(manifest.read_text(encoding="utf-8")).get("packages", [])
            revs = {p.get("name"): p.get("rev") for p in pkgs if isinstance(p, dict)}
            out["lean_project_mathlib_rev"] = revs.get("mathlib")
        except (ValueError, AttributeError):
            out["lean_project_mathlib_rev"] = None
    return out


def _model_revision(model: str) -> str | None:
    path = Path(model).expanduser()
    if (path / "config.json").is_file():
        digest = hashlib.sha256((path / "config.json").read_bytes())
        for w in sorted(path.glob("*.safetensors"))[:4]:
            st = w.stat()
            digest.update(f"{w.name}:{st.st_size}".encode())
        return "local:" + digest.hexdigest()[:12]
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(model, "config.json")
    except Exception:  # noqa: BLE001 - not a hub id, or no hub library
        return None
    if isinstance(found, str) and "/snapshots/" in found:
        return found.split("/snapshots/")[1].split("/")[0]
    return None


class _NoPolicy(Policy):
    """Stands in for a policy not made yet, for a check that never generates."""

    name = "none"

    def __init__(self) -> None:
        super().__init__(PolicyConfig(model="none"))

    async def generate(self, prompts: Sequence[Prompt], sampling: SamplingConfig) -> Any:
        raise AssertionError("never called")  # pragma: no cover


class _CountingRuntime(Runtime):
    """The run's runtime, reporting each verdict to the progress bar as it arrives.

    A batch is checked in the pieces the runtime would make of it anyway
    (:meth:`Runtime.check_piece`: one attempt for the local pool, which runs them concurrently;
    ``batch_size`` for the sandboxed runtimes), so the bar moves per attempt without changing
    how attempts are sent. Other runtimes get their batches whole."""

    def __init__(self, inner: Runtime, on_done: Callable[[int], None]) -> None:
        super().__init__(inner.config)
        self.inner = inner
        self.name = inner.name  # type: ignore[misc]
        self.on_done = on_done
        self.piece = inner.check_piece()

    def __getattr__(self, attr: str) -> Any:  # max_tactic_sessions and other extras
        return getattr(self.inner, attr)

    async def check(self, attempts: Sequence[Attempt]) -> list[Verdict]:
        if self.piece <= 0 or len(attempts) <= self.piece:
            verdicts = await self.inner.check(attempts)
            self.on_done(len(verdicts))
            return verdicts

        async def part(chunk: Sequence[Attempt]) -> list[Verdict]:
            got = await self.inner.check(chunk)
            self.on_done(len(got))
            return got

        step = self.piece
        parts = await asyncio.gather(
            *(part(attempts[i : i + step]) for i in range(0, len(attempts), step))
        )
        return [v for p in parts for v in p]

    def supports_tactic_sessions(self) -> bool:
        return self.inner.supports_tactic_sessions()

    def tactic_session(
        self, header: str, policy: VerificationPolicy | None = None
    ) -> AbstractAsyncContextManager[TacticSession]:
        return self.inner.tactic_session(header, policy)
