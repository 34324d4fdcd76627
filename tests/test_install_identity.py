"""The PyPI name `leanrl` is an unrelated package: leanrl notices when the installed distribution
of that name is not this project, and every install hint uses a form that installs this one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from leanrl import ConfigError, _dist, load_environment

REPO = Path(__file__).resolve().parent.parent


def _foreign_site(tmp_path: Path) -> Path:
    """A folder holding only the metadata of PyPI's unrelated `leanrl` (an XBRL tool)."""
    site = tmp_path / "site"
    info = site / "leanrl-0.1.5.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: leanrl\nVersion: 0.1.5\n"
        "Summary: Lean (non-XML) approach to process XBRL\n",
        encoding="utf-8",
    )
    (info / "RECORD").write_text("", encoding="utf-8")
    return site


def _python(code: str, site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run(
        [sys.executable, *args, "-c", code] if not args else [sys.executable, *args],
        capture_output=True,
        text=True,
        cwd=site,
        env=env,
        timeout=120,
    )


def test_this_checkout_is_recognised_as_itself() -> None:
    assert _dist.foreign_distribution() is None


def test_a_foreign_leanrl_distribution_is_named_with_the_fix(tmp_path: Path) -> None:
    site = _foreign_site(tmp_path)
    out = _python("import leanrl; print(leanrl.__version__)", site)
    assert out.returncode == 0, out.stderr
    assert "0.0.0+unknown" in out.stdout  # not the other package's version
    assert "not this project" in out.stderr and "XBRL" in out.stderr
    assert "pip uninstall leanrl" in out.stderr and "git+" in out.stderr
    version = _python("", site, "-m", "leanrl.cli", "--version")
    assert version.returncode == 0
    assert "warning: the installed Python distribution named 'leanrl'" in version.stdout


def test_unknown_environment_error_names_the_foreign_distribution(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_dist, "foreign_distribution", lambda: "PROBLEM-X")
    with pytest.raises(ConfigError, match=r"did you mean 'minif2f'.*Note: PROBLEM-X"):
        load_environment("minif2ff")


def test_install_hint_follows_where_leanrl_came_from(monkeypatch: pytest.MonkeyPatch) -> None:
    # This checkout is installed editable (`pip install -e .`): the hint adds to it.
    hint = _dist.install_hint("serve")
    assert hint == f'pip install -e "{REPO}[serve]"'
    monkeypatch.setattr(
        _dist,
        "_direct_url",
        lambda: {
            "url": "https://example.org/x/leanrl",
            "vcs_info": {"vcs": "git", "commit_id": "abc123"},
        },
    )
    assert _dist.install_hint("plot") == (
        'pip install "leanrl[plot] @ git+https://example.org/x/leanrl@abc123"'
    )
    monkeypatch.setattr(_dist, "_direct_url", lambda: {"url": "file:///w/leanrl-0.1.0.whl"})
    assert _dist.install_hint("modal") == 'pip install "leanrl[modal] @ file:///w/leanrl-0.1.0.whl"'
    monkeypatch.setattr(_dist, "_direct_url", lambda: None)
    fallback = _dist.install_hint("train")
    assert "leanrl[train] @ git+" in fallback and "not from PyPI" in fallback


def test_no_hint_in_the_code_or_docs_says_pip_install_leanrl_from_pypi() -> None:
    """`pip install leanrl` / `pip install 'leanrl[x]'` install the unrelated PyPI package."""
    bad = []
    files = [REPO / "README.md", *REPO.glob("docs/*.md"), *REPO.glob("examples/**/*.md")]
    for folder in ("leanrl", "environments", "harnesses", "runtimes", "examples"):
        files += (REPO / folder).rglob("*.py")
    for f in files:
        text = f.read_text(encoding="utf-8")
        for pattern in ("pip install leanrl", "pip install 'leanrl[", 'pip install "leanrl["'):
            at = text.find(pattern)
            while at != -1:
                line = text[text.rfind("\n", 0, at) + 1 : text.find("\n", at)]
                if pattern.startswith('pip install "leanrl[') and "@" in line:
                    pass  # the direct-reference form installs this project
                elif "not" in line or "unrelated" in line:
                    pass  # the README's warning about it
                else:
                    bad.append(f"{f.relative_to(REPO)}: {line.strip()}")
                at = text.find(pattern, at + 1)
    assert not bad, "\n".join(bad)
