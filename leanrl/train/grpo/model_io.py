"""Loading and saving what the GRPO engine holds (the model, the optimizer and RNG state), the
training device and precision, and the small tensor helpers of :mod:`leanrl.train.grpo.engine`.

Apart from the engine so that it reads as the optimisation step alone; nothing here holds state.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from leanrl.errors import ConfigError, PolicyError
from leanrl.train.distributed import World, full_optimizer_state, full_state_dict

if TYPE_CHECKING:
    from leanrl.train.grpo.config import GRPOConfig

__all__ = [
    "device_and_precision",
    "disable_dropout",
    "load_optimizer_file",
    "save_engine_checkpoint",
]


class _Saver:
    """What ``RunDir.save_checkpoint`` saves: the model, from a gathered state dict if sharded."""

    def __init__(self, model: Any, state: dict[str, Any] | None) -> None:
        self.model = model
        self.state = state

    def save_pretrained(self, folder: Path) -> None:
        if self.state is None:
            self.model.save_pretrained(folder)
        else:
            self.model.save_pretrained(folder, state_dict=self.state)


def load_optimizer_file(path: Path, device: torch.device) -> dict[str, Any]:
    """The optimizer, schedule and RNG state saved with a checkpoint.

    Loaded with ``weights_only=True``: the file may only hold tensors and plain data (dicts,
    lists, numbers, strings), so a planted pickle payload is refused instead of run. A missing,
    truncated or refused file is a :class:`ConfigError` that names it.
    """
    import pickle

    from leanrl.integrity import torch_file_problem

    if not path.is_file():
        raise ConfigError(f"{path} is missing")
    why = torch_file_problem(path)
    if why:
        raise ConfigError(f"{path}: {why}")
    try:
        blob = torch.load(path, map_location=device, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, ValueError, EOFError) as e:
        raise ConfigError(
            f"{path} holds more than tensors and plain data ({_refusal_detail(e)}), so it was "
            "not loaded: leanrl never unpickles run files, so it never runs code from one, and "
            f"it did not write this. Delete {path.parent} to resume from the checkpoint before "
            "it, or start the run over in a new --out folder"
        ) from None
    need = {"optimizer", "scheduler", "torch_rng", "python_rng"}
    if not isinstance(blob, dict) or not need <= set(blob):
        raise ConfigError(f"{path} does not hold the optimizer state leanrl saves ({sorted(need)})")
    return blob


def _refusal_detail(e: BaseException) -> str:
    """What torch found in the file (``unsupported GLOBAL posix.system``), without its advice
    to retry with ``weights_only=False``: that advice is for files one trusts, and a run file
    holding a pickled object is not one leanrl wrote."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    advice = ("weights_only", "torch.load", "trusted source", "pytorch.org")
    kept = [ln for ln in lines if not any(a in ln for a in advice)]
    text = kept[0] if kept else type(e).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _python_rng_state(state: Any) -> tuple[Any, ...]:
    """``random.getstate()`` as saved (lists where it had tuples) back as ``random.setstate``
    wants it: ``(version, tuple of ints, gauss_next)``."""
    version, internal, gauss = state
    return (version, tuple(internal), gauss)


def _load_pretrained(
    tokenizer_from: str, weights_from: str, dtype: torch.dtype, opts: dict[str, Any]
) -> tuple[Any, Any]:
    """(tokenizer, model) from folders or hub ids; a PolicyError saying what is wrong."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from leanrl.integrity import checkpoint_problem

    for source in dict.fromkeys((tokenizer_from, weights_from)):
        folder = Path(source).expanduser()
        if folder.is_dir():
            why = checkpoint_problem(folder, torch_files=False)  # optimizer.pt: checked apart
            if why:
                raise PolicyError(f"cannot load model {source!r}: {why}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_from)
        model = AutoModelForCausalLM.from_pretrained(weights_from, dtype=dtype, **opts)
    except (OSError, ValueError) as e:  # missing files; unreadable tokenizer or config
        raise PolicyError(f"cannot load model {tokenizer_from!r}: {e}") from e
    return tokenizer, model


def disable_dropout(model: Any) -> None:
    """Every dropout of ``model`` off: ``nn.Dropout`` modules, and the float rates that
    attention implementations read at forward time (``attention_dropout`` in Llama/Qwen)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for name in ("attention_dropout", "dropout", "dropout_p", "attn_dropout"):
            if isinstance(getattr(module, name, None), float):
                setattr(module, name, 0.0)


