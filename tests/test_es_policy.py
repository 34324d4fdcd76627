"""The in-process policy ES scores members with: generation on whatever weights the model holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from leanrl.errors import PolicyError
from leanrl.policy import SamplingConfig
from leanrl.rollout import ChatMessage
from leanrl.train.es.policy import TorchPolicy, load_model
from leanrl.train.es.weights import ESWeights


@pytest.fixture(scope="module")
def policy(tiny_model_dir: Path) -> TorchPolicy:
    model, tok = load_model(str(tiny_model_dir), "float32", "cpu")
    return TorchPolicy(model, tok)


async def test_greedy_is_deterministic_and_batched(policy: TorchPolicy) -> None:
    prompts = ["theorem a : True := by", "theorem bb (x : Nat) : x = x := by"]
    out = await policy.generate(prompts, SamplingConfig(n=2, temperature=0.0, max_tokens=5))
    assert [len(g) for g in out] == [2, 2]
    assert out[0][0] == out[0][1]
    for g, p in zip(out, prompts, strict=True):
        c = g[0]
        assert len(c.token_ids) <= 5 and c.logprobs is not None
        assert len(c.logprobs) == len(c.token_ids) and all(lp <= 0 for lp in c.logprobs)
        assert list(c.prompt_token_ids) == policy.tokenize(p)
    # the same prompt alone gives the same greedy tokens as inside a padded batch
    alone = await policy.generate(prompts[:1], SamplingConfig(temperature=0.0, max_tokens=5))
    assert alone[0][0].token_ids == out[0][0].token_ids


async def test_sampling_seed_stop_and_chat(policy: TorchPolicy) -> None:
    s = SamplingConfig(n=3, temperature=1.0, max_tokens=6, seed=5)
    a = await policy.generate(["theorem a : True := by"], s)
    b = await policy.generate(["theorem a : True := by"], s)
    assert a == b
    assert len({c.token_ids for c in a[0]}) > 1  # sampled, not greedy
    text = a[0][0].text
    stop = text[1:3] if len(text) >= 3 else text
    cut = await policy.generate(["theorem a : True := by"], s.model_copy(update={"stop": [stop]}))
    assert stop not in cut[0][0].text and cut[0][0].finish_reason == "stop"
    chat = [ChatMessage(role="user", content="prove it")]
    assert policy.render(chat).endswith("<|im_start|>assistant\n")
    out = await policy.generate([chat], SamplingConfig(temperature=0.0, max_tokens=3))
    assert len(out[0]) == 1


def test_continuation_logprob_follows_the_weights(policy: TorchPolicy) -> None:
    w = ESWeights.from_model(policy.model)
    base = policy.continuation_logprob("theorem a : True := by", " omega")
    assert base < 0
    w.perturb(1, 0.05)
    moved = policy.continuation_logprob("theorem a : True := by", " omega")
    w.restore()
    assert moved != base
    assert policy.continuation_logprob("theorem a : True := by", " omega") == base
    with pytest.raises(PolicyError):
        policy.continuation_logprob("", " omega")


def test_policy_options_reach_from_pretrained(tiny_model_dir: Path) -> None:
    from leanrl.errors import ConfigError

    eager, _ = load_model(str(tiny_model_dir), "float32", "cpu", {"attn_implementation": "eager"})
    sdpa, _ = load_model(str(tiny_model_dir), "float32", "cpu", {"attn_implementation": "sdpa"})
    assert eager.config._attn_implementation == "eager"
    assert sdpa.config._attn_implementation == "sdpa"
    with pytest.raises(ConfigError, match=r"policy\.dtype"):
        load_model(str(tiny_model_dir), "float32", "cpu", {"torch_dtype": "bfloat16"})


def test_trainer_passes_policy_options(tiny_model_dir: Path, tmp_path: Path) -> None:
    from test_es_learning import toy_config

    from leanrl.runtime import run_sync
    from leanrl.train.es import ESTrainer

    cfg = toy_config(tiny_model_dir, tmp_path / "o")
    cfg = cfg.model_copy(
        update={
            "policy": cfg.policy.model_copy(update={"options": {"attn_implementation": "eager"}})
        }
    )
    tr = ESTrainer(cfg)
    run_sync(tr.start())
    try:
        assert tr.model.config._attn_implementation == "eager"
    finally:
        run_sync(tr.close())


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingConfig(temperature=0.0, max_tokens=8),
        SamplingConfig(temperature=0.8, top_p=0.9, max_tokens=8),
    ],
    ids=["greedy", "sampled"],
)
def test_scoring_keeps_no_full_vocabulary_scores_and_logprobs_are_unchanged(
    policy: TorchPolicy, sampling: SamplingConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    model, tok = policy.model, policy.tokenizer
    texts = ["theorem a : True := by", "theorem bb (x : Nat) : x = x := by"]
    # what the scores used to come from: every step's [batch, vocab] scores, kept to the end
    tok.padding_side = "left"
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    kw: dict = {"do_sample": sampling.temperature > 0}
    if sampling.temperature > 0:
        kw.update(temperature=sampling.temperature, top_p=sampling.top_p)
    torch.manual_seed(11)
    g = model.generate(**enc, max_new_tokens=sampling.max_tokens, pad_token_id=tok.pad_token_id,
                       eos_token_id=tok.eos_token_id, output_scores=True,
                       return_dict_in_generate=True, top_k=None, **kw)  # fmt: skip
    want = model.compute_transition_scores(g.sequences, g.scores, normalize_logits=True)

    asked: list[dict] = []
    real = model.generate
    monkeypatch.setattr(model, "generate", lambda **k: (asked.append(k), real(**k))[1])
    torch.manual_seed(11)
    got = policy._generate_batch(texts, sampling)
    assert not asked[0].get("output_scores") and not asked[0].get("return_dict_in_generate")
    for b, c in enumerate(got):
        n = len(c.token_ids)
        assert list(c.token_ids) == g.sequences[b, enc["input_ids"].shape[1] :][:n].tolist()
        assert c.logprobs == pytest.approx(want[b, :n].tolist(), abs=1e-5)
