"""Pulling a proof out of a model's text.

The result is always the *proof body* (what goes after the statement's ``:= by``) plus optional
helper lemmas (the preamble), or a reason why there is none. The model's text is read with
Lean's own lexical rules (:mod:`leanrl.lean.trust.lexer`): a declaration, ``:=`` or ``end``
inside a comment or string literal is never taken for code, and ``theorem «t»`` is ``theorem t``.

When the model restates the theorem, its statement is compared with the reference as token
streams (comments, layout, ``«»``, ``lemma``/``theorem``, the ``:= by`` and redundant parentheses
do not count). A match puts the proof under the reference statement. A restatement that does not
match is *not* rejected here: it comes back as ``restated_statement`` (the reference's own
definitions before the theorem, such as PutnamBench's ``abbrev ..._solution``, then the model's
theorem), and the trusted checker accepts it only if it elaborates to exactly the reference type
(``statement_changed`` otherwise). What is certainly wrong is rejected here: no theorem with the
task's name, the theorem declared twice, or a redefinition of what the statement is built on.
"""

from __future__ import annotations

import heapq
import re
import textwrap

from pydantic import BaseModel, ConfigDict

from leanrl.lean.trust.lexer import (
    MAX_TOKENS,
    Kind,
    Token,
    bracket_delta,
    code_only,
    tokenize,
    too_many_tokens,
)
from leanrl.task import Task
from leanrl.verdict import Reason

__all__ = [
    "MAX_TEXT_CHARS",
    "Extracted",
    "extract_proof",
    "normalize_statement",
    "strip_reasoning",
]

# The kinds as plain names: on Python 3.11 each `Kind.IDENT` is a slow attribute look-up, and
# these are read for every token.
_IDENT, _SYMBOL, _NUMBER = Kind.IDENT, Kind.SYMBOL, Kind.NUMBER
_STRING, _CHAR, _NAME = Kind.STRING, Kind.CHAR, Kind.NAME
_DOC, _COMMENT, _ERROR = Kind.DOC, Kind.COMMENT, Kind.ERROR


class Extracted(BaseModel):
    """A proof pulled out of a completion, or why none could be."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    proof: str | None = None
    """The tactic block to put under the statement (None when rejected)."""
    preamble: str = ""
    """Helper lemmas/definitions the model wrote before the theorem."""
    restated_statement: str = ""
    """The model's own statement (ending in ``:= by``, after the reference's definitions) when it
    restated the theorem in a way that does not match the reference token for token; empty when
    the proof goes under the reference statement. The trusted checker compares its elaborated
    type with the reference's."""
    reason: Reason | None = None
    """Why nothing can be checked (``no_proof``, ``truncated``, ``statement_changed``)."""
    detail: str = ""
    """One line saying what went wrong."""


# After a fence's backticks: spaces, then its language (the rest of the line is ignored).
_FENCE_LANG = re.compile(r"[ \t]*([\w+\-]*)")
_DECL_LINE = re.compile(
    r"^(?:@\[|theorem\b|lemma\b|def\b|example\b|abbrev\b|instance\b|structure\b|inductive\b|"
    r"noncomputable\b|private\b|protected\b|namespace\b|section\b|end\b|open\b|import\b|#)"
)
_THEOREM_WORDS = ("theorem", "lemma", "example")
_MODIFIERS = frozenset("private protected noncomputable partial nonrec".split())
_DEFINING = tuple("abbrev def theorem lemma instance structure inductive class opaque".split())
# Spellings Lean reads as the same token (`unicodeSymbol`s and notation aliases of core).
_SAME = {
    "->": "→",
    "<-": "←",
    "<->": "↔",
    "<=": "≤",
    ">=": "≥",
    "λ": "fun",
    "↦": "=>",
    "/\\": "∧",
    "\\/": "∨",
    "forall": "∀",
    "lemma": "theorem",
}
MAX_TEXT_CHARS = 1_000_000
"""The longest model output extraction reads; a longer one is ``too_large`` before anything is
scanned. A reasoning model's 32k-token answer is ~130k characters, so this leaves it room. The
code block extraction then lexes is bounded in tokens as well (the lexer's ``MAX_TOKENS``), which
bounds the time of the worst shape whatever the characters (``benchmarks/prescan_scaling.py``)."""
# Bounds on work that grows faster than the text (hostile text can be ~200k characters).
_MAX_UNWRAP = 4000  # statement tokens to drop redundant parentheses from
_MAX_ATTRIBUTE = 200  # tokens in an attribute list in front of a declaration
# Tokens whose meaning depends on whether a space precedes them (`a[i]` is indexing, `a [i]`
# applies `a` to a list; `x.1` is a projection).
_SPACE_MATTERS = frozenset("[ . ! ? ⁻¹".split())


