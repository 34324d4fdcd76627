"""Low-rank ES scored by a vLLM engine: every member a LoRA adapter, the update in the engine.

``scorer.backend = "vllm"`` with ``perturbation = "lowrank"`` (``lowrank_targets = "linear"``,
``lowrank_other = "frozen"``, which the config requires). The engine holds θ *unperturbed*, and
it never changes during an iteration:

- **members**: member (seed, sign) is the adapter ``lora_B @ lora_A = sign·σ·A·Bᵀ/√r`` on every
  target linear layer (:mod:`leanrl.train.es.vllm_lora`), its folder written by the engine's
  rank-0 worker from the factors drawn on its GPU (the same generator the update uses) into a
  temporary folder of the iteration, removed afterwards. Members' prompts go to the engine
  ``scorer.members_per_batch`` members per ``generate`` call, one ``LoRARequest`` per prompt;
  vLLM batches the rows of different adapters together over θ. Calls are pipelined as for the
  full-rank scorer (``scorer.pipeline`` batches in flight: batch b+1 decodes while batch b's
  attempts are checked), through :class:`~leanrl.train.es.pipeline.PipelinedScorer`.
- **update**: ``θ += Σ_k c_k·A_k·B_kᵀ/√r`` on each target, accumulated term by term in fp32 on
  the workers' fp32 master (:meth:`ESLowRankWorkerExtension.es_lowrank_update`, the same
  operations in the same order as :meth:`~leanrl.train.es.lowrank.LowRankWeights.apply_update`,
  so the history replays with the HF model on the same kind of device), then written into the
  engine with the model's own ``load_weights``, which fuses q/k/v into ``qkv_proj`` and gate/up
  into ``gate_up_proj`` and shards for tensor parallelism from Hugging Face names.

With LoRA enabled vLLM wraps each linear layer it can adapt, so its weight lives at
``….qkv_proj.base_layer.weight`` and a plain ``load_weights`` of ``….q_proj.weight`` would miss
it; :func:`engine_weight_name` inserts the ``base_layer`` segment for the layers the live model
wraps (via the model's ``packed_modules_mapping`` for the fused ones), and ``load_weights``
still does the fusing. Written against vLLM's LoRA and ``collective_rpc`` APIs and tested
against a stand-in (``tests/test_es_lowrank_vllm.py``); not yet run on a real engine.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from leanrl.errors import ConfigError, PolicyError
from leanrl.policy import PolicyConfig
from leanrl.train.es.history import HistoryRecord, WeightsSource
from leanrl.train.es.pipeline import PipelinedScorer, PipelinedVLLMScorer
from leanrl.train.es.workers import (
    ESVLLMWorkerExtension,
    IterationState,
    Member,
    MemberScore,
    _worker_rank,
    vllm_engine_kwargs,
)

if TYPE_CHECKING:
    from leanrl.environment import Environment
    from leanrl.train.es.vllm_lora import LoRAPlan

__all__ = [
    "ESLowRankWorkerExtension",
    "LowRankVLLMScorer",
    "engine_weight_name",
    "lora_wrapped_modules",
]

#: ``vllm.LLM`` LoRA arguments the low-rank scorer sets itself (from ``scorer`` and ``rank``).
_LORA_OWN = ("enable_lora", "max_loras", "max_lora_rank")


def lora_wrapped_modules(model: Any) -> set[str]:
    """Module paths of ``model`` that vLLM's LoRA manager (or PEFT) wrapped: their own weights
    then live under ``base_layer``."""
    return {path for path, m in model.named_modules() if hasattr(m, "base_layer")}


def engine_weight_name(name: str, wrapped: set[str], packed: Mapping[str, Sequence[str]]) -> str:
    """The name to hand vLLM's ``load_weights`` for HF tensor ``name``: unchanged, or with
    ``base_layer`` before its last segment when the module holding it is LoRA-wrapped.

    ``packed`` is the model's ``packed_modules_mapping`` (``{"qkv_proj": ["q_proj", "k_proj",
    "v_proj"], ...}``): ``….q_proj.weight`` lives in the fused module ``….qkv_proj``, so that is
    the module looked up; ``load_weights`` then maps ``….q_proj.base_layer.weight`` to
    ``….qkv_proj.base_layer.weight`` and loads the q slice, as it does without LoRA."""
    module, _, leaf = name.rpartition(".")
    parent, _, child = module.rpartition(".")
    fused = {sub: whole for whole, subs in packed.items() for sub in subs}.get(child, child)
    live = f"{parent}.{fused}" if parent else fused
    if live in wrapped or module in wrapped:
        return f"{module}.base_layer.{leaf}"
    return name


class ESLowRankWorkerExtension(ESVLLMWorkerExtension):
    """The ES worker extension of a LoRA-enabled engine (``worker_extension_cls``): the fp32
    master and ``collective_rpc`` methods of :class:`ESVLLMWorkerExtension`, weights loaded
    under their LoRA-wrapped names, plus the low-rank update and the members' adapter folders."""

    def _es_load(self, fn: Any, names: Sequence[str] | None = None) -> None:
        model = self.model_runner.model
        wrapped = lora_wrapped_modules(model)
        packed = getattr(model, "packed_modules_mapping", None) or {}
        todo = self.es_master if names is None else {n: self.es_master[n] for n in names}
        # a generator: one tensor's cast copy alive at a time, not a second copy of the model
        batch = (
            (engine_weight_name(n, wrapped, packed), fn(n, t).to(self.es_dtype))
            for n, t in todo.items()
        )
        model.load_weights(weights=batch)

    def es_lowrank_update(
        self, coeffs: list[tuple[int, float]], names: list[str], rank: int
    ) -> None:
        """``θ += Σ_k c_k·A_k·B_kᵀ/√r`` on each of ``names`` (the low-rank targets), exactly as
        :meth:`~leanrl.train.es.lowrank.LowRankWeights.apply_update` computes it; only those
        tensors are written back into the engine (the others are frozen)."""
        import math

        import torch

        from leanrl.train.es.lowrank import add_outer, factors

        inv = 1.0 / math.sqrt(rank)
        with torch.no_grad():
            for n in names:
                theta = self.es_master[n]  # [m, n] fp32
                delta = torch.zeros_like(theta)
                for seed, c in coeffs:
                    a, b = factors(seed, n, tuple(theta.shape), rank, theta.device)
                    add_outer(delta, a, b, c * inv)
                theta.add_(delta)
        self._es_load(lambda n, t: t, names)

    def es_write_adapter(
        self,
        folder: str,
        seed: int,
        scale: float,
        targets: dict[str, tuple[str, tuple[int, int]]],
        rank: int,
        base_model: str,
    ) -> bool:
        """Write member (seed, scale)'s PEFT adapter folder, factors drawn on this worker's
        device (rank 0 only: the folder is one for all ranks). Returns whether this rank wrote."""
        from leanrl.train.es.vllm_lora import LoRAPlan, member_adapter, write_adapter

        if _worker_rank(self) != 0:
            return False
        plan = LoRAPlan({k: (p, (int(s[0]), int(s[1]))) for k, (p, s) in targets.items()}, ())
        device = next(iter(self.es_master.values())).device
        tensors = member_adapter(seed, scale, plan, rank, device)
        write_adapter(Path(folder), tensors, plan, rank, base_model)
        return True


