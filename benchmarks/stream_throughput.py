"""Generated tokens/s of the ``hf`` policy's stream (continuous batching) against today's
chunked ``generate`` calls, at 8 and 64 sequences at once.

Both modes run in this one process on the same model, the same ``--prompts`` prompts (128 by
default) and sampling settings:

* ``chunked-C``: ``generate`` over consecutive chunks of C prompts (``batch_size`` C), what the
  eval does without ``eval.stream`` (chunk_tasks x samples sequences per call); each call
  waits for its longest sequence;
* ``stream-C``: one ``Policy.stream`` over all prompts with a live batch of C rows, a finished
  row replaced at once.

The model is a small random Llama (a few million parameters) made on the spot; its EOS logit
gets a bias so that sampled completions end after a geometric number of tokens (mean
``--mean-tokens``, cut at ``--max-tokens``), the spread of lengths a prover's proofs have. Each
mode runs ``--rounds`` times, the order alternating round by round; one torch thread by default.
Reported: tokens/s per mode (min/median/max) and the ratios stream/chunked at the same C and
stream-64/chunked-8 (what the eval gains by default chunking), per round.

    python benchmarks/stream_throughput.py                   # CPU
    python benchmarks/stream_throughput.py --device cuda     # GPU (benchmarks/gpu_check.sh)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent


def _texts(data: Path) -> list[str]:
    for root in (data, REPO / "tests" / "fixtures" / "data"):
        f = root / "minif2f.jsonl"
        if f.is_file():
            rows = [json.loads(x) for x in f.open(encoding="utf-8")]
            return [r["header"] + r["formal_statement"] for r in rows]
    raise SystemExit(f"no minif2f.jsonl under {data} or tests/fixtures/data")


def eos_bias(policy: Any, mean_tokens: float) -> None:
    """Give the model's EOS logit a bias so that a sampled completion ends after about
    ``mean_tokens`` tokens (geometric lengths): the lm head becomes a Linear with a bias."""
    import torch

    model, tok = policy.model, policy.tokenizer
    eos = int(tok.eos_token_id)
    model.generation_config.eos_token_id = eos  # the static path stops rows on it too
    head = model.lm_head
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    biased = biased.to(device=head.weight.device, dtype=head.weight.dtype)
    with torch.no_grad():
        biased.weight.copy_(head.weight)
        biased.bias.zero_()
        # Calibrate on real hidden states: find b with mean P(eos) = 1/mean_tokens.
        ids = tok(["theorem x (a b : ℕ) : a + b = b + a := by"], return_tensors="pt").input_ids
        h = model.model(input_ids=ids.to(head.weight.device)).last_hidden_state[0].float()
        logits = h @ head.weight.float().T
        want = 1.0 / mean_tokens
        lo, hi = -50.0, 50.0
        for _ in range(60):
            b = (lo + hi) / 2
            z = logits.clone()
            z[:, eos] += b
            p = torch.softmax(z, -1)[:, eos].mean().item()
            lo, hi = (b, hi) if p < want else (lo, b)
        biased.bias[eos] = (lo + hi) / 2
    model.lm_head = biased


async def _chunked(policy: Any, prompts: list[str], sampling: Any, c: int) -> int:
    tokens = 0
    for i in range(0, len(prompts), c):
        seed = sampling.seed + i
        got = await policy.generate(prompts[i : i + c], sampling.model_copy(update={"seed": seed}))
        tokens += sum(len(x.token_ids) for row in got for x in row)
    return tokens


async def _streamed(policy: Any, prompts: list[str], sampling: Any) -> int:
    from leanrl.policy import StreamRequest

    reqs = [
        StreamRequest(key=i, prompt=p, sampling=sampling, slot=i) for i, p in enumerate(prompts)
    ]
    tokens = 0
    async for sc in policy.stream(reqs):
        tokens += len(sc.completion.token_ids)
    return tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data"))
    ap.add_argument("--prompts", type=int, default=128)
    ap.add_argument("--mean-tokens", type=float, default=48.0)
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--concurrency", default="8,64", help="sequences at once, comma-separated")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--model", default=None, help="a model folder (default: a tiny random one)")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args()
    import torch

    from leanrl.policies import make_policy
    from leanrl.policy import PolicyConfig, SamplingConfig
    from leanrl.testing import make_tiny_model

    torch.set_num_threads(args.threads)
    texts = _texts(Path(args.data))
    model = args.model
    if model is None:
        tmp = Path(tempfile.mkdtemp(prefix="leanrl-stream-"))
        model = str(
            make_tiny_model(tmp / "model", texts, hidden_size=args.hidden, layers=args.layers)
        )
    prompts = [texts[i % len(texts)] for i in range(args.prompts)]
    cs = [int(x) for x in args.concurrency.split(",")]
    policy = make_policy(PolicyConfig(model=model, device=args.device, dtype="float32"))
    asyncio.run(policy.start())
    params = sum(p.numel() for p in policy.model.parameters())  # type: ignore[attr-defined]
    eos_bias(policy, args.mean_tokens)
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, max_tokens=args.max_tokens, seed=0)

    def run(mode: str, c: int) -> tuple[float, int]:
        policy.config = policy.config.model_copy(update={"batch_size": c})
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        if mode == "chunked":
            n = asyncio.run(_chunked(policy, prompts, sampling, c))
        else:
            n = asyncio.run(_streamed(policy, prompts, sampling))
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        return n / (time.perf_counter() - t0), n

    modes = [(m, c) for c in cs for m in ("chunked", "stream")]
    for _m, c in modes:  # warm-up: one-time costs land on no mode
        policy.config = policy.config.model_copy(update={"batch_size": c})
        asyncio.run(_streamed(policy, prompts[:c], sampling.model_copy(update={"max_tokens": 8})))
    rates: dict[tuple[str, int], list[float]] = {k: [] for k in modes}
    for r in range(args.rounds):
        order = modes if r % 2 == 0 else list(reversed(modes))
        for m, c in order:
            rate, n = run(m, c)
            rates[(m, c)].append(rate)
            print(f"round {r} {m}-{c}: {rate:8.0f} tokens/s ({n} tokens)", flush=True)
    print(
        f"{args.prompts} prompts, {params / 1e6:.1f}M-parameter model, lengths geometric (mean "
        f"{args.mean_tokens:.0f}, max {args.max_tokens}), {args.rounds} rounds, device "
        f"{args.device}, {args.threads} torch thread(s)"
    )
    out: dict[str, Any] = {"tokens_per_s": {}, "ratios": {}}
    for (m, c), xs in rates.items():
        out["tokens_per_s"][f"{m}-{c}"] = xs
        print(
            f"  {m}-{c}: tokens/s min {min(xs):.0f}, median {statistics.median(xs):.0f}, "
            f"max {max(xs):.0f}"
        )

    def ratio(name: str, a: list[float], b: list[float]) -> None:
        rs = [x / y for x, y in zip(a, b, strict=True) if y > 0 and not math.isnan(x)]
        out["ratios"][name] = rs
        print(
            f"  {name}: min {min(rs):.2f}x, median {statistics.median(rs):.2f}x, max {max(rs):.2f}x"
        )

    for c in cs:
        ratio(f"stream-{c} / chunked-{c}", rates[("stream", c)], rates[("chunked", c)])
    if len(cs) > 1:
        lo, hi = min(cs), max(cs)
        ratio(f"stream-{hi} / chunked-{lo}", rates[("stream", hi)], rates[("chunked", lo)])
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
