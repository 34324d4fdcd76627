"""False-reject rate of proof extraction + pre-scan over public prover proofs known to be valid.

Every proof given here was published as checked by Lean, so anything the whole-proof extractor
(``harnesses/whole_proof/extract.py``) or the pre-scan (``leanrl/lean/trust/syntax.py``)
refuses is a candidate false reject. Each refusal is listed with its reason. Refusals of a
construct the policy forbids *on purpose* (native code under the strict policy, a proof that
defines its own elaborator or macro) are counted apart. "restated" counts the proofs that pass
with the model's own statement (it differs from the reference beyond layout, comments, `«»` and
redundant parentheses), which the trusted checker then compares by type and, where the types
differ, by the kernel's definitional equality.

With ``--judge`` (needs a real Lean with the benchmark's Mathlib: ``leanrl setup --env ...`` or
``LEANRL_LEAN_PROJECT``), every proof the pre-scan passes under the default policy is also checked
end to end by the local runtime -- elaboration, the trusted checker, kernel replay -- and any
verdict but ``ok`` is listed as a false reject of stage ``judge:<reason>``; "restated" then counts
the restatements the kernel accepted.

Inputs (any number, each a path):

* a ``.jsonl`` file of rows with ``name``, ``formal_statement`` and ``formal_proof``
  (DeepSeek-Prover-V1.5's ``minif2f_valid_few_shot.jsonl``: the proof continues the statement,
  as a completion-style model writes it; the miniF2F-lean4 ``minif2f_lean4@442f415.jsonl``:
  ``formal_statement`` ends in ``:= sorry`` and ``formal_proof`` replaces the ``sorry``);
* a ``.lean`` file, a folder of them, or a ``.zip`` of them: whole solution files, given to the
  extractor as a chat answer's code block;
* ``GITDIR:REV:PATH``: a ``.zip`` or ``.lean`` blob inside a bare git repository (as ``fetch``
  brings repositories: ``/work/.mirror/owner+name/repo:HEAD:minif2f-solutions.zip``).

The task each file answers is the row of ``--statements`` (a benchmark JSONL with ``name``,
``header``, ``formal_statement``) with the same name, else it is read from the file itself (its
theorem named like the file, or its last theorem), or from ``--statements-env`` (an environment's
tasks, loaded as leanrl loads them). Nothing else is downloaded; no third-party file is kept.

With ``--judge``, a restatement the checker refuses as ``statement_changed`` is listed as such,
not counted as a false reject: the published proof proves the model's own statement, and the
checker's two checks (the elaborator's reducible ``isDefEq`` and the kernel) found it is not the
reference's. Every restatement is listed with its verdict; ``--show-restated`` lists the
statements themselves. ``--fail-on-false-rejects`` exits 1 on any false reject of the default
policy (``.github/workflows/lean.yml`` runs it through the real judge on DeepSeek-Prover-V2's
published miniF2F solutions).

    python benchmarks/false_rejects.py \\
      /work/shared/data/raw/deepseek-prover-v1.5/minif2f_valid_few_shot.jsonl \\
      "/work/shared/data/raw/yangky11-miniF2F-lean4/minif2f_lean4@442f415.jsonl" \\
      /work/.mirror/deepseek-ai+DeepSeek-Prover-V2/repo:HEAD:minif2f-solutions.zip \\
      --statements /work/shared/data/minif2f_deepseek.jsonl
"""

from __future__ import annotations

import argparse
import io
import json
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from leanrl.harnesses.whole_proof.extract import extract_proof
from leanrl.lean.trust.allowlist import COMMANDS
from leanrl.lean.trust.lexer import Kind, bracket_delta, tokenize
from leanrl.lean.trust.rules import judge_prescan
from leanrl.task import Task
from leanrl.verdict import Attempt, Reason, VerificationPolicy

DEEPSEEK_HEADER = (
    "import Mathlib\nimport Aesop\n\nset_option maxHeartbeats 400000\n\n"
    "open BigOperators Real Nat Topology Rat\n\n"
)


@dataclass
class Case:
    """One published proof: where it came from, the task it answers, the model-style text."""

    source: str
    name: str
    task: Task
    text: str
    completion_style: bool


