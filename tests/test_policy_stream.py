"""Policy.stream: the hf continuous batcher against the static path and a direct computation,
the base-class default, the openai and vllm streams."""

from __future__ import annotations

import asyncio
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from leanrl import PolicyConfig, SamplingConfig
from leanrl.policies import make_policy
from leanrl.policy import Completion, Policy, StreamRequest

PROMPTS = [
    "theorem foo (x : Nat)",
    "theorem b",
    "lemma a (n m : ℕ) : n + m = m + n := by",
    "x",
    "theorem mathd_algebra_1 (a b : ℝ) (h : a = b) : b = a := by",
    "example : 1 + 1 = 2 :=",
]


async def collect(p: Policy, reqs: Sequence[StreamRequest]) -> dict[tuple[Any, int], Completion]:
    out: dict[tuple[Any, int], Completion] = {}
    async for sc in p.stream(reqs):
        assert (sc.key, sc.sample) not in out
        out[(sc.key, sc.sample)] = sc.completion
    return out


@pytest.fixture(scope="module")
def hf(tiny_model_dir: Path) -> Any:
    """One loaded model for the module (the policy works from any test's event loop)."""
    p = make_policy(PolicyConfig(model=str(tiny_model_dir), batch_size=2))
    asyncio.run(p.start())
    return p


async def test_greedy_stream_is_token_identical_to_generate(hf: Any) -> None:
    # a live batch of 2 with ragged lengths: rows leave and join mid-flight, caches are joined
    maxt = [9, 3, 14, 5, 7, 11]
    reqs = [
        StreamRequest(key=i, prompt=p, sampling=SamplingConfig(temperature=0, max_tokens=m))
        for i, (p, m) in enumerate(zip(PROMPTS, maxt, strict=True))
    ]
    got = await collect(hf, reqs)
    assert len(got) == len(PROMPTS)
    for i, (p, m) in enumerate(zip(PROMPTS, maxt, strict=True)):
        ref = (await hf.generate([p], SamplingConfig(temperature=0, max_tokens=m)))[0][0]
        c = got[(i, 0)]
        assert c.token_ids == ref.token_ids and c.text == ref.text
        assert c.finish_reason == ref.finish_reason and c.prompt_token_ids == ref.prompt_token_ids
        assert c.logprobs == pytest.approx(ref.logprobs, abs=1e-4)


async def test_stop_strings_and_eos_end_rows_as_in_generate(hf: Any) -> None:
    base = SamplingConfig(temperature=0, max_tokens=24)
    free = {k[0]: c for k, c in (await collect(hf, [
        StreamRequest(key=i, prompt=p, sampling=base) for i, p in enumerate(PROMPTS)
    ])).items()}  # fmt: skip
    # a stop string each greedy completion really produces: a piece of its own text
    stops = [c.text[3:5] for c in free.values() if len(c.text) > 6]
    assert stops
    s = base.model_copy(update={"stop": stops})
    got = await collect(
        hf, [StreamRequest(key=i, prompt=p, sampling=s) for i, p in enumerate(PROMPTS)]
    )
    ref = await hf.generate(PROMPTS, s)
    cut = 0
    for i in range(len(PROMPTS)):
        c, r, f = got[(i, 0)], ref[i][0], free[i]
        # what a stop string means: the free completion cut before its first one (the token
        # that completed it kept)
        at = [f.text.find(x) for x in stops if x in f.text]
        if at:
            assert c.text == f.text[: min(at)] and c.finish_reason == "stop"
            assert c.token_ids == f.token_ids[: len(c.token_ids)] and c.token_ids != f.token_ids
            cut += 1
        else:
            assert c == f
        # and the static path agrees, except where transformers' stop criterion matched a stop
        # string across the end of the prompt (it ends that row early, finish "length")
        if not (r.finish_reason == "length" and len(r.token_ids) < base.max_tokens):
            assert (c.text, c.token_ids, c.finish_reason) == (r.text, r.token_ids, r.finish_reason)
    assert cut >= 1  # the stop strings did end some completions early

    # a token the model emits, made its EOS: the row ends there as in generate (the EOS token
    # kept in token_ids, left out of the text)
    ids = free[2].token_ids
    eos = ids[3]
    cfg = hf.model.generation_config
    old = cfg.eos_token_id
    cfg.eos_token_id = eos
    try:
        req = [StreamRequest(key=0, prompt=PROMPTS[2], sampling=base)]
        c = (await collect(hf, req))[(0, 0)]
        r = (await hf.generate([PROMPTS[2]], base))[0][0]
    finally:
        cfg.eos_token_id = old
    end = ids.index(eos) + 1
    assert c.token_ids == ids[:end] == r.token_ids and c.finish_reason == "stop" == r.finish_reason
    assert c.text == r.text


