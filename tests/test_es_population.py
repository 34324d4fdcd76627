"""Batched population decoding (low-rank ES): one generate call for many members gives each
member the tokens its materialised weights give (fp32: identical; bf16: close logits), for Llama
(tied embedding + lm_head) and GPT-2 (Conv1D, position embeddings); the batched scorer groups
members into calls, pipelines batches with checks and matches the one-member-per-call trainer."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from leanrl.errors import ConfigError  # noqa: E402
from leanrl.policy import Completion, PolicyConfig, Prompt, SamplingConfig  # noqa: E402
from leanrl.runtime import run_sync  # noqa: E402
from leanrl.train.es.lowrank import factors, lowrank_delta  # noqa: E402
from leanrl.train.es.policy import TorchPolicy, load_model  # noqa: E402
from leanrl.train.es.population import (  # noqa: E402
    LowRankPopulation,
    RowGroup,
    generate_members,
)

RANK = 2
MEMBERS = [(3, 0.05), (3, -0.05), (7, 0.05), (9, -0.05)]
PROMPTS = ["theorem a : 1 + 1 = 2 := by", "theorem b (x : Nat) : x = x", "simp"]
GREEDY = SamplingConfig(temperature=0.0, max_tokens=10)


@contextmanager
def materialised(model: Any, seed: int, scale: float) -> Iterator[None]:
    """The per-member path, written directly: every 2-D parameter ``θ + scale·A·Bᵀ/√r``
    (computed in fp32, cast once), 1-D ones left alone; θ written back after."""
    params = dict(model.named_parameters())
    saved = {k: p.detach().clone() for k, p in params.items()}
    with torch.no_grad():
        for k, p in params.items():
            if p.dim() == 2:
                delta = lowrank_delta(seed, k, tuple(p.shape), RANK, p.device)
                p.copy_(saved[k].float() + scale * delta)
    try:
        yield
    finally:
        with torch.no_grad():
            for k, p in params.items():
                p.copy_(saved[k])


def _llama(tiny_model_dir: Path, dtype: str = "float32") -> tuple[Any, Any]:
    return load_model(str(tiny_model_dir), dtype, "cpu")


def _gpt2(tiny_model_dir: Path) -> tuple[Any, Any]:
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    torch.manual_seed(1)
    ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}
    cfg = GPT2Config(vocab_size=len(tok), n_positions=128, n_embd=48, n_layer=2, n_head=4, **ids)
    cfg.pad_token_id = tok.pad_token_id
    return GPT2LMHeadModel(cfg).eval(), tok


def _tokens(rows: list[list[Completion]]) -> list[tuple[int, ...]]:
    return [c.token_ids for group in rows for c in group]


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_batched_tokens_equal_materialised_fp32(tiny_model_dir: Path, arch: str) -> None:
    _check_tokens_equal(tiny_model_dir, arch, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_batched_tokens_equal_materialised_cuda(tiny_model_dir: Path, arch: str) -> None:
    """The same on a GPU (factors from the CUDA generator on both sides, fp32 kernels)."""
    _check_tokens_equal(tiny_model_dir, arch, "cuda")


def _check_tokens_equal(tiny_model_dir: Path, arch: str, device: str) -> None:
    model, tok = _llama(tiny_model_dir) if arch == "llama" else _gpt2(tiny_model_dir)
    model.to(device)
    policy = TorchPolicy(model, tok, PolicyConfig(model="x", batch_size=16))
    serial = []
    for seed, scale in MEMBERS:
        with materialised(model, seed, scale):
            serial.append(policy.generate_sync(PROMPTS, GREEDY))
    plain = _tokens(policy.generate_sync(PROMPTS, GREEDY))
    pop = LowRankPopulation(model, dict(model.named_parameters()), RANK)
    kinds = {t.kind for t in pop.targets}
    # GPT-2: Conv1D blocks, wte/wpe embeddings, lm_head a Linear tied to wte
    assert kinds == ({"embedding", "linear"} | ({"conv1d"} if arch == "gpt2" else set()))
    batched = generate_members(policy, pop, [(m, PROMPTS) for m in MEMBERS], GREEDY)
    for want, got in zip(serial, batched, strict=True):
        assert _tokens(got) == _tokens(want)
        assert [c.text for g in got for c in g] == [c.text for g in want for c in g]
    # the perturbations matter (else equality would prove nothing): members differ
    assert len({tuple(_tokens(s)) for s in serial} | {tuple(plain)}) >= 3
    assert _tokens(policy.generate_sync(PROMPTS, GREEDY)) == plain  # hooks gone after the call


def test_uneven_row_groups_and_repeated_members(tiny_model_dir: Path) -> None:
    """Requests of different sizes (the gathered path) and one member asking twice."""
    model, tok = _llama(tiny_model_dir)
    policy = TorchPolicy(model, tok, PolicyConfig(model="x"))
    requests: list[tuple[tuple[int, float], Sequence[Prompt]]] = [
        (MEMBERS[0], PROMPTS[:1]),
        (MEMBERS[2], PROMPTS),
        (MEMBERS[0], PROMPTS[1:]),
    ]
    pop = LowRankPopulation(model, dict(model.named_parameters()), RANK)
    got = generate_members(policy, pop, requests, GREEDY)
    for (member, prompts), out in zip(requests, got, strict=True):
        with materialised(model, *member):
            assert _tokens(out) == _tokens(policy.generate_sync(prompts, GREEDY))


def test_samples_per_prompt_rows(tiny_model_dir: Path) -> None:
    model, tok = _llama(tiny_model_dir)
    policy = TorchPolicy(model, tok, PolicyConfig(model="x"))
    two = GREEDY.model_copy(update={"n": 2})
    pop = LowRankPopulation(model, dict(model.named_parameters()), RANK)
    got = generate_members(policy, pop, [(m, PROMPTS[:2]) for m in MEMBERS[:2]], two)
    assert [[len(g) for g in out] for out in got] == [[2, 2], [2, 2]]
    with materialised(model, *MEMBERS[1]):
        assert _tokens(got[1]) == _tokens(policy.generate_sync(PROMPTS[:2], two))


def test_bf16_logits_within_tolerance(tiny_model_dir: Path) -> None:
    """bf16 rounds W + δ once in the materialised path and x·W, x·δ separately here: the
    logits agree to bf16 precision, far closer than the members differ from each other, and
    are as close to the fp32 truth as the materialised bf16 ones (σ = 0.01: the term is a
    fraction of the output, as in training, where σ is smaller still)."""
    members = [(s, 0.2 * sc) for s, sc in MEMBERS]
    model, tok = _llama(tiny_model_dir, "bfloat16")
    enc = tok(PROMPTS, return_tensors="pt", padding=True, add_special_tokens=False)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    want = []
    for seed, scale in members:
        with materialised(model, seed, scale), torch.no_grad():
            want.append(model(input_ids=ids, attention_mask=mask).logits.float())
    pop = LowRankPopulation(model, dict(model.named_parameters()), RANK)
    groups = [RowGroup(k, len(PROMPTS)) for k in range(len(members))]
    with pop.active(members, groups), torch.no_grad():
        got = model(
            input_ids=ids.repeat(len(members), 1), attention_mask=mask.repeat(len(members), 1)
        ).logits.float()
    got = got.reshape(len(members), *want[0].shape)
    exact, _ = _llama(tiny_model_dir)  # fp32 truth, same θ (bf16 values widen exactly)
    exact.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    spread = (want[0] - want[2]).abs().max()
    for k, w in enumerate(want):
        with materialised(exact, *members[k]), torch.no_grad():
            truth = exact(input_ids=ids, attention_mask=mask).logits
        err = (got[k] - w)[mask.bool()].abs().max()
        assert err < 0.05 * spread, (k, float(err), float(spread))
        # no worse than bf16 itself: the batched error from fp32 is of the materialised one's size
        ours = (got[k] - truth)[mask.bool()].abs().max()
        theirs = (w - truth)[mask.bool()].abs().max()
        assert ours <= 2 * theirs + 1e-3, (k, float(ours), float(theirs))


def test_embedding_rows_match_direct_formula(tiny_model_dir: Path) -> None:
    """emb[x] + s/√r·A[x]·Bᵀ, written out, for the input embedding alone."""
    model, _ = _llama(tiny_model_dir)
    emb = model.get_input_embeddings()
    name = next(n for n, p in model.named_parameters() if p is emb.weight)
    ids = torch.tensor([[1, 5, 9], [2, 2, 7], [4, 0, 3], [6, 8, 1]])  # [4 rows, 3]
    members = [(11, 0.3), (12, -0.2)]
    pop = LowRankPopulation(model, {name: emb.weight}, RANK)
    with pop.active(members, [RowGroup(1, 1), RowGroup(0, 3)]), torch.no_grad():
        got = emb(ids)
    row_member = [1, 0, 0, 0]
    for b in range(4):
        seed, scale = members[row_member[b]]
        a, bb = factors(seed, name, tuple(emb.weight.shape), RANK, "cpu")
        want = emb.weight[ids[b]] + scale / math.sqrt(RANK) * (a[ids[b]] @ bb.T)
        torch.testing.assert_close(got[b], want)


def test_one_member_any_batch_logprob(tiny_model_dir: Path) -> None:
    """groups=None: every row of every forward is the member's (continuation_logprob)."""
    model, tok = _llama(tiny_model_dir)
    policy = TorchPolicy(model, tok, PolicyConfig(model="x"))
    with materialised(model, *MEMBERS[2]):
        want = policy.continuation_logprob(PROMPTS[0], " omega")
    pop = LowRankPopulation(model, dict(model.named_parameters()), RANK)
    with pop.active([MEMBERS[2]]):
        got = policy.continuation_logprob(PROMPTS[0], " omega")
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert got != pytest.approx(policy.continuation_logprob(PROMPTS[0], " omega"), abs=1e-4)


