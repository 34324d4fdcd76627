"""The hf policy on a tiny random model: seeding, logprobs, stop strings, chat, threading."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from leanrl import ChatMessage, ConfigError, PolicyConfig, PolicyError, SamplingConfig
from leanrl.policies import make_policy
from leanrl.policies.hf import HFPolicy


@pytest.fixture(scope="module")
def policy(tiny_model_dir: Path) -> HFPolicy:
    p = make_policy(PolicyConfig(model=str(tiny_model_dir), batch_size=3))
    assert isinstance(p, HFPolicy)
    asyncio.run(p.start())  # loaded once for the module; each test generates in its own loop
    return p


PROMPTS = ["theorem foo (x : ℕ) : x = x := by", "Complete the following Lean 4 code:"]


async def test_same_seed_same_samples_other_seed_other_samples(policy: HFPolicy) -> None:
    s = SamplingConfig(n=3, max_tokens=12, seed=7)
    a = await policy.generate(PROMPTS, s)
    b = await policy.generate(PROMPTS, s)
    c = await policy.generate(PROMPTS, s.model_copy(update={"seed": 8}))
    assert a == b
    assert [x.token_ids for x in a[0]] != [x.token_ids for x in c[0]]
    assert [len(x) for x in a] == [3, 3]
    assert len({x.token_ids for x in a[0]}) > 1  # n samples of one prompt differ


async def test_logprobs_are_those_of_the_sampled_tokens(policy: HFPolicy) -> None:
    import torch

    s = SamplingConfig(n=2, max_tokens=10, seed=1, temperature=0.7, top_p=1.0)
    out = await policy.generate(PROMPTS[:1], s)
    model = policy.model
    for comp in out[0]:
        assert len(comp.token_ids) == len(comp.logprobs or ()) == 10
        assert comp.finish_reason == "length"
        ids = torch.tensor([list(comp.prompt_token_ids) + list(comp.token_ids)])
        with torch.no_grad():
            logits = model(ids).logits[0].float() / 0.7
        lp = torch.log_softmax(logits, -1)
        p = len(comp.prompt_token_ids)
        want = [lp[p - 1 + i, t].item() for i, t in enumerate(comp.token_ids)]
        assert comp.logprobs == pytest.approx(want, abs=1e-4)


async def test_greedy_is_argmax_and_deterministic(policy: HFPolicy) -> None:
    import torch

    s = SamplingConfig(n=2, max_tokens=6, temperature=0.0, seed=None)
    out = await policy.generate(PROMPTS[:1], s)
    assert out[0][0].token_ids == out[0][1].token_ids
    comp = out[0][0]
    ids = list(comp.prompt_token_ids)
    with torch.no_grad():
        for t in comp.token_ids:
            nxt = int(policy.model(torch.tensor([ids])).logits[0, -1].argmax())
            assert nxt == t
            ids.append(t)


async def test_stop_strings_cut_text_and_tokens(policy: HFPolicy) -> None:
    s = SamplingConfig(n=4, max_tokens=40, seed=3)
    free = await policy.generate(PROMPTS[:1], s)
    # stop at a character the unconstrained samples actually produced
    char = next(ch for ch in free[0][0].text[3:] if ch.strip())
    out = await policy.generate(PROMPTS[:1], s.model_copy(update={"stop": [char]}))
    stopped = [c for c in out[0] if c.finish_reason == "stop"]
    assert stopped
    tok = policy.tokenizer
    for c in stopped:
        assert char not in c.text
        full = tok.decode(list(c.token_ids), skip_special_tokens=True)
        assert char in full and full.startswith(c.text)  # the stop token is kept, not the text
        assert len(c.logprobs or ()) == len(c.token_ids)


async def test_chat_prompts_use_the_chat_template(policy: HFPolicy) -> None:
    msgs = [ChatMessage(role="system", content="S"), ChatMessage(role="user", content="prove")]
    out = await policy.generate([msgs], SamplingConfig(n=1, max_tokens=4))
    prompt = policy.tokenizer.decode(list(out[0][0].prompt_token_ids))
    assert prompt.endswith("<|im_start|>user\nprove<|im_end|>\n<|im_start|>assistant\n")
    assert policy.tokenize("omega") and policy.tokenize("omega") == policy.tokenize("omega")


async def test_generation_runs_off_the_event_loop(policy: HFPolicy) -> None:
    ticks = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0)

    t = asyncio.ensure_future(ticker())
    await policy.generate(PROMPTS, SamplingConfig(n=4, max_tokens=48))
    stop.set()
    await t
    assert ticks > 10  # the loop kept running other work while the model generated


async def test_bad_models_are_clear_errors(tmp_path: Path, monkeypatch) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        await make_policy(PolicyConfig(model=str(tmp_path / "nope"))).start()
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"no config\.json"):
        await make_policy(PolicyConfig(model=str(tmp_path / "empty"))).start()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf"))  # empty
    with pytest.raises(PolicyError, match=r"offline mode is on.*--local-dir"):
        await make_policy(PolicyConfig(model="someone/some-prover")).start()
    with pytest.raises(ConfigError, match="no model given"):
        make_policy(PolicyConfig())


@pytest.mark.gpu
async def test_gpu_sampling_is_seeded_and_has_logprobs(tiny_model_dir: Path) -> None:
    p = make_policy(PolicyConfig(model=str(tiny_model_dir), device="cuda", batch_size=4))
    await p.start()
    s = SamplingConfig(n=4, max_tokens=16, seed=5)
    a = await p.generate(PROMPTS, s)
    b = await p.generate(PROMPTS, s)
    assert [[c.token_ids for c in row] for row in a] == [[c.token_ids for c in row] for row in b]
    assert all(len(c.logprobs or ()) == len(c.token_ids) > 0 for row in a for c in row)
    await p.close()
