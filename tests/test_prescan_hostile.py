"""Hostile text: the pre-scan, the lexer and extraction never raise, and never recurse unbounded
(issue 19, item 6).

Deep nesting of every kind (a tactic configuration, a term, a ``calc``, attributes, comments,
interpolated strings) is judged at depths 10, 1000 and 100000, through the whole-proof path
(``judge_prescan`` on an attempt) and the tactic-mode path (``prescan_tactic`` and a local
tactic session's ``apply``), and extracted. A seeded generator then mixes the hostile shapes with
Lean-ish tokens for 10,000 texts. The linear cost is measured by ``benchmarks/prescan_scaling.py``
(no timed assertion here); what is checked here is that the rewritten walks give the results
the old ones gave (``_unwrap``, the fence readers) and that extraction runs off the event loop.
"""

from __future__ import annotations

import ast
import asyncio
import random
import re
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from leanrl import HarnessConfig, SamplingConfig, Taskset, TasksetConfig
from leanrl.harnesses.tactic_loop import TacticLoopHarness, extract_tactics
from leanrl.harnesses.tactic_loop import harness as tactic_harness
from leanrl.harnesses.whole_proof import WholeProofHarness, extract_proof
from leanrl.harnesses.whole_proof.extract import Extracted, _atom, _fenced, _unwrap, strip_reasoning
from leanrl.harnesses.whole_proof.harness import INLINE_CHARS
from leanrl.lean.tactic_input import prescan_tactic
from leanrl.lean.trust.lexer import Kind, tokenize, too_many_tokens
from leanrl.lean.trust.rules import judge_prescan
from leanrl.lean.trust.syntax import MAX_NESTING, Finding, scan
from leanrl.policy import Completion
from leanrl.runtime import TacticState
from leanrl.runtimes.local import LocalTacticSession
from leanrl.task import Task
from leanrl.verdict import Attempt, Reason, VerificationPolicy
from tests._scripted_runtime import ScriptedPolicy, ScriptedRuntime

REPO = Path(__file__).resolve().parent.parent
TASK = Task(name="t", header="import Mathlib\n", formal_statement="theorem t : True := by")
# Long enough for the deepest texts: the size limit is another rule, tested elsewhere.
POLICY = VerificationPolicy(max_proof_chars=10_000_000)


def _nest(opener: str, inner: str, closer: str, depth: int) -> str:
    return opener * depth + inner + closer * depth


# kind -> (tactic text at a depth, whether deep nesting of it is refused)
NESTED: dict[str, tuple[Callable[[int], str], bool]] = {
    "config": (lambda d: f"simp (config := {_nest('{a := ', '1', '}', d)})", True),
    "config_parens": (lambda d: f"simp (config := {_nest('(', '1', ')', d)})", True),
    "term": (lambda d: "exact " + _nest("(", "trivial", ")", d), True),
    "anonymous_constructor": (lambda d: "exact " + _nest("⟨", "trivial", "⟩", d), True),
    "calc": (lambda d: "calc 1 = 1 := " + _nest("(by calc 1 = 1 := ", "rfl", ")", d), True),
    "attribute": (
        lambda d: "have := @[to_additive " + _nest("(attr := to_additive ", "simp", ")", d) + "] 1",
        True,
    ),
    # Lean reads nested comments with a counter, as the lexer does: any depth is fine.
    "comments": (lambda d: _nest("/- ", "c", " -/", d) + "\ntrivial", False),
    "interpolated_strings": (
        lambda d: "have s := " + _nest('s!"{', "1", '}"', d) + "\ntrivial",
        True,
    ),
}
# 300 is just past MAX_NESTING. The deepest texts are read for the kinds whose levels are
# cheapest to read (100000 levels of a `calc` are 600,000 tokens: seconds on a small machine).
CASES = [(kind, depth) for kind in NESTED for depth in (10, 300, 1000)] + [
    (kind, 100_000) for kind in ("term", "comments", "interpolated_strings")
]


