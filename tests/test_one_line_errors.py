"""Bad input on the command line is one line naming what is wrong, never a traceback.

A truncated model for ``train es``, a config file that is not UTF-8, an empty taskset file, a
JSON row with an unterminated string, and an output folder that cannot be written, for every
command that writes one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from leanrl.cli import main
from leanrl.errors import ConfigError, DatasetError

REPO = Path(__file__).resolve().parent.parent
RT = "tests._scripted_runtime:ScriptedRuntime"
TOY = REPO / "tests" / "fixtures" / "toy_tasks.jsonl"
DECONTAM = REPO / "tests" / "fixtures" / "decontam"
ES_TOML = REPO / "examples" / "train-es-cpu.toml"


def _one_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run ``leanrl argv``; it must fail with exit code 2 and a single line on stderr."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("leanrl: error: ") and "\n" not in err, err
    return err


# -- 9a: a truncated model.safetensors in `train es` --------------------------------------------


def test_train_es_with_a_truncated_model_is_one_line(
    tiny_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.syspath_prepend(str(REPO / "examples"))  # the example's environment
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    weights = model / "model.safetensors"
    size = weights.stat().st_size
    os.truncate(weights, size // 2)  # a copy cut short
    argv = ["train", "es", "--config", str(ES_TOML), "--model", str(model)]
    err = _one_line(capsys, [*argv, "--out", str(tmp_path / "run"), "--steps", "1"])
    assert f"cannot load model {model}: model.safetensors is truncated" in err
    assert f"({size // 2} of {size} bytes)" in err


def test_a_damaged_es_master_file_names_it(tmp_path: Path) -> None:
    from leanrl.train.es.weights import load_master_file

    path = tmp_path / "checkpoint-3" / "es_master.safetensors"
    path.parent.mkdir()
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{")  # its header cut short
    with pytest.raises(ConfigError) as e:
        load_master_file(path)
    msg = str(e.value)
    assert "\n" not in msg
    assert f"cannot load the fp32 master weights {path}: es_master.safetensors is truncated" in msg
    assert f"Delete the checkpoint folder holding it ({path.parent})" in msg


# -- 9b: a config file that is not UTF-8 ----------------------------------------------------------


def test_a_non_utf8_byte_in_a_toml_config_names_file_line_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    toml = tmp_path / "run.toml"
    toml.write_bytes(b'steps = 2\nrun_name = "caf\xe9"\n')  # Latin-1 "é"
    err = _one_line(capsys, ["train", "es", "--config", str(toml)])
    assert f"config file {toml}, line 2, column 16: byte e9 (byte offset 25) is not UTF-8" in err
    assert "save it as UTF-8" in err and "iconv" in err


# -- 9c: an empty taskset file ------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "\n  \n"])
def test_an_empty_taskset_file_is_named(tmp_path: Path, text: str) -> None:
    from leanrl import EnvironmentConfig, TasksetConfig, load_environment

    path = tmp_path / "tasks.jsonl"
    path.write_text(text)
    env = load_environment(EnvironmentConfig(id="dataset", taskset=TasksetConfig(path=path)))
    with pytest.raises(DatasetError) as e:
        env.tasks()
    assert f"taskset 'dataset': {path} holds no tasks (the file is empty or blank)" in str(e.value)


def test_train_es_on_an_empty_taskset_file_names_it(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text("")
    argv = ["train", "es", "--env", "dataset", "--env.taskset.path", str(path)]
    err = _one_line(capsys, [*argv, "--model", str(tiny_model_dir), "--out", str(tmp_path / "o")])
    assert f"{path} holds no tasks" in err


# -- 11c: JSON errors read "at column N", not "at at column N" ---------------------------------


def test_an_unterminated_string_in_a_row_reads_well(tmp_path: Path) -> None:
    from leanrl.jsonl import read_jsonl, scan_log

    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n{"name": "t1')  # the file ends inside a string
    with pytest.raises(DatasetError) as e:
        list(read_jsonl(path))
    assert str(e.value) == (
        f"{path}, row 2: not valid JSON (Unterminated string starting at column 10)."
    )
    path.write_text('{"x": "\x01"}\n{"a": 1}\n')  # a raw control character in a log row
    scan = scan_log(path, dict)
    assert [b.why for b in scan.bad] == ["not valid JSON (Invalid control character at column 8)"]


# -- 9d: an output folder that cannot be written ------------------------------------------------


def _commands(model: Path, tmp: Path) -> dict[str, list[str]]:
    """Every command that writes an output folder, set up to get as far as writing it."""
    from leanrl.proofs import ProofStore, kept_from
    from leanrl.task import Task

    proofs = tmp / "proofs.jsonl"  # what `train sft` trains on
    task = Task(name="t0", header="", formal_statement="theorem t0 (n : Nat) : n + 0 = 0 + n := by")
    ProofStore(proofs).add([kept_from(task, "\n  omega")])
    return {
        "eval": ["eval", "--env", "dataset", "--env.taskset.path", str(TOY), "--model",
                 str(model), "--runtime", RT, "--samples", "1"],
        "train grpo": ["train", "grpo", "--env", "dataset", "--env.taskset.path", str(TOY),
                       "--env.runtime.name", RT, "--model", str(model), "--steps", "1",
                       "--group_size", "2"],
        "train es": ["train", "es", "--config", str(ES_TOML), "--model", str(model),
                     "--steps", "1"],
        "train sft": ["train", "sft", "--model", str(model), "--data.proofs", f'["{proofs}"]',
                      "--steps", "1"],
        "train expert-iteration": ["train", "expert-iteration", "--model", str(model), "--env",
                                   "dataset", "--env.taskset.path", str(TOY),
                                   "--env.runtime.name", RT, "--rounds", "1", "--samples", "1"],
        "compare": ["compare", "--model", str(model)],
        "decontaminate": ["decontaminate", "--env", "leanrl.environments.corpora:GoedelPset",
                          "--env.taskset.path", str(DECONTAM / "train_goedel.jsonl"),
                          "--against", f"dataset={DECONTAM / 'bench.jsonl'}"],
    }  # fmt: skip


COMMANDS = [
    "eval", "train grpo", "train es", "train sft", "train expert-iteration", "compare",
    "decontaminate",
]  # fmt: skip


@pytest.mark.parametrize("command", COMMANDS)
def test_an_output_folder_under_a_file_is_one_line(
    command: str,
    tiny_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--out`` below a regular file: no user (root included) can create it (ENOTDIR)."""
    monkeypatch.syspath_prepend(str(REPO / "examples"))  # train es's example environment
    monkeypatch.syspath_prepend(str(REPO))  # the scripted runtime: tests._scripted_runtime
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    out = blocker / "sub" / "run"
    argv = _commands(tiny_model_dir, tmp_path)[command]
    err = _one_line(capsys, [*argv, "--out", str(out)])
    assert err.startswith(f"leanrl: error: cannot write to the output folder {out}: ")
    assert "Give a writable folder with --out" in err
    assert blocker.read_text() == "not a folder"


