"""Configuration: TOML + dotted command-line overrides, validation, shipped example files."""

from __future__ import annotations

from pathlib import Path

import pytest

from leanrl import EnvironmentConfig
from leanrl.cli import parse_command
from leanrl.config import ConfigCommand, load_toml, merge
from leanrl.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent


class DemoCommand(ConfigCommand):
    """A command with an environment and one flat option."""

    env: EnvironmentConfig = EnvironmentConfig()
    """The environment."""
    samples: int = 1
    """Samples per task."""


def parse(args: list[str]) -> DemoCommand:
    return parse_command(DemoCommand, args)


TOML = """
samples = 8

[env]
id = "proofnet"

[env.taskset]
limit = 50
split = "valid"

[env.harness]
max_turns = 4
"""


def test_toml_then_flags_override(tmp_path: Path) -> None:
    cfg = tmp_path / "run.toml"
    cfg.write_text(TOML)
    cmd = parse(["--config", str(cfg), "--env.taskset.limit", "20", "--env.harness.max_turns", "8"])
    assert cmd.samples == 8  # from the file
    assert cmd.env.id == "proofnet" and cmd.env.taskset.split == "valid"  # from the file
    assert cmd.env.taskset.limit == 20  # the flag wins over the file
    assert cmd.env.harness.max_turns == 8  # the flag wins over the file
    assert cmd.env.runtime.timeout_s == 60.0  # the default where neither says anything


def test_flags_alone() -> None:
    cmd = parse(
        [
            "--env.taskset.limit",
            "20",
            "--env.runtime.workers",
            "3",
            "--samples",
            "2",
            "--env",
            "putnambench",
        ]
    )
    assert (cmd.env.taskset.limit, cmd.env.runtime.workers, cmd.samples) == (20, 3, 2)
    assert cmd.env.id == "putnambench"  # `--env NAME` is short for `--env.id NAME`


def test_invalid_value_in_file_names_the_field(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[env.taskset]\nlimit = -3\n")
    with pytest.raises(ConfigError, match=r"env\.taskset\.limit: Input should be greater"):
        merge(DemoCommand, cfg, {})


def test_unknown_key_in_file_is_an_error(tmp_path: Path) -> None:
    cfg = tmp_path / "typo.toml"
    cfg.write_text("[env.harness]\nmax_turn = 3\n")
    with pytest.raises(
        ConfigError,
        match=r"env\.harness\.max_turn: no such option \(did you mean env\.harness\.max_turns\?\)",
    ):
        merge(DemoCommand, cfg, {})


def test_bad_toml_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "x.toml"
    bad.write_text("[env\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_toml(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_toml(tmp_path / "missing.toml")


def _command_for(path: Path) -> type:
    """The command model a shipped example config is for, from its file name prefix."""
    import importlib

    from leanrl.cli import _COMMANDS

    stem = path.stem
    best = None
    for cmd, target in _COMMANDS.items():
        prefix = cmd.replace(" ", "-")
        if (stem == prefix or stem.startswith(prefix + "-") or stem.startswith(prefix + "_")) and (
            best is None or len(prefix) > len(best[0])
        ):
            best = (prefix, target)
    assert best is not None, (
        f"{path.name}: name example configs after their command (eval-*.toml, "
        "train-grpo-*.toml, train-es-*.toml, serve-*.toml, ...)"
    )
    module, _, attr = best[1].partition(":")
    return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]


EXAMPLE_CONFIGS = sorted((REPO / "examples").rglob("*.toml"))
EXAMPLE_CONFIGS = [p for p in EXAMPLE_CONFIGS if p.name != "pyproject.toml"]


@pytest.mark.parametrize("path", EXAMPLE_CONFIGS, ids=lambda p: p.name)
def test_shipped_example_config_validates(path: Path) -> None:
    cls = _command_for(path)
    merge(cls, path, {})


def _imports(module: str) -> set[str]:
    """Every ``leanrl`` module a file imports, at the top or inside functions."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    return {m for m in out if m.startswith("leanrl")}


def test_config_and_the_cli_import_one_way() -> None:
    """The CLI imports the config helpers; the reference of every command (which needs the
    CLI's command table) lives in its own module, so nothing imports back."""
    assert "leanrl.config" in _imports("leanrl.cli")
    config = _imports("leanrl.config")
    assert not {m for m in config if m.startswith(("leanrl.cli", "leanrl.config_reference"))}
    assert "leanrl.cli" in _imports("leanrl.config_reference")
    assert "leanrl.config_reference" not in _imports("leanrl.cli")