class _Worker:
    """Stands in for a REPL process: answers every tactic that gets past the pre-scan."""

    def __init__(self) -> None:
        self.applied: list[str] = []

    async def tactic_apply(self, proof_state: int, tactic: str, timeout: float) -> TacticState:
        self.applied.append(tactic)
        return TacticState(proof_state=proof_state + 1, goals=())


def _refused_for_depth(why: str) -> bool:
    return "nested deeper than" in why or "nested too deeply" in why


@pytest.mark.parametrize(("kind", "depth"), CASES)
async def test_deep_nesting_is_judged_never_raised(kind: str, depth: int) -> None:
    build, refused = NESTED[kind]
    tactic = build(depth)
    # One text for both paths (the whole-proof scan reads preamble, statement, proof joined by
    # newlines), so the lexer reads it once.
    text = "\n\n" + tactic
    attempt = Attempt(
        name="t", header=TASK.header, formal_statement=TASK.formal_statement, proof=tactic,
        policy=POLICY,
    )  # fmt: skip
    verdict = judge_prescan(attempt)
    # tactic mode: the local runtime's session pre-scans each tactic (`prescan_tactic`)
    worker = _Worker()
    session = LocalTacticSession(worker, TASK.header, 5.0, POLICY)  # type: ignore[arg-type]
    state = await session.apply(0, text)
    if too_many_tokens(tokenize(text)):
        # past the lexer's token bound the size answers first, before any nesting is read
        assert verdict is not None and verdict.reason is Reason.TOO_LARGE, verdict
        assert state.error is not None and state.error.startswith("pre-scan (too_large)")
        assert worker.applied == []
    elif depth <= 16 or not refused:
        assert verdict is None, verdict
        assert state.error is None and worker.applied == [text]
    else:
        assert verdict is not None and verdict.reason is Reason.FORBIDDEN
        assert _refused_for_depth(verdict.detail), verdict.detail
        assert state.error is not None and state.error.startswith("pre-scan (forbidden)")
        assert _refused_for_depth(state.error) and worker.applied == []  # never reached Lean
    if depth <= 1000 or not refused:  # (extraction reads the text four times over)
        out = extract_proof(f"```lean4\ntheorem t : True := by\n  {tactic}\n```", TASK)
        assert isinstance(out, Extracted)
        assert out.reason is None and out.proof is not None


def test_the_bound_is_on_depth_not_on_length() -> None:
    just = "exact " + _nest("(", "trivial", ")", MAX_NESTING)
    assert scan(just, POLICY) == []
    assert scan(just + "\nexact " + _nest("(", "x", ")", MAX_NESTING), POLICY) == []
    over = scan("exact " + _nest("(", "trivial", ")", MAX_NESTING + 1), POLICY)
    assert [f.token for f in over] == [f"( nested deeper than {MAX_NESTING}"]
    assert over[0].reason is Reason.FORBIDDEN and over[0].line == 1
    # a taskset cannot waive it by the name its finding shows, as it cannot waive a lexing error
    waiving = VerificationPolicy(prescan_allow=(over[0].token,))
    assert scan("exact " + _nest("(", "trivial", ")", MAX_NESTING + 1), waiving) == over


