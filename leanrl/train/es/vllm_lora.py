"""Low-rank ES members as LoRA adapters of one vLLM engine (multi-LoRA batching).

Member (seed, sign) perturbs a linear layer's weight W [out, in] by ``s·A·Bᵀ/√r`` (``s`` =
sign·σ; A [out, r], B [in, r] from :func:`leanrl.train.es.lowrank.factors`). That is exactly a
LoRA adapter of rank r in PEFT's layout, ``ΔW = (lora_alpha / r)·lora_B @ lora_A``, with

    lora_A = Bᵀ  [r, in]      lora_B = s/√r·A  [out, r]      lora_alpha = r (scaling 1)

so every member becomes one adapter folder (``adapter_config.json`` +
``adapter_model.safetensors``) and all members' requests go to one ``LLM.generate`` call, each
prompt with its member's ``LoRARequest`` (``enable_lora``, ``max_loras`` = members per call): vLLM
batches rows of different adapters together (punica kernels) over the unperturbed θ, which the ES
worker extension keeps updated in place as today.

What LoRA cannot carry, and how it is handled: vLLM applies adapters to the decoder's linear
layers only (its embedding/``lm_head`` LoRA support was tied to LoRA's extra vocabulary, which
recent vLLM removed), and never to 1-D tensors. A run scored this way therefore perturbs exactly
those linear layers on both sides, the update and these adapters: ``lowrank_targets = "linear"``
with ``lowrank_other = "frozen"`` (the config requires both with ``scorer.backend = "vllm"``). A
plan whose perturbed set holds anything else is refused (:func:`lora_plan` lists it): members
scored on fewer tensors than the update moves would steer those tensors by noise the members
never had.

Adapter ids: vLLM caches a loaded adapter by ``lora_int_id`` (on the GPU, ``max_loras`` slots,
and an LRU of ``max_cpu_loras`` on the host) and never rereads its folder while the id is cached,
so every adapter gets a fresh id from a counter that lives as long as the engine: an id is never
reused for another member, or for the same seed in a later iteration. Rank: vLLM takes adapters
of any rank up to the engine's ``max_lora_rank`` (one of :data:`VLLM_LORA_RANKS`) and pads the
rest of its slot with zeros, so the folders hold rank r exactly and the engine's rank is the
smallest allowed one ≥ r (:func:`lora_engine_kwargs`).

The factors are drawn on the device the update draws them on (``device``: the engine's GPU), as
CPU and CUDA generators give different numbers for one seed.
"""

from __future__ import annotations

import itertools
import json
import math
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from leanrl.errors import ConfigError, PolicyError
from leanrl.policy import Completion, PolicyConfig, Prompt, SamplingConfig
from leanrl.train.es.lowrank import factors, is_lowrank_target

__all__ = [
    "LoRAPlan",
    "VLLMLoRAEngine",
    "lora_engine_kwargs",
    "lora_plan",
    "member_adapter",
    "write_adapter",
]

#: ``max_lora_rank`` values vLLM accepts (it pads smaller adapters up to the engine's rank).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass(frozen=True)
class LoRAPlan:
    """Which perturbed tensors become adapter weights, and which cannot."""

    targets: dict[str, tuple[str, tuple[int, int]]]
    """Parameter name -> (module path, weight shape [out, in]) of each LoRA-able linear layer."""
    uncovered: tuple[str, ...]
    """Perturbed tensors no adapter can carry (embeddings, ``lm_head``, 1-D tensors)."""

    def check(self) -> None:
        """Raise ConfigError when some perturbed tensor is not LoRA-able (see module docstring)."""
        if self.uncovered:
            raise ConfigError(
                f"low-rank ES through vLLM adapters cannot perturb {len(self.uncovered)} "
                f"tensor(s) of this model (e.g. {list(self.uncovered[:3])}): vLLM applies LoRA to "
                "the decoder's linear layers only, while the update would move these tensors "
                "too. Use scorer.backend = 'inprocess' (scorer.members_per_batch for batching)"
            )


def lora_plan(model: Any, params: Mapping[str, Any], lowrank_other: str = "frozen") -> LoRAPlan:
    """The plan for ``params`` (perturbed parameters by name) of HF ``model`` (a meta-device copy
    is enough: only module types and shapes are read)."""
    from torch import nn

    out_emb = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    linear = {
        id(m.weight): path
        for path, m in model.named_modules()
        if type(m) is nn.Linear and m is not out_emb
    }
    targets: dict[str, tuple[str, tuple[int, int]]] = {}
    uncovered: list[str] = []
    for name, p in params.items():
        shape = tuple(p.shape)
        if not is_lowrank_target(name, shape):
            if lowrank_other == "full":
                uncovered.append(name)
            continue
        path = linear.get(id(p))
        if path is None:
            uncovered.append(name)
        else:
            targets[name] = (path, (shape[0], shape[1]))
    return LoRAPlan(targets, tuple(uncovered))


def member_adapter(
    seed: int, scale: float, plan: LoRAPlan, rank: int, device: Any
) -> dict[str, Any]:
    """Member (seed, scale)'s adapter tensors in PEFT's naming (fp32, on CPU):
    ``lora_B @ lora_A = scale·A·Bᵀ/√r`` for every target, with ``lora_alpha = r``."""
    out: dict[str, Any] = {}
    for name, (path, shape) in plan.targets.items():
        a, b = factors(seed, name, shape, rank, device)  # [out, r], [in, r]
        out[f"base_model.model.{path}.lora_A.weight"] = b.T.contiguous().cpu()  # [r, in]
        out[f"base_model.model.{path}.lora_B.weight"] = (a * (scale / math.sqrt(rank))).cpu()
    return out