async def test_sampled_stream_is_seeded_per_sample(hf: Any, tiny_model_dir: Path) -> None:
    s = SamplingConfig(temperature=1.0, top_p=0.9, max_tokens=10, seed=3, n=2)
    reqs = [StreamRequest(key=i, prompt=p, sampling=s, slot=i) for i, p in enumerate(PROMPTS)]
    a = await collect(hf, reqs)
    b = await collect(hf, reqs)
    assert {k: c.token_ids for k, c in a.items()} == {k: c.token_ids for k, c in b.items()}
    # neighbours, batch size and request order do not change a request's samples
    wide = make_policy(PolicyConfig(model=str(tiny_model_dir), batch_size=16))
    await wide.start()
    c = await collect(wide, list(reversed(reqs)))
    await wide.close()
    assert {k: x.token_ids for k, x in c.items()} == {k: x.token_ids for k, x in a.items()}
    # the two samples of a request, and another seed, differ
    assert any(a[(i, 0)].token_ids != a[(i, 1)].token_ids for i in range(len(PROMPTS)))
    other = await collect(
        hf, [StreamRequest(key=i, prompt=p, sampling=s.model_copy(update={"seed": 4}), slot=i)
             for i, p in enumerate(PROMPTS)]
    )  # fmt: skip
    assert {k: x.token_ids for k, x in other.items()} != {k: x.token_ids for k, x in a.items()}


async def test_sampled_logprobs_are_those_of_the_warped_distribution(hf: Any) -> None:
    """Against a direct computation: the model run over prompt + completion, temperature and
    top-p applied to each position's logits, log-softmax, the sampled token picked out."""
    import torch
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

    s = SamplingConfig(temperature=0.7, top_p=0.9, max_tokens=8, seed=1)
    got = await collect(
        hf, [StreamRequest(key=i, prompt=p, sampling=s) for i, p in enumerate(PROMPTS[:3])]
    )
    for c in got.values():
        ids = list(c.prompt_token_ids) + list(c.token_ids)
        with torch.no_grad():
            logits = hf.model(input_ids=torch.tensor([ids])).logits[0].float()
        p0 = len(c.prompt_token_ids)
        want = []
        for t, tid in enumerate(c.token_ids):
            row = logits[p0 + t - 1 : p0 + t]
            row = TopPLogitsWarper(top_p=0.9)(None, TemperatureLogitsWarper(0.7)(None, row))
            want.append(float(torch.log_softmax(row, -1)[0, tid]))
        assert c.logprobs == pytest.approx(want, abs=1e-4)


async def test_the_default_stream_groups_requests_into_generate_calls() -> None:
    from tests._scripted_runtime import ScriptedPolicy

    p = ScriptedPolicy(["a", "bb"])
    s1, s2 = SamplingConfig(n=2, seed=1), SamplingConfig(n=2, seed=2)
    reqs = [StreamRequest(key=k, prompt=f"p{k}", sampling=s1 if k < 3 else s2) for k in range(5)]
    got = await collect(p, reqs)
    assert sorted(got) == [(k, s) for k in range(5) for s in range(2)]
    assert got[(4, 1)].text == "bb"
    # one call per run of equal sampling, with that run's seed: what generate gave before
    assert [len(c) for c in p.calls] == [3, 2] and p.seeds == [1, 2]


async def test_openai_streams_each_request_as_it_returns() -> None:
    from tests.test_policy_openai import Server, policy

    with Server(fail=0, delay_s=0.02) as server:
        p = policy(server.url, max_concurrency=4)
        s = SamplingConfig(n=2, max_tokens=5, seed=1)
        reqs = [StreamRequest(key=f"k{i}", prompt=f"p{i}", sampling=s) for i in range(6)]
        got = await collect(p, reqs)
        await p.close()
    assert len(got) == 12 and got[("k3", 1)].text == "p3 -> 1"
    assert 1 < server.peak <= 4  # concurrent, bounded
    with pytest.raises(Exception, match="token ids"):
        await collect(p, [StreamRequest(key=0, prompt_ids=(1, 2), sampling=s)])


async def test_vllm_stream_steps_the_engine_and_yields_finished_requests(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The glue code only (vLLM's engine replaced by a stand-in that finishes one request per
    step, last first); real vLLM is the gpu test."""
    from leanrl.policies.vllm import VLLMPolicy
    from tests._vllm_engine_standin import Engine, Params

    class LLM:
        def __init__(self, **kw: Any) -> None:
            self.llm_engine = Engine()

        def get_tokenizer(self) -> Any:
            return None

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, SamplingParams=Params))
    p = make_policy(PolicyConfig(model=str(tiny_model_dir), backend="vllm"))
    assert isinstance(p, VLLMPolicy)
    s = SamplingConfig(n=2, seed=9)
    reqs = [StreamRequest(key=i, prompt=f"p{i}", sampling=s) for i in range(3)]
    order = [(sc.key, sc.sample) async for sc in p.stream(reqs)]
    assert order == [(2, 0), (2, 1), (1, 0), (1, 1), (0, 0), (0, 1)]  # as the engine finished
    got = await collect(p, reqs)
    assert got[(1, 1)].text == "p1/1/9"  # each request keeps its own seed, as in generate
    # a consumer that stops early aborts what the engine still holds
    agen = p.stream(reqs)
    await agen.__anext__()
    await agen.aclose()
    assert p._llm.llm_engine.aborted  # type: ignore[attr-defined]


async def test_stream_of_nothing_yields_nothing(hf: Any) -> None:
    assert await collect(hf, []) == {}


async def test_a_consumer_that_stops_early_frees_the_model(hf: Any) -> None:
    s = SamplingConfig(temperature=0, max_tokens=40)
    agen = hf.stream([StreamRequest(key=i, prompt=p, sampling=s) for i, p in enumerate(PROMPTS)])
    first = await agen.__anext__()
    await agen.aclose()  # the sampler stops and the model's lock is released
    ref = await asyncio.wait_for(hf.generate([PROMPTS[first.key]], s), 120)
    assert ref[0][0].token_ids == first.completion.token_ids
