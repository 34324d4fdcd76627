"""``--dry-run`` bills Lean sandboxes with their start-ups, one batch each or reused.

A sandbox that serves one batch pays ``launcher.estimate.sandbox_start_s`` for every batch; reused
ones pay it about once, but stay alive (and billed) while they wait. Under the pool's default
``reuse = "auto"`` whether sandboxes will be reused is known only when they report isolated Lean
processes, so the estimate prices one batch each and prints the reused figure beside it.
"""

from __future__ import annotations

from typing import Any

import pytest

from leanrl.launch.plan import plan_for
from leanrl.train.es import ESConfig
from leanrl.train.grpo import GRPOConfig


def es(**over: Any) -> ESConfig:
    runtime = {"name": "modal", **over.pop("runtime", {})}
    launcher = {"name": "modal", "estimate": over.pop("estimate", {})}
    return ESConfig(
        population=30, tasks_per_step=128, launcher=launcher, env={"runtime": runtime}, **over
    )


def billed(cfg: Any, kind: str = "es") -> tuple[dict[str, float], str]:
    plan = plan_for(kind, cfg)
    return plan.estimate, plan.render()


def test_one_batch_per_sandbox_pays_a_start_up_per_batch() -> None:
    est, text = billed(es())
    # 30 members x 2 batches of 64 = 60 batches, each a fresh 4-core sandbox starting in 30 s
    assert "one batch per sandbox (reuse needs isolated Lean processes" in text
    assert "60 start-ups x 30 s" in text and "(reused: " in text
    later, _ = billed(es(estimate={"sandbox_start_s": 60.0}))
    assert later["sandbox_billed_core_s"] - est["sandbox_billed_core_s"] == pytest.approx(
        60 * 30.0 * 4
    )
    assert est["sandbox_core_s"] == 3840 * 4.0  # the checking itself is unchanged
    assert est["sandbox_billed_core_s"] > est["sandbox_core_s"]
    assert "sandbox core-s billed (15360 checking)" in text


def test_reused_sandboxes_pay_start_up_about_once() -> None:
    one, _ = billed(es())
    reused, text = billed(es(estimate={"sandbox_reuse": "reused"}))
    assert "sandbox billing: reused (estimate.sandbox_reuse = reused), up to 16 alive" in text
    assert reused["sandbox_billed_core_s"] < one["sandbox_billed_core_s"]
    assert reused["usd"] < one["usd"]
    slower, _ = billed(es(estimate={"sandbox_reuse": "reused", "sandbox_start_s": 60.0}))
    delta = slower["sandbox_billed_core_s"] - reused["sandbox_billed_core_s"]
    assert 0 < delta < 2 * 30.0 * 4  # fewer than two extra start-ups, not 60
    # "always" in the pool is reuse for the estimate too
    pool = {"max_sandboxes": 16, "reuse": "always"}  # a pool table replaces Modal's default
    always, text = billed(es(runtime={"modal": {"pool": pool}}))
    assert 'reused (pool.reuse = "always")' in text
    assert always["sandbox_billed_core_s"] == pytest.approx(reused["sandbox_billed_core_s"])


def test_max_uses_1_is_one_batch_per_sandbox_whatever_the_estimate_assumes() -> None:
    cfg = es(runtime={"modal": {"pool": {"max_uses": 1}}}, estimate={"sandbox_reuse": "reused"})
    est, text = billed(cfg)
    assert "one batch per sandbox (max_uses = 1): 60 start-ups" in text
    assert "(reused: " not in text  # no reuse to compare with
    assert est["sandbox_billed_core_s"] == pytest.approx(billed(es())[0]["sandbox_billed_core_s"])


def test_grpo_steps_bill_start_ups_and_a_local_runtime_bills_none() -> None:
    grpo = GRPOConfig(
        tasks_per_step=32,
        group_size=8,
        launcher={"name": "modal"},
        env={"runtime": {"name": "modal"}},
    )
    est, text = billed(grpo, "grpo")
    assert "4 start-ups x 30 s" in text  # 256 attempts: 4 batches of 64, all at once
    assert est["sandbox_billed_core_s"] > est["sandbox_core_s"] > 0
    local = GRPOConfig(tasks_per_step=32, group_size=8)
    est, text = billed(local, "grpo")
    assert est["sandbox_billed_core_s"] == est["sandbox_core_s"] == 0.0
    assert "sandbox billing" not in text
