"""Secret values (``env.runtime.docker.env``) never reach files or command lines."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from leanrl import EnvironmentConfig, RuntimeConfig, TasksetConfig
from leanrl._sandbox_config import DockerConfig
from leanrl.eval import EvalConfig, run_eval
from leanrl.train.common import RunDir, TrainConfig
from tests._scripted_runtime import ScriptedPolicy

SECRET = "hf_VERY_s3cret_value"


def _env(tasks: Path) -> EnvironmentConfig:
    return EnvironmentConfig(
        id="minif2f",
        taskset=TasksetConfig(path=tasks),
        runtime=RuntimeConfig(
            name="tests._scripted_runtime:ScriptedRuntime",
            docker=DockerConfig(env={"HF_TOKEN": SECRET, "MODE": "fast"}),
        ),
    )


async def test_eval_files_never_hold_docker_env_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    row = {"name": "t0", "header": "", "formal_statement": "theorem t0 : True := by"}
    tasks.write_text(json.dumps(row) + "\n")
    # as if given on the command line: the recorded command is redacted too
    monkeypatch.setattr(
        sys, "argv", ["leanrl", "eval", "--env.runtime.docker.env", f'{{"HF_TOKEN": "{SECRET}"}}']
    )
    cfg = EvalConfig(env=_env(tasks), out=tmp_path / "run", progress=False)
    await run_eval(cfg, policy=ScriptedPolicy(["\n  omega\n"]))
    for name in ("run.json", "summary.json", "report.md", "results.jsonl"):
        assert SECRET not in (tmp_path / "run" / name).read_text(), name
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["config"]["env"]["runtime"]["docker"]["env"] == {
        "HF_TOKEN": "<redacted>",
        "MODE": "<redacted>",
    }
    assert "<redacted>" in run["command"]
    # the config in memory keeps the values: the docker runtime needs them
    assert cfg.env.runtime.docker.env["HF_TOKEN"] == SECRET
    # and the same run resumes (the redacted fingerprint is stable)
    again = await run_eval(cfg, policy=ScriptedPolicy(["\n  omega\n"]))
    assert again["timing"]["attempts_this_run"] == 0


def test_trainer_config_json_never_holds_docker_env_values(tmp_path: Path) -> None:
    cfg = TrainConfig(env=_env(tmp_path / "x.jsonl"))
    run = RunDir(tmp_path / "run")
    assert run.bind_config(cfg) is False
    assert SECRET not in (tmp_path / "run" / "config.json").read_text()
    assert run.bind_config(cfg) is True  # resumable with the same settings