# -- reading the inputs ----------------------------------------------------------------------------


def _blob(spec: str) -> tuple[str, bytes] | None:
    """``GITDIR:REV:PATH`` -> (PATH, bytes), via ``git show``."""
    m = re.match(r"^(.+?):([^:/]+):(.+)$", spec)
    if m is None or not Path(m.group(1)).is_dir():
        return None
    gitdir, rev, path = m.groups()
    out = subprocess.run(
        ["git", "--git-dir", gitdir, "show", f"{rev}:{path}"], capture_output=True, check=True
    )
    return path, out.stdout


def _lean_files(spec: str) -> Iterator[tuple[str, str]]:
    """(file name, text) of every solution file behind ``spec``."""
    blob = _blob(spec)
    if blob is not None:
        path, data = blob
        if path.endswith(".zip"):
            yield from _zip_files(zipfile.ZipFile(io.BytesIO(data)))
        else:
            yield Path(path).name, data.decode("utf-8")
        return
    p = Path(spec)
    if p.suffix == ".zip":
        yield from _zip_files(zipfile.ZipFile(p))
    elif p.is_dir():
        for f in sorted(p.rglob("*.lean")):
            if "__MACOSX" not in f.parts and f.name != "lakefile.lean":
                yield f.name, f.read_text(encoding="utf-8")
    else:
        yield p.name, p.read_text(encoding="utf-8")


def _zip_files(z: zipfile.ZipFile) -> Iterator[tuple[str, str]]:
    for info in sorted(z.infolist(), key=lambda i: i.filename):
        name = info.filename
        if name.endswith(".lean") and "__MACOSX" not in name and not name.endswith("lakefile.lean"):
            yield Path(name).name, z.read(info).decode("utf-8")


def _task_from_file(name: str, text: str) -> Task | None:
    """The task a solution file answers, read from the file: its header lines and the theorem
    named like the file (or its last theorem), up to the ``:=`` of its proof."""
    tokens = tokenize(text)
    decls = [  # a `theorem`/`lemma` that starts its line
        k
        for k, t in enumerate(tokens[:-1])
        if t.kind is Kind.IDENT
        and t.text in ("theorem", "lemma")
        and (k == 0 or tokens[k - 1].line != t.line)
    ]
    if not decls:
        return None
    chosen = next((k for k in decls if tokens[k + 1].value == name), decls[-1])
    start = tokens[chosen].start
    depth, local = 0, False  # `local`: inside a `let x := v;` of the statement's type
    for t in tokens[chosen:]:
        depth += bracket_delta(t)
        if depth == 0 and t.kind is Kind.IDENT and t.text in ("let", "have"):
            local = True
        elif depth == 0 and t.kind is Kind.SYMBOL and t.text == ":=":
            if not local:
                stmt = text[start : t.start].strip() + " := by"
                break
            local = False
    else:
        return None
    header = "\n".join(
        ln for ln in text[:start].split("\n") if re.match(r"\s*(import|open|set_option)\s", ln)
    )
    return Task(name=tokens[chosen + 1].value, header=header + "\n\n", formal_statement=stmt)


def cases(spec: str, statements: dict[str, dict]) -> Iterator[Case]:
    source = Path(spec.split(":")[-1] if ":" in spec else spec).name
    if spec.endswith(".jsonl") and Path(spec).is_file():
        for line in Path(spec).read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            proof = row.get("formal_proof")
            if not proof:
                continue
            stmt = row["formal_statement"].rstrip()
            if stmt.endswith("sorry"):  # miniF2F-lean4: the proof replaces the `sorry`
                head = stmt[: -len("sorry")].rstrip()
                task = Task(name=row["name"], header=DEEPSEEK_HEADER, formal_statement=head + " by")
                text = f"```lean4\n{head} {proof.strip()}\n```"
                yield Case(source, row["name"], task, text, completion_style=False)
            else:  # DeepSeek few-shot: the proof continues the statement (completion style)
                task = Task(name=row["name"], header=DEEPSEEK_HEADER, formal_statement=stmt)
                yield Case(source, row["name"], task, proof + "\n```", completion_style=True)
        return
    for fname, text in _lean_files(spec):
        stem = fname.removesuffix(".lean")
        row = statements.get(stem)
        if row is not None:
            task = Task(
                name=row["name"], header=row["header"], formal_statement=row["formal_statement"]
            )
        else:
            found = _task_from_file(stem, text)
            if found is None:
                print(f"skipped {source}/{fname}: no theorem in it", file=sys.stderr)
                continue
            task = found
        yield Case(source, stem, task, f"```lean4\n{text}\n```", completion_style=False)


