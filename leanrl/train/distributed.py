"""Several processes, one run: ``torch.distributed`` for the trainers.

A trainer launched with ``torchrun --nproc_per_node N`` (or any launcher that sets ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``) runs the same program on every
rank. :class:`World` is that program's view of the others:

- the default process group (``nccl`` on GPUs, ``gloo`` on CPUs) carries the model's collectives:
  FSDP2's all-gathers and reduce-scatters, DDP's all-reduces, the metric sums;
- a second, ``gloo`` group carries Python objects (rollouts, member scores): object collectives on
  ``nccl`` would stage every pickle through GPU memory;
- ``is_main`` (rank 0) is the only rank that writes to the run folder.

:func:`shard_model` wraps a model for training: ``fsdp`` (FSDP2 ``fully_shard`` on every decoder
layer and on the root, so each rank holds 1/N of the weights, gradients and AdamW state) or ``ddp``
(a full replica per rank, gradients all-reduced: the cheaper choice for small models). Both average
gradients over ranks; the trainers scale their per-rank losses by N so that the result is the
*sum* over ranks, i.e. the single-process gradient of the whole batch.

Checkpoints are world-size independent: the full (gathered) model state dict and the full
optimizer state keyed by parameter name (``torch.distributed.checkpoint.state_dict``), so a run
saved with 4 ranks resumes with 1 or 8.

Without a launcher (``WORLD_SIZE`` unset or 1) every method here is a cheap no-op.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from leanrl.errors import ConfigError

__all__ = [
    "DistributedConfig",
    "World",
    "full_named_parameters",
    "full_optimizer_state",
    "full_state_dict",
    "load_optimizer_state",
    "round_robin",
    "shard_model",
    "unwrap",
]

T = TypeVar("T")


class DistributedConfig(BaseModel):
    """How a run launched with ``torchrun`` spreads over its ranks (ignored with one process)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    strategy: Literal["auto", "fsdp", "ddp"] = "auto"
    """``fsdp``: FSDP2 ``fully_shard`` (weights, gradients and AdamW state split over ranks; the
    way to train models that do not fit one GPU). ``ddp``: a full replica on every rank, gradients
    all-reduced (less communication; for models that fit). ``auto``: ``fsdp`` on GPUs, ``ddp`` on
    CPUs."""
    backend: Literal["auto", "nccl", "gloo"] = "auto"
    """Process-group backend of the model's collectives. ``auto``: ``nccl`` on GPUs, ``gloo`` on
    CPUs. Python objects always travel over a separate ``gloo`` group."""
    timeout_s: float = Field(default=1800.0, gt=0)
    """Seconds a collective may wait for the other ranks before the run fails (a rank that died
    or hangs in Lean verification shows up here)."""


def round_robin(n_items: int, n_lanes: int) -> list[list[int]]:
    """Item indices per lane: lane ``k`` gets ``k, k + n_lanes, k + 2·n_lanes, ...``.

    The one assignment rule of every fan-out in leanrl (rollout tasks over ranks, ES members over
    ranks, worker processes or remote containers), so that which lane did what never depends on
    timing."""
    if n_lanes < 1:
        raise ValueError(f"n_lanes must be at least 1, got {n_lanes}")
    return [list(range(k, n_items, n_lanes)) for k in range(n_lanes)]


@dataclass
class World:
    """This process's place among the ranks of a run (rank 0 of 1 without a launcher)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    _objects: Any = field(default=None, repr=False)  # the gloo group for Python objects
    _owned: bool = field(default=False, repr=False)  # this World initialised the default group

    @classmethod
    def from_env(cls, config: DistributedConfig | None = None, device_type: str = "cpu") -> World:
        """The World the launcher describes; initialises the process groups when needed.

        ``device_type`` (``cpu`` or ``cuda``) picks the ``auto`` backend. A process group that is
        already initialised (a test that spawned its own ranks) is used as it is."""
        import torch.distributed as dist

        cfg = config or DistributedConfig()
        size = int(os.environ.get("WORLD_SIZE", "1"))
        # torchrun sets TORCHELASTIC_RUN_ID: a 1-rank torchrun launch takes the distributed path
        # too (FSDP with one rank), which is how the sharded code is checked on one GPU.
        launched = size > 1 or "TORCHELASTIC_RUN_ID" in os.environ
        if not dist.is_available() or (not launched and not dist.is_initialized()):
            return cls()
        owned = False
        if not dist.is_initialized():
            for var in ("MASTER_ADDR", "MASTER_PORT", "RANK"):
                if var not in os.environ:
                    raise ConfigError(
                        f"WORLD_SIZE={size} but {var} is not set: launch with torchrun "
                        "(`torchrun --nproc_per_node N -m leanrl.cli train ...`), which sets "
                        "RANK, LOCAL_RANK, MASTER_ADDR and MASTER_PORT"
                    )
            backend = cfg.backend
            if backend == "auto":
                backend = "nccl" if device_type == "cuda" else "gloo"
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=cfg.timeout_s))
            owned = True
        rank, size = dist.get_rank(), dist.get_world_size()
        local = int(os.environ.get("LOCAL_RANK", str(rank)))
        objects = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=cfg.timeout_s))
        return cls(rank, size, local, objects, owned)

    @property
    def is_main(self) -> bool:
        """Rank 0: the only rank that writes the run folder."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """Part of a process group (a torchrun launch), even of one rank."""
        return self._objects is not None

    def device(self, device_type: str) -> str:
        """This rank's device: ``cuda:LOCAL_RANK`` on GPUs (one GPU per rank), else ``cpu``."""
        return (
            f"cuda:{self.local_rank}" if device_type == "cuda" and self.distributed else device_type
        )

    def all_gather(self, obj: T) -> list[T]:
        """Every rank's ``obj``, in rank order (over the gloo object group)."""
        if not self.distributed:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj, group=self._objects)
        return out

    def broadcast(self, obj: T, src: int = 0) -> T:
        """Rank ``src``'s ``obj`` on every rank."""
        if not self.distributed:
            return obj
        import torch.distributed as dist

        box = [obj if self.rank == src else None]
        dist.broadcast_object_list(box, src=src, group=self._objects)
        return box[0]  # type: ignore[return-value]

    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sums of ``values`` over ranks (float64, over the object group)."""
        if not self.distributed:
            return [float(v) for v in values]
        import torch
        import torch.distributed as dist

        t = torch.tensor([float(v) for v in values], dtype=torch.float64)
        dist.all_reduce(t, group=self._objects)
        return [float(v) for v in t.tolist()]

    def barrier(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            dist.barrier(group=self._objects)

    def close(self) -> None:
        """Tear down the process groups this World created (not one a caller made)."""
        if self._owned:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
            self._owned = False


def resolve_strategy(config: DistributedConfig, device_type: str) -> str:
    """``auto`` resolved: ``fsdp`` on GPUs, ``ddp`` on CPUs."""
    if config.strategy != "auto":
        return config.strategy
    return "fsdp" if device_type == "cuda" else "ddp"


def _layer_classes(model: Any) -> set[str]:
    """Class names of the model's repeated blocks (transformers lists them in
    ``_no_split_modules``); each becomes one FSDP unit, so only one layer's full weights exist
    at a time."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(inner, "_no_split_modules", None) or ())
    if not names:
        raise ConfigError(
            f"{type(inner).__name__} does not name its decoder layers (_no_split_modules), so "
            "FSDP cannot shard it layer by layer: use distributed.strategy = 'ddp'"
        )
    return names


