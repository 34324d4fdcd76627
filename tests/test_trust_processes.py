"""The process side of the trust boundary, with real child processes (tests/fake_repl.py, a
stand-in that speaks the REPL protocol and can act as a process an attempt took over).

Each test names the attack (or failure) it stops and checks the verdict's reason."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from leanrl.lean import pool as pool_module
from leanrl.lean.pool import PoolConfig, ReplPool
from leanrl.lean.trust.containment import isolation_problem, sweep_stale
from leanrl.lean.trust.judge import take_pickle
from leanrl.verdict import Attempt, Reason, VerificationPolicy

FAKE = Path(__file__).with_name("fake_repl.py")
HEADER = "import Mathlib\n"
UNSCANNED = VerificationPolicy(forbid_tokens=False)
needs_bwrap = pytest.mark.skipif(
    isolation_problem() is not None, reason=f"needs bubblewrap: {isolation_problem()}"
)


def fake_cmd(*extra: str) -> list[str]:
    return [sys.executable, str(FAKE), *extra]


def att(
    proof: str = "rfl", i: int = 0, policy: VerificationPolicy | None = None, **fake: object
) -> Attempt:
    if fake:
        proof += "\n  -- fake: " + json.dumps(fake)
    return Attempt(
        name="t",
        header=HEADER,
        formal_statement="theorem t : 1 = 1 := by",
        proof=proof,
        policy=policy or VerificationPolicy(),
        id=f"a{i}",
    )


def make_pool(**kw: object) -> ReplPool:
    cfg: dict[str, object] = {"command": fake_cmd(), "workers": 1, "spares": 0, "timeout_s": 5.0}
    cfg.update(kw)
    return ReplPool(PoolConfig.model_validate(cfg))


def requests_by_pid(log: Path) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for line in log.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        out.setdefault(row["pid"], []).append(row)
    return out


# -- the verdict comes from a process the attempt never touched --------------------------------


async def test_a_taken_over_elaborating_process_cannot_accept_its_own_attempt() -> None:
    """Attack: the attempt's code owns the process that elaborates it: it hides its `sorry` and
    errors, and answers any trusted check put to it with a forged `ok` carrying the right nonce.
    The check goes to a judge that never saw the attempt, which finds `sorryAx` in the data."""
    p = make_pool()
    try:
        (v,) = await p.check([att("sorry", policy=UNSCANNED, compromise=True)])
    finally:
        await p.close()
    assert not v.accepted
    assert v.reason is Reason.SORRY and "sorryAx" in v.detail


async def test_checks_go_only_to_judges_and_judges_never_see_model_text(tmp_path: Path) -> None:
    """Structural: no code path sends the trusted check to a process that elaborated model text
    (or ran tactics), and no judge is ever given model text. Fails if any path reads a report
    from the attempt's process."""
    log = tmp_path / "requests.jsonl"
    p = make_pool(command=fake_cmd("--log", str(log)), workers=2, spares=1)
    marker = "MODEL_TEXT_MARKER"
    try:
        attempts = [att(f"simp -- {marker} {i}", i=i) for i in range(6)]
        attempts.append(att(f"sorry -- {marker}", i=9, policy=UNSCANNED, compromise=True))
        vs = await p.check(attempts)
        worker = await p.acquire(HEADER)  # a tactic session's process
        await worker.tactic_start(HEADER, "theorem t : 1 = 1 := by", "", 5.0)
        await p.release(HEADER, worker)
        roles = dict(p.roles)
    finally:
        await p.close()
    assert [v.accepted for v in vs] == [True] * 6 + [False]
    by_pid = requests_by_pid(log)
    judges = {pid for pid, r in roles.items() if r == "judge"}
    assert judges and set(by_pid) <= set(roles)
    for pid, reqs in by_pid.items():
        kinds = {r["kind"] for r in reqs}
        saw_model_text = any(marker in r["text"] for r in reqs) or "tactic" in kinds
        if "check" in kinds:
            assert pid in judges and not saw_model_text, (pid, roles[pid], kinds)
        if pid in judges:
            assert not saw_model_text and "pickle" not in kinds and "tactic" not in kinds
    assert sum(r["kind"] == "check" for reqs in by_pid.values() for r in reqs) == 7
    # The nonce of every check never appears in anything a non-judge process was sent (paths
    # included): nothing the attempt ran could have seen it.
    nonces = [
        re.search(r'"([0-9a-f]{32})"', r["text"]).group(1)  # type: ignore[union-attr]
        for reqs in by_pid.values()
        for r in reqs
        if r["kind"] == "check"
    ]
    others = [r["text"] for pid, reqs in by_pid.items() if pid not in judges for r in reqs]
    assert len(nonces) == 7 and not any(n in t for n in nonces for t in others)


