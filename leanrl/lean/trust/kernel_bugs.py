"""The Lean kernel soundness bugs known for the toolchains leanrl's tasksets pin, and what stops each.

A replay through the *same* kernel cannot catch a bug of that kernel, so the judge keeps attempts
away from the shapes each known bug needs. This table is the list a reviewer checks that claim
against: every row names the bug (lean4 issues and the fixing pull requests), the first release
with the fix, the pinned toolchains it affects, what an attacker must give the kernel, and the
rule of the judge that stops it. ``tests/test_trust_restatement.py`` runs one test per row over the
checker's report (the rule turns the report into a rejection) or its source (the guard is there);
``docs/verification.md`` prints the same table.

Read against the lean4 issue tracker and the release notes (the reference manual's
``Releases/v4_*.lean``) on 2026-12-06; "unverified" marks what could not be confirmed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["KERNEL_BUGS", "PINNED", "KernelBug", "Rule"]

PINNED: tuple[str, ...] = ("v4.8.0-rc1", "v4.9.0", "v4.20.0", "v4.24.0", "v4.27.0")
"""The Lean versions the built-in tasksets pin (``tests/test_trust_restatement.py`` checks the list
against the tasksets)."""

Rule = Literal[
    "free_variable",
    "metavariable",
    "bad_projection",
    "not_safe",
    "kernel_internal_name",
    "too_deep",
    "new_inductives",
    "memory_cap",
    "restatement",
    "literal_bound",
    "none",
]
"""What stops a bug: a shape status of the checker (refused before ``addDecl``:
``free_variable`` ... ``too_deep``), the refusal of new inductive types (``new_inductives``,
unless a taskset sets ``allow_new_inductives``), the judge's memory cap (``memory_cap``), the two
independent checks of a restated statement (``restatement``), the bound on literal arithmetic in
a restated statement together with the pool's ``judge_limit`` (``literal_bound``: these rows cost
the judge process, not soundness), or nothing (``none``: a residual risk, stated in the docs)."""


@dataclass(frozen=True)
class KernelBug:
    """One known kernel soundness bug (or, for ``literal_bound`` rows, a way to kill the judge)."""

    issues: str
    """The lean4 issues and pull requests that describe and fix it."""
    fixed_in: str
    """The first Lean release with the fix (``unverified`` where none could be confirmed)."""
    affects: tuple[str, ...]
    """The pinned versions (:data:`PINNED`) it affects."""
    shape: str
    """What an attacker must give the kernel."""
    rules: tuple[Rule, ...]
    """What stops it in leanrl's judge (see :data:`Rule`); ``("none",)`` when nothing does."""


_ALL = PINNED

KERNEL_BUGS: tuple[KernelBug, ...] = (
    KernelBug(
        "lean4#14484 (fix #14498)",
        "v4.32.1",
        _ALL,
        "an opaque constant whose value holds a free variable (its value was never checked for one)",
        ("free_variable",),
    ),
    KernelBug(
        "lean4#12746, #13602, #13618 (fix #14632)",
        "v4.33.0",
        _ALL,
        "a projection `Expr.proj S i e` with an index of 2^32 or more, truncated by the kernel",
        ("bad_projection",),
    ),
    KernelBug(
        "lean4#14631",
        "v4.33.0",
        _ALL,
        "two projections of the same index and term that name different structures (defeq "
        "ignored the name); needs an ill-typed projection first",
        ("bad_projection", "new_inductives"),
    ),
    KernelBug(
        "lean4#14576 (fix #14577)",
        "v4.32.2",
        _ALL,
        "a new nested inductive whose nested occurrence has ill-typed parameters",
        ("new_inductives",),
    ),
    KernelBug(
        "lean4#14582",
        "v4.33.1",
        _ALL,
        "a new inductive that occurs applied to other than its parameters (non-uniform)",
        ("new_inductives",),
    ),
    KernelBug(
        "lean4#14607",
        "v4.33.0",
        _ALL,
        "a new nested inductive whose constructor types hold free variables or metavariables",
        ("new_inductives", "free_variable", "metavariable"),
    ),
    KernelBug(
        "lean4#14613, #14615",
        "v4.33.0",
        _ALL,
        "a new inductive in `Sort (imax 1 0)` with a data field projected out of a proof",
        ("new_inductives",),
    ),
    KernelBug(
        "lean4#14616 (hardening #14620, #14621)",
        "v4.33.0",
        _ALL,
        "a new nested inductive naming a kernel auxiliary `_nested` type",
        ("kernel_internal_name", "new_inductives"),
    ),
    KernelBug(
        "lean4#14806",
        "v4.33.1",
        _ALL,
        "an order-dependent answer of the kernel's defeq cache; the known exploits build a new "
        "inductive whose recursor hits a crafted hash collision",
        ("new_inductives", "restatement"),
    ),
    KernelBug(
        "lean4#14807, #14843, #14847",
        "v4.33.1",
        _ALL,
        "a new inductive family whose sort is stuck, then a data field recovered from a proof",
        ("new_inductives",),
    ),
    KernelBug(
        "lean4#8695",
        "unverified",
        ("v4.8.0-rc1", "v4.9.0", "v4.20.0"),
        "a new inductive with a constructor named like its recursor (`I.rec`)",
        ("new_inductives",),
    ),
    KernelBug(
        "lean4#14608, #14609",
        "v4.33.0",
        _ALL,
        "unsafe or partial declarations (mismatched universes in a mutual block; `partial` lost "
        "across modules)",
        ("not_safe",),
    ),
    KernelBug(
        "lean4#8554 (fixes #8559, #8560)",
        "v4.21.0",
        ("v4.8.0-rc1", "v4.9.0", "v4.20.0"),
        "a loose bound variable index of 2^20 or more, or a universe level deeper than 2^24: the "
        "object's cached flags read zero, the kernel's included",
        ("too_deep",),
    ),
    KernelBug(
        "lean4#14838; #15241, #15289",
        "v4.33.1; v4.34.1",
        _ALL,
        "terms big enough to overflow a 32-bit reference count (about 18 GB in one process; "
        "#15289 over 100 GB)",
        ("memory_cap",),
    ),
    KernelBug(
        "lean4#8060",
        "v4.20.0",
        (),
        "`Nat.pow` of a closed base that is not a literal, read as a number (introduced by "
        "#4637 in v4.11.0: v4.11 to v4.19 only; v4.9's kernel reduced `Nat.pow` of two literals "
        "only); restated as `if <stuck pow> = 0 then True else P`, any statement",
        ("restatement",),
    ),
    KernelBug(
        "lean4#14833",
        "v4.33.1",
        _ALL,
        "a corner case of GMP 6.1.2, which the official Linux builds linked (which operation is "
        "unverified)",
        ("literal_bound", "none"),
    ),
    KernelBug(
        "lean4#10475",
        "v4.25.0",
        ("v4.8.0-rc1", "v4.9.0", "v4.20.0", "v4.24.0"),
        "a `let` whose type depends on an earlier `let`: the inferred type holds a stray free "
        "variable (no exploit known)",
        ("none",),
    ),
    KernelBug(
        "kernel `Nat.shiftLeft` by 2^32 or more; `Nat.pow` without an exponent cap before v4.11 "
        "(#4637)",
        "not a soundness bug",
        _ALL,
        "literal arithmetic that aborts the process (`lean_internal_panic`) or exhausts memory "
        "while the kernel or `whnf` evaluates it: `1 <<< 4294967296` in a restated statement",
        ("literal_bound",),
    ),
)
"""The known kernel bugs of the pinned toolchains, and the rules that stop them."""