def test_an_unrelated_os_error_is_not_blamed_on_the_output_folder() -> None:
    """Only errors on the output folder (or a folder it needs) are named as such."""
    from types import SimpleNamespace

    from leanrl.cli import _unwritable_out

    cmd = SimpleNamespace(out=Path("/data/runs/a"))
    other = PermissionError(13, "Permission denied", "/etc/leanrl.toml")
    assert _unwritable_out(cmd, other) is None
    mine = PermissionError(13, "Permission denied", "/data/runs/a/config.json")
    assert "output folder /data/runs/a: Permission denied" in str(_unwritable_out(cmd, mine))
    parent = PermissionError(13, "Permission denied", "/data")  # mkdir(parents=True) there
    assert _unwritable_out(cmd, parent) is not None
    a_file = FileExistsError(17, "File exists", "/data/runs/a")  # --out names a file
    assert _unwritable_out(cmd, a_file) is not None
    clash = FileExistsError(17, "File exists", "/data/runs/a/checkpoint-3")  # not the folder's
    assert _unwritable_out(cmd, clash) is None


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (bwrap)")
@pytest.mark.parametrize("command", COMMANDS)
def test_a_read_only_file_system_under_out_is_one_line_for_root_too(
    command: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The whole ``leanrl`` process, with its output folder's parent mounted read-only
    (bubblewrap; unlike a chmod, this holds for root): one line on stderr, no traceback."""
    ro = tmp_path / "ro"
    ro.mkdir()
    argv = _commands(tiny_model_dir, tmp_path)[command]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "examples")])}
    cmd = [shutil.which("bwrap") or "bwrap", "--dev-bind", "/", "/", "--ro-bind", str(ro), str(ro)]
    cmd += [sys.executable, "-m", "leanrl.cli", *argv, "--out", str(ro / "run")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    lines = [x for x in r.stderr.splitlines() if x.startswith("leanrl: error: ")]
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert lines == [
        f"leanrl: error: cannot write to the output folder {ro / 'run'}: Read-only file system "
        f"({ro / 'run'}). Give a writable folder with --out, or make that one writable, and "
        "rerun the same command."
    ]
