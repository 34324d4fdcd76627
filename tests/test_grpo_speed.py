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


# -- AdamW ---------------------------------------------------------------------------------------


def _grads(params: list[Any], seed: int) -> None:
    import torch

    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * 1e-2


def test_fused_adamw_makes_the_loops_updates(loaded: tuple[Any, Any]) -> None:
    """The fused kernel the trainer uses and torch's per-tensor loop: the same weights after
    several steps with weight decay, to float rounding (they differ in the last bits only)."""
    import copy

    import torch

    from leanrl.train.optim import adamw

    a = copy.deepcopy(loaded[0])
    b = copy.deepcopy(loaded[0])
    pa, pb = list(a.parameters()), list(b.parameters())
    fused = adamw(pa, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1)
    loop = torch.optim.AdamW(pb, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1, foreach=False)
    assert fused.param_groups[0]["fused"] is True
    for step in range(4):
        for ps, opt in ((pa, fused), (pb, loop)):
            _grads(ps, step)
            opt.step()
            opt.zero_grad(set_to_none=True)
    base = list(loaded[0].parameters())
    with torch.no_grad():
        moved = max(float((x - y).abs().max()) for x, y in zip(pa, base, strict=True))
    assert moved > 1e-3  # the updates did something
    for x, y in zip(pa, pb, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


def test_an_old_loop_state_resumes_fused(loaded: tuple[Any, Any]) -> None:
    """An optimizer state saved by the per-tensor loop (checkpoints before issue 38) loads into
    the fused optimizer, which stays fused and continues as the loop would."""
    import copy

    import torch

    from leanrl.train.optim import adamw, kernel_of, set_kernel

    a = copy.deepcopy(loaded[0])
    pa = list(a.parameters())
    loop = torch.optim.AdamW(pa, lr=1e-2, weight_decay=0.1)  # the old engine's optimizer
    _grads(pa, 0)
    loop.step()
    saved = copy.deepcopy(loop.state_dict())
    b = copy.deepcopy(a)
    pb = list(b.parameters())
    fused = adamw(pb, lr=1e-2, betas=(0.9, 0.999), weight_decay=0.1)
    fused.load_state_dict(saved)
    assert not fused.param_groups[0].get("fused")  # the loaded groups say "loop"
    set_kernel(fused, kernel_of(pb, sharded=False))
    assert fused.param_groups[0]["fused"] is True
    for ps, opt in ((pa, loop), (pb, fused)):
        _grads(ps, 1)
        opt.step()
    for x, y in zip(pa, pb, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


def test_the_grpo_engine_builds_fused_adamw(tiny_model_dir: Path, tmp_path: Path) -> None:
    from leanrl.train.common import RunDir
    from leanrl.train.grpo import GRPOConfig
    from leanrl.train.grpo.engine import GRPOEngine

    cfg = GRPOConfig(policy=PolicyConfig(model=str(tiny_model_dir)), out=tmp_path / "run")
    engine = GRPOEngine(cfg, RunDir(cfg.out))
    engine.load(resumed=False)
    assert all(g["fused"] is True for g in engine.optimizer.param_groups)