def test_refusals(tiny_model_dir: Path) -> None:
    model, _ = _llama(tiny_model_dir)
    params = dict(model.named_parameters())
    with pytest.raises(ConfigError, match="lowrank_other = 'frozen'"):
        LowRankPopulation(model, params, RANK, "full")

    class Scaled(torch.nn.Embedding):
        def forward(self, x: Any) -> Any:
            return super().forward(x) * 2.0

    odd = Scaled(5, 3)
    with pytest.raises(ConfigError, match="Scaled"):
        LowRankPopulation(odd, dict(odd.named_parameters()), RANK)
    free = torch.nn.Module()
    free.table = torch.nn.Parameter(torch.zeros(3, 4))
    with pytest.raises(ConfigError, match=r"no module's \.weight"):
        LowRankPopulation(free, dict(free.named_parameters()), RANK)
    pop = LowRankPopulation(model, params, RANK)
    with pop.active(MEMBERS[:2], [RowGroup(0, 1), RowGroup(1, 1)]), torch.no_grad():
        with pytest.raises(RuntimeError, match="groups cover 2"):
            model(input_ids=torch.tensor([[1, 2], [3, 4], [5, 6]]))


# -- the batched scorer ----------------------------------------------------------------------------


class FakeBatchEngine:
    """Answers each request with ``"<seed>:<scale>"`` of its member (after a pause), recording
    each call's start and end (monotonic clock, as the event loop's)."""

    def __init__(self, gen_s: float, log: list[tuple[str, str, float]]) -> None:
        from test_es_pipeline import FakePolicy

        self.policy = FakePolicy(self, 0.0)  # type: ignore[arg-type]
        self.current = (0, 0.0)
        self.gen_s = gen_s
        self.log = log
        self.calls: list[list[tuple[int, float]]] = []

    def generate_members(
        self, requests: Sequence[tuple[tuple[int, float], Sequence[Prompt]]], sampling: Any
    ) -> list[list[list[Completion]]]:
        keys = [f"{s}:{sc}" for (s, sc), _ in requests]
        for k in keys:
            self.log.append(("gen-start", k, time.monotonic()))
        time.sleep(self.gen_s)
        for k in keys:
            self.log.append(("gen-end", k, time.monotonic()))
        return [[[Completion(text=f"{s}:{sc}")] for _ in ps] for (s, sc), ps in requests]

    def call_member(self, seed: int, scale: float, fn: Any, *args: Any, **kw: Any) -> Any:
        return fn(*args, **kw)