# -- judging ----------------------------------------------------------------------------------------


def attempt_of(case: Case, policy: VerificationPolicy) -> Attempt:
    """The attempt the whole-proof harness makes of a published proof."""
    ex = extract_proof(case.text, case.task, completion_style=case.completion_style)
    assert ex.proof is not None, "extraction failed"
    return Attempt(
        name=case.task.name,
        header=case.task.header,
        formal_statement=case.task.formal_statement,
        proof=ex.proof,
        preamble=ex.preamble,
        restated_statement=ex.restated_statement,
        policy=policy,
        id=f"{case.source}/{case.name}",
    )


def judge(case: Case, policy: VerificationPolicy) -> tuple[str, str] | None:
    """(stage and reason, detail) when extraction or the pre-scan refuses the proof; an
    accepted proof whose statement differs from the reference gives ("restated", statement)."""
    ex = extract_proof(case.text, case.task, completion_style=case.completion_style)
    if ex.reason is not None or ex.proof is None:
        return f"extract:{ex.reason.value if ex.reason else '?'}", ex.detail
    v = judge_prescan(attempt_of(case, policy))
    if v is None:
        return ("restated", ex.restated_statement) if ex.restated_statement else None
    return f"prescan:{v.reason.value}", v.detail


def judge_with_lean(
    all_cases: list[Case], policy: VerificationPolicy, workers: int
) -> tuple[int, int, list[str]]:
    """Check every case the pre-scan passes with the local runtime: (false rejects, restatements
    accepted, listed lines). A restatement the checker refuses as ``statement_changed`` is not a
    false reject: the published proof proves the model's own statement, which the trusted
    checker found is not the reference's (both its checks must agree, docs/verification.md); it
    is listed as ``restatement refused`` with the check that refused it. Every restatement is
    listed with its verdict."""
    from leanrl.runtime import RuntimeConfig
    from leanrl.runtimes.local import LocalRuntime

    passed: list[tuple[Case, Attempt]] = []
    for c in all_cases:
        got = judge(c, policy)
        if got is not None and got[0] != "restated":  # refused before Lean: counted above
            continue
        passed.append((c, attempt_of(c, policy)))
    rt = LocalRuntime(RuntimeConfig(workers=workers, timeout_s=600.0))
    verdicts = rt.check_sync([a for _, a in passed])
    false = restated = 0
    lines: list[str] = []
    for (c, a), v in zip(passed, verdicts, strict=True):
        if a.restated_statement:
            verdict = "accepted" if v.accepted else f"{v.reason.value}: {v.detail[:150]}"
            lines.append(f"  restatement   {c.source}/{c.name}: {verdict}")
        if v.accepted:
            restated += bool(a.restated_statement)
            continue
        if a.restated_statement and v.reason is Reason.STATEMENT_CHANGED:
            continue  # listed above: the model's statement is not the reference's
        false += 1
        lines.append(
            f"  FALSE REJECT  {c.source}/{c.name}: judge:{v.reason.value}: {v.detail[:150]}"
        )
    return false, restated, lines


