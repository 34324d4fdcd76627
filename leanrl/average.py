"""``leanrl average``: the weighted mean of checkpoints' weights, as one model folder.

Goedel-Prover-V2 (Lin et al. 2025, "model averaging") averages the weights of checkpoints of
one run to win back the output diversity (pass@k for larger k) that later training loses; weight
averaging of fine-tuned models from one start is Wortsman et al. 2022's "model soups".

Every input is a Hugging Face model folder (``checkpoint-N`` of any leanrl trainer, a model
folder); a folder holding LoRA adapters (``adapter_config.json``) is merged into its base model
first (its ``merged/`` sub-folder when the run saved one, else
:func:`leanrl.train.lora.merge_checkpoint`). All inputs must hold the same tensors with the same
shapes; the mean is taken in float32 and written in each tensor's own dtype (or ``dtype``),
shard by shard in the first checkpoint's layout, with the first checkpoint's config and tokenizer
files. The output appears whole or not at all: it is written to a temporary folder beside ``out``
and renamed into place.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Literal

from pydantic import Field
from pydantic_settings import CliPositionalArg

from leanrl.config import ConfigCommand
from leanrl.errors import ConfigError

__all__ = ["AverageCommand", "average_checkpoints", "normalised_weights"]

INDEX = "model.safetensors.index.json"
"""The shard index of a sharded safetensors model folder."""
PROVENANCE = "averaged.json"
"""What ``leanrl average`` writes beside the weights: the inputs and their weights."""

# Files of a checkpoint that are not the model: optimizer and trainer state, checksums of the
# input folder (which the output's files would not match), adapters (merged already).
_NOT_COPIED = (
    "checksums.sha256",
    "trainer_state.json",
    "training_args.bin",
    "optimizer.pt",
    "scheduler.pt",
    "scaler.pt",
    "adapter_config.json",
    "adapter_model.safetensors",
    PROVENANCE,
)

# Weights (written anew) and pickled state (optimizer, RNG, training arguments): not copied.
_STATE_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin")

DTYPES = {"float32", "bfloat16", "float16"}


def normalised_weights(weights: Sequence[float] | None, n: int) -> list[float]:
    """``weights`` scaled to sum to 1 (None: equal weights); a ConfigError unless there is one
    finite, positive weight per checkpoint."""
    if weights is None:
        return [1.0 / n] * n
    w = [float(x) for x in weights]
    if len(w) != n:
        raise ConfigError(
            f"{len(w)} weights for {n} checkpoints: give one weight per checkpoint, in the same "
            "order (--weights 1,1,2), or leave --weights out for the plain mean"
        )
    bad = [x for x in w if not math.isfinite(x) or x <= 0]
    if bad:
        raise ConfigError(
            f"weight {bad[0]!r} is not a positive number: every weight must be > 0 (they are "
            "scaled to sum to 1, so 1,1,2 means 1/4, 1/4, 1/2)"
        )
    total = sum(w)
    return [x / total for x in w]


def average_checkpoints(
    checkpoints: Sequence[str | Path],
    out: str | Path,
    weights: Sequence[float] | None = None,
    *,
    dtype: str = "auto",
    base_model: str | None = None,
) -> Path:
    """Write the weighted mean of ``checkpoints`` to ``out`` (see the module doc); returns it.

    ``dtype``: ``auto`` keeps each tensor's own dtype, else ``float32``, ``bfloat16`` or
    ``float16`` for every floating tensor. ``base_model``: the base model of LoRA checkpoints
    when the one recorded in their ``adapter_config.json`` has moved."""
    folders = [Path(c).expanduser() for c in checkpoints]
    if len(folders) < 2:
        raise ConfigError(
            f"{len(folders)} checkpoint given: averaging needs two or more "
            "(leanrl average RUN/checkpoint-100 RUN/checkpoint-200 --out DIR)"
        )
    w = normalised_weights(weights, len(folders))
    if dtype != "auto" and dtype not in DTYPES:
        raise ConfigError(f"dtype {dtype!r} is not one of auto, {', '.join(sorted(DTYPES))}")
    dest = Path(out).expanduser()
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ConfigError(
            f"--out {dest} exists and is not an empty folder: give a new folder (nothing is "
            "overwritten)"
        )
    from leanrl.integrity import CHECKSUMS_FILE, content_problem

    for f in folders:
        if not f.is_dir():
            raise ConfigError(f"checkpoint {f} is not a folder: give Hugging Face model folders")
        # a leanrl checkpoint's checksums (its merged/ too): a flipped bit is structurally whole
        why = content_problem(f)
        if why:
            raise ConfigError(
                f"{f} is damaged: {why}. Leave it out or use a good copy (to average it as it "
                f"is anyway, delete {f / CHECKSUMS_FILE})"
            )
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-average-{dest.name}-", dir=dest.parent))
    try:
        plain = _plain_folders(folders, tmp / ".merged", base_model)
        _average_into(plain, folders, w, tmp, dtype)
        shutil.rmtree(tmp / ".merged", ignore_errors=True)
        tmp.chmod(0o755)  # mkdtemp makes it private; the output is an ordinary folder
        if dest.exists():
            dest.rmdir()  # empty (checked above)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def _plain_folders(folders: Sequence[Path], scratch: Path, base_model: str | None) -> list[Path]:
    """The inputs as plain model folders: a LoRA checkpoint's ``merged/`` when it has one, else
    its adapters merged into the base model under ``scratch``."""
    from leanrl.train.lora import MERGED_DIR, is_adapter_folder

    out: list[Path] = []
    for i, f in enumerate(folders):
        if not is_adapter_folder(f):
            out.append(f)
        elif _weight_files(f / MERGED_DIR, required=False):
            out.append(f / MERGED_DIR)
        else:
            from leanrl.train.lora import merge_checkpoint  # a missing peft: the install line

            out.append(merge_checkpoint(f, scratch / str(i), base_model))
    return out


def _weight_files(folder: Path, *, required: bool = True) -> list[str]:
    """The safetensors files of a model folder, in its shard index's order."""
    if (folder / INDEX).is_file():
        index = json.loads((folder / INDEX).read_text(encoding="utf-8"))
        return sorted(set(index.get("weight_map", {}).values()))
    if (folder / "model.safetensors").is_file():
        return ["model.safetensors"]
    if required:
        raise ConfigError(
            f"{folder} holds no model.safetensors (nor a {INDEX}): give Hugging Face model "
            "folders saved as safetensors (leanrl's checkpoints are)"
        )
    return []


