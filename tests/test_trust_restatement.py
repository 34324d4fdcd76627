"""A restated statement is decided by two independent, bounded checks; the known kernel bugs of
the pinned toolchains each meet a rule (issue 35). No Lean needed: the checker's structure is read
from its source, and each rule's effect from the policy applied to a report.

`restate_problems` names every way a restated statement could be accepted by one check alone,
or without the judge's bounds. It is run on the checker as shipped (no problem allowed) and on the
checker as it was before the rule, kept as a fixture, where it must find the kernel-only path: the
check can fail. Mutations of the shipped source show each part of it is needed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from leanrl import load_environment
from leanrl.lean.trust.kernel_bugs import KERNEL_BUGS, PINNED, KernelBug
from leanrl.lean.trust.report import CheckReport, checker_source
from leanrl.lean.trust.rules import KERNEL_BUG_SHAPES, judge_report
from leanrl.runtime import RuntimeConfig
from leanrl.verdict import Attempt, Reason, VerificationPolicy

ROOT = Path(__file__).parents[1]
BEFORE = ROOT / "tests" / "fixtures" / "trust" / "LeanrlCheck_before_issue35.lean"
DOC = ROOT / "docs" / "verification.md"


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
    return re.sub(r"--.*$", "", text, flags=re.M)


def restate_problems(src: str) -> list[str]:
    """Every way a restated target could be accepted without both bounded checks (empty: none)."""
    problems: list[str] = []
    same = _code(_definition(src, "sameStatement"))
    replay = _code(_definition(src, "replay"))
    if not same:
        return ["no `sameStatement`"]
    meta = re.search(
        r"Meta\.withTransparency\s+\.reducible\s+\(Meta\.isDefEq refType stated\)", same
    )
    kernel = same.find("addDecl")
    if meta is None:
        problems.append("the elaborator's isDefEq at reducible transparency is not asked")
    if kernel < 0:
        problems.append("the kernel is not asked")
    if meta is not None and kernel >= 0 and meta.start() > kernel:
        problems.append("the kernel is asked before the elaborator")
    # Only one way to say "the same", and only once both have agreed.
    accepts = [m.start() for m in re.finditer(r"return none\b", same)]
    if len(accepts) != 1:
        problems.append(f"`sameStatement` accepts in {len(accepts)} places (one expected)")
    elif kernel >= 0 and accepts[0] < kernel:
        problems.append("`sameStatement` accepts before the kernel's check")
    if not re.search(r"\| \.ok false =>\s*return some \(\"type_mismatch\"", same):
        problems.append("a 'no' from the elaborator does not refuse the restatement")
    if not re.search(r"\| \.error why =>.*?return some", same, re.S):
        problems.append("an error of a check does not refuse the restatement")
    # Both checks are bounded, and literal arithmetic is refused before either reduces anything.
    for what in ("viaMeta", "viaKernel"):
        if not re.search(rf"bounded {what} heartbeats", same):
            problems.append(f"`{what}` is not run under the heartbeat bound (`bounded`)")
    big = same.find("bigComputation? refType stated")
    if big < 0 or (meta is not None and big > meta.start()):
        problems.append("literal arithmetic is not bounded before the checks")
    bounded = _code(_definition(src, "bounded"))
    if "Core.CoreM.toIO" not in bounded or "EIO.toBaseIO" not in bounded:
        problems.append("`bounded` does not catch every exception (runtime ones included)")
    if "maxHeartbeats := heartbeats * 1000" not in bounded or "`maxHeartbeats" not in bounded:
        problems.append("`bounded` does not set the heartbeat bound for the elaborator and kernel")
    # the kernel counts its steps per thread and `addDecl` never resets the count: a fresh thread
    if "Task.Priority.dedicated" not in bounded or "IO.wait" not in bounded:
        problems.append("`bounded` runs on the judge's own thread (the kernel's count is stale)")
    limit = _code(_definition(src, "isLimit"))
    if "startsWith" not in limit:
        problems.append("`isLimit` reads the whole message (the attempt's names are in it)")
    # In the replay, a restated target reaches `addDecl tgtDecl` only after `sameStatement`.
    branch = re.search(r"if n == target then(.*?)\n      continue\n", replay, re.S)
    if branch is None:
        problems.append("`replay` has no target branch")
    else:
        body = branch.group(1)
        call = body.find("sameStatement refType stated")
        early = re.search(r"if let some \(st, why\) := differs then\s*return \(st,", body)
        add = body.find("addDecl tgtDecl")
        if call < 0 or early is None or not call < early.start() < add:
            problems.append("the target is added without a refused restatement returning first")
    # Universes are paired by what they bind, for the statement and the proof alike.
    for user in ("statedType", "targetDecl"):
        if "levelMap attempt ref" not in _definition(src, user):
            problems.append(f"`{user}` pairs universes by position only")
    return problems


def test_a_restatement_needs_both_bounded_checks() -> None:
    assert restate_problems(checker_source()) == []


def test_the_check_finds_the_kernel_only_path_of_the_checker_before_the_rule() -> None:
    problems = restate_problems(BEFORE.read_text(encoding="utf-8"))
    assert any("reducible" in p for p in problems), problems
    assert any("heartbeat" in p for p in problems), problems
    assert any("by position" in p for p in problems), problems
    assert any("own thread" in p for p in problems), problems


@pytest.mark.parametrize(
    "mutation",
    [
        # the elaborator's check dropped: the kernel alone decides
        ("  match ← bounded viaMeta heartbeats with", "  match Except.ok true with"),
        # the elaborator asked at default transparency (unfolds ordinary definitions)
        ("Meta.withTransparency .reducible", "Meta.withTransparency .default"),
        # a 'no' from the elaborator ignored
        (
            '  | .ok false =>\n    return some ("type_mismatch"',
            '  | .ok false =>\n    pure ()\n    return some ("x"',
        ),
        # the kernel's check unbounded
        ("match ← bounded viaKernel heartbeats with", "match ← (Except.ok <$> viaKernel) with"),
        # literal arithmetic evaluated whatever its size
        (
            "if let some what := bigComputation? refType stated nonNat then",
            "if let some what := (none : Option String) then",
        ),
        # universes by position
        ("(levelMap attempt ref)", "(ref.levelParams.map Level.param)"),
        # the checks on the judge's own long-lived thread
        ("Task.Priority.dedicated", "Task.Priority.default"),
        # limits read anywhere in a message that quotes the attempt's names
        ("fun p => why.startsWith p", "fun p => (why.splitOn p).length > 1"),
    ],
)
def test_each_part_of_the_restatement_rule_is_needed(mutation: tuple[str, str]) -> None:
    src = checker_source()
    old, new = mutation
    assert old in src, old
    assert restate_problems(src.replace(old, new, 1)), mutation


def test_the_checker_reserves_its_own_namespace() -> None:
    src = checker_source()
    prep = _code(_definition(src, "prepare"))
    guard = prep.find("n.getRoot == `LeanrlCheck")
    assert guard >= 0 and 'status := "reserved_name"' in prep
    # before the comparison with the clean environment that gave `helper_mismatch`
    assert guard < prep.index('status := "helper_mismatch"')
    # and both checks start from it: the theorem check and the file check
    for check in ("run", "runFile"):
        assert "← prepare path olean" in _definition(src, check), check


# -- what the policy makes of the checker's new statuses ----------------------------------------

ATTEMPT = Attempt(name="t", header="", formal_statement="theorem t : True := by", proof="trivial")


def _report(**kw: object) -> CheckReport:
    base: dict[str, object] = {"nonce": "n", "status": "ok", "kind": "theorem",
                               "ref_kind": "theorem", "replayed": True}  # fmt: skip
    base.update(kw)
    return CheckReport.model_validate(base)


def test_a_restatement_past_the_bounds_is_judge_limit_and_a_refused_one_says_which_check() -> None:
    v = judge_report(ATTEMPT, _report(status="judge_limit", detail="1 <<< 4294967296"))
    assert v.reason is Reason.JUDGE_LIMIT and not v.accepted and "4294967296" in v.detail
    for which in ("the elaborator's isDefEq at reducible transparency says", "the kernel did not"):
        v = judge_report(ATTEMPT, _report(status="type_mismatch", detail=which, restated=True))
        assert v.reason is Reason.STATEMENT_CHANGED and which in v.detail
    v = judge_report(ATTEMPT, _report(status="reserved_name", detail="LeanrlCheck.run"))
    assert v.reason is Reason.FORBIDDEN and "LeanrlCheck" in v.detail
    # the accepted restatement: both checks passed and the kernel replayed the proof
    assert judge_report(ATTEMPT, _report(restated=True)).accepted


# -- the kernel bug table: one test per row ------------------------------------------------------


def test_the_table_covers_every_pinned_toolchain() -> None:
    envs = ("minif2f", "minif2f-deepseek", "proofnet", "proofnet-deepseek", "putnambench",
            "core", "deepseek-prover-v1", "goedel-pset", "numina-lean", "lean-workbook")  # fmt: skip
    pins = set()
    for env in envs:
        pin = load_environment(env).taskset.lean_toolchain  # None: the dataset's own project
        if pin is not None:
            pins.add(pin.split(":")[-1])
    assert pins == set(PINNED), pins ^ set(PINNED)
    for bug in KERNEL_BUGS:
        assert set(bug.affects) <= set(PINNED), bug


def _holds(rule: str, bug: KernelBug) -> None:
    src = checker_source()
    if rule in KERNEL_BUG_SHAPES:
        # the checker reports the shape, before the kernel, and the policy refuses it
        where = _definition(src, "prepare" if rule == "too_deep" else "badShape")
        assert f'"{rule}"' in where, rule
        v = judge_report(ATTEMPT, _report(status=rule, detail="x"))
        assert v.reason is Reason.FORBIDDEN and rule in v.detail
    elif rule == "new_inductives":
        assert "inductives := inductives.push n" in _definition(src, "run")
        v = judge_report(ATTEMPT, _report(inductives=("T",)))
        assert v.reason is Reason.FORBIDDEN and "allow_new_inductives" in v.detail
        allowed = ATTEMPT.model_copy(
            update={"policy": VerificationPolicy(allow_new_inductives=True)}
        )
        assert judge_report(allowed, _report(inductives=("T",))).accepted
    elif rule == "memory_cap":
        # every judge runs under memory_mb (RLIMIT_DATA at 1.5x): far below the ~18 GB needed
        assert RuntimeConfig().memory_mb * 1.5 * 2**20 < 18e9
    elif rule == "restatement":
        assert restate_problems(src) == []
    elif rule == "literal_bound":
        same = _definition(src, "sameStatement")
        assert same.index("bigComputation? refType stated") < same.index("viaMeta")
        assert judge_report(ATTEMPT, _report(status="judge_limit")).reason is Reason.JUDGE_LIMIT
    elif rule == "none":
        # a residual risk: the docs say so, naming the bug
        residual = DOC.read_text(encoding="utf-8").split("**What is still assumed.**")[1]
        assert bug.issues.split(" ")[0].split(",")[0] in residual, bug.issues
    else:  # pragma: no cover - a rule the table names but this test does not know
        raise AssertionError(rule)


@pytest.mark.parametrize("bug", KERNEL_BUGS, ids=[b.issues.split(" ")[0] for b in KERNEL_BUGS])
def test_each_known_kernel_bug_meets_its_rule(bug: KernelBug) -> None:
    assert bug.rules, bug
    for rule in bug.rules:
        _holds(rule, bug)
    # and the docs print the row
    assert bug.issues in DOC.read_text(encoding="utf-8"), bug.issues
