"""The `local` runtime end to end with stand-in REPL processes (tests/fake_repl.py), the
`leanrl verify` command, and one-shot mode's process handling."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from leanrl import registry
from leanrl.cli import main
from leanrl.environment import EnvironmentConfig
from leanrl.errors import ConfigError, DatasetError, LeanNotFoundError
from leanrl.lean.commands import verify_file
from leanrl.lean.oneshot import OneShotChecker
from leanrl.runtime import RuntimeConfig
from leanrl.runtimes.local import LocalRuntime, LocalTacticSession
from leanrl.taskset import TasksetConfig
from leanrl.verdict import Attempt, Reason, VerificationPolicy

FAKE = [sys.executable, str(Path(__file__).with_name("fake_repl.py"))]


def runtime(**kw: object) -> LocalRuntime:
    cfg: dict[str, object] = {"workers": 2, "timeout_s": 3.0}
    cfg.update(kw)
    cfg["options"] = {"repl_command": FAKE, "spares": 0}
    return LocalRuntime(RuntimeConfig.model_validate(cfg))


def att(proof: str, i: int = 0) -> Attempt:
    return Attempt(
        name="t",
        header="import Mathlib\n",
        formal_statement="theorem t : 1 = 1 := by",
        proof=proof,
        id=str(i),
    )


def test_registered_under_local() -> None:
    cls = registry.resolve("runtimes", "local")
    assert cls is LocalRuntime and cls.name == "local" and cls.description


def test_check_capacity_counts_workers_and_judges() -> None:
    """What the whole-proof harness keeps in flight (the rest go in task order): the elaborating
    workers plus the judges (an attempt being judged holds no worker); one-shot: the workers."""
    assert runtime(workers=4).check_capacity() == 5  # judges default: one per four workers
    assert runtime(workers=5).check_capacity() == 7
    assert runtime(workers=4, judges=3).check_capacity() == 7
    assert runtime(workers=4, mode="oneshot").check_capacity() == 4


def test_check_sync_from_plain_code() -> None:
    hang = 'rfl\n  -- fake: {"hang": true}'
    vs = runtime(timeout_s=1.0).check_sync([att("rfl", 0), att(hang, 1), att("rfl", 2)])
    assert [v.reason for v in vs] == [Reason.OK, Reason.TIMEOUT, Reason.OK]
    assert [v.id for v in vs] == ["0", "1", "2"]


async def test_check_sync_inside_a_running_loop() -> None:
    # Jupyter runs an event loop; check_sync must still work there.
    (v,) = runtime().check_sync([att("rfl")])
    assert v.accepted


async def test_tactic_session() -> None:
    rt = runtime()
    async with rt:
        async with rt.tactic_session("import Mathlib\n") as s:
            st = await s.start("theorem t (p : Prop) (hp : p) : p := by")
            assert st.error is None and st.proof_state is not None and st.goals == ("⊢ P",)
            st2 = await s.apply(st.proof_state, "intro x")
            assert st2.error is None and st2.goals == ("⊢ Q",) and not st2.solved
            bad = await s.apply(st2.proof_state or 0, "fail")
            assert bad.error and "unknown tactic" in bad.error and bad.proof_state is None
            err = await s.apply(st2.proof_state or 0, "bad")
            assert err.error and "Unknown identifier" in err.error
            done = await s.apply(st2.proof_state or 0, "simp")
            assert done.solved
            hung = await s.apply(st2.proof_state or 0, "hang")
            assert hung.error and "timeout" in hung.error
            after = await s.apply(st2.proof_state or 0, "simp")
            assert after.error and "session ended" in after.error
        # the broken process was replaced; the runtime still works
        (v,) = await rt.check([att("rfl")])
        assert v.accepted


async def test_tactic_session_sends_a_block_of_tactics_as_one() -> None:
    # The stand-in parses like the REPL: one tactic per request (REPL issue #43).
    rt = runtime()
    async with rt:
        async with rt.tactic_session("import Mathlib\n") as s:
            st = await s.start("theorem t (p : Prop) (hp : p) : p := by")
            assert st.proof_state is not None
            for block in ["intro x\nsimp\n\n-- done", "ext1 x; simp", "  intro x\n  simp"]:
                done = await s.apply(st.proof_state, block)
                assert done.error is None and done.solved, (block, done.error)
            part = await s.apply(st.proof_state, "intro x\nintro y")
            assert part.error is None and part.goals == ("⊢ Q",)
            bad = await s.apply(st.proof_state, "-- plan\n  intro x\n  fail\n")
            assert bad.error and "<input>:3:2: unknown tactic" in bad.error  # the model's line
            empty = await s.apply(st.proof_state, "-- just a comment\n")
            assert empty.error and "no tactic" in empty.error


@pytest.mark.parametrize(
    "tactic", ['run_tac do IO.FS.writeFile "/tmp/x" ""', "intro x\nby_elab pure ()"]
)
async def test_tactic_session_prescans_model_tactics(tactic: str) -> None:
    rt = runtime()
    async with rt:
        async with rt.tactic_session("import Mathlib\n") as s:
            st = await s.start("theorem t (p : Prop) (hp : p) : p := by")
            assert st.proof_state is not None
            bad = await s.apply(st.proof_state, tactic)
            # The stand-in would answer such a tactic with one more goal: it was never sent.
            assert bad.error and "pre-scan" in bad.error and "arbitrary code" in bad.error
            assert bad.proof_state is None
            ok = await s.apply(st.proof_state, "simp")
            assert ok.solved  # the session goes on: a rejected tactic costs one turn
        lenient = rt.tactic_session(
            "import Mathlib\n", VerificationPolicy(allow_native_decide=True)
        )
        async with lenient as s:
            st = await s.start("theorem t (p : Prop) (hp : p) : p := by")
            nd = await s.apply(st.proof_state or 0, "native_decide")
            assert nd.error is None
            pre = await s.start("theorem u : True := by", preamble="#eval IO.println 1")
            assert pre.error and "pre-scan" in pre.error


async def test_a_process_that_ran_tactics_never_checks_proofs() -> None:
    rt = runtime(workers=1)  # room for ONE process: before the fix it served both
    async with rt:
        async with rt.tactic_session("import Mathlib\n") as s:
            assert isinstance(s, LocalTacticSession)
            st = await s.start("theorem t (p : Prop) (hp : p) : p := by")
            assert (await s.apply(st.proof_state or 0, "simp")).solved
            tactic_pid = s.worker.proc.proc.pid if s.worker.proc.proc else -1
        assert rt.pool is not None
        seen = len(rt.pool.events)
        vs = await rt.check([att("rfl", i) for i in range(3)])
        assert all(v.accepted for v in vs)
        check_pids = {pid for what, pid in list(rt.pool.events)[seen:] if what == "acquire"}
        assert check_pids and tactic_pid not in check_pids
        # ...and a later session gets a tactic process again, never one that checked proofs.
        async with rt.tactic_session("import Mathlib\n") as s2:
            assert isinstance(s2, LocalTacticSession)
            assert s2.worker.proc.proc is not None
            assert s2.worker.proc.proc.pid not in check_pids


def test_oneshot_mode_refuses_tactic_sessions() -> None:
    rt = LocalRuntime(RuntimeConfig(mode="oneshot"))
    with pytest.raises(ConfigError, match="tactic mode"):
        rt.tactic_session("")


def test_bad_repl_command_option() -> None:
    rt = LocalRuntime(RuntimeConfig(options={"repl_command": 5}))
    with pytest.raises(ConfigError, match="repl_command"):
        rt.check_sync([att("rfl")])


def test_no_lean_anywhere_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("LEANRL_LEAN_PROJECT", raising=False)
    monkeypatch.setenv("LEANRL_CACHE", str(tmp_path / "cache"))
    with pytest.raises(LeanNotFoundError, match="leanrl setup"):
        LocalRuntime(RuntimeConfig()).check_sync([att("rfl")])
    with pytest.raises(LeanNotFoundError, match="elan"):
        LocalRuntime(RuntimeConfig(mode="oneshot")).check_sync([att("rfl")])


def test_no_lean_is_told_before_no_sandbox(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # A bare machine lacks both: the first error must be Lean's (what the README promises, and
    # the longer set-up), not bubblewrap's, in start() and in preflight() alike.
    import leanrl.runtimes.local as local

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("LEANRL_LEAN_PROJECT", raising=False)
    monkeypatch.delenv(local.ALLOW_UNSANDBOXED, raising=False)
    monkeypatch.setenv("LEANRL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(local, "isolation_problem", lambda: "bubblewrap (`bwrap`) is missing")
    assert local.isolation_refused(None) is not None  # the sandbox would be refused too
    with pytest.raises(LeanNotFoundError):
        LocalRuntime(RuntimeConfig()).check_sync([att("rfl")])
    with pytest.raises(LeanNotFoundError):
        LocalRuntime(RuntimeConfig()).preflight()


# -- leanrl verify ---------------------------------------------------------------------------


def _env(bench_data: Path) -> EnvironmentConfig:
    return EnvironmentConfig(
        id="minif2f",
        taskset=TasksetConfig(path=bench_data / "minif2f.jsonl", split=None),
        runtime=RuntimeConfig(workers=2, options={"repl_command": FAKE, "spares": 0}),
    )


async def test_verify_file(bench_data: Path, tmp_path: Path) -> None:
    rows = [
        {"name": "aime_1983_p9", "proof": "nlinarith"},
        {"name": "aime_1983_p9", "proof": "sorry"},
        {"name": "aimeII_2001_p3", "proof": "omega", "preamble": "lemma l : True := trivial"},
        {"name": "aimeII_2001_p3", "proof": "native_decide", "id": "mine"},
    ]
    proofs = tmp_path / "p.jsonl"
    proofs.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "v.jsonl"
    summary = await verify_file(_env(bench_data), proofs, out)
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [g["reason"] for g in got] == ["ok", "sorry", "ok", "native"]
    assert [g["row"] for g in got] == [1, 2, 3, 4] and got[3]["id"] == "mine"
    assert summary["rows"] == 4 and summary["accepted"] == 2
    assert summary["reasons"] == {"ok": 2, "sorry": 1, "native": 1}


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("{not json", r"row 2: not valid JSON"),
        ('{"name": "aime_1983_p9"}', r"row 2: field 'proof' is missing"),
        ('{"name": "no_such_theorem", "proof": "rfl"}', r"row 2: no task named 'no_such_theorem'"),
        ('["a", "b"]', r"row 2: expected a JSON object"),
    ],
)
async def test_verify_bad_rows_name_the_row(
    bench_data: Path, tmp_path: Path, line: str, match: str
) -> None:
    proofs = tmp_path / "p.jsonl"
    proofs.write_text(json.dumps({"name": "aime_1983_p9", "proof": "rfl"}) + "\n" + line + "\n")
    with pytest.raises(DatasetError, match=match):
        await verify_file(_env(bench_data), proofs, tmp_path / "v.jsonl")


def test_verify_cli(bench_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proofs = tmp_path / "p.jsonl"
    proofs.write_text(json.dumps({"name": "aime_1983_p9", "proof": "nlinarith"}) + "\n")
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        "[env.taskset]\n"
        f'path = "{bench_data / "minif2f.jsonl"}"\n'
        "[env.runtime]\nworkers = 1\n"
        "[env.runtime.options]\n"
        f"repl_command = {json.dumps(FAKE)}\n"
    )
    rc = main(["verify", str(proofs), "--env", "minif2f", "--config", str(cfg), "--print_json"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["accepted"] == 1 and summary["rows"] == 1
    assert (tmp_path / "p.verdicts.jsonl").is_file()
    assert (tmp_path / "p.verdicts.summary.json").is_file()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"name": "x"}\n')
    assert main(["verify", str(bad), "--env", "minif2f", "--config", str(cfg)]) == 2
    assert "row 1" in capsys.readouterr().err


# -- one-shot mode: process handling (Lean itself is covered by the lean-marked tests) ----------


async def test_oneshot_timeout_and_crash_are_verdicts(tmp_path: Path) -> None:
    sleeper = OneShotChecker(
        [sys.executable, "-c", "import time; time.sleep(30)"], timeout_s=0.5, json_output=False
    )
    await sleeper.start()
    (v,) = await sleeper.check([att("rfl")])
    assert v.reason is Reason.TIMEOUT
    crasher = OneShotChecker(
        [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"],
        timeout_s=5,
        json_output=False,
    )
    await crasher.start()
    (v,) = await crasher.check([att("rfl")])
    assert v.reason is Reason.CRASH and "signal" in v.detail
    (pre,) = await crasher.check([att("sorry")])
    assert pre.reason is Reason.SORRY  # the pre-scan runs before any process


# A stand-in for an OLD `lean` binary (not Lean: it proves nothing). With `-o` it "compiles" the
# attempt (writes the .olean); on Check.lean it prints what old Lean prints: the `sorry` warning of
# the reference statement, then the checker's info message with no position and no newline of its
# own, so the report is glued to the warning (LAYOUT=glued) or starts the output (LAYOUT=first).
_OLD_LEAN = r"""
import json, re, sys
args = sys.argv[1:]
src = args[-1]
if "-o" in args:
    open(args[args.index("-o") + 1], "wb").close()
    sys.exit(0)
