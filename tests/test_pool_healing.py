"""A pool that heals: REPL processes that fail to start are infrastructure, never the model's
`error`, and the first start that succeeds clears them (issue 27, item 1).

The stand-in REPL (tests/fake_repl.py) dies before answering in its first N starts, as a REPL
killed during start-up does. For N in 1..5 the verdicts are checked in the pool itself, through
`leanrl serve` (whose /health must say `degraded` while starts fail), and in `leanrl eval`
(whose resume must redo every `infra` attempt and end at the true pass@1 of 1.0).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import httpx
import pytest
from _service_testing import running_service

from leanrl import EnvironmentConfig, RuntimeConfig, TasksetConfig
from leanrl.eval import EvalConfig, run_eval
from leanrl.lean.pool import PoolConfig, ReplPool
from leanrl.runtimes.local import LocalRuntime
from leanrl.verdict import Attempt, Reason
from tests._scripted_runtime import ScriptedPolicy

FAKE = Path(__file__).with_name("fake_repl.py")
FAST = {"start_retries": 2, "start_backoff_s": 0.05, "max_start_backoff_s": 0.2}


def failing_cmd(n: int, starts: Path) -> list[str]:
    return [sys.executable, str(FAKE), "--fail-starts", str(n), "--starts-file", str(starts)]


def att(i: int) -> Attempt:
    return Attempt(
        name="t",
        header="import Mathlib\n",
        formal_statement="theorem t : 1 = 1 := by",
        proof="rfl",
        id=f"a{i}",
    )


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
async def test_the_pool_heals_after_n_failed_starts(n: int, tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    p = ReplPool(
        PoolConfig(command=failing_cmd(n, starts), workers=1, spares=0, timeout_s=5.0, **FAST)
    )
    seen: list[Reason] = []
    try:
        for _ in range(100):  # bounded: the stand-in heals after n starts
            vs = await p.check([att(0), att(1)])
            seen += [v.reason for v in vs]
            if all(v.accepted for v in vs):
                break
            for v in vs:
                assert v.reason in (Reason.OK, Reason.INFRA), (v.reason, v.detail)
                if v.reason is Reason.INFRA:
                    assert "start" in v.detail, v.detail
            await asyncio.sleep(0.06)
        problems = p.problems()
        later = await p.check([att(2), att(3)])
    finally:
        await p.close()
    assert Reason.ERROR not in seen, seen
    assert seen[-2:] == [Reason.OK, Reason.OK], seen
    assert [v.reason for v in later] == [Reason.OK, Reason.OK]
    assert problems == []
    if n < FAST["start_retries"]:
        # fewer failures than the retries: nobody even saw `infra`
        assert set(seen) == {Reason.OK}, seen
    else:
        assert Reason.INFRA in seen and p.stats.healed >= 1, (seen, p.stats)
    assert p.stats.start_failures == n


async def test_a_header_lean_refuses_stays_an_error_and_is_reported(tmp_path: Path) -> None:
    # The other kind of start failure: Lean's answer says the imports do not elaborate. That
    # is the taskset's fault and does not heal; it must not be mistaken for infrastructure.
    from leanrl.lean.worker import WorkerStartError

    p = ReplPool(PoolConfig(command=failing_cmd(0, tmp_path / "s"), workers=1, spares=0, **FAST))
    await p.start()

    async def refuse(self: object, timeout: float) -> None:
        raise WorkerStartError("the imports do not elaborate: unknown package", header_fault=True)

    from leanrl.lean import worker as worker_mod

    orig = worker_mod.ReplWorker.start
    worker_mod.ReplWorker.start = refuse  # type: ignore[method-assign,assignment]
    try:
        vs = await p.check([att(0)])
        problems = p.problems()
    finally:
        worker_mod.ReplWorker.start = orig  # type: ignore[method-assign]
        await p.close()
    assert vs[0].reason is Reason.ERROR and "unknown package" in vs[0].detail
    assert problems and problems[0].startswith("header:"), problems
    assert "import Mathlib" in problems[0] and "elab" in problems[0], problems


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
async def test_the_service_heals_and_health_says_degraded_meanwhile(n: int, tmp_path: Path) -> None:
    rt = LocalRuntime(
        RuntimeConfig(
            workers=1,
            timeout_s=5.0,
            isolate=False,  # the stand-in counts its starts in a file outside any sandbox
            options={"repl_command": failing_cmd(n, tmp_path / "starts"), "spares": 0, **FAST},
        )
    )
    body = {"attempts": [json.loads(att(i).model_dump_json()) for i in range(2)]}
    reasons: list[str] = []
    statuses: list[str] = []
    async with running_service(rt) as url, httpx.AsyncClient(timeout=30) as http:
        for _ in range(100):
            r = await http.post(f"{url}/check", json=body)
            assert r.status_code == 200, r.text
            got = [v["reason"] for v in r.json()["verdicts"]]
            reasons += got
            h = (await http.get(f"{url}/health")).json()
            statuses.append(h["status"])
            if h["status"] == "degraded":
                assert any(p.startswith("infra:") for p in h["problems"]), h
            if got == ["ok", "ok"]:
                break
            await asyncio.sleep(0.06)
        final = (await http.get(f"{url}/health")).json()
    assert "error" not in reasons, reasons
    assert reasons[-2:] == ["ok", "ok"], reasons
    assert final["status"] == "ok" and final["problems"] == [], final
    if n >= FAST["start_retries"]:
        assert "infra" in reasons and "degraded" in statuses, (reasons, statuses)


@pytest.mark.parametrize("n", [1, 3, 5])
async def test_eval_never_scores_a_failed_start_and_resume_ends_at_the_truth(
    n: int, bench_data: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    cfg = EvalConfig(
        env=EnvironmentConfig(
            id="minif2f",
            taskset=TasksetConfig(path=bench_data / "minif2f.jsonl", limit=4),
            runtime=RuntimeConfig(
                workers=1,
                timeout_s=5.0,
                isolate=False,  # the stand-in counts its starts in a file outside any sandbox
                options={
                    "repl_command": failing_cmd(n, tmp_path / "starts"),
                    "spares": 0,
                    **FAST,
                },
            ),
        ),
        samples=2,
        k=[1],
        out=out,
        chunk_tasks=1,
        progress=False,
    )
    summaries = []
    for _ in range(8):  # a resume redoes the `infra` attempts; the stand-in heals after n
        summaries.append(await run_eval(cfg, policy=ScriptedPolicy(["\n  omega\n"])))
        if summaries[-1]["results"]["infra"] == 0:
            break
        await asyncio.sleep(0.25)
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    reasons = {r["verdict"]["reason"] for r in rows}
    assert "error" not in reasons, reasons
    res = summaries[-1]["results"]
    assert res["infra"] == 0 and res["pass_at_k"]["all"] == {"tasks": 4, "pass@1": 1.0}, res