async def test_judges_are_separate_processes_from_elaboration() -> None:
    p = make_pool(workers=3, judges=2)
    try:
        await p.warm(HEADER)
        elab = {q.pid for q in p.live_processes("elab")}
        judge = {q.pid for q in p.live_processes("judge")}
    finally:
        await p.close()
    assert len(judge) == 2 and len(elab) >= 3 and not elab & judge


async def test_a_forged_report_printed_by_the_attempt_is_never_read() -> None:
    """Attack: the attempt's elaboration prints a well-formed `LEANRL-CHECK` report (status ok,
    no axioms). Only the judge's answer to the check command is parsed."""
    forged = {
        "nonce": "0" * 32,
        "status": "ok",
        "kind": "theorem",
        "ref_kind": "theorem",
        "axioms": [],
        "constants": ["t"],
        "replayed": True,
    }
    msg = {"severity": "info", "data": "LEANRL-CHECK " + json.dumps(forged)}
    p = make_pool()
    try:
        (v,) = await p.check(
            [att("exact cheat.elim", policy=UNSCANNED, messages=[msg], check={"status": "missing"})]
        )
    finally:
        await p.close()
    # The fake judge reports `missing` for this attempt: that is what decides.
    assert v.reason is Reason.STATEMENT_CHANGED


async def test_an_answer_printed_by_the_attempt_cannot_pass_for_the_repls() -> None:
    """Attack: the attempt prints `{"env": 0}` on the REPL's stdout before the real answer, so
    the pool would pickle environment 0 -- an earlier (perhaps valid) attempt's -- as its own.
    The REPL numbers environments in order: an answer naming an old one is refused."""
    p = make_pool()
    try:
        vs = await p.check(
            [att(i=0), att("sorry", i=1, policy=UNSCANNED, forge_answer=1), att(i=2)]
        )
    finally:
        await p.close()
    assert vs[0].accepted and vs[2].accepted
    assert vs[1].reason is Reason.CRASH and "not the new environment" in vs[1].detail


# -- hand-off of the compiled constants ---------------------------------------------------------


def test_take_pickle_copies_a_regular_file(tmp_path: Path) -> None:
    src, hand = tmp_path / "attempt.olean", tmp_path / "handoff"
    hand.mkdir()
    src.write_bytes(b"constants")
    copy = take_pickle(src, hand, 1 << 20)
    assert isinstance(copy, Path) and copy.parent == hand and copy.read_bytes() == b"constants"
    assert not src.exists()  # the original is gone


def test_take_pickle_refuses_a_symlink_to_another_attempts_file(tmp_path: Path) -> None:
    """Attack: proof theft -- the attempt's pickle path is made a link to another attempt's
    (valid) compiled environment."""
    hand = tmp_path / "handoff"
    hand.mkdir()
    victim = tmp_path / "victim.olean"
    victim.write_bytes(b"someone else's valid proof")
    src = tmp_path / "attempt.olean"
    src.symlink_to(victim)
    out = take_pickle(src, hand, 1 << 20)
    assert isinstance(out, str) and "cannot be opened safely" in out
    assert list(hand.iterdir()) == []


