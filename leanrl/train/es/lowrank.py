"""Low-rank ES perturbations (EGGROLL, Sarkar et al. 2025, arXiv 2511.16652): the shared maths.

For a weight matrix W of shape [m, n], member (seed, sign) uses ``W + sign·σ·A·Bᵀ/√r`` with
A [m, r] and B [n, r] standard normal, drawn from the same per-(seed, tensor name) generator as
full-rank noise (:func:`leanrl.train.es.weights.noise_seed`): A first, then B, so any process can
rebuild any member's factors from (seed, name) alone, as for full-rank noise. ``E = A·Bᵀ/√r``
has entries of variance 1, like full-rank ε, so σ keeps its meaning across the two modes.

Only the factors are drawn; ``E`` itself need never exist. A batched forward computes
``x·Wᵀ + sign·σ/√r·((x·B)·Aᵀ)`` per member (``leanrl.train.es.population``), which is exactly the
output of the materialised weights up to floating-point rounding.

The update of an iteration is ``Δ = Σ_k c_k·A_k·B_kᵀ/√r`` per matrix, accumulated in fp32 on the
master. It is a sum of N rank-r terms, so **rank Δ ≤ N·r** (and ≤ min(m, n)): one iteration moves
each matrix only within the span of its N·r drawn column directions A (and row directions B).
Over T iterations the directions are fresh draws, so the total change has rank up to T·N·r: low
rank bounds what *one step* can do, not what the run can reach.

Tensors that are not 2-D (norms, biases; LoRA-free runs have a few per layer) follow the run's
``lowrank_other`` rule: ``frozen`` (never perturbed, never updated: the update and the history
stay purely low rank) or ``full`` (full-rank noise ε(seed, name), exactly as in full mode).

**Determinism.** ``A·Bᵀ`` is accumulated as r outer products, one column pair at a time, with
elementwise kernels (``addcmul_``) in a fixed order, never with a BLAS matmul: a GEMM's blocking
(and so its rounding) may change with the thread count, which would make a resume on a machine
with another core count rebuild slightly different weights. Elementwise kernels give the same bits
whatever the threads, so the live run, a resume and ``replay`` agree bit for bit on the same kind
of device (as full-rank noise does). The cost is N·r passes over each matrix per update, the same
arithmetic as one matmul of inner size N·r, and no random numbers the size of the matrix.

This module is the one definition both the trainer's update and the batched decoder use.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from leanrl.errors import ConfigError
from leanrl.train.es.weights import ESWeights, noise, noise_seed

if TYPE_CHECKING:
    import torch

__all__ = [
    "LowRankSpec",
    "LowRankWeights",
    "describe",
    "factors",
    "is_lowrank_target",
    "linear_weight_names",
    "lowrank_delta",
    "make_weights",
]


@dataclass(frozen=True)
class LowRankSpec:
    """A run's low-rank perturbation settings (``perturbation = "lowrank"``); ``None`` in their
    place means full-rank noise. Small and picklable: workers and launched containers get it with
    their :class:`~leanrl.train.es.history.WeightsSource`, and the history's header records it."""

    rank: int
    """r: each member's change to a weight matrix is ``σ·A·Bᵀ/√r`` with A [m, r], B [n, r]."""
    other: Literal["frozen", "full"] = "frozen"
    """What tensors that are not 2-D get: ``frozen`` (nothing) or ``full`` (full-rank noise)."""
    targets: Literal["all", "linear"] = "all"
    """Which 2-D tensors get the low-rank term: ``all`` of them, or only the weights of
    ``nn.Linear`` layers other than the output embedding (:func:`linear_weight_names`; the rest
    stay frozen), which is what vLLM's LoRA adapters can carry."""

    def __post_init__(self) -> None:
        if int(self.rank) < 1:
            raise ConfigError(f"low-rank perturbations need rank >= 1, got {self.rank}")
        if self.other not in ("frozen", "full"):
            raise ConfigError(
                f"lowrank_other must be 'frozen' or 'full', got {self.other!r} (what tensors "
                "that are not 2-D, such as norms and biases, get)"
            )
        if self.targets not in ("all", "linear"):
            raise ConfigError(
                f"lowrank_targets must be 'all' or 'linear', got {self.targets!r} (which 2-D "
                "weights get low-rank perturbations)"
            )

    @classmethod
    def from_config(cls, config: Any) -> LowRankSpec | None:
        """The spec of an :class:`~leanrl.train.es.config.ESConfig` (None: full-rank noise)."""
        if config.perturbation == "full":
            return None
        return cls(int(config.rank), config.lowrank_other, config.lowrank_targets)

    def header(self) -> dict[str, Any]:
        """The history header's keys for this spec (a full-rank run writes none of them, so its
        header, and so its history, stays byte for byte what it was before low rank existed; so
        does a low-rank run on every 2-D tensor, which writes no ``lowrank_targets``)."""
        out: dict[str, Any] = {
            "perturbation": "lowrank",
            "rank": self.rank,
            "lowrank_other": self.other,
        }
        if self.targets != "all":
            out["lowrank_targets"] = self.targets
        return out

    @classmethod
    def from_header(cls, info: dict[str, Any]) -> LowRankSpec | None:
        """Read :meth:`header`'s keys back; a header without them is a full-rank run."""
        kind = info.get("perturbation", "full")
        if kind == "full":
            return None
        if kind != "lowrank":
            raise ValueError(f"unknown perturbation {kind!r}")
        targets = str(info.get("lowrank_targets", "all"))  # absent: from before the setting
        return cls(int(info["rank"]), str(info["lowrank_other"]), targets)  # type: ignore[arg-type]

    def describe(self) -> str:
        """For error messages: ``lowrank (rank 4, tensors that are not 2-D frozen)``."""
        where = ", linear layers only" if self.targets == "linear" else ""
        return f"lowrank (rank {self.rank}, tensors that are not 2-D {self.other}{where})"


