"""One ES iteration: serial full-rank members vs batched low-rank members (EGGROLL decoding).

A random Llama of a few million parameters (made here, with a BPE tokenizer trained on a few
lines: no download) scores a population of P members on T prompts, greedy, exactly
``--max-tokens`` new tokens per row (the end-of-sequence token is one the model cannot emit, so
every row runs to the limit and both modes generate the same number of tokens). The real
in-process scorer runs both modes:

- serial full-rank (``perturbation = "full"``, today's default): per member, write
  ``θ + σ·ε`` into the model, one generate call of T rows, restore;
- batched low-rank (``perturbation = "lowrank"``, ``scorer.members_per_batch = P``): one
  generate call of P·T rows through the unperturbed model, each layer adding its row group's
  ``σ/√r·(x·B)·Aᵀ`` (:mod:`leanrl.train.es.population`);
- plain: one generate call of the same P·T rows, no perturbation at all (the ceiling: batched
  inference).

Modes alternate within each repeat (order reversed on odd repeats); printed per population are
min/median/max of the iteration's wall seconds and generated tokens/s per mode, and the
serial/batched ratio of each repeat. Goal on the 2-core CPU: batched >= 4x serial at P = 32; on a
GPU: batched close to plain.

    python benchmarks/es_population.py                          # P in 8 16 32, CPU, fp32
    python benchmarks/es_population.py --device cuda --dtype bfloat16 --repeats 5
    python benchmarks/es_population.py --json runs/es_population.json   # rows also to a file
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from leanrl.environment import Environment
from leanrl.harness import Harness
from leanrl.policy import Policy, PolicyConfig, SamplingConfig
from leanrl.rollout import Rollout, Turn
from leanrl.runtime import Runtime
from leanrl.task import Task
from leanrl.taskset import Taskset
from leanrl.train.es.pipeline import PipelinedScorer, TorchEngine
from leanrl.train.es.population import LowRankPopulation
from leanrl.train.es.workers import IterationState, Member


class _GenerateOnly(Harness):
    """BENCHMARK ONLY: generate, no checking (reward 0): the iteration is all decoding."""

    name = "generate-only"

    async def run(
        self,
        tasks: Sequence[Task],
        policy: Policy,
        runtime: Runtime,
        sampling: SamplingConfig,
        taskset: Taskset,
    ) -> list[list[Rollout]]:
        comps = await policy.generate([t.formal_statement for t in tasks], sampling)
        return [
            [Rollout(task_id=t.id, prompt=t.formal_statement, turns=[Turn.from_completion(c[0])])]
            for t, c in zip(tasks, comps, strict=True)
        ]


class _Env(Environment):
    def make_harness(self) -> Harness:
        return _GenerateOnly(self.config.harness)


def make_model(folder: Path, hidden: int, layers: int, device: str, dtype: str) -> tuple[Any, Any]:
    """A random Llama + tokenizer whose end-of-sequence and padding token lie outside the
    model's vocabulary (so no row ever stops early)."""
    import torch

    from leanrl.testing import make_tiny_model
    from leanrl.train.es.policy import load_model

    texts = [f"theorem t{i} : {i} + {i} = {2 * i} := by\n  omega\n" for i in range(200)]
    texts += ["simp rfl norm_num linarith nlinarith ring_nf exact decide", "```lean4\n```"]
    path = make_tiny_model(folder, texts, vocab_size=1024, hidden_size=hidden, layers=layers)
    model, tok = load_model(str(path), dtype, device)
    tok.add_special_tokens({"eos_token": "<|never|>", "pad_token": "<|never|>"})
    assert tok.eos_token_id >= model.config.vocab_size
    model.generation_config.eos_token_id = None  # generate stops only at max_new_tokens
    torch.manual_seed(0)
    return model, tok


def prompts(tok: Any, n: int) -> list[str]:
    """``n`` distinct prompts of one token length (no padding: the pad token is not embeddable)."""
    cands = [f"theorem t{i} : {i} + {i} = {2 * i} := by" for i in range(10, 400)]
    by_len: dict[int, list[str]] = {}
    for c in cands:
        by_len.setdefault(len(tok(c, add_special_tokens=False)["input_ids"]), []).append(c)
    best = max(by_len.values(), key=len)
    if len(best) < n:
        raise SystemExit(f"only {len(best)} prompts of one length; ask for fewer --tasks")
    return best[:n]