def test_take_pickle_does_not_block_on_a_fifo(tmp_path: Path) -> None:
    """Attack: a FIFO in place of the pickle would hang a blocking open forever."""
    hand = tmp_path / "handoff"
    hand.mkdir()
    src = tmp_path / "attempt.olean"
    os.mkfifo(src)
    out = take_pickle(src, hand, 1 << 20)
    assert out == "the attempt's compiled environment is not a regular file"


def test_take_pickle_bounds_the_size(tmp_path: Path) -> None:
    hand = tmp_path / "handoff"
    hand.mkdir()
    src = tmp_path / "attempt.olean"
    src.write_bytes(b"x" * 5000)
    out = take_pickle(src, hand, 1000)
    assert isinstance(out, str) and "hand-off limit" in out and list(hand.iterdir()) == []


def test_writes_after_the_hand_off_do_not_reach_the_copy(tmp_path: Path) -> None:
    """Attack: code left running in the elaborating process keeps the pickle open and rewrites
    it after the hand-off. The judge reads a copy."""
    hand = tmp_path / "handoff"
    hand.mkdir()
    src = tmp_path / "attempt.olean"
    src.write_bytes(b"honest")
    with src.open("r+b") as held:
        copy = take_pickle(src, hand, 1 << 20)
        held.seek(0)
        held.write(b"forged")
        held.flush()
    assert isinstance(copy, Path) and copy.read_bytes() == b"honest"


@needs_bwrap
async def test_a_sandboxed_attempt_cannot_steal_another_attempts_pickle() -> None:
    """Attack: proof theft by content -- the taken-over elaborating process overwrites its own
    pickle with a valid one it found elsewhere in the pool's folders. Under bubblewrap the
    pool's folders other than its own are an empty tmpfs, so there is nothing to read."""
    p = make_pool(isolate=True)
    try:
        await p.start()
        assert p.scratch is not None
        planted = p.scratch / "valid.olean"
        planted.write_text(json.dumps({"text": "theorem t : 1 = 1 := by\n  rfl\n"}))
        (v,) = await p.check([att("sorry", policy=UNSCANNED, compromise=True, steal=str(planted))])
    finally:
        await p.close()
    assert v.reason is Reason.SORRY, v.detail


# -- containment ------------------------------------------------------------------------------


async def test_lean_processes_get_a_minimal_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Leak: API keys of the parent must not be readable by proof code (or in /proc)."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    p = make_pool()
    try:
        (v,) = await p.check([att(environ=True)])
        pids = [q.pid for q in p.live_processes() if q.pid]
        environs = [Path(f"/proc/{pid}/environ").read_bytes() for pid in pids]
    finally:
        await p.close()
    names = next(m.data for m in v.messages if "PATH" in m.data).split()
    assert "OPENAI_API_KEY" not in names and "HF_TOKEN" not in names
    assert {"HOME", "TMPDIR", "PATH"} <= set(names)
    assert environs and all(b"sk-secret" not in e and b"hf_secret" not in e for e in environs)


async def test_each_process_has_its_own_private_home(tmp_path: Path) -> None:
    p = make_pool(workers=2, spares=0)
    try:
        await p.warm(HEADER)
        homes = set()
        for q in p.live_processes():
            env = psutil.Process(q.pid).environ()
            homes.add(env["HOME"])
            assert Path(env["HOME"]).parent == p.scratch
            assert oct(Path(env["HOME"]).stat().st_mode & 0o777) == "0o700"
    finally:
        await p.close()
    assert len(homes) == 3  # two elaborating processes and a judge


