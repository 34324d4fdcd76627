"""A stand-in for ``vllm serve MODEL`` as an on-policy distillation teacher, for tests on machines
without vLLM or a GPU. Not vLLM, and never used outside tests.

It speaks what leanrl's server teacher uses: ``GET /v1/models``, ``POST /tokenize`` (vLLM's, at
the root: ``{"prompt"}`` -> ``{"tokens"}``) and ``POST /v1/completions`` with a token-id prompt
and ``prompt_logprobs`` (vLLM's field: per prompt position ``None`` first, then ``{token id:
{"logprob", "rank", "decoded_token"}}`` holding the prompt's own token), or with ``--echo-only``
the OpenAI form instead (``echo`` + ``logprobs``: ``choices[0].logprobs.token_logprobs``, the
prompt's first ``None``). The log-probs come from the full logits of a transformers model (the
reference computation, not leanrl's tiled one). ``--no-tokenize`` leaves ``/tokenize`` out;
``--tokenizer DIR`` answers it with another tokenizer (a teacher the check must refuse).

Run: ``python tests/_teacher_standin.py --model DIR --port PORT [--echo-only] [--no-tokenize]
[--tokenizer DIR]``.
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations (Request).

import argparse
import os
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def make_app(
    model_dir: str, name: str, echo_only: bool, tokenize: bool, tokenizer: str | None = None
) -> Any:
    import torch
    from fastapi import FastAPI, HTTPException, Request
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(model_dir)
    split = AutoTokenizer.from_pretrained(tokenizer) if tokenizer else tok  # what /tokenize uses
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    app = FastAPI()
    served = {"requests": 0}

    def logprobs(ids: list[int]) -> list[float]:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0].float()
        lp = torch.log_softmax(logits, dim=-1)  # position j predicts token j + 1
        return [float(lp[j - 1, t]) for j, t in enumerate(ids) if j > 0]

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": name, "object": "model", "root": model_dir}]}

    if tokenize:

        @app.post("/tokenize")
        async def tokenize_(request: Request) -> dict[str, Any]:
            body = await request.json()
            add = bool(body.get("add_special_tokens", True))
            ids = split(body["prompt"], add_special_tokens=add).input_ids
            return {"tokens": ids, "count": len(ids), "max_model_len": 2048}

    @app.post("/v1/completions")
    async def completions(request: Request) -> dict[str, Any]:
        body = await request.json()
        served["requests"] += 1
        ids = body.get("prompt")
        if not (isinstance(ids, list) and all(isinstance(x, int) for x in ids)):
            raise HTTPException(status_code=400, detail="the stand-in takes token-id prompts")
        if body.get("model") != name:
            raise HTTPException(status_code=404, detail=f"model {body.get('model')!r} not served")
        lps = logprobs(ids)
        choice: dict[str, Any] = {"index": 0, "text": "", "finish_reason": "length"}
        if body.get("prompt_logprobs") is not None and not echo_only:
            choice["prompt_logprobs"] = [None] + [
                {str(t): {"logprob": v, "rank": 1, "decoded_token": tok.decode([t])}}
                for t, v in zip(ids[1:], lps, strict=True)
            ]
        elif body.get("echo") and body.get("logprobs") is not None:
            choice["logprobs"] = {
                "tokens": [tok.decode([t]) for t in ids] + ["x"],
                "token_logprobs": [None, *lps, -1.0],
            }
        return {"id": "cmpl-standin", "object": "text_completion", "model": name,
                "choices": [choice]}  # fmt: skip

    @app.get("/standin/state")
    async def state() -> dict[str, Any]:
        return dict(served)

    return app


def main() -> None:
    import uvicorn

    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--name", default="teacher")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--echo-only", action="store_true")
    p.add_argument("--no-tokenize", action="store_true")
    p.add_argument("--tokenizer", default=None)
    a = p.parse_args()
    app = make_app(a.model, a.name, a.echo_only, not a.no_tokenize, a.tokenizer)
    uvicorn.run(app, host="127.0.0.1", port=a.port, log_level="warning")


if __name__ == "__main__":
    main()
