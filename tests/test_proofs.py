"""Kept proofs: proofs.jsonl holds every verified attempt once per distinct proof, survives a
kill mid-write, and `leanrl eval` fills it (also for runs resumed from before it existed).

Uses the scripted TEST runtime (accepts a proof containing ``omega``; not Lean) and the toy
tasks in tests/fixtures/toy_tasks.jsonl.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from leanrl import EnvironmentConfig, RuntimeConfig, TasksetConfig
from leanrl.errors import DatasetError
from leanrl.eval import EvalConfig, run_eval
from leanrl.proofs import ProofStore, kept_from, proof_digest, read_proofs
from leanrl.task import Task
from tests._scripted_runtime import ScriptedPolicy

TOY = Path(__file__).parent / "fixtures" / "toy_tasks.jsonl"
RT = "tests._scripted_runtime:ScriptedRuntime"
TASK = Task(name="t", header="", formal_statement="theorem t : 1 = 1 := by")


def test_store_dedups_per_task_across_reopens(tmp_path: Path) -> None:
    path = tmp_path / "proofs.jsonl"
    s = ProofStore(path)
    first = s.add([kept_from(TASK, "\n  omega", source="eval"), kept_from(TASK, "omega\n  ")])
    assert len(first) == 1  # the same proof up to layout at the ends
    assert len(s.add([kept_from(TASK, "\n  simp; omega")])) == 1
    other = Task(name="u", header="", formal_statement="theorem u : 2 = 2 := by")
    assert len(s.add([kept_from(other, "\n  omega")])) == 1  # same text, another task: kept
    again = ProofStore(path)
    assert again.add([kept_from(TASK, "\n  omega")]) == []
    assert again.solved() == {"t", "u"} and again.count("t") == 2 and len(again) == 3
    rows = read_proofs(path)
    assert [r.proof for r in rows] == ["\n  omega", "\n  simp; omega", "\n  omega"]
    assert rows[0].digest == proof_digest("\n  omega")


def test_a_torn_last_line_is_cut_off(tmp_path: Path) -> None:
    path = tmp_path / "proofs.jsonl"
    ProofStore(path).add([kept_from(TASK, "\n  omega")])
    with path.open("a") as f:
        f.write('{"task_id": "t", "name": "t", "head')  # a kill mid-write
    s = ProofStore(path)
    assert len(s.add([kept_from(TASK, "\n  decide")])) == 1
    assert [r.proof for r in read_proofs(path)] == ["\n  omega", "\n  decide"]


def test_bad_lines_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "proofs.jsonl"
    path.write_text('{"name": "t"}\n{"also": 1}\n')
    with pytest.raises(DatasetError, match=r"line 1: not a proof row"):
        read_proofs(path)


def _eval_config(out: Path) -> EvalConfig:
    return EvalConfig(
        env=EnvironmentConfig(
            id="dataset",
            taskset=TasksetConfig(path=TOY, split="train", limit=4),
            runtime=RuntimeConfig(name=RT),
        ),
        samples=4,
        out=out,
        chunk_tasks=2,
        progress=False,
    )


# samples 0 and 2 are accepted, and they are the same proof: one kept proof per task
TEXTS = ["\n  omega\n", "\n  simp\n", "\n  omega\n", "\n  rfl\n"]


async def test_eval_keeps_each_distinct_verified_proof_once(tmp_path: Path) -> None:
    out = tmp_path / "run"
    await run_eval(_eval_config(out), policy=ScriptedPolicy(TEXTS))
    rows = read_proofs(out / "proofs.jsonl")
    assert [r.task_id for r in rows] == ["toy_0", "toy_1", "toy_2", "toy_3"]
    r = rows[0]
    assert (r.proof, r.source, r.model, r.sample, r.reason) == (
        "\n  omega",
        "eval",
        "scripted",
        0,
        "ok",
    )
    assert r.formal_statement == "theorem toy_0 (n : Nat) : n + 0 = 0 + n := by"
    assert r.task().formal_statement == r.formal_statement
    # rerunning the finished run adds nothing
    await run_eval(_eval_config(out), policy=ScriptedPolicy(TEXTS))
    assert len(read_proofs(out / "proofs.jsonl")) == 4


async def test_a_resumed_run_backfills_proofs_from_its_results(tmp_path: Path) -> None:
    out = tmp_path / "run"
    await run_eval(_eval_config(out), policy=ScriptedPolicy(TEXTS))
    (out / "proofs.jsonl").unlink()  # as if the run was made before proofs were kept
    await run_eval(_eval_config(out), policy=ScriptedPolicy(["never called"]))
    rows = [json.loads(x) for x in (out / "proofs.jsonl").read_text().splitlines()]
    assert sorted(r["task_id"] for r in rows) == ["toy_0", "toy_1", "toy_2", "toy_3"]