_OWNER = textwrap.dedent(
    """
    import asyncio, json, sys
    from pathlib import Path
    from leanrl.lean.pool import PoolConfig, ReplPool
    from leanrl.verdict import Attempt

    async def main():
        p = ReplPool(PoolConfig(command=[sys.executable, {fake!r}], workers=2, spares=0,
                                timeout_s=600, scratch_parent=Path({parent!r})))
        await p.start()
        a = Attempt(name="t", header="import Mathlib\\n", formal_statement="theorem t : 1 = 1 := by",
                    proof='rfl\\n  -- fake: {{"hang": true}}')
        task = asyncio.ensure_future(p.check([a, a]))
        while len([q for q in p.live_processes() if q.alive]) < 2:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        print(json.dumps({{"root": str(p.scratch), "pids": [q.pid for q in p.live_processes()]}}),
              flush=True)
        await task

    asyncio.run(main())
    """
)


def test_kill_9_of_the_owner_kills_busy_lean_processes_and_the_next_start_cleans_up(
    tmp_path: Path,
) -> None:
    """Leak: after `kill -9` of leanrl, busy Lean processes ran forever and their folders
    stayed. Now they die with their owner, and the next pool removes the folder."""
    script = tmp_path / "owner.py"
    script.write_text(_OWNER.format(fake=str(FAKE), parent=str(tmp_path)))
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        info = json.loads(owner.stdout.readline())
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    pids, root = info["pids"], Path(info["root"])
    assert len(pids) == 2 and root.is_dir()
    deadline = time.monotonic() + 10
    while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_running(pid) for pid in pids)
    assert root.is_dir()  # nobody cleaned up yet
    assert sweep_stale(tmp_path) == [root] and not root.exists()


def test_the_sweep_kills_what_a_dead_owner_left_in_its_process_groups(tmp_path: Path) -> None:
    root = tmp_path / "leanrl-pool-1-x"
    root.mkdir()
    # A leftover that does not die with its parent: its own session, recorded as a group.
    home = root / "elab-1"
    home.mkdir()
    left = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"],
        start_new_session=True,
        env={**os.environ, "HOME": str(home)},
    )
    # An unrelated process whose group id is recorded (a reused id) is spared.
    bystander = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True
    )
    try:
        created = psutil.Process(left.pid).create_time()
        other = psutil.Process(bystander.pid).create_time()
        groups = [[left.pid, created], [bystander.pid, other]]
        dead_owner = {"pid": 2**22 + 7, "created": 1.0, "groups": groups}
        (root / "owner.json").write_text(json.dumps(dead_owner))
        assert sweep_stale(tmp_path) == [root]
        assert left.wait(timeout=10) == -signal.SIGKILL
        assert bystander.poll() is None
    finally:
        for q in (left, bystander):
            if q.poll() is None:
                q.kill()


def test_the_sweep_leaves_a_live_owners_folder_alone(tmp_path: Path) -> None:
    root = tmp_path / "leanrl-pool-2-y"
    root.mkdir()
    me = psutil.Process()
    (root / "owner.json").write_text(
        json.dumps({"pid": me.pid, "created": me.create_time(), "groups": []})
    )
    assert sweep_stale(tmp_path) == [] and root.is_dir()


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


# -- faults that cost one attempt, not the run ---------------------------------------------------


async def test_an_output_flood_is_capped_and_kills_the_process() -> None:
    """Fault: a child printing without end grew the parent to gigabytes. Now the request is
    cut at the cap, the attempt gets `memory`, and the process is replaced."""
    p = make_pool(max_output_mb=4)
    before = psutil.Process().memory_info().rss
    try:
        vs = await p.check([att(flood_mb=200, i=0), att(i=1)])
    finally:
        await p.close()
    grew_mb = (psutil.Process().memory_info().rss - before) / 2**20
    assert vs[0].reason is Reason.MEMORY and "more than 4 MiB" in vs[0].detail
    assert vs[1].accepted
    assert grew_mb < 100, grew_mb
    assert p.stats.killed == 1


