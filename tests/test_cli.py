"""The `leanrl` console script: envs, help that teaches, errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from leanrl.cli import main, normalize_argv


def leanrl_cmd(*args: str, cwd: str = "/") -> subprocess.CompletedProcess[str]:
    exe = shutil.which("leanrl", path=str(Path(sys.executable).parent)) or shutil.which("leanrl")
    assert exe, "the `leanrl` console script is not installed (pip install -e .)"
    return subprocess.run(
        [exe, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "100"},
        timeout=120,
    )


def test_envs_lists_builtins_with_descriptions() -> None:
    out = leanrl_cmd("envs")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for section in ("environments:", "harnesses:", "runtimes:"):
        assert section in text
    for env in ("minif2f", "minif2f-deepseek", "proofnet", "putnambench", "core", "dataset"):
        line = next(ln for ln in text.splitlines() if ln.strip().startswith(env + " "))
        assert len(line.split(None, 1)[1]) > 10, f"{env} has no description"


def test_envs_json() -> None:
    out = leanrl_cmd("envs", "--json")
    data = json.loads(out.stdout)
    ids = {e["id"] for e in data["environments"]}
    assert {"minif2f", "proofnet", "putnambench", "core", "dataset"} <= ids
    assert all(e["description"] for e in data["environments"])


def test_root_help_teaches() -> None:
    out = leanrl_cmd("--help")
    assert out.returncode == 0
    assert "envs" in out.stdout and "--config" in out.stdout and "--env.taskset.limit" in out.stdout
    bare = leanrl_cmd()
    assert bare.returncode == 0 and "usage: leanrl" in bare.stdout


def test_unknown_command_is_an_error() -> None:
    out = leanrl_cmd("frobnicate")
    assert out.returncode != 0
    assert "invalid choice" in out.stderr and "envs" in out.stderr


def test_env_shorthand() -> None:
    assert normalize_argv(["eval", "--env", "minif2f", "--k", "1"]) == [
        "eval",
        "--env.id",
        "minif2f",
        "-k",  # argparse spells one-letter flags with one dash; --k is accepted as well
        "1",
    ]
    assert normalize_argv(["--env=core"]) == ["--env.id", "core"]
    assert normalize_argv(["--env", '{"id": "core"}']) == ["--env", '{"id": "core"}']


def test_main_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["envs"]) == 0
    assert "minif2f" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "want"),
    [
        ([], "auto"),
        (["--stream"], True),
        (["--stream", "--limit", "2"], True),
        (["--stream", "false"], False),
        (["--no-stream"], False),
        (["--stream", "auto"], "auto"),
        (["--stream=true"], True),
    ],
)
def test_a_bool_or_auto_field_switches_like_a_bool(argv: list[str], want: object) -> None:
    from leanrl.cli import parse_command
    from leanrl.eval.cli import EvalCommand

    cmd = parse_command(EvalCommand, ["--env", "minif2f", *argv])
    assert cmd.to_eval_config().stream == want
    if "--limit" in argv:
        assert cmd.limit == 2  # the flag after a bare switch is still read as a flag


def test_bare_switches_leaves_plain_flags_alone() -> None:
    from leanrl.cli import bare_switches
    from leanrl.eval.cli import EvalCommand

    argv = ["--print-json", "--limit", "3", "--stream"]
    assert bare_switches(EvalCommand, argv) == ["--print-json", "--limit", "3", "--stream", "true"]


@pytest.mark.parametrize(
    ("argv", "want"),
    [
        ([], "auto"),
        (["--async-generation"], True),
        (["--async-generation", "--steps", "3"], True),
        (["--no-async-generation"], False),
        (["--async-generation", "false"], False),
        (["--async-generation", "auto"], "auto"),
    ],
)
def test_grpo_async_generation_switches_like_a_bool(argv: list[str], want: object) -> None:
    from leanrl.cli import parse_command
    from leanrl.train.grpo.cli import GRPOCommand

    cmd = parse_command(GRPOCommand, ["--env", "minif2f", "--model", "m", *argv])
    assert cmd.to_grpo_config().async_generation == want
    if "--steps" in argv:
        assert cmd.steps == 3  # the flag after the bare switch is read as a flag
