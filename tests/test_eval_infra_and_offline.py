"""Eval for a newcomer: `--generate-only` (no Lean), `infra` verdicts kept out of pass@k and
retried, mismatches refused up front, a bar per attempt, and the Lean that ran in the report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from leanrl import ConfigError, EnvironmentConfig, RuntimeConfig, TasksetConfig
from leanrl.cli import main
from leanrl.eval import EvalConfig, run_eval
from leanrl.eval.report import summarize
from leanrl.harness import HarnessConfig
from tests._scripted_runtime import ScriptedPolicy

RT = "tests._scripted_runtime:ScriptedRuntime"
TEXTS = ["\n  omega\n", "\n  simp\n", "", "\n  ring\n"]


def make(data: Path, out: Path, **kw: Any) -> EvalConfig:
    return EvalConfig(
        env=EnvironmentConfig(
            id="minif2f",
            taskset=TasksetConfig(path=data, limit=kw.pop("limit", 4)),
            runtime=RuntimeConfig(name=RT, options=kw.pop("runtime_options", {})),
            harness=HarnessConfig(name=kw.pop("harness", "whole-proof")),
        ),
        samples=kw.pop("samples", 4),
        k=kw.pop("k", [1, 4]),
        out=out,
        chunk_tasks=kw.pop("chunk_tasks", 2),
        progress=False,
        **kw,
    )


# -- generate-only ---------------------------------------------------------------------------


async def test_generate_only_needs_no_lean_and_feeds_verify(
    bench_data: Path, tmp_path: Path
) -> None:
    # A runtime that would fail to start: generate-only must never start it. Sample 2 is
    # empty: no proof to store.
    cfg = make(bench_data, tmp_path / "g", generate_only=True, runtime_options={"fail_start": True})
    s = await run_eval(cfg, policy=ScriptedPolicy(TEXTS))
    assert s["generate_only"] is True
    rows = [json.loads(x) for x in Path(s["completions"]).read_text().splitlines()]
    # 4 tasks x 4 samples; sample 2 holds no code, so no proof to check.
    assert len(rows) == 12 and {r["sample"] for r in rows} == {0, 1, 3}
    assert all(set(r) >= {"name", "proof", "preamble", "id"} for r in rows)
    assert s["results"]["reasons"] == {"unchecked": 12, "no_proof": 4}
    report = (tmp_path / "g" / "report.md").read_text()
    assert "nothing was checked by Lean" in report and "leanrl verify" in report
    assert not (tmp_path / "g" / "pass_at_k.png").exists()
    # The stored completions are what `leanrl verify` reads (here checked by the test runtime).
    from leanrl.lean.commands import verify_file

    env = cfg.env.model_copy(update={"runtime": RuntimeConfig(name=RT)})
    env = env.model_copy(update={"taskset": env.taskset.model_copy(update={"limit": None})})
    summary = await verify_file(env, Path(s["completions"]), tmp_path / "v.jsonl")
    assert summary["rows"] == 12 and summary["accepted"] == 4  # the `omega` samples


async def test_generate_only_refuses_a_harness_that_needs_lean(
    bench_data: Path, tmp_path: Path
) -> None:
    cfg = make(bench_data, tmp_path / "t", generate_only=True, harness="tactic-loop")
    with pytest.raises(ConfigError, match=r"cannot generate without Lean.*whole-proof"):
        await run_eval(cfg, policy=ScriptedPolicy(TEXTS))
    assert not (tmp_path / "t").exists()


# -- infra -----------------------------------------------------------------------------------


def _rec(task: str, sample: int, reason: str) -> dict[str, Any]:
    return {
        "task_id": task,
        "sample": sample,
        "accepted": reason == "ok",
        "verdict": {"reason": reason},
    }


def test_infra_attempts_are_not_model_failures_in_pass_at_k() -> None:
    records = [
        _rec("a", 0, "ok"), _rec("a", 1, "error"),
        _rec("b", 0, "error"), _rec("b", 1, "infra"),  # b: one attempt never checked
    ]  # fmt: skip
    res = summarize(records, ["a", "b"], {}, samples=2, ks=[1])
    assert res["infra"] == 1 and res["tasks_with_infra"] == 1
    assert res["tasks_complete"] == 1  # b is incomplete until its infra attempt is redone
    assert res["pass_at_k"]["all"] == {"tasks": 1, "pass@1": 0.5}
    assert res["reasons"]["infra"] == 1


async def test_infra_is_flagged_loudly_and_retried_on_resume(
    bench_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "checker-broken"
    broken.write_text("")
    cfg = make(bench_data, tmp_path / "i", runtime_options={"infra_file": str(broken)})
    s = await run_eval(cfg, policy=ScriptedPolicy(TEXTS))
    res = s["results"]
    assert res["infra"] == 12 and res["tasks_complete"] == 0  # 4 no_proof + 12 infra
    assert res["pass_at_k"]["all"]["tasks"] == 0  # nothing counted as a model failure
    assert s["warnings"] and s["warnings"][0].startswith("MOST ATTEMPTS WERE NOT CHECKED")
    report = (tmp_path / "i" / "report.md").read_text()
    assert "> **Warning:** MOST ATTEMPTS WERE NOT CHECKED" in report
    # The checker works again: the same command redoes the infra attempts only.
    broken.unlink()
    s = await run_eval(cfg, policy=ScriptedPolicy(TEXTS))
    assert s["results"]["infra"] == 0 and s["warnings"] == []
    assert s["timing"]["attempts_this_run"] == 12
    assert s["results"]["pass_at_k"]["all"] == {"tasks": 4, "pass@1": 0.25, "pass@4": 1.0}
    lines = (tmp_path / "i" / "results.jsonl").read_text().splitlines()
    reasons = [json.loads(x)["verdict"]["reason"] for x in lines]
    assert "infra" in reasons  # the old lines stay until the next reconcile...
    from leanrl.eval.store import ResultStore

    store = ResultStore(tmp_path / "i")
    store.open(cfg.fingerprint(), cfg.fingerprint_data())
    store.close()
    assert len(store.records) == 16  # ...which keeps the later answer of each attempt
    assert all(r["verdict"]["reason"] != "infra" for r in store.records.values())


async def test_a_tactic_loop_on_one_shot_lean_is_refused_before_the_run(
    bench_data: Path, tmp_path: Path
) -> None:
    cfg = make(bench_data, tmp_path / "m", harness="tactic-loop")
    cfg = cfg.model_copy(
        update={"env": cfg.env.model_copy(update={"runtime": RuntimeConfig(mode="oneshot")})}
    )
    with pytest.raises(ConfigError, match=r"tactic mode.*--env\.runtime\.mode repl"):
        await run_eval(cfg, policy=ScriptedPolicy(TEXTS))
    assert not (tmp_path / "m").exists()


def test_verify_exits_non_zero_when_a_verdict_is_infra(
    bench_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    proofs = tmp_path / "p.jsonl"
    proofs.write_text(json.dumps({"name": "aime_1983_p9", "proof": "omega"}) + "\n")
    broken = tmp_path / "broken"
    broken.write_text("")
    base = ["verify", str(proofs), "--env", "minif2f", "--env.taskset.path", str(bench_data),
            "--env.runtime.name", RT]  # fmt: skip
    opts = ["--env.runtime.options", json.dumps({"infra_file": str(broken)})]
    with pytest.raises(SystemExit) as e:
        main([*base, *opts])
    assert e.value.code == 1
    assert "could not be checked" in capsys.readouterr().err
    broken.unlink()
    assert main([*base, *opts]) == 0


# -- progress and versions ---------------------------------------------------------------------


async def test_progress_moves_per_attempt(
    bench_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from leanrl.eval import runner

    seen: list[int] = []
    real = runner.Progress.checked

    def spy(self: Any, verdicts: int) -> None:
        real(self, verdicts)
        seen.append(self.at)

    monkeypatch.setattr(runner.Progress, "checked", spy)
    cfg = make(bench_data, tmp_path / "p", chunk_tasks=4, runtime_options={"piece": 1})
    await run_eval(cfg, policy=ScriptedPolicy(TEXTS))
    # One chunk of 4 tasks x 4 samples; 12 proofs reach the runtime, one verdict at a time.
    assert seen == list(range(1, 13))


async def test_report_names_the_lean_that_ran_and_flags_a_mismatch(
    bench_data: Path, tmp_path: Path
) -> None:
    cfg = make(bench_data, tmp_path / "v", runtime_options={"lean_version": "4.9.0"}, limit=1)
    s = await run_eval(cfg, policy=ScriptedPolicy(TEXTS))
    assert s["versions"]["lean_ran"] == "4.9.0"
    assert any("is 4.9.0, but the taskset was written for 4.24.0" in w for w in s["warnings"])
    report = (tmp_path / "v" / "report.md").read_text()
    assert "- Lean that ran: 4.9.0" in report
    ok = make(bench_data, tmp_path / "w", runtime_options={"lean_version": "4.24.0"}, limit=1)
    assert (await run_eval(ok, policy=ScriptedPolicy(TEXTS)))["warnings"] == []


async def test_the_suggested_verify_command_keeps_the_local_taskset(tmp_path: Path) -> None:
    """--env dataset from a local file with renamed columns: the `leanrl verify` the eval
    suggests must read the same file the same way (it used to drop everything but --env)."""
    import shlex

    data = tmp_path / "my tasks.jsonl"
    toy = Path(__file__).parent / "fixtures" / "toy_tasks.jsonl"
    rows = [json.loads(x) for x in toy.read_text().splitlines()[:2]]
    data.write_text("".join(json.dumps({"id": r["name"], "stmt": r["formal_statement"],
                                        "split": "test"}) + "\n" for r in rows))  # fmt: skip
    env = EnvironmentConfig(
        id="dataset",
        taskset=TasksetConfig(path=data, columns={"name": "id", "formal_statement": "stmt"}),
        runtime=RuntimeConfig(name=RT, timeout_s=12.5),
    )
    cfg = EvalConfig(env=env, samples=1, out=tmp_path / "g", generate_only=True, progress=False)
    s = await run_eval(cfg, policy=ScriptedPolicy(["\n  omega\n"]))
    report = (tmp_path / "g" / "report.md").read_text()
    line = next(x for x in report.splitlines() if "leanrl verify" in x)
    argv = shlex.split(line.split("`")[1])
    assert argv[:3] == ["leanrl", "verify", s["completions"]]
    assert "--env.runtime.timeout-s" in argv  # the runtime options travel too
    # The command runs as suggested: the file, its columns and the runtime come along.
    import asyncio

    out = tmp_path / "v.jsonl"
    rc = await asyncio.to_thread(main, [*argv[1:], "--out", str(out)])
    assert rc in (0, None)
    verdicts = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(verdicts) == 2 and all(v["accepted"] for v in verdicts)


async def test_no_verify_command_for_completions_without_a_proof(tmp_path: Path) -> None:
    toy = Path(__file__).parent / "fixtures" / "toy_tasks.jsonl"
    env = EnvironmentConfig(
        id="dataset",
        taskset=TasksetConfig(path=toy, split="train", limit=2),
        runtime=RuntimeConfig(name=RT),
    )
    cfg = EvalConfig(env=env, samples=1, out=tmp_path / "e", generate_only=True, progress=False)
    s = await run_eval(cfg, policy=ScriptedPolicy([""]))
    assert s["results"]["reasons"].get("unchecked", 0) == 0
    report = (tmp_path / "e" / "report.md").read_text()
    assert "leanrl verify" not in report and "nothing to verify" in report