async def test_a_duplicated_answer_replaces_the_process_at_once() -> None:
    """Fault: one duplicated answer put a process out of step; it then served 145 attempts with
    wrong answers. Now the first out-of-step answer replaces it."""
    p = make_pool()
    try:
        vs = await p.check([att(duplicate=True, i=0)] + [att(i=i) for i in range(1, 5)])
    finally:
        await p.close()
    assert vs[0].reason is Reason.CRASH and "out of step" in vs[0].detail
    assert all(v.accepted for v in vs[1:]), [v.detail for v in vs[1:]]
    assert p.stats.killed == 1


async def test_a_crash_whose_child_holds_the_pipe_is_reported_at_once() -> None:
    """Fault: a crashed REPL whose child kept stdout open turned into a 60 s timeout, and the
    child survived close(). Now the exit is seen at once, and the child is killed."""
    p = make_pool(timeout_s=30.0)
    since = time.time() - 1.0  # orphans of this test only, not of a run beside it
    try:
        t0 = time.monotonic()
        (v,) = await p.check([att(orphan=True)])
        took = time.monotonic() - t0
        await asyncio.sleep(0.2)
    finally:
        await p.close()
    # The outcome, not a time: a crash seen only when the child let go of the pipe would have
    # ended in the 30 s limit (timeout); well before it, however loaded the machine is.
    assert v.reason is Reason.CRASH, v.detail
    assert took < 25, took
    orphans = [
        q
        for q in psutil.process_iter(["cmdline", "create_time"])
        if "time.sleep(119.5)" in " ".join(q.info["cmdline"] or [])
        and (q.info["create_time"] or 0) >= since
    ]
    assert not [q for q in orphans if q.status() != psutil.STATUS_ZOMBIE]


async def test_what_an_attempt_started_dies_with_the_attempt(tmp_path: Path) -> None:
    """Leak: a process the attempt's code started could outlive it in a warm REPL (and rewrite
    files or disturb the next attempt). It is killed when the attempt ends; the REPL stays."""
    pid_file = tmp_path / "child.pid"
    p = make_pool()
    try:
        vs = await p.check([att(spawn=str(pid_file), i=0)])
        repl = p.live_processes("elab")
        child = int(pid_file.read_text())
        await asyncio.sleep(0.1)
        alive = _running(child)
        vs += await p.check([att(i=1)])
    finally:
        await p.close()
    assert [v.reason for v in vs] == [Reason.OK, Reason.OK]
    assert not alive and p.stats.strays_killed == 1
    assert len(repl) == 1 and p.stats.killed == 0  # the REPL itself was kept