def test_a_failure_inside_the_scan_is_a_refusal(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from leanrl.lean.trust import syntax

    def boom(*args: object, **kwargs: object) -> object:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(syntax, "tokenize", boom)
    [f] = scan("simp", POLICY)
    assert f.reason is Reason.FORBIDDEN and "RecursionError" in f.why
    assert "pre-scan failed" in caplog.text  # a bug of the pre-scan: logged, with its traceback
    verdict = judge_prescan(
        Attempt(name="t", header="", formal_statement=TASK.formal_statement, proof="simp")
    )
    assert verdict is not None and verdict.reason is Reason.FORBIDDEN
    assert prescan_tactic("simp", POLICY) is not None


# -- no recursion left unbounded -----------------------------------------------------------------

# Functions that call themselves (directly or through others), each with its bound: the
# configuration literal and `(attr := ...)` walks (`_MAX_CONFIG_DEPTH`), and interpolated strings
# inside interpolated strings (the lexer's `_MAX_DEPTH`).
BOUNDED = {
    "leanrl/lean/trust/syntax.py": {"_literal", "_literal_at", "attribute"},
    "leanrl/lean/trust/lexer.py": {"run", "token", "string", "_interpolated"},
    "harnesses/whole_proof/extract.py": set(),
    "harnesses/tactic_loop/harness.py": set(),
}


def _recursive(source: str) -> set[str]:
    """Names of the functions in ``source`` that can reach themselves through calls (by name:
    ``f(...)``, ``self.f(...)`` and ``probe.f(...)`` count as calls of any ``f`` defined here;
    ``self.seen.add(...)`` and ``super().__init__(...)`` do not)."""
    tree = ast.parse(source)
    defs: dict[str, list[ast.AST]] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            defs.setdefault(node.name, []).append(node)
    calls: dict[str, set[str]] = {}
    for name, nodes in defs.items():
        out: set[str] = set()
        for fn in nodes:
            for sub in ast.walk(fn):
                if isinstance(sub, ast.Call):
                    f = sub.func
                    callee = None
                    if isinstance(f, ast.Name):
                        callee = f.id
                    elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
                        callee = f.attr
                    if callee in defs:
                        out.add(callee)
        calls[name] = out
    found = set()
    for start in defs:
        seen, todo = set(), list(calls[start])
        while todo:
            n = todo.pop()
            if n == start:
                found.add(start)
                break
            if n not in seen:
                seen.add(n)
                todo.extend(calls[n])
    return found


@pytest.mark.parametrize("path", list(BOUNDED))
def test_every_recursive_walk_is_a_bounded_one(path: str) -> None:
    assert _recursive((REPO / path).read_text()) == BOUNDED[path]


# -- a seeded generator of hostile text ----------------------------------------------------------

_TOKENS = [
    "theorem t", "theorem u", "lemma t", "def f", " : ", "True", ":=", " by", "\n", "\n  ", "  ",
    "(", ")", "[", "]", "{", "}", "⟨", "⟩", "@[", "simp", "omega", "trivial", "exact", "calc",
    "_ = 1 := rfl", "open Nat in\n", "set_option maxHeartbeats 400000 in\n", "namespace A\n",
    "end\n", "end A\n", "section\n", "/-", "-/", "--", "/--", "/-!", '"', "\\", '\\"', "\\x4",
    "s!", "m!", "'", "''", "∑'", "«", "»", "`", "```", "```lean4\n", "<think>", "</think>",
    "#eval", "#check", "sorry", "native_decide", "(config := ", "(maxSteps := 1)", "{a := ",
    "(attr := ", "to_additive", "notation", "macro", "x.1", "h.2.1", "0x1F", "1e5", "é", "ℝ≥0",
    "\t", "\r\n", "\r", "fun x =>", "match", "with", "| _ =>", "let y := 1;", "r#\"", "\"#",
    "private", "noncomputable", "import Mathlib\n", ";", "<;>", "·", "←", "⁻¹'", "//", "+-",
]  # fmt: skip


def _hostile(rng: random.Random) -> str:
    """One fragment: a hostile shape at a random small size, or a few plain tokens."""
    d = rng.choice((1, 2, 3, 8, 17, 33)) if rng.random() < 0.99 else MAX_NESTING + 1
    k = rng.randint(1, 4)
    shape = rng.randrange(14)
    if shape == 0:
        return "open Nat in\n" * k
    if shape == 1:
        return _nest(rng.choice("([{⟨"), rng.choice(("x", "1", "")), rng.choice(")]}⟩"), d)
    if shape == 2:
        return "calc 1 = 1 := rfl\n" + "  _ = 1 := rfl\n" * k
    if shape == 3:
        return _nest("/- ", "", " -/", d) if rng.random() < 0.8 else "/- " * d
    if shape == 4:
        return "a" * rng.randint(1, 40)
    if shape == 5:
        return "set_option maxHeartbeats 0 in " * k
    if shape == 6:
        return '"' + "".join(rng.choice(("\\n", '\\"', "\\x41", "\\u0041", "{", "}", "x")) for _ in range(k)) + '"'  # fmt: skip
    if shape == 7:
        return "@[simp, norm_cast] " * k
    if shape == 8:
        return "simp (config := " + _nest("{a := ", "1", "}", d) + ")"
    if shape == 9:
        return "simp " + "(maxSteps := 1) " * k
    if shape == 10:
        return _nest('s!"{', "x", '}"', min(d, 20))
    if shape == 11:
        return "@[to_additive " + _nest("(attr := to_additive ", "simp", ")", min(d, 40)) + "]"
    if shape == 12:
        return "```" * k
    return "".join(rng.choice(_TOKENS) for _ in range(k))


def _check_findings(found: object) -> None:
    assert isinstance(found, list)
    for f in found:
        assert isinstance(f, Finding) and isinstance(f.reason, Reason)
        assert isinstance(f.token, str) and isinstance(f.why, str) and f.why
        assert isinstance(f.line, int) and f.line >= 1


def test_ten_thousand_hostile_texts_never_raise() -> None:
    rng = random.Random(20260119)
    notation = VerificationPolicy(allow_notation=True)
    for case in range(10_000):
        text = "".join(_hostile(rng) for _ in range(rng.randint(1, 3)))
        _check_findings(scan(text, notation if case % 5 == 0 else POLICY))
        style = case % 3
        answer = text if style else f"```lean4\ntheorem t : True := by\n{text}\n```"
        out = extract_proof(
            answer,
            TASK,
            finish_reason=rng.choice(("stop", "length", None)),
            completion_style=style == 2,
        )
        assert isinstance(out, Extracted)
        assert (out.proof is None) == (out.reason is not None)
        assert isinstance(out.preamble, str) and isinstance(out.restated_statement, str)
        assert isinstance(extract_tactics(text, chat=case % 2 == 0), str)


def test_comments_kept_or_not_give_the_same_code() -> None:
    # `code_only`/`mask_comments` lex with comments kept, the pre-scan without: the tokens that
    # are code must be the same both ways (comments are whitespace, also to what looks back).
    rng = random.Random(7)
    for _ in range(2000):
        text = "".join(rng.choice(_TOKENS) for _ in range(rng.randint(0, 20)))
        plain = tokenize(text)
        kept = [t for t in tokenize(text, keep_comments=True) if t.kind is not Kind.COMMENT]
        assert plain == kept, text


# -- the rewritten walks give the old results ----------------------------------------------------


def _match(words: list[str], a: int) -> int:
    depth = 0
    for j in range(a, len(words)):
        if words[j] == "(":
            depth += 1
        elif words[j] == ")":
            depth -= 1
            if depth == 0:
                return j
    return -1


def _unwrap_reference(words: list[str], colon: int) -> list[str]:
    """The rule as first written: rescan from the start after each removal (cubic)."""
    changed = True
    while changed:
        changed = False
        for a, w in enumerate(words):
            if w != "(":
                continue
            b = _match(words, a)
            if b < 0:
                continue
            before = words[a - 1] if a > 0 else ""
            after = words[b + 1] if b + 1 < len(words) else ""
            closes = after in (")", "]", "}", "⟩", "")
            if (
                (before == "(" and after == ")")
                or (before == ":" and closes)
                or (b == a + 2 and a > colon and _atom(words[a + 1]))
            ):
                del words[b]
                del words[a]
                if a < colon:
                    colon -= 2
                changed = True
                break
    return words


def test_unwrap_removes_the_same_parentheses_as_the_rescanning_rule() -> None:
    rng = random.Random(3)
    alphabet = ["(", "(", "(", ")", ")", ")", ":", "x", "1", "+", "]", "}", "⟩", "a b", "_y"]
    for _ in range(20_000):
        words = [rng.choice(alphabet) for _ in range(rng.randint(0, 24))]
        if rng.random() < 0.5:
            colon = rng.randint(-1, len(words) + 1)  # also where no colon is
        else:
            colon = words.index(":") if ":" in words else len(words)
        assert _unwrap(list(words), colon) == _unwrap_reference(list(words), colon), words
    deep = ["x", ":"] + ["(", "a"] * 120 + ["(", "(", "y", ")", ")"] * 30 + [")"] * 120
    assert _unwrap(list(deep), 1) == _unwrap_reference(list(deep), 1)


_FENCE_OPEN = re.compile(r"```[ \t]*([\w+\-]*)[^\n]*\n")


def _fenced_reference(text: str) -> tuple[str | None, bool]:
    blocks: list[tuple[str, str]] = []
    pos, unclosed_from = 0, None
    while (m := _FENCE_OPEN.search(text, pos)) is not None:
        end = text.find("```", m.end())
        if end < 0:
            unclosed_from = m.end()
            break
        blocks.append((m.group(1).lower(), text[m.end() : end]))
        pos = end + 3
    if unclosed_from is not None:
        return text[unclosed_from:], True
    lean = [c for lang, c in blocks if lang in ("lean4", "lean")]
    bare = [c for lang, c in blocks if lang == ""]
    return (lean[-1] if lean else bare[-1] if bare else None), False


def _tactics_reference(text: str, chat: bool) -> str:
    body, problem = strip_reasoning(text)
    if problem is not None:
        return ""
    if not chat:
        return textwrap.dedent(body.split("```", 1)[0]).strip("\n").rstrip()
    blocks = re.findall(r"```[ \t]*(?:lean4|lean)?[^\n]*\n(.*?)```", body, flags=re.S)
    return textwrap.dedent(blocks[-1] if blocks else body).strip("\n").rstrip()


def test_fences_are_found_as_the_patterns_found_them() -> None:
    rng = random.Random(5)
    pieces = ["```", "`", "\n", " ", "\t", "lean4", "lean", "LEAN", "py", "x", "é", "+-", "``"]
    for _ in range(20_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 16)))
        assert _fenced(text) == _fenced_reference(text), text
        for chat in (True, False):
            assert extract_tactics(text, chat) == _tactics_reference(text, chat), text