nonce = re.search(r'"([0-9a-f]{32})"', open(src).read()).group(1)
report = {"nonce": nonce, "status": "ok", "kind": "theorem", "ref_kind": "theorem",
          "axioms": ["propext"], "constants": ["t"], "replayed": True}
tagged = "LEANRL-CHECK " + json.dumps(report, separators=(",", ":"))
warn = src + ":40:8: warning: declaration uses 'sorry'"
sys.stdout.write(warn + tagged if LAYOUT == "glued" else tagged + warn + "\n")
"""


@pytest.mark.parametrize("layout", ["glued", "first"])
async def test_oneshot_plain_output_finds_a_report_without_position(
    tmp_path: Path, layout: str
) -> None:
    script = tmp_path / "old_lean.py"
    script.write_text(f"LAYOUT = {layout!r}\n" + _OLD_LEAN)
    checker = OneShotChecker([sys.executable, str(script)], timeout_s=20, json_output=False)
    await checker.start()
    (v,) = await checker.check([att("rfl")])
    assert v.accepted, v.detail


async def test_a_cancelled_tactic_step_kills_its_process() -> None:
    """A step cancelled by its caller (a service timeout, a client gone) may still be answered by
    the REPL later; that process must never serve another session or check."""
    rt = runtime(workers=1)
    async with rt:
        async with rt.tactic_session("import Mathlib\n") as s:
            assert isinstance(s, LocalTacticSession)
            st = await s.start("theorem t (p : Prop) (hp : p) : p := by")
            proc = s.worker.proc.proc
            assert proc is not None
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(s.apply(st.proof_state or 0, "hang"), 0.5)
            assert s.broken == "cancelled mid-step"
            after = await s.apply(st.proof_state or 0, "simp")
            assert after.error and "session ended" in after.error
        assert proc.returncode is not None  # killed, not handed back to the pool
        async with rt.tactic_session("import Mathlib\n") as s2:
            assert isinstance(s2, LocalTacticSession)
            assert s2.worker.proc.proc is not None and s2.worker.proc.proc.pid != proc.pid


async def test_metrics_report_the_pools_counters() -> None:
    rt = runtime(workers=1)
    assert rt.metrics() == {}  # nothing started yet
    async with rt:
        vs = await rt.check([att("rfl", i) for i in range(3)])
        assert len(vs) == 3
        m = rt.metrics()
    assert m["checked"] == 3.0 and m["started"] >= 1.0 and m["killed"] == 0.0


async def test_a_long_tactic_is_prescanned_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A megabyte of hostile tactic text must not stall every other session's answers.
    import threading

    import leanrl.runtimes.local as local

    seen: list[tuple[int, bool]] = []
    real = local.prescan_tactic

    def spy(text: str, policy: VerificationPolicy) -> str | None:
        seen.append((len(text), threading.current_thread() is threading.main_thread()))
        return real(text, policy)

    monkeypatch.setattr(local, "prescan_tactic", spy)
    policy = VerificationPolicy()
    assert await local._prescan("simp", policy) is None
    long = "run_tac pure ()\n" + "simp\n" * 10_000
    assert "run_tac" in (await local._prescan(long, policy) or "")
    assert seen == [(4, True), (len(long), False)]


async def test_oneshot_lean_killed_from_outside_is_run_again(tmp_path: Path) -> None:
    """A `lean` killed by a signal that did not come from the attempt (the first run here kills
    itself, as an operator's kill -9 would) is run again; only a death that repeats costs the
    attempt (benchmarks/fault_soak.py found such kills charged to the model)."""
    script = tmp_path / "old_lean.py"
    marker = tmp_path / "killed-once"
    once = (
        "import os, signal, sys\n"
        f"if '-o' in sys.argv and not os.path.exists({str(marker)!r}):\n"
        f"    open({str(marker)!r}, 'w').close()\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    script.write_text(once + "LAYOUT = 'first'\n" + _OLD_LEAN)
    checker = OneShotChecker([sys.executable, str(script)], timeout_s=20, json_output=False)
    await checker.start()
    (v,) = await checker.check([att("rfl")])
    assert marker.exists() and v.accepted, v.detail
    # A death that repeats is the attempt's own, and says it was tried again.
    crasher = OneShotChecker(
        [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"],
        timeout_s=5,
        json_output=False,
    )
    await crasher.start()
    (v,) = await crasher.check([att("rfl")])
    assert v.reason is Reason.CRASH and v.detail.endswith("(2 runs)"), v.detail


def test_no_lean_names_the_setup_of_the_environment_in_use(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from leanrl import load_environment

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("LEANRL_LEAN_PROJECT", raising=False)
    monkeypatch.setenv("LEANRL_CACHE", str(tmp_path / "cache"))
    with pytest.raises(LeanNotFoundError) as e:
        load_environment("core").runtime.preflight()
    assert "`leanrl setup --env core`" in str(e.value) and "minif2f" not in str(e.value)
    missing = tmp_path / "nope"
    with pytest.raises(LeanNotFoundError) as e:
        load_environment("core", runtime={"lean_project": str(missing)}).runtime.preflight()
    assert f"{missing} does not exist" in str(e.value) and "--env core`" in str(e.value)
    with pytest.raises(LeanNotFoundError, match=r"e\.g\. `leanrl setup --env minif2f`"):
        LocalRuntime(RuntimeConfig()).preflight()  # no environment: a placeholder, an example
