"""An in-process Policy around a torch model that ES perturbs in place.

ES scores each population member by writing perturbed weights into one live model and running the
environment's harness with a Policy over that model. :class:`TorchPolicy` is that Policy: it holds
a reference to the model (never a copy), so whatever weights are in the model when
:meth:`TorchPolicy.generate` runs are the weights that generate. Greedy decoding (temperature 0)
is deterministic, which is what ES wants by default.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from leanrl.errors import ConfigError, PolicyError
from leanrl.policy import Completion, Policy, PolicyConfig, Prompt, SamplingConfig

__all__ = ["TorchPolicy", "load_model", "resolve_device_dtype"]


def resolve_device_dtype(config: PolicyConfig) -> tuple[str, str]:
    """(device, dtype name) for ``config``: ``auto`` is a GPU in bf16 if present, else CPU fp32."""
    import torch

    device = config.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = config.dtype
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    return device, dtype


#: ``from_pretrained`` arguments ES sets itself from ``policy.dtype`` / ``policy.device``.
_OWN_KWARGS = {
    "dtype": "policy.dtype",
    "torch_dtype": "policy.dtype",
    "device_map": "policy.device",
}


def load_model(
    path: str, dtype: str, device: str, options: Mapping[str, Any] | None = None
) -> tuple[Any, Any]:
    """A causal LM and its tokenizer, in eval mode on ``device`` (raises PolicyError).

    ``options`` (``policy.options``) are passed to the model's ``from_pretrained``, e.g.
    ``{"attn_implementation": "sdpa", "revision": "main"}``.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    opts = dict(options or {})
    clash = sorted(k for k in opts if k in _OWN_KWARGS)
    if clash:
        raise ConfigError(
            f"policy.options sets {clash}, which ES derives itself: use "
            f"{sorted({_OWN_KWARGS[k] for k in clash})} instead"
        )
    from safetensors import SafetensorError

    from leanrl.integrity import checkpoint_problem

    folder = Path(path).expanduser()
    # A truncated model.safetensors (a kill mid-copy, a full disk) otherwise surfaces as the
    # safetensors library's own exception and a long traceback: name the file, as eval and GRPO
    # do with the same check.
    why = checkpoint_problem(folder, torch_files=False) if folder.is_dir() else None
    if why:
        raise PolicyError(
            f"cannot load model {path!r}: {why}. Copy the model folder again (or, for a "
            "checkpoint of this run, delete that checkpoint folder and rerun: the weights are "
            "rebuilt from the history)"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype), **opts)
    except (OSError, ValueError, TypeError, SafetensorError) as e:
        raise PolicyError(
            f"cannot load model {path!r}: {e} (check policy.model, and policy.options, which are "
            "passed to from_pretrained)"
        ) from e
    model.to(device)  # type: ignore[arg-type]
    model.eval()
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


