"""The ES trainer's config: :class:`ESConfig` (the run) and :class:`ESScorerConfig` (where the
population is scored). Kept apart from the trainer so the CLI and the docs read it without torch."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from leanrl.train.common import TrainConfig
from leanrl.train.curriculum import CurriculumConfig
from leanrl.train.lora import LoRAConfig

__all__ = ["ESConfig", "ESScorerConfig"]


class ESScorerConfig(BaseModel):
    """Where population members are scored."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    backend: Literal["inprocess", "processes", "vllm"] = "inprocess"
    """``inprocess``: one after another on the trainer's model (no copies). ``processes``: local
    worker processes, each rebuilding the weights from base model + history (CPU, or one GPU
    each). ``vllm``: perturb inside a vLLM engine on a GPU (the ``vllm`` extra)."""
    members_per_batch: int = Field(default=1, ge=1)
    """``inprocess`` or ``vllm`` with ``perturbation = "lowrank"``: members decoded together in
    one batched generate call (rows of the batch belong to members; ``inprocess``: each
    perturbed linear layer adds its member's low-rank term without materialising the weights;
    ``vllm``: each member is a LoRA adapter of the engine, one ``LoRARequest`` per prompt, and
    this is also the engine's ``max_loras``). Set it to the population size for one call per
    iteration. 1 (the default): one member per call."""
    workers: int = Field(default=2, ge=1)
    """``processes``: number of worker processes (each holds one copy of the model)."""
    threads_per_worker: int = Field(default=1, ge=1)
    """``processes``: torch CPU threads per worker process."""
    pipeline: Annotated[int, Field(ge=1)] | Literal["auto"] = "auto"
    """``inprocess`` and ``vllm``: members (with ``members_per_batch > 1``: batches of members)
    in flight on the engine at once. With 2, member i+1 generates while member i's attempts are
    checked (the engine's weights are switched exactly per generate call, so rewards do not
    change); 1 scores them one after another. ``auto`` (the default): 2 in the first
    iteration, then ``ceil(1 + V/G)`` from the measured checking (V) and generation (G) seconds
    per member, capped by the checker's capacity (a local pool's workers) and the population;
    each change is logged. The depth used is logged as ``pipeline_depth`` and the engine's idle
    share of each iteration as ``gpu_idle_frac``. Can change on resume."""


