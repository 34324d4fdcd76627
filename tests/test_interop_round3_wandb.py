"""W&B runs of the trainers (``log_to = ["wandb"]``), with the real ``wandb`` package, offline.

The run id used to be the run folder's name (``--out runs/sft`` and ``--out other/sft`` were one
W&B run once synced) and W&B wrote its ``wandb/`` folder into the current folder. Now the id is
stored in the run folder, made once and kept on resume, and W&B's files go under the folder.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from leanrl.errors import ConfigError
from leanrl.train.common import MetricsLogger, RunDir
from leanrl.train.wandb_run import WANDB_ID_FILE, wandb_id

needs_wandb = pytest.mark.skipif(
    importlib.util.find_spec("wandb") is None, reason="wandb is not installed (pip install wandb)"
)


def test_the_id_is_made_once_per_folder_and_kept(tmp_path: Path) -> None:
    a, b = tmp_path / "runs" / "sft", tmp_path / "other" / "sft"  # same name, two runs
    first = wandb_id(a)
    assert wandb_id(a) == first  # resumed: the same id
    assert (a / WANDB_ID_FILE).read_text().strip() == first
    assert wandb_id(b) != first
    assert first != "sft"


def test_a_damaged_id_file_is_a_one_line_error(tmp_path: Path) -> None:
    (tmp_path / WANDB_ID_FILE).write_text("not an id!\n")
    with pytest.raises(ConfigError, match="delete the file"):
        wandb_id(tmp_path)


@needs_wandb
@pytest.mark.slow  # W&B starts its own service process
def test_two_folders_of_one_name_are_two_wandb_runs_written_under_each_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    ids = []
    for folder in (
        tmp_path / "runs" / "sft",
        tmp_path / "other" / "sft",
        tmp_path / "runs" / "sft",
    ):
        folder.mkdir(parents=True, exist_ok=True)
        logger = MetricsLogger(RunDir(folder), ["wandb"], None, {"lr": 1e-5})
        logger.start()
        logger.log({"step": 1, "reward_mean": 0.5})
        ids.append(logger._wandb.id)
        assert logger._wandb.name == "sft"  # the display name is still the folder's
        logger.close()
        assert list((folder / "wandb").glob("offline-run-*"))  # W&B's files: under the run
    assert ids[0] != ids[1]  # same basename, different runs
    assert ids[2] == ids[0]  # the resumed run continues its own
    assert not (cwd / "wandb").exists()  # nothing in the current folder
