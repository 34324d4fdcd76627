"""Rebuild core.jsonl: the miniF2F statements that need only core Lean (no Mathlib).

A syntactic filter over the miniF2F Lean 4 statements (yangky11/miniF2F-lean4, MIT; the
normalized ``minif2f.jsonl`` with fields name, split, formal_statement, informal_statement,
source). A statement is kept when it talks only about natural numbers and integers with
operations core Lean has (``+ - * / % ^ ∣``, comparisons, connectives, quantifiers, pairs,
function variables, ``Nat.gcd``/``Nat.lcm``). Mathlib's notations ``ℕ``/``ℤ`` become ``Nat``/``Int``
and the header is empty. Usage, from the repository root::

    python environments/core/data/make_core.py path/to/minif2f.jsonl > environments/core/data/core.jsonl

Not every kept statement is known to elaborate or be provable without Mathlib (no Lean was at
hand when it was made); ``ground`` marks closed numeric facts (``decide``/``omega`` material).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Iterator

# Anything outside ℕ/ℤ arithmetic, or a notation or name only Mathlib defines.
_REJECT_CHARS = set("ℝℚℂ∑∏√|!≡π∫⌊⌈∘∈∉⊆∪∩")
_REJECT_WORDS = re.compile(
    r"\b(Real|Rat|Complex|Finset|Set|List|Multiset|Polynomial|Prime|Even|Odd|digits|sqrt|abs|"
    r"floor|ceil|choose|factorial|log|exp|sin|cos|tan|card|range|Icc|Ico|Ioo|Ioc|ZMod|Fin|"
    r"Function|deriv|Matrix|IsLeast|IsGreatest|sSup|sInf|Nat\.succ|Int\.natAbs|Int\.toNat|"
    r"Int\.emod|Int\.fract|Nat\.ModEq|Nat\.divisors|Nat\.totient|Nat\.sqrt|Int\.floor)\b"
)
# Capitalised names a kept statement may use (variables and hypotheses are lower case).
_ALLOWED_NAMES = {"Nat", "Int", "True", "False", "Nat.gcd", "Nat.lcm"}
_DECIMAL = re.compile(r"\d\.\d")


def core_only(statement: str) -> bool:
    """True when ``statement`` uses only what core Lean knows about ℕ and ℤ."""
    if _REJECT_CHARS & set(statement) or _REJECT_WORDS.search(statement):
        return False
    if _DECIMAL.search(statement):
        return False
    body = statement.split(" ", 2)[2] if statement.startswith("theorem ") else statement
    names = set(re.findall(r"(?<![\w.])[A-Z][\w.]*", body))
    return names <= _ALLOWED_NAMES


def to_core(statement: str) -> str:
    """Mathlib's ``ℕ``/``ℤ`` notations spelled the core way."""
    return statement.replace("ℕ", "Nat").replace("ℤ", "Int")


def is_ground(statement: str) -> bool:
    """A closed fact: no binders before the colon (``theorem t : 2 ^ 8 % 5 = 1 := by``)."""
    return re.match(r"theorem\s+\S+\s*:", statement) is not None


def convert(rows: Iterable[dict]) -> Iterator[dict]:
    """The kept rows, in the source's order, with the fields the core taskset ships."""
    for row in rows:
        st = row["formal_statement"]
        if not core_only(st):
            continue
        yield {
            "name": row["name"],
            "split": row["split"],
            "header": "",
            "formal_statement": to_core(st),
            "informal_statement": row.get("informal_statement"),
            "ground": is_ground(st),
            "source": row.get("source"),
        }


def main(path: str) -> None:
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    for out in convert(rows):
        sys.stdout.write(json.dumps(out, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
