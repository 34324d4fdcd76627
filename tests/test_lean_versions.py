"""Lean versions are cross-checked: sandbox images default to the taskset's Lean, a data file
written for another Lean is refused, and the runtime reports the Lean that really ran."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from leanrl import DatasetError, RuntimeConfig, load_environment
from leanrl._sandbox_config import DockerConfig, ModalConfig

REPO = Path(__file__).resolve().parent.parent


def test_no_default_names_a_lean_no_benchmark_uses() -> None:
    used = {
        load_environment(e).taskset.lean_toolchain
        for e in ("minif2f", "minif2f-deepseek", "proofnet", "putnambench", "core")
    }
    m = ModalConfig()
    assert m.lean_toolchain is None and m.mathlib_rev is None and m.repl_rev is None
    assert DockerConfig().image is None
    dockerfile = (REPO / "runtimes" / "docker" / "Dockerfile").read_text()
    pins = {ln.split("=", 1)[1] for ln in dockerfile.splitlines() if ln.startswith("ARG LEAN_")}
    assert pins and pins <= used, f"the Dockerfile defaults to {pins}, no benchmark uses it"
    for doc in ("docs/sandboxes.md", "README.md"):
        assert "v4.15.0" not in (REPO / doc).read_text(), doc


@pytest.mark.parametrize(
    ("env_id", "tag"),
    [("minif2f", "v4.24.0"), ("minif2f-deepseek", "v4.9.0"), ("putnambench", "v4.27.0")],
)
def test_sandbox_images_follow_the_taskset(env_id: str, tag: str) -> None:
    from leanrl.runtimes.modal import ModalRuntime

    env = load_environment(env_id, runtime=RuntimeConfig(name="docker"))
    backend = env.runtime.make_backend()
    assert backend.config.image == f"leanrl-verifier:{tag}"  # type: ignore[attr-defined]
    modal_env = load_environment(
        env_id, runtime=RuntimeConfig(name="modal", modal={"backend": "modal"})
    )
    runtime = modal_env.runtime
    assert isinstance(runtime, ModalRuntime)
    pytest.importorskip("modal")
    cfg = runtime.make_backend().config  # type: ignore[attr-defined]
    assert cfg.lean_toolchain.endswith(tag) and cfg.repl_rev == tag
    assert cfg.mathlib_rev == modal_env.taskset.mathlib_rev


def test_a_file_for_another_lean_is_refused(tmp_path: Path, bench_data: Path) -> None:
    # DeepSeek's miniF2F rows declare Lean v4.9.0; `minif2f` checks with v4.24.0.
    with pytest.raises(DatasetError) as e:
        load_environment("minif2f", path=bench_data / "minif2f_deepseek.jsonl").tasks()
    msg = str(e.value)
    assert "written for Lean 4.9.0" in msg and "checks with Lean 4.24.0" in msg
    assert "--env minif2f-deepseek" in msg
    # the same file in its own environment loads
    assert load_environment("minif2f-deepseek", path=bench_data / "minif2f_deepseek.jsonl").tasks()


def test_a_dataset_takes_the_lean_its_file_declares(tmp_path: Path) -> None:
    f = tmp_path / "d.jsonl"
    row = {"name": "t", "header": "", "formal_statement": "theorem t : 1 = 1 := by",
           "lean_toolchain": "leanprover/lean4:v4.20.0"}  # fmt: skip
    f.write_text(json.dumps(row) + "\n")
    env = load_environment("dataset", path=f)
    env.tasks()
    assert env.taskset.lean_toolchain == "leanprover/lean4:v4.20.0"


async def test_local_runtime_asks_lean_for_its_version(tmp_path: Path) -> None:
    from leanrl.runtimes.local import LocalRuntime

    fake = tmp_path / "lean"
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--version" ]; then\n'
        '  echo "Lean (version 4.24.0, x86_64-unknown-linux-gnu, commit abc, Release)"\n'
        "fi\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    rt = LocalRuntime(RuntimeConfig(mode="oneshot", options={"lean_command": [str(fake)]}))
    assert await rt.lean_version() == "4.24.0"
    # no Lean to ask: the project's lean-toolchain file says what it pins
    project = tmp_path / "proj"
    project.mkdir()
    (project / "lean-toolchain").write_text("leanprover/lean4:v4.9.0\n")
    old = os.environ.pop("PATH")
    try:
        os.environ["PATH"] = str(tmp_path / "empty")
        rt = LocalRuntime(RuntimeConfig(lean_project=project))
        assert await rt.lean_version() == "leanprover/lean4:v4.9.0"
    finally:
        os.environ["PATH"] = old


async def test_the_service_carries_the_lean_version(tmp_path: Path) -> None:
    """Docker and Modal ask the service in the sandbox: its /health names the Lean it runs."""
    from leanrl.service.app import VerificationService

    rt = load_environment(
        "core", runtime=RuntimeConfig(name="tests._scripted_runtime:ScriptedRuntime",
                                      options={"lean_version": "4.24.0"})
    ).runtime  # fmt: skip
    service = VerificationService(rt)
    await service.start()
    try:
        assert service.health().lean_version == "4.24.0"
    finally:
        await service.close()
