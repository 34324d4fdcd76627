"""The REPL pool with real child processes (tests/fake_repl.py, a stand-in that speaks the REPL
protocol) that answer, hang, crash, eat memory or answer garbage."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from leanrl.lean.pool import PoolConfig, ReplPool
from leanrl.verdict import Attempt, Reason

FAKE = Path(__file__).with_name("fake_repl.py")
HEADER = "import Mathlib\nopen Real\n"


def fake_cmd(load_time: float = 0.0, pid_file: Path | None = None) -> list[str]:
    cmd = [sys.executable, str(FAKE), "--load-time", str(load_time)]
    return cmd + (["--pid-file", str(pid_file)] if pid_file else [])


def att(proof: str = "rfl", i: int = 0, header: str = HEADER, **fake: object) -> Attempt:
    if fake:
        proof += "\n  -- fake: " + json.dumps(fake)
    return Attempt(
        name="t",
        header=header,
        formal_statement="theorem t : 1 = 1 := by",
        proof=proof,
        id=f"a{i}",
    )


def pool(**kw: object) -> ReplPool:
    cfg: dict[str, object] = {"command": fake_cmd(), "workers": 2, "timeout_s": 3.0}
    cfg.update(kw)
    return ReplPool(PoolConfig.model_validate(cfg))


async def test_verdicts_in_order_one_per_attempt() -> None:
    p = pool()
    try:
        attempts = [
            att(i=0),
            att("sorry", i=1),
            att(i=2, check={"axioms": ["propext", "cheat"]}),
            att(i=3, check={"status": "type_mismatch"}),
            att(i=4),
        ]
        vs = await p.check(attempts)
    finally:
        await p.close()
    assert [v.id for v in vs] == ["a0", "a1", "a2", "a3", "a4"]
    assert [v.reason for v in vs] == [
        Reason.OK,
        Reason.SORRY,
        Reason.AXIOM,
        Reason.STATEMENT_CHANGED,
        Reason.OK,
    ]
    assert all(v.time_s >= 0 for v in vs)


async def test_hang_costs_one_attempt_and_the_spare_is_already_warm() -> None:
    p = pool(workers=1, spares=1, timeout_s=1.0)
    try:
        await p.warm(HEADER)  # one busy-capable process + one spare
        vs = await p.check([att(i=0, hang=True), att(i=1), att(i=2)])
        events = list(p.events)
    finally:
        await p.close()
    assert [v.reason for v in vs] == [Reason.TIMEOUT, Reason.OK, Reason.OK]
    assert "time limit" in vs[0].detail
    kill = next(i for i, (e, _) in enumerate(events) if e == "kill")
    after = next(pid for e, pid in events[kill:] if e == "acquire")
    ready_at = next(i for i, (e, pid) in enumerate(events) if e == "ready" and pid == after)
    assert ready_at < kill, "the process that took over was warm before the kill"
    assert p.stats.killed == 1


async def test_crash_garbage_and_memory_each_cost_one_attempt() -> None:
    p = pool(workers=2, memory_mb=200, timeout_s=10.0)
    try:
        vs = await p.check(
            [att(i=0, crash=True), att(i=1), att(i=2, garbage=True), att(i=3, oom=True), att(i=4)]
        )
    finally:
        await p.close()
    assert [v.reason for v in vs] == [
        Reason.CRASH,
        Reason.OK,
        Reason.CRASH,
        Reason.MEMORY,
        Reason.OK,
    ]
    assert "200 MiB" in vs[3].detail
    # A death is retried once on a fresh process (it could have come from outside); the crash
    # repeats there, so it is the attempt's own. Garbage is what the process printed (no kill
    # does that): not retried. 2 + 1 + 1 processes killed, and one more where the memory death
    # was first seen as a plain death: the peak is sampled, and on a loaded machine the sample
    # can miss it (seen once in issue 42's loaded runs), so that attempt is retried and its
    # second death is named for the cap. Either way each attempt gets its own verdict above.
    assert "on 2 fresh processes in a row" in vs[0].detail
    assert "fresh processes" not in vs[2].detail
    assert p.stats.crash_retried in (1, 2), p.stats
    assert p.stats.killed == 3 + p.stats.crash_retried, p.stats


def _pids(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


async def test_a_lean_process_killed_from_outside_is_not_the_attempts_crash(
    tmp_path: Path,
) -> None:
    """An operator's kill -9, or another program's memory pressure, is no answer of the model:
    neither an idle process that died before the attempt reached it, nor one killed while it
    worked, may turn a correct proof into ``crash`` (found by benchmarks/fault_soak.py)."""
    import asyncio
    import os
    import signal

    pids = tmp_path / "pids"
    p = pool(command=fake_cmd(pid_file=pids), workers=1, spares=0, timeout_s=30.0)
    try:
        assert (await p.check([att(i=0)]))[0].reason is Reason.OK
        for pid in _pids(pids):  # idle, warm, and now dead (not yet reaped)
            os.kill(pid, signal.SIGKILL)
        idle = (await p.check([att(i=1)]))[0]
        # long enough that the kill below lands while it works, on a loaded machine too
        busy_task = asyncio.ensure_future(p.check([att(i=2, delay=5.0)]))
        for _ in range(200):  # the process the slow attempt is on
            await asyncio.sleep(0.05)
            if p.stats.checked >= 3:
                break
        await asyncio.sleep(0.3)
        alive = [pid for pid in _pids(pids) if psutil.pid_exists(pid)]
        for pid in alive:
            os.kill(pid, signal.SIGKILL)
        busy = (await busy_task)[0]
    finally:
        await p.close()
    assert idle.reason is Reason.OK, idle.detail
    assert busy.reason is Reason.OK, busy.detail
    # At least one attempt ran again on a fresh process. (Both kills usually cost a retry each;
    # on a loaded machine the idle death can be seen before the attempt is sent, which is fine.)
    assert p.stats.crash_retried >= 1


async def test_without_crash_retries_a_dead_process_costs_its_attempt() -> None:
    p = pool(crash_retries=0)
    try:
        vs = await p.check([att(i=0, crash=True), att(i=1)])
    finally:
        await p.close()
    assert [v.reason for v in vs] == [Reason.CRASH, Reason.OK]
    assert p.stats.crash_retried == 0 and "fresh processes" not in vs[0].detail


async def test_debug_noise_before_an_answer_is_skipped() -> None:
    p = pool(workers=1)
    try:
        (v,) = await p.check([att(noise=True)])
    finally:
        await p.close()
    assert v.accepted, v.detail


async def test_recycle_after_n_attempts() -> None:
    p = pool(workers=1, spares=0, recycle_after=2)
    try:
        vs = await p.check([att(i=i) for i in range(5)])
    finally:
        await p.close()
    assert all(v.accepted for v in vs)
    # Elaborating processes and judges both retire after 2 attempts: 3 of each for 5 attempts.
    assert p.stats.recycled == 4 and p.stats.started == 6


async def test_recycle_above_memory_threshold() -> None:
    p = pool(workers=1, spares=0, recycle_memory_mb=60, memory_mb=1000)
    try:
        vs = await p.check([att(i=0, leak_mb=80), att(i=1), att(i=2)])
    finally:
        await p.close()
    assert all(v.accepted for v in vs)
    assert p.stats.recycled == 1


async def test_in_flight_bounded_by_workers() -> None:
    p = pool(workers=2, spares=0)
    try:
        vs = await p.check([att(i=i, delay=0.2) for i in range(6)])
    finally:
        await p.close()
    assert all(v.accepted for v in vs)
    assert p.stats.max_busy == 2


async def test_headers_with_same_imports_share_processes() -> None:
    p = pool(workers=1, spares=0)
    try:
        vs = await p.check([att(i=0, header=HEADER), att(i=1, header="import Mathlib\nopen Nat\n")])
    finally:
        await p.close()
    # One elaborating process and one judge serve both headers.
    assert all(v.accepted for v in vs) and p.stats.started == 2


async def test_other_imports_evict_idle_processes() -> None:
    p = pool(workers=1, spares=0)
    try:
        a = await p.check([att(i=0, header="import Mathlib\n")])
        b = await p.check([att(i=1, header="import Aesop\n")])
    finally:
        await p.close()
    assert a[0].accepted and b[0].accepted
    # The second header's elaborating process and judge each evict the first's.
    assert p.stats.evicted == 2 and p.stats.started == 4


async def test_broken_header_is_an_error_verdict_not_a_crash() -> None:
    err = {"severity": "error", "pos": {"line": 1, "column": 0}, "data": "unknown namespace"}
    header = "import Mathlib\nopen Nonexistent\n-- fake: " + json.dumps({"messages": [err]}) + "\n"
    p = pool(workers=1)
    try:
        vs = await p.check([att(i=0, header=header), att(i=1)])
    finally:
        await p.close()
    assert vs[0].reason is Reason.ERROR and "header" in vs[0].detail
    assert vs[1].accepted


async def test_missing_executable_gives_infra_verdicts() -> None:
    p = pool(command=["/nonexistent/repl"], workers=1)
    try:
        vs = await p.check([att(i=0), att(i=1)])
    finally:
        await p.close()
    assert [v.reason for v in vs] == [Reason.INFRA, Reason.INFRA]
    assert "did not start" in vs[0].detail


async def test_close_kills_every_process(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    p = pool(command=fake_cmd(pid_file=pids), workers=2, spares=1)
    try:
        await p.warm(HEADER)
        started = [int(x) for x in pids.read_text().split()]
        # Two elaborating processes, one spare, one judge.
        assert len(started) == 4 and len(p.live_processes()) == 4
        assert len(p.live_processes("judge")) == 1
    finally:
        await p.close()
    for pid in started:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def _bwrap_works() -> bool:
    exe = shutil.which("bwrap")
    if not exe:
        return False
    r = subprocess.run(
        [exe, "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "true"],
        capture_output=True,
        check=False,
    )
    return r.returncode == 0


@pytest.mark.skipif(
    not _bwrap_works(), reason="bubblewrap (bwrap) is missing or cannot sandbox here"
)
async def test_bubblewrap_isolation_read_only_and_offline(tmp_path: Path) -> None:
    target = tmp_path / "escape.txt"
    p = pool(workers=1, isolate=True)
    try:
        (v,) = await p.check([att(probe=str(target))])
    finally:
        await p.close()
    assert v.accepted, v.detail
    probe = next(m.data for m in v.messages if m.data.startswith("write="))
    assert probe.startswith("write=denied") and probe.endswith("net=denied")
    assert not target.exists()
