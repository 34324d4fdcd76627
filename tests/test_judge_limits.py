"""The judge cannot be stalled, crashed or starved by one attempt (issue 35, item 2, pool side).

A judge is a warm REPL process that runs only trusted text (the checker, the taskset's header
and reference statements) and reads each attempt's compiled constants as data; several workers
share it. The stand-in judge (tests/fake_repl.py) obeys ``-- fake: {"judge": {...}}`` in the
attempt it checks -- it aborts, hangs or fills its memory, as a restated term evaluated in a
real judge can (``Nat.shiftLeft 1 4294967296``, a huge ``Nat.pow``) -- and ``--check-leak-mb``
makes it keep memory after every check, as a real judge keeps every pickle it reads.

Promised, and checked here with real processes and a batch of several attempts:

* the attempt whose check killed, stalled or filled the judge gets ``judge_limit`` (not
  ``crash``/``timeout``/``memory``), and is never retried (its check reaches a judge once);
* the judge is replaced and every other attempt of the batch gets its own verdict;
* a judge found dead before a check was sent to it costs nothing (the check goes to another);
* judges are recycled on measured memory, so an innocent attempt never gets ``memory`` for
  what earlier checks left in its judge.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from leanrl.lean import pool as pool_module
from leanrl.lean.pool import PoolConfig, ReplPool
from leanrl.verdict import Attempt, Reason

FAKE = Path(__file__).with_name("fake_repl.py")


def fake_cmd(*extra: str) -> list[str]:
    return [sys.executable, str(FAKE), *extra]


def att(i: int, proof: str = "rfl", **fake: object) -> Attempt:
    if fake:
        proof += "\n  -- fake: " + json.dumps(fake)
    return Attempt(
        name="t",
        header="import Mathlib\n",
        formal_statement="theorem t : 1 = 1 := by",
        proof=proof,
        id=f"a{i}",
    )


def make_pool(log: Path | None = None, *extra: str, **kw: object) -> ReplPool:
    cmd = fake_cmd(*extra, *(["--log", str(log)] if log else []))
    cfg: dict[str, object] = {"command": cmd, "workers": 3, "judges": 1, "timeout_s": 5.0}
    cfg.update(kw)
    return ReplPool(PoolConfig.model_validate(cfg))


def batch(bad: dict[str, object]) -> list[Attempt]:
    return [
        att(0),
        att(1, judge=bad),
        att(2),
        att(3, "sorry"),
        att(4),
        att(5, check={"axioms": ["propext", "cheat"]}),
    ]


EXPECTED_OTHERS = [Reason.OK, Reason.OK, Reason.SORRY, Reason.OK, Reason.AXIOM]


def judge_pids(p: ReplPool) -> set[int]:
    return {pid for pid, role in p.roles.items() if role == "judge"}


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ({"crash": True}, "died while it checked"),
        ({"abort": True}, "died while it checked"),  # SIGABRT: a GMP overflow, a stack overflow
        ({"oom": True}, "memory cap"),
    ],
)
async def test_an_attempt_that_kills_its_judge_gets_judge_limit_and_the_batch_goes_on(
    bad: dict[str, object], words: str, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    p = make_pool(log, memory_mb=256)
    try:
        vs = await p.check(batch(bad))
        judges = judge_pids(p)
        killed = p.stats.killed
    finally:
        await p.close()
    v = vs[1]
    assert v.reason is Reason.JUDGE_LIMIT and words in v.detail, (v.reason, v.detail)
    assert [x.reason for x in vs[:1] + vs[2:]] == EXPECTED_OTHERS, [(x.id, x.reason) for x in vs]
    assert [x.id for x in vs] == [f"a{i}" for i in range(6)]
    # Never retried: exactly one check of that attempt reached a judge (a crash used to be
    # run again on a fresh judge, doubling the cost).
    rows = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    checks = [r for r in rows if r["kind"] == "check"]
    assert len(checks) == 5, len(checks)  # a3's sorry is rejected before any judge
    assert p.stats.crash_retried == 0 and p.stats.judge_limits == 1, p.stats
    # The judge was killed and a fresh one served whatever came after it: the checks ran on at
    # most two judges, one after the other, never back on the dead one. (Which check comes last
    # depends on which elaboration ends last; where the killer was last, no fresh judge is
    # needed, so the count of judges started is not the outcome to assert.)
    pids = [r["pid"] for r in checks]
    runs = [pid for i, pid in enumerate(pids) if i == 0 or pids[i - 1] != pid]
    assert killed == 1 and len(runs) == len(set(runs)) <= 2, (killed, pids)
    assert set(runs) <= judges, (runs, judges)


async def test_an_attempt_that_stalls_its_judge_gets_judge_limit_at_the_wall_clock_limit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The check gets what is left of the attempt's own time limit (at least CHECK_FLOOR_S).
    monkeypatch.setattr(pool_module, "CHECK_FLOOR_S", 0.5)
    log = tmp_path / "log"
    p = make_pool(log, timeout_s=1.0)
    try:
        vs = await p.check(batch({"hang": True}))
    finally:
        await p.close()
    v = vs[1]
    assert v.reason is Reason.JUDGE_LIMIT and "wall-clock limit" in v.detail, v.detail
    assert [x.reason for x in vs[:1] + vs[2:]] == EXPECTED_OTHERS
    assert p.stats.judge_limits == 1 and p.stats.crash_retried == 0


async def test_a_judge_found_dead_before_the_check_costs_nothing(tmp_path: Path) -> None:
    # Killed from outside while idle (the OOM killer, an operator): the attempt it was about
    # to check never reached it, so the check goes to another judge, at no cost. A guard for
    # the rule above (judge deaths are never retried): it must not reach a death the check
    # never caused. Whether the pool finds the judge reaped or still a zombie depends on timing;
    # both must end in a fresh judge and no `judge_limit`.
    p = make_pool(None, crash_retries=0)
    try:
        first = await p.check([att(0)])
        (judge,) = judge_pids(p)
        os.kill(judge, signal.SIGKILL)
        for _ in range(400):  # until the kernel says it is dead (zombie or gone)
            if _dead(judge):
                break
            await asyncio.sleep(0.01)
        later = await p.check([att(1), att(2)])
    finally:
        await p.close()
    assert first[0].accepted
    assert [v.reason for v in later] == [Reason.OK, Reason.OK], [v.detail for v in later]
    assert p.stats.judge_limits == 0


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
async def test_a_judge_killed_from_outside_mid_check_is_not_the_attempts_doing(
    sig: signal.Signals, tmp_path: Path
) -> None:
    # The kernel's OOM killer or an operator ends a judge while it checks an innocent attempt:
    # a signal only something outside sends. The check runs again on a fresh judge
    # (crash_retries), as for any process killed from outside; no `judge_limit`.
    log = tmp_path / "log"
    p = make_pool(log, "--check-time", "2", workers=1)
    try:
        task = asyncio.ensure_future(p.check([att(0)]))
        for _ in range(1000):  # until the check has reached a judge
            rows = log.read_text(encoding="utf-8").splitlines() if log.exists() else []
            checks = [json.loads(r) for r in rows if '"kind": "check"' in r]
            if checks:
                break
            await asyncio.sleep(0.01)
        os.kill(checks[0]["pid"], sig)
        (v,) = await asyncio.wait_for(task, 60)
    finally:
        await p.close()
    assert v.reason is Reason.OK, (v.reason, v.detail)
    assert p.stats.crash_retried == 1 and p.stats.judge_limits == 0, p.stats


def _dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


async def test_judges_are_recycled_on_measured_memory_so_innocents_never_get_memory() -> None:
    # Every check leaves 40 MiB in the judge. Under a 256 MiB cap the judge would go over it
    # after a few checks, and the innocent attempt then in it would get `memory`. Judges are
    # recycled once their measured memory passes 3/4 of the cap (recycle_memory_mb is left at
    # its default, 6144, far above this cap: the cap bounds it).
    p = make_pool(None, "--check-leak-mb", "40", workers=1, spares=0, memory_mb=256)
    try:
        vs = []
        for i in range(12):  # one at a time: each check lands on the same judge
            vs += await p.check([att(i)])
    finally:
        await p.close()
    assert [v.reason for v in vs] == [Reason.OK] * 12, [(v.reason, v.detail) for v in vs]
    assert p.stats.recycled >= 1 and p.stats.judge_limits == 0, p.stats
    assert len(judge_pids(p)) >= 2


def test_the_recycle_threshold_leaves_a_quarter_of_the_cap() -> None:
    cfg = PoolConfig(command=["x"], memory_mb=4096)  # recycle_memory_mb 6144 by default
    assert cfg.recycle_mb == 3072
    assert PoolConfig(command=["x"], memory_mb=None).recycle_mb == 6144
    assert PoolConfig(command=["x"]).recycle_mb == 6144  # the defaults keep their figure
