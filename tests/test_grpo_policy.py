"""The in-process training policy: log-probs match a plain forward, seeds repeat, stops work."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from leanrl.policy import PolicyConfig, SamplingConfig
from leanrl.rollout import ChatMessage

PROMPTS = ["theorem foo (x : ℝ) : x ^ 2 ≥ 0 := by", "omega"]  # different lengths: left padding


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(
        tiny_model_dir
    )


def _policy(loaded: tuple[Any, Any], **kw: Any) -> Any:
    from leanrl.train.hf_policy import TrainPolicy

    model, tok = loaded
    return TrainPolicy(PolicyConfig(model="tiny", **kw), model, tok)


def test_logprobs_are_those_of_a_plain_forward(loaded: tuple[Any, Any]) -> None:
    model, _ = loaded
    out = _policy(loaded).generate_sync(PROMPTS, SamplingConfig(n=3, max_tokens=12, seed=1))
    assert [len(g) for g in out] == [3, 3]
    for group in out:
        for c in group:
            ids = torch.tensor([list(c.prompt_token_ids) + list(c.token_ids)])
            with torch.no_grad():
                logits = model(ids).logits[0]
            p = len(c.prompt_token_ids)
            want = torch.log_softmax(logits[p - 1 : -1], -1)
            want = want.gather(-1, torch.tensor(c.token_ids).unsqueeze(-1)).squeeze(-1)
            assert torch.allclose(torch.tensor(c.logprobs), want, atol=1e-4)
            assert len(c.token_ids) <= 12


def test_temperature_scales_the_reported_logprobs(loaded: tuple[Any, Any]) -> None:
    model, _ = loaded
    c = _policy(loaded).generate_sync(PROMPTS[:1], SamplingConfig(temperature=0.7, seed=2))[0][0]
    ids = torch.tensor([list(c.prompt_token_ids) + list(c.token_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0] / 0.7
    p = len(c.prompt_token_ids)
    want = torch.log_softmax(logits[p - 1 : -1], -1)
    want = want.gather(-1, torch.tensor(c.token_ids).unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(torch.tensor(c.logprobs), want, atol=1e-4)


def test_same_seed_same_samples_other_seed_other_samples(loaded: tuple[Any, Any]) -> None:
    s = SamplingConfig(n=4, max_tokens=10, seed=7)
    a = _policy(loaded).generate_sync(PROMPTS, s)
    b = _policy(loaded).generate_sync(PROMPTS, s)
    c = _policy(loaded).generate_sync(PROMPTS, s.model_copy(update={"seed": 8}))
    ids = [[x.token_ids for x in g] for g in a]
    assert ids == [[x.token_ids for x in g] for g in b]
    assert ids != [[x.token_ids for x in g] for g in c]


def test_stop_string_and_eos(loaded: tuple[Any, Any]) -> None:
    model, tok = loaded
    greedy = SamplingConfig(temperature=0.0, max_tokens=12)
    free = _policy(loaded).generate_sync(PROMPTS[:1], greedy)[0][0]
    assert free.finish_reason == "length" and len(free.token_ids) == 12
    # stop string: cut before it, finish "stop"
    text = free.text
    stop = next(text[i : i + 2] for i in range(3, len(text) - 1) if text[i : i + 2].strip())
    cut = _policy(loaded).generate_sync(PROMPTS[:1], greedy.model_copy(update={"stop": [stop]}))
    assert cut[0][0].finish_reason == "stop"
    assert cut[0][0].text == text[: text.find(stop)]
    # EOS: the greedy path's 4th token declared the end of sequence
    eos = free.token_ids[3]
    old = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = eos
    try:
        ended = _policy(loaded).generate_sync(PROMPTS[:1], greedy)[0][0]
    finally:
        model.generation_config.eos_token_id = old
    assert ended.finish_reason == "stop"
    assert ended.token_ids == free.token_ids[: free.token_ids.index(eos) + 1]  # EOS kept (loss)
    assert ended.text == tok.decode(list(ended.token_ids[:-1]), skip_special_tokens=True)


def test_chat_prompt_uses_the_template(loaded: tuple[Any, Any]) -> None:
    _, tok = loaded
    pol = _policy(loaded)
    msgs = [ChatMessage(role="user", content="prove it")]
    c = pol.generate_sync([msgs], SamplingConfig(max_tokens=3, seed=0))[0][0]
    assert tok.decode(list(c.prompt_token_ids)).startswith("<|im_start|>user\nprove it")
    assert pol.tokenize("omega") == tok.encode("omega", add_special_tokens=False)


def test_sampler_draws_from_the_distribution_and_nucleus() -> None:
    from leanrl.train.hf_policy import _sample

    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logp = torch.log(probs).expand(20000, 4)
    gen = torch.Generator().manual_seed(0)
    freq = torch.bincount(_sample(logp, 1.0, gen), minlength=4).float() / 20000
    assert torch.allclose(freq, probs, atol=0.012)  # 3.5 sigma of binomial noise at p = 0.5
    # top-p 0.7 keeps the smallest prefix with >= 0.7 mass: {0.5, 0.3}, renormalised
    freq = torch.bincount(_sample(logp, 0.7, gen), minlength=4).float() / 20000
    assert torch.allclose(freq, torch.tensor([0.625, 0.375, 0.0, 0.0]), atol=0.012)


def test_stop_check_reads_a_bounded_tail_and_finds_long_stop_strings(
    loaded: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import leanrl.train.hf_policy as hp

    greedy = SamplingConfig(temperature=0.0, max_tokens=80)
    free = _policy(loaded).generate_sync(PROMPTS[:1], greedy)[0][0]
    seen: list[int] = []
    real = hp._hits_stop
    monkeypatch.setattr(
        hp, "_hits_stop", lambda tok, t, s: (seen.append(len(t)), real(tok, t, s))[1]
    )
    never = greedy.model_copy(update={"stop": ["\x00never\x00"]})
    out = _policy(loaded).generate_sync(PROMPTS[:1], never)[0][0]
    assert out.token_ids == free.token_ids and len(seen) == 80
    # one bounded tail per step (the whole prefix each step made the check quadratic)
    assert max(seen) == hp.stop_window(["\x00never\x00"]) == 16
    # a stop string longer than 16 tokens' text is still found where it ends
    _, tok = loaded
    pieces = [tok.decode([t], skip_special_tokens=False) for t in free.token_ids]
    start = 40
    long_stop = "".join(pieces[start : start + 20])
    assert len(long_stop) >= 20 and long_stop in free.text
    cut = _policy(loaded).generate_sync(
        PROMPTS[:1], greedy.model_copy(update={"stop": [long_stop]})
    )
    assert cut[0][0].finish_reason == "stop"
    assert cut[0][0].text == free.text[: free.text.find(long_stop)]
