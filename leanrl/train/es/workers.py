"""Scoring an ES population: the :class:`MemberScorer` interface and its backends.

A member is ``(seed, sign)``: it scores the weights ``θ + sign·σ·ε(seed)`` (low-rank runs:
``A(seed)·B(seed)ᵀ/√r`` per matrix in place of ε, which the
:class:`~leanrl.train.es.history.WeightsSource` carries, so every backend that builds its weights
with :func:`~leanrl.train.es.history.load_weights` perturbs the same way). Members are
independent, so they can be scored anywhere that can rebuild ``θ``. Every backend here follows the
same rule: **a worker holds the base weights and the history, never receives full weights**. Per
iteration it gets the history records it has not applied yet (a few hundred bytes each), the tasks,
the decoding settings and its members' seeds, and answers with one :class:`MemberScore` each.

Backends:

- :class:`InProcessScorer`: perturbs the trainer's own live model, scores, restores. No copies.
- :class:`ProcessPoolScorer`: local worker processes (spawned), each with its own copy of the model
  built from a :class:`~leanrl.train.es.history.WeightsSource` plus history records.
- :class:`VLLMScorer`: a vLLM engine on a GPU; perturb/restore/update run *inside* the engine's
  workers through a worker extension and ``collective_rpc`` (no reload, no weight transfer), with
  the prefix cache disabled so no KV computed under one member is reused by another. Low-rank
  runs use its subclass :class:`~leanrl.train.es.vllm_scorer.LowRankVLLMScorer` (members as
  LoRA adapters of the engine, the update applied inside it).

A remote backend (e.g. Modal ``Function.map`` over members) implements the same three methods:
each remote call receives ``(WeightsSource, records, tasks, sampling, sigma, member)`` and caches
the loaded weights per container.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing as mp
import time
import traceback
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from leanrl._dist import install_hint
from leanrl.environment import EnvironmentConfig, load_environment
from leanrl.errors import ConfigError, PolicyError
from leanrl.policy import (
    Completion,
    Policy,
    PolicyConfig,
    Prompt,
    SamplingConfig,
    StreamCompletion,
    StreamRequest,
    closing_stream,
)
from leanrl.task import Task
from leanrl.train.distributed import round_robin
from leanrl.train.es.history import HistoryRecord, WeightsSource

if TYPE_CHECKING:
    from leanrl.environment import Environment
    from leanrl.train.es.weights import ESWeights

__all__ = [
    "InProcessScorer",
    "IterationState",
    "Member",
    "MemberScore",
    "MemberScorer",
    "ProcessPoolScorer",
    "VLLMScorer",
    "score_rollouts",
]


@dataclass(frozen=True)
class Member:
    """One population member: noise seed and sign (+1, or -1 for the mirrored twin)."""

    seed: int
    sign: int = 1


@dataclass(frozen=True)
class IterationState:
    """What a worker needs to score members of one iteration (all of it small)."""

    iteration: int
    """The iteration being scored (1-based); members perturb ``θ_{iteration-1}``."""
    tasks: tuple[Task, ...]
    """The batch every member is scored on."""
    sampling: SamplingConfig
    """Decoding (greedy by default) and samples per task (``n``)."""
    sigma: float
    """Noise scale σ."""
    records: tuple[HistoryRecord, ...]
    """The history so far (iterations ``1..iteration-1``); workers apply what they lack."""


@dataclass
class MemberScore:
    """A member's result: its reward and what it cost."""

    reward: float
    """Mean reward over every judged rollout (tasks × samples per task, less the ``infra``
    ones); 0.0 when none was judged (see :attr:`unjudged`)."""
    pass_rate: float | None
    """Fraction of the judged rollouts the checker accepted; None when the environment gives
    rewards but no verdicts (nothing to pass or fail), or when none was judged."""
    tokens: int = 0
    """Generated tokens (for tokens/s)."""
    perturb_s: float = 0.0
    """Seconds spent writing the perturbation and restoring."""
    score_s: float = 0.0
    """Seconds spent on rollouts (generation + verification)."""
    rewards: list[float] = field(default_factory=list)
    """Every judged rollout's reward, task-major."""
    task_ids: list[str] = field(default_factory=list)
    """The task of each entry of ``rewards`` (to name the task in error messages)."""
    passed: list[bool] = field(default_factory=list)
    """Whether the checker accepted each entry of ``rewards`` (False where the environment gives
    rewards but no verdicts); the run's difficulty table reads it (``curriculum``)."""
    infra: int = 0
    """Rollouts the checker could not judge (verdict ``infra``): no outcome of the member, so
    they are left out of ``reward``, ``pass_rate`` and ``rewards``."""
    kept: list[dict[str, Any]] = field(default_factory=list)
    """The accepted attempts (task id, sample, proof, preamble, completion, axioms, time), for
    the run's ``proofs.jsonl``."""

    @property
    def unjudged(self) -> bool:
        """Whether no rollout of the member was judged (all ``infra``): it has no reward."""
        return self.infra > 0 and not self.rewards