def by_design(stage: str, detail: str, policy: VerificationPolicy) -> bool:
    """A refusal of a construct the policy forbids on purpose: native code when the policy does
    not allow it, or a command that runs code written in the proof (`elab`, `macro`, ...)."""
    if stage == f"prescan:{Reason.NATIVE.value}" and not policy.allow_native_decide:
        return True
    m = re.match(r"pre-scan: `([^`]+)`", detail)
    return bool(m) and stage == "prescan:forbidden" and COMMANDS.get(m.group(1)) == "code"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "inputs", nargs="+", help="proof files, folders, zips, JSONL or GITDIR:REV:PATH"
    )
    ap.add_argument("--statements", action="append", default=[], help="benchmark JSONL(s)")
    ap.add_argument(
        "--statements-env",
        action="append",
        default=[],
        help="an environment whose tasks (every split) are the statements, e.g. minif2f-deepseek "
        "(loaded as leanrl loads it: from the hub unless HF_HUB_OFFLINE, or --env path)",
    )
    ap.add_argument(
        "--judge",
        action="store_true",
        help="also check what the pre-scan passes with real Lean (local runtime, default policy)",
    )
    ap.add_argument("--workers", type=int, default=0, help="Lean processes for --judge (0: cores)")
    ap.add_argument(
        "--show-restated",
        action="store_true",
        help="list each proof that restates its theorem, the reference and the model's statement",
    )
    ap.add_argument(
        "--fail-on-false-rejects",
        action="store_true",
        help="exit 1 when the default policy has a false reject (what CI runs)",
    )
    args = ap.parse_args(argv)
    statements: dict[str, dict] = {}
    for path in args.statements:
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            statements.setdefault(row["name"], row)
    for env_id in args.statements_env:
        from leanrl import load_environment

        for t in load_environment(env_id, split=None).tasks():
            statements.setdefault(
                t.name,
                {"name": t.name, "header": t.header, "formal_statement": t.formal_statement},
            )
    policies = {
        "default": VerificationPolicy(),
        "native allowed": VerificationPolicy(allow_native_decide=True),
    }
    all_cases = [c for spec in args.inputs for c in cases(spec, statements)]
    failed = False
    sources = sorted({c.source for c in all_cases}, key=[c.source for c in all_cases].index)
    for label, policy in policies.items():
        print(f"\n== policy: {label} ==")
        print(
            f"{'source':44} {'proofs':>6} {'false rejects':>14} {'refused on purpose':>19}"
            f" {'restated':>9}"
        )
        total = false_total = design_total = restated_total = 0
        listed: list[str] = []
        for source in sources:
            mine = [c for c in all_cases if c.source == source]
            false = design = restated = 0
            for c in mine:
                got = judge(c, policy)
                if got is None:
                    continue
                stage, detail = got
                if stage == "restated":  # passed, with the model's own statement for the checker
                    restated += 1
                    if args.show_restated and label == "default":
                        ref = " ".join(c.task.formal_statement.split())
                        listed.append(
                            f"  restated      {source}/{c.name}:\n      reference: {ref}\n"
                            f"      model:     {' '.join(detail.split())}"
                        )
                    continue
                if by_design(stage, detail, policy):
                    design += 1
                    listed.append(f"  on purpose    {source}/{c.name}: {stage}: {detail[:150]}")
                else:
                    false += 1
                    listed.append(f"  FALSE REJECT  {source}/{c.name}: {stage}: {detail[:150]}")
            total += len(mine)
            false_total += false
            design_total += design
            restated_total += restated
            print(f"{source:44} {len(mine):>6} {false:>14} {design:>19} {restated:>9}")
        if args.judge and label == "default":
            f, r, lines = judge_with_lean(all_cases, policy, args.workers)
            false_total += f
            listed += lines
            print(f"{'real judge (kernel)':44} {'':>6} {f:>14} {'':>19} {r:>9}")
        rate = 100.0 * false_total / max(total, 1)
        print(f"{'all':44} {total:>6} {false_total:>14} {design_total:>19} {restated_total:>9}")
        print(f"false-reject rate: {false_total}/{total} = {rate:.2f}%")
        print("\n".join(listed))
        failed = failed or (label == "default" and false_total > 0)
    return 1 if failed and args.fail_on_false_rejects else 0


if __name__ == "__main__":
    from leanrl.errors import LeanNotFoundError

    try:
        raise SystemExit(main())
    except LeanNotFoundError as e:
        print(f"--judge needs a real Lean: {e}", file=sys.stderr)
        raise SystemExit(2) from None