async def test_the_prescan_runs_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault: a batch of long texts stalled the event loop in the pre-scan, which turned into
    false timeouts of every other attempt. The pre-scan now runs in a worker thread."""
    threads: list[int] = []
    real = pool_module.judge_prescan

    def spy(a: Attempt) -> object:
        threads.append(threading.get_ident())
        return real(a)

    monkeypatch.setattr(pool_module, "judge_prescan", spy)
    p = make_pool()
    try:
        (v,) = await p.check([att()])
    finally:
        await p.close()
    assert v.accepted and threads and threading.get_ident() not in threads


async def test_a_judge_that_hangs_costs_one_attempt() -> None:
    p = make_pool(command=fake_cmd("--check-time", "30"), timeout_s=1.0)
    try:
        (v,) = await p.check([att()])
    finally:
        await p.close()
    # The judge runs only trusted text: a check that stalls it is the attempt's `judge_limit`.
    assert v.reason is Reason.JUDGE_LIMIT and "wall-clock limit" in v.detail, v.detail


def test_isolation_problem_names_the_fix_when_bwrap_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from leanrl.lean.trust import containment

    containment.isolation_problem.cache_clear()
    monkeypatch.setattr(containment.shutil, "which", lambda name: None)
    try:
        assert "apt-get install bubblewrap" in (containment.isolation_problem() or "")
    finally:
        containment.isolation_problem.cache_clear()


def test_the_sandbox_binds_back_what_the_process_needs_under_tmp(tmp_path: Path) -> None:
    """A checkout under /tmp (``mktemp -d``) must stay readable inside the private /tmp, except
    the scratch root, which stays hidden."""
    from leanrl.lean.trust.containment import bwrap_argv, process_needs

    clone = Path("/tmp") / f"leanrl-test-clone-{os.getpid()}"
    (clone / "venv" / "bin").mkdir(parents=True, exist_ok=True)
    exe = clone / "venv" / "bin" / "repl"
    exe.write_text("")
    root = Path("/tmp") / f"leanrl-pool-test-{os.getpid()}"
    root.mkdir(exist_ok=True)
    try:
        needs = process_needs([str(exe)], clone, {"PATH": f"{root}:/usr/bin"})
        argv = bwrap_argv([root / "elab-1"], hide=[root], needs=needs, exe="/usr/bin/bwrap")
    finally:
        shutil.rmtree(clone, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
    binds = [argv[i + 1] for i, a in enumerate(argv) if a == "--ro-bind"]
    assert str(clone) in binds and str(root) not in binds
    assert argv.index("--tmpfs") < argv.index(str(clone)) < argv.index(str(root))


# A stand-in `lean` (NOT Lean): with -o it writes the .olean, then leaves a child in its process
# group that rewrites the .olean a moment later with a forged one -- unless it is killed first.
_LEFTOVER_LEAN = r"""
import json, re, subprocess, sys
args = sys.argv[1:]
src = args[-1]
if "-o" in args:
    olean = args[args.index("-o") + 1]
    open(olean, "w").write("honest")
    subprocess.Popen([sys.executable, "-c",
        "import time, sys; time.sleep(0.3); open(sys.argv[1], 'w').write('forged')", olean])
    sys.exit(0)
text = open(src).read()
path = re.search(r'LeanrlCheck.run "([^"]*)"', text).group(1)
nonce = re.search(r'"([0-9a-f]{32})"', text).group(1)
import time; time.sleep(0.6)  # like importing Mathlib: the leftover child would strike now
status = "ok" if open(path).read() == "honest" else "replay_failed"
report = {"nonce": nonce, "status": status, "kind": "theorem", "ref_kind": "theorem",
          "axioms": [], "constants": ["t"], "replayed": True, "detail": "forged"}