def strip_reasoning(text: str) -> tuple[str, str | None]:
    """Text after the model's ``<think>`` reasoning; second item says if reasoning never ended."""
    if "</think>" in text:
        return text.rsplit("</think>", 1)[1], None
    if "<think>" in text:
        return "", "the <think> reasoning never closed"
    return text, None


def _fenced(text: str) -> tuple[str | None, bool]:
    """(the last Lean code block, whether the last block opened is unclosed).

    A block opens at a ```` ``` ```` with a newline somewhere after it (the language is what
    follows the backticks on that line) and closes at the next ```` ``` ````. Read with
    ``str.find``, never a pattern retried at every ```` ``` ````, so a line of a thousand
    backticks costs its length once."""
    blocks: list[tuple[str, str]] = []
    pos = 0
    unclosed_from: int | None = None
    while True:
        tick = text.find("```", pos)
        if tick < 0:
            break
        newline = text.find("\n", tick + 3)
        if newline < 0:
            break  # no newline after it: nothing opens here, nor at any later backticks
        m = _FENCE_LANG.match(text, tick + 3, newline)
        lang = m.group(1) if m is not None else ""
        start = newline + 1
        end = text.find("```", start)
        if end < 0:
            unclosed_from = start
            break
        blocks.append((lang.lower(), text[start:end]))
        pos = end + 3
    if unclosed_from is not None:
        return text[unclosed_from:], True
    lean = [code for lang, code in blocks if lang in ("lean4", "lean")]
    bare = [code for lang, code in blocks if lang == ""]
    if lean:
        return lean[-1], False
    if bare:
        return bare[-1], False
    return None, False


# -- comparing statements as token streams ------------------------------------------------------


def _significant(tokens: list[Token]) -> list[Token]:
    """Tokens that make up the statement: doc comments and modifiers in front dropped."""
    out = [t for t in tokens if t.kind is not _DOC]
    i = 0
    while i < len(out):
        t = out[i]
        if t.kind is _SYMBOL and t.text == "@[":
            depth = 0
            while i < len(out):
                depth += bracket_delta(out[i])
                if depth == 0:
                    break
                i += 1
            i += 1
        elif t.kind is _IDENT and t.text in _MODIFIERS:
            i += 1
        else:
            break
    return out[i:]