def device_and_precision(cfg: GRPOConfig, world: World | None = None) -> tuple[torch.device, str]:
    """The training device and the resolved precision; a :class:`ConfigError` if they clash.

    With several ranks on GPUs each rank takes ``cuda:LOCAL_RANK``."""
    dev = cfg.policy.device
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(dev)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"policy.device is {dev!r} but no CUDA device is available")
    if world is not None and world.distributed and device.type == "cuda":
        device = torch.device(world.device("cuda"))
        torch.cuda.set_device(device)
    precision = cfg.precision
    if precision == "auto":
        precision = "bf16-mixed" if device.type == "cuda" else "fp32"
    if precision == "bf16-mixed" and device.type != "cuda":
        raise ConfigError(
            "precision 'bf16-mixed' needs a CUDA device; use 'fp32' (or 'bf16') on the CPU"
        )
    return device, precision


def _turns_per_attempt(harness: Any) -> int:
    """Most model turns one attempt of the built-in harnesses takes (for ``dr_grpo``)."""
    if harness.name == "tactic-loop":
        return int(harness.max_turns)
    if harness.name == "self-correction":
        return int(harness.max_revisions) + 1
    return 1


def _split(order: list[int], parts: int) -> list[list[int]]:
    """``order`` cut into ``parts`` contiguous pieces whose sizes differ by at most one."""
    n = len(order)
    bounds = [round(i * n / parts) for i in range(parts + 1)]
    return [order[bounds[i] : bounds[i + 1]] for i in range(parts)]


def _right_aligned(
    rows: Sequence[Sequence[float]], width: int, fill: float, device: torch.device
) -> torch.Tensor:
    """Rows padded on the left to ``width`` (responses end at the right edge). [n, width]."""
    out = torch.full((len(rows), width), fill, dtype=torch.float32)
    for k, row in enumerate(rows):
        if row:
            out[k, width - len(row) :] = torch.tensor(row, dtype=torch.float32)
    return out.to(device)


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def save_engine_checkpoint(engine: Any, row: dict[str, Any], optimizer_file: str) -> Path | None:
    """The GRPO engine's checkpoint: HF model folder (with LoRA: the adapters, peft layout) +
    trainer_state.json + ``optimizer_file`` (optimizer state by parameter name, schedule, RNG).

    Every rank takes part (the full state is gathered from the shards); only rank 0 writes
    and gets the folder, the others get None. The files do not depend on the number of
    ranks, so a run resumes with any number."""
    cfg = engine.config
    with engine.weights_lock:
        sd = full_state_dict(engine.module, engine.world) if engine.world.distributed else None
        optim = full_optimizer_state(engine.module, engine.optimizer)
    if not engine.world.is_main:
        engine.world.barrier()
        return None

    def extra(folder: Path) -> None:
        torch.save(
            {
                "format": "named",
                "optimizer": optim,
                "scheduler": engine.scheduler.state_dict(),
                "torch_rng": torch.get_rng_state(),
                "python_rng": random.getstate(),
            },
            folder / optimizer_file,
        )
        if cfg.lora.enabled and cfg.lora.save_merged:
            from leanrl.train.lora import MERGED_DIR, save_merged

            save_merged(engine.model, engine.tokenizer, folder / MERGED_DIR, cfg.lora.scale, sd)

    state = {
        "trainer": "grpo",
        "policy_version": engine.step,
        "optimizer_file": optimizer_file,
        "base_model": cfg.policy.model,
        "reward_mean": row.get("reward_mean"),
        "world_size": engine.world.size,
        "lora": cfg.lora.enabled,
    }
    with engine.weights_lock:
        path = engine.run.save_checkpoint(
            engine.step,
            _Saver(engine.model, sd),
            engine.tokenizer,
            state,
            keep=cfg.keep_checkpoints,
            extra=extra,
        )
    engine.world.barrier()
    return path
