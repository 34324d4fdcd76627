"""GRPO with generation in a separate ``vllm serve`` process, weights pushed after every step.

The server is an ordinary vLLM OpenAI-compatible server, on other GPUs or another machine, with
tensor parallelism if wanted. Two things make it trainable:

- ``--worker-extension-cls leanrl.train.vllm_server.WeightReceiver`` mixes :class:`WeightReceiver`
  into every vLLM GPU worker (leanrl must be installed where the server runs);
- ``VLLM_SERVER_DEV_MODE=1`` turns on vLLM's ``POST /collective_rpc`` (call a method on every
  worker) and ``POST /reset_prefix_cache``.

The protocol, trainer (rank 0 of the trainer's ranks) on the left, each vLLM worker on the right.
Arguments travel as one JSON string (``/collective_rpc`` takes strings only); tensors travel over
a process group of their own (``nccl`` between GPUs, ``gloo`` over TCP) or as a safetensors file
in a folder both sides see (``disk``)::

    POST /collective_rpc leanrl_weights_ping                  -> [worker rank, ...]  (N workers)
    POST /collective_rpc leanrl_weights_init {transport, host, port, world_size: 1+N}
         ... while the trainer opens the group as rank 0; worker k joins as rank 1+k
    per step, per chunk of tensors (bounded bytes):
    POST /collective_rpc leanrl_weights_update {version, tensors: [[name, dtype, shape], ...]}
         ... while the trainer broadcasts each tensor from rank 0, in that order;
         every worker loads them with the model's own ``load_weights`` (fused and tensor-parallel
         layouts are the model's business) and answers {tensors, checksum}
    (disk: the trainer writes the chunk to DIR/leanrl-weights-vV-C.safetensors first and calls
     leanrl_weights_load {path}; nothing is broadcast)
    POST /reset_prefix_cache                                    (KV computed with old weights)
    POST /collective_rpc leanrl_weights_close                   (at the end)

The trainer compares every worker's checksum of what it received with its own of what it sent,
so a transfer that lost or corrupted a tensor fails the step instead of training on wrong
samples. Tensor names are the Hugging Face names of the trained model (with LoRA: the merged
weights under the base model's names).

Generation goes to the same server's OpenAI endpoint (:class:`VLLMServerPolicy`, the ``openai``
backend asking for token ids), so ``leanrl eval --policy.backend openai --policy.base_url
http://HOST:8000/v1`` evaluates the model being trained on the very same server.

Importing this module imports neither torch nor vLLM.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from leanrl.errors import ConfigError, PolicyError
from leanrl.policies.openai import OpenAIPolicy, _completion
from leanrl.policy import Completion, PolicyConfig, SamplingConfig

__all__ = ["VLLMServerConfig", "VLLMServerPolicy", "WeightReceiver", "WeightSync", "make_group"]

#: Tensor dtypes that may be sent, by their torch names (``torch.<name>``).
_DTYPES = ("float32", "bfloat16", "float16", "float64", "int64", "int32", "int8", "uint8", "bool")


class VLLMServerConfig(BaseModel):
    """Generation in a separate ``vllm serve`` process (``policy.backend = "openai"``), with the
    trained weights pushed to it after every step. See ``docs/training-grpo.md``."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    transport: Literal["off", "nccl", "gloo", "disk"] = "off"
    """How weights reach the server. ``nccl``: a NCCL group between the trainer's GPU and every
    server GPU (fastest; needs GPUs on both sides and a network path for NCCL). ``gloo``: the
    same over TCP from CPU memory (no GPU needed on the trainer; slower). ``disk``: a safetensors
    file in ``disk_dir``, a folder both machines see at the same path. ``off``: no server mode."""
    url: str | None = None
    """The server's root URL (``http://HOST:8000``). Unset: ``policy.base_url`` without its
    ``/v1``."""
    group_host: str = "127.0.0.1"
    """``nccl``/``gloo``: the address of the trainer (rank 0) that the server's workers connect
    to; set it to the trainer machine's address when the server runs elsewhere."""
    group_port: int = Field(default=51216, ge=1, le=65535)
    """``nccl``/``gloo``: the TCP port the trainer listens on for the weight group."""
    disk_dir: Path | None = None
    """``disk``: the shared folder the weight files are written to (and removed from)."""
    chunk_mb: int = Field(default=512, ge=1)
    """Most megabytes of tensors sent per update call (bounds the trainer's extra memory)."""
    timeout_s: float = Field(default=600.0, gt=0)
    """Seconds one update (or the group set-up) may take before the step fails."""

    @property
    def enabled(self) -> bool:
        return self.transport != "off"

    def control_url(self, base_url: str) -> str:
        """The server root: ``url``, or ``base_url`` with a trailing ``/v1`` removed."""
        if self.url:
            return self.url.rstrip("/")
        root = base_url.rstrip("/")
        return root[: -len("/v1")] if root.endswith("/v1") else root


