"""A stand-in for ``VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --worker-extension-cls
leanrl.train.vllm_server.WeightReceiver``, for tests on machines without vLLM or a GPU.

It speaks the same HTTP as vLLM for what leanrl uses: ``GET /v1/models``, ``POST /v1/completions``
(text or token-id prompts, ``n``, ``logprobs``, ``return_token_ids``), ``POST /collective_rpc``
(``{"method", "args", "timeout"}`` -> ``{"results": [one per worker]}``) and ``POST
/reset_prefix_cache``. Its "workers" are ``--workers`` copies of a transformers model, each with
leanrl's real :class:`~leanrl.train.vllm_server.WeightReceiver` mixed in and a ``load_weights``
like vLLM models have; the weight group is real (gloo over loopback). Completions are sampled
from worker 0's model, so what the trainer pushes is what generates.

``GET /standin/state`` (not vLLM's) reports the number of prefix-cache resets and a checksum of
each worker's weights, for the tests to compare with the trainer's.

Run: ``python tests/_vllm_standin.py --model DIR --port PORT [--workers 2] [--no-dev-mode]``.
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations (Request).

import argparse
import asyncio
import os
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


class _Model:
    """What vLLM's ``model_runner.model`` offers the receiver: parameters and load_weights."""

    def __init__(self, hf: Any) -> None:
        self.hf = hf
        self.loaded = 0

    def parameters(self) -> Any:
        return self.hf.parameters()

    def load_weights(self, weights: Any) -> set[str]:
        import torch

        params = dict(self.hf.named_parameters())
        done = set()
        with torch.no_grad():
            for name, t in weights:
                if name not in params:
                    raise KeyError(f"no parameter {name!r} in the served model")
                params[name].copy_(t)
                done.add(name)
        self.loaded += len(done)
        return done


def make_app(model_dir: str, workers: int, dev_mode: bool) -> Any:
    import torch
    from fastapi import FastAPI, HTTPException, Request
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from leanrl.policy import PolicyConfig, SamplingConfig
    from leanrl.train.hf_policy import TrainPolicy
    from leanrl.train.vllm_server import WeightReceiver, checksum

    class Worker(WeightReceiver):
        def __init__(self, rank: int) -> None:
            self.rank = rank
            hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
            self.model_runner = type("Runner", (), {})()
            self.model_runner.model = _Model(hf)

    tok = AutoTokenizer.from_pretrained(model_dir)
    pool = [Worker(r) for r in range(workers)]
    policy = TrainPolicy(PolicyConfig(model=model_dir), pool[0].model_runner.model.hf, tok)
    state = {"resets": 0}
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_dir, "object": "model"}]}

    @app.post("/v1/completions")
    async def completions(request: Request) -> dict[str, Any]:
        body = await request.json()
        prompt = body["prompt"]
        ids = (
            list(prompt)
            if isinstance(prompt, list)
            else tok.encode(prompt, add_special_tokens=False)
        )
        sampling = SamplingConfig(
            n=int(body.get("n", 1)),
            temperature=float(body.get("temperature", 1.0)),
            top_p=float(body.get("top_p", 1.0)),
            max_tokens=int(body.get("max_tokens", 16)),
            seed=body.get("seed"),
            stop=list(body.get("stop") or []),
        )
        [comps] = await asyncio.to_thread(policy.generate_ids_sync, [ids], sampling)
        choices = []
        for i, c in enumerate(comps):
            choice: dict[str, Any] = {
                "index": i,
                "text": c.text,
                "finish_reason": c.finish_reason,
                "logprobs": {"token_logprobs": list(c.logprobs or ())},
            }
            if body.get("return_token_ids"):
                choice["token_ids"] = list(c.token_ids)
                choice["prompt_token_ids"] = list(ids)
            choices.append(choice)
        return {"object": "text_completion", "model": body.get("model"), "choices": choices}

    if dev_mode:

        @app.post("/collective_rpc")
        async def collective_rpc(request: Request) -> dict[str, Any]:
            body = await request.json()
            method = body.get("method")
            if method is None:
                raise HTTPException(400, "Missing 'method' in request body")
            args = body.get("args", [])
            if not all(hasattr(w, method) for w in pool):
                raise HTTPException(500, f"'Worker' object has no attribute {method!r}")
            # every worker at once, as vLLM's executor does: they meet in the weight group
            results = await asyncio.gather(
                *(asyncio.to_thread(getattr(w, method), *args) for w in pool)
            )
            return {"results": list(results)}

        @app.post("/reset_prefix_cache")
        async def reset_prefix_cache() -> dict[str, Any]:
            state["resets"] += 1
            return {}

    @app.get("/standin/state")
    async def standin_state() -> dict[str, Any]:
        sums = [checksum(p for _, p in w.model_runner.model.hf.named_parameters()) for w in pool]
        loaded = [w.model_runner.model.loaded for w in pool]
        return {"resets": state["resets"], "checksums": sums, "loaded": loaded}

    return app


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-dev-mode", action="store_true")
    a = ap.parse_args()
    app = make_app(a.model, a.workers, not a.no_dev_mode)
    uvicorn.run(app, host="127.0.0.1", port=a.port, log_level="warning")


if __name__ == "__main__":
    main()