@pytest.mark.parametrize(("size", "depth"), [(2, 1), (2, 2), (4, 2), (8, 1)])
def test_batched_scorer_groups_members_and_keeps_order(size: int, depth: int) -> None:
    from test_es_pipeline import EVENTS, EchoEnv, _state
    from test_es_pipeline import MEMBERS as PMEMBERS

    from leanrl.train.es.pipeline import PipelinedScorer

    EVENTS.clear()
    engine = FakeBatchEngine(0.01, EVENTS)
    scorer = PipelinedScorer(EchoEnv(), engine, depth, members_per_batch=size)  # type: ignore[arg-type]
    scores = run_sync(scorer.score(_state(), PMEMBERS))
    assert [s.reward for s in scores] == [m.sign * 0.5 + m.seed % 7 for m in PMEMBERS]
    keys = [(m.seed, m.sign * 0.5) for m in PMEMBERS]
    assert scorer.last_calls == [keys[i : i + size] for i in range(0, len(keys), size)]
    assert scorer.last_idle_frac is not None and 0.0 <= scorer.last_idle_frac <= 1.0


def test_next_batch_decodes_while_previous_batch_is_checked() -> None:
    from test_es_pipeline import EVENTS, EchoEnv, _state
    from test_es_pipeline import MEMBERS as PMEMBERS

    from leanrl.train.es.pipeline import PipelinedScorer

    env = EchoEnv()
    env.config.runtime.options["check_s"] = 0.05
    for depth in (2, 1):
        EVENTS.clear()
        engine = FakeBatchEngine(0.02, EVENTS)
        run_sync(PipelinedScorer(env, engine, depth, members_per_batch=2).score(_state(), PMEMBERS))  # type: ignore[arg-type]
        at = {(kind, key): t for kind, key, t in EVENTS}
        first, second = "11:0.5", "23:0.5"  # members 0 and 2: batches 0 and 1
        overlap = at[("gen-start", second)] < at[("check-end", first)]
        assert overlap == (depth == 2)


