"""The trusted checker's structure, read from its Lean source (no Lean needed).

The kernel must check the attempt's *own* proof of the target. In the judge, the target's name
belongs to the reference statement (proved with `sorry`), so a checker that resolved the target
there when replaying would hand the kernel the reference's `sorry` and never look at the
attempt's body: an attempt that added its target without the kernel (code run during
elaboration) would be accepted. `target_problems` reads `LeanrlCheck.lean` and names every way
the replay could again read the target from the clean environment. It is run on the checker as
shipped (no problem allowed) and on the checker as it was before that hole was closed, kept as a
fixture, where it must find the hole: the check can fail.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from leanrl.lean.trust.report import checker_source
from leanrl.lean.trust.rules import KERNEL_BUG_SHAPES

BEFORE = Path(__file__).parent / "fixtures" / "trust" / "LeanrlCheck_before_issue19.lean"


def _definition(src: str, name: str) -> str:
    """The text of the top-level `def name` up to the next top-level item."""
    m = re.search(rf"^(?:unsafe |partial )?def {re.escape(name)}\b", src, re.M)
    if m is None:
        return ""
    nxt = re.search(
        r"^(?:/-|@\[|(?:unsafe |partial )?def |structure |inductive |abbrev |end )",
        src[m.end() :],
        re.M,
    )
    return src[m.start() : m.end() + (nxt.start() if nxt else len(src))]


def _code(text: str) -> str:
    """`text` without its line comments (a comment saying "replay" is not a call)."""
    return re.sub(r"--.*$", "", text, flags=re.M)


def target_problems(src: str) -> list[str]:
    """Every way `replay` could read the target from the clean environment (empty: none)."""
    problems: list[str] = []
    run, replay, target_decl = (
        _code(_definition(src, name)) for name in ("run", "replay", "targetDecl")
    )
    if not run or not replay:
        return ["`run` or `replay` is missing from the checker"]
    # 1. The lookup the replay gets hides the target's name.
    hide = re.search(
        r"let lookW : Name → Option ConstantInfo := fun n => if n == tgt then none else look n",
        run,
    )
    if hide is None:
        problems.append("`run` defines no lookup that hides the target (`lookW`)")
    calls = re.findall(r"\breplay\s+(\w+)\s+isNew\b", run)
    if not calls:
        problems.append("`run` never calls `replay`")
    for arg in calls:
        if arg != "lookW":
            problems.append(
                f"`replay` is given `{arg}`, which resolves the target in the clean env"
            )
    # 2. The target reaches the kernel as `targetDecl` builds it from the attempt's constant.
    if not target_decl:
        problems.append("no `targetDecl`: the target's declaration is not built from the attempt")
    else:
        if "env" in re.findall(r"\b\w+\b", target_decl):
            problems.append("`targetDecl` reads an environment")
        for branch in re.findall(
            r"\| \.(\w+) a, \.\1 (?:_|r) =>(.*?)(?=\n  \||\Z)", target_decl, re.S
        ):
            body = branch[1]
            if "value := inst a.value" not in body or "type := ref.type" not in body:
                problems.append(f"`targetDecl`'s {branch[0]} branch is not `ref.type := a.value`")
            if re.search(r"\br\.value\b|\bref\.value\b", body):
                problems.append(f"`targetDecl`'s {branch[0]} branch reads the reference's value")
        if not re.search(r"\| \.thmInfo a, \.thmInfo _ =>", target_decl):
            problems.append("`targetDecl` has no theorem branch")
    if not re.search(r"let attempt\? := lookNew tgt", run) or not re.search(
        r"match attempt\? with.*?\| some ci =>.*?targetDecl ci ref fresh", run, re.S
    ):
        problems.append("`run` does not build the target's declaration from `lookNew tgt`")
    # 3. In `replay`, the target is added as `tgtDecl`, and never through its `look`.
    branch = re.search(r"if n == target then(.*?)\n      continue\n", replay, re.S)
    if branch is None or "addDecl tgtDecl" not in branch.group(1):
        problems.append("`replay` does not add the target as `tgtDecl` before anything else")
    elif replay.index("if n == target then") > replay.index("look n"):
        problems.append("`replay` looks a name up before it has set the target apart")
    return problems


def test_the_replay_never_reads_the_target_from_the_clean_environment() -> None:
    assert target_problems(checker_source()) == []


def test_the_structure_check_finds_the_hole_in_the_checker_before_the_fix() -> None:
    # A test of the test: the checker that accepted a forged target must fail it.
    problems = target_problems(BEFORE.read_text(encoding="utf-8"))
    assert any("`replay` is given `look`" in p for p in problems), problems
    assert any("targetDecl" in p for p in problems), problems


@pytest.mark.parametrize(
    "mutation",
    [
        # the replay given the lookup that prefers the clean environment
        ("(replay lookW isNew", "(replay look isNew"),
        # the target built from the reference's value
        ("value := inst a.value, all := [fresh] }", "value := inst r.value, all := [fresh] }"),
        # the target's value read from the clean environment's copy
        ("targetDecl ci ref fresh", "targetDecl ref ref fresh"),
        # the lookup no longer hides the target
        ("fun n => if n == tgt then none else look n", "fun n => look n"),
    ],
)
def test_the_structure_check_catches_each_way_back(mutation: tuple[str, str]) -> None:
    src = checker_source()
    old, new = mutation
    assert old in src, old
    assert target_problems(src.replace(old, new, 1)), mutation


def test_every_kernel_bug_shape_the_checker_reports_has_a_rule() -> None:
    src = checker_source()
    shape = _definition(src, "badShape")
    reported = set(re.findall(r'some \("([a-z_]+)"', shape))
    # `too_deep` is found by the rebuild (`prepare`), before any shape is looked at
    prep, run = _definition(src, "prepare"), _definition(src, "run")
    assert 'status := "too_deep"' in prep
    assert run.index("← prepare path olean") < run.index("badShape")
    assert reported | {"too_deep"} == set(KERNEL_BUG_SHAPES), reported
    for cap in ("k ≥ maxBVarIndex", "r.2 > maxLevelDepth"):
        assert cap in src, cap
    # and each is looked for in every new constant, the target's own copy included
    run = _definition(src, "run")
    assert "let own? := if n == tgt then some ci else if isNew n then lookNew n else none" in run
    assert run.index("badShape lookW own") < run.index("replay lookW")


def test_every_name_the_replay_resolves_is_explained() -> None:
    # The checker and docs/verification.md both say which copy each kind of name is read from.
    src = checker_source()
    doc = (Path(__file__).parents[1] / "docs" / "verification.md").read_text(encoding="utf-8")
    for kind in (
        "The target",
        "shares with the clean environment",
        "answer placeholder",
        "Every other constant",
    ):
        assert kind in src, kind
    assert "Which copy of each constant the judge reads" in src
    assert "Which copy of each constant the judge reads" in doc
