"""Kept proofs: proofs.jsonl holds every verified attempt once per distinct proof, survives a
kill mid-write, and `leanrl eval` fills it from what its own process saw accepted, never from
results.jsonl (whose verdicts can be edited); huge completions are not stored whole.

Uses the scripted TEST runtime (accepts a proof containing ``omega``; not Lean) and the toy
tasks in tests/fixtures/toy_tasks.jsonl.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from leanrl import EnvironmentConfig, RuntimeConfig, TasksetConfig
from leanrl.errors import DatasetError
from leanrl.eval import EvalConfig, read_results, run_eval
from leanrl.proofs import ProofStore, kept_from, proof_digest, read_proofs
from leanrl.task import Task
from leanrl.verdict import VerificationPolicy
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


def _results(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]


def _write_results(out: Path, recs: list[dict[str, Any]]) -> None:
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


async def test_a_verdict_edited_to_accepted_is_not_copied_into_proofs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """results.jsonl is plain text anyone with the folder can edit: a resume keeps proofs only
    from attempts its own process saw accepted, and warns about the accepted records that have
    no kept proof."""
    out = tmp_path / "run"
    await run_eval(_eval_config(out), policy=ScriptedPolicy(TEXTS))
    before = (out / "proofs.jsonl").read_bytes()
    recs = _results(out)
    forged = next(r for r in recs if r["task_id"] == "toy_1" and r["sample"] == 1)
    assert not forged["accepted"]  # "\n  simp": the checker said no
    forged["accepted"] = True
    forged["verdict"] = {**forged["verdict"], "reason": "ok", "accepted": True}
    _write_results(out, recs)
    with caplog.at_level(logging.WARNING, logger="leanrl"):
        await run_eval(_eval_config(out), policy=ScriptedPolicy(["never called"]))
    assert (out / "proofs.jsonl").read_bytes() == before
    assert "simp" not in {r.proof.strip() for r in read_proofs(out / "proofs.jsonl")}
    assert any("1 accepted attempt(s) have no kept proof" in m for m in caplog.messages)


async def test_a_run_without_proofs_jsonl_is_not_filled_from_results(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "run"
    await run_eval(_eval_config(out), policy=ScriptedPolicy(TEXTS))
    (out / "proofs.jsonl").unlink()  # as if the run was made before proofs were kept
    with caplog.at_level(logging.WARNING, logger="leanrl"):
        await run_eval(_eval_config(out), policy=ScriptedPolicy(["never called"]))
    kept = out / "proofs.jsonl"
    assert not kept.is_file() or read_proofs(kept) == []
    # samples 0 and 2 of the 4 tasks were accepted
    assert any("8 accepted attempt(s) have no kept proof" in m for m in caplog.messages)


async def test_proofs_are_kept_before_their_attempts_are_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No resume copies from results.jsonl, so a crash between keeping a chunk's proofs and
    recording its attempts must lose no proof: proofs go first."""
    from leanrl.eval.store import ResultStore

    out = tmp_path / "run"
    cfg = _eval_config(out).model_copy(update={"pipeline_depth": 1})

    def crash(self: ResultStore, records: Any) -> int:
        raise RuntimeError("killed while recording")

    monkeypatch.setattr(ResultStore, "append", crash)
    with pytest.raises(RuntimeError, match="killed while recording"):
        await run_eval(cfg, policy=ScriptedPolicy(TEXTS))
    # the chunk whose recording failed has its proofs kept
    assert {"toy_0", "toy_1"} <= {r.task_id for r in read_proofs(out / "proofs.jsonl")}
    assert (out / "results.jsonl").read_text() == ""
    monkeypatch.undo()
    with caplog.at_level(logging.WARNING, logger="leanrl"):
        await run_eval(cfg, policy=ScriptedPolicy(TEXTS))
    assert [r.task_id for r in read_proofs(out / "proofs.jsonl")] == [f"toy_{i}" for i in range(4)]
    assert not any("no kept proof" in m for m in caplog.messages)


async def test_a_huge_completion_is_stored_cut_with_its_length_and_hash(tmp_path: Path) -> None:
    """A 0.9 MB completion (an API that ignored max_tokens) is not written whole, neither to
    results.jsonl nor to proofs.jsonl: at most 4 x max_proof_chars of it, with the length and
    sha256 of the whole text. (It stays under the 1,000,000 characters extraction reads: a
    longer output is refused as ``too_large`` before extraction, tested in test_size_caps.)"""
    out = tmp_path / "run"
    huge = "\n  omega\n```\n" + "y" * 900_000  # the proof, then 0.9 MB after the fence
    long_proof = "\n  simp" + " <;> simp" * 300  # 2,707 characters: over max_proof_chars
    cfg = _eval_config(out)
    cfg = cfg.model_copy(
        update={
            "env": cfg.env.model_copy(
                update={
                    "taskset": cfg.env.taskset.model_copy(
                        update={"policy": VerificationPolicy(max_proof_chars=1000)}
                    )
                }
            )
        }
    )
    await run_eval(cfg, policy=ScriptedPolicy([huge, long_proof + "\n"]))
    assert (out / "results.jsonl").stat().st_size < 8 * 40_000  # not 8 MB
    rec = next(r for r in read_results(out) if r["task_id"] == "toy_0" and r["sample"] == 0)
    assert rec["accepted"] and rec["proof"] == "\n  omega"
    assert len(rec["completion"]) == 4000 and huge.startswith(rec["completion"])
    assert rec["text_cut"]["completion"] == {
        "chars": len(huge),
        "sha256": hashlib.sha256(huge.encode()).hexdigest(),
        "kept": 4000,
    }
    bad = next(r for r in read_results(out) if r["task_id"] == "toy_0" and r["sample"] == 1)
    # one character over the limit: checked again, it is still too long, as the whole was
    assert len(bad["proof"]) == 1001 and bad["text_cut"]["proof"]["chars"] == len(long_proof)
    [row] = [r for r in read_proofs(out / "proofs.jsonl") if r.task_id == "toy_0"]
    assert row.proof == "\n  omega" and row.completion == ""  # a cut text is no training text
    assert row.text_cut["completion"]["chars"] == len(huge)
    assert (out / "proofs.jsonl").stat().st_size < 20_000


def test_the_store_leaves_out_a_completion_over_its_limit(tmp_path: Path) -> None:
    store = ProofStore(tmp_path / "proofs.jsonl", completion_chars=100)
    [row] = store.add([kept_from(TASK, "\n  omega", completion="x" * 101)])
    assert row.completion == "" and row.text_cut["completion"]["chars"] == 101
    [short] = store.add([kept_from(TASK, "\n  simp", completion="x" * 100)])
    assert short.completion == "x" * 100 and short.text_cut == {}