@runtime_checkable
class MemberScorer(Protocol):
    """Scores population members. ``start`` before the first ``score``; ``close`` at the end."""

    async def start(self) -> None: ...

    async def score(self, state: IterationState, members: Sequence[Member]) -> list[MemberScore]:
        """One score per member, in order, each for ``θ_{state.iteration-1} + sign·σ·ε(seed)``."""
        ...

    async def close(self) -> None: ...


async def score_rollouts(
    env: Environment, policy: Policy, tasks: Sequence[Task], sampling: SamplingConfig
) -> MemberScore:
    """Run the environment on ``tasks`` with ``policy`` and summarise the rewards."""
    t0 = time.perf_counter()
    groups = await env.rollout(tasks, policy, sampling)
    rollouts = [r for g in groups for r in g]
    if not rollouts:
        raise ConfigError(
            f"the environment returned no rollouts for a batch of {len(tasks)} task(s) "
            f"(n = {sampling.n}): its harness must return one group of rollouts per task. Check "
            "the harness (and that tasks_per_step and sampling.n are at least 1)"
        )
    judged = [r for r in rollouts if not r.infra]  # infra: the checker did not run
    rewards = [float(r.reward) for r in judged]
    passed = sum(1 for r in judged if r.verdict is not None and r.verdict.accepted)
    tokens = sum(len(t.completion_ids) for r in rollouts for t in r.turns)
    kept = [
        {
            "task_id": str(r.task_id),
            "sample": r.sample,
            "proof": r.proof,
            "preamble": r.preamble,
            "restated_statement": r.restated_statement,
            "completion": r.turns[-1].completion if r.turns else "",
            "axioms": list(r.verdict.axioms),
            "verify_s": r.verdict.time_s,
        }
        for r in rollouts
        if r.verdict is not None and r.verdict.accepted and r.proof is not None
    ]
    return MemberScore(
        reward=sum(rewards) / len(rewards) if rewards else 0.0,
        # a reward-only environment (no verdicts at all) has no pass rate, not a 0.0 one
        pass_rate=(passed / len(judged) if any(r.verdict is not None for r in judged) else None),
        tokens=tokens,
        score_s=time.perf_counter() - t0,
        rewards=rewards,
        task_ids=[str(r.task_id) for r in judged],
        passed=[r.verdict is not None and r.verdict.accepted for r in judged],
        kept=kept,
        infra=len(rollouts) - len(judged),
    )


# -- in-process ------------------------------------------------------------------------------------


class InProcessScorer:
    """Scores members one after another on the trainer's live model.

    ``weights`` are owned by the trainer, which keeps them at ``θ_{iteration-1}``; this scorer
    only perturbs and restores them (restore is exact, so it leaves them as it found them).
    """

    def __init__(self, env: Environment, policy: Policy, weights: ESWeights) -> None:
        self.env = env
        self.policy = policy
        self.weights = weights

    async def start(self) -> None:
        await self.policy.start()

    async def score(self, state: IterationState, members: Sequence[Member]) -> list[MemberScore]:
        out = []
        for m in members:
            t0 = time.perf_counter()
            self.weights.perturb(m.seed, m.sign * state.sigma)
            t_perturb = time.perf_counter() - t0
            try:
                res = await score_rollouts(self.env, self.policy, state.tasks, state.sampling)
            finally:
                t1 = time.perf_counter()
                self.weights.restore()
                t_perturb += time.perf_counter() - t1
            res.perturb_s = t_perturb
            out.append(res)
        return out

    async def close(self) -> None:
        return None


