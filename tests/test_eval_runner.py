"""The eval runner with a scripted TEST runtime and policy: files, pass@k, resume, overlap."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from leanrl import ConfigError, EnvironmentConfig, RuntimeConfig, TasksetConfig, load_environment
from leanrl.eval import EvalConfig, read_results, run_eval
from leanrl.eval.runner import chunk_seed
from tests._scripted_runtime import ScriptedPolicy

RT = "tests._scripted_runtime:ScriptedRuntime"
# Sample 0 is accepted by the test runtime, samples 1-3 are not: n=4, c=1 for every task.
TEXTS = ["\n  omega\n", "\n  simp\n", "\n  linarith\n", "\n  ring\n"]


def make(bench_data: Path, out: Path, **kw: Any) -> EvalConfig:
    rt = kw.pop("runtime_options", {})
    return EvalConfig(
        env=EnvironmentConfig(
            id="minif2f",
            taskset=TasksetConfig(path=bench_data, limit=kw.pop("limit", 6)),
            runtime=RuntimeConfig(name=RT, options=rt),
        ),
        samples=kw.pop("samples", 4),
        k=kw.pop("k", [1, 2, 4]),
        out=out,
        chunk_tasks=kw.pop("chunk_tasks", 2),
        progress=False,
        **kw,
    )


def lines(out: Path) -> list[dict[str, Any]]:
    return list(read_results(out))


async def test_run_writes_every_attempt_and_the_report(bench_data: Path, tmp_path: Path) -> None:
    cfg = make(bench_data, tmp_path / "run")
    policy = ScriptedPolicy(TEXTS)
    s = await run_eval(cfg, policy=policy)
    recs = lines(tmp_path / "run")
    assert len(recs) == 24 and len({(r["task_id"], r["sample"]) for r in recs}) == 24
    # the runtime's own counters and costs reach the summary
    assert s["runtime"]["metrics"]["checked"] == 24.0
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["runtime"]["metrics"]["checked"] == 24.0
    r0 = next(r for r in recs if r["sample"] == 0)
    assert r0["accepted"] and r0["verdict"]["reason"] == "ok" and r0["reward"] == 1.0
    assert r0["proof"] == "\n  omega" and r0["completion"] == TEXTS[0]
    assert r0["prompt"].startswith("Complete the following Lean 4 code")
    assert r0["completion_tokens"] == len(TEXTS[0]) and "generate" in r0["timings"]
    table = s["results"]["pass_at_k"]["all"]
    assert table == {"tasks": 6, "pass@1": 0.25, "pass@2": 0.5, "pass@4": 1.0}
    assert s["results"]["pass_at_k_curve"]["all"]["pass@3"] == pytest.approx(0.75)
    assert set(s["results"]["pass_at_k"]) >= {"all", "aime"}  # per category too
    assert s["results"]["reasons"] == {"error": 18, "ok": 6}
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["versions"]["lean_toolchain"] == "leanprover/lean4:v4.24.0"
    assert summary["versions"]["leanrl"] and summary["config"]["samples"] == 4
    report = (tmp_path / "run" / "report.md").read_text()
    assert "| **all** | 6 | 25.0% | 50.0% | 100.0% |" in report
    png = (tmp_path / "run" / "pass_at_k.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    # chunks of 2 tasks x 4 samples, each with its own fixed seed
    assert [len(c) for c in policy.calls] == [2, 2, 2]
    assert policy.seeds == [chunk_seed(0, i) for i in range(3)]


async def test_resume_after_interruption_redoes_nothing(bench_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    cfg = make(bench_data, out, pipeline_depth=1, runtime_options={"delay_s": 0.2}, stream=False)
    first = ScriptedPolicy(TEXTS)
    job = asyncio.ensure_future(run_eval(cfg, policy=first))
    while not (out / "results.jsonl").is_file() or not (out / "results.jsonl").read_text():
        await asyncio.sleep(0.02)
    job.cancel()  # interrupted after the first chunk was recorded
    with pytest.raises(asyncio.CancelledError):
        await job
    done = {(r["task_id"], r["sample"]) for r in lines(out)}
    assert 0 < len(done) < 24
    second = ScriptedPolicy(TEXTS)
    s = await run_eval(cfg, policy=second)
    recs = lines(out)
    keys = [(r["task_id"], r["sample"]) for r in recs]
    assert len(keys) == 24 and len(set(keys)) == 24  # nothing lost, nothing twice
    redone = {p for call in second.calls for p in call}
    assert len(second.calls) == 3 - len(done) // 8  # only the chunks that were not finished
    assert s["results"]["pass_at_k"]["all"]["pass@2"] == 0.5
    assert s["timing"]["attempts_this_run"] == 24 - len(done)
    assert redone  # the unfinished chunks were generated again
    # a third run has nothing left to do and calls no model
    third = ScriptedPolicy(TEXTS)
    await run_eval(cfg, policy=third)
    assert third.calls == [] and len(lines(out)) == 24


async def test_torn_last_line_and_duplicates_are_reconciled(
    bench_data: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    cfg = make(bench_data, out, limit=2)
    await run_eval(cfg, policy=ScriptedPolicy(TEXTS))
    recs = lines(out)
    body = "".join(json.dumps(r) + "\n" for r in recs[:5])
    body += json.dumps(recs[0]) + "\n"  # a duplicate
    body += json.dumps(recs[5])[:40]  # a line torn by a kill
    (out / "results.jsonl").write_text(body)
    policy = ScriptedPolicy(TEXTS)
    await run_eval(cfg, policy=policy)
    keys = [(r["task_id"], r["sample"]) for r in lines(out)]
    assert len(keys) == 8 and len(set(keys)) == 8
    assert len(policy.calls) == 1  # only the chunk with missing attempts ran again


async def test_a_different_config_is_not_resumed(bench_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    await run_eval(make(bench_data, out, limit=2), policy=ScriptedPolicy(TEXTS))
    with pytest.raises(ConfigError, match=r"different eval run.*samples: 4 -> 8.*--out"):
        await run_eval(
            make(bench_data, out, limit=2, samples=8, k=[1]), policy=ScriptedPolicy(TEXTS)
        )
    # other k values and a longer limit are the same run: it re-reports and extends
    s = await run_eval(make(bench_data, out, limit=4, k=[1, 3]), policy=ScriptedPolicy(TEXTS))
    assert s["results"]["pass_at_k"]["all"] == {"tasks": 4, "pass@1": 0.25, "pass@3": 0.75}
    assert len(lines(out)) == 16


async def test_generation_and_verification_overlap(bench_data: Path, tmp_path: Path) -> None:
    def overlaps(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> bool:
        return any(s1 < e2 and s2 < e1 for s1, e1 in a for s2, e2 in b)

    runs = {}
    for depth in (1, 2):
        env = load_environment(make(bench_data, tmp_path / f"d{depth}").env)
        env.config.runtime.options = {"delay_s": 0.1}
        cfg = make(
            bench_data, tmp_path / f"d{depth}", pipeline_depth=depth, chunk_tasks=1, stream=False
        )
        policy = ScriptedPolicy(TEXTS, delay_s=0.1)
        await run_eval(cfg, policy=policy, env=env)
        runs[depth] = overlaps(policy.spans, env.runtime.spans)  # type: ignore[attr-defined]
        assert len(env.runtime.spans) == 6  # type: ignore[attr-defined]
    assert runs == {1: False, 2: True}


async def test_bad_input_fails_before_any_work(bench_data: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"k=\[8\] is larger than samples=4"):
        await run_eval(make(bench_data, tmp_path / "a", k=[1, 8]), policy=ScriptedPolicy(TEXTS))
    bad_env = make(bench_data, tmp_path / "b")
    bad_env.env.id = "nosuchenv"
    with pytest.raises(ConfigError, match=r"unknown environment 'nosuchenv'\. Known: .*minif2f"):
        await run_eval(bad_env, policy=ScriptedPolicy(TEXTS))
    bad_h = make(bench_data, tmp_path / "c")
    bad_h.env.harness.name = "nope"
    with pytest.raises(ConfigError, match=r"unknown harness 'nope'\. Known: .*whole-proof"):
        await run_eval(bad_h, policy=ScriptedPolicy(TEXTS))
    lean_missing = make(bench_data, tmp_path / "d", runtime_options={"fail_start": True})
    from leanrl import LeanNotFoundError

    policy = ScriptedPolicy(TEXTS)
    with pytest.raises(LeanNotFoundError, match="leanrl setup"):
        await run_eval(lean_missing, policy=policy)
    assert policy.calls == []
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    # once Lean is there, the same folder takes a changed config: it never recorded anything
    fixed = make(bench_data, tmp_path / "d", samples=2, k=[1])
    s = await run_eval(fixed, policy=ScriptedPolicy(TEXTS))
    assert s["results"]["attempts"] == 12


@pytest.mark.lean
async def test_real_lean_verdicts_through_the_runner(bench_data: Path, tmp_path: Path) -> None:
    cfg = EvalConfig(
        env=EnvironmentConfig(
            id="core",
            taskset=TasksetConfig(path=bench_data, split=None, names=["mathd_numbertheory_101"]),
            runtime=RuntimeConfig(name="local"),
        ),
        samples=3,
        k=[1, 3],
        out=tmp_path / "lean",
        progress=False,
    )
    policy = ScriptedPolicy(["\n  decide\n", "\n  sorry\n", "\n  exact no_such_lemma\n"])
    s = await run_eval(cfg, policy=policy)
    reasons = [
        r["verdict"]["reason"] for r in sorted(lines(tmp_path / "lean"), key=lambda r: r["sample"])
    ]
    assert reasons == ["ok", "sorry", "error"]
    assert s["results"]["pass_at_k"]["all"]["pass@1"] == pytest.approx(1 / 3)


async def test_tactic_loop_through_the_runner(bench_data: Path, tmp_path: Path) -> None:
    cfg = make(bench_data, tmp_path / "tl", limit=2, samples=2, k=[1, 2])
    cfg.env.harness.name = "tactic-loop"
    cfg.env.harness.prompt_format = "chat"
    first = load_environment(cfg.env).tasks()[0]

    def pick(prompt: Any, sample: int) -> str:
        # the first task is solved in one turn; the other never (an unknown tactic each turn)
        return "```lean4\nomega\n```" if first.name in str(prompt) else "```lean4\nbad\n```"

    s = await run_eval(cfg, policy=ScriptedPolicy([], pick=pick))
    recs = lines(tmp_path / "tl")
    assert len(recs) == 4
    solved = [r for r in recs if r["task_id"] == first.id]
    assert all(r["accepted"] and r["proof"] == "\n  omega" for r in solved)
    assert all(r["turns"][0]["feedback"].startswith("No goals remain") for r in solved)
    failed = [r for r in recs if r["task_id"] != first.id]
    assert all(r["verdict"]["reason"] == "error" and len(r["turns"]) == 8 for r in failed)
    assert all(r["turns"][0]["feedback"].startswith("Error: unknown tactic") for r in failed)
    assert all(r["feedback_tokens"] > 0 for r in recs)
    assert s["results"]["pass_at_k"]["all"] == {"tasks": 2, "pass@1": 0.5, "pass@2": 0.5}


async def test_progress_bar_shows_tasks_rate_and_pass_rate(
    bench_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = make(bench_data, tmp_path / "p", limit=4).model_copy(update={"progress": True})
    await run_eval(cfg, policy=ScriptedPolicy(TEXTS))
    err = capsys.readouterr().err
    assert "16/16" in err and "att/s" in err and "pass 100.0%" in err


async def test_versions_name_the_lean_project(bench_data: Path, tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "lean-toolchain").write_text("leanprover/lean4:v4.24.0\n")
    manifest = {"packages": [{"name": "mathlib", "rev": "f897ebcf"}, {"name": "aesop", "rev": "a"}]}
    (proj / "lake-manifest.json").write_text(json.dumps(manifest))
    cfg = make(bench_data, tmp_path / "v", limit=1)
    cfg.env.runtime.lean_project = proj
    s = await run_eval(cfg, policy=ScriptedPolicy(TEXTS))
    v = s["versions"]
    assert v["lean_project_toolchain"] == "leanprover/lean4:v4.24.0"
    assert v["lean_project_mathlib_rev"] == "f897ebcf" and v["model"] == "scripted"
    assert "Lean: leanprover/lean4:v4.24.0" in (tmp_path / "v" / "report.md").read_text()


async def test_versions_find_the_project_leanrl_setup_made(
    bench_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No project configured: the one `leanrl setup` made the default is the one recorded."""
    proj = tmp_path / "cache" / "projects" / "p"
    proj.mkdir(parents=True)
    (proj / "lean-toolchain").write_text("leanprover/lean4:v4.19.0\n")
    (proj / "lake-manifest.json").write_text(
        json.dumps({"packages": [{"name": "mathlib", "rev": "abc"}]})
    )
    (tmp_path / "cache" / "default-project").write_text(str(proj))
    monkeypatch.setenv("LEANRL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("LEANRL_LEAN_PROJECT", raising=False)
    s = await run_eval(make(bench_data, tmp_path / "v", limit=1), policy=ScriptedPolicy(TEXTS))
    v = s["versions"]
    assert (
        v["lean_project"] == str(proj) and v["lean_project_toolchain"] == "leanprover/lean4:v4.19.0"
    )
    assert v["lean_project_mathlib_rev"] == "abc"
    report = (tmp_path / "v" / "report.md").read_text()
    assert "Lean project used: " in report and "toolchain leanprover/lean4:v4.19.0" in report


async def test_an_unreachable_server_fails_before_the_runtime_starts(
    bench_data: Path, tmp_path: Path
) -> None:
    from leanrl import PolicyConfig, PolicyError

    cfg = make(bench_data, tmp_path / "o", limit=1)
    cfg.policy = PolicyConfig(backend="openai", model="m", base_url="http://127.0.0.1:9/v1")
    env = load_environment(cfg.env)
    with pytest.raises(PolicyError, match="cannot reach the OpenAI-compatible server"):
        await run_eval(cfg, env=env)
    assert env.runtime.started is False  # type: ignore[attr-defined]


def test_greedy_with_several_samples_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Every greedy sample is the same completion: say so before spending the compute.
    import logging

    from test_countdown import ScriptedPolicy

    from leanrl.eval.config import EvalConfig
    from leanrl.eval.runner import run_eval_sync

    cfg = EvalConfig(
        env={"id": "countdown", "taskset": {"limit": 1}},  # type: ignore[arg-type]
        samples=2,
        sampling={"temperature": 0.0},  # type: ignore[arg-type]
        out=tmp_path / "ev",
        progress=False,
    )
    with caplog.at_level(logging.WARNING, logger="leanrl"):
        run_eval_sync(cfg, policy=ScriptedPolicy(["<answer>1</answer>"]))
    assert any("pass@k for k > 1 equals pass@1" in r.getMessage() for r in caplog.records)


class _ReportingPolicy(ScriptedPolicy):
    """Reports its completions one at a time inside generate (as the HF backend does per
    batch), and records where the eval's progress bar stood after each report."""

    def __init__(self, texts: list[str]) -> None:
        super().__init__(texts)
        self.positions: list[int] = []

    async def generate(self, prompts: Any, sampling: Any) -> Any:
        out = await super().generate(prompts, sampling)
        for group in out:
            self.completed(len(group))
            bar = getattr(self.on_completions, "__self__", None)  # the runner's _Progress
            self.positions.append(-1 if bar is None else bar.at)
        return out


async def test_the_bar_moves_inside_a_generate_call_without_lean(tmp_path: Path) -> None:
    # Countdown (no Lean): one chunk of 4 tasks x 2 samples is one generate call; the bar must
    # move per reported completion, not sit at 0 until the call (here: the whole run) ends.
    cfg = EvalConfig(
        env=EnvironmentConfig(id="countdown", taskset=TasksetConfig(limit=4)),
        samples=2,
        out=tmp_path / "c",
        chunk_tasks=8,
        progress=False,
    )
    policy = _ReportingPolicy(["<answer> 1 + 2 </answer>"])
    await run_eval(cfg, policy=policy)
    assert len(policy.calls) == 1
    assert policy.positions == [2, 4, 6, 8]
    assert policy.on_completions is None  # unhooked after the run


async def test_with_lean_the_bar_counts_verdicts_not_generations(
    bench_data: Path, tmp_path: Path
) -> None:
    cfg = make(bench_data, tmp_path / "l", limit=2, samples=2, k=[1, 2])
    policy = _ReportingPolicy(TEXTS)
    await run_eval(cfg, policy=policy)
    assert policy.positions == [0, 0]  # generated, not yet checked: the bar waits for Lean


async def test_a_resumed_eval_says_what_was_recorded(
    bench_data: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = make(bench_data, tmp_path / "r", limit=2, samples=2, k=[1, 2])
    await run_eval(cfg, policy=ScriptedPolicy(TEXTS))
    with caplog.at_level("INFO", logger="leanrl.eval"):
        await run_eval(cfg, policy=ScriptedPolicy(TEXTS))
    said = [r.getMessage() for r in caplog.records if "resuming" in r.getMessage()]
    assert said == [
        f"resuming {cfg.out_dir}: 4 of 4 attempts already recorded, nothing to redo "
        "(reporting only)"
    ]


def test_the_hf_backend_reports_each_batch(tiny_model_dir: Path) -> None:
    from leanrl.policies.hf import HFPolicy
    from leanrl.policy import PolicyConfig, SamplingConfig
    from leanrl.runtime import run_sync

    policy = HFPolicy(PolicyConfig(model=str(tiny_model_dir), device="cpu", batch_size=2))
    seen: list[int] = []
    policy.on_completions = seen.append
    sampling = SamplingConfig(n=3, max_tokens=2, temperature=1.0, seed=0)
    out = run_sync(policy.generate(["a b", "c d"], sampling))
    assert [len(g) for g in out] == [3, 3]
    assert seen == [2, 2, 2]