async def one_iteration(mode: str, model: Any, tok: Any, state: IterationState, pop: int) -> float:
    from leanrl.train.es.policy import TorchPolicy
    from leanrl.train.es.weights import ESWeights

    policy = TorchPolicy(model, tok, PolicyConfig(model="bench", batch_size=10_000))
    members = [Member(seed, sign) for seed in range(1, pop // 2 + 1) for sign in (1, -1)]
    # set-up once per run in a trainer (the fp32 master, the module scan): not timed
    weights = ESWeights.from_model(model)
    if mode == "serial":
        scorer = PipelinedScorer(_Env(), TorchEngine(weights, policy), depth=1)
    elif mode == "batched":
        lr = LowRankPopulation(model, weights.params, rank=1)
        engine = TorchEngine(weights, policy, lr)
        scorer = PipelinedScorer(_Env(), engine, depth=1, members_per_batch=pop)
    t0 = time.perf_counter()
    if mode == "plain":
        texts = [t.formal_statement for t in state.tasks] * pop
        out = await asyncio.to_thread(policy.generate_rows, texts, state.sampling)
        tokens = sum(len(c.token_ids) for c in out)
    else:
        scores = await scorer.score(state, members)  # perturb/draw factors, generate, restore
        tokens = sum(s.tokens for s in scores)
    wall = time.perf_counter() - t0
    want = pop * len(state.tasks) * state.sampling.max_tokens
    assert tokens == want, f"{mode}: {tokens} tokens generated, expected {want}"
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--populations", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--tasks", type=int, default=4, help="prompts per member")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--sigma", type=float, default=1e-3)
    ap.add_argument("--json", type=Path, help="also write the rows to this file")
    a = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model, tok = make_model(Path(tmp), a.hidden, a.layers, a.device, a.dtype)
    n_params = sum(p.numel() for p in model.parameters())
    tasks = tuple(
        Task(name=f"t{i}", header="", formal_statement=p)
        for i, p in enumerate(prompts(tok, a.tasks))
    )
    sampling = SamplingConfig(temperature=0.0, max_tokens=a.max_tokens, seed=0)
    state = IterationState(1, tasks, sampling, a.sigma, ())
    print(
        f"model: Llama {n_params / 1e6:.1f}M params ({a.layers} layers, hidden {a.hidden}), "
        f"{a.device} {a.dtype}, {a.tasks} prompts x {a.max_tokens} tokens per member, "
        f"torch threads {torch.get_num_threads()}"
    )
    asyncio.run(one_iteration("batched", model, tok, state, 2))  # warm-up (allocator, kernels)
    out = []
    for pop in a.populations:
        runs: dict[str, list[float]] = {"serial": [], "batched": [], "plain": []}
        order = list(runs)
        for r in range(a.repeats):
            for mode in order if r % 2 == 0 else order[::-1]:  # alternate the order
                runs[mode].append(asyncio.run(one_iteration(mode, model, tok, state, pop)))
        tokens = pop * a.tasks * a.max_tokens

        def mmm(xs: list[float]) -> list[float]:
            return [round(min(xs), 3), round(statistics.median(xs), 3), round(max(xs), 3)]

        row: dict[str, Any] = {"population": pop, "tokens_per_iteration": tokens}
        for mode, walls in runs.items():
            row[f"{mode}_wall_s"] = mmm(walls)
            row[f"{mode}_tok_s"] = mmm([tokens / w for w in walls])
        row["serial_over_batched"] = mmm(
            [s / b for s, b in zip(runs["serial"], runs["batched"], strict=True)]
        )
        row["batched_over_plain"] = mmm(
            [b / p for b, p in zip(runs["batched"], runs["plain"], strict=True)]
        )
        out.append(row)
        print(json.dumps(row), flush=True)
    if a.json:
        a.json.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    at32 = [r for r in out if r["population"] == 32]
    if at32:
        ok = at32[0]["serial_over_batched"][1] >= 4.0
        print(f"goal (median serial/batched >= 4 at population 32): {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
