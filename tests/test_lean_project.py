"""Project discovery, `leanrl setup` and `leanrl doctor`, for real, on a machine without Lean:
they must fail fast with the command that fixes the problem."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from leanrl.errors import LeanNotFoundError
from leanrl.lean.project import (
    doctor,
    find_project,
    find_repl,
    lakefile,
    online,
    project_dir,
    repl_command,
    repl_tag,
    resolve_lake_env,
    setup_project,
)

TOOLCHAIN = "leanprover/lean4:v4.24.0"
REV = "f897ebcf72cd16f89ab4577d0c826cd14afaafc7"


@pytest.fixture
def bare(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An empty PATH, no LEANRL_LEAN_PROJECT, a private cache folder."""
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("LEANRL_LEAN_PROJECT", raising=False)
    monkeypatch.setenv("LEANRL_CACHE", str(tmp_path / "cache"))
    return empty


def _cli(
    args: list[str], tmp_path: Path, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": str(tmp_path / "bin"),
        "HOME": str(tmp_path),
        "LEANRL_CACHE": str(tmp_path / "cache"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "LEANRL_ALLOW_UNSANDBOXED": "1",  # these tests are about Lean tools; bwrap has its own
    }
    env.update(extra_env or {})
    (tmp_path / "bin").mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "leanrl.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_setup_without_elan_fails_fast_with_the_fix(tmp_path: Path) -> None:
    # Offline, a missing elan cannot be installed: stop at once with the manual fix.
    r = _cli(["setup", "--env", "minif2f"], tmp_path)
    assert r.returncode == 2
    assert "elan (the Lean toolchain manager) is missing" in r.stderr
    assert "elan-init.sh" in r.stderr and "LEANRL_LEAN_PROJECT" in r.stderr
    assert not (tmp_path / "cache" / "projects").exists()
    # ... and without the installer, the message is the plain "not on PATH" one.
    r = _cli(["setup", "--env", "minif2f", "--no-install_elan"], tmp_path)
    assert r.returncode == 2 and "`elan` is not on PATH" in r.stderr


def test_setup_without_bubblewrap_stops_before_anything_with_the_install_command(
    tmp_path: Path,
) -> None:
    # No bwrap on PATH: the local runtime would refuse to run Lean after the long Mathlib set-up,
    # so setup says so first, with how to install it and what the opt-out gives up.
    r = _cli(["setup", "--env", "minif2f"], tmp_path, {"LEANRL_ALLOW_UNSANDBOXED": "0"})
    assert r.returncode == 2, r.stderr
    assert "sandboxes every Lean process with bubblewrap" in r.stderr
    assert "bubblewrap" in r.stderr.split("then rerun")[0]
    assert "LEANRL_ALLOW_UNSANDBOXED=1" in r.stderr and "trusted source" in r.stderr
    assert "elan" not in r.stderr  # it stopped before looking for the Lean tools
    assert not (tmp_path / "cache" / "projects").exists()
    # With the opt-out it warns and goes on to the Lean tools.
    r = _cli(["setup", "--env", "minif2f"], tmp_path)
    assert r.returncode == 2 and "warning: bubblewrap" in r.stderr
    assert "elan (the Lean toolchain manager) is missing" in r.stderr


def test_setup_bubblewrap_advice_per_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    from leanrl.lean import commands
    from leanrl.lean.trust import containment

    monkeypatch.delenv("LEANRL_ALLOW_UNSANDBOXED", raising=False)
    monkeypatch.setattr(
        containment, "isolation_problem", lambda: "bubblewrap (`bwrap`) is not installed (x)"
    )
    monkeypatch.setattr(commands.sys, "platform", "darwin")
    with pytest.raises(LeanNotFoundError, match="does not exist on macOS") as e:
        commands.sandbox_preflight()
    assert "docker runtime" in str(e.value)
    monkeypatch.setattr(commands.sys, "platform", "linux")
    monkeypatch.setattr(containment, "isolation_problem", lambda: "bubblewrap does not run here: x")
    with pytest.raises(LeanNotFoundError, match="unprivileged user namespaces"):
        commands.sandbox_preflight()
    monkeypatch.setattr(containment, "isolation_problem", lambda: None)
    commands.sandbox_preflight()  # bubblewrap works: nothing to say


def _stub(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_setup_installs_elan_then_builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing elan is installed by running the downloaded installer; its folder is then used
    for every later step. The installer and the tools are stand-ins (no Lean runs here): they
    record their arguments, and `lake build repl` leaves an executable where the REPL goes."""
    elan_home = tmp_path / "elan-home"
    monkeypatch.setenv("ELAN_HOME", str(elan_home))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # the shell's tools, but no elan
    monkeypatch.setenv("LEANRL_CACHE", str(tmp_path / "cache"))
    assert shutil.which("elan") is None
    calls = tmp_path / "calls.log"
    installer = f"""#!/bin/sh
echo "installer $*" >> {calls}
mkdir -p {elan_home}/bin
cat > {elan_home}/bin/elan <<'X'
#!/bin/sh
echo "elan $*" >> {calls}
X
cat > {elan_home}/bin/lake <<'X'
#!/bin/sh
echo "lake $*" >> {calls}
if [ "$1" = build ]; then
  mkdir -p .lake/packages/REPL/.lake/build/bin
  printf '#!/bin/sh\n' > .lake/packages/REPL/.lake/build/bin/repl
  chmod +x .lake/packages/REPL/.lake/build/bin/repl
fi
X
chmod +x {elan_home}/bin/elan {elan_home}/bin/lake
"""
    fetched: list[str] = []

    def fetch(url: str) -> bytes:
        fetched.append(url)
        return installer.encode()

    dest = tmp_path / "proj"
    out = setup_project(
        TOOLCHAIN,
        REV,
        dest=dest,
        is_online=lambda: True,
        install=True,
        fetch=fetch,
        log=lambda s: None,
    )
    assert out == dest and find_repl(dest) is not None
    assert fetched == ["https://raw.githubusercontent.com/leanprover/elan/master/elan-init.sh"]
    log = calls.read_text().splitlines()
    assert log == [
        "installer -y --default-toolchain none",
        f"elan toolchain install {TOOLCHAIN}",
        "lake update",
        "lake exe cache get",
        "lake build repl",
    ]
    assert str(elan_home / "bin") in os.environ["PATH"].split(os.pathsep)
    assert (dest / "lean-toolchain").read_text().strip() == TOOLCHAIN
    assert f'@ "{REV}"' in (dest / "lakefile.lean").read_text()


def test_failed_elan_download_says_how_to_install_by_hand(
    bare: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ELAN_HOME", str(tmp_path / "elan-home"))

    def fetch(url: str) -> bytes:
        raise OSError("connection reset")

    with pytest.raises(LeanNotFoundError, match=r"could not download elan's installer.*elan-init"):
        setup_project(
            TOOLCHAIN,
            REV,
            dest=tmp_path / "p",
            is_online=lambda: True,
            install=True,
            fetch=fetch,
            log=lambda s: None,
        )


def test_doctor_reports_everything_missing_with_fixes(tmp_path: Path) -> None:
    r = _cli(["doctor", "--env", "minif2f", "--print_json"], tmp_path)
    assert r.returncode == 1
    checks = {c["name"]: c for c in json.loads(r.stdout)}
    assert set(checks) >= {"elan", "lake", "lean", "Lean project"}
    assert not any(c["ok"] for c in checks.values())
    assert "elan-init.sh" in checks["elan"]["fix"]
    assert "leanrl setup --env minif2f" in checks["Lean project"]["fix"]


def test_setup_offline_fails_fast(bare: Path, tmp_path: Path) -> None:
    # Stand-in `elan`/`lake` executables so the tool check passes; setup must stop at the network
    # check without running them (they would fail loudly if run).
    for tool in ("elan", "lake"):
        exe = bare / tool
        exe.write_text("#!/bin/sh\necho should-not-run >&2\nexit 99\n")
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(LeanNotFoundError, match="needs the internet") as e:
        setup_project(TOOLCHAIN, REV, is_online=lambda: False, log=lambda s: None)
    assert not project_dir(TOOLCHAIN, REV).exists()
    # what the README promises it says offline: the Lean project, and the local model folder
    assert "LEANRL_LEAN_PROJECT" in str(e.value) and "--model ./my-model" in str(e.value)


def test_online_probe_is_false_for_a_closed_port() -> None:
    assert online("127.0.0.1", 9, timeout=1.0) is False


def test_find_project_order(bare: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert find_project(None) is None
    a, b, c = (tmp_path / n for n in "abc")
    for p in (a, b, c):
        p.mkdir()
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "default-project").write_text(str(c))
    assert find_project(None) == c
    monkeypatch.setenv("LEANRL_LEAN_PROJECT", str(b))
    assert find_project(None) == b
    assert find_project(a) == a
    with pytest.raises(LeanNotFoundError, match="does not exist"):
        find_project(tmp_path / "missing")
    monkeypatch.setenv("LEANRL_LEAN_PROJECT", str(tmp_path / "nope"))
    with pytest.raises(LeanNotFoundError, match="LEANRL_LEAN_PROJECT"):
        find_project(None)


def test_repl_discovery_in_a_project(bare: Path, tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    binp = proj / ".lake" / "packages" / "REPL" / ".lake" / "build" / "bin"
    binp.mkdir(parents=True)
    with pytest.raises(LeanNotFoundError, match="no Lean REPL found"):
        repl_command(proj)
    exe = binp / "repl"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert find_repl(proj) == exe
    assert repl_command(proj) == ([str(exe)], proj)  # no lakefile: run it directly
    (proj / "lakefile.lean").write_text("")
    with pytest.raises(LeanNotFoundError, match="`lake` is not on PATH"):
        repl_command(proj)


def test_doctor_on_a_project_folder(bare: Path, tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "lean-toolchain").write_text("leanprover/lean4:v4.9.0\n")
    (proj / "lake-manifest.json").write_text(
        json.dumps({"packages": [{"name": "mathlib", "rev": REV}]})
    )
    checks = {c.name: c for c in doctor(proj, TOOLCHAIN, REV, "minif2f")}
    assert checks["Lean project"].ok
    assert not checks["toolchain"].ok and TOOLCHAIN in checks["toolchain"].fix
    assert not checks["Mathlib"].ok and "not built" in checks["Mathlib"].found
    assert not checks["REPL"].ok and "oneshot" in checks["REPL"].fix


def test_versions_and_lakefile() -> None:
    assert repl_tag(TOOLCHAIN) == "v4.24.0"
    assert repl_tag("leanprover/lean4:v4.33.0-rc2") == "v4.33.0-rc2"
    # No REPL tag for this one (lean-workbook's Lean): the REPL's last commit on it.
    assert repl_tag("leanprover/lean4:v4.8.0-rc1") == "88a0643592d35d20a279e416e839a1f4184444a1"
    with pytest.raises(LeanNotFoundError):
        repl_tag("nightly")
    text = lakefile(REV, "https://github.com/leanprover-community/mathlib4", TOOLCHAIN)
    assert f'@ "{REV}"' in text and '@ "v4.24.0"' in text and "require REPL" in text
    assert "mathlib" not in lakefile(None, "x", TOOLCHAIN)
    assert project_dir(TOOLCHAIN, REV) != project_dir("leanprover/lean4:v4.9.0", REV)
    assert os.fspath(project_dir(TOOLCHAIN, None)).count("core") == 1


def test_doctor_smoke_runs_the_checker_through_a_repl(bare: Path, tmp_path: Path) -> None:
    # A project whose `repl` is the stand-in REPL (tests/fake_repl.py, not Lean): doctor's smoke
    # test drives the real pool and policy end to end (a valid proof, a helper and a target
    # forged without the kernel, an axiom cheat).
    proj = tmp_path / "proj"
    binp = proj / ".lake" / "packages" / "REPL" / ".lake" / "build" / "bin"
    binp.mkdir(parents=True)
    exe = binp / "repl"
    fake = Path(__file__).with_name("fake_repl.py")
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{fake}" "$@"\n')
    exe.chmod(0o755)
    checks = {c.name: c for c in doctor(proj, None, None, "core", smoke=True)}
    assert checks["REPL"].ok
    assert checks["checker"].ok, checks["checker"].found
    assert checks["checker"].found == (
        "valid proof: ok; forged helper: forbidden; forged target: forbidden; axiom cheat: axiom"
    )


def test_resolve_lake_env_passes_other_commands_through(bare: Path) -> None:
    assert resolve_lake_env(["/opt/repl"], None) == (["/opt/repl"], None)


def test_no_lean_at_all_says_install_lean_not_use_oneshot(bare: Path) -> None:
    # A machine without Lean: one-shot mode would fail next, so it is not offered; the fix is
    # to install elan and run setup, named with a real command (no `<id>` placeholder).
    with pytest.raises(LeanNotFoundError) as e:
        repl_command(None)
    msg = str(e.value)
    assert "Lean is not installed here" in msg and "elan" in msg
    assert "leanrl setup --env minif2f" in msg and "oneshot" not in msg and "<id>" not in msg
    fake = bare / "lean"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    with pytest.raises(LeanNotFoundError, match=r"no Lean REPL found.*mode oneshot"):
        repl_command(None)


def _builtin_toolchains() -> dict[str, list[str]]:
    """Lean toolchain -> the built-in tasksets that pin it (every module of the built-in
    environments is imported, so a new taskset cannot slip past)."""
    import importlib
    import pkgutil

    import leanrl.environments as envs
    from leanrl.taskset import Taskset

    for m in pkgutil.walk_packages(envs.__path__, envs.__name__ + "."):
        importlib.import_module(m.name)
    out: dict[str, list[str]] = {}
    todo = list(Taskset.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        tc = cls.__dict__.get("lean_toolchain")
        if cls.__module__.startswith(envs.__name__) and tc:
            out.setdefault(tc, []).append(cls.__name__)
    return out


def test_every_builtin_toolchain_resolves_to_a_recorded_repl_revision() -> None:
    from leanrl.lean.project import REPL_REVISIONS, REPL_UNTAGGED

    pinned = _builtin_toolchains()
    assert len(pinned) >= 5, pinned  # v4.8.0-rc1, v4.9.0, v4.20.0, v4.24.0, v4.27.0 at least
    for toolchain, users in pinned.items():
        version = toolchain.rsplit(":", 1)[-1]
        assert version in REPL_REVISIONS, (toolchain, users, "add it to REPL_REVISIONS")
        want = REPL_REVISIONS[version] if version in REPL_UNTAGGED else version
        assert repl_tag(toolchain) == want, (toolchain, users)
    assert repl_tag("leanprover/lean4:v4.20.0") == "16054ca34b80803d6621dccd11882ca2ea03e215"


def _repl_mirror() -> Path | None:
    """A local git copy of leanprover-community/repl: $LEANRL_REPL_GIT, or the workspace's."""
    cands = [os.environ.get("LEANRL_REPL_GIT", "")]
    root = Path(__file__).resolve().parents[2]
    cands.append(str(root / ".mirror" / "leanprover-community+repl" / "repo"))
    for c in cands:
        if c and ((Path(c) / "HEAD").exists() or (Path(c) / ".git").exists()):
            return Path(c)
    return None


def test_the_repl_revision_table_matches_the_repository() -> None:
    """Every entry is a full commit id of a version that reads as one; where a local copy of
    leanprover-community/repl exists ($LEANRL_REPL_GIT, or the workspace's), each commit's
    `lean-toolchain`, its `pickleTo` support and the tags are checked against it too (no network
    is asked: without a copy, that part is left for a machine that has one)."""
    from leanrl.lean.project import REPL_REVISIONS, REPL_UNTAGGED

    assert REPL_UNTAGGED <= set(REPL_REVISIONS)
    for version, commit in REPL_REVISIONS.items():
        assert re.fullmatch(r"v\d+\.\d+\.\d+(-rc\d+)?", version), version
        assert re.fullmatch(r"[0-9a-f]{40}", commit), (version, commit)
        assert repl_tag(f"leanprover/lean4:{version}") in (version, commit)
    git = _repl_mirror()
    if git is None or shutil.which("git") is None:
        return

    def sh(*args: str) -> str:
        r = subprocess.run(
            [
                "git",
                f"--git-dir={git}" if (git / "HEAD").exists() else f"--git-dir={git}/.git",
                *args,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        return r.stdout.strip() if r.returncode == 0 else ""

    tags = set(sh("tag").split())
    for version, commit in REPL_REVISIONS.items():
        toolchain = sh("show", f"{commit}:lean-toolchain")
        assert toolchain == f"leanprover/lean4:{version}", (version, commit, toolchain)
        assert "pickleTo" in sh("show", f"{commit}:REPL/JSON.lean"), (version, commit)
        if version in REPL_UNTAGGED:
            assert version not in tags, f"{version} is tagged now: require it by tag"
        else:
            assert sh("rev-parse", f"{version}^{{commit}}") == commit, version