def shard_model(
    model: Any,
    strategy: str,
    world: World,
    *,
    param_dtype: Any = None,
) -> Any:
    """``model`` wrapped for training on ``world``: FSDP2-sharded in place (returned as is) or a
    DDP module around it. With one rank, ``model`` unchanged. ``param_dtype`` (FSDP only): the
    dtype the all-gathered weights compute in (bf16 under ``bf16-mixed``); gradients are reduced
    in fp32."""
    if not world.distributed:
        return model
    import torch

    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        dev = next(model.parameters()).device
        ids = [dev.index] if dev.type == "cuda" else None
        # Frozen weights (LoRA) need nothing: DDP only reduces parameters that require grad.
        return DistributedDataParallel(model, device_ids=ids)
    if strategy != "fsdp":
        raise ConfigError(f"unknown distributed.strategy {strategy!r}: use 'fsdp' or 'ddp'")
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    layers = _layer_classes(model)
    for module in model.modules():
        if type(module).__name__ in layers:
            fully_shard(module, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    return model


def unwrap(module: Any) -> Any:
    """The model inside a DDP wrapper (FSDP2 shards in place: nothing to unwrap)."""
    from torch.nn.parallel import DistributedDataParallel

    return module.module if isinstance(module, DistributedDataParallel) else module


def _options(**kw: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(**kw)


def full_state_dict(module: Any, world: World) -> dict[str, Any]:
    """The whole model's state dict, on the CPU, on rank 0 (other ranks get ``{}``).

    A collective under FSDP: every rank must call it."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    inner = unwrap(module)
    if not world.distributed:
        return {k: v.detach().cpu() for k, v in inner.state_dict().items()}
    sd = get_model_state_dict(inner, options=_options(full_state_dict=True, cpu_offload=True))
    # Tied weights (an output head sharing the embedding) appear under both names here; the
    # checkpoint keeps one, as save_pretrained of the unsharded model does.
    kept = {n for n, _ in inner.named_parameters()}
    tied = {n for n, _ in inner.named_parameters(remove_duplicate=False)} - kept
    return {k: v for k, v in sd.items() if k not in tied} if world.is_main else {}


def full_named_parameters(module: Any) -> Iterator[tuple[str, Any]]:
    """``(name, full tensor)`` for every parameter, gathering FSDP shards one at a time.

    A collective under FSDP: every rank must iterate it to the end, in step."""
    from torch.distributed.tensor import DTensor

    for name, p in unwrap(module).named_parameters():
        t = p.detach()
        yield name, (t.full_tensor() if isinstance(t, DTensor) else t)


def full_optimizer_state(module: Any, optimizer: Any) -> dict[str, Any]:
    """The optimizer state keyed by parameter *name*, unsharded, on the CPU: loadable with any
    number of ranks (and without torch.distributed). A collective under FSDP."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(  # type: ignore[no-any-return]
        unwrap(module), optimizer, options=_options(full_state_dict=True, cpu_offload=True)
    )


def load_optimizer_state(module: Any, optimizer: Any, state: dict[str, Any]) -> None:
    """Load a state written by :func:`full_optimizer_state` (every rank passes the whole state;
    each keeps its shard)."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    set_optimizer_state_dict(
        unwrap(module), optimizer, optim_state_dict=state, options=_options(full_state_dict=True)
    )