def describe(spec: LowRankSpec | None) -> str:
    """A perturbation mode in words (``full`` for None)."""
    return "full" if spec is None else spec.describe()


def is_lowrank_target(name: str, shape: tuple[int, ...]) -> bool:
    """Whether tensor ``name`` gets a low-rank perturbation: every 2-D weight (linear layers and
    embeddings, or with LoRA the adapter matrices). Other tensors (norms, biases) are handled by
    the run's ``lowrank_other`` rule."""
    return len(shape) == 2


def linear_weight_names(model: Any) -> frozenset[str]:
    """The parameter names (as ``named_parameters`` gives them) of the weights of the model's
    ``nn.Linear`` layers, less the output embedding (``lm_head``, tied or not) and any weight an
    embedding shares: what ``lowrank_targets = "linear"`` perturbs.

    That is the set vLLM's LoRA can target: it applies adapters to the decoder's linear layers;
    its embedding and ``lm_head`` support was tied to LoRA's extra vocabulary, which recent vLLM
    removed, so both are left out whatever the version. GPT-2's ``Conv1D`` layers (weights stored
    [in, out], and no vLLM LoRA for GPT-2) are left out too."""
    from torch import nn

    out_emb = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    shared = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    if out_emb is not None and getattr(out_emb, "weight", None) is not None:
        shared.add(id(out_emb.weight))
    linear = {
        id(m.weight)
        for m in model.modules()
        if isinstance(m, nn.Linear) and m is not out_emb and id(m.weight) not in shared
    }
    return frozenset(n for n, p in model.named_parameters() if id(p) in linear)


