"""Tasksets: every built-in from the fixture data, filters, column mapping, bad rows, offline hub."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

import leanrl
from leanrl import ConfigError, DatasetError, load_environment
from leanrl.taskset import split_header

BUILTINS = {
    # id: (rows in the test split of the fixture file, toolchain)
    "minif2f": (14, "leanprover/lean4:v4.24.0"),
    "minif2f-deepseek": (4, "leanprover/lean4:v4.9.0"),
    "proofnet": (3, "leanprover/lean4:v4.20.0"),
    "proofnet-deepseek": (3, "leanprover/lean4:v4.9.0"),
    "putnambench": (3, "leanprover/lean4:v4.27.0"),
}


@pytest.mark.parametrize("env_id", sorted(BUILTINS))
def test_builtin_loads_from_local_folder(env_id: str, bench_data: Path) -> None:
    env = load_environment(env_id, split="test", path=bench_data)
    tasks = env.tasks()
    want, toolchain = BUILTINS[env_id]
    assert len(tasks) == want
    assert env.taskset.lean_toolchain == toolchain
    assert env.taskset.hub_id
    assert len({t.id for t in tasks}) == len(tasks)
    for t in tasks:
        assert t.formal_statement.endswith(":= by")
        assert t.name in t.formal_statement
        assert t.split == "test"


def test_limit_20_from_a_file(bench_data: Path) -> None:
    env = load_environment("minif2f", split="test", limit=10, path=bench_data / "minif2f.jsonl")
    assert isinstance(env, leanrl.Environment)
    tasks = env.tasks()
    assert len(tasks) == 10
    assert tasks[0].header.startswith("import Mathlib")
    assert tasks[0].informal_statement


def test_split_valid_and_none(bench_data: Path) -> None:
    assert len(load_environment("minif2f", split="valid", path=bench_data).tasks()) == 6
    assert len(load_environment("minif2f", split="validation", path=bench_data).tasks()) == 6
    assert len(load_environment("minif2f", split=None, path=bench_data).tasks()) == 20


def test_core_ships_its_statements() -> None:
    """`core` loads offline with no path: its data is part of the package."""
    env = load_environment("core")
    tasks = env.tasks()
    assert len(tasks) == 67 and env.taskset.lean_toolchain == "leanprover/lean4:v4.24.0"
    assert len(load_environment("core", split=None).tasks()) == 121
    for t in tasks:
        assert t.header == "" and t.formal_statement.endswith(":= by")
        assert "ℕ" not in t.formal_statement and "ℤ" not in t.formal_statement
        assert "import" not in t.formal_statement
    ground = [t for t in tasks if t.extra.get("ground")]
    assert ground and all(t.formal_statement.startswith(f"theorem {t.name} :") for t in ground)


def test_names_pattern_shuffle(bench_data: Path) -> None:
    kw = {"split": "test", "path": bench_data}
    picked = load_environment("minif2f", names=["imo_1959_p1", "amc12a_2020_p10"], **kw).tasks()
    assert {t.id for t in picked} == {"imo_1959_p1", "amc12a_2020_p10"}
    algebra = load_environment("minif2f", pattern="mathd_algebra_*", **kw).tasks()
    assert algebra and all(t.id.startswith("mathd_algebra_") for t in algebra)
    assert all(t.category == "mathd_algebra" for t in algebra)
    a = [t.id for t in load_environment("minif2f", shuffle=True, seed=1, limit=10, **kw).tasks()]
    b = [t.id for t in load_environment("minif2f", shuffle=True, seed=1, limit=10, **kw).tasks()]
    c = [t.id for t in load_environment("minif2f", shuffle=True, seed=2, limit=10, **kw).tasks()]
    plain = [t.id for t in load_environment("minif2f", limit=10, **kw).tasks()]
    assert a == b and a != c and a != plain


def test_unknown_name_is_a_clear_error(bench_data: Path) -> None:
    env = load_environment("minif2f", names=["no_such_problem"], path=bench_data)
    with pytest.raises(ConfigError, match="no_such_problem"):
        env.tasks()


def test_putnambench_fills_in_answers(bench_data: Path) -> None:
    tasks = {t.id: t for t in load_environment("putnambench", path=bench_data).tasks()}
    t = tasks["putnam_1962_a2"]
    assert "putnam_1962_a2_solution" in t.formal_statement
    assert ":= sorry" not in t.formal_statement  # the official answer replaced the placeholder
    assert t.category == "analysis"


def test_proofnet_deepseek_uses_unique_ids(bench_data: Path) -> None:
    tasks = load_environment("proofnet-deepseek", split=None, path=bench_data).tasks()
    names = [t.name for t in tasks]
    assert len(set(names)) < len(names)  # names repeat across books...
    assert len({t.id for t in tasks}) == len(tasks)  # ...ids do not
    assert any("|" in t.id for t in tasks)


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


GOOD = {"name": "t1", "header": "", "formal_statement": "theorem t1 : 1 = 1 := by"}


def test_generic_dataset_with_column_mapping(tmp_path: Path) -> None:
    f = _write(
        tmp_path / "mine.jsonl",
        [
            {
                "problem": "p1",
                "lean": "import Mathlib\n\ntheorem p1 : (2 : ℕ) + 2 = 4 := by",
                "nl": "Two plus two.",
                "split": "test",
            },
            {"problem": "p2", "lean": "theorem p2 : True := by", "nl": None, "split": "test"},
        ],
    )
    env = load_environment(
        "dataset",
        path=f,
        columns={"name": "problem", "formal_statement": "lean", "informal_statement": "nl"},
    )
    t1, t2 = env.tasks()
    assert t1.header == "import Mathlib\n\n"  # split off the statement: no header column
    assert t1.formal_statement.startswith("theorem p1")
    assert t1.informal_statement == "Two plus two."
    assert t2.header == "" and t2.informal_statement is None


@pytest.mark.parametrize(
    "row,field,msg",
    [
        ({"header": "", "formal_statement": "theorem t1 : 1 = 1 := by"}, "name", "missing"),
        ({"name": "t1", "header": ""}, "formal_statement", "missing"),
        (
            # a statement with a real proof (a placeholder `sorry` is stripped, not rejected)
            {**GOOD, "formal_statement": "theorem t1 : 1 = 1 := by rfl"},
            "formal_statement",
            "must end in ':= by'",
        ),
        ({**GOOD, "name": "t9"}, "name", "not declared"),
        ({**GOOD, "header": 3}, "header", "expected text"),
    ],
)
def test_bad_row_names_file_row_and_field(tmp_path: Path, row: dict, field: str, msg: str) -> None:
    f = _write(
        tmp_path / "bad.jsonl",
        [GOOD | {"name": "t0", "formal_statement": "theorem t0 : 1 = 1 := by"}, row],
    )
    with pytest.raises(DatasetError) as e:
        load_environment("dataset", path=f, split=None).tasks()
    text = str(e.value)
    assert str(f) in text and "row 2" in text and f"'{field}'" in text and msg in text


def test_duplicate_name_names_both_rows(tmp_path: Path) -> None:
    f = _write(tmp_path / "dup.jsonl", [GOOD, GOOD])
    with pytest.raises(DatasetError, match=r"row 2, field 'name': duplicate task id 't1'.*row 1"):
        load_environment("dataset", path=f, split=None).tasks()


def test_invalid_json_line(tmp_path: Path) -> None:
    f = tmp_path / "broken.jsonl"
    f.write_text(json.dumps(GOOD) + "\n{not json\n")
    with pytest.raises(DatasetError, match=r"broken.jsonl, row 2: not valid JSON"):
        load_environment("dataset", path=f, split=None).tasks()


def test_missing_path_and_wrong_folder(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="does not exist"):
        load_environment("minif2f", path=tmp_path / "nope.jsonl").tasks()
    with pytest.raises(DatasetError, match=r"does not hold minif2f\.jsonl"):
        load_environment("minif2f", path=tmp_path).tasks()


def test_offline_hub_fails_at_once_naming_both_fixes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.monotonic()
    with pytest.raises(DatasetError) as e:
        load_environment("minif2f").tasks()
    assert time.monotonic() - t0 < 15  # a guard against the hub's ~20 s retries, not a benchmark
    text = str(e.value)
    assert "cat-searcher/minif2f-lean4" in text and "--env.taskset.path" in text


def test_unreachable_hub_fails_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Offline mode off, but the endpoint is a closed local port: the probe must say so at once.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    with pytest.raises(DatasetError, match=r"unreachable.*--env\.taskset\.path"):
        load_environment("proofnet").tasks()


def test_dataset_without_a_source_says_how_to_give_one() -> None:
    with pytest.raises(DatasetError, match=r"no Hugging Face dataset.*--env\.taskset\.path"):
        load_environment("dataset").tasks()


def test_split_header() -> None:
    h, s = split_header("import Mathlib\nopen Real\n\n/-- doc -/\ntheorem x : True := by")
    assert h == "import Mathlib\nopen Real\n\n" and s.startswith("/-- doc -/")


def test_group_rewards_binary_and_shortest_bonus() -> None:
    from leanrl import Reason, Rollout, Verdict

    ok = Verdict(accepted=True, reason=Reason.OK)
    bad = Verdict.reject(Reason.ERROR, "x")
    task = leanrl.Task(name="t", header="", formal_statement="theorem t : True := by")
    group = [
        Rollout(task_id="t", prompt="p", proof="trivial", verdict=ok),
        Rollout(task_id="t", prompt="p", proof="exact True.intro", verdict=ok),
        Rollout(task_id="t", prompt="p", proof="x", verdict=bad),
    ]
    assert leanrl.Taskset().group_rewards(task, group) == [1.0, 1.0, 0.0]
    shaped = leanrl.Taskset(leanrl.TasksetConfig(shortest_proof_bonus=0.25))
    assert shaped.group_rewards(task, group) == [1.25, 1.0, 0.0]


def test_split_all_keeps_every_split_of_core() -> None:
    from leanrl import load_environment

    assert len(load_environment("core").tasks()) == 67  # the default: test
    assert len(load_environment("core", split="valid").tasks()) == 54
    assert len(load_environment("core", split="all").tasks()) == 121
