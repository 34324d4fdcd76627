"""Policy: the model side. Turns prompts into completions (with token ids and logprobs).

Backends: ``hf`` (transformers, the default), ``openai`` (any OpenAI-compatible server) and
``vllm`` (in-process, GPU, optional extra). Subclass :class:`Policy` and implement
:meth:`Policy.generate`; :meth:`Policy.stream` (every prompt at once, each completion yielded
when it is done) then works too, built on ``generate``, and a backend that can do better
overrides it.
"""

from __future__ import annotations

import abc
import asyncio
import time
from collections.abc import AsyncIterator, Callable, Hashable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ChatMessage",
    "Completion",
    "Policy",
    "PolicyConfig",
    "Prompt",
    "SamplingConfig",
    "StreamCompletion",
    "StreamRequest",
    "closing_stream",
    "sample_seed",
    "stream_replays_generate",
]


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
    usage_tokens: int | None = None
    """Generated tokens as the server's ``usage`` counted them, for a backend that returns
    neither token ids nor log-probs (an OpenAI-compatible server without them); None otherwise."""


@dataclass(frozen=True)
class StreamRequest:
    """One prompt for :meth:`Policy.stream`: ``sampling.n`` completions of it are wanted.

    Give ``prompt`` (text or chat) or ``prompt_ids`` (exact token ids, as for
    :meth:`Policy.generate_from_ids`), not both."""

    key: Hashable
    """The caller's name for the request, echoed in each :class:`StreamCompletion`."""
    sampling: SamplingConfig
    """How to sample it; ``sampling.n`` completions come back."""
    prompt: Prompt | None = None
    """The prompt as text or chat messages."""
    prompt_ids: tuple[int, ...] | None = None
    """The prompt as token ids (used as they are)."""
    slot: int = 0
    """The request's place among the requests that share ``sampling.seed`` (the eval runner
    gives a task's position in its chunk). Backends that seed each request on its own (``hf``,
    ``vllm``) seed from ``(seed, slot, sample)`` (:func:`sample_seed`), so a request's samples do
    not depend on what else is in flight or in which order requests finish."""

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.prompt_ids is None):
            raise ValueError(
                f"StreamRequest {self.key!r}: give exactly one of prompt (text or chat) and "
                "prompt_ids (token ids)"
            )


@dataclass(frozen=True)
class StreamCompletion:
    """One finished completion from :meth:`Policy.stream`."""

    key: Hashable
    """The :attr:`StreamRequest.key` of the request it answers."""
    sample: int
    """Which of the request's ``sampling.n`` samples it is (0-based)."""
    completion: Completion
    """The completion."""
    elapsed_s: float = 0.0
    """Seconds the backend spent on it: from its admission to its end where the backend
    generates per sequence (``hf``), else its ``generate`` call's time shared out."""


def sample_seed(seed: int, slot: int, sample: int) -> int:
    """The seed of sample ``sample`` of the request in ``slot`` under ``seed``: a fixed mix
    (splitmix64-style), so neighbouring slots and samples get unrelated random streams."""
    x = (seed * 0x9E3779B97F4A7C15 + slot * 0xBF58476D1CE4E5B9 + sample * 0x94D049BB133111EB) & (
        2**64 - 1
    )
    x ^= x >> 31
    x = (x * 0xBF58476D1CE4E5B9) & (2**64 - 1)
    x ^= x >> 27
    return x % (2**63 - 1)


