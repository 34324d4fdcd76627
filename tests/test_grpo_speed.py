"""Issue 38: a cheaper GRPO step. The ``hf`` sampler drops finished rows from its decode batch
with the same rollouts as the full-batch decode; AdamW runs fused/foreach with the same updates
as the per-tensor loop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from leanrl.policy import PolicyConfig, SamplingConfig

PROMPTS = ["theorem foo (x : ℝ) : x ^ 2 ≥ 0 := by", "omega", "simp", "rfl", "norm_num"]


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    return model, AutoTokenizer.from_pretrained(tiny_model_dir)


def _policy(loaded: tuple[Any, Any], drop: bool) -> Any:
    from leanrl.train.hf_policy import TrainPolicy

    model, tok = loaded
    return TrainPolicy(PolicyConfig(model="t", chat=False, batch_size=64), model, tok,
                       drop_finished=drop)  # fmt: skip


def _rows_per_step(model: Any) -> tuple[list[int], Any]:
    seen: list[int] = []

    def hook(_m: Any, args: Any, kwargs: dict[str, Any]) -> None:
        seen.append(int(kwargs["input_ids"].shape[0]))

    return seen, model.register_forward_pre_hook(hook, with_kwargs=True)


@pytest.mark.parametrize(
    "sampling",
    [
        # stop strings end rows at different steps (the tiny model writes spaces at random)
        SamplingConfig(n=4, temperature=1.0, max_tokens=24, seed=11, stop=[" "]),
        SamplingConfig(n=3, temperature=0.8, top_p=0.9, max_tokens=20, seed=5, stop=[" ", "a"]),
        SamplingConfig(n=2, temperature=0.0, max_tokens=16, seed=None, stop=[" b", "rfl"]),
    ],
    ids=["sampled", "top_p", "greedy"],
)
def test_dropping_finished_rows_gives_the_same_rollouts(
    loaded: tuple[Any, Any], sampling: SamplingConfig
) -> None:
    """Token ids, log-probs, texts and finish reasons are bit for bit those of the decode that
    keeps every row to the end (same seeds, same call counter: two calls each), while later
    decode steps really run on fewer rows."""
    want = _policy(loaded, drop=False)
    got = _policy(loaded, drop=True)
    seen, handle = _rows_per_step(loaded[0])
    try:
        for _ in range(2):  # the second call of a seed draws from the next generator
            a = want.generate_sync(PROMPTS, sampling)
            n_full = len(seen)
            b = got.generate_sync(PROMPTS, sampling)
            full, compact = seen[:n_full], seen[n_full:]
            seen.clear()
            flat_a = [c for g in a for c in g]
            flat_b = [c for g in b for c in g]
            assert [c.token_ids for c in flat_a] == [c.token_ids for c in flat_b]
            assert [c.logprobs for c in flat_a] == [c.logprobs for c in flat_b]  # exact
            assert [(c.text, c.finish_reason) for c in flat_a] == [
                (c.text, c.finish_reason) for c in flat_b
            ]
            lengths = sorted(len(c.token_ids) for c in flat_b)
            assert lengths[0] < lengths[-1], "rows must end at different steps for this test"
            assert len(full) == len(compact)  # as many decode steps
            assert set(full) == {len(flat_a)}  # the old decode: every row, every step
            assert compact[0] == len(flat_b) and min(compact) < len(flat_b)
    finally:
        handle.remove()


def test_the_batch_keeps_a_floor_of_rows(loaded: tuple[Any, Any]) -> None:
    """Finished rows leave only down to MIN_ROWS (below it the BLAS kernel changes, and with it
    the last bits of the logits); the filler rows' outputs are discarded."""
    from leanrl.train.hf_policy import MIN_ROWS

    sampling = SamplingConfig(n=4, temperature=1.0, max_tokens=24, seed=11, stop=[" "])
    seen, handle = _rows_per_step(loaded[0])
    try:
        out = _policy(loaded, drop=True).generate_sync(PROMPTS, sampling)
    finally:
        handle.remove()
    assert min(seen) == MIN_ROWS
    lengths = [len(c.token_ids) for g in out for c in g]
    # the decode ran as many steps as the longest row, each row stopped at its own end
    assert len(seen) == max(lengths) and min(lengths) < max(lengths)


def test_streamed_rows_are_the_same_when_rows_leave(loaded: tuple[Any, Any]) -> None:
    """The stream's hand-over (``on_done``) with rows leaving the batch: each row once, the
    same completion as the returned one, at the step it ended."""
    sampling = SamplingConfig(n=3, temperature=1.0, max_tokens=24, seed=2, stop=[" "])
    pol = _policy(loaded, drop=True)
    handed: dict[tuple[int, int], Any] = {}

    def on_done(i: int, s: int, c: Any) -> None:
        assert (i, s) not in handed
        handed[(i, s)] = c

    ids = [pol.tokenize(p) for p in PROMPTS]
    out = pol.generate_ids_sync(ids, sampling, on_done)
    ref = _policy(loaded, drop=False).generate_ids_sync(ids, sampling)
    assert handed == {(i, s): c for i, g in enumerate(out) for s, c in enumerate(g)}
    assert out == ref
