"""Trace converters: verifiers' traces.jsonl <-> leanrl's proofs.jsonl.

The verifiers side is written and read with verifiers' own models and trace store where the
package is installed (the converters themselves are plain JSON); leanrl's verdicts come from the
scripted test runtime (accepts a proof containing ``omega``; never Lean).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from leanrl.errors import DatasetError
from leanrl.interop.traces import kept_from_trace, proofs_to_vf, vf_to_proofs
from leanrl.interop.traces_cli import TracesCommand
from leanrl.proofs import read_proofs

HAS_VF = importlib.util.find_spec("verifiers") is not None
needs_vf = pytest.mark.skipif(not HAS_VF, reason="verifiers is not installed (extra `verifiers`)")


def generic_episode(reply: str, score: float, ok: bool = True, key: str = "k1") -> dict[str, Any]:
    """A verifiers episode of a taskset other than leanrl's, as verifiers writes it."""
    trace = {
        "id": "t-" + key,
        "task": {
            "type": "LettersTask",
            "key": key,
            "data": {"idx": 0, "name": "say_cat", "prompt": "Say the word cat.", "word": "cat"},
        },
        "agent": {"config": {"model": "m"}},
        "nodes": [
            {"message": {"role": "user", "content": "Say the word cat."}},
            {"parent": 0, "sampled": True, "message": {"role": "assistant", "content": reply}},
        ],
        "rewards": {"letters": {"score": score / 2, "weight": 1.0}, "exact": {"score": score / 2}},
        "ok": ok,
        "errors": [] if ok else [{"type": "HarnessError", "message": "boom"}],
    }
    return {
        "id": "e-" + key,
        "env": {"id": "_vf_letters"},
        "task": trace["task"],
        "traces": [trace],
    }


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_solved_verifiers_trace_becomes_the_verifiers_environments_kept_proof(
    tmp_path: Path,
) -> None:
    src = write_jsonl(
        tmp_path / "traces.jsonl",
        [
            generic_episode(" cat ", 1.0, key="a"),
            generic_episode("ca", 0.6, key="b"),  # below solved_at
            generic_episode("cat", 1.0, ok=False, key="c"),  # errored: not a result
        ],
    )
    report = vf_to_proofs(tmp_path, tmp_path / "out" / "proofs.jsonl")
    assert (report.read, report.written) == (3, 1)
    assert report.skipped == {"reward below solved_at": 1, "errored rollout": 1}
    (row,) = read_proofs(tmp_path / "out" / "proofs.jsonl")
    # the same task the `verifiers` environment makes of that verifiers task
    assert row.task_id == "a" and row.name == "say_cat"
    assert row.formal_statement == "verifiers _vf_letters: a"
    assert row.informal_statement == "Say the word cat."
    assert row.proof == "cat" and row.source == "verifiers" and row.model == "m"
    again = vf_to_proofs(src, tmp_path / "out" / "proofs.jsonl", solved_at=0.5)
    assert again.written == 1 and again.skipped["already kept"] == 1  # b now; a not twice


def test_bad_results_files_are_named_with_the_line(tmp_path: Path) -> None:
    (tmp_path / "traces.jsonl").write_text(json.dumps(generic_episode("cat", 1.0)) + "\n{oops\n")
    with pytest.raises(DatasetError, match=r"traces.jsonl, line 2: not JSON"):
        vf_to_proofs(tmp_path, tmp_path / "p.jsonl")
    (tmp_path / "traces.jsonl").write_text('{"rows": 1}\n')
    with pytest.raises(DatasetError, match="line 1: neither a verifiers episode"):
        vf_to_proofs(tmp_path, tmp_path / "p.jsonl")
    with pytest.raises(DatasetError, match="do not exist"):
        vf_to_proofs(tmp_path / "nowhere", tmp_path / "p.jsonl")


def test_a_trace_of_leanrls_taskset_is_kept_only_when_leanrl_accepted_it() -> None:
    from leanrl import load_environment

    task = load_environment("core", limit=1).tasks()[0]
    reply = f"```lean4\n{task.formal_statement}\n  omega\n```"
    trace: dict[str, Any] = {
        "task": {"data": {"leanrl_task": task.model_dump(mode="json")}},
        "root_reply": reply,
        "info": {"leanrl_verdict": {"accepted": True, "reason": "ok", "axioms": ["propext"]}},
    }
    row, why = kept_from_trace(trace)
    assert row is not None and why == ""
    assert row.task_id == task.id and row.header == task.header
    assert row.proof.strip() == "omega" and row.axioms == ["propext"]
    # a reward is not a verdict: without leanrl's acceptance nothing is kept
    trace["info"]["leanrl_verdict"]["accepted"] = False
    trace["rewards"] = {"other": {"score": 1.0}}
    assert kept_from_trace(trace) == (None, "not accepted")
    del trace["info"]
    assert kept_from_trace(trace) == (None, "no leanrl verdict")


@needs_vf
@pytest.mark.slow  # verifiers' models and trace store, a scored taskset
def test_vf_results_to_proofs_and_back_round_trip_through_verifiers_own_reader(
    tmp_path: Path,
) -> None:
    import verifiers.v1 as vf
    from verifiers.v1.utils.trace_store import read_episodes, write_episode

    from leanrl.interop.verifiers_plugin import LeanrlTaskset, LeanrlTasksetConfig

    ts = LeanrlTaskset(
        LeanrlTasksetConfig(
            id="leanrl-verifiers", env="core", limit=2, runtime="_scripted_runtime:ScriptedRuntime"
        )
    )
    run = tmp_path / "vf-run"
    run.mkdir()
    tasks = list(ts)
    for task, tactic in zip(tasks, ("omega", "simp"), strict=True):
        stmt = task.data.leanrl_task["formal_statement"]
        trace = vf.Trace(
            task=vf.TraceTask(type="LeanrlTask", data=task.data),
            agent=vf.AgentInfo(config=vf.AgentConfig(model="standin")),
            root_reply=f"```lean4\n{stmt}\n  {tactic}\n```",
            is_completed=True,
            ok=True,
        )
        asyncio.run(task.score(trace))
        write_episode(run, vf.Episode(task=trace.task, traces=[trace], ok=True))

    TracesCommand(src=run, to="proofs", out=tmp_path / "leanrl").cli_cmd()
    (kept,) = read_proofs(tmp_path / "leanrl" / "proofs.jsonl")
    assert kept.task_id == tasks[0].data.leanrl_task["id"] and kept.proof.strip() == "omega"
    assert kept.model == "standin"

    back = proofs_to_vf(tmp_path / "leanrl", tmp_path / "back")
    assert (back.read, back.written) == (1, 1)
    (episode,) = read_episodes(tmp_path / "back", vf.Trace[vf.WireTaskData])
    (t,) = episode.traces
    assert t.reward == 1.0 and t.info["leanrl_verdict"]["accepted"] is True
    assert [m.role for m in t.messages] == ["system", "user", "assistant"]
    assert "omega" in t.last_reply
    # ... and the episode converts back to the same kept proof
    vf_to_proofs(tmp_path / "back", tmp_path / "again.jsonl")
    (again,) = read_proofs(tmp_path / "again.jsonl")
    for f in ("task_id", "header", "formal_statement", "proof", "preamble", "completion"):
        assert getattr(again, f) == getattr(kept, f), f