def lowrank_plan(path: str) -> LoRAPlan:
    """The adapters' plan for HF model ``path``: its linear weights (``lowrank_targets =
    "linear"``), read from a meta-device copy built from its config (nothing is loaded)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from leanrl.train.es.lowrank import linear_weight_names
    from leanrl.train.es.vllm_lora import lora_plan

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    names = linear_weight_names(model)
    plan = lora_plan(model, {n: p for n, p in model.named_parameters() if n in names})
    plan.check()
    if not plan.targets:
        raise ConfigError(
            f"{path} has no nn.Linear weight vLLM's LoRA could carry (lowrank_targets = "
            "'linear'): use scorer.backend = 'inprocess' with lowrank_targets = 'all'"
        )
    return plan


class LowRankVLLMScorer(PipelinedVLLMScorer):
    """Scores a low-rank run's members as LoRA adapters of one vLLM engine (module docstring)."""

    lowrank_ok = True

    def __init__(
        self,
        env: Environment,
        source: WeightsSource,
        policy: PolicyConfig,
        master_path: str | None,
        *,
        depth: int | Literal["auto"] = 2,
        members_per_batch: int = 1,
    ) -> None:
        spec = source.lowrank
        if spec is None or spec.targets != "linear" or spec.other != "frozen":
            raise ConfigError(
                "the low-rank vLLM scorer needs perturbation = 'lowrank' with lowrank_targets = "
                "'linear' and lowrank_other = 'frozen' (vLLM's adapters carry linear layers "
                f"only), got {spec}"
            )
        super().__init__(env, source, policy, master_path, depth=depth)
        self.rank = spec.rank
        self.members_per_batch = members_per_batch
        self.plan: LoRAPlan | None = None
        self._ids = itertools.count(1)
        """Adapter ids for the engine's lifetime: never reused (vLLM caches adapters by id)."""
        self.last_calls: list[list[tuple[int, float]]] = []

    def engine_kwargs(self, fraction: float) -> dict[str, Any]:
        from leanrl.train.es.vllm_lora import lora_engine_kwargs

        clash = sorted(k for k in self.policy_config.options if k in _LORA_OWN)
        if clash:
            raise ConfigError(
                f"policy.options sets {clash}, which the low-rank ES vLLM scorer sets itself "
                "(one adapter slot per member of a call, rank from --rank): use "
                "scorer.members_per_batch and rank instead"
            )
        kw = vllm_engine_kwargs(self.source, self.policy_config, fraction)
        kw["worker_extension_cls"] = "leanrl.train.es.vllm_scorer.ESLowRankWorkerExtension"
        lora = lora_engine_kwargs(self.members_per_batch, self.rank)
        if "max_cpu_loras" in self.policy_config.options:
            lora.pop("max_cpu_loras")
        return {**kw, **lora}

    async def start(self) -> None:
        if self.llm is not None:
            return
        self.plan = lowrank_plan(self.source.checkpoint or self.source.model)  # fails early
        await super().start()

    def sync(self, records: Sequence[HistoryRecord]) -> None:
        """Apply the records the engine lacks: the low-rank update of the linear layers."""
        assert self.plan is not None
        names = list(self.plan.targets)
        for rec in records:
            if rec.iteration > self._applied:
                if rec.coeffs:
                    self.llm.collective_rpc(
                        "es_lowrank_update", args=(list(rec.coeffs), names, self.rank)
                    )
                self._applied = rec.iteration
        self.llm.reset_prefix_cache()

    def _write(self, path: Path, seed: int, scale: float) -> None:
        assert self.plan is not None
        wrote = self.llm.collective_rpc(
            "es_write_adapter",
            args=(str(path), seed, scale, self.plan.targets, self.rank, self.policy_config.model),
        )
        if sum(bool(w) for w in wrote) != 1:
            raise PolicyError(f"expected exactly one engine worker (rank 0) to write {path}")

    async def score(self, state: IterationState, members: Sequence[Member]) -> list[MemberScore]:
        from leanrl.train.es.vllm_lora import VLLMLoRAEngine

        assert self.plan is not None
        self.sync(state.records)
        folder = Path(tempfile.mkdtemp(prefix=f"leanrl-es-lora-{state.iteration}-"))
        engine = VLLMLoRAEngine(
            self.llm,
            self.policy_config,
            self.plan,
            self.rank,
            folder,
            ids=self._ids,
            writer=self._write,
        )
        inner = PipelinedScorer(
            self.env,
            engine,  # type: ignore[arg-type]  # a batch engine: generate_members, no perturb
            self.control,  # the run's depth: fixed, or measured across iterations
            members_per_batch=self.members_per_batch,
            batched=True,
        )
        try:
            scores = await inner.score(state, members)
        finally:
            for seed in {m.seed for m in members}:  # what an error left loaded
                engine.forget(seed)
            shutil.rmtree(folder, ignore_errors=True)
        self.last_idle_frac, self.last_depth = inner.last_idle_frac, inner.last_depth
        self.last_calls = inner.last_calls
        return scores
