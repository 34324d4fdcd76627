"""Issue 38: benchmarks/grpo_vs_trl.py's measuring parts. CPU time per step is the difference
between consecutive step ends; the variable-length processor follows rows as they leave the
``hf`` sampler's batch, so every completion still gets its drawn length."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from leanrl.policy import PolicyConfig, SamplingConfig

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "grpo_vs_trl.py"


@pytest.fixture(scope="module")
def bench() -> Any:
    spec = importlib.util.spec_from_file_location("grpo_vs_trl_under_test", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_cpu_per_step_is_between_step_ends(bench: Any) -> None:
    meter = bench.CpuMeter()
    busy = bench._timed(meter, "generate", lambda s: _spin(s))
    for s in (0.01, 0.03, 0.02):
        busy(s)
        meter.mark()
    got = meter.per_step(skip=1)
    assert len(got["generate"]) == 2 and len(got["process"]) == 2  # steps 2 and 3
    for gen, proc, want in zip(got["generate"], got["process"], (0.03, 0.02), strict=True):
        assert gen == pytest.approx(want, abs=0.01)
        assert proc >= gen - 0.002  # the process clock counts the phase (and a little more)


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def _forced(bench: Any, model: Any, tok: Any, drop: bool) -> tuple[list[Any], list[int], list[int]]:
    """Completions, their drawn targets and the rows of each forward, with the processor on."""
    from leanrl.train.hf_policy import TrainPolicy

    eos = int(tok.eos_token_id)
    lengths = bench.DrawnLengths(7, 6.0, 0.6, 16, tok.all_special_ids)
    pol = TrainPolicy(PolicyConfig(model="t", chat=False, batch_size=64), model, tok,
                      drop_finished=drop)  # fmt: skip
    rows_seen: list[int] = []
    pre = model.register_forward_pre_hook(
        lambda _m, _a, kw: rows_seen.append(int(kw["input_ids"].shape[0])), with_kwargs=True
    )
    hook = model.register_forward_hook(bench._force_hook, with_kwargs=True)
    prompts = ["omega", "simp", "theorem foo : 1 = 1 := by"]
    token = bench._GENERATING.set(bench._Generating(lengths, eos, pol))
    try:
        out = pol.generate_sync(
            prompts, SamplingConfig(n=4, temperature=1.0, max_tokens=16, seed=1)
        )
    finally:
        bench._GENERATING.reset(token)
        hook.remove()
        pre.remove()
    return [c for g in out for c in g], lengths.drawn, rows_seen


def test_forced_lengths_follow_rows_that_leave_the_batch(bench: Any, tiny_model_dir: Path) -> None:
    """With rows leaving the batch the processor forces each row's own drawn length: the same
    completions as the decode that keeps every row, each ending in EOS at its target at the
    latest (earlier where the model chose EOS itself)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    got, targets, rows = _forced(bench, model, tok, drop=True)
    want, want_targets, full_rows = _forced(bench, model, tok, drop=False)
    assert targets == want_targets
    assert [(c.token_ids, c.logprobs) for c in got] == [(c.token_ids, c.logprobs) for c in want]
    lens = [len(c.token_ids) for c in got]
    assert all(n <= t for n, t in zip(lens, targets, strict=True))
    assert sum(n == t for n, t in zip(lens, targets, strict=True)) >= len(lens) - 2
    assert all(c.token_ids[-1] == int(tok.eos_token_id) for c in got)
    assert len(set(lens)) > 1 and min(rows) < len(lens) == min(full_rows)  # rows did leave