# -- the group both sides join ---------------------------------------------------------------------


def make_group(
    transport: str, host: str, port: int, rank: int, world: int, timeout_s: float
) -> Any:
    """A process group of its own (not torch.distributed's default one): a TCPStore at
    ``host:port`` (served by rank 0) and a gloo or NCCL backend over it. Both vLLM's workers
    (which already belong to vLLM's own group) and a trainer (which may belong to its ranks'
    group) can join one."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    tcp = dist.TCPStore(host, port, world, is_master=rank == 0, timeout=timeout)
    store = dist.PrefixStore("leanrl-weights", tcp)
    if transport == "gloo":
        return dist.ProcessGroupGloo(store, rank, world, timeout)
    if transport == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, world, opts)
    raise ConfigError(f"unknown weight transport {transport!r}: use 'nccl', 'gloo' or 'disk'")


def _broadcast(group: Any, tensor: Any) -> None:
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    group.broadcast([tensor], opts).wait()


def _wire_device(transport: str, t: Any) -> Any:
    """Where a tensor must be to be broadcast: a GPU for NCCL, the CPU for gloo."""
    import torch

    if transport != "nccl":
        return torch.device("cpu")
    return t.device if t.is_cuda else torch.device("cuda", torch.cuda.current_device())


def checksum(tensors: Iterable[Any]) -> float:
    """A float64 sum over every element of every tensor, each weighted by its position in the
    sequence (so a swapped pair changes it); the two sides compute it on the same values."""
    import torch

    total = 0.0
    for i, t in enumerate(tensors):
        total += (i + 1) * float(t.detach().to(torch.float64).sum())
    return total


# -- the server side -------------------------------------------------------------------------------


class WeightReceiver:
    """Mixed into every vLLM GPU worker (``--worker-extension-cls``); called by ``/collective_rpc``.

    Each method takes one JSON string and returns JSON-able data, as ``/collective_rpc`` requires.
    ``model_runner.model.load_weights`` is the model's own loader, the one vLLM uses at start-up.
    """

    model_runner: Any  # provided by the vLLM worker this class is mixed into

    def _leanrl_rank(self) -> int:
        rank = getattr(self, "rank", None)
        return rank if isinstance(rank, int) else 0

    def _leanrl_device(self) -> Any:
        return next(self.model_runner.model.parameters()).device

    def leanrl_weights_ping(self, spec: str = "{}") -> int:
        """This worker's rank (the trainer counts the answers to size the group)."""
        return self._leanrl_rank()

    def leanrl_weights_init(self, spec: str) -> int:
        """Join the weight group as rank ``1 + worker rank``; returns that rank."""
        s = json.loads(spec)
        rank = 1 + self._leanrl_rank()
        self._leanrl_transport = s["transport"]
        self._leanrl_group = make_group(
            s["transport"], s["host"], int(s["port"]), rank, int(s["world_size"]), s["timeout_s"]
        )
        return rank

    def leanrl_weights_update(self, spec: str) -> dict[str, Any]:
        """Receive the listed tensors by broadcast from the trainer and load them."""
        import torch

        meta = json.loads(spec)["tensors"]
        device = self._leanrl_device()
        on = device if self._leanrl_transport == "nccl" else torch.device("cpu")
        got: list[tuple[str, Any]] = []
        for name, dtype, shape in meta:
            if dtype not in _DTYPES:
                raise ValueError(f"tensor {name!r}: unsupported dtype {dtype!r}")
            t = torch.empty(tuple(shape), dtype=getattr(torch, dtype), device=on)
            _broadcast(self._leanrl_group, t)
            got.append((name, t))
        return self._leanrl_load(got, device)

    def leanrl_weights_load(self, spec: str) -> dict[str, Any]:
        """Load the tensors of a safetensors file (``disk`` transport)."""
        from safetensors.torch import load_file

        path = json.loads(spec)["path"]
        names = json.loads(spec)["names"]
        tensors = load_file(path)
        return self._leanrl_load([(n, tensors[n]) for n in names], self._leanrl_device())

    def _leanrl_load(self, got: list[tuple[str, Any]], device: Any) -> dict[str, Any]:
        total = checksum(t for _, t in got)
        self.model_runner.model.load_weights(weights=((n, t.to(device)) for n, t in got))
        return {"tensors": len(got), "checksum": total}

    def leanrl_weights_close(self, spec: str = "{}") -> bool:
        """Leave the weight group."""
        self._leanrl_group = None
        return True