# -- local worker processes -------------------------------------------------------------------------


@dataclass(frozen=True)
class _WorkerInit:
    source: WeightsSource
    records: tuple[HistoryRecord, ...]
    env: EnvironmentConfig
    policy: PolicyConfig
    threads: int


def _worker_main(conn: Any, init: _WorkerInit) -> None:
    """A worker process: build θ from source + history, then score members on request."""
    try:
        asyncio.run(_worker_loop(conn, init))
    except (EOFError, KeyboardInterrupt):
        pass


async def _worker_loop(conn: Any, init: _WorkerInit) -> None:
    import torch

    from leanrl.train.es.history import load_weights
    from leanrl.train.es.policy import TorchPolicy

    torch.set_num_threads(init.threads)
    env = None
    try:
        env = load_environment(init.env)  # cheap, and the likeliest to fail: first
        model, tok, weights = load_weights(init.source, list(init.records))
        applied = max(init.source.iteration, len(init.records))
        policy = TorchPolicy(model, tok, init.policy)
        await env.start()
        conn.send(("ready", applied))
    except Exception:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(("error", traceback.format_exc()))
        return
    try:
        while True:
            msg = await asyncio.to_thread(conn.recv)
            if msg[0] == "close":
                break
            _, new_records, tasks, sampling, sigma, members = msg
            try:
                for rec in new_records:
                    if rec.iteration != applied + 1:
                        raise RuntimeError(
                            f"worker at iteration {applied} got record {rec.iteration}"
                        )
                    weights.apply_update(rec.coeffs)
                    applied = rec.iteration
                scores = []
                for seed, sign in members:
                    t0 = time.perf_counter()
                    weights.perturb(seed, sign * sigma)
                    tp = time.perf_counter() - t0
                    try:
                        res = await score_rollouts(env, policy, tasks, sampling)
                    finally:
                        t1 = time.perf_counter()
                        weights.restore()
                        tp += time.perf_counter() - t1
                    res.perturb_s = tp
                    scores.append(res)
                conn.send(("ok", scores))
            except Exception:  # noqa: BLE001 - reported to the parent, which raises it
                conn.send(("error", traceback.format_exc()))
    finally:
        if env is not None:
            await env.close()


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


