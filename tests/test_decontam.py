"""Decontamination drops exactly the planted overlaps, says why, and writes its report.

tests/fixtures/decontam/bench.jsonl stands in for a benchmark (four miniF2F-style rows, two
splits); train_goedel.jsonl is a training file in Goedel-Pset's layout with four planted copies of
benchmark rows (renamed, reformatted, older notation, informal text reused) and three rows that
must stay (two near misses that differ in a constant, one unrelated).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from leanrl import load_environment
from leanrl.cli import main
from leanrl.decontam import decontaminate, informal_ngrams, statement_key
from leanrl.decontam_config import DecontaminationConfig
from leanrl.errors import ConfigError

FIX = Path(__file__).parent / "fixtures" / "decontam"
BENCH = f"dataset={FIX / 'bench.jsonl'}"
GOEDEL = "leanrl.environments.corpora:GoedelPset"


def _train() -> list:
    return load_environment(GOEDEL, path=FIX / "train_goedel.jsonl").tasks()


def test_statement_key_ignores_names_layout_comments_and_notation() -> None:
    a = statement_key("theorem t1 (x : ℝ) (h₀ : x + 1 = 3) : x = 2 := by")
    b = statement_key("/-- c -/ theorem zz (y : ℝ)\n  (h : y+1 = 3) :\n  y = 2 := by sorry")
    assert a == b
    assert a != statement_key("theorem t1 (x : ℝ) (h₀ : x + 1 = 4) : x = 2 := by")
    assert statement_key("theorem s : (∑ k in Finset.range 3, k) = 3 := by") == statement_key(
        "theorem s : (∑ j ∈ Finset.range 3, j) = 3 := by"
    )
    # a bound variable and a free constant of the same spelling are not confused
    assert statement_key("theorem a (f : ℕ → ℕ) : f 1 = 1 := by") != statement_key(
        "theorem a : Nat.succ 1 = 1 := by"
    )


def test_statements_only_drops_exactly_the_formal_plants() -> None:
    config = DecontaminationConfig(against=[BENCH])
    kept, report = decontaminate(_train(), config)
    dropped = {m.task_id: (m.by, m.benchmark_task) for m in report.dropped}
    assert dropped == {
        "plant_rename": ("statement", "mathd_algebra_10"),
        "plant_notation": ("statement", "mathd_numbertheory_466"),  # a `valid` row: all splits
        "plant_verbatim": ("statement", "amc12a_2008_p2"),
    }
    assert [t.id for t in kept] == ["near_miss", "plant_informal", "unrelated", "near_miss_2"]
    assert (report.checked, report.kept) == (7, 4)
    assert report.benchmark_rows == {"dataset": 4}
    assert report.counts() == {"dataset/statement": 3}


def test_informal_ngrams_also_drop_reused_problem_text() -> None:
    config = DecontaminationConfig(against=[BENCH], informal_ngram=13)
    kept, report = decontaminate(_train(), config)
    by_id = {m.task_id: m for m in report.dropped}
    assert set(by_id) == {"plant_rename", "plant_notation", "plant_verbatim", "plant_informal"}
    m = by_id["plant_informal"]
    assert (m.by, m.benchmark_task) == ("informal", "imo_1959_p1")
    assert len(m.evidence.split()) == 13
    assert [t.id for t in kept] == ["near_miss", "unrelated", "near_miss_2"]


def test_ngrams_need_enough_words() -> None:
    assert informal_ngrams("one two three", 4) == set()
    assert informal_ngrams("A b, C", 3) == {("a", "b", "c")}


def test_taskset_option_filters_and_keeps_the_report() -> None:
    env = load_environment(
        GOEDEL,
        path=FIX / "train_goedel.jsonl",
        decontaminate={"against": BENCH, "informal_ngram": 13},
        limit=2,  # applied after decontamination
    )
    assert [t.id for t in env.tasks()] == ["near_miss", "unrelated"]
    report = env.taskset.decontamination
    assert report is not None and len(report.dropped) == 4


def test_command_writes_kept_rows_dropped_rows_and_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="leanrl.decontam")
    out = tmp_path / "clean"
    rc = main(
        [
            "decontaminate",
            "--env",
            GOEDEL,
            "--env.taskset.path",
            str(FIX / "train_goedel.jsonl"),
            "--against",
            BENCH,
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    # The summary once: printed, and no longer also logged by the matcher (the CLI's log
    # handler showed it a second time).
    assert capsys.readouterr().out.count("dropped 3 of 7 training rows") == 1
    assert not [r for r in caplog.records if "dropped 3 of 7" in r.getMessage()]
    kept = load_environment("dataset", path=out / "kept.jsonl", split=None).tasks()
    assert [t.id for t in kept] == ["near_miss", "plant_informal", "unrelated", "near_miss_2"]
    dropped = [json.loads(x) for x in (out / "dropped.jsonl").read_text().splitlines()]
    assert [d["id"] for d in dropped] == ["plant_rename", "plant_notation", "plant_verbatim"]
    assert dropped[0]["matched"]["benchmark_task"] == "mathd_algebra_10"
    report = json.loads((out / "decontamination.json").read_text())
    assert report["checked"] == 7 and len(report["dropped"]) == 3
    assert "plant_verbatim" in (out / "decontamination.md").read_text()


def test_bad_specs_say_what_to_write(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="ENV or ENV=PATH"):
        DecontaminationConfig(against=["=x.jsonl"])
    config = DecontaminationConfig(against=[f"minif2f={tmp_path / 'missing.jsonl'}"])
    with pytest.raises(ConfigError, match=r"does not exist.*local copy of 'minif2f'"):
        decontaminate(_train(), config)


def test_an_uncached_benchmark_names_the_against_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    # Offline and not cached: the fix is `--against minif2f=PATH`, not the training set's
    # --env.taskset.path that the loader's own message suggests.
    from leanrl.errors import DatasetError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    try:
        decontaminate(_train(), DecontaminationConfig(against=["minif2f"]))
    except DatasetError as e:
        assert "--against minif2f=FILE_OR_FOLDER" in str(e)
    else:
        pytest.skip("miniF2F is in this machine's Hugging Face cache: nothing to fail on")
