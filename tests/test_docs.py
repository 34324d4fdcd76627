"""The README and the docs stay true: commands that CI runs, generated reference, links."""

from __future__ import annotations

import re
from pathlib import Path

from leanrl.cli import _COMMANDS
from leanrl.config_reference import configuration_reference

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text(encoding="utf-8")


def _bash_blocks(text: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    tests_cmd = next(b for b in _bash_blocks(README) if "pytest" in b)
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert tests_cmd in ci.splitlines(), "README's test command and .ci/run disagree"


def test_readme_main_command_is_the_eval_job() -> None:
    main_cmd = _bash_blocks(README)[0]
    assert "bash .ci/setup.sh" in main_cmd and "leanrl eval --env minif2f" in main_cmd


def test_every_command_is_in_the_readme() -> None:
    for path in _COMMANDS:
        assert f"`leanrl {path}" in README, f"README's command table lacks `leanrl {path}`"


def test_configuration_reference_is_up_to_date() -> None:
    current = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert current == configuration_reference(), (
        "docs/configuration.md is stale: run `python -m leanrl.config_reference > docs/configuration.md`"
    )


def test_relative_links_resolve() -> None:
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", doc.read_text(encoding="utf-8")):
            assert (doc.parent / target).exists(), f"{doc.name} links to missing {target}"


def test_no_merge_conflict_markers() -> None:
    """A merge left `<<<<<<<`/`=======`/`>>>>>>>` lines in docs/eval.md once; nothing the repo
    ships may keep them."""
    marker = re.compile(r"^(<{7}( |$)|={7}$|>{7}( |$))", flags=re.M)
    suffixes = {".md", ".py", ".toml", ".txt", ".sh", ".lean", ".json", ".yaml", ".yml", ""}
    found = []
    for path in REPO.rglob("*"):
        rel = path.relative_to(REPO)
        if rel.parts[0] in {".git", ".venv", "build", "dist"} or "__pycache__" in rel.parts:
            continue
        if not path.is_file() or path.suffix not in suffixes or path.stat().st_size > 2_000_000:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        found += [f"{rel}:{text.count(chr(10), 0, m.start()) + 1}" for m in marker.finditer(text)]
    assert not found, f"merge conflict markers left in: {found}"