class ProcessPoolScorer:
    """Scores members in ``workers`` local processes, members split round-robin.

    Each process loads the model from ``source`` itself and replays history records; per
    iteration it receives only the records it lacks, the tasks and its seeds.
    """

    def __init__(
        self,
        source: WeightsSource,
        env: EnvironmentConfig,
        policy: PolicyConfig,
        *,
        workers: int = 2,
        threads_per_worker: int = 1,
        records: Sequence[HistoryRecord] = (),
    ) -> None:
        self.source = source
        self.env_config = env
        self.policy_config = policy
        self.workers = workers
        self.threads = threads_per_worker
        self.initial_records = tuple(records)
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        self._applied: list[int] = []

    async def start(self) -> None:
        if self._procs:
            return
        ctx = mp.get_context("spawn")  # fork + torch threads deadlock; spawn is safe everywhere
        init = _WorkerInit(
            self.source, self.initial_records, self.env_config, self.policy_config, self.threads
        )
        gpus = _cuda_count() if self.source.device.startswith("cuda") else 0
        for i in range(self.workers):
            if gpus > 1:  # one GPU per worker, round-robin (CUDA noise is the same on every GPU)
                src = replace(self.source, device=f"cuda:{i % gpus}")
                init = replace(init, source=src)
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker_main, args=(child, init), daemon=True)
            proc.start()
            child.close()
            self._procs.append(proc)
            self._conns.append(parent)
        replies = await self._gather(range(self.workers))
        self._applied = [int(r) for r in replies]

    async def _gather(self, workers: Sequence[int]) -> list[Any]:
        """One reply from each of ``workers``. If any fails, every other reply is still read
        (no stale answer is left in a pipe) and then the pool is shut down and the first error
        raised: a pool with a failed worker is not reused."""
        replies = await asyncio.gather(*(self._recv(w) for w in workers), return_exceptions=True)
        errors = [r for r in replies if isinstance(r, BaseException)]
        if errors:
            await self.close()
            raise errors[0]
        return list(replies)

    def _died(self, i: int) -> PolicyError:
        proc = self._procs[i]
        proc.join(5)  # the pipe closes a moment before the exit code is known
        code = proc.exitcode
        hint = ""
        if code == -9:
            hint = (
                " Exit code -9 (SIGKILL) is usually the out-of-memory killer: every worker holds "
                "a full copy of the model, so lower scorer.workers (or use a smaller model)."
            )
        elif code is not None and code < 0:
            hint = f" It was killed by signal {-code}."
        return PolicyError(
            f"ES worker {i} died (exit code {code}).{hint} The run can be resumed: rerun the "
            "same command (the history keeps every finished iteration)."
        )

    async def _recv(self, i: int) -> Any:
        try:
            kind, payload = await asyncio.to_thread(self._conns[i].recv)
        except (EOFError, OSError):
            raise self._died(i) from None
        if kind == "error":
            raise PolicyError(f"ES worker {i} failed:\n{payload}")
        return payload

    async def score(self, state: IterationState, members: Sequence[Member]) -> list[MemberScore]:
        if not self._procs:
            raise PolicyError("ProcessPoolScorer.score called before start()")
        assign = round_robin(len(members), self.workers)
        busy: list[int] = []
        for w, idx in enumerate(assign):
            if not idx:
                continue
            new = tuple(r for r in state.records if r.iteration > self._applied[w])
            payload = [(members[i].seed, members[i].sign) for i in idx]
            try:
                self._conns[w].send(
                    ("score", new, tuple(state.tasks), state.sampling, state.sigma, payload)
                )
            except OSError:  # BrokenPipeError: the worker is gone
                await self._gather(busy)  # read what the others were sent, then
                err = self._died(w)
                await self.close()
                raise err from None
            self._applied[w] = state.iteration - 1
            busy.append(w)
        results = await self._gather(busy)
        out: list[MemberScore | None] = [None] * len(members)
        for w, res in zip(busy, results, strict=True):
            for i, r in zip(assign[w], res, strict=True):
                out[i] = r
        return [r for r in out if r is not None]

    async def close(self) -> None:
        for conn in self._conns:
            try:
                conn.send(("close",))
            except (OSError, BrokenPipeError):
                pass
        for proc in self._procs:
            await asyncio.to_thread(proc.join, 30)
            if proc.is_alive():
                proc.kill()
                await asyncio.to_thread(proc.join, 5)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []


# -- vLLM (GPU) ---------------------------------------------------------------------------------------