def _unwrap(words: list[str], colon: int) -> list[str]:
    """Drop parentheses that cannot change the meaning: ``((e))`` -> ``(e)``, a whole type
    ``: (P)`` -> ``: P`` (after a colon, up to a closing bracket or the end), and ``(x)`` around
    one name or number in the type (never around a binder before the top-level colon).

    Pairs go one at a time, always the leftmost one a rule allows, until none does. Done
    naively (rescan from the start after each removal) that is cubic in the statement; here a
    removal only sends the few pairs whose neighbours it changed back to be looked at, so the
    result is the same in O(n log n)."""
    n = len(words)
    if n > _MAX_UNWRAP:
        return words  # no statement is that long except on purpose
    match = [-1] * n  # the `)` of each `(` (-1: never closed)
    opener: dict[int, int] = {}  # the `(` of each matched `)`
    stack: list[int] = []
    for j, w in enumerate(words):
        if w == "(":
            stack.append(j)
        elif w == ")" and stack:
            o = stack.pop()
            match[o], opener[j] = j, o
    prv = list(range(-1, n - 1))
    nxt = [*range(1, n), -1]
    alive = [True] * n
    fen = _Alive(n)

    def removable(a: int) -> bool:
        b = match[a]
        if b < 0:
            return False
        before = words[prv[a]] if prv[a] >= 0 else ""
        after = words[nxt[b]] if nxt[b] >= 0 else ""
        if before == "(" and after == ")":
            return True
        if before == ":" and after in (")", "]", "}", "⟩", ""):
            return True
        inner = nxt[a]
        return inner != b and nxt[inner] == b and fen.index(a) > colon and _atom(words[inner])

    def unlink(j: int) -> None:
        alive[j] = False
        fen.remove(j)
        p, q = prv[j], nxt[j]
        if p >= 0:
            nxt[p] = q
        if q >= 0:
            prv[q] = p

    # Every `(` before `cursor` that is not in `again` is known to stay: the next removal is
    # the smallest of `again` and `cursor` that a rule allows.
    again: list[int] = []
    cursor = 0 if n else -1
    while True:
        if again and (cursor < 0 or again[0] < cursor):
            a = heapq.heappop(again)
        elif cursor >= 0:
            a, cursor = cursor, nxt[cursor]
        else:
            break
        if not alive[a] or words[a] != "(" or not removable(a):
            continue
        b = match[a]
        # Whose rule can change: the pairs next to either parenthesis (their word before or
        # after, or their one word inside), and those at the colon's index (it moves by two).
        near = [prv[a], nxt[a], prv[b], nxt[b]]
        near += [prv[j] for j in near if j >= 0]
        near += [opener[j] for j in near if j in opener]
        near += [fen.at(colon + k) for k in range(3)]
        moved = fen.index(a) < colon
        unlink(b)
        unlink(a)
        if moved:
            colon -= 2
        while cursor >= 0 and not alive[cursor]:
            cursor = nxt[cursor]
        for j in near:
            if j >= 0 and alive[j] and words[j] == "(":
                heapq.heappush(again, j)
    words[:] = [w for j, w in enumerate(words) if alive[j]]
    return words