def write_adapter(
    folder: Path, tensors: Mapping[str, Any], plan: LoRAPlan, rank: int, base_model: str
) -> Path:
    """Write a PEFT LoRA adapter folder (what vLLM's ``LoRARequest(lora_path=...)`` loads)."""
    from safetensors.torch import save_file

    leaves = sorted({path.rsplit(".", 1)[-1] for path, _ in plan.targets.values()})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": rank,
        "lora_alpha": rank,  # scaling lora_alpha / r = 1: the factors carry s/√r themselves
        "use_rslora": False,
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "target_modules": leaves,
        "modules_to_save": None,
    }
    folder.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.contiguous() for k, v in tensors.items()}, str(folder / "adapter_model.safetensors")
    )
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return folder


def lora_engine_kwargs(members_per_batch: int, rank: int) -> dict[str, Any]:
    """``vllm.LLM`` arguments for a multi-LoRA population engine: one adapter slot per member of
    a call, the smallest rank vLLM accepts that holds ``rank``."""
    fit = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fit:
        raise ConfigError(f"rank {rank} exceeds vLLM's largest LoRA rank {VLLM_LORA_RANKS[-1]}")
    return {
        "enable_lora": True,
        "max_loras": members_per_batch,
        "max_cpu_loras": 2 * members_per_batch,  # the next call's adapters load meanwhile
        "max_lora_rank": fit[0],
    }


class VLLMLoRAEngine:
    """A population engine over a running ``vllm.LLM`` started with :func:`lora_engine_kwargs`:
    :meth:`generate_members` sends every member's prompts in one ``generate`` call, each with its
    member's adapter. Plugs into :class:`~leanrl.train.es.pipeline.PipelinedScorer` with
    ``members_per_batch``. Written against vLLM's LoRA API; tested with a stand-in."""

    def __init__(
        self,
        llm: Any,
        config: PolicyConfig,
        plan: LoRAPlan,
        rank: int,
        folder: Path,
        device: Any = "cuda",
        *,
        ids: Iterator[int] | None = None,
        writer: Callable[[Path, int, float], None] | None = None,
    ) -> None:
        from leanrl.train.es.workers import _EnginePolicy

        plan.check()
        self.llm = llm
        self.policy = _EnginePolicy(llm, config)
        self.plan = plan
        self.rank = rank
        self.folder = Path(folder)
        self.device = device
        self.base_model = config.model
        self._adapters: dict[tuple[int, float], Any] = {}
        self._ids = ids if ids is not None else itertools.count(1)
        """Adapter ids (positive, never reused: see the module docstring); pass the engine's
        own counter when several of these share one engine."""
        self._writer = writer
        """Writes member (seed, scale)'s adapter folder at a path (default: here, factors drawn
        on ``device``); the low-rank vLLM scorer has the engine's rank-0 worker write it."""

    def adapter(self, seed: int, scale: float) -> Any:
        """Member (seed, scale)'s ``LoRARequest`` (its folder written on first use)."""
        key = (seed, scale)
        req = self._adapters.get(key)
        if req is None:
            from vllm.lora.request import LoRARequest

            lid = next(self._ids)
            path = self.folder / f"member-{seed}-{'p' if scale >= 0 else 'm'}-{lid}"
            if self._writer is not None:
                self._writer(path, seed, scale)
            else:
                tensors = member_adapter(seed, scale, self.plan, self.rank, self.device)
                write_adapter(path, tensors, self.plan, self.rank, self.base_model)
            req = LoRARequest(f"es-{lid}", lid, str(path))
            self._adapters[key] = req
        return req

    def generate_members(
        self,
        requests: Sequence[tuple[tuple[int, float], Sequence[Prompt]]],
        sampling: SamplingConfig,
    ) -> list[list[list[Completion]]]:
        """Blocking: one ``LLM.generate`` over all requests' prompts, each with its adapter."""
        from vllm import SamplingParams

        from leanrl.policies.vllm import completions_from_vllm

        texts: list[str] = []
        loras: list[Any] = []
        for (seed, scale), prompts in requests:
            req = self.adapter(seed, scale)
            for p in prompts:
                texts.append(self._render(p))
                loras.append(req)
        if not texts:
            return [[] for _ in requests]
        params = SamplingParams(
            n=sampling.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p if sampling.temperature > 0 else 1.0,
            max_tokens=sampling.max_tokens,
            seed=sampling.seed,
            stop=sampling.stop or None,
            logprobs=0,
        )
        outs = self.llm.generate(texts, params, lora_request=loras, use_tqdm=False)
        flat = completions_from_vllm(outs)
        res: list[list[list[Completion]]] = []
        at = 0
        for _, prompts in requests:
            res.append(flat[at : at + len(prompts)])
            at += len(prompts)
        return res

    def _render(self, prompt: Prompt) -> str:
        if isinstance(prompt, str):
            return prompt
        tok = self.llm.get_tokenizer()
        return str(
            tok.apply_chat_template(
                [m.model_dump() for m in prompt], tokenize=False, add_generation_prompt=True
            )
        )

    def call_member(self, seed: int, scale: float, fn: Any, *args: Any, **kw: Any) -> Any:
        raise PolicyError(
            f"{getattr(fn, '__name__', fn)} needs a member's weights outside generate(), which "
            "vLLM's adapters only apply inside generate: use a harness that only generates, or "
            "scorer.backend = 'inprocess'"
        )

    def forget(self, seed: int) -> None:
        """Drop the member's adapters (engine slot and folder) once both twins are scored."""
        for key in [k for k in self._adapters if k[0] == seed]:
            req = self._adapters.pop(key)
            remove = getattr(getattr(self.llm, "llm_engine", None), "remove_lora", None)
            if callable(remove):
                remove(req.lora_int_id)
            shutil.rmtree(req.lora_path, ignore_errors=True)
