"""Third-party environments: entry points, import paths, subclass hooks; and the built wheel."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import ClassVar

import pytest

import leanrl
from leanrl import ConfigError, Environment, Taskset, load_environment
from leanrl.registry import resolve
from leanrl.taskset import RawRow

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_PKG = REPO / "examples" / "leanrl-example-env"


def test_unknown_environment_lists_known_ones() -> None:
    with pytest.raises(ConfigError) as e:
        load_environment("minif2ff")
    assert "minif2f" in str(e.value) and "proofnet" in str(e.value)


def test_unknown_harness_and_runtime_list_known_ones(bench_data: Path) -> None:
    env = load_environment("minif2f", harness="no-such-harness", path=bench_data)
    with pytest.raises(ConfigError, match="unknown harness 'no-such-harness'"):
        _ = env.harness
    env = load_environment("minif2f", runtime="no-such-runtime", path=bench_data)
    with pytest.raises(ConfigError, match="unknown runtime 'no-such-runtime'"):
        _ = env.runtime


class Squares(Taskset):
    """A taskset made in code: the one hook is load_rows."""

    name = "squares"

    def load_rows(self):  # type: ignore[no-untyped-def]
        for i in range(1, 6):
            yield RawRow(
                origin="code",
                index=i,
                data={
                    "name": f"sq_{i}",
                    "header": "",
                    "formal_statement": f"theorem sq_{i} : {i} * {i} = {i * i} := by",
                    "split": "test",
                },
            )


class SquaresEnv(Environment):
    name = "squares"
    taskset_class: ClassVar[type[Taskset]] = Squares


def test_subclass_with_one_hook_and_import_path() -> None:
    env = load_environment(f"{__name__}:SquaresEnv", limit=3)
    assert isinstance(env, SquaresEnv)
    assert [t.id for t in env.tasks()] == ["sq_1", "sq_2", "sq_3"]
    assert resolve("environments", f"{__name__}:SquaresEnv") is SquaresEnv
    with pytest.raises(ConfigError, match="cannot import"):
        resolve("environments", "no_such_module:Thing")


def _pip(*args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check", *args],
        check=True,
        capture_output=True,
        timeout=300,
    )


def _run_outside(code: str, site: Path, tmp: Path) -> str:
    """Run python from an unrelated folder with only ``site`` added (and the venv's deps)."""
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.slow
def test_third_party_package_installs_and_registers(tmp_path: Path) -> None:
    site = tmp_path / "site"
    _pip("install", "--no-deps", "--no-build-isolation", "--target", str(site), str(EXAMPLE_PKG))
    out = _run_outside(
        "import leanrl, leanrl.registry as r\n"
        "env = leanrl.load_environment('example-arith', limit=2)\n"
        "print(type(env).__name__, [t.id for t in env.tasks()])\n"
        "print([d for d in r.describe('environments') if d[0] == 'example-arith'])\n",
        site,
        tmp_path,
    )
    assert "ArithEnvironment ['arith_0', 'arith_1']" in out
    assert "leanrl-example-env" in out  # shown with the package it came from
    # ... and `leanrl envs` lists it.
    env = {**os.environ, "PYTHONPATH": str(site)}
    cli = subprocess.run(
        [sys.executable, "-m", "leanrl.cli", "envs"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert "example-arith" in cli.stdout and "[leanrl-example-env]" in cli.stdout


@pytest.mark.slow
def test_built_wheel_works_outside_the_source_tree(tmp_path: Path, bench_data: Path) -> None:
    dist = tmp_path / "dist"
    _pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(REPO))
    wheel = next(dist.glob("leanrl-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for must in (
        "leanrl/__init__.py",
        "leanrl/environments/minif2f/__init__.py",
        "leanrl/harnesses/__init__.py",
        "leanrl/runtimes/__init__.py",
    ):
        assert must in names, f"{must} missing from the wheel"
    assert not any(
        n.startswith(("environments/", "harnesses/", "runtimes/", "tests/")) for n in names
    ), "built-ins must ship inside leanrl/, not as top-level packages"
    site = tmp_path / "site"
    _pip("install", "--no-deps", "--target", str(site), str(wheel))
    out = _run_outside(
        "import leanrl, leanrl.environments.minif2f as m\n"
        "print(leanrl.__file__)\nprint(m.__file__)\n"
        f"env = leanrl.load_environment('minif2f', limit=2, path={str(bench_data)!r})\n"
        "print(env.taskset.lean_toolchain)\n",
        site,
        tmp_path,
    )
    lines = out.splitlines()
    assert lines[0].startswith(str(site)) and lines[1].startswith(str(site))
    assert lines[2] == "leanprover/lean4:v4.24.0"


def test_source_tree_maps_the_builtin_folders() -> None:
    import leanrl.environments.core as core

    assert Path(core.__file__).resolve().parent == REPO / "environments" / "core"
    assert leanrl.Environment is Environment


def test_every_package_folder_is_listed_in_pyproject() -> None:
    """pyproject lists the packages (the built-in folders are mapped under leanrl); a new folder
    with an __init__.py that is not listed would be missing from the wheel."""
    import sys

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib

    listed = set(
        tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = set()
    for top, prefix in (
        ("leanrl", "leanrl"),
        ("environments", "leanrl.environments"),
        ("harnesses", "leanrl.harnesses"),
        ("runtimes", "leanrl.runtimes"),
        ("leanrl_verifiers", "leanrl_verifiers"),  # verifiers' plugin id, top-level by design
    ):
        for init in (REPO / top).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / top).parts
            found.add(".".join((prefix, *rel)))
    # Data folders (no __init__.py) are listed too, so that setuptools does not warn about them.
    data = {p for p in listed if p.endswith(".data")}
    listed -= data
    for p in data:
        top = "environments" if p.startswith("leanrl.environments.") else "leanrl"
        folder = REPO / top / Path(*p.split(".")[2 if top == "environments" else 1 :])
        assert folder.is_dir() and not (folder / "__init__.py").exists(), p
    assert found == listed, f"not listed: {sorted(found - listed)}; stale: {sorted(listed - found)}"
