"""results.jsonl mechanics: one durable write per chunk, resumable after a torn write."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from leanrl.eval.store import ResultStore


def recs(task: str, n: int) -> list[dict[str, Any]]:
    return [{"task_id": task, "sample": i, "accepted": i == 0} for i in range(n)]


def test_a_chunk_is_one_write_and_one_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import leanrl.eval.store as store_mod

    syncs: list[int] = []
    real = store_mod.os.fsync
    monkeypatch.setattr(store_mod.os, "fsync", lambda fd: (syncs.append(fd), real(fd))[1])
    st = ResultStore(tmp_path)
    st.open("fp", {}, "")
    syncs.clear()
    assert st.append(recs("a", 64) + recs("b", 64)) == 128
    assert len(syncs) == 1  # not one per line: that blocks the event loop for seconds
    # duplicates, within the batch or of what is recorded, are not written
    assert st.append(recs("a", 2) + [{"task_id": "c", "sample": 0}] * 2) == 1
    st.close()
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    assert (
        len(lines) == 129
        and len({(json.loads(x)["task_id"], json.loads(x)["sample"]) for x in lines}) == 129
    )


def test_a_write_torn_by_a_kill_is_cut_and_the_rest_kept(tmp_path: Path) -> None:
    st = ResultStore(tmp_path)
    st.open("fp", {}, "")
    st.append(recs("a", 3))
    st.close()
    with open(tmp_path / "results.jsonl", "ab") as f:  # a kill in the middle of the next write
        f.write((json.dumps(recs("b", 1)[0]) + "\n").encode() + b'{"task_id": "b", "sam')
    again = ResultStore(tmp_path)
    again.open("fp", {}, "")
    assert sorted(again.records) == [("a", 0), ("a", 1), ("a", 2), ("b", 0)]
    assert again.append(recs("b", 2)) == 1  # only ("b", 1) was missing
    again.close()


def test_two_runs_cannot_write_one_folder_at_once(tmp_path: Path) -> None:
    from leanrl import ConfigError

    first = ResultStore(tmp_path)
    first.open("fp", {}, "")
    second = ResultStore(tmp_path)
    with pytest.raises(ConfigError, match="another eval is running"):
        second.open("fp", {}, "")
    first.close()
    second.open("fp", {}, "")  # free again once the first run is done
    second.close()


def test_a_refused_resume_does_not_keep_the_folder_locked(tmp_path: Path) -> None:
    from leanrl import ConfigError

    st = ResultStore(tmp_path)
    st.open("fp-a", {"samples": 1}, "")
    st.append(recs("a", 1))
    st.close()
    with pytest.raises(ConfigError, match="different eval run"):
        ResultStore(tmp_path).open("fp-b", {"samples": 2}, "")
    again = ResultStore(tmp_path)
    again.open("fp-a", {"samples": 1}, "")  # not "another eval is running"
    assert again.has(("a", 0))
    again.close()


def test_only_a_small_index_of_each_attempt_stays_in_memory(tmp_path: Path) -> None:
    st = ResultStore(tmp_path)
    st.open("fp", {}, "")
    big = [
        {**r, "completion": "x" * 10_000, "proof": "y" * 5_000, "prompt": "p" * 5_000,
         "verdict": {"reason": "error", "messages": [{"data": "z" * 5_000}]}, "completion_tokens": 7}
        for r in recs("a", 3)
    ]  # fmt: skip
    st.append(big)
    st.close()
    again = ResultStore(tmp_path)
    again.open("fp", {}, "")  # after a restart too
    for store in (st, again):
        entry = store.records[("a", 1)]
        assert entry == {"task_id": "a", "sample": 1, "accepted": False,
                         "verdict": {"reason": "error"}, "completion_tokens": 7}  # fmt: skip
    again.close()
    # the full records are on disk
    line = json.loads((tmp_path / "results.jsonl").read_text().splitlines()[1])
    assert line["completion"] == "x" * 10_000 and line["proof"] == "y" * 5_000


def test_a_proof_inside_its_completion_is_stored_once(tmp_path: Path) -> None:
    """Eval stored each proof twice (beside the completion it came from); a proof that is a piece
    of the completion is now its offsets, and every reader gets the text back."""
    from leanrl.eval import read_results

    body = "  intro x\n  simp [h, «odd name»] -- ∀ ünïcode\n"
    completion = f"Here it is:\n```lean4\ntheorem t : True := by\n{body}```\nDone ✓."
    rows = recs("a", 3)
    rows[0] |= {"completion": completion, "proof": body}
    rows[1] |= {"completion": completion, "proof": "  exact rebuilt_from_turns"}  # not inside
    rows[2] |= {"completion": "", "proof": None}
    st = ResultStore(tmp_path)
    st.open("fp", {}, "")
    st.append(rows)
    st.close()
    lines = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text("utf-8").splitlines()]
    assert "proof" not in lines[0] and lines[0]["proof_at"] == [
        completion.index(body),
        completion.index(body) + len(body),
    ]
    assert lines[1]["proof"] == "  exact rebuilt_from_turns" and "proof_at" not in lines[1]
    assert lines[2]["proof"] is None
    for got in (list(read_results(tmp_path)), list(ResultStore(tmp_path).full_records())):
        assert [r["proof"] for r in got] == [body, "  exact rebuilt_from_turns", None]
        assert all("proof_at" not in r for r in got)
    # stored once: the line is shorter than the record written with both
    size = (tmp_path / "results.jsonl").stat().st_size
    both = sum(len((json.dumps(r, ensure_ascii=False) + "\n").encode()) for r in rows)
    saved = len(json.dumps(body, ensure_ascii=False).encode())  # the proof's text, quoted
    assert both - saved < size < both - saved + 20  # plus `"proof_at": [20, 69]` for it


def test_a_bad_proof_offset_is_quarantined_not_trusted(tmp_path: Path) -> None:
    st = ResultStore(tmp_path)
    st.open("fp", {}, "")
    st.append([{**r, "completion": "abc", "proof": "b"} for r in recs("a", 2)])
    st.close()
    path = tmp_path / "results.jsonl"
    lines = path.read_text().splitlines()
    lines[0] = lines[0].replace('"proof_at": [1, 2]', '"proof_at": [1, 99]')
    path.write_text("\n".join(lines) + "\n")
    again = ResultStore(tmp_path)
    again.open("fp", {}, "")  # the damaged line goes aside and its attempt is redone
    assert not again.has(("a", 0)) and again.has(("a", 1))
    assert [r["proof"] for r in again.full_records()] == ["b"]
    again.close()
    assert "[1, 99]" in (tmp_path / "results.jsonl.quarantined").read_text()


def test_a_lone_surrogate_in_a_completion_is_written_and_read_back(tmp_path: Path) -> None:
    st = ResultStore(tmp_path)
    st.open("fp", {}, "")
    st.append([{**recs("a", 1)[0], "completion": "bad \ud800 text", "proof": None}])
    st.close()
    assert [r["completion"] for r in ResultStore(tmp_path).full_records()] == ["bad \ud800 text"]


def test_a_nan_in_a_record_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    """Python would write a bare ``NaN`` (not JSON: strict readers reject the whole file). The
    runner refuses non-finite rewards first; the store refuses whatever else is left, naming
    the attempt and the field, and writes none of the chunk."""
    from leanrl.errors import LeanrlError

    st = ResultStore(tmp_path)
    st.open("fp", {}, "")
    st.append(recs("a", 2))
    bad = recs("b", 2)
    bad[1]["timings"] = {"verify": float("inf")}
    with pytest.raises(LeanrlError, match=r"task 'b', attempt 1: timings\.verify is inf"):
        st.append(bad)
    st.close()

    def refuse(name: str) -> Any:
        raise ValueError(name)

    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    assert [json.loads(x, parse_constant=refuse)["task_id"] for x in lines] == ["a", "a"]
