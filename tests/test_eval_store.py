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
