"""GRPO's ``hf`` sampler streams: each row of the batch is handed over as it ends while the
others go on decoding, and the stream gives exactly ``generate``'s completions (same batch,
seeds and call counter), so GRPO's rollouts are checked as they arrive with nothing changed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from leanrl.policy import PolicyConfig, SamplingConfig, StreamRequest, stream_replays_generate
from leanrl.runtime import run_sync

PROMPTS = ["theorem foo (x : ℝ) : x ^ 2 ≥ 0 := by", "omega", "simp", "rfl"]


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(
        tiny_model_dir
    )


def _policy(loaded: tuple[Any, Any], **kw: Any) -> Any:
    from leanrl.train.hf_policy import TrainPolicy

    model, tok = loaded
    return TrainPolicy(PolicyConfig(model="tiny", chat=False, **kw), model, tok)


def _stream(policy: Any, sampling: SamplingConfig, calls: int = 1) -> list[list[Any]]:
    """``calls`` streams of PROMPTS, each as ``(key, sample, completion)`` in arrival order."""

    async def go() -> list[list[Any]]:
        out = []
        for _ in range(calls):
            reqs = [
                StreamRequest(key=i, prompt=p, sampling=sampling) for i, p in enumerate(PROMPTS)
            ]
            out.append([(sc.key, sc.sample, sc.completion) async for sc in policy.stream(reqs)])
        return out

    return run_sync(go())


# stop strings end rows at different steps (the tiny model writes spaces and digits at random)
SAMPLED = SamplingConfig(n=3, temperature=1.0, max_tokens=24, seed=7, stop=[" "])


def test_the_stream_gives_generates_completions(loaded: tuple[Any, Any]) -> None:
    want = _policy(loaded).generate_sync(PROMPTS, SAMPLED)
    ref = _policy(loaded)
    ref.generate_sync(PROMPTS, SAMPLED)
    want2 = ref.generate_sync(PROMPTS, SAMPLED)  # the second call of the same seed
    first, second = _stream(_policy(loaded), SAMPLED, calls=2)
    for got, ref_groups in ((first, want), (second, want2)):
        by = {(k, s): c for k, s, c in got}
        assert len(by) == len(got) == len(PROMPTS) * SAMPLED.n  # each sample once
        for i, group in enumerate(ref_groups):
            for s, c in enumerate(group):
                assert by[(i, s)] == c  # tokens, log-probs, text and finish reason


def test_rows_are_handed_over_as_they_end(loaded: tuple[Any, Any]) -> None:
    (got,) = _stream(_policy(loaded, batch_size=64), SAMPLED)
    lengths = [len(c.token_ids) for _, _, c in got]
    # one batch: a row is handed over at the step it ends, so shorter rows come first
    assert lengths == sorted(lengths)
    assert len(set(lengths)) > 1, lengths  # the rows did end at different steps
    assert [(k, s) for k, s, _ in got] != [(i, s) for i in range(len(PROMPTS)) for s in range(3)]


def test_ids_requests_and_the_guard(loaded: tuple[Any, Any]) -> None:
    pol = _policy(loaded)
    assert stream_replays_generate(pol, SAMPLED, native=True, ids=True)
    ids = [pol.prompt_ids(p) for p in PROMPTS]
    want = _policy(loaded).generate_ids_sync(ids, SAMPLED)

    async def go() -> dict[tuple[int, int], Any]:
        reqs = [
            StreamRequest(key=i, prompt_ids=tuple(x), sampling=SAMPLED) for i, x in enumerate(ids)
        ]
        return {(sc.key, sc.sample): sc.completion async for sc in pol.stream(reqs)}  # type: ignore[misc]

    got = run_sync(go())
    assert all(got[(i, s)] == c for i, g in enumerate(want) for s, c in enumerate(g))