sys.stdout.write("LEANRL-CHECK " + json.dumps(report) + "\n")
"""


async def test_oneshot_kills_what_the_attempt_left_running_before_the_check(tmp_path: Path) -> None:
    """Attack: in one-shot mode a child left behind by the attempt's `lean -o` rewrote
    Attempt.olean while the check process imported Mathlib. Its process group is now killed
    as soon as `lean -o` exits, and the judge reads a copy."""
    from leanrl.lean.oneshot import OneShotChecker

    script = tmp_path / "lean.py"
    script.write_text(_LEFTOVER_LEAN)
    checker = OneShotChecker([sys.executable, str(script)], timeout_s=20, json_output=False)
    await checker.start()
    try:
        (v,) = await checker.check([att("rfl")])
    finally:
        await checker.close()
    assert v.accepted, v.detail


def test_isolation_is_on_where_bubblewrap_works_and_loud_where_not(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from leanrl.errors import RuntimeUnavailable
    from leanrl.runtimes import local

    monkeypatch.setattr(local, "isolation_problem", lambda: None)
    assert local.resolve_isolation(None) is True
    assert local.resolve_isolation(False) is False
    monkeypatch.setattr(local, "isolation_problem", lambda: "bubblewrap is not installed")
    monkeypatch.delenv(local.ALLOW_UNSANDBOXED, raising=False)
    # Without a sandbox an attempt that runs code can reach the checker: fail closed...
    with pytest.raises(RuntimeUnavailable, match=r"forge verdicts.*isolate false"):
        local.resolve_isolation(None)
    with pytest.raises(RuntimeUnavailable, match="cannot be sandboxed"):
        local.resolve_isolation(True)
    # ...unless the user says so, loudly.
    monkeypatch.setenv(local.ALLOW_UNSANDBOXED, "1")
    with caplog.at_level("WARNING", logger="leanrl.runtime"):
        assert local.resolve_isolation(None) is False
    assert "WITHOUT a sandbox" in caplog.text and "bubblewrap is not installed" in caplog.text


@needs_bwrap
async def test_the_sandbox_hides_this_users_home_and_bounds_its_tmp(tmp_path: Path) -> None:
    """Leak: the sandbox bound `/` read-only, so a proof's code could list `~` (tokens in
    `~/.cache`, `~/.config`) and put what it read into Lean's messages. The home folder is now an
    empty tmpfs, with only what the process needs bound back; `/tmp` and `/dev/shm` are bounded
    (files there are memory the RSS watch does not see)."""
    home = Path.home()
    p = make_pool(isolate=True)
    try:
        (v,) = await p.check([att(read=str(home))])
    finally:
        await p.close()
    seen = next(m.data for m in v.messages if m.data.startswith("read="))
    visible = set(seen.split()[1:]) if seen.startswith("read=ok") else set()
    # Only what the process needs is bound back (here: the Python the stand-in runs on).
    secret = {".cache", ".config", ".bash_history", ".gitconfig", ".ssh"} & set(os.listdir(home))
    assert not visible & secret, visible
    from leanrl.lean.trust.containment import bwrap_argv

    args = bwrap_argv([tmp_path], exe=shutil.which("bwrap"))
    assert args[args.index("/tmp") - 3] == "--size" and "/dev/shm" in args
    assert str(home) in args


@needs_bwrap
def test_the_sandbox_shows_the_project_under_tmp_but_not_its_siblings() -> None:
    """Leak: under /tmp the sandbox bound the needed paths' top folder (``/tmp/X`` for
    ``/tmp/X/.../project``), so a Lean process could read every folder next to the project
    there. Now exactly the project (the process's folder), its program and toolchain folders."""
    # directly under /tmp, wherever pytest's own temporary folders are
    tmp = Path(tempfile.mkdtemp(prefix="leanrl-siblings-", dir="/tmp"))
    try:
        _check_project_alone(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _check_project_alone(tmp: Path) -> None:
    from leanrl.lean.trust.containment import bwrap_argv, process_needs

    project = tmp / "checkout" / "repl-project"
    (project / ".lake" / "build" / "bin").mkdir(parents=True)
    (project / "lakefile.lean").write_text("-- the project")
    sibling = tmp / "checkout" / "someone-elses"
    sibling.mkdir()
    (sibling / "secret.txt").write_text("token")
    scratch = tmp / "scratch"
    scratch.mkdir()
    shell = shutil.which("sh") or "/bin/sh"
    script = (
        f"cat {project}/lakefile.lean; echo; echo LIST; ls -A {project.parent}; echo SECRET; "
        f"cat {sibling}/secret.txt 2>/dev/null; true"
    )
    cmd = [shell, "-c", script]
    needs = process_needs([str(project / ".lake" / "build" / "bin")], project, {"PATH": "/usr/bin"})
    argv = bwrap_argv([scratch], needs=needs, exe=shutil.which("bwrap"))
    out = subprocess.run([*argv, *cmd], capture_output=True, text=True, timeout=60, cwd=project)
    seen, _, rest = out.stdout.partition("LIST\n")
    listed, _, secret = rest.partition("SECRET\n")
    assert "-- the project" in seen, (out.stdout, out.stderr)  # the project: readable
    assert listed.split() == ["repl-project"]  # its folder shows the project alone
    assert secret == ""  # and a sibling's file cannot be read