def _layout(folder: Path) -> dict[str, tuple[str, tuple[int, ...], str]]:
    """Every tensor of a model folder: name -> (file, shape, dtype)."""
    from safetensors import safe_open

    from leanrl.integrity import checkpoint_problem

    why = checkpoint_problem(folder, torch_files=False)
    if why:
        raise ConfigError(f"{folder} is damaged: {why}")
    out: dict[str, tuple[str, tuple[int, ...], str]] = {}
    for name in _weight_files(folder):
        with safe_open(str(folder / name), framework="pt") as f:
            for key in f.keys():
                sl = f.get_slice(key)
                out[key] = (name, tuple(sl.get_shape()), str(sl.get_dtype()))
    return out


def _check_same(
    layouts: Sequence[dict[str, tuple[str, tuple[int, ...], str]]], names: Sequence[Path]
) -> None:
    """A ConfigError naming the first tensor that differs (missing, or another shape)."""
    first = layouts[0]
    for layout, name in zip(layouts[1:], names[1:], strict=True):
        for key in sorted(set(first) | set(layout)):
            if key not in layout:
                raise ConfigError(
                    f"{name} has no tensor {key!r}, which {names[0]} has: checkpoints to average "
                    "must be of one model (the same architecture and size)"
                )
            if key not in first:
                raise ConfigError(
                    f"{name} has tensor {key!r}, which {names[0]} has not: checkpoints to "
                    "average must be of one model (the same architecture and size)"
                )
            if first[key][1] != layout[key][1]:
                raise ConfigError(
                    f"tensor {key!r} is {list(first[key][1])} in {names[0]} but "
                    f"{list(layout[key][1])} in {name}: checkpoints to average must be of one "
                    "model (the same architecture and size)"
                )


