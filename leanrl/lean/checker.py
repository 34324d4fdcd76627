"""Putting the Lean text together, and reading the trusted checker's answer.

An attempt is checked in three steps, in every mode:

1. the model's text (preamble + reference statement + proof) is elaborated under the header;
2. the resulting constants are written to a file (REPL ``pickleTo``, or ``lean -o`` in one-shot
   mode);
3. in a *clean* environment -- the header's imports plus the trusted checker
   (``LeanrlCheck.lean``) plus the reference statement elaborated with ``sorry``, none of which
   the model's text touched -- the checker reads that file as data and reports facts: does the
   theorem exist, is it a theorem, is its type the reference type, which axioms does it depend
   on, and (opt-in) does the kernel accept a replay of it.

This module builds the text for each step and parses the report; :mod:`leanrl.lean.judge` turns
the facts into a :class:`~leanrl.Verdict`.
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources

from pydantic import BaseModel, ConfigDict, Field

from leanrl.lean.protocol import ReplMessage
from leanrl.verdict import Attempt

__all__ = [
    "CHECK_TAG",
    "Assembled",
    "CheckReport",
    "assemble",
    "check_command",
    "checker_source",
    "parse_report",
    "reference_command",
    "split_header",
]

CHECK_TAG = "LEANRL-CHECK "
"""Prefix of the checker's one info message."""

_IMPORT = re.compile(r"^\s*import\s+\S")


@cache
def checker_source() -> str:
    """The trusted Lean checker (``LeanrlCheck.lean``, shipped with the package)."""
    return resources.files("leanrl.lean").joinpath("LeanrlCheck.lean").read_text(encoding="utf-8")


def split_header(header: str) -> tuple[list[str], str]:
    """Split a header into its import lines and the rest (options, ``open``, ...).

    ``import Lean`` is added in front when missing: the checker needs Lean's meta API. For
    Mathlib headers this changes nothing (Mathlib imports Lean); for core-only tasksets it makes
    Lean's meta library visible to the attempt too, which the pre-scan keeps from being run.
    """
    imports: list[str] = []
    rest: list[str] = []
    in_imports = True
    in_comment = False
    for line in header.splitlines():
        stripped = line.strip()
        if in_imports and in_comment:
            in_comment = "-/" not in stripped
        elif in_imports and stripped.startswith("/-"):
            in_comment = "-/" not in stripped[2:]
        elif in_imports and _IMPORT.match(line):
            imports.extend("import " + m for m in line.split()[1:])
        elif in_imports and (not stripped or stripped.startswith("--")):
            continue
        else:
            in_imports = False
            rest.append(line)
    if "import Lean" not in imports:
        imports.insert(0, "import Lean")
    return imports, "\n".join(rest).strip("\n")


class Assembled(BaseModel):
    """The attempt's Lean text and where its parts are (1-based, inclusive line numbers)."""

    model_config = ConfigDict(frozen=True)

    text: str
    """Preamble, statement and proof, as sent to Lean after the header."""
    statement_lines: tuple[int, int]
    """First and last line of the reference statement within ``text``."""
    proof_line: int
    """Line where the proof starts within ``text`` (line of ``:= by`` when inline)."""

    def in_statement(self, line: int) -> bool:
        """Whether ``line`` belongs to the trusted statement (not model text)."""
        return self.statement_lines[0] <= line <= self.statement_lines[1]


def assemble(attempt: Attempt) -> Assembled:
    """Preamble + statement + proof, laid out like :meth:`leanrl.Task.lean_text`."""
    pre = attempt.preamble.rstrip() + "\n\n" if attempt.preamble.strip() else ""
    stmt = (attempt.restated_statement or attempt.formal_statement).rstrip()
    body = attempt.proof if attempt.proof.startswith("\n") else "\n  " + attempt.proof
    text = f"{pre}{stmt}{body}\n"
    first = pre.count("\n") + 1
    last = first + stmt.count("\n")
    return Assembled(text=text, statement_lines=(first, last), proof_line=last + 1)


def model_text(attempt: Attempt) -> str:
    """The part of the attempt the model wrote (what the pre-scan looks at)."""
    return "\n".join((attempt.preamble, attempt.restated_statement, attempt.proof))


def lean_string(s: str) -> str:
    """A Lean string literal for ``s``."""
    out = s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return f'"{out}"'


def reference_command(formal_statement: str) -> str:
    """The reference statement with a ``sorry`` proof, elaborated in the clean environment."""
    return formal_statement.rstrip() + "\n  sorry\n"


def check_command(path: str, name: str, nonce: str, *, olean: bool, replay: bool) -> str:
    """The ``#eval`` that runs the trusted check (in the clean environment).

    ``LeanrlCheck.run`` is a ``CoreM`` action; it is lifted to ``CommandElabM`` because before
    Lean's ``#eval`` rewrite (lean4#5627) ``#eval`` ran a ``CoreM`` action on a fresh message log
    and dropped the report it logs, while a ``CommandElabM`` action logs into the command's own
    messages in every Lean version.
    """
    flag = {True: "true", False: "false"}
    return (
        f"#eval LeanrlCheck.run {lean_string(path)} {lean_string(name)} {lean_string(nonce)} "
        f"{flag[olean]} {flag[replay]} |> Lean.Elab.Command.liftCoreM\n"
    )


class CheckReport(BaseModel):
    """What the trusted checker found (facts only; the policy is applied in Python)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    nonce: str
    """Echo of the per-check nonce."""
    status: str
    """``ok``, ``missing``, ``wrong_kind``, ``type_mismatch``, ``helper_mismatch``,
    ``missing_dependency``, ``no_reference`` or ``replay_failed``."""
    detail: str = ""
    """Why, when ``status`` is not ``ok``."""
    kind: str = "missing"
    """Kind of the attempt's declaration (``theorem``, ``def``, ... or ``missing``)."""
    ref_kind: str = "missing"
    """Kind of the reference declaration."""
    axioms: tuple[str, ...] = ()
    """Axioms the attempt's declaration depends on (transitively)."""
    constants: tuple[str, ...] = ()
    """Every constant the attempt added."""
    replayed: bool = False
    """True when the kernel replay ran and accepted everything."""
    extra: dict[str, str] = Field(default_factory=dict)
    """Anything else the checker said (forward compatibility)."""


def parse_report(
    messages: tuple[ReplMessage, ...] | list[ReplMessage], nonce: str
) -> CheckReport | str:
    """The checker's report from the messages of the check step, or why there is none.

    Exactly one message must carry the tag and the right nonce, and the step must have produced
    no error: anything else means the check did not run as intended.
    """
    errors = [m.data for m in messages if m.severity == "error"]
    if errors:
        return "the trusted check failed to run: " + errors[0][:500]
    tagged = [m.data for m in messages if m.data.startswith(CHECK_TAG)]
    if len(tagged) != 1:
        return f"the trusted check produced {len(tagged)} reports (expected exactly 1)"
    try:
        obj = json.loads(tagged[0][len(CHECK_TAG) :])
        report = CheckReport.model_validate(obj)
    except (ValueError, TypeError) as e:
        return f"the trusted check's report is unreadable: {e}"
    if report.nonce != nonce:
        return "the trusted check's report carries the wrong nonce"
    return report
