"""ES weights: seeded per-tensor noise, exact perturb/restore, and the fp32 update.

Three rules make an ES run reproducible and its history replayable bit for bit:

1. **Noise is a function of (seed, tensor name).** Each tensor gets its own generator, seeded
   with a 63-bit hash of ``(seed, name)``. Two tensors of the same shape therefore never share
   noise (a bug in implementations that reuse one generator state per shape or per seed).
2. **Restore recomputes, it never subtracts.** The fp32 master copy ``θ`` is never touched by a
   perturbation; a perturbed parameter is written as ``cast(θ + sσε)`` and restored as
   ``cast(θ)``. ``(θ + σε) - σε`` is not ``θ`` in floating point; ``cast(θ)`` always is.
3. **The update lives in fp32.** ``Δ = Σ_k c_k ε_k`` is accumulated in fp32 and added to the fp32
   master, then cast into the model. A step of ~1e-5 would round away in bf16.

The same :meth:`ESWeights.apply_update` is used live and by ``replay``, so both perform the same
floating-point operations in the same order, which is what makes replay bitwise identical on the
same kind of device (CPU and CUDA generators give different numbers for the same seed).

Low-rank perturbations (``perturbation = "lowrank"``: each matrix gets ``A·Bᵀ/√r`` instead of a
full ε) are :class:`~leanrl.train.es.lowrank.LowRankWeights`, a subclass that keeps all three
rules; :func:`~leanrl.train.es.lowrank.make_weights` builds whichever a run uses.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from leanrl.errors import ConfigError

if TYPE_CHECKING:
    import torch

__all__ = ["ESWeights", "noise", "noise_seed"]

MASTER_FILE = "es_master.safetensors"
"""Name of the fp32 master weights file inside a checkpoint (written when the model is not fp32)."""


def noise_seed(seed: int, name: str) -> int:
    """The generator seed of tensor ``name`` for member seed ``seed`` (stable across runs)."""
    digest = hashlib.blake2b(f"{seed}\x00{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def noise(seed: int, name: str, shape: Sequence[int], device: torch.device | str) -> torch.Tensor:
    """Standard-normal fp32 noise ε for one tensor, reproducible per (seed, name, device type)."""
    import torch

    gen = torch.Generator(device=device)
    gen.manual_seed(noise_seed(seed, name))
    return torch.randn(tuple(shape), generator=gen, device=device, dtype=torch.float32)


class ESWeights:
    """The fp32 master weights of a model and the operations ES applies to them.

    ``params`` are the model's own parameters (any dtype; what generation uses). ``master`` holds
    an fp32 copy of each, the authoritative weights ``θ``. Tied weights appear once (PyTorch's
    ``named_parameters`` drops duplicates), so a tied embedding gets one noise tensor.
    """

    def __init__(self, params: dict[str, torch.nn.Parameter], master: dict[str, torch.Tensor]):
        self.params = params
        self.master = master

    @classmethod
    def from_model(cls, model: torch.nn.Module, trainable_only: bool = False) -> ESWeights:
        """Take the model's current weights as ``θ`` (copied to fp32; the model is not changed).

        ``trainable_only``: only the parameters that require grad (LoRA: the adapters); the
        others are left alone and get no master copy."""
        import torch

        params: dict[str, torch.nn.Parameter] = {}
        master: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            for name, p in model.named_parameters():
                if trainable_only and not p.requires_grad:
                    continue
                p.requires_grad_(False)  # ES never needs autograd; saves the grad buffers
                params[name] = p
                # .float() on an fp32 tensor aliases it: clone so the master is independent.
                master[name] = p.detach().to(torch.float32, copy=True)
        return cls(params, master)

    def names(self) -> list[str]:
        """Perturbed tensor names, in model order."""
        return list(self.params)

    def numel(self) -> int:
        """Number of perturbed scalars."""
        return sum(t.numel() for t in self.master.values())

    # -- perturb / restore ------------------------------------------------------------------------

    def perturb(self, seed: int, scale: float) -> None:
        """Write ``cast(θ + scale·ε(seed))`` into every parameter (``scale`` = ±σ)."""
        import torch

        with torch.no_grad():
            for name, p in self.params.items():
                theta = self.master[name]  # [*shape] fp32
                eps = noise(seed, name, theta.shape, theta.device)  # [*shape] fp32
                if p.dtype == torch.float32:  # same single rounding, no temporary
                    torch.add(theta, eps, alpha=scale, out=p)
                else:
                    p.copy_(torch.add(theta, eps, alpha=scale))

    def restore(self) -> None:
        """Write ``cast(θ)`` back into every parameter: bit-exact, whatever was written before."""
        import torch

        with torch.no_grad():
            for name, p in self.params.items():
                p.copy_(self.master[name])

    # -- update -----------------------------------------------------------------------------------

    def apply_update(self, coeffs: Sequence[tuple[int, float]]) -> float:
        """``θ += Σ_k c_k ε(seed_k)`` in fp32 (in the given order), then cast into the model.

        ``coeffs`` are (seed, c_k) with c_k already rounded to float32 (the history stores them
        as float32, so the live run and a replay multiply by the very same numbers). Returns the
        L2 norm of the step over all tensors.
        """
        import torch

        sq = 0.0
        with torch.no_grad():
            for name, p in self.params.items():
                theta = self.master[name]  # [*shape] fp32
                if coeffs:
                    delta = torch.zeros_like(theta)  # [*shape] fp32 accumulator
                    for seed, c in coeffs:
                        delta.add_(noise(seed, name, theta.shape, theta.device), alpha=c)
                    theta.add_(delta)
                    sq += float(delta.double().square().sum())
                p.copy_(theta)
        return math.sqrt(sq)

    # -- state ------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The fp32 master weights (the tensors themselves; clone before mutating)."""
        return self.master

    def load_master(self, tensors: dict[str, torch.Tensor]) -> None:
        """Replace ``θ`` (fp32 tensors by name, e.g. from a checkpoint) and write it into the model."""
        import torch

        missing = set(self.params) - set(tensors)
        if missing:
            raise ConfigError(
                f"the fp32 master weights lack {len(missing)} of the model's tensors (e.g. "
                f"{sorted(missing)[:5]}): they were saved from a different model. Check that "
                "policy.model is the model this run was trained from, or delete the checkpoint "
                "folder holding them so the weights are rebuilt from the history."
            )
        with torch.no_grad():
            for name, p in self.params.items():
                src = tensors[name]
                if tuple(src.shape) != tuple(p.shape):
                    raise ConfigError(
                        f"tensor {name!r}: master shape {tuple(src.shape)} != model shape "
                        f"{tuple(p.shape)}: the master was saved from a different model (check "
                        "policy.model, or delete that checkpoint folder)"
                    )
                self.master[name] = src.to(device=p.device, dtype=torch.float32, copy=True)
                p.copy_(self.master[name])

    def save_master(self, path: Path) -> None:
        """Write ``θ`` to a safetensors file (exact fp32)."""
        from safetensors.torch import save_file

        save_file({k: v.detach().contiguous().cpu() for k, v in self.master.items()}, str(path))

    def equal(self, other: dict[str, torch.Tensor]) -> bool:
        """True when ``other`` holds exactly (bitwise) these master weights."""
        import torch

        return set(other) == set(self.master) and all(
            torch.equal(self.master[k], other[k].to(self.master[k].device)) for k in self.master
        )

    def __iter__(self) -> Iterator[str]:
        return iter(self.params)


def load_master_file(path: Path) -> dict[str, torch.Tensor]:
    """Read fp32 master weights written by :meth:`ESWeights.save_master` (a damaged file is a
    :class:`ConfigError` naming it, not the safetensors library's traceback)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from leanrl.integrity import safetensors_problem

    why = safetensors_problem(Path(path))
    try:
        if why is None:
            return load_file(str(path))
    except (OSError, SafetensorError) as e:
        why = f"{Path(path).name} cannot be read ({e})"
    raise ConfigError(
        f"cannot load the fp32 master weights {path}: {why}. Delete the checkpoint folder "
        f"holding it ({Path(path).parent}) and rerun: the weights are rebuilt from an older "
        "checkpoint or the base model and the history."
    )
