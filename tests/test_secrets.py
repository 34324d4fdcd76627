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


def test_compare_runs_get_docker_env_values_and_their_files_do_not(tmp_path: Path) -> None:
    """The runs' configs were rebuilt from redacting JSON dumps: their containers would have
    been given the literal "<redacted>" as the credential."""
    from leanrl.compare import CompareConfig

    env = EnvironmentConfig(
        id="countdown", runtime=RuntimeConfig(docker=DockerConfig(env={"TOKEN": SECRET}))
    )
    cfg = CompareConfig(env=env, budget={"tokens": 1000}, out=tmp_path / "cmp")
    for method in ("es", "grpo"):
        run_cfg = cfg.run_config(method, 0)
        assert run_cfg.env.runtime.docker.env == {"TOKEN": SECRET}, method
        assert run_cfg.eval.env.runtime.docker.env == {"TOKEN": SECRET}, method  # held-out too
        RunDir(tmp_path / method).bind_config(run_cfg)
        text = (tmp_path / method / "config.json").read_text()
        assert SECRET not in text and '"TOKEN": "<redacted>"' in text, method


def test_a_launched_jobs_payload_keeps_docker_env_values(tmp_path: Path) -> None:
    """The payload of a launched job was ``model_dump(mode="json")``: redacted."""
    from leanrl.launch.launcher import job_call

    cfg = EvalConfig(env=_env(tmp_path / "tasks.jsonl"), out="runs/e", progress=False)
    call = job_call("eval", cfg)
    assert call.config["env"]["runtime"]["docker"]["env"] == {"HF_TOKEN": SECRET, "MODE": "fast"}
    rebuilt = EvalConfig.model_validate(call.config)  # what the Function's container runs
    assert rebuilt.env.runtime.docker.env["HF_TOKEN"] == SECRET
    assert SECRET not in cfg.model_dump_json()  # what files get is still redacted
