"""Time per character of the pre-scan and of proof extraction on hostile text, by size.

Both read text a model wrote, so both must cost time linear in its length whatever its shape:
a shape that costs 10,000 times more at 1M characters than at 10k (instead of 100 times) is a
way for one completion to stall a training step or a service. Each shape below is built at each
size (10k, 100k, 1M characters by default) and given to

* the pre-scan, :func:`leanrl.lean.trust.syntax.scan` (what ``judge_prescan`` runs for whole
  proofs, which first refuses text over ``max_proof_chars``, 200k by default, and what
  ``prescan_tactic`` runs on every tactic in tactic mode, with no size limit);
* extraction, :func:`leanrl.harnesses.whole_proof.extract.extract_proof`, on the shape as the
  model's answer (in a ```` ```lean4 ```` block unless the shape is about the fences).

The table gives min/median/max µs per character over ``--repeats`` runs, and per shape and
function the ratio of the median time at the largest size to that at the smallest (linear: about
the size ratio, 100 for 1M/10k). A call that raises is reported as such (the pre-scan must not
raise at all). A shape whose call takes longer than ``--max-seconds`` at one size is not run at
the larger ones.

Every entry point that reads model text bounds it before scanning: ``judge_prescan`` and
``prescan_tactic`` refuse text over ``max_proof_chars`` (200k) and the lexer stops after
``MAX_TOKENS`` (65,536) tokens, which they and extraction report as ``too_large``; extraction
refuses an output over ``MAX_TEXT_CHARS`` (1M). ``--at-cap`` measures those entry points
themselves (``judge_prescan``, ``prescan_tactic``, ``extract_proof``) on every shape at the
largest size each reads (just under the character cap, so the token bound is what stops the
dense shapes), and prints the slowest call of each: wall and CPU seconds, min/median/max.

    python benchmarks/prescan_scaling.py            # 10k, 100k, 1M; 3 repeats
    python benchmarks/prescan_scaling.py --quick    # 10k, 100k; 1 repeat
    python benchmarks/prescan_scaling.py --shapes open_in,calc --sizes 10000,200000
    python benchmarks/prescan_scaling.py --at-cap   # the entry points at their caps
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from leanrl.harnesses.whole_proof.extract import extract_proof
from leanrl.lean.tactic_input import prescan_tactic
from leanrl.lean.trust.lexer import _tokenize
from leanrl.lean.trust.rules import judge_prescan
from leanrl.lean.trust.syntax import scan
from leanrl.task import Task
from leanrl.verdict import Attempt, VerificationPolicy

TASK = Task(id="t", name="t", header="import Mathlib\n", formal_statement="theorem t : True := by")
THEOREM = "theorem t : True := by\n  trivial\n"


def _times(unit: str, n: int, fixed: int = 0) -> int:
    return max(1, (n - fixed) // len(unit))


def _repeat(unit: str, n: int, before: str = "", after: str = "") -> str:
    return before + unit * _times(unit, n, len(before) + len(after)) + after


def _nest(opener: str, inner: str, closer: str, n: int, before: str, after: str = "") -> str:
    d = _times(opener + closer, n, len(before) + len(after) + len(inner))
    return before + opener * d + inner + closer * d + after


# name -> (builder of about n characters of Lean, whether extraction gets it in a code block)
SHAPES: dict[str, tuple[Callable[[int], str], bool]] = {
    "open_in": (lambda n: _repeat("open Nat in\n", n, after=THEOREM), True),
    "brackets": (
        lambda n: _nest("(", "trivial", ")", n, "theorem t : True := by\n  exact "),
        True,
    ),
    "config_brackets": (
        lambda n: _nest("{a := ", "1", "}", n, "theorem t : True := by\n  simp (config := ", ")"),
        True,
    ),
    "calc": (
        lambda n: _repeat(
            "    _ = 1 := rfl\n", n, "theorem t : 1 = 1 := by\n  calc 1 = 1 := rfl\n"
        ),
        True,
    ),
    "nested_comments": (
        lambda n: _nest("/- ", "c ", "-/ ", n, "theorem t : True := by\n  ", "\n  trivial\n"),
        True,
    ),
    "identifier": (lambda n: _repeat("a", n, "theorem t : True := by\n  exact "), True),
    "set_option_in": (
        lambda n: _repeat("set_option maxHeartbeats 400000 in\n", n, after=THEOREM),
        True,
    ),
    "string_escapes": (
        lambda n: _repeat(
            '\\n\\"\\x41\\u0041 ', n, 'theorem t : True := by\n  have s := "', '"\n  trivial\n'
        ),
        True,
    ),
    "attribute_lists": (lambda n: _repeat("@[simp, norm_cast] ", n, after=THEOREM), True),
    # shapes that were quadratic or worse before issue 19
    "config_items": (
        lambda n: _repeat("(maxSteps := 1) ", n, "theorem t : True := by\n  simp "),
        True,
    ),
    "doc_comment_words": (lambda n: _repeat("def ", n, "/-- ", "-/\n" + THEOREM), True),
    "stray_ends": (lambda n: _repeat("end\n", n, after=THEOREM), True),
    "backticks": (lambda n: _repeat("```", n), False),
    "interpolation": (
        lambda n: _repeat("{x} ", n, 'theorem t : True := by\n  have s := s!"', '"\n  trivial\n'),
        True,
    ),
    # shapes of issue 35: one token per character, and a block of `end` lines
    "projections": (lambda n: _repeat("x.1", n, "theorem t : True := by\n  exact "), True),
    "end_lines": (lambda n: _repeat("end\n", n), True),
}


def _time(fn: Callable[[], object]) -> tuple[float, str]:
    # The lexer keeps the last texts it read (the pre-scan and extraction read the same text
    # more than once): each measured call starts without them, as a new completion does.
    _tokenize.cache_clear()
    t0 = time.perf_counter()
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - reported in the table
        return time.perf_counter() - t0, type(e).__name__
    return time.perf_counter() - t0, ""


@dataclass
class Row:
    """One shape, function and size, measured."""

    shape: str
    fn: str
    size: int
    chars: int
    """Characters given to the function (extraction gets the code block's fences too)."""
    seconds: list[float]
    """One per repeat."""
    raised: str
    """The exception a call raised ('' when none)."""


def _call(what: str, text: str, policy: VerificationPolicy) -> Callable[[], object]:
    if what == "scan":
        return lambda: scan(text, policy)
    return lambda: extract_proof(text, TASK)


def measure(shapes: list[str], sizes: list[int], repeats: int, max_seconds: float) -> list[Row]:
    """Every shape, function and size, ``repeats`` times (after one warm-up call per shape and
    function); a shape stops growing once a call takes over ``max_seconds``."""
    policy = VerificationPolicy()
    rows: list[Row] = []
    for name in shapes:
        build, fenced = SHAPES[name]
        for what in ("scan", "extract"):
            for size in sizes:
                code = build(size)
                text = code if what == "scan" or not fenced else f"```lean4\n{code}\n```"
                fn = _call(what, text, policy)
                if size == sizes[0]:
                    _time(fn)  # warm-up: imports, caches, compiled patterns
                runs = [_time(fn) for _ in range(repeats)]
                secs = [s for s, _ in runs]
                raised = next((e for _, e in runs if e), "")
                rows.append(Row(name, what, size, len(text), secs, raised))
                print(
                    f"  {name:18} {what:8} {len(text):>9,} chars  "
                    f"{statistics.median(secs):8.3f} s{'  raised ' + raised if raised else ''}",
                    file=sys.stderr,
                    flush=True,
                )
                if min(secs) > max_seconds:
                    break  # larger sizes would take too long: not run
    return rows


def at_cap(shapes: list[str], repeats: int) -> str:
    """Each entry point that reads model text, on every shape at the largest size it reads in
    full (just under ``max_proof_chars``; extraction gets the shape in a code block): the
    slowest shape's wall and CPU seconds per call, min/median/max over ``repeats``."""
    policy = VerificationPolicy()
    cap = policy.max_proof_chars - 64

    def entries(code: str, fenced: bool) -> dict[str, Callable[[], object]]:
        attempt = Attempt(name="t", header="", formal_statement="", proof=code)
        block = f"```lean4\n{code}\n```" if fenced else code
        return {
            "judge_prescan": lambda: judge_prescan(attempt),
            "prescan_tactic": lambda: prescan_tactic(code, policy),
            "extract_proof": lambda: extract_proof(block, TASK),
        }

    worst: dict[str, tuple[str, list[float], list[float]]] = {}
    for name in shapes:
        build, fenced = SHAPES[name]
        for what, fn in entries(build(cap), fenced).items():
            walls: list[float] = []
            cpus: list[float] = []
            for _ in range(repeats):
                _tokenize.cache_clear()
                c0 = time.process_time()
                t0 = time.perf_counter()
                fn()
                walls.append(time.perf_counter() - t0)
                cpus.append(time.process_time() - c0)
            if what not in worst or statistics.median(cpus) > statistics.median(worst[what][2]):
                worst[what] = (name, walls, cpus)
    lines = [f"at the cap ({cap:,} characters): the slowest shape per entry point, seconds"]
    lines.append(
        f"{'entry point':16} {'shape':14} {'wall min/med/max':>22} {'CPU min/med/max':>22}"
    )
    for what, (name, walls, cpus) in worst.items():
        w = f"{min(walls):.3f}/{statistics.median(walls):.3f}/{max(walls):.3f}"
        c = f"{min(cpus):.3f}/{statistics.median(cpus):.3f}/{max(cpus):.3f}"
        lines.append(f"{what:16} {name:14} {w:>22} {c:>22}")
    return "\n".join(lines)


def table(rows: list[Row], sizes: list[int]) -> str:
    """The rows as text: µs/char min/median/max per size, and the time ratio largest/smallest."""
    head = f"{'shape':18} {'fn':8}"
    for s in sizes:
        head += f" | {_size(s) + ' µs/char (min/med/max)':>27}"
    head += f" | {_size(sizes[-1]) + '/' + _size(sizes[0]):>9}"
    lines = [head, "-" * len(head)]
    by: dict[tuple[str, str], dict[int, Row]] = {}
    for r in rows:
        by.setdefault((r.shape, r.fn), {})[r.size] = r
    for (shape, fn), per in by.items():
        line = f"{shape:18} {fn:8}"
        for s in sizes:
            row = per.get(s)
            if row is None:
                line += f" | {'not run':>27}"
                continue
            us = [x * 1e6 / row.chars for x in row.seconds]
            cell = f"{min(us):.2f}/{statistics.median(us):.2f}/{max(us):.2f}"
            if row.raised:
                cell = f"raised {row.raised} {cell}"
            line += f" | {cell:>27}"
        lo, hi = per.get(sizes[0]), per.get(sizes[-1])
        if lo is not None and hi is not None and len(sizes) > 1:  # the ratio of medians
            ratio = statistics.median(hi.seconds) / max(statistics.median(lo.seconds), 1e-9)
            line += f" | {ratio:9.0f}"
        else:
            line += f" | {'':>9}"
        lines.append(line)
    return "\n".join(lines)


def _size(n: int) -> str:
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1000 and n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--sizes", default="10000,100000,1000000", help="characters, comma-separated")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated; all by default")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="10k and 100k characters, one repeat")
    ap.add_argument("--max-seconds", type=float, default=120.0, help="skip larger sizes after")
    ap.add_argument("--json", action="store_true", help="print the measurements as JSON too")
    ap.add_argument(
        "--at-cap", action="store_true", help="time the entry points at their size caps only"
    )
    args = ap.parse_args(argv)
    sizes = [10_000, 100_000] if args.quick else [int(s) for s in args.sizes.split(",")]
    repeats = 1 if args.quick else args.repeats
    shapes = [s for s in args.shapes.split(",") if s]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        ap.error(f"unknown shapes {unknown}; known: {', '.join(SHAPES)}")
    if args.at_cap:
        print(at_cap(shapes, args.repeats))
        return 0
    rows = measure(shapes, sorted(sizes), repeats, args.max_seconds)
    print(table(rows, sorted(sizes)))
    if args.json:
        print(json.dumps([asdict(r) for r in rows]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
