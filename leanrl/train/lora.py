"""LoRA through ``peft``: low-rank adapters instead of full fine-tuning, for GRPO, ES and SFT
(and expert iteration's SFT phase).

With ``lora.rank = r > 0`` the trainer freezes the base model and trains, in every targeted linear
layer W (d_out × d_in), two small matrices B (d_out × r, zero at the start) and A (r × d_in), so
the layer computes ``W·x + (alpha / r)·B·A·x`` (Hu et al. 2021). What that buys:

- GRPO: gradients and AdamW state only for the adapters (a few MB instead of 3× the model);
- ES: the population perturbs only the adapters, so the fp32 master is the adapters' size, not
  the model's (see ``docs/training-es.md`` for the trade-off);
- SFT: transformers' Trainer trains (and checkpoints, and resumes) the peft model as it is;
- checkpoints: the adapters in the Hugging Face / peft layout (``adapter_config.json`` +
  ``adapter_model.safetensors``), which ``peft.PeftModel.from_pretrained(base, folder)`` and
  ``transformers``' own peft integration load; the merged full model on request.

Generation engines that take plain weights (a vLLM engine, in-process or behind ``vllm serve``)
get the *merged* weights ``W + (alpha / r)·B·A`` under the base model's own tensor names
(:func:`merge_stream`), one tensor at a time.

``peft`` is imported lazily (the ``lora`` extra).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from leanrl.errors import ConfigError, PolicyError

__all__ = [
    "ADAPTER",
    "LoRAConfig",
    "apply_lora",
    "check_peft",
    "is_adapter_folder",
    "load_adapter",
    "merge_checkpoint",
    "merge_stream",
    "save_merged",
]

ADAPTER = "default"
"""The adapter name peft gives the one adapter leanrl trains."""
MERGED_DIR = "merged"
"""Sub-folder of a checkpoint that holds the merged model (``lora.save_merged``)."""


class LoRAConfig(BaseModel):
    """Low-rank adapters (``peft``) instead of training every weight."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    rank: int = Field(default=0, ge=0)
    """LoRA rank r. 0 (the default): no LoRA, every weight trains. 8 to 64 is usual."""
    alpha: float | None = Field(default=None, gt=0)
    """Scale numerator: the update is (alpha / r)·B·A. Unset: 2·r (so the scale is 2)."""
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Dropout on the adapters' input during training. 0 by default: in GRPO a dropout the
    sampler does not apply makes the trainer's policy differ from the one that sampled (see
    ``disable_dropout``)."""
    target_modules: list[str] | Literal["all-linear"] = "all-linear"
    """Which linear layers get adapters: module names (``["q_proj", "v_proj"]``) or
    ``all-linear`` (every linear layer except the output head)."""
    save_merged: bool = False
    """Also write the merged full model (``W + (alpha/r)·B·A``) into ``checkpoint-N/merged/``, a
    plain Hugging Face folder for engines without LoRA support. Costs a full model's disk per
    checkpoint; :func:`leanrl.train.lora.merge_checkpoint` does the same afterwards."""

    @field_validator("target_modules")
    @classmethod
    def _targets(cls, v: list[str] | str) -> list[str] | str:
        if isinstance(v, list) and not v:
            raise ValueError(
                "lora.target_modules is empty: name the linear layers to adapt "
                "(e.g. ['q_proj', 'v_proj']) or use 'all-linear'"
            )
        return v

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scale(self) -> float:
        """alpha / r."""
        return self.lora_alpha / self.rank

    @property
    def lora_alpha(self) -> float:
        return self.alpha if self.alpha is not None else 2.0 * self.rank


def _peft() -> Any:
    try:
        import peft
    except ImportError:
        from leanrl._dist import install_hint

        raise ConfigError(
            f"lora.rank > 0 needs the peft package: {install_hint('lora')} (or pip install "
            "peft), or set lora.rank = 0 to train every weight"
        ) from None
    return peft


def check_peft(config: LoRAConfig) -> None:
    """With LoRA on, fail before anything loads when ``peft`` is missing (the install line)."""
    if config.enabled and importlib.util.find_spec("peft") is None:
        _peft()


def apply_lora(model: Any, config: LoRAConfig, seed: int) -> Any:
    """``model`` with fresh adapters (a ``peft.PeftModel``): the base frozen, A and B trainable.

    A is drawn from the CPU generator seeded with ``seed`` (peft creates the adapters on the CPU
    and then moves them), so the same seed gives the same adapters on any device; B is zero, so
    the wrapped model computes exactly what ``model`` did."""
    import torch

    peft = _peft()
    cfg = peft.LoraConfig(
        r=config.rank,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.dropout,
        target_modules=config.target_modules,
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            wrapped = peft.get_peft_model(model, cfg)
        except ValueError as e:  # peft: "Target modules {...} not found in the base model"
            raise ConfigError(f"lora.target_modules: {e}") from e
    return wrapped


def is_adapter_folder(path: str | Path) -> bool:
    """A folder holding peft adapters (``adapter_config.json``), not a full model."""
    return (Path(path) / "adapter_config.json").is_file()


def load_adapter(model: Any, folder: str | Path) -> None:
    """Load the adapter weights saved in ``folder`` into ``model`` (a PeftModel, same config)."""
    from safetensors.torch import load_file

    peft = _peft()
    f = Path(folder) / "adapter_model.safetensors"
    if not f.is_file():
        raise PolicyError(f"{folder} has no adapter_model.safetensors: not a LoRA checkpoint")
    result = peft.set_peft_model_state_dict(model, load_file(str(f)))
    missing = [k for k in getattr(result, "missing_keys", []) if "lora_" in k]
    if missing:
        raise PolicyError(
            f"the adapters in {folder} do not fit this model: {len(missing)} adapter tensors "
            f"missing (e.g. {missing[:3]}); check lora.rank/target_modules against the run's"
        )


def _clean(name: str) -> str:
    """A peft parameter name as the base model names it (``base_model.model.`` and
    ``.base_layer`` removed)."""
    if name.startswith("base_model.model."):
        name = name[len("base_model.model.") :]
    return name.replace(".base_layer.", ".")


def merge_stream(named: Iterable[tuple[str, Any]], scale: float) -> Iterator[tuple[str, Any]]:
    """Merged ``(name, tensor)`` pairs from a peft model's parameters (or state dict), in order.

    Each adapted weight comes out once its ``lora_A`` and ``lora_B`` have been seen, as
    ``W + scale·B·A`` in W's dtype; everything else passes through under its base name. Only
    the pending weights of a layer are held, so FSDP can gather tensor by tensor."""
    pending: dict[str, dict[str, Any]] = {}
    for name, t in named:
        if ".lora_A." in name or ".lora_B." in name:
            prefix, kind = (
                (name.split(".lora_A.")[0], "A")
                if ".lora_A." in name
                else (
                    name.split(".lora_B.")[0],
                    "B",
                )
            )
        elif name.endswith(".base_layer.weight"):
            prefix, kind = name[: -len(".base_layer.weight")], "W"
        else:
            if ".lora_" not in name:  # lora_embedding_*, magnitudes: not produced by leanrl
                yield _clean(name), t
            continue
        slot = pending.setdefault(prefix, {})
        slot[kind] = t
        if len(slot) == 3:
            del pending[prefix]
            w = slot["W"]
            delta = (slot["B"].float() @ slot["A"].float()) * scale
            yield _clean(prefix) + ".weight", (w.float() + delta).to(w.dtype)
    if pending:
        raise PolicyError(
            f"LoRA layers without all of weight, lora_A and lora_B: {sorted(pending)[:3]}"
        )


def save_merged(model: Any, tokenizer: Any, out: Path, scale: float, state: Any = None) -> Path:
    """Write the merged model (a plain Hugging Face folder) to ``out``.

    ``state``: the peft model's full state dict when it is sharded (FSDP); default its own."""
    named = state.items() if state is not None else model.state_dict().items()
    merged = {k: v.detach().cpu().contiguous() for k, v in merge_stream(named, scale)}
    base = model.get_base_model()
    out.mkdir(parents=True, exist_ok=True)
    base.save_pretrained(out, state_dict=merged)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return out