def factors(
    seed: int, name: str, shape: tuple[int, ...], rank: int, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The fp32 factors (A [m, r], B [n, r]) of member seed ``seed`` for 2-D tensor ``name`` of
    shape [m, n]; reproducible per (seed, name, rank, device type)."""
    import torch

    if len(shape) != 2:
        raise ValueError(f"low-rank factors need a 2-D tensor, {name!r} has shape {tuple(shape)}")
    m, n = shape
    gen = torch.Generator(device=device)
    gen.manual_seed(noise_seed(seed, name))
    a = torch.randn((m, rank), generator=gen, device=device, dtype=torch.float32)  # [m, r]
    b = torch.randn((n, rank), generator=gen, device=device, dtype=torch.float32)  # [n, r]
    return a, b


def add_outer(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float) -> None:
    """``out += scale·a·bᵀ`` (out [m, n], a [m, r], b [n, r]), one rank-1 term after another with
    an elementwise kernel: the same bits whatever the thread count (see the module docstring)."""
    for j in range(a.shape[1]):
        out.addcmul_(a[:, j : j + 1], b[:, j].unsqueeze(0), value=scale)  # [m,1]*[1,n] -> [m,n]


def lowrank_delta(
    seed: int, name: str, shape: tuple[int, ...], rank: int, device: torch.device | str
) -> torch.Tensor:
    """``E = A·Bᵀ/√r`` materialised, fp32 [m, n] (the per-member path uses it)."""
    import torch

    a, b = factors(seed, name, shape, rank, device)
    e = torch.zeros(tuple(shape), dtype=torch.float32, device=device)  # [m, n]
    add_outer(e, a, b, 1.0 / math.sqrt(rank))
    return e


def make_weights(
    model: torch.nn.Module, trainable_only: bool = False, lowrank: LowRankSpec | None = None
) -> ESWeights:
    """The :class:`ESWeights` of a run: full-rank (``lowrank`` None) or :class:`LowRankWeights`."""
    if lowrank is None:
        return ESWeights.from_model(model, trainable_only)
    return LowRankWeights.from_model(model, trainable_only, lowrank)


class LowRankWeights(ESWeights):
    """:class:`ESWeights` with low-rank perturbations of every 2-D tensor (``targets =
    "linear"``: of the linear layers' weights only, the other 2-D tensors frozen).

    The three rules of :mod:`leanrl.train.es.weights` hold unchanged: factors are a function of
    (seed, tensor name); a perturbed tensor is written as ``cast(θ + s·σ·E)`` from the untouched
    fp32 master and restored as ``cast(θ)``; the update ``Σ_k c_k·A_k·B_kᵀ/√r`` (rank ≤ N·r) is
    accumulated in fp32 and added to the master. Frozen tensors (``other = "frozen"``) keep a
    master copy (checkpoints and ``equal`` cover the whole model) but are never changed.
    """

    def __init__(
        self,
        params: dict[str, torch.nn.Parameter],
        master: dict[str, torch.Tensor],
        spec: LowRankSpec,
        linear: frozenset[str] | None = None,
    ) -> None:
        super().__init__(params, master)
        self.spec = spec
        if spec.targets == "linear" and linear is None:
            raise ValueError("lowrank_targets = 'linear' needs the names of the linear weights")
        self.linear = linear if spec.targets == "linear" else None
        """``lowrank_targets = "linear"``: the names that get the low-rank term (the other 2-D
        tensors stay frozen); None: every 2-D tensor."""
        if self.linear is not None and not any(n in self.linear for n in master):
            raise ConfigError(
                "lowrank_targets = 'linear' found no nn.Linear weight to perturb in this model "
                "(embeddings and lm_head do not count; GPT-2's Conv1D layers neither): use "
                "lowrank_targets = 'all'"
            )

    @classmethod
    def from_model(  # type: ignore[override]
        cls, model: torch.nn.Module, trainable_only: bool = False, spec: LowRankSpec | None = None
    ) -> LowRankWeights:
        """As :meth:`ESWeights.from_model`, perturbing with ``spec`` (required)."""
        if spec is None:
            raise ValueError("LowRankWeights needs its LowRankSpec")
        base = ESWeights.from_model(model, trainable_only)
        linear = linear_weight_names(model) if spec.targets == "linear" else None
        return cls(base.params, base.master, spec, linear)

    def _kind(self, name: str) -> Literal["lowrank", "full", "frozen"]:
        """How tensor ``name`` is perturbed and updated."""
        if is_lowrank_target(name, tuple(self.master[name].shape)):
            if self.linear is not None and name not in self.linear:
                return "frozen"  # an embedding or lm_head under lowrank_targets = "linear"
            return "lowrank"
        return self.spec.other

    def lowrank_names(self) -> list[str]:
        """The tensors that get the low-rank term, in parameter order."""
        return [n for n in self.master if self._kind(n) == "lowrank"]

    def numel(self) -> int:
        """Number of scalars that move (frozen tensors left out)."""
        return sum(t.numel() for n, t in self.master.items() if self._kind(n) != "frozen")

    def perturb(self, seed: int, scale: float) -> None:
        """Write ``cast(θ + scale·E(seed))`` into every tensor that moves (``scale`` = ±σ; E is
        ``A·Bᵀ/√r`` for a matrix, ε for a full-rank one); frozen tensors hold ``cast(θ)``."""
        import torch

        with torch.no_grad():
            for name, p in self.params.items():
                kind = self._kind(name)
                if kind == "frozen":
                    continue  # holds cast(θ) already: restore and updates write nothing else
                theta = self.master[name]  # [*shape] fp32
                if kind == "lowrank":
                    e = lowrank_delta(seed, name, tuple(theta.shape), self.spec.rank, theta.device)
                else:
                    e = noise(seed, name, theta.shape, theta.device)  # [*shape] fp32
                if p.dtype == torch.float32:  # same single rounding, no temporary
                    torch.add(theta, e, alpha=scale, out=p)
                else:
                    p.copy_(torch.add(theta, e, alpha=scale))

    def apply_update(self, coeffs: Sequence[tuple[int, float]]) -> float:
        """``θ += Σ_k c_k·A_k·B_kᵀ/√r`` per matrix (``Σ_k c_k·ε_k`` for full-rank tensors,
        nothing for frozen ones), accumulated in fp32 in the given order, then cast into the model.

        A matrix's step is a sum of N rank-r terms, so its rank is at most N·r. ``coeffs`` are
        (seed, c_k) with c_k already float32, as the history stores them. Returns the L2 norm of
        the step over all tensors."""
        import torch

        inv = 1.0 / math.sqrt(self.spec.rank)
        sq = 0.0
        with torch.no_grad():
            for name, p in self.params.items():
                kind = self._kind(name)
                theta = self.master[name]  # [*shape] fp32
                if coeffs and kind != "frozen":
                    delta = torch.zeros_like(theta)  # [*shape] fp32 accumulator
                    for seed, c in coeffs:
                        if kind == "lowrank":
                            a, b = factors(
                                seed, name, tuple(theta.shape), self.spec.rank, theta.device
                            )
                            add_outer(delta, a, b, c * inv)
                        else:
                            delta.add_(noise(seed, name, theta.shape, theta.device), alpha=c)
                    theta.add_(delta)
                    sq += float(delta.double().square().sum())
                p.copy_(theta)
        return math.sqrt(sq)