class ESVLLMWorkerExtension:
    """Mixed into every vLLM GPU worker (``worker_extension_cls``); called via ``collective_rpc``.

    Holds an fp32 master copy keyed by **Hugging Face tensor names** and writes weights into the
    engine through the model's own ``load_weights`` (which handles fused qkv/gate_up tensors and
    tensor-parallel sharding). Noise is drawn per HF name with the same
    :func:`~leanrl.train.es.weights.noise` as everywhere else, so a vLLM run's history replays
    with the HF model on the same kind of device.
    """

    model_runner: Any  # provided by the vLLM worker this class is mixed into

    def es_init(self, hf_model: str, dtype: str) -> int:
        """Load the fp32 master from the HF checkpoint on this worker's GPU; returns #tensors."""
        import torch
        from transformers import AutoModelForCausalLM

        device = next(self.model_runner.model.parameters()).device
        hf = AutoModelForCausalLM.from_pretrained(hf_model, dtype=getattr(torch, dtype))
        self.es_master = {
            n: p.detach().to(device=device, dtype=torch.float32, copy=True)
            for n, p in hf.named_parameters()
        }
        self.es_dtype = getattr(torch, dtype)
        del hf
        self._es_load(lambda n, t: t)
        return len(self.es_master)

    def _es_load(self, fn: Any) -> None:
        # a generator: one tensor's cast copy alive at a time, not a second copy of the model
        batch = ((n, fn(n, t).to(self.es_dtype)) for n, t in self.es_master.items())
        self.model_runner.model.load_weights(weights=batch)

    def es_perturb(self, seed: int, scale: float) -> None:
        import torch

        from leanrl.train.es.weights import noise

        self._es_load(lambda n, t: torch.add(t, noise(seed, n, t.shape, t.device), alpha=scale))

    def es_restore(self) -> None:
        self._es_load(lambda n, t: t)

    def es_update(self, coeffs: list[tuple[int, float]]) -> None:
        import torch

        from leanrl.train.es.weights import noise

        for n, t in self.es_master.items():
            delta = torch.zeros_like(t)
            for seed, c in coeffs:
                delta.add_(noise(seed, n, t.shape, t.device), alpha=c)
            t.add_(delta)
        self.es_restore()

    def es_load_master(self, path: str) -> None:
        """Replace the master with an exact fp32 copy saved by :meth:`es_save_master`."""
        from safetensors.torch import load_file

        for n, t in load_file(path).items():
            self.es_master[n].copy_(t)
        self.es_restore()

    def es_save_master(self, path: str) -> bool:
        """Write the fp32 master to ``path`` on rank 0 only (every rank holds the same full
        master; several ranks writing one path would race). Returns whether this rank wrote."""
        from safetensors.torch import save_file

        if _worker_rank(self) != 0:
            return False
        save_file({k: v.contiguous().cpu() for k, v in self.es_master.items()}, path)
        return True


def _worker_rank(worker: Any) -> int:
    """The global rank of a vLLM worker (its ``rank`` attribute, else torch.distributed's)."""
    rank = getattr(worker, "rank", None)
    if isinstance(rank, int):
        return rank
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


#: ``vllm.LLM`` arguments the ES scorer sets itself, and the field to use instead.
_ENGINE_OWN = {
    "model": "policy.model",
    "dtype": "policy.dtype",
    "worker_extension_cls": "(none: the ES scorer needs its own)",
    "gpu_memory_utilization": "policy.gpu_memory_utilization",
}


def vllm_engine_kwargs(
    source: WeightsSource, policy: PolicyConfig, gpu_memory_utilization: float
) -> dict[str, Any]:
    """The keyword arguments of ``vllm.LLM`` for the ES scorer: ``policy.options`` merged with
    the ones ES needs. Options may override defaults (``enable_prefix_caching``: the scorer
    resets the prefix cache after every weight change anyway) but not what ES depends on."""
    clash = sorted(k for k in policy.options if k in _ENGINE_OWN)
    if clash:
        raise ConfigError(
            f"policy.options sets {clash}, which the ES vLLM scorer sets itself: use "
            f"{[_ENGINE_OWN[k] for k in clash]} instead"
        )
    return {
        "enable_prefix_caching": False,
        **policy.options,
        "model": source.checkpoint or source.model,
        "dtype": source.dtype,
        "gpu_memory_utilization": gpu_memory_utilization,
        "worker_extension_cls": "leanrl.train.es.workers.ESVLLMWorkerExtension",
    }


