"""vLLM for training: generate in a running engine and push new weights into it after each step.

The engine is the ``vllm`` policy backend (:class:`leanrl.policies.vllm.VLLMPolicy`) with three
settings a trainer needs:

- ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` so the engine core lives in this process and its model
  object is reachable: the push is an in-place ``model.load_weights(...)`` on the live engine, no
  restart and no copy through a file or socket.
- ``logprobs_mode="processed_logprobs"``: the reported log-probs are those of the distribution
  actually sampled from (after temperature), which is what the importance ratio needs.
- the prefix cache is reset after every push: cached KV blocks were computed with the old weights.

vLLM is imported lazily; this module imports without it. Tests are marked ``gpu``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from leanrl.errors import PolicyError
from leanrl.policies.vllm import VLLMPolicy

__all__ = ["VLLMTrainPolicy", "engine_model"]


def engine_model(llm: Any) -> Any:
    """The ``nn.Module`` inside an in-process vLLM engine (V1 uni-process, or the V0 layout)."""
    executor = llm.llm_engine.model_executor
    worker = executor.driver_worker
    worker = getattr(worker, "worker", worker)  # V1 wraps the GPU worker in a WorkerWrapper
    return worker.model_runner.model


class VLLMTrainPolicy(VLLMPolicy):
    """The ``vllm`` backend plus :meth:`push_weights`. Generation and pushes never overlap (the
    trainer pushes only between generation calls)."""

    name = "vllm"

    async def start(self) -> None:
        if self._llm is not None:
            return
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] != "0":
            raise PolicyError(
                "GRPO with vLLM pushes weights into the engine in this process: unset "
                "VLLM_ENABLE_V1_MULTIPROCESSING (or set it to 0)"
            )
        opts = dict(self.config.options)
        opts.setdefault("logprobs_mode", "processed_logprobs")
        opts.setdefault("enable_prefix_caching", True)
        # vLLM's own "auto" serves fp32 checkpoints (what the trainer saves) in fp16; bf16 is
        # what PolicyConfig promises for "auto" on a GPU, and what training autocasts to.
        dtype = "bfloat16" if self.config.dtype == "auto" else self.config.dtype
        self.config = self.config.model_copy(update={"options": opts, "dtype": dtype})
        await super().start()

    def push_weights(self, named_params: Iterator[tuple[str, Any]]) -> int:
        """Load ``(name, tensor)`` pairs (Hugging Face names) into the live engine, in place.

        Returns the number of tensors pushed. The engine's prefix cache is reset afterwards.
        """
        if self._llm is None:
            raise PolicyError("push_weights before start(): the vLLM engine is not running")
        model = engine_model(self._llm)
        count = 0

        def counted() -> Iterator[tuple[str, Any]]:
            nonlocal count
            for name, t in named_params:
                count += 1
                yield name, t

        model.load_weights(counted())
        self._llm.reset_prefix_cache()
        return count