# -- the trainer side ------------------------------------------------------------------------------


class WeightSync:
    """The trainer's end of the protocol (rank 0 only). ``connect`` once, ``push`` per step,
    ``close`` at the end. Blocking (the trainer calls it from a worker thread)."""

    def __init__(self, config: VLLMServerConfig, base_url: str) -> None:
        self.config = config
        self.url = config.control_url(base_url)
        self.workers = 0
        self.group: Any = None
        self.pushes = 0
        self._client: Any = None

    def _http(self) -> Any:
        if self._client is None:
            import httpx

            self._client = httpx.Client(timeout=httpx.Timeout(self.config.timeout_s, connect=10))
        return self._client

    def _post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        import httpx

        try:
            r = self._http().post(f"{self.url}/{path}", json=body or {})
        except httpx.TransportError as e:
            raise PolicyError(
                f"cannot reach the vLLM server at {self.url} ({type(e).__name__}: {e}); start it "
                "with `VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --worker-extension-cls "
                "leanrl.train.vllm_server.WeightReceiver`, or fix vllm_server.url"
            ) from e
        if r.status_code == 404:
            raise PolicyError(
                f"{self.url}/{path} does not exist: start the server with VLLM_SERVER_DEV_MODE=1 "
                "(it enables /collective_rpc and /reset_prefix_cache)"
            )
        if r.status_code != 200:
            raise PolicyError(f"{self.url}/{path} failed: HTTP {r.status_code}: {r.text[:500]}")
        return r.json() if r.content else None

    def _rpc(self, method: str, spec: dict[str, Any] | None = None) -> list[Any]:
        body = {
            "method": method,
            "args": [json.dumps(spec or {})],
            "timeout": self.config.timeout_s,
        }
        out = self._post("collective_rpc", body)
        results = out.get("results") if isinstance(out, dict) else None
        if not isinstance(results, list) or not results:
            raise PolicyError(f"{self.url}/collective_rpc {method}: unexpected answer {out!r}")
        if any(isinstance(x, str) and "has no attribute" in x for x in results):
            raise PolicyError(
                f"the server's workers lack {method}: start it with --worker-extension-cls "
                "leanrl.train.vllm_server.WeightReceiver (and leanrl installed next to vLLM)"
            )
        return results

    def connect(self) -> None:
        """Count the server's workers and (``nccl``/``gloo``) open the weight group with them."""
        cfg = self.config
        if cfg.transport == "nccl":
            import torch

            if not torch.cuda.is_available():
                raise ConfigError(
                    "vllm_server.transport = 'nccl' sends from the trainer's GPU, but this "
                    "process has none: use transport 'gloo' (TCP from CPU memory) or 'disk'"
                )
        self.workers = len(self._rpc("leanrl_weights_ping"))
        if cfg.transport == "disk":
            if cfg.disk_dir is None:
                raise ConfigError("vllm_server.transport = 'disk' needs vllm_server.disk_dir")
            Path(cfg.disk_dir).mkdir(parents=True, exist_ok=True)
            return
        spec = {
            "transport": cfg.transport,
            "host": cfg.group_host,
            "port": cfg.group_port,
            "world_size": 1 + self.workers,
            "timeout_s": cfg.timeout_s,
        }
        # The workers block in the group's rendezvous until rank 0 (this process) joins too.
        with ThreadPoolExecutor(1) as pool:
            joined = pool.submit(self._rpc, "leanrl_weights_init", spec)
            self.group = make_group(
                cfg.transport, cfg.group_host, cfg.group_port, 0, 1 + self.workers, cfg.timeout_s
            )
            ranks = joined.result()
        if sorted(ranks) != list(range(1, 1 + self.workers)):
            raise PolicyError(f"the server's workers joined the weight group as ranks {ranks}")

    def push(self, named: Iterable[tuple[str, Any]], version: int) -> int:
        """Send every ``(name, tensor)`` to the server in chunks; returns the tensors sent."""
        limit = self.config.chunk_mb * 2**20
        chunk: list[tuple[str, Any]] = []
        size = sent = 0
        for name, t in named:
            chunk.append((name, t.detach()))
            size += t.numel() * t.element_size()
            if size >= limit:
                sent += self._send(chunk, version, sent)
                chunk, size = [], 0
        if chunk:
            sent += self._send(chunk, version, sent)
        self._post("reset_prefix_cache")
        self.pushes += 1
        return sent

    def _send(self, chunk: Sequence[tuple[str, Any]], version: int, offset: int) -> int:

        cfg = self.config
        for name, t in chunk:
            dtype = str(t.dtype).removeprefix("torch.")
            if dtype not in _DTYPES:
                raise PolicyError(f"tensor {name!r} has dtype {dtype}, which cannot be sent")
        want = checksum(t for _, t in chunk)
        if cfg.transport == "disk":
            from safetensors.torch import save_file

            assert cfg.disk_dir is not None
            path = Path(cfg.disk_dir) / f"leanrl-weights-v{version}-{offset}.safetensors"
            tmp = path.with_suffix(".tmp")
            save_file({n: t.contiguous().cpu() for n, t in chunk}, str(tmp))
            os.replace(tmp, path)  # a worker never reads a half-written file
            try:
                results = self._rpc(
                    "leanrl_weights_load", {"path": str(path), "names": [n for n, _ in chunk]}
                )
            finally:
                path.unlink(missing_ok=True)
        else:
            meta = [[n, str(t.dtype).removeprefix("torch."), list(t.shape)] for n, t in chunk]
            with ThreadPoolExecutor(1) as pool:
                answer = pool.submit(
                    self._rpc, "leanrl_weights_update", {"version": version, "tensors": meta}
                )
                try:
                    for _, t in chunk:
                        dev = _wire_device(cfg.transport, t)
                        _broadcast(self.group, t.contiguous().to(dev))
                finally:
                    results = answer.result()
        for k, res in enumerate(results):
            if not isinstance(res, dict) or res.get("tensors") != len(chunk):
                raise PolicyError(f"server worker {k} did not load the weights: {res!r}")
            got = float(res["checksum"])
            if abs(got - want) > 1e-6 * max(1.0, abs(want)):
                raise PolicyError(
                    f"server worker {k} received different weights (checksum {got} != {want}): "
                    "the transfer corrupted them; the step is not trained on them"
                )
        return len(chunk)

    def close(self) -> None:
        if self.group is not None:
            try:
                self._rpc("leanrl_weights_close")
            except PolicyError:
                pass  # the server may already be gone; nothing to release on this side
            self.group = None
        if self._client is not None:
            self._client.close()
            self._client = None