def engine_memory_fraction(
    *,
    total_bytes: int,
    free_bytes: int,
    n_params: int,
    largest_tensor: int,
    requested: float | None,
    default: float = 0.85,
) -> float:
    """The ``gpu_memory_utilization`` to start the engine with, leaving room for ES's own buffers.

    vLLM reserves ``fraction x total`` of the GPU for weights + KV cache when it starts; the ES
    worker extension then allocates, *outside* that reservation, an fp32 master of the whole
    model (4 bytes/parameter on every GPU) plus up to three fp32 buffers of the largest tensor
    (noise, sum, update) while it perturbs or updates. ``requested`` (an explicit ``policy.gpu_memory_utilization``) is checked against
    that; ``None`` picks the largest fraction up to ``default`` that fits. Raises PolicyError
    early, with the fraction that would fit, instead of an out-of-memory error after loading.
    """
    need = 4 * n_params + 3 * 4 * largest_tensor + 512 * 2**20  # + CUDA context / allocator slack
    already_used = total_bytes - free_bytes  # other processes, this process's CUDA context
    fits = (total_bytes - already_used - need) / total_bytes  # the most the engine may reserve
    gib = need / 2**30
    if requested is None:
        if fits < 0.1:
            raise PolicyError(
                f"the ES vLLM scorer needs {gib:.1f} GiB of GPU memory outside the engine for the "
                f"fp32 master of {n_params / 1e9:.2f}B parameters, leaving under 10% of this "
                f"GPU ({total_bytes / 2**30:.0f} GiB, {free_bytes / 2**30:.0f} GiB free) for the "
                "engine: use a GPU with more memory, or a smaller model"
            )
        return math.floor(min(default, fits) * 100) / 100
    if requested > fits:
        raise PolicyError(
            f"policy.gpu_memory_utilization = {requested} leaves too little GPU memory for the "
            f"ES fp32 master ({gib:.1f} GiB for {n_params / 1e9:.2f}B parameters, allocated "
            f"after the engine reserves its share): set policy.gpu_memory_utilization <= "
            f"{math.floor(fits * 100) / 100:.2f}, or leave it unset to have it chosen"
        )
    return requested


def _count_params(path: str) -> tuple[int, int]:
    """(parameters, largest tensor's size) of a HF model, from its config: nothing is loaded."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    sizes = [p.numel() for p in model.parameters()]
    return sum(sizes), max(sizes)


class VLLMScorer:
    """Scores members with a vLLM engine, perturbing weights inside the engine (GPU only).

    Loads lazily (the ``vllm`` extra). Prefix caching is off, and the cache is reset
    after every weight change anyway, so no KV block computed under one member's weights is
    reused for another.
    """

    lowrank_ok = False
    """Whether this class scores low-rank runs (its subclass in ``vllm_scorer`` does)."""

    def __init__(
        self, env: Environment, source: WeightsSource, policy: PolicyConfig, master_path: str | None
    ) -> None:
        if source.lowrank is not None and not self.lowrank_ok:
            raise ConfigError(
                "this vLLM scorer draws full-rank noise inside its engine, so it cannot score a "
                "low-rank run (perturbation = 'lowrank'): use "
                "leanrl.train.es.vllm_scorer.LowRankVLLMScorer (what the trainer builds for "
                "scorer.backend = 'vllm' with perturbation = 'lowrank')"
            )
        self.env = env
        self.source = source
        self.policy_config = policy
        self.master_path = master_path
        self.llm: Any = None
        self._applied = source.iteration

    async def start(self) -> None:
        if self.llm is not None:
            return
        try:
            from vllm import LLM
        except ImportError:
            raise PolicyError(
                f"scorer 'vllm' needs vLLM on a GPU machine: {install_hint('vllm')}"
            ) from None
        import torch

        path = self.source.checkpoint or self.source.model
        n_params, largest = _count_params(path)
        free, total = torch.cuda.mem_get_info()
        explicit = "gpu_memory_utilization" in self.policy_config.model_fields_set
        fraction = engine_memory_fraction(
            total_bytes=total,
            free_bytes=free,
            n_params=n_params,
            largest_tensor=largest,
            requested=self.policy_config.gpu_memory_utilization if explicit else None,
            default=self.policy_config.gpu_memory_utilization,
        )
        self.llm = LLM(**self.engine_kwargs(fraction))
        self.llm.collective_rpc("es_init", args=(path, self.source.dtype))
        if self.master_path:  # a checkpoint's exact fp32 master (bf16 runs)
            self.llm.collective_rpc("es_load_master", args=(self.master_path,))

    def engine_kwargs(self, fraction: float) -> dict[str, Any]:
        """The ``vllm.LLM`` arguments (a subclass adds its own)."""
        return vllm_engine_kwargs(self.source, self.policy_config, fraction)

    def sync(self, records: Sequence[HistoryRecord]) -> None:
        """Apply the records the engine has not applied yet (in fp32, inside the engine)."""
        for rec in records:
            if rec.iteration > self._applied:
                self.llm.collective_rpc("es_update", args=(list(rec.coeffs),))
                self._applied = rec.iteration
        self.llm.reset_prefix_cache()

    async def score(self, state: IterationState, members: Sequence[Member]) -> list[MemberScore]:
        self.sync(state.records)
        policy = _EnginePolicy(self.llm, self.policy_config)
        out = []
        for m in members:
            t0 = time.perf_counter()
            self.llm.collective_rpc("es_perturb", args=(m.seed, m.sign * state.sigma))
            self.llm.reset_prefix_cache()
            tp = time.perf_counter() - t0
            try:
                res = await score_rollouts(self.env, policy, state.tasks, state.sampling)
            finally:
                t1 = time.perf_counter()
                self.llm.collective_rpc("es_restore")
                self.llm.reset_prefix_cache()
                tp += time.perf_counter() - t1
            res.perturb_s = tp
            out.append(res)
        return out

    def save_master(self, path: str) -> None:
        """Write the engine's fp32 master (rank 0) to ``path`` for a checkpoint."""
        wrote = self.llm.collective_rpc("es_save_master", args=(path,))
        if sum(bool(w) for w in wrote) != 1:
            raise PolicyError(f"expected exactly one engine worker (rank 0) to write {path}")

    async def close(self) -> None:
        """Shut the engine down (its worker processes and GPU memory), not just drop it."""
        llm, self.llm = self.llm, None
        if llm is None:
            return
        shutdown = getattr(llm, "shutdown", None)  # newer vLLM
        if shutdown is None:  # older V1 engines: shut the engine core down directly
            core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
            shutdown = getattr(core, "shutdown", None)
        if callable(shutdown):
            shutdown()
        del llm
        import gc

        import torch

        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