class ESConfig(TrainConfig):
    """Evolution strategies. Defaults from Qiu et al. 2025, "Evolution Strategies at Scale: LLM
    Fine-Tuning Beyond Reinforcement Learning": N = 30, σ = 1e-3, α = σ/2, greedy decoding.

    ``steps`` counts ES iterations; ``save_every`` (M) is the full-checkpoint period (between
    checkpoints the run is still fully recoverable from the history, written every iteration).
    """

    population: int = Field(default=30, ge=2)
    """Population size N: perturbed copies scored per iteration (Qiu et al. 2025 use 30)."""
    sigma: float = Field(default=1e-3, gt=0)
    """Noise scale σ: each member is θ + σ·ε with ε ~ N(0, I) (Qiu et al. 2025: 0.001)."""
    alpha: float | None = Field(default=None, gt=0)
    """Learning rate α of θ += α·(1/N)·Σ zₙ·εₙ. ``None`` means σ/2 (Qiu et al. 2025: 5e-4 with
    σ = 1e-3)."""
    mirrored: bool = False
    """Antithetic pairs: N/2 seeds, each scored as +σε and -σε (lower-variance estimate; not in
    Qiu et al. 2025, from Salimans et al. 2017). Needs an even population."""
    shaping: Literal["zscore", "rank"] = "zscore"
    """Reward normalisation across the population. ``zscore`` (Qiu et al. 2025): (R - mean)/std.
    ``rank``: centered ranks (ties averaged), then z-scored, so α keeps its meaning; robust to
    outlier rewards (Salimans et al. 2017)."""
    perturbation: Literal["full", "lowrank"] = "full"
    """``full`` (Qiu et al. 2025): ε ~ N(0, I) over every weight. ``lowrank`` (EGGROLL, Sarkar et
    al. 2025, arXiv 2511.16652): each 2-D weight (with LoRA: each adapter matrix) gets
    ``A·Bᵀ/√rank`` with Gaussian A [m, rank], B [n, rank], drawn per (seed, tensor name), so
    members can share one batched forward (``scorer.members_per_batch``). An iteration's update
    of a matrix is then a sum of N rank-r terms: rank ≤ N·rank. Recorded in the history's header:
    a resume or replay with another mode is refused."""
    rank: int = Field(default=1, ge=1)
    """``perturbation = "lowrank"``: the rank r of each member's perturbation of a weight matrix
    (EGGROLL reports r = 1 already matching full-rank ES; a larger r costs r passes per matrix)."""
    lowrank_other: Literal["full", "frozen"] = "frozen"
    """``perturbation = "lowrank"``: what happens to tensors that are not 2-D (norms, biases):
    ``frozen`` (not perturbed, not updated: the whole update is low rank, and a batched forward
    needs no per-member norm weights) or ``full`` (full-rank noise, as in ``full`` mode)."""
    lowrank_targets: Literal["all", "linear"] = "all"
    """``perturbation = "lowrank"``: which 2-D weights get the low-rank term. ``all`` (EGGROLL):
    every one, embeddings and ``lm_head`` included. ``linear``: only the weights of the
    ``nn.Linear`` layers other than the output embedding (attention and MLP projections), the
    ones vLLM's LoRA adapters can carry; embeddings and ``lm_head`` (tied or not) stay frozen,
    as do GPT-2's ``Conv1D`` layers. Needed by ``scorer.backend = "vllm"`` (with
    ``lowrank_other = "frozen"``). Recorded in the history's header when ``linear``: a resume or
    replay with the other value is refused."""
    samples_per_task: int = Field(default=1, ge=1)
    """Rollouts per task for each member, averaged into its reward (useful with sampling; with
    greedy decoding the samples are identical)."""
    greedy: bool = True
    """Greedy decoding for every member (temperature 0), as in Qiu et al. 2025. False: use
    ``sampling`` as given, with the same sampling seed for every member of an iteration."""
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig)
    """Choose each iteration's tasks by difficulty (a per-task table of the population's
    attempts in the run folder; ``docs/training-grpo.md#curriculum``). ``off`` (the default):
    the seeded order every trainer uses."""
    scorer: ESScorerConfig = Field(default_factory=ESScorerConfig)
    """How members are scored (in-process, local processes, vLLM)."""
    lora: LoRAConfig = Field(default_factory=LoRAConfig)
    """Perturb only low-rank adapters (``--lora.rank 16``): the fp32 master is the adapters',
    not the model's (``docs/training-es.md`` explains the trade-off). Not with the vLLM scorer."""

    @model_validator(mode="after")
    def _check(self) -> ESConfig:
        if self.lora.enabled and self.scorer.backend == "vllm":
            raise ValueError(
                "lora.rank > 0 with scorer.backend = 'vllm' is not supported: the vLLM scorer "
                "perturbs full weights inside the engine. Use scorer.backend = 'inprocess' or "
                "'processes' with LoRA, or lora.rank = 0 with vLLM"
            )
        self._check_perturbation()
        if self.mirrored and self.population % 2:
            raise ValueError(
                f"mirrored pairs need an even population, got {self.population}: use "
                f"{self.population + 1} or mirrored = false"
            )
        backend = self.policy.backend
        if self.scorer.backend == "vllm" and backend == "openai":
            raise ValueError(
                "policy.backend = 'openai' cannot be trained: ES perturbs the weights, so it "
                "needs them in-process. Use policy.backend = 'vllm' (or 'hf') with "
                "scorer.backend = 'vllm'"
            )
        if self.scorer.backend != "vllm" and backend != "hf":
            raise ValueError(
                f"policy.backend = {backend!r} is not used by scorer.backend = "
                f"{self.scorer.backend!r}: ES perturbs the weights in-process, so members are "
                "scored with a transformers model. Set policy.backend = 'hf', or "
                "scorer.backend = 'vllm' for vLLM on a GPU"
            )
        return self

    def _check_perturbation(self) -> None:
        """Low-rank settings only where they mean something (a typo'd mode would otherwise run
        full-rank ES with ``--rank 4`` silently ignored)."""
        if self.perturbation == "full":
            given = []
            if self.rank != 1:
                given.append(f"rank = {self.rank}")
            if self.lowrank_other != "frozen":
                given.append(f"lowrank_other = {self.lowrank_other!r}")
            if self.lowrank_targets != "all":
                given.append(f"lowrank_targets = {self.lowrank_targets!r}")
            if self.scorer.members_per_batch != 1:
                given.append(f"scorer.members_per_batch = {self.scorer.members_per_batch}")
            if given:
                raise ValueError(
                    f"{' and '.join(given)} only apply to low-rank perturbations: add "
                    "perturbation = 'lowrank' (--perturbation lowrank), or drop them for "
                    "full-rank ES"
                )
            return
        if self.scorer.backend == "vllm":
            got = []
            if self.lowrank_targets != "linear":
                got.append(f"lowrank_targets = {self.lowrank_targets!r}")
            if self.lowrank_other != "frozen":
                got.append(f"lowrank_other = {self.lowrank_other!r}")
            if got:
                raise ValueError(
                    "perturbation = 'lowrank' with scorer.backend = 'vllm' needs "
                    f"lowrank_targets = 'linear' and lowrank_other = 'frozen' (got "
                    f"{' and '.join(got)}): the engine scores each member as a LoRA adapter, "
                    "and vLLM's adapters carry the decoder's linear layers only, not embeddings, "
                    "lm_head or tensors that are not 2-D. Add --lowrank_targets linear "
                    "--lowrank_other frozen, or use scorer.backend = 'inprocess'"
                )
        if self.scorer.members_per_batch > 1 and self.scorer.backend == "processes":
            raise ValueError(
                f"scorer.members_per_batch = {self.scorer.members_per_batch} needs "
                "scorer.backend = 'inprocess' or 'vllm' (got 'processes'): members are batched "
                "in the trainer's own model or in the vLLM engine. Set members_per_batch = 1, or "
                "use scorer.backend = 'inprocess'"
            )
        if self.scorer.members_per_batch > 1 and self.lora.enabled:
            raise ValueError(
                "scorer.members_per_batch > 1 with lora.rank > 0 is not supported: with LoRA the "
                "perturbed tensors are the adapter matrices, and the batched decoder adds a "
                "member's term to the base linear layers only. Use members_per_batch = 1 with "
                "LoRA (each member's adapters are written in turn), or lora.rank = 0"
            )

    @property
    def lr(self) -> float:
        """α, with its default σ/2 filled in."""
        return self.alpha if self.alpha is not None else self.sigma / 2