def _average_into(
    plain: Sequence[Path], names: Sequence[Path], w: Sequence[float], out: Path, dtype: str
) -> None:
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    layouts = [_layout(f) for f in plain]
    _check_same(layouts, names)
    first = plain[0]
    target = getattr(torch, dtype) if dtype != "auto" else None
    with ExitStack() as stack:
        handles = [
            {
                n: stack.enter_context(safe_open(str(f / n), framework="pt"))
                for n in _weight_files(f)
            }
            for f in plain
        ]
        for shard in _weight_files(first):
            tensors: dict[str, Any] = {}
            for key, (file, _, _) in layouts[0].items():
                if file != shard:
                    continue
                parts = [
                    h[lay[key][0]].get_tensor(key) for h, lay in zip(handles, layouts, strict=True)
                ]
                tensors[key] = _mean(key, parts, w, target, names)
            save_file(tensors, str(out / shard), metadata={"format": "pt"})
            (out / shard).chmod(0o644)  # an ordinary model file, like the config beside it
    for p in first.iterdir():  # config, generation config, tokenizer, chat template
        if p.is_file() and p.suffix not in _STATE_SUFFIXES and p.name not in _NOT_COPIED:
            shutil.copy2(p, out / p.name)
    (out / PROVENANCE).write_text(
        json.dumps(
            {"checkpoints": [str(n) for n in names], "weights": list(w), "dtype": dtype},
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )


def _mean(
    key: str, parts: Sequence[Any], w: Sequence[float], target: Any, names: Sequence[Path]
) -> Any:
    """The weighted mean of one tensor over the checkpoints, summed in float32."""
    import torch

    if not parts[0].is_floating_point():
        # integer buffers (position ids, counters) are no weights to average: they must agree
        for p, name in zip(parts[1:], names[1:], strict=True):
            if not torch.equal(p, parts[0]):
                raise ConfigError(
                    f"tensor {key!r} ({parts[0].dtype}) differs between {names[0]} and {name}; "
                    "only floating-point tensors are averaged"
                )
        return parts[0].contiguous()
    acc = torch.zeros(parts[0].shape, dtype=torch.float32)
    for p, wi in zip(parts, w, strict=True):
        acc += p.to(torch.float32) * wi
    return acc.to(target or parts[0].dtype).contiguous()


class AverageCommand(ConfigCommand):
    """Average the weights of checkpoints into one model folder (Goedel-Prover-V2's model
    averaging: it restores the diversity later training loses).

    Example: leanrl average runs/sft/checkpoint-100 runs/sft/checkpoint-200 --out runs/avg
    (then evaluate runs/avg with leanrl eval like any model folder). LoRA checkpoints are
    merged into their base model first. The mean is taken in float32 and saved in the
    checkpoints' own dtype, with the first checkpoint's config and tokenizer; --out must not
    exist (or be empty).
    """

    checkpoints: CliPositionalArg[list[Path]] = Field(default_factory=list)
    """Model folders to average (``checkpoint-N`` of a run, a Hugging Face model folder, a LoRA
    checkpoint), two or more, all of one model."""
    out: Path | None = None
    """The folder to write (must not exist, or be empty)."""
    weights: list[float] | None = None
    """One positive weight per checkpoint, in order (``--weights 1,1,2``), scaled to sum to 1.
    Unset: the plain mean."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """The dtype the averaged tensors are saved in. ``auto``: each tensor's own (the mean is
    always taken in float32)."""
    base_model: str | None = None
    """LoRA checkpoints: the base model (path or hub id) when the one their
    ``adapter_config.json`` records has moved."""

    def cli_cmd(self) -> None:
        cmd = self.resolved()
        if cmd.out is None:
            raise ConfigError("give the folder to write: --out DIR")
        dest = average_checkpoints(
            cmd.checkpoints, cmd.out, cmd.weights, dtype=cmd.dtype, base_model=cmd.base_model
        )
        w = normalised_weights(cmd.weights, len(cmd.checkpoints))
        print(f"averaged {len(cmd.checkpoints)} checkpoints (weights "
              f"{', '.join(f'{x:.3g}' for x in w)}) into {dest}")  # fmt: skip
