"""Optional parts live behind extras; without one, what needs it says so in one line with the
install command, and the core works without any of them."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from leanrl import ConfigError, PolicyError, load_environment

REPO = Path(__file__).resolve().parent.parent
OPTIONAL = (
    "datasets",
    "pyarrow",
    "pandas",
    "fastapi",
    "uvicorn",
    "starlette",
    "modal",
    "matplotlib",
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _missing(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """Make ``import module`` fail as it does when the package is not installed."""
    for m in modules:
        for name in [n for n in sys.modules if n == m or n.startswith(m + ".")]:
            monkeypatch.delitem(sys.modules, name)
        monkeypatch.setitem(sys.modules, m, None)


def _one_line_fix(message: str, extra: str) -> None:
    assert "\n" not in message
    assert f"[{extra}]" in message and "pip install" in message, message


def test_core_dependencies_are_small_and_every_extra_is_in_all() -> None:
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core = " ".join(meta["dependencies"])
    for heavy in ("datasets", "fastapi", "uvicorn", "modal", "matplotlib", "vllm"):
        assert heavy not in core, f"{heavy} is a core dependency"
    extras = meta["optional-dependencies"]
    for name in ("hub", "serve", "modal", "plot", "train", "vllm", "all"):
        assert name in extras
    everything = set(extras["all"])
    for name, reqs in extras.items():
        if name not in ("all", "vllm", "dev"):
            assert set(reqs) <= everything, f"`all` lacks {set(reqs) - everything} of [{name}]"


def test_the_core_runs_without_any_optional_package(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        f"for m in {OPTIONAL!r}: sys.modules[m] = None\n"
        "import leanrl\n"
        "from leanrl.cli import main\n"
        "assert main(['envs']) == 0\n"
        "assert main(['eval', '--help']) == 0\n"
        "print(len(leanrl.load_environment('core').tasks()))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "67"


def test_hub_loading_without_datasets(monkeypatch: pytest.MonkeyPatch) -> None:
    _missing(monkeypatch, "datasets")
    with pytest.raises(ConfigError) as e:
        load_environment("minif2f").tasks()
    _one_line_fix(str(e.value), "hub")
    assert "Hugging Face hub" in str(e.value)


def test_serve_without_fastapi(monkeypatch: pytest.MonkeyPatch) -> None:
    from leanrl.service.cli import ServeCommand

    _missing(monkeypatch, "fastapi")
    with pytest.raises(ConfigError) as e:
        ServeCommand().cli_cmd()
    _one_line_fix(str(e.value), "serve")


def test_modal_runtime_without_modal(monkeypatch: pytest.MonkeyPatch) -> None:
    from leanrl.runtimes.modal import ModalRuntime

    _missing(monkeypatch, "modal")
    with pytest.raises(ConfigError) as e:
        ModalRuntime().make_backend()
    _one_line_fix(str(e.value), "modal")


def test_vllm_backend_without_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    from leanrl.policies.vllm import import_vllm

    _missing(monkeypatch, "vllm")
    with pytest.raises(PolicyError) as e:
        import_vllm()
    assert "[vllm]" in str(e.value) and "pip install -e" in str(e.value)


def test_report_and_reward_curve_without_matplotlib(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from leanrl.eval.report import write_report
    from leanrl.train.common import RunDir

    _missing(monkeypatch, "matplotlib")
    summary = {
        "config": {
            "env": {"id": "core", "harness": {"name": "whole-proof", "prompt_format": "deepseek"},
                    "runtime": {"name": "local"}},
            "policy": {"model": "m", "backend": "hf"},
            "sampling": {"temperature": 1.0, "top_p": 1.0, "max_tokens": 8, "seed": 0},
            "samples": 1,
        },
        "versions": {},
        "ks": [1],
        "results": {
            "tasks": 1, "tasks_complete": 1, "attempts": 1, "accepted": 0, "solved": 0,
            "reasons": {"error": 1}, "pass_at_k": {"all": {"tasks": 1, "pass@1": 0.0}},
            "pass_at_k_curve": {"all": {"tasks": 1, "pass@1": 0.0}},
        },
    }  # fmt: skip
    write_report(tmp_path, summary)
    report = (tmp_path / "report.md").read_text()
    assert not (tmp_path / "pass_at_k.png").exists()
    assert "[plot]" in report and "pip install" in report
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    (run.path / "metrics.jsonl").write_text('{"step": 1, "reward_mean": 0.5}\n')
    with caplog.at_level(logging.WARNING, logger="leanrl.train"):
        assert run.plot() is None
    assert "[train]" in caplog.text


def test_a_trainer_with_in_run_eval_finishes_without_matplotlib(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    toy_model_dir: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every trainer draws eval_curve.png in its `finally`; without the extra that is a warning
    with the fix, never an ImportError that ends (or hides the error of) the run."""
    from leanrl import load_environment
    from leanrl.environment import EnvironmentConfig
    from leanrl.policy import PolicyConfig, SamplingConfig
    from leanrl.train.inrun_eval_config import InRunEvalConfig
    from leanrl.train.sft import SFTConfig, SFTTrainer
    from leanrl.train.sft.data import Pair

    toy = Path(__file__).parent / "fixtures" / "toy_tasks.jsonl"
    _missing(monkeypatch, "matplotlib")
    held_out = EnvironmentConfig(
        id="dataset",
        taskset={"path": toy, "split": "test"},
        runtime={"name": "tests._scripted_runtime:ScriptedRuntime", "options": {"accept": "omega"}},
    )
    cfg = SFTConfig(
        policy=PolicyConfig(model=str(toy_model_dir)),
        out=tmp_path / "run",
        epochs=None,
        steps=2,
        batch_size=2,
        micro_batch_size=2,
        save_every=2,
        eval=InRunEvalConfig(
            every=2, env=held_out, sampling=SamplingConfig(temperature=0.0, max_tokens=4)
        ),
    )
    tasks = load_environment("dataset", path=toy, split="train").tasks()
    with caplog.at_level(logging.WARNING, logger="leanrl.train"):
        SFTTrainer(cfg, pairs=[Pair(t, "\n  omega") for t in tasks]).train_sync()
    run = tmp_path / "run"
    assert '"eval/pass@1"' in (run / "metrics.jsonl").read_text()  # the evaluation did run
    assert not (run / "eval_curve.png").exists()
    warned = [r.getMessage() for r in caplog.records if "eval_curve.png" in r.getMessage()]
    assert len(warned) == 1
    _one_line_fix(warned[0], "train")