class _Alive:
    """Which of ``n`` positions are still there (a Fenwick tree): index and position queries
    in O(log n)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.tree = [0] * (n + 1)
        for i in range(1, n + 1):
            self.tree[i] += 1
            if (up := i + (i & -i)) <= n:
                self.tree[up] += self.tree[i]
        self.top = 1 << max(0, n.bit_length() - 1)

    def remove(self, j: int) -> None:
        i = j + 1
        while i <= self.n:
            self.tree[i] -= 1
            i += i & -i

    def index(self, j: int) -> int:
        """How many positions before ``j`` are still there (``j``'s index in the list)."""
        total, i = 0, j
        while i > 0:
            total += self.tree[i]
            i -= i & -i
        return total

    def at(self, k: int) -> int:
        """The position whose index is ``k`` (-1 when there is none)."""
        if k < 0:
            return -1
        pos, rest, step = 0, k + 1, self.top
        while step:
            if pos + step <= self.n and self.tree[pos + step] < rest:
                pos += step
                rest -= self.tree[pos]
            step >>= 1
        return pos if pos < self.n else -1


def _atom(word: str) -> bool:
    return bool(word) and (word[0].isalnum() or word[0] in "_«") and " " not in word


def _words(tokens: list[Token]) -> list[str]:
    out: list[str] = []
    for k, t in enumerate(tokens):
        word = t.value if t.kind in (_IDENT, _NAME) else t.text
        word = _SAME.get(word, word) if t.kind in (_IDENT, _SYMBOL) else word
        prev = tokens[k - 1] if k else None
        glued = not t.space_before and prev is not None
        if glued and (t.text in _SPACE_MATTERS or (prev is not None and prev.text == ".")):
            word = "\u2060" + word  # marks "no space before" where that changes the meaning
        out.append(word)
    return out


def _top_colon(tokens: list[Token]) -> int:
    depth = 0
    for i, t in enumerate(tokens):
        depth += bracket_delta(t)
        if depth == 0 and t.kind is _SYMBOL and t.text == ":":
            return i
    return len(tokens)


def normalize_statement(s: str) -> str:
    """A canonical form of a statement for comparing a restated statement with the reference:
    its tokens (so comments, layout and ``«»`` quoting do not count) without the doc comment,
    attributes and modifiers in front, with ``lemma`` read as ``theorem``, without the trailing
    ``:=``/``:= by``, and without parentheses that cannot change the meaning."""
    tokens = _significant(tokenize(s))
    words = _words(tokens)
    if words[-2:] == [":=", "by"]:
        words = words[:-2]
    elif words[-1:] == [":="]:
        words = words[:-1]
    return " ".join(_unwrap(words, _top_colon(tokens)))


def _norm_words(s: str) -> list[str]:
    """Text as canonical tokens (comments, doc comments and layout dropped), for comparing the
    definitions a reference statement starts with."""
    return _words([t for t in tokenize(s) if t.kind is not _DOC])


# -- finding declarations ----------------------------------------------------------------------


class _Decl:
    """A declaration found in code: where its text starts (its first modifier, attribute or doc
    comment), its keyword, its name token, and the index of its first token in the code's."""

    def __init__(self, start: int, keyword: Token, name: Token | None, index: int) -> None:
        self.start = start
        self.keyword = keyword
        self.name = name
        self.index = index


def _declarations(code: str, words: tuple[str, ...]) -> list[_Decl]:
    """Declarations whose keyword is one of ``words`` and that start a line (possibly after
    modifiers, attributes, a doc comment, or an ``open ... in``/``set_option ... in`` on the
    same line), outside comments and strings."""
    tokens = tokenize(code)
    found: list[_Decl] = []
    for k, t in enumerate(tokens):
        if t.kind is not _IDENT or t.escaped or t.text not in words:
            continue
        first = k
        j = k - 1
        while j >= 0:
            u = tokens[j]
            if u.kind is _DOC or (u.kind is _IDENT and u.text in _MODIFIERS):
                j -= 1
            elif u.kind is _SYMBOL and u.text == "]":
                opener = _attribute_open(tokens, j)
                if opener < 0:
                    break
                j = opener - 1
            else:
                break
            first = j + 1
        head = tokens[first]
        prev = tokens[first - 1] if first > 0 else None
        if prev is not None and prev.line == head.line and prev.text != "in":
            continue  # something else on the line before it: not a declaration start
        nxt = tokens[k + 1] if k + 1 < len(tokens) else None
        name = nxt if nxt is not None and nxt.kind is _IDENT else None
        found.append(_Decl(head.start, t, name, first))
    return found


def _attribute_open(tokens: list[Token], close: int) -> int:
    depth = 0
    for j in range(close, max(close - _MAX_ATTRIBUTE, -1), -1):
        u = tokens[j]
        if u.kind is not _SYMBOL:
            continue
        if u.text == "]":
            depth += 1
        elif u.text in ("[", "@["):
            depth -= 1
            if depth == 0:
                return j if u.text == "@[" else -1
    return -1


def _named(code: str, name: str) -> list[_Decl]:
    """Declarations of the theorem ``name`` (``theorem``/``lemma``; ``instance`` for tasksets
    whose statement is one), however the name is quoted."""
    return [
        d
        for d in _declarations(code, ("theorem", "lemma", "instance"))
        if d.name is not None and d.name.value == name
    ]


def _defined_names(code: str) -> set[str]:
    """Names that ``code`` declares (``def``, ``abbrev``, ``theorem``, ...), unquoted."""
    return {d.name.value for d in _declarations(code, _DEFINING) if d.name is not None}


# -- the proof after `:=` ------------------------------------------------------------------------


def _cut_after_proof(proof: str) -> str:
    """Drop whatever follows the proof at column 0 (a new declaration, ``end``, ``#eval``),
    looking only at code (a ``theorem`` inside a comment or string does not end the proof)."""
    lines = proof.split("\n")
    if not any(_DECL_LINE.match(line) for line in lines[1:]):
        return proof  # (blanking comments and literals never makes a line start a command)
    code_lines = code_only(proof).split("\n")
    for i, line in enumerate(code_lines):
        if i > 0 and _DECL_LINE.match(line):
            return "\n".join(lines[:i])
    return proof


def _ends_in_line_comment(text: str) -> bool:
    """Whether the last line of ``text`` ends inside a ``--`` comment."""
    if "--" not in text.rstrip("\n").rsplit("\n", 1)[-1]:
        return False  # (a `--` comment starts on the line it is on)
    tokens = tokenize(text, keep_comments=True)
    last = text.rstrip("\n").count("\n") + 1
    return any(t.kind is _COMMENT and t.text.startswith("--") and t.line == last for t in tokens)


def _body(rest: str) -> str:
    """The proof after ``:=``: a ``by`` block's tactics, or a term wrapped in ``exact``."""
    rest = _cut_after_proof(rest)
    stripped = rest.lstrip()
    if re.match(r"by(?![\w'.!?])", stripped):
        after = stripped[2:]
        return after.lstrip(" \t") if after.lstrip(" \t").startswith("\n") else after.strip()
    term = textwrap.dedent(rest.strip("\n")).strip()
    if not term:
        return ""
    # Continuation lines deeper than the tactic column, so the term stays one tactic. A line
    # comment on the last line would swallow the closing parenthesis: close it on its own line.
    close = "\n    )" if _ends_in_line_comment(term) else ")"
    return "exact (" + term.replace("\n", "\n    ") + close


def _as_block(proof: str) -> str:
    """Tactic lines as a block under ``:= by``: a leading newline, every line indented by 2."""
    lines = textwrap.dedent(proof.strip("\n")).rstrip().split("\n")
    return "\n" + "\n".join(("  " + ln) if ln.strip() else "" for ln in lines)


def _statement_end(tokens: list[Token], first: int, offset: int) -> int | None:
    """Offset from ``offset`` (where a theorem's text starts in the code) of the ``:=`` that
    ends the statement: the first outside brackets that is not a ``let``/``have``'s in its type.
    ``tokens`` are the code's, read from the theorem's first token (index ``first``) on: they
    are the theorem text's own (nothing before a declaration's first token changes how what
    follows reads), and the text after the statement is not read again."""
    depth = 0
    local = False  # inside a `let x := v;` / `have h := v;` of the statement's type
    for k in range(first, len(tokens)):
        t = tokens[k]
        depth += bracket_delta(t)
        if t.kind is _SYMBOL and t.text == ":=" and depth == 0:
            if not local:
                return t.start - offset
            local = False
        elif t.kind is _IDENT and t.text in ("let", "have") and depth == 0:
            local = True
    return None


# -- the preamble --------------------------------------------------------------------------------


def _clean_preamble(before: str, header: str) -> str:
    """The model's text before its theorem, made safe to put above the reference statement:
    imports and header lines dropped, a doc comment meant for the theorem dropped, a
    ``set_option ... in`` or ``open ... in`` in front of it made a plain ``set_option``/``open``
    (the same effect on the one theorem that follows: the proof still sees the names it opened;
    should an ``open`` change how the reference statement reads, the checker sees a different
    type), and namespaces/sections left open closed, so the reference statement is elaborated
    as a top-level declaration under its own name."""
    head = {ln.strip() for ln in header.splitlines() if ln.strip()}
    # (code only: an `import` in a comment or string is not one; without the word, the text
    # need not be read for it)
    code = code_only(before) if "import" in before else before
    keep = [
        ln
        for ln, c in zip(before.split("\n"), code.split("\n"), strict=True)
        if not c.lstrip().startswith("import ") and ln.strip() not in head
    ]
    text = "\n".join(keep).strip()
    tokens = tokenize(text)  # removing tokens from the end leaves the ones before unchanged
    options: list[str] = []
    end = len(text)
    while tokens and tokens[-1].kind is not _ERROR:
        last = tokens[-1]
        if last.kind is _DOC:
            end = last.start
            tokens.pop()
            continue
        k = _scoped_prefix(tokens) if last.kind is _IDENT and last.text == "in" else None
        if k is None:
            break
        options.append(text[tokens[k].start : last.start].rstrip())  # last first
        end = tokens[k].start
        del tokens[k:]
    return _close_scopes("\n".join([text[:end].rstrip(), *reversed(options)]).strip())


def _scoped_prefix(tokens: list[Token]) -> int | None:
    """Index of the ``open``/``set_option`` that the final ``in`` of ``tokens`` belongs to."""
    for k in range(len(tokens) - 2, -1, -1):
        t = tokens[k]
        if t.kind is _IDENT and not t.escaped and t.text in ("open", "set_option"):
            return k
        if t.kind is not _IDENT and t.kind is not _NUMBER and t.text != ".":
            if t.kind is _STRING or t.text in ("(", ")", "→", "=>", "-"):
                continue  # `open Foo (bar)`, `open Foo renaming a → b`, option values
            return None
    return None


_SCOPE = re.compile(r"(?m)^[ \t]*(?:noncomputable[ \t]+)?(namespace|section|end)\b[ \t]*([^\s-]*)")


def _close_scopes(text: str) -> str:
    """``text`` with its scopes balanced: an ``end`` that closes nothing the model opened is
    dropped (it would close the header's ``section`` and change how the reference statement is
    read), and every namespace/section left open gets its ``end`` (a namespace is opened again
    with ``open`` so the proof still sees the helper lemmas by their short names)."""
    if not any(w in text for w in ("namespace", "section", "end")):
        return text.strip()  # nothing to balance (the code has none of them if the text has not)
    stack: list[tuple[str, str]] = []
    stray: list[tuple[int, int]] = []
    for m in _SCOPE.finditer(code_only(text)):
        kind, name = m.group(1), m.group(2)
        if kind == "end":
            if stack:
                stack.pop()
            else:
                stray.append((m.start(), m.end()))
        else:
            stack.append((kind, name))
    pieces: list[str] = []  # joined once: cutting one `end` at a time copies the text each time
    pos = 0
    for a, b in stray:
        pieces.append(text[pos:a])
        pos = b
    pieces.append(text[pos:])
    out = ["".join(pieces).strip()]
    for kind, name in reversed(stack):
        out.append(f"\nend{' ' + name if name else ''}")
        if kind == "namespace" and name:
            out.append(f"\nopen {name}")
    return "".join(out)


# -- extraction ----------------------------------------------------------------------------------


def extract_proof(
    text: str,
    task: Task,
    *,
    finish_reason: str | None = "stop",
    completion_style: bool = False,
) -> Extracted:
    """The proof in ``text`` (a model's output for ``task``), or the reason there is none.

    ``completion_style``: the prompt ended inside an open code block right after the
    statement, so the output *is* the proof until the closing fence.
    """
    truncated = finish_reason == "length"
    if len(text) > MAX_TEXT_CHARS:
        return Extracted(
            reason=Reason.TOO_LARGE,
            detail=f"the output is {len(text):,} characters, over the {MAX_TEXT_CHARS:,} that "
            "extraction reads",
        )
    body, think_problem = strip_reasoning(text)
    if think_problem is not None:
        if truncated:
            return Extracted(reason=Reason.TRUNCATED, detail=f"cut off: {think_problem}")
        return Extracted(reason=Reason.NO_PROOF, detail=f"no code: {think_problem}")

    if completion_style:
        idx = body.find("```")
        if idx < 0 and truncated:
            return Extracted(reason=Reason.TRUNCATED, detail="cut off before the code block closed")
        code = body if idx < 0 else body[:idx]
        if (big := _too_many_tokens(code)) is not None:
            return big
        # The text up to the first new command is the continuation of the statement the prompt
        # ended with: the proof. Only when the model starts over with its own declarations
        # (a restated header/theorem) is the code searched for the theorem.
        lead = _cut_after_proof(code).rstrip()
        first = next((ln for ln in code_only(lead).split("\n") if ln.strip()), "")
        if first and not _DECL_LINE.match(first.lstrip()):
            if lead.startswith("\n"):
                return Extracted(proof=lead)
            if lead[:1] in (" ", "\t"):
                # Indented first tactic (the prompt ended in a newline): keep every line's own
                # indentation, so the block stays one tactic block.
                return Extracted(proof="\n" + lead)
            return Extracted(proof=lead.strip())
        if not _declarations(code, _THEOREM_WORDS):
            return Extracted(reason=Reason.NO_PROOF, detail="the completion is empty")
    else:
        found, unclosed = _fenced(body)
        if unclosed and truncated:
            return Extracted(reason=Reason.TRUNCATED, detail="cut off inside the last code block")
        if found is None:
            if truncated:
                return Extracted(reason=Reason.TRUNCATED, detail="cut off before any code block")
            if not _named(body, task.name):
                return Extracted(reason=Reason.NO_PROOF, detail="no Lean code block in the output")
            found = body
        code = found
        if (big := _too_many_tokens(code)) is not None:
            return big

    return _from_code(code, task)


def _too_many_tokens(code: str) -> Extracted | None:
    """``too_large`` when ``code`` is past the lexer's token bound: every later step reads its
    tokens, so it is refused before any of them (the tokens are cached for the steps that run)."""
    if too_many_tokens(tokenize(code)):
        return Extracted(
            reason=Reason.TOO_LARGE,
            detail=f"the code has more than {MAX_TOKENS:,} Lean tokens; no proof is that long",
        )
    return None


def _split_reference(task: Task) -> tuple[str, str]:
    """The reference statement as (what comes before the theorem, the theorem): some tasksets
    put definitions in the statement (PutnamBench's ``abbrev ..._solution``)."""
    stmt = task.formal_statement
    decls = _named(stmt, task.name)
    if not decls:
        return "", stmt
    start = decls[0].start
    return stmt[:start], stmt[start:]


def _without_restated_prefix(before: str, prefix: str) -> str | None:
    """``before`` minus a restatement of the reference's ``prefix`` at its end; ``before`` when
    the model did not restate it; None when it restated it differently."""
    want = _norm_words(prefix)
    if not want:
        return before
    tokens = [t for t in tokenize(before) if t.kind is not _DOC]
    if len(tokens) >= len(want) and _words(tokens[-len(want) :]) == want:
        return before[: tokens[-len(want)].start]
    if _defined_names(prefix) & _defined_names(before):
        return None  # it redefines what the statement is built on (an answer, a definition)
    return before


def _restated(prefix: str, theorem: str) -> str:
    """The model's statement as the text to check: the reference's definitions, then the
    model's theorem from its keyword (``lemma`` read as ``theorem``), ending in ``:= by``."""
    text = theorem.rstrip()
    if text.startswith("lemma"):
        text = "theorem" + text[len("lemma") :]
    sep = "\n" if _ends_in_line_comment(text) else " "
    return f"{prefix.rstrip()}\n{text}{sep}:= by".lstrip("\n")


def _from_code(code: str, task: Task) -> Extracted:
    decls = _named(code, task.name)
    if not decls:
        others = [
            d.name.text if d.name is not None else d.keyword.text
            for d in _declarations(code, _THEOREM_WORDS)
        ]
        if others:
            return Extracted(
                reason=Reason.STATEMENT_CHANGED,
                detail=f"the code states {others[-1]!r}, not the theorem {task.name!r}",
            )
        proof = re.sub(r"^\s*(:=\s*)?by\b", "", code.strip("\n"))
        lines = [
            ln
            for ln, c in zip(proof.split("\n"), code_only(proof).split("\n"), strict=True)
            if not re.match(r"\s*(import|open|set_option)\s", c)
        ]
        proof = "\n".join(lines).rstrip()
        if not proof.strip():
            return Extracted(reason=Reason.NO_PROOF, detail="the code block is empty")
        return Extracted(proof=_as_block(proof))
    if len(decls) > 1:
        # Lean would reject the redeclaration anyway; say why instead of letting an earlier copy
        # (perhaps of a different statement) sit in the preamble above the reference.
        return Extracted(
            reason=Reason.STATEMENT_CHANGED,
            detail=f"the code declares the theorem {task.name!r} {len(decls)} times",
        )
    decl = decls[0]
    before, after = code[: decl.start], code[decl.start :]
    ref_prefix, ref_theorem = _split_reference(task)
    rest = _without_restated_prefix(before, ref_prefix)
    if rest is None:
        names = ", ".join(sorted(_defined_names(ref_prefix)))
        return Extracted(
            reason=Reason.STATEMENT_CHANGED,
            detail=f"the code redefines what the reference statement is built on ({names})",
        )
    assign = _statement_end(tokenize(code), decl.index, decl.start)  # (`_named` read the code)
    if assign is None:
        return Extracted(
            reason=Reason.NO_PROOF,
            detail="the theorem has no `:=` proof (equation-style `|` proofs cannot be placed "
            "under the reference statement)",
        )
    restated = ""
    if normalize_statement(after[:assign]) != normalize_statement(ref_theorem):
        keyword_at = decl.keyword.start - decl.start
        restated = _restated(ref_prefix, after[keyword_at:assign])
    proof = _body(after[assign + 2 :]).rstrip()
    if not proof.strip():
        return Extracted(reason=Reason.NO_PROOF, detail="the theorem has an empty proof")
    return Extracted(
        proof=proof,
        preamble=_clean_preamble(rest, task.header),
        restated_statement=restated,
    )
