"""Bad input gets a message naming the file, row and what is wrong, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from leanrl import EnvironmentConfig, TasksetConfig, load_environment
from leanrl.errors import DatasetError
from leanrl.eval import EvalConfig

ROW = {
    "name": "t0",
    "split": "test",
    "header": "import Mathlib\n",
    "formal_statement": "theorem t0 : 1 + 1 = 2 := by",
}


def _dataset(tmp_path: Path, bad_row: bytes) -> Path:
    path = tmp_path / "tasks.jsonl"
    good = json.dumps(ROW).encode() + b"\n"
    last = good.replace(b"t0", b"t3")
    path.write_bytes(good + good.replace(b"t0", b"t1") + bad_row + b"\n" + last)
    return path


def test_a_non_utf8_byte_in_a_dataset_names_file_row_and_column(tmp_path: Path) -> None:
    # "é" in Latin-1 (one byte 0xe9) where UTF-8 was expected, at column 25 of row 3
    bad = b'{"name": "t2", "x": "caf\xe9", "header": "", "formal_statement": "theorem t2 : True := by"}'
    path = _dataset(tmp_path, bad)
    env = load_environment(EnvironmentConfig(id="minif2f", taskset=TasksetConfig(path=path)))
    with pytest.raises(DatasetError) as e:
        env.tasks()
    msg = str(e.value)
    assert f"{path}, row 3, column 25: byte e9 is not UTF-8" in msg
    assert "iconv" in msg  # and how to fix it


def test_leanrl_verify_reports_a_non_utf8_proofs_file_in_one_line(tmp_path: Path) -> None:
    tasks = _dataset(tmp_path, json.dumps(ROW).replace("t0", "t2").encode())
    proofs = tmp_path / "proofs.jsonl"
    proofs.write_bytes(b'{"name": "t0", "proof": "simp"}\n{"name": "t1", "proof": "\xff"}\n')
    r = subprocess.run(
        [sys.executable, "-m", "leanrl.cli", "verify", str(proofs), "--env", "minif2f",
         "--env.taskset.path", str(tasks)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert f"{proofs}, row 2, column 26: byte ff is not UTF-8" in r.stderr


@pytest.mark.parametrize("k", ["", " , ", []])
def test_an_empty_k_is_refused_with_a_clear_error(k: object) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"k is empty|k is an empty list"):
        EvalConfig(k=k)  # type: ignore[arg-type]


def test_an_empty_k_on_the_command_line_says_what_to_pass(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "leanrl.cli", "eval", "--env", "minif2f", "--k", "",
         "--model", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "k is empty: give the k values to report, like --k 1,8,32" in r.stderr
