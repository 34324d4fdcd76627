"""TRL's GRPOConfig names in a TOML file given to the CLI (``leanrl train grpo --config``).

The CLI resolves the file twice (once when it parses the flags, once when it builds the
GRPOConfig), so a TRL name in the file met the leanrl name the first pass had already written:
every name was refused as given twice. Each name of ``TRL_SAME`` is run through the real CLI
here, up to the config the trainer would get (``launched`` is the first thing to see it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from leanrl.cli import main
from leanrl.train.grpo.trl_names import TRL_SAME

# One valid TOML value per TRL name, and what leanrl's field must hold afterwards.
VALUES: dict[str, tuple[str, Any]] = {
    "learning_rate": ("2e-6", 2e-6),
    "num_generations": ("4", 4),
    "max_completion_length": ("64", 64),
    "temperature": ("0.7", 0.7),
    "top_p": ("0.9", 0.9),
    "epsilon": ("0.1", 0.1),
    "epsilon_high": ("0.3", 0.3),
    "num_iterations": ("2", 2),
    "loss_type": ('"dr_grpo"', "dr_grpo"),
    "max_steps": ("3", 3),
    "output_dir": ('"runs/trl-out"', Path("runs/trl-out")),
    "save_steps": ("5", 5),
    "save_total_limit": ("2", 2),
    "report_to": ('"none"', []),
    "lr_scheduler_type": ('"cosine"', "cosine"),
    "mask_truncated_completions": ("false", False),
    "vllm_importance_sampling_cap": ("4.0", 4.0),
}


def test_every_trl_name_has_a_value_here() -> None:
    assert set(VALUES) == set(TRL_SAME)


def _field(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The GRPOConfig the CLI hands to the launcher (nothing is trained)."""
    seen: list[Any] = []

    def launched(kind: str, config: Any, dry_run: bool) -> bool:
        seen.append(config)
        return True

    monkeypatch.setattr("leanrl.train.grpo.cli.launched", launched)
    return seen


@pytest.mark.parametrize("trl", sorted(VALUES))
def test_a_trl_name_in_a_toml_file_works_through_the_cli(
    trl: str, tmp_path: Path, captured: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    toml_value, expected = VALUES[trl]
    toml = tmp_path / "t.toml"
    toml.write_text(f"{trl} = {toml_value}\n")
    rc = main(["train", "grpo", "--config", str(toml), "--model", "m"])
    assert rc == 0, capsys.readouterr().err
    (cfg,) = captured
    assert _field(cfg, TRL_SAME[trl]) == expected


def test_a_flag_overrides_the_trl_name_in_the_file(
    tmp_path: Path, captured: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    toml = tmp_path / "t.toml"
    toml.write_text("learning_rate = 2e-6\nnum_generations = 4\n")
    rc = main(["train", "grpo", "--config", str(toml), "--model", "m", "--lr", "3e-6"])
    assert rc == 0, capsys.readouterr().err
    (cfg,) = captured
    assert (cfg.lr, cfg.group_size) == (3e-6, 4)  # the flag wins; the file gives the rest


def test_both_spellings_in_one_file_are_still_refused(
    tmp_path: Path, captured: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    toml = tmp_path / "t.toml"
    toml.write_text("learning_rate = 2e-6\nlr = 1e-6\n")
    assert main(["train", "grpo", "--config", str(toml), "--model", "m"]) == 2
    err = capsys.readouterr().err
    assert "both 'learning_rate' (TRL's name) and 'lr' (leanrl's)" in err and "t.toml" in err
    assert captured == []


def test_a_trl_name_of_another_meaning_in_a_file_names_the_file_and_the_field(
    tmp_path: Path, captured: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    toml = tmp_path / "t.toml"
    toml.write_text("per_device_train_batch_size = 8\n")
    assert main(["train", "grpo", "--config", str(toml), "--model", "m"]) == 2
    err = capsys.readouterr().err
    assert "t.toml" in err and "tasks_per_step" in err
