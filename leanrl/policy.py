"""Policy: the model side. Turns prompts into completions (with token ids and logprobs).

Backends: ``hf`` (transformers, the default), ``openai`` (any OpenAI-compatible server) and
``vllm`` (in-process, GPU, optional extra). Subclass :class:`Policy` and implement
:meth:`Policy.generate`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ChatMessage", "Completion", "Policy", "PolicyConfig", "Prompt", "SamplingConfig"]


class ChatMessage(BaseModel):
    """One chat message (OpenAI format)."""

    model_config = ConfigDict(frozen=True)

    role: Literal["system", "user", "assistant", "tool"]
    """Who speaks."""
    content: str
    """What is said."""


Prompt = str | list[ChatMessage]
"""A text prompt (completion models) or a list of chat messages (chat models)."""


class SamplingConfig(BaseModel):
    """Sampling parameters, shared by every backend."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    n: int = Field(default=1, ge=1)
    """Completions per prompt."""
    temperature: float = Field(default=1.0, ge=0.0)
    """Softmax temperature; 0 means greedy decoding."""
    top_p: float = Field(default=0.95, gt=0.0, le=1.0)
    """Nucleus sampling: keep the smallest set of tokens with this much probability mass."""
    max_tokens: int = Field(default=2048, ge=1)
    """Most new tokens per completion (per turn in multi-turn harnesses)."""
    seed: int | None = 0
    """Sampling seed; the same seed and config give the same samples with ``hf``."""
    stop: list[str] = Field(default_factory=list)
    """Strings that end a completion (not included in the output)."""

    @classmethod
    def given_fields(cls, v: Any, *, all_fields: bool = False) -> Any:
        """For the ``mode="before"`` validator of a field typed as a subclass with other
        defaults (GRPO's, the held-out evaluation's): a SamplingConfig of another class given in
        Python becomes the fields it set (every field with ``all_fields``), so that the
        subclass's defaults fill the rest instead of SamplingConfig's."""
        if isinstance(v, SamplingConfig) and not isinstance(v, cls):
            return v.model_dump() if all_fields else v.model_dump(exclude_unset=True)
        return v


class PolicyConfig(BaseModel):
    """Which model generates, and how."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    model: str = ""
    """Local model folder or Hugging Face model id (``hf``, ``vllm``), or the served model name
    (``openai``)."""
    backend: Literal["hf", "openai", "vllm"] = "hf"
    """``hf``: transformers (CPU/GPU). ``openai``: an OpenAI-compatible server over HTTP.
    ``vllm``: in-process vLLM on a GPU (the ``vllm`` extra)."""
    chat: bool | None = None
    """Apply the tokenizer's chat template (chat models). ``None``: decide from the prompt
    format of the harness."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights dtype; ``auto`` is bfloat16 on GPU and float32 on CPU."""
    device: str = "auto"
    """``cpu``, ``cuda``, ``cuda:1``...; ``auto`` picks a GPU when there is one."""
    batch_size: int = Field(default=16, ge=1)
    """Most sequences generated at once by ``hf`` (bounds memory)."""
    base_url: str = "http://127.0.0.1:8000/v1"
    """``openai`` backend: the server's base URL."""
    api_key_env: str = "OPENAI_API_KEY"
    """``openai`` backend: the environment variable holding the API key (may be unset)."""
    max_concurrency: int = Field(default=32, ge=1)
    """``openai`` backend: requests in flight at once."""
    request_timeout_s: float = Field(default=600.0, gt=0)
    """``openai`` backend: per-request timeout."""
    max_retries: int = Field(default=5, ge=0)
    """``openai`` backend: retries with exponential backoff on transient failures."""
    gpu_memory_utilization: float = Field(default=0.85, gt=0, le=1)
    """``vllm`` backend: fraction of GPU memory the engine may take. When it is not set, GRPO's
    in-process engine takes 0.3 (it shares the GPU with training), and ES's vLLM scorer the
    largest share up to this that leaves room for its fp32 master and noise buffers."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Extra keyword arguments for the backend (``from_pretrained`` / ``LLM(...)``)."""


class Completion(BaseModel):
    """One completion of one prompt."""

    model_config = ConfigDict(frozen=True)

    text: str
    """The generated text (stop string excluded)."""
    token_ids: tuple[int, ...] = ()
    """Generated token ids."""
    logprobs: tuple[float, ...] | None = None
    """Log-probability of each generated token under the sampling distribution."""
    prompt_token_ids: tuple[int, ...] = ()
    """The prompt's token ids as the backend tokenized it."""
    finish_reason: Literal["stop", "length"] = "stop"
    """``length`` when the token limit cut it off."""


class Policy(abc.ABC):
    """Base class of every policy backend. ``__init__`` does no work; :meth:`start` loads."""

    name: ClassVar[str] = ""
    """Backend id (``hf``, ``openai``, ``vllm``)."""

    on_completions: Callable[[int], None] | None = None
    """Set by a caller that shows progress (the eval runner): called with a number of
    completions each time that many finish inside a :meth:`generate` call, possibly from a
    worker thread. Backends call :meth:`completed`; one that never does only moves the caller's
    progress when ``generate`` returns."""

    def __init__(self, config: PolicyConfig) -> None:
        self.config = config

    def completed(self, n: int) -> None:
        """Report ``n`` finished completions to :attr:`on_completions` (if anyone listens)."""
        hook = self.on_completions
        if hook is not None and n:
            hook(n)

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Load the model or open the connection. Idempotent."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Free the model or close the connection. Idempotent."""

    @abc.abstractmethod
    async def generate(
        self, prompts: Sequence[Prompt], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        """``sampling.n`` completions for each prompt, in order."""

    async def generate_from_ids(
        self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        """``sampling.n`` completions for each prompt given as token ids, in order (optional).

        The model conditions on exactly these ids (chat template, if any, already in them); each
        Completion's ``prompt_token_ids`` echoes them. Multi-turn harnesses use this to grow a
        context as ``prompt ids + completion ids + feedback ids``, so the ids a trainer replays
        are the ids the model saw (re-tokenizing the text would drift). Backends that cannot
        take ids (for example the ``openai`` backend) leave it unimplemented.
        """
        raise NotImplementedError(
            f"policy {self.name!r} cannot generate from token ids; use generate() with text "
            "prompts (multi-turn harnesses fall back to text contexts)"
        )

    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens (for environment feedback tokens)."""
        raise NotImplementedError(f"policy {self.name!r} cannot tokenize")

    async def __aenter__(self) -> Policy:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
