"""Training corpora load from local files in their published formats, `sorry` statements included.

The fixtures under tests/fixtures/corpora/ hold a few rows in each corpus' own column layout
(Goedel-Pset-v1, NuminaMath-LEAN, Lean Workbook, DeepSeek-Prover-V1); the hub is not used.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from leanrl import load_environment
from leanrl.errors import DatasetError
from leanrl.taskset import declared_name, strip_sorry_proof

FIX = Path(__file__).parent / "fixtures" / "corpora"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("theorem a : 1 = 1 := by sorry", "theorem a : 1 = 1 := by"),
        ("theorem a : 1 = 1 := sorry", "theorem a : 1 = 1 := by"),
        ("theorem a : 1 = 1 := by\n  sorry\n", "theorem a : 1 = 1 := by"),
        ("theorem a : 1 = 1  :=  by  sorry", "theorem a : 1 = 1 := by"),
        ("theorem a : 1 = 1 := by sorry -- to do", "theorem a : 1 = 1 := by"),
        ("theorem a : 1 = 1 := by", "theorem a : 1 = 1 := by"),
        # `sorry` inside the statement, or a real proof: not a placeholder, left alone
        ("theorem a : f sorry = 1 := by simp", "theorem a : f sorry = 1 := by simp"),
        ("theorem a : 1 = 1 := by\n  -- sorry", "theorem a : 1 = 1 := by\n  -- sorry"),
    ],
)
def test_strip_sorry_proof(text: str, want: str) -> None:
    assert strip_sorry_proof(text) == want


def test_declared_name_skips_comments() -> None:
    text = "/-- theorem fake : 1 = 1 -/\n-- theorem other\ntheorem real_one (x : ℕ) : x = x := by"
    assert declared_name(text) == "real_one"
    assert declared_name("def f : ℕ := 1") is None


def test_dataset_env_accepts_sorry_rows(tmp_path: Path) -> None:
    f = tmp_path / "rows.jsonl"
    rows = [
        {"name": "a", "formal_statement": "theorem a : 1 = 1 := by sorry"},
        {"name": "b", "formal_statement": "theorem b : 2 = 2 := sorry"},
        {"name": "c", "formal_statement": "theorem c : 3 = 3 := by\n  sorry"},
    ]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = load_environment("dataset", path=f, split=None).tasks()
    assert [t.formal_statement for t in tasks] == [
        "theorem a : 1 = 1 := by",
        "theorem b : 2 = 2 := by",
        "theorem c : 3 = 3 := by",
    ]


def test_goedel_pset() -> None:
    env = load_environment("leanrl.environments.corpora:GoedelPset", path=FIX / "goedel_pset.jsonl")
    tasks = env.tasks()
    assert [t.id for t in tasks] == ["numina_1", "numina_2", "lean_workbook_3"]
    assert [t.name for t in tasks] == ["two_plus_two", "sq_nonneg_x", "two_plus_two"]
    t0, t1, _ = tasks
    assert t0.header.startswith("import Mathlib\nimport Aesop") and "open BigOperators" in t0.header
    assert t0.formal_statement == (
        "/-- Show that $2 + 2 = 4$.-/\ntheorem two_plus_two : (2 : ℕ) + 2 = 4 := by"
    )
    assert t1.formal_statement.endswith("x ^ 2 ≥ 0 := by")
    assert t0.informal_statement == "Show that $2 + 2 = 4$."
    assert env.taskset.split is None  # a corpus keeps every row unless a split is asked for


def test_numina_lean_keeps_proof_columns() -> None:
    env = load_environment("leanrl.environments.corpora:NuminaLean", path=FIX / "numina_lean.jsonl")
    t0, t1 = env.tasks()
    assert (t0.id, t0.name) == ("0a1b-1", "algebra_1")
    assert t0.header == "import Mathlib\n\n"
    assert t0.formal_statement == "theorem algebra_1 (x : ℝ) (h : x + 1 = 3) : x = 2 := by"
    assert t0.informal_statement.startswith("Find $x$")
    assert "linarith" in t0.extra["formal_ground_truth"]
    assert t1.formal_statement == "theorem number_theory_2 : Odd 7 := by"
    assert t1.source == "aops"


def test_lean_workbook_gets_the_default_header() -> None:
    env = load_environment(
        "leanrl.environments.corpora:LeanWorkbook", path=FIX / "lean_workbook.jsonl"
    )
    t0, t1 = env.tasks()
    assert t0.name == t0.id == "lean_workbook_10"
    assert t0.header.startswith("import Mathlib") and "maxHeartbeats 400000" in t0.header
    assert t1.formal_statement == "theorem lean_workbook_plus_22 : (1 : ℕ) + 1 = 2 := by"
    assert t0.extra["tactic"] == "nlinarith [sq_nonneg (a - b)]"
    assert type(env.taskset).hub_revision == "4db66c03298bb5a20b5b1e1923d8f42051a4851f"


def test_corpus_lean_versions_come_from_their_sources(tmp_path: Path) -> None:
    """Lean Workbook's card names Lean v4.8.0-rc1 and Mathlib of the same tag; Goedel-Pset was
    written in DeepSeek-Prover-V1.5's environment; the others name no version (None: the user
    points the runtime at a project). A file declaring another Lean is refused."""
    pins = {
        e: (type(t).lean_toolchain, type(t).mathlib_rev)
        for e in ("lean-workbook", "goedel-pset", "numina-lean", "deepseek-prover-v1")
        for t in [load_environment(e).taskset]
    }
    assert pins["lean-workbook"] == (
        "leanprover/lean4:v4.8.0-rc1",
        "db651742f2c631e5b8525e9aabcf3d61ed094a4a",
    )
    assert pins["goedel-pset"] == (
        "leanprover/lean4:v4.9.0",
        "2f65ba7f1a9144b20c8e7358513548e317d26de1",
    )
    assert pins["numina-lean"] == pins["deepseek-prover-v1"] == (None, None)
    rows = (FIX / "lean_workbook.jsonl").read_text(encoding="utf-8").splitlines()
    other = tmp_path / "lw.jsonl"
    other.write_text(
        "\n".join(
            json.dumps({**json.loads(r), "lean_toolchain": "leanprover/lean4:v4.9.0"}) for r in rows
        )
    )
    with pytest.raises(DatasetError, match=r"written for Lean 4\.9\.0.*checks with Lean 4\.8\.0"):
        load_environment("lean-workbook", path=other).tasks()


def test_deepseek_prover_v1_unwraps_the_informal_comment() -> None:
    env = load_environment(
        "leanrl.environments.corpora:DeepSeekProverV1", path=FIX / "deepseek_prover_v1.jsonl"
    )
    t0, _ = env.tasks()  # rows say split "lean_workbook": every row is kept by default
    assert t0.name == "induction_12"
    assert t0.informal_statement == "Prove that $n + 0 = n$ for naturals $n$."
    assert t0.formal_statement == "theorem induction_12 (n : ℕ) : n + 0 = n := by"
    assert t0.extra["formal_proof"] == "  simp"


def test_a_split_asked_for_filters_corpus_rows() -> None:
    path = FIX / "deepseek_prover_v1.jsonl"
    env = load_environment("leanrl.environments.corpora:DeepSeekProverV1", path=path, split="x")
    assert env.tasks() == []


def test_columns_given_override_the_corpus_defaults(tmp_path: Path) -> None:
    f = tmp_path / "wb.jsonl"
    f.write_text(
        json.dumps({"id": "w1", "stmt": "theorem w1 : True := by sorry", "nl": "True."}) + "\n"
    )
    env = load_environment(
        "leanrl.environments.corpora:LeanWorkbook",
        path=f,
        columns={"formal_statement": "stmt", "informal_statement": "nl"},
    )
    [t] = env.tasks()
    assert (t.name, t.informal_statement) == ("w1", "True.")


def test_statement_without_theorem_says_how_to_fix(tmp_path: Path) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps({"problem_id": "p", "formal_statement": "def x := 1"}) + "\n")
    env = load_environment("leanrl.environments.corpora:GoedelPset", path=f)
    with pytest.raises(DatasetError, match=r"row 1.*no theorem is declared.*columns.name"):
        env.tasks()
