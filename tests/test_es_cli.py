"""`leanrl train es`: the command runs a CPU example end to end; bad config fails early."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from leanrl.cli import main
from leanrl.config import merge
from leanrl.train.es.cli import ESCommand

REPO = Path(__file__).resolve().parent.parent
CPU_TOML = REPO / "examples" / "train-es-cpu.toml"


def test_cli_trains_the_cpu_example(
    tiny_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.syspath_prepend(str(REPO / "examples"))  # the example defines its environment
    out = tmp_path / "run"
    args = ["train", "es", "--config", str(CPU_TOML), "--model", str(tiny_model_dir)]
    args += ["--out", str(out), "--steps", "2", "--population", "4", "--save_every", "1"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "latest checkpoint" in text and "checkpoint-2" in text
    rows = [r for r in (out / "metrics.jsonl").read_text().splitlines() if r]
    assert len(rows) == 2
    assert (out / "checkpoint-2" / "config.json").is_file()
    # flags override the file; the file's other values are kept
    cfg = merge(ESCommand, CPU_TOML, {"model": str(tiny_model_dir), "steps": 2}).to_es_config()
    assert (cfg.steps, cfg.population, cfg.mirrored, cfg.policy.model) == (
        2,
        16,
        True,
        str(tiny_model_dir),
    )
    # the same command again resumes: nothing left to do, the run stays at 2 iterations
    assert main(args) == 0
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2


def test_bad_config_fails_before_loading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "never"
    assert main(["train", "es", "--model", str(tmp_path / "missing"), "--out", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not out.exists()
    assert main(["train", "es", "--out", str(out)]) == 2
    assert "no model given" in capsys.readouterr().err
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    rc = main(["train", "es", "--model", str(model), "--population", "7", "--mirrored"])
    assert rc == 2
    assert "even population" in capsys.readouterr().err


def test_command_module_imports_no_torch() -> None:
    import subprocess

    code = "import sys, leanrl.train.es.cli; print('torch' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "False"