class TorchPolicy(Policy):
    """Generation with a live torch model (whatever weights it holds right now)."""

    name: ClassVar[str] = "torch"

    def __init__(self, model: Any, tokenizer: Any, config: PolicyConfig | None = None) -> None:
        super().__init__(config or PolicyConfig(model="<in-process>"))
        self.model = model
        self.tokenizer = tokenizer

    @property
    def device(self) -> Any:
        return next(self.model.parameters()).device

    def render(self, prompt: Prompt) -> str:
        """The prompt as text (chat messages through the tokenizer's chat template)."""
        if isinstance(prompt, str):
            return prompt
        messages = [m.model_dump() for m in prompt]
        out = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        return str(out)

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    async def generate(
        self, prompts: Sequence[Prompt], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        # A worker thread keeps the event loop free (e.g. for Lean checks of the previous member).
        return await asyncio.to_thread(self.generate_sync, prompts, sampling)

    def generate_sync(
        self, prompts: Sequence[Prompt], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        """Blocking :meth:`generate`: ``sampling.n`` completions per prompt, batched."""
        import torch

        texts = [self.render(p) for p in prompts]
        flat = [t for t in texts for _ in range(sampling.n)]
        out: list[Completion] = []
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        bs = self.config.batch_size
        for i in range(0, len(flat), bs):
            out += self._generate_batch(flat[i : i + bs], sampling)
        return [out[i * sampling.n : (i + 1) * sampling.n] for i in range(len(texts))]

    def generate_rows(self, texts: Sequence[str], sampling: SamplingConfig) -> list[Completion]:
        """One completion per entry of ``texts`` (already rendered), all in one ``generate``
        call whatever ``batch_size``: the batched population decoder lays out the rows of its
        members itself (``leanrl.train.es.population``). Seeded as :meth:`generate_sync`."""
        import torch

        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        return self._generate_batch(list(texts), sampling)

    def _generate_batch(self, texts: list[str], sampling: SamplingConfig) -> list[Completion]:
        import torch
        from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

        tok = self.tokenizer
        tok.padding_side = "left"  # generation continues at the right edge of every row
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        ids = enc["input_ids"].to(self.device)  # [B, P]
        mask = enc["attention_mask"].to(self.device)  # [B, P]
        greedy = sampling.temperature == 0.0
        kwargs: dict[str, Any] = {"do_sample": not greedy}
        recorder = _ChosenLogprobs()
        processors: list[Any] = [recorder]
        if not greedy:
            # Temperature and top-p go in this list, before the recorder, so it sees the very
            # distribution that is sampled from (generate puts its own warpers after custom
            # processors); generate's own are neutral then.
            kwargs.update(temperature=1.0, top_p=1.0)
            processors = [
                TemperatureLogitsWarper(sampling.temperature),
                *([TopPLogitsWarper(sampling.top_p)] if sampling.top_p < 1.0 else []),
                recorder,
            ]
        with torch.no_grad():
            try:
                sequences = self.model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    max_new_tokens=sampling.max_tokens,
                    pad_token_id=tok.pad_token_id,
                    eos_token_id=tok.eos_token_id,
                    logits_processor=LogitsProcessorList(processors),
                    top_k=None,
                    **kwargs,
                )
            except RuntimeError as e:
                raise PolicyError(f"generation failed: {e}") from e
            scores = recorder.finish(sequences)  # [B, T] log-probs of the chosen tokens
        new = sequences[:, ids.shape[1] :]  # [B, T]
        out = []
        for b in range(len(texts)):
            prompt_ids = tuple(int(t) for t, m in zip(ids[b], mask[b], strict=True) if m)
            toks: list[int] = []
            lps: list[float] = []
            finish = "length"
            for t, lp in zip(new[b].tolist(), scores[b].tolist(), strict=True):
                if t == tok.eos_token_id:
                    finish = "stop"
                    break
                if t == tok.pad_token_id:
                    continue
                toks.append(int(t))
                lps.append(float(lp))
            text = tok.decode(toks, skip_special_tokens=True)
            for s in sampling.stop:
                cut = text.find(s)
                if cut >= 0:
                    text, finish = text[:cut], "stop"
            out.append(
                Completion(
                    text=text,
                    token_ids=tuple(toks),
                    logprobs=tuple(lps),
                    prompt_token_ids=prompt_ids,
                    finish_reason=finish,  # type: ignore[arg-type]
                )
            )
        return out

    def continuation_logprob(self, prompt: str, continuation: str) -> float:
        """Mean per-token log-probability the model gives ``continuation`` after ``prompt``.

        A smooth function of the weights (unlike greedy text), handy for shaped rewards.
        """
        import torch

        p = self.tokenize(prompt)
        c = self.tokenize(continuation)
        if not p or not c:
            raise PolicyError("continuation_logprob: the prompt and continuation must be non-empty")
        ids = torch.tensor([p + c], device=self.device)  # [1, P+C]
        with torch.no_grad():
            logits = self.model(input_ids=ids).logits[0, len(p) - 1 : -1].float()  # [C, V]
        lp = torch.log_softmax(logits, dim=-1)
        target = torch.tensor(c, device=self.device)  # [C]
        return float(lp.gather(1, target[:, None]).mean())


class _ChosenLogprobs:
    """A logits processor, run last, that keeps only the log-probability of each chosen token.

    ``generate(output_scores=True)`` keeps every step's full-vocabulary scores until the end
    (steps × batch × vocab floats: 4 GB at 512 × 16 × 32k × fp32) although one number per step
    is needed. This sees each step's final scores, holds them until the next step shows which
    token was chosen, and keeps that token's ``log_softmax`` (what ``compute_transition_scores``
    with ``normalize_logits=True`` gives), so one step's scores are in memory at a time.
    """

    def __init__(self) -> None:
        self.pending: Any = None  # [B, V] log-softmax of the last step, choice not yet known
        self.chosen: list[Any] = []  # [B] per finished step

    def _take(self, input_ids: Any) -> None:
        tok = input_ids[:, -1:]  # the token the pending step chose
        self.chosen.append(self.pending.gather(-1, tok).squeeze(-1).float().cpu())
        self.pending = None

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        if self.pending is not None:
            self._take(input_ids)
        self.pending = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, sequences: Any) -> Any:
        """[B, T] log-probs of the generated tokens (T = sequence length past the prompt)."""
        import torch

        if self.pending is not None:
            self._take(sequences)
        if not self.chosen:
            return torch.zeros((sequences.shape[0], 0))
        return torch.stack(self.chosen, dim=1)
