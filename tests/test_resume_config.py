"""A run folder written before a config field existed still resumes, as long as the new field
holds its default (every new option defaults to the old behaviour); setting it is a change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from leanrl.errors import ConfigError
from leanrl.train.common import RunDir
from leanrl.train.grpo.config import GRPOConfig


def test_added_default_field_resumes(tmp_path: Path) -> None:
    """Fields missing from an old config.json (top level and nested) count as their defaults."""
    cfg = GRPOConfig(out=str(tmp_path / "r"))
    run = RunDir(tmp_path / "r")
    assert run.bind_config(cfg) is False
    stored = json.loads((tmp_path / "r/config.json").read_text())
    stored.pop("curriculum", None)
    stored["sampling"].pop("top_p")
    (tmp_path / "r/config.json").write_text(json.dumps(stored))
    assert run.bind_config(cfg) is True


def test_added_field_set_is_refused(tmp_path: Path) -> None:
    """A field missing from the old config but set now is a change, named with its dotted path."""
    cfg = GRPOConfig(out=str(tmp_path / "r"))
    run = RunDir(tmp_path / "r")
    run.bind_config(cfg)
    stored = json.loads((tmp_path / "r/config.json").read_text())
    stored["sampling"].pop("top_p")
    stored["lr"] = 5.0
    (tmp_path / "r/config.json").write_text(json.dumps(stored))
    cfg2 = GRPOConfig(out=str(tmp_path / "r"), sampling={"top_p": 0.5})
    with pytest.raises(ConfigError, match=r"\['lr', 'sampling.top_p'\]"):
        run.bind_config(cfg2)


def test_grpo_memory_options_may_change_on_resume(tmp_path: Path) -> None:
    """How the loss is computed (tiles, sorted micro-batches) may change when a run resumes,
    e.g. after running out of memory; what it computes may not."""
    from leanrl.train.grpo.trainer import GRPOTrainer

    run = RunDir(tmp_path / "r")
    run.bind_config(GRPOConfig(out=str(tmp_path / "r")))
    tiled = GRPOConfig(out=str(tmp_path / "r"), logprob_chunk=256, sort_micro_batches=True)
    assert run.bind_config(tiled, ignore=GRPOTrainer.RESUMABLE) is True
    with pytest.raises(ConfigError, match="different config"):
        run.bind_config(GRPOConfig(out=str(tmp_path / "r"), lr=1e-3), ignore=GRPOTrainer.RESUMABLE)
