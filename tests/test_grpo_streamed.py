"""Issue 38: streamed training (``stream_training``), each group's gradient accumulated as soon
as the harness reports the group checked, the update after the last one.

- the engine: a batch trained group by group (unnormalised sums, the denominator applied to the
  gradient at the end) gives the synchronous step's gradient, update and metrics within float
  rounding, for every aggregation and the objective variants that allow it;
- the trainer: groups really are trained while the rollout is still going on; a streamed run
  repeats bit for bit whatever order and timing the groups are reported in; a harness that
  changes a group after reporting it is refused; what rules the mode out is said (``auto``) or
  refused (``true``).
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from test_grpo_objectives_ext import _batch_of, _engine
from test_grpo_trainer import DigitEnv, PromptHarness, _config

from leanrl import Harness, Rollout, Runtime, Task, Taskset
from leanrl.errors import ConfigError, PolicyError
from leanrl.harness import listen_for_groups, report_group
from leanrl.policy import Policy, PolicyConfig, SamplingConfig
from leanrl.train.grpo import GRPOConfig, GRPOTrainer
from leanrl.train.grpo.data import _Sample
from leanrl.train.grpo.streamed import StepSums, resolve_stream_training

# -- the engine: group by group equals all at once ------------------------------------------------


def _groups(engine: Any) -> list[list[_Sample]]:
    """Three groups of three sequences: different prompt and response lengths, masked tokens,
    advantages of both signs, and log-probs moved off the model's so the clip takes part."""
    tok = engine.tokenizer
    prompt = tok.encode("theorem t1 : 1 + 1 = 2 := by", add_special_tokens=False)
    body = tok.encode("  nlinarith [sq_nonneg x] omega simp rfl norm_num", add_special_tokens=False)
    rng = random.Random(7)
    groups = []
    for g in range(3):
        group = []
        for k in range(3):
            n = rng.randint(2, min(10, len(body)))
            mask = [int(rng.random() > 0.2) for _ in range(n)]
            mask[0] = 1
            group.append(_Sample(prompt=prompt[: 3 + g + k], resp=body[:n], mask=mask, old=[],
                                 adv=rng.uniform(-1.5, 1.5)))  # fmt: skip
        groups.append(group)
    engine._fill_logprobs([s for g in groups for s in g], "old")
    for g in groups:
        for s in g:  # the sampler a little off the trainer: ratios around 1 ± 0.3
            s.old = [o + rng.uniform(-0.3, 0.3) for o in s.old]
    return groups


def _grads_at_update(engine: Any) -> dict[str, torch.Tensor]:
    """The gradient the optimizer steps with (captured at its step)."""
    seen: dict[str, torch.Tensor] = {}
    step = engine.optimizer.step

    def spy(*a: Any, **k: Any) -> Any:
        for n, p in engine.model.named_parameters():
            if p.grad is not None:
                seen[n] = p.grad.detach().clone()
        return step(*a, **k)

    engine.optimizer.step = spy
    return seen


@pytest.mark.parametrize(
    "kw",
    [
        {"loss_agg": "dapo"},
        {"loss_agg": "grpo"},
        {"loss_agg": "dr_grpo"},
        {"beta": 0.05},
        {"is_correction": "token_truncate"},
        {"old_logprobs": "recompute"},
        {"loss": "cispo"},
        {"importance_sampling_level": "sequence"},
    ],
    ids=["dapo", "grpo", "dr_grpo", "kl", "is_correction", "recompute", "cispo", "gspo"],
)
def test_a_streamed_step_is_the_synchronous_step(
    tiny_model_dir: Path, tmp_path: Path, kw: dict[str, Any]
) -> None:
    base = dict(tasks_per_step=3, group_size=3, micro_batch_size=2, max_grad_norm=1e9, **kw)
    sync = _engine(tiny_model_dir, tmp_path / "sync", **base)
    streamed = _engine(tiny_model_dir, tmp_path / "streamed", **base)
    groups = _groups(sync)
    g_sync, g_streamed = _grads_at_update(sync), _grads_at_update(streamed)

    a = sync.train_step(_batch_of([s for g in copy.deepcopy(groups) for s in g]))
    sums = StepSums()
    copies = copy.deepcopy(groups)
    for g in copies:
        streamed.accumulate(sums, g)
    batch = _batch_of([s for g in copies for s in g])
    batch.streamed = sums
    b = streamed.train_step(batch)

    assert sums.n_seqs == 9 and b["optimizer_steps"] == 1 and b["time_train_streamed"] > 0
    scale = max(float(v.abs().max()) for v in g_sync.values())
    assert scale > 0
    for n in g_sync:  # the same gradient, to float rounding (another summation order)
        assert torch.allclose(g_streamed[n], g_sync[n], rtol=1e-4, atol=1e-6 * scale), n
    for key in ("loss", "kl_behaviour", "clip_frac", "entropy", "grad_norm", "kl"):
        if a[key] is None:
            assert b[key] is None, key
        else:
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-7), key
    w_sync = dict(sync.model.named_parameters())
    for n, p in streamed.model.named_parameters():
        assert torch.allclose(p, w_sync[n], rtol=0, atol=1e-5), n
    assert sync.step == streamed.step == 1