class _EnginePolicy(Policy):
    """A Policy over an already running ``vllm.LLM`` (whose weights the scorer perturbs)."""

    name = "vllm-engine"

    def __init__(self, llm: Any, config: PolicyConfig) -> None:
        super().__init__(config)
        self.llm = llm

    def tokenize(self, text: str) -> list[int]:
        return list(self.llm.get_tokenizer().encode(text, add_special_tokens=False))

    @staticmethod
    def _params(sampling: SamplingConfig) -> Any:
        from vllm import SamplingParams

        return SamplingParams(
            n=sampling.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p if sampling.temperature > 0 else 1.0,
            max_tokens=sampling.max_tokens,
            seed=sampling.seed,
            stop=sampling.stop or None,
            logprobs=0,
        )

    def _texts(self, prompts: Sequence[Prompt]) -> list[Any]:
        tok = self.llm.get_tokenizer()
        return [
            p
            if isinstance(p, str)
            else tok.apply_chat_template(
                [m.model_dump() for m in p], tokenize=False, add_generation_prompt=True
            )
            for p in prompts
        ]

    async def generate(
        self, prompts: Sequence[Prompt], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        from leanrl.policies.vllm import completions_from_vllm

        outs = await asyncio.to_thread(
            self.llm.generate, self._texts(prompts), self._params(sampling), use_tqdm=False
        )
        return completions_from_vllm(outs)

    def stream_replays(self, sampling: SamplingConfig) -> bool:
        # every request keeps its own SamplingParams (its seed): what generate would give it
        return True

    async def stream(self, requests: Sequence[StreamRequest]) -> AsyncIterator[StreamCompletion]:
        """Each completion as its request finishes, from the same engine (continuous batching:
        :func:`leanrl.policies.vllm.stream_llm`); the caller holds the engine's gate."""
        from leanrl.policies.vllm import stream_llm

        inputs = [
            {"prompt_token_ids": [int(t) for t in r.prompt_ids]}
            if r.prompt_ids is not None
            else self._texts([r.prompt or ""])[0]
            for r in requests
        ]
        async with closing_stream(stream_llm(self.llm, requests, inputs, self._params)) as items:
            async for item in items:
                self.completed(1)
                yield item