def test_scorer_refuses_an_engine_without_batches() -> None:
    from test_es_pipeline import EchoEnv, FakeEngine

    from leanrl.train.es.pipeline import PipelinedScorer

    with pytest.raises(ConfigError, match="members_per_batch = 4"):
        PipelinedScorer(EchoEnv(), FakeEngine(0.0), 2, members_per_batch=4)


def test_trainer_batched_matches_one_member_per_call(toy_model_dir: Path, tmp_path: Path) -> None:
    """The whole trainer: low-rank members decoded 4 per call give the rewards and updates of
    the same members decoded one per call with their weights written (up to fp32 rounding:
    x·W + x·δ is not bitwise x·(W + δ))."""
    from test_es_learning import toy_config

    from leanrl.train.es import ESTrainer

    rows = {}
    for size in (1, 4):
        cfg = toy_config(
            toy_model_dir,
            tmp_path / f"b{size}",
            steps=2,
            population=8,
            perturbation="lowrank",
            rank=2,
            scorer={"members_per_batch": size, "pipeline": 2},
        )
        tr = ESTrainer(cfg)
        rows[size] = tr.train_sync()
        calls = getattr(tr._scorer, "last_calls", [])
        assert [len(c) for c in calls] == ([4, 4] if size == 4 else [])  # really batched
    for a, b in zip(rows[1], rows[4], strict=True):
        assert b["reward_mean"] == pytest.approx(a["reward_mean"], rel=1e-4, abs=1e-6)
        assert b["update_norm"] == pytest.approx(a["update_norm"], rel=1e-3)
        assert 0.0 <= b["gpu_idle_frac"] <= 1.0


def test_asyncio_gate_admits_whole_batches() -> None:
    """Members admitted but not yet heard from are waited for: the first call holds all four,
    even when one member's harness takes a while to ask."""
    from leanrl.train.es.pipeline import BatchGate

    engine = FakeBatchEngine(0.0, [])
    gate = BatchGate(engine, 4)
    keys = [(i, 1.0) for i in range(4)]

    async def main() -> None:
        gate.admit(keys)
        runner = asyncio.ensure_future(gate.run())

        async def member(i: int) -> None:
            await asyncio.sleep(0.02 if i == 3 else 0.0)
            await gate.generate(i, 1.0, ["p"], GREEDY)
            gate.finish(keys[i])

        await asyncio.gather(*(member(i) for i in range(4)))
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)

    run_sync(main())
    assert gate.calls == [keys]
