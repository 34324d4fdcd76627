"""A stand-in for an in-process ``vllm.LLM``'s engine (``llm.llm_engine``), for the glue code of
the streams that step it (:func:`leanrl.policies.vllm.stream_llm`): it finishes one request per
step, the last added first, and answers each with ``"{prompt}/{sample}/{seed}"`` (plus
``"/{top_p}"`` when asked). Real vLLM is the GPU check."""

from __future__ import annotations

import time
import types
from typing import Any


class Params:
    """``vllm.SamplingParams``: keeps what it is given."""

    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


class Engine:
    def __init__(self, step_s: float = 0.05, show_top_p: bool = False) -> None:
        self.queue: list[tuple[str, Any, Any]] = []
        self.aborted: list[str] = []
        self.step_s, self.show_top_p = step_s, show_top_p

    def add_request(self, rid: str, prompt: Any, params: Any) -> None:
        self.queue.append((rid, prompt, params))

    def has_unfinished_requests(self) -> bool:
        return bool(self.queue)

    def step(self) -> list[Any]:
        time.sleep(self.step_s)  # a GPU step: the consumer may stop meanwhile
        rid, prompt, params = self.queue.pop()
        tail = f"/{params.top_p}" if self.show_top_p else ""
        outs = [
            types.SimpleNamespace(text=f"{prompt}/{i}/{params.seed}{tail}", token_ids=[5],
                                  logprobs=None, finish_reason="stop")
            for i in range(params.n)
        ]  # fmt: skip
        return [
            types.SimpleNamespace(request_id=rid, finished=True, outputs=outs, prompt_token_ids=[1])
        ]

    def abort_request(self, ids: list[str]) -> None:
        self.aborted += ids
