"""Costs: the price table, GPU names, per-step and total accounting, and the trainers' columns."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from leanrl.costs import CostMeter, PriceTable, Usage, gpu_kind, local_gpus, sandbox_usage
from leanrl.errors import ConfigError
from leanrl.runtime import Runtime
from leanrl.verdict import Attempt, Verdict


def test_price_table_defaults_and_lookup() -> None:
    p = PriceTable()
    assert p.gpu("H100") == 0.001097 and p.gpu("h100") == 0.001097
    assert p.gpu("A100-80GB") == 0.000694 and p.gpu("a100_80gb") == 0.000694
    assert p.gpu(None) == 0.0
    assert p.sandbox_cpu_core_per_s == 0.00003942 and p.cpu_core_per_s == 0.0000131
    with pytest.raises(ConfigError, match=r"no price for GPU type 'Z9'.*gpu_per_s"):
        p.gpu("Z9")
    assert PriceTable(gpu_per_s={"Z9": 0.5}).gpu("Z9") == 0.5


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA A100 80GB PCIe", "A100-80GB"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA L4", "L4"),
        ("Tesla T4", "T4"),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_gpu_kind_from_device_names(name: str, kind: str | None) -> None:
    assert gpu_kind(name) == kind


def test_local_gpus_on_cpu_bills_nothing() -> None:
    assert local_gpus("cpu", "auto") == (None, 0)
    assert local_gpus("cpu", "H100") == (None, 0)  # a CPU process holds no GPU
    assert local_gpus("cuda:0", "none") == (None, 0)
    assert local_gpus("cuda:0", "H100", 2) == ("H100", 2)


def test_usage_dollars_are_the_sum_of_priced_parts() -> None:
    p = PriceTable()
    u = Usage(
        gpu_s={"H100": 100.0, "L4": 10.0},
        sandbox_s=50,
        sandbox_cpu_s=200,
        sandbox_gib_s=800,
        cpu_s=30,
        gib_s=60,
    )
    want = (
        100 * 0.001097 + 10 * 0.000222 + 200 * 0.00003942 + 800 * 0.00000672
        + 30 * 0.0000131 + 60 * 0.00000222
    )  # fmt: skip
    assert u.usd(p) == pytest.approx(want, rel=1e-12)
    d = u.as_dict(p)
    assert d["gpu_s"] == 110.0 and d["sandbox_s"] == 50 and d["usd"] == pytest.approx(want)


def test_meter_steps_are_deltas_and_totals_survive_a_resume() -> None:
    p = PriceTable()
    m = CostMeter(p)
    r1 = m.step(Usage(gpu_s={"H100": 10.0}, sandbox_s=5, sandbox_cpu_s=20))
    r2 = m.step(Usage(gpu_s={"H100": 25.0}, sandbox_s=8, sandbox_cpu_s=32))
    assert r1["cost/gpu_s"] == 10 and r2["cost/gpu_s"] == 15 and r2["cost/sandbox_s"] == 3
    assert r2["cost/total_gpu_s"] == 25 and r2["cost/total_sandbox_cpu_s"] == 32
    assert r1["cost/usd"] + r2["cost/usd"] == pytest.approx(r2["cost/total_usd"])
    # a new process (resume): its counters restart at 0, the totals continue from the rows
    m2 = CostMeter(p)
    m2.resume([json.loads(json.dumps(r1)), json.loads(json.dumps(r2))])
    r3 = m2.step(Usage(gpu_s={"H100": 5.0}))
    assert r3["cost/total_gpu_s"] == 30 and r3["cost/total_sandbox_s"] == 8
    assert r3["cost/total_usd"] == pytest.approx(r2["cost/total_usd"] + 5 * 0.001097)


def test_sandbox_usage_reads_pool_figures() -> None:
    u = sandbox_usage({"pool_sandbox_s": 10, "pool_cpu_reserved_s": 40, "pool_memory_gib_s": 160})
    assert (u.sandbox_s, u.sandbox_cpu_s, u.sandbox_gib_s) == (10, 40, 160)
    assert sandbox_usage({"restarts": 3}).usd(PriceTable()) == 0.0


def test_modal_runtime_reports_memory_gib_seconds() -> None:
    from leanrl._sandbox_config import ModalConfig
    from leanrl.runtime import RuntimeConfig
    from leanrl.runtimes.modal import ModalRuntime

    rt = ModalRuntime(RuntimeConfig(name="modal", modal=ModalConfig(memory_mb=2048)))
    rt._totals["pool_sandbox_s"] = 0.0  # no pool yet: the totals only
    m = rt.metrics()
    assert m["pool_memory_gib_s"] == 0.0


class BilledRuntime(Runtime):
    """Reports sandbox figures that grow by a fixed amount per metrics() call."""

    name = "billed-test"
    calls = 0

    def metrics(self) -> dict[str, float]:
        BilledRuntime.calls += 1
        n = BilledRuntime.calls
        return {"pool_sandbox_s": 10.0 * n, "pool_cpu_reserved_s": 40.0 * n}

    async def check(self, attempts: Sequence[Attempt]) -> list[Verdict]:
        raise AssertionError("not used")


def test_es_rows_and_summary_carry_costs(toy_model_dir: Path, tmp_path: Path) -> None:
    from test_es_learning import ToyEnv, toy_config

    from leanrl.train.es import ESTrainer

    class Env(ToyEnv):
        def make_runtime(self) -> Runtime:
            return BilledRuntime(self.config.runtime)

    BilledRuntime.calls = 0
    cfg = toy_config(toy_model_dir, tmp_path / "run", steps=2, population=4, save_every=100)
    tr = ESTrainer(cfg, env=Env(cfg.env))
    rows = tr.train_sync()
    deltas = [r["cost/sandbox_s"] for r in rows]
    assert deltas[0] > 0 and deltas[0] == deltas[1]  # per-step deltas of a cumulative counter
    total = rows[-1]["cost/total_sandbox_s"]
    assert total == sum(deltas) and rows[-1]["cost/total_sandbox_cpu_s"] == 4 * total
    assert rows[-1]["cost/total_usd"] == pytest.approx(4 * total * 0.00003942)
    assert rows[-1]["cost/gpu_s"] == 0.0  # a CPU run holds no GPU
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["trainer"] == "es" and summary["steps"] == 2
    assert summary["cost"]["sandbox_s"] == total
    assert summary["cost"]["usd"] == pytest.approx(rows[-1]["cost/total_usd"])