def merge_checkpoint(
    checkpoint: str | Path, out: str | Path, base_model: str | None = None
) -> Path:
    """Merge a LoRA checkpoint folder's adapters into its base model and save a plain Hugging Face
    folder at ``out`` (loadable by transformers and vLLM). ``base_model``: the base model's path
    or id when the one recorded in ``adapter_config.json`` has moved."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    peft = _peft()
    ckpt = Path(checkpoint)
    if not is_adapter_folder(ckpt):
        raise ConfigError(f"{ckpt} holds no adapter_config.json: not a LoRA checkpoint")
    info = json.loads((ckpt / "adapter_config.json").read_text())
    base_path = base_model or info.get("base_model_name_or_path")
    if not base_path:
        raise ConfigError(f"{ckpt}/adapter_config.json names no base model: pass base_model")
    # Merged in fp32, saved in the base model's own dtype (a bf16 model stays bf16 on disk).
    saved = AutoConfig.from_pretrained(base_path)
    stored = getattr(saved, "torch_dtype", None) or getattr(saved, "dtype", None)
    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    merged = peft.PeftModel.from_pretrained(base, str(ckpt)).merge_and_unload()
    if isinstance(stored, str):
        stored = getattr(torch, stored, None)
    if isinstance(stored, torch.dtype) and stored != torch.float32:
        merged = merged.to(stored)
    dest = Path(out)
    merged.save_pretrained(dest)
    AutoTokenizer.from_pretrained(
        ckpt if (ckpt / "tokenizer_config.json").is_file() else base_path
    ).save_pretrained(dest)
    return dest