class Policy(abc.ABC):
    """Base class of every policy backend. ``__init__`` does no work; :meth:`start` loads."""

    name: ClassVar[str] = ""
    """Backend id (``hf``, ``openai``, ``vllm``)."""

    on_completions: Callable[[int], None] | None = None
    """Set by a caller that shows progress (the eval runner): called with a number of
    completions each time that many finish inside a :meth:`generate` call, possibly from a
    worker thread. Backends call :meth:`completed`; one that never does only moves the caller's
    progress when ``generate`` returns."""

    on_tokens: Callable[[int], None] | None = None
    """Set by a caller that shows progress (the eval runner): called with a number of tokens
    as they are generated, possibly from a worker thread: every decoding step where the backend
    decodes itself (``hf``, ``vllm``'s stream), as each response arrives for a server
    (``openai``). Backends call :meth:`tokens_generated`."""

    def __init__(self, config: PolicyConfig) -> None:
        self.config = config

    def completed(self, n: int) -> None:
        """Report ``n`` finished completions to :attr:`on_completions` (if anyone listens)."""
        hook = self.on_completions
        if hook is not None and n:
            hook(n)

    def tokens_generated(self, n: int) -> None:
        """Report ``n`` newly generated tokens to :attr:`on_tokens` (if anyone listens)."""
        hook = self.on_tokens
        if hook is not None and n > 0:
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

    stream_group: ClassVar[int] = 64
    """The default :meth:`stream`: most requests per ``generate`` call."""

    def stream_replays(self, sampling: SamplingConfig) -> bool:
        """Whether :meth:`stream` yields, for requests with this sampling, the completions
        ``generate`` would give them, so that a run may stream without changing what it
        records (``eval.stream = "auto"`` streams only then). True here: the default
        :meth:`stream` calls ``generate`` on runs of requests with equal sampling. A backend
        whose stream seeds samples differently says False for sampled decoding."""
        return True

    async def stream(self, requests: Sequence[StreamRequest]) -> AsyncIterator[StreamCompletion]:
        """Every completion of every request, each yielded as soon as it is done (in no set
        order; match them by ``key`` and ``sample``).

        This default, for backends that do not stream, makes ``generate`` calls over runs of
        consecutive requests with equal sampling (at most :attr:`stream_group` requests each,
        two calls in flight so the next is ready when one ends) and yields each call's
        completions when it returns: the same samples as calling ``generate`` on those runs.
        ``hf``, ``openai`` and ``vllm`` override it to yield each completion when it ends.
        Breaking out of the loop (or cancelling) stops the work still queued."""
        groups: list[list[StreamRequest]] = []
        for r in requests:
            g = groups[-1] if groups else None
            if (
                g
                and len(g) < self.stream_group
                and g[0].sampling == r.sampling
                and (g[0].prompt_ids is None) == (r.prompt_ids is None)
            ):
                g.append(r)
            else:
                groups.append([r])
        queue: asyncio.Queue[list[StreamCompletion] | Exception] = asyncio.Queue()
        gate = asyncio.Semaphore(2)

        async def run(group: list[StreamRequest]) -> None:
            try:
                async with gate:
                    t0 = time.perf_counter()
                    sampling = group[0].sampling
                    if group[0].prompt_ids is not None:
                        ids = [r.prompt_ids or () for r in group]
                        got = await self.generate_from_ids(ids, sampling)
                    else:
                        got = await self.generate([r.prompt or "" for r in group], sampling)
                    each = (time.perf_counter() - t0) / max(1, sum(len(c) for c in got))
                    await queue.put(
                        [
                            StreamCompletion(r.key, s, c, each)
                            for r, comps in zip(group, got, strict=True)
                            for s, c in enumerate(comps)
                        ]
                    )
            except Exception as e:  # noqa: BLE001 - handed to the consumer, who re-raises
                await queue.put(e)

        jobs = [asyncio.ensure_future(run(g)) for g in groups]
        try:
            for _ in jobs:
                item = await queue.get()
                if isinstance(item, Exception):
                    raise item
                for sc in item:
                    yield sc
        finally:
            for j in jobs:
                j.cancel()

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


def _owner(cls: type, name: str) -> type:
    return next(c for c in cls.__mro__ if name in c.__dict__)


_T = TypeVar("_T")


@asynccontextmanager
async def closing_stream(stream: AsyncIterator[_T]) -> AsyncIterator[AsyncIterator[_T]]:
    """``async with closing_stream(policy.stream(requests)) as items``: the stream is closed
    (``aclose``, when it has one) as the block ends, also when it ends early or fails, so the
    policy stops its queued work and lets go of its lock at once instead of when the stream is
    garbage-collected."""
    try:
        yield stream
    finally:
        close = getattr(stream, "aclose", None)
        if close is not None:
            await close()


def stream_replays_generate(
    policy: Policy, sampling: SamplingConfig, *, native: bool = False, ids: bool = False
) -> bool:
    """Whether a caller may use ``policy.stream`` where it would call ``generate`` (or
    ``generate_from_ids``) with this sampling and record the same completions.

    It may when the policy says so (:meth:`Policy.stream_replays`) and no subclass changed
    ``generate`` (with ``ids``, for prompts given as token ids: ``generate_from_ids``) below
    the class whose ``stream`` it inherits (a wrapper that records, rewrites or syncs weights
    there would be skipped by that stream). ``native``: also require a ``stream`` of the backend's own; the base class's only
    runs ``generate`` on runs of requests, which gains nothing inside one call and splits a
    call of more than :attr:`Policy.stream_group` prompts."""
    cls = type(policy)
    streams = _owner(cls, "stream")
    if native and streams is Policy:
        return False
    for name in ("generate", "generate_from_ids") if ids else ("generate",):
        gen = _owner(cls, name)
        if streams is not Policy and gen is not streams and issubclass(gen, streams):
            return False
    return policy.stream_replays(sampling)