def test_a_streamed_step_with_nothing_to_learn_moves_time_on(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    engine = _engine(tiny_model_dir, tmp_path / "e")
    before = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
    sums = StepSums()
    engine.accumulate(sums, [_Sample(prompt=[1, 2], resp=[3], mask=[0], old=[0.0], adv=1.0)])
    batch = _batch_of([])
    batch.streamed = sums
    row = engine.train_step(batch)
    assert row["skipped"] is True and engine.step == 1
    assert all(torch.equal(p, before[n]) for n, p in engine.model.named_parameters())


# -- the trainer -----------------------------------------------------------------------------------


class ReportingHarness(PromptHarness):
    """PromptHarness that reports each group final before returning them all, in an order and
    with pauses set per test; ``hold`` keeps the rollout from returning until a group has been
    trained on (``trained`` set by the engine's accumulate), or fails after 60 s."""

    name = "test-reporting"
    order: str = "forward"  # or "shuffled"
    hold = False
    trained: threading.Event | None = None
    tamper: str | None = None  # "reward": change a reported reward; "swap": return others
    held_ok: ClassVar[list[bool]] = []

    async def run(
        self,
        tasks: Sequence[Task],
        policy: Policy,
        runtime: Runtime,
        sampling: SamplingConfig,
        taskset: Taskset,
    ) -> list[list[Rollout]]:
        out = await super().run(tasks, policy, runtime, sampling, taskset)
        idx = list(range(len(out)))
        if self.order == "shuffled":
            random.Random(sampling.seed).shuffle(idx)
        for n, i in enumerate(idx):
            report_group(tasks[i], out[i])
            await asyncio.sleep(random.uniform(0, 0.02) if self.order == "shuffled" else 0)
            if n == 0 and self.hold:
                assert self.trained is not None
                for _ in range(6000):  # up to 60 s, cancellable (a thread's wait is not)
                    if self.trained.is_set():
                        break
                    await asyncio.sleep(0.01)
                type(self).held_ok.append(self.trained.is_set())
        if self.tamper == "raise":
            raise RuntimeError("the harness failed after reporting its groups")
        if self.tamper == "reward":
            out[0][0].reward += 0.5
        elif self.tamper == "swap":
            out[0] = [copy.copy(r) for r in out[0]]
        return out


class ReportingEnv(DigitEnv):
    def make_harness(self) -> Harness:
        return ReportingHarness(self.config.harness)


def _run(cfg: Any) -> list[dict[str, Any]]:
    return GRPOTrainer(cfg, env=ReportingEnv()).train_sync()


def _weights(model: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _final_weights(out: Path, step: int) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(out / f"checkpoint-{step}" / "model.safetensors"))


def test_groups_are_trained_while_the_rollout_goes_on(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from leanrl.train.grpo.engine import GRPOEngine

    trained = threading.Event()
    calls: list[int] = []
    plain = GRPOEngine.accumulate

    def accumulate(self: Any, sums: StepSums, samples: list[_Sample]) -> None:
        plain(self, sums, samples)
        calls.append(len(samples))
        trained.set()

    monkeypatch.setattr(GRPOEngine, "accumulate", accumulate)
    monkeypatch.setattr(ReportingHarness, "hold", True)
    monkeypatch.setattr(ReportingHarness, "trained", trained)
    monkeypatch.setattr(ReportingHarness, "held_ok", [])
    rows = _run(_config(tiny_model_dir, tmp_path / "run", steps=1, dynamic_sampling="off"))
    assert ReportingHarness.held_ok == [True]  # a group trained before the rollout returned
    assert calls == [4, 4, 4, 4]  # each group on its own, once
    assert rows[0]["time_train_streamed"] > 0 and rows[0]["optimizer_steps"] == 1


@pytest.mark.parametrize("sampling", ["off", "refill"])
def test_a_streamed_run_repeats_whatever_the_report_order(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sampling: str
) -> None:
    """Groups reported in task order at once, or shuffled with pauses: the same weights bit for
    bit (task order is kept); and the unstreamed run (the update after the last verdict) is the
    same run within float rounding. With refill (the default dynamic sampling) the streamed
    rounds keep exactly the groups the unstreamed step keeps."""
    kw = dict(steps=3, save_every=3, dynamic_sampling=sampling)
    _run(_config(tiny_model_dir, tmp_path / "a", **kw))
    monkeypatch.setattr(ReportingHarness, "order", "shuffled")
    _run(_config(tiny_model_dir, tmp_path / "b", **kw))
    a, b = _final_weights(tmp_path / "a", 3), _final_weights(tmp_path / "b", 3)
    assert all(torch.equal(a[n], b[n]) for n in a)

    rows_c = _run(_config(tiny_model_dir, tmp_path / "c", stream_training=False, **kw))
    c = _final_weights(tmp_path / "c", 3)
    rows_a = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    for ra, rc in zip(rows_a, rows_c, strict=True):
        for key in ("groups", "groups_kept", "loss_tokens"):
            assert ra[key] == rc[key], key
    start = _final_weights_of_model(tiny_model_dir)
    moved = max(float((a[n] - start[n]).abs().max()) for n in a)
    assert moved > 1e-3
    assert max(float((a[n] - c[n]).abs().max()) for n in a) < 0.05 * moved


def _final_weights_of_model(model: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(model / "model.safetensors"))


@pytest.mark.parametrize("tamper", ["reward", "swap"])
def test_a_group_changed_after_its_report_is_refused(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tamper: str
) -> None:
    monkeypatch.setattr(ReportingHarness, "tamper", tamper)
    with pytest.raises(PolicyError, match="report_group"):
        _run(_config(tiny_model_dir, tmp_path / "run", steps=1, dynamic_sampling="off"))


def test_a_rollout_that_fails_after_reports_fails_the_step_with_its_error(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Groups already trained on do not hide the harness's own error, and the step never
    updates the weights (the run folder has no checkpoint, so a rerun starts over)."""
    monkeypatch.setattr(ReportingHarness, "tamper", "raise")
    with pytest.raises(RuntimeError, match="failed after reporting"):
        _run(_config(tiny_model_dir, tmp_path / "run", steps=1, dynamic_sampling="off"))
    assert not list((tmp_path / "run").glob("checkpoint-*"))


def test_a_failed_group_pass_stops_the_rollout_at_once(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group's pass that fails (here: raises) cancels the rollout still going on instead of
    waiting for its end: the holding harness never gets past its wait."""
    from leanrl.train.grpo.engine import GRPOEngine

    def accumulate(self: Any, sums: StepSums, samples: list[_Sample]) -> None:
        raise RuntimeError("the group's pass ran out of memory")

    monkeypatch.setattr(GRPOEngine, "accumulate", accumulate)
    monkeypatch.setattr(ReportingHarness, "hold", True)
    monkeypatch.setattr(ReportingHarness, "trained", threading.Event())  # never set
    monkeypatch.setattr(ReportingHarness, "held_ok", [])
    with pytest.raises(RuntimeError, match="ran out of memory"):
        _run(_config(tiny_model_dir, tmp_path / "run", steps=1, dynamic_sampling="off"))
    assert ReportingHarness.held_ok == []  # cancelled while it waited (else [False] after 60 s)


def test_masked_samples_still_count_in_the_step_metrics(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """mask_truncated masks every cut-off attempt: their samples train nothing but are the
    batch's still, so the advantage and token metrics are the unstreamed step's."""
    kw = dict(steps=2, dynamic_sampling="off", mask_truncated=True,
              sampling=SamplingConfig(max_tokens=8, top_p=1.0, seed=0))  # fmt: skip
    a = _run(_config(tiny_model_dir, tmp_path / "a", **kw))
    b = _run(_config(tiny_model_dir, tmp_path / "b", stream_training=False, **kw))
    assert any(r["truncated_frac"] and r["truncated_frac"] < 1 for r in a)  # some masked
    for ra, rb in zip(a, b, strict=True):
        for key in ("adv_mean", "adv_std", "adv_min", "adv_max", "loss_tokens", "groups_kept"):
            assert ra[key] == pytest.approx(rb[key], rel=1e-6, abs=1e-9), key


def test_report_group_outside_a_listener_does_nothing_and_listeners_nest() -> None:
    task = Task(id="t", name="t", header="", formal_statement="theorem t : True := by")
    report_group(task, [])  # nobody listens: no error
    outer: list[str] = []
    inner: list[str] = []
    with listen_for_groups(lambda t, g: outer.append(t.id)):
        report_group(task, [])
        with listen_for_groups(lambda t, g: inner.append(t.id)):
            report_group(task, [])
        report_group(task, [])
    report_group(task, [])
    assert (outer, inner) == (["t", "t"], ["t"])


# -- when it is on ---------------------------------------------------------------------------------


def _cfg(tmp_path: Path, **kw: Any) -> GRPOConfig:
    kw.setdefault("policy", PolicyConfig(model="m"))
    return GRPOConfig(out=tmp_path, **kw)


@pytest.mark.parametrize(
    ("kw", "ranks", "why"),
    [
        ({"async_generation": True}, 1, "async_generation"),
        ({}, 2, "2 ranks"),
        ({"ppo_epochs": 2}, 1, "passes"),
        ({"minibatches": 2, "group_size": 4}, 1, "mini-batches"),
        ({"scale_rewards": "batch"}, 1, "scale_rewards"),
        ({"replay": {"fraction": 0.5}}, 1, "replay"),
        ({"disable_dropout": False}, 1, "dropout"),
        ({"lora": {"rank": 4}, "beta": 0.1}, 1, "LoRA"),
        ({"lora": {"rank": 4, "dropout": 0.1}}, 1, "LoRA dropout"),
        ({"gradient_checkpointing": True}, 1, "gradient checkpointing"),
        ({"logprob_chunk": 64}, 1, "logprob_chunk"),
    ],
)
def test_what_rules_it_out(tmp_path: Path, kw: dict[str, Any], ranks: int, why: str) -> None:
    auto = resolve_stream_training(_cfg(tmp_path, **kw), ranks)
    assert not auto.on and why in auto.reason and auto.line().startswith("stream training: off")
    with pytest.raises(ConfigError, match=why):
        resolve_stream_training(_cfg(tmp_path, stream_training=True, **kw), ranks)
    assert not resolve_stream_training(_cfg(tmp_path, stream_training=False, **kw), ranks).on


def test_what_the_hf_sampler_shares_rules_out_only_hf(tmp_path: Path) -> None:
    """vLLM generates on its own copy: the model's modes and head are the trainer's alone."""
    vllm = PolicyConfig(model="m", backend="vllm")
    for kw in ({"gradient_checkpointing": True}, {"logprob_chunk": 64}, {"disable_dropout": False}):
        cfg = _cfg(tmp_path, policy=vllm, async_generation=False, stream_training=True, **kw)
        assert resolve_stream_training(cfg, 1).on


def test_auto_is_on_for_hf_only(tmp_path: Path) -> None:
    default = resolve_stream_training(_cfg(tmp_path), 1)
    assert (
        default.on
        and default.line() == "stream training: on (auto: hf, one process, one update per step)"
    )
    vllm = _cfg(tmp_path, policy=PolicyConfig(model="m", backend="vllm"), async_generation=False)
    got = resolve_stream_training(vllm, 1)
    assert not got.on and "hf backend only" in got.reason
    on = _cfg(tmp_path, policy=PolicyConfig(model="m", backend="vllm"), stream_training=True)
    assert resolve_stream_training(on.model_copy(update={"async_generation": False}), 1).on
    async_vllm = resolve_stream_training(_cfg(tmp_path, policy=vllm.policy), 1)
    assert not async_vllm.on and "async_generation" in async_vllm.reason  # auto: the pipeline
    assert not resolve_stream_training(_cfg(tmp_path, stream_training=False), 1).on