# -- extraction runs off the event loop ---------------------------------------------------------


def _off_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return True
    return False


PAD = " " * INLINE_CHARS  # after the code block: a batch this long is read in a worker thread


async def test_whole_proof_extraction_runs_off_the_event_loop() -> None:
    seen: list[bool] = []

    class Watched(WholeProofHarness):
        def extract(self, task: Task, completion: Completion) -> Extracted:
            seen.append(_off_loop())
            return super().extract(task, completion)

    texts = ["```lean4\ntheorem t : True := by\n  trivial\n```", "no code", "```lean4\nsimp\n```"]
    h = Watched(HarnessConfig(name="whole-proof", prompt_format="chat"))
    for pad, off in (("", False), (PAD, True)):  # a short batch is read at once, inline
        seen.clear()
        policy = ScriptedPolicy([t + pad for t in texts])
        groups = await h.generate([TASK, TASK], policy, SamplingConfig(n=3))
        assert seen == [off] * 6
        assert [[r.proof for r in g] for g in groups] == [["\n  trivial", None, "\n  simp"]] * 2
        assert [r.sample for r in groups[0]] == [0, 1, 2]


async def test_tactic_extraction_runs_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bool] = []

    def watched(text: str, chat: bool) -> str:
        seen.append(_off_loop())
        return extract_tactics(text, chat)

    monkeypatch.setattr(tactic_harness, "extract_tactics", watched)
    policy = ScriptedPolicy([], per_turn=["```lean4\nintro y\n```" + PAD, "omega" + PAD])
    cfg = HarnessConfig(
        name="tactic-loop", prompt_format="chat", max_turns=4, max_total_tokens=10**6
    )
    groups = await TacticLoopHarness(cfg).run(
        [TASK], policy, ScriptedRuntime(), SamplingConfig(n=2, seed=1), Taskset(TasksetConfig())
    )
    assert seen == [True] * 4  # two turns of two episodes
    assert [r.proof for r in groups[0]] == ["\n  intro y\n  omega"] * 2