# -- generation ------------------------------------------------------------------------------------


class VLLMServerPolicy(OpenAIPolicy):
    """The ``openai`` backend against a vLLM server, asking for token ids (``return_token_ids``)
    so that GRPO trains on exactly the tokens the server sampled, and generating from token ids
    (multi-turn harnesses) through ``/completions`` with a token-id prompt."""

    name = "vllm-server"

    def __init__(self, config: PolicyConfig) -> None:
        opts = {"return_token_ids": True, **config.options}
        super().__init__(config.model_copy(update={"options": opts}))

    async def generate_from_ids(
        self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        import asyncio

        await self.start()

        async def one(ids: Sequence[int]) -> list[Completion]:
            body: dict[str, Any] = {
                "model": self.config.model,
                "prompt": [int(x) for x in ids],
                "n": sampling.n,
                "temperature": sampling.temperature,
                "top_p": sampling.top_p,
                "max_tokens": sampling.max_tokens,
                "logprobs": 0,
                **({"seed": sampling.seed} if sampling.seed is not None else {}),
                **({"stop": list(sampling.stop)} if sampling.stop else {}),
                **self.config.options,
            }
            data = await self._post("completions", body)
            choices = sorted(data.get("choices", []), key=lambda c: c.get("index", 0))
            if len(choices) != sampling.n:
                raise PolicyError(
                    f"{self.config.base_url}/completions returned {len(choices)} choices for "
                    f"n={sampling.n}"
                )
            out = [_completion(c, False) for c in choices]
            # the prompt is what we sent, whatever the server echoes
            return [c.model_copy(update={"prompt_token_ids": tuple(ids)}) for c in out]

        return list(await asyncio.gather(*(one(p) for p in prompt_ids)))


def check_sync_config(config: VLLMServerConfig, policy: PolicyConfig) -> None:
    """Clear errors for a server-mode config that cannot work (before anything loads)."""
    if not config.enabled:
        return
    if policy.backend != "openai":
        raise ConfigError(
            f"vllm_server.transport = {config.transport!r} trains against a separate vLLM "
            f"server, which generation reaches through policy.backend = 'openai' (got "
            f"{policy.backend!r}); set --policy.backend openai --policy.base_url "
            "http://HOST:8000/v1"
        )
    if config.transport == "disk" and config.disk_dir is None:
        raise ConfigError(
            "vllm_server.transport = 'disk' needs vllm_server.disk_dir: a folder the trainer "
            "and the server both see at the same path"
        )
