"""The pre-scan: a deny-by-default allow-list over the text the model wrote.

It runs on the model's part of an attempt (preamble, restated statement, proof) before Lean does,
and on every tactic block a model sends in tactic mode. It reads the text with
:mod:`leanrl.lean.trust.lexer`, so comments and strings are exactly what Lean takes them to be: a
word inside a comment or string never triggers a rule, and a comment or string can never hide
code from it (a text the lexer cannot read unambiguously is refused outright).

What is checked, token by token:

* **commands**: every command keyword is either on the allow-list (declarations, their
  modifiers, ``namespace``/``section``/``end``, ``variable``, ``universe``, ``mutual``, ``open``,
  ``set_option``, ``attribute``, ``#check``/``#print``/``#reduce``) or refused with the reason it
  is dangerous (``macro``, ``elab``, ``simproc``, ``#eval``, ``#exit``, ``import``, ...). Command
  keywords are reserved tokens in Lean, so the rule applies wherever one appears; an unknown
  ``#word`` at the start of a line is refused too.
* **attributes** (``@[...]``, ``attribute [...]``, nested ``(attr := ...)``): allow-listed lemma
  attributes only; anything that registers code (``simproc``, ``aesop``, ``norm_num``,
  ``positivity``, ``delab``, parsers, ``extern``, ...) or is unknown is refused.
* **options** (``set_option``, also ``... in`` inside proofs): allow-listed names only.
* **names** (however spelled: ``_root_.``, ``@``, ``«»``, name literals): native evaluation
  (``native_decide``, ``Lean.reduceBool``, ``ofReduceBool``, ``trustCompiler``, ``_native``
  auxiliaries, ``decide +native``, ``bv_decide``) -> ``native`` unless the policy allows it;
  ``sorry``/``admit``/``sorryAx`` -> ``sorry``; ``axiom`` -> ``axiom``; ``unsafe*``,
  ``run_tac``, ``by_elab``, ``plausible``, meta-programming monads and IO -> ``forbidden``.

Hostile text never makes it raise or crawl: every walk is a loop or bounded in depth, brackets
nested deeper than :data:`MAX_NESTING` levels are refused (``forbidden``), and any failure inside
the scan itself comes back as a refusal rather than an exception. Its cost is linear in the text.

The pre-scan is a cheap first filter that gives a clear reason; it is never the defence on its
own. The verdict comes from a separate checker process (see docs/verification.md), which is what
stands behind anything this cannot know about (a command keyword of a library newer than its
tables reads to it as an identifier). See docs/prescan.md.
"""

from __future__ import annotations

import logging
import re
from typing import NamedTuple

from leanrl.lean.trust.allowlist import (
    ALLOWED_ATTRIBUTES,
    ALLOWED_OPTION_PREFIXES,
    ALLOWED_OPTIONS,
    CODE_ATTRIBUTES,
    COMMANDS,
    CONFIG_CONSTANTS,
    CONFIG_QUALIFIED,
    CONFIG_TACTICS,
    DISCHARGER_TACTICS,
    HASH_COMMANDS,
    METAPROGRAM_NAMES,
    NATIVE_NAMES,
    NATIVE_TACTICS,
    NOTATION_COMMANDS,
    SORRY_NAMES,
    TACTIC_WORDS,
    TACTICS,
    UNSAFE_OPTION_PREFIXES,
    UNSAFE_OPTIONS,
    WHY,
)
from leanrl.lean.trust.lexer import Kind, Token, bracket_delta, tokenize
from leanrl.verdict import Reason, VerificationPolicy

__all__ = ["MAX_NESTING", "Finding", "scan"]

# The kinds as plain names: on Python 3.11 each `Kind.IDENT` is a slow attribute look-up, and
# these are read for every token.
_IDENT, _SYMBOL, _NUMBER = Kind.IDENT, Kind.SYMBOL, Kind.NUMBER
_STRING, _CHAR, _NAME = Kind.STRING, Kind.CHAR, Kind.NAME
_DOC, _COMMENT, _ERROR = Kind.DOC, Kind.COMMENT, Kind.ERROR


class Finding(NamedTuple):
    """One construct the pre-scan refuses."""

    reason: Reason
    """The verdict reason it maps to."""
    token: str
    """The construct, as written (``native_decide``, ``@[simproc]``, ``#eval``)."""
    line: int
    """1-based line of its first occurrence in the scanned text."""
    why: str
    """What the construct could do, and how to write the proof instead."""


log = logging.getLogger("leanrl.lean")

_REASON = {"native": Reason.NATIVE, "sorry": Reason.SORRY, "axiom": Reason.AXIOM}
# Findings no taskset can waive: text the lexer cannot read, nesting past the bound.
_UNWAIVABLE = frozenset({"lexing", "too_deep"})

MAX_NESTING = 256
"""Brackets (``( [ { ⟨ ⦃ ⟦``, ``@[``, ...) nested deeper than this are refused. Published proofs
nest at most 8 deep (miniF2F, ProofNet, PutnamBench); Lean's parser and elaborator recurse on
every level (``maxRecDepth`` defaults to 512), so much deeper text fails in Lean anyway or
exhausts its stack; refusing it up front also keeps every walk over it shallow."""
_MAX_CONFIG_DEPTH = 32
"""Nesting followed inside one configuration value or one ``(attr := ...)`` chain; deeper is
refused (a configuration nests two or three levels in practice)."""
# Words after `#print` that are part of the command, not commands of their own.
_PRINT_WORDS = frozenset("axioms prefix equations eqns sig".split())


def scan(text: str, policy: VerificationPolicy) -> list[Finding]:
    """Every construct in ``text`` (model-written Lean) the pre-scan refuses, in text order, one
    finding per distinct construct. Empty means the text passes.

    Never raises on any text: a failure inside the scan (it should have none; a
    ``RecursionError`` or ``MemoryError`` on text nobody foresaw) is itself a refusal, reason
    ``forbidden``, so an attempt is judged instead of lost."""
    try:
        return _scan(text, policy)
    except Exception as e:
        # Hostile text must cost the attempt, not the caller. Logged: a failure here is a bug of
        # the pre-scan (every walk in it is bounded), and must be seen.
        log.warning("pre-scan failed on %d characters of text", len(text), exc_info=True)
        return [
            Finding(
                Reason.FORBIDDEN,
                "<unreadable text>",
                1,
                f"the pre-scan could not read the text ({type(e).__name__}); it refuses what it "
                "cannot read",
            )
        ]


def _scan(text: str, policy: VerificationPolicy) -> list[Finding]:
    # Per-taskset switches read with getattr: tasksets may carry them on their policy (see
    # docs/prescan.md, "Extending the allow-list").
    allow_notation = bool(getattr(policy, "allow_notation", False))
    waived = frozenset(getattr(policy, "prescan_allow", ()) or ())
    tokens = tokenize(text)
    if allow_notation:
        atoms, bad = _notation_atoms(tokens)
        if bad:
            return bad
        if atoms:  # new tokens change how Lean splits the rest of the text: read it again
            tokens = tokenize(text, extra_symbols=atoms)
    return _Scan(tokens, policy.allow_native_decide, allow_notation, waived).run()


class _TooDeep(Exception):
    """A walk went deeper than its bound; ``at`` is the token where it stopped."""

    def __init__(self, at: int) -> None:
        super().__init__(at)
        self.at = at


class _Scan:
    def __init__(
        self,
        tokens: list[Token],
        allow_native: bool,
        allow_notation: bool,
        waived: frozenset[str] = frozenset(),
    ) -> None:
        self.toks = tokens
        self.allow_native = allow_native
        self.allow_notation = allow_notation
        self.waived = waived
        self.found: list[Finding] = []
        self.seen: set[tuple[Reason, str]] = set()
        self.names: set[int] = set()  # attribute and option names: no other rule applies
        self.args: set[int] = set()  # attribute arguments: name rules apply, command rules don't
        self.closer, self.too_deep = _closers(tokens)
        self.checked: set[int] = set()  # attribute lists already read (`@[` indices)
        self._openers: dict[int, int] | None = None
        self._bad: int | None = None  # where the last configuration value stopped being literal
        self._instance: bool | None = None
        self._declared: frozenset[str] | None = None
        self._heads: dict[int, str | None] = {}  # `_tactic_before` answers, by token index

    # -- helpers ----------------------------------------------------------------------------------

    def add(self, kind: str, token: str, line: int, why: str = "") -> None:
        reason = _REASON.get(kind, Reason.FORBIDDEN)
        if reason is Reason.NATIVE and self.allow_native:
            return
        # A taskset may allow a construct by the name its finding shows (`@[my_attr]`,
        # `set_option hygiene`, `alias`); never text the lexer cannot read, `sorry`, an axiom,
        # or native code (that has its own switch).
        if reason is Reason.FORBIDDEN and kind not in _UNWAIVABLE and token in self.waived:
            return
        if (reason, token) in self.seen:
            return
        self.seen.add((reason, token))
        self.found.append(Finding(reason, token, line, why or WHY[kind]))

    def tok(self, i: int) -> Token | None:
        return self.toks[i] if 0 <= i < len(self.toks) else None

    def is_sym(self, i: int, text: str) -> bool:
        t = self.tok(i)
        return t is not None and t.kind is _SYMBOL and t.text == text

    def keyword(self, i: int) -> str:
        """The token's text when it can be a keyword (an identifier not written with «»)."""
        t = self.tok(i)
        return t.text if t is not None and t.kind is _IDENT and not t.escaped else ""

    def line_start(self, i: int) -> bool:
        prev = self.tok(i - 1)
        return prev is None or prev.line != self.toks[i].line

    def tactic_start(self, i: int) -> bool:
        """Token ``i`` stands where a tactic starts: first on its line, or after ``by``, ``;``,
        ``<;>``, ``·``, ``=>``, ``(`` or ``|`` (not where a term goes: ``simp [trace]``)."""
        prev = self.tok(i - 1)
        return self.line_start(i) or (
            prev is not None and prev.text in ("by", ";", "<;>", "·", ".", "=>", "(", "|")
        )

    def lone_string(self, j: int) -> bool:
        """Token ``j`` is a string literal that ends the tactic (core's ``trace "message"``)."""
        t, nxt = self.tok(j), self.tok(j + 1)
        if t is None or t.kind is not Kind.STRING:
            return False
        return nxt is None or nxt.line != t.line or nxt.text in (";", ")", "<;>")

    # -- the pass ---------------------------------------------------------------------------------

    def run(self) -> list[Finding]:
        if self.too_deep is not None:
            t = self.toks[self.too_deep]
            self.add(
                "too_deep",
                f"{t.text} nested deeper than {MAX_NESTING}",
                t.line,
                f"brackets are nested deeper than {MAX_NESTING} levels; no proof needs that, and "
                "Lean's parser and elaborator recurse on every level: name the parts with `have` "
                "or `let`",
            )
        for i, t in enumerate(self.toks):
            if t.kind is _ERROR:
                snippet = t.text.strip().splitlines()[0][:40] if t.text.strip() else t.text
                self.add(
                    "lexing",
                    snippet or "<end of text>",
                    t.line,
                    f"the text cannot be read safely ({t.error}); Lean would reject it, or could "
                    "read it differently from the pre-scan",
                )
            elif t.kind is _SYMBOL and t.text == "@[":
                self.attributes(i + 1, "@[")
            elif t.kind is _SYMBOL and t.text == "#":
                self.hash_command(i)
            elif t.kind is _SYMBOL and t.text == "(" and self.is_sym(i + 2, ":="):
                self.config_item(i)
            elif t.kind in (_IDENT, _NAME) and i not in self.names:
                if t.kind is _IDENT and not t.escaped and i not in self.args:
                    self.command_word(i, t)
                self.name_rules(t)
            if t.kind is _STRING or (t.kind in (_IDENT, _NAME) and "«" in t.text):
                self.hidden_command(t, anywhere=True)
            elif t.kind is _DOC:
                self.hidden_command(t, anywhere=False)
        return self.found

    def command_word(self, i: int, t: Token) -> None:
        word = t.text
        if word == "attribute" and self.is_sym(i + 1, "["):
            self.attributes(i + 2, "attribute [")
        elif word == "set_option":
            self.option(i + 1)
        elif word in ("open", "export") and self.keyword(i + 1) == "private":
            self.add("open_private", f"{word} private", t.line)
        if word == "native":
            # `decide +native`, `(native := true)`, `{ native := true }`: a switch in a
            # configuration, not a local named `native` (`let native := 1`)
            if self.is_sym(i - 1, "+"):
                self.add("native", "decide +native", t.line)
            elif self.is_sym(i + 1, ":=") and any(self.is_sym(i - 1, s) for s in "({,"):
                self.add("native", "native :=", t.line)
        kind = COMMANDS.get(word, "")
        if word in NOTATION_COMMANDS and self.allow_notation:
            kind = ""
        if kind:
            self.add(kind, word, t.line)
        if word in TACTICS:
            self.add(TACTICS[word], word, t.line)
        if word in TACTIC_WORDS and self.tactic_start(i) and not self.lone_string(i + 1):
            self.add(TACTIC_WORDS[word], word, t.line)
        if word == "eval" and self.is_sym(i + 1, "%") and not self.toks[i + 1].space_before:
            self.add("run_code", "eval%", t.line)
        if word in NATIVE_TACTICS:
            self.add("native", word, t.line)
        if word == "tactic":
            self.add("aesop_tactic", word, t.line)

    def hidden_command(self, t: Token, *, anywhere: bool) -> None:
        """A command written inside a string literal or a ``«»`` name. After a parse error Lean
        looks for the next command token by token, and character by character where a token
        fails to lex: a string Lean fails on (an escape one Lean version lacks) is entered, and
        ``"\\q #eval evil --"`` would run ``#eval evil`` (the ``--`` comments out the closing
        quote). Defence in depth: any command word inside such a token is refused. A doc comment
        is consumed whole by the declaration it starts, so for it only a refused command at the
        start of one of its lines counts."""
        body = t.text
        prev_end = -1  # where the previous match ended (-1: none yet)
        for m in _COMMAND_START.finditer(body):
            word = m.group(0)
            start, end = m.start(), m.end()
            if not anywhere:
                # Only what lies between the previous match and this one is looked at, so a
                # long doc comment costs its length once.
                nl = body.rfind("\n", max(prev_end, 0), start)
                same_line = nl < 0 and prev_end >= 0  # the previous match is code before it
                prev_end = end
                if same_line or body[nl + 1 : start].strip() or not _refused_command(word):
                    continue
            shown = word if len(t.text) <= 40 else f"{word} (in {t.text[:30]}…)"
            self.add("hidden_command", shown, t.line)
            return

    # -- tactic configurations ----------------------------------------------------------------------

    def config_item(self, i: int) -> None:
        """``(field := VALUE)`` at ``i``: a configuration when the field is ``config`` (anywhere,
        attribute arguments included) or the item follows a tactic that takes configuration
        items (``simp (maxSteps := 10)``); elsewhere it is a named argument. Lean elaborates a
        configuration and then compiles and runs it (``declare_config_elab``), so a name in it
        runs whatever the proof made that name mean -- a definition of its own, a ``default``
        instance it declares, a ``discharger`` field that is a tactic program. Only literal
        values are allowed."""
        field = self.tok(i + 1)
        if field is None or field.kind is not _IDENT:
            return
        name = field.value  # `«config»` is `config` to Lean
        head = self._tactic_before(i)
        if name in ("disch", "discharger") and head in DISCHARGER_TACTICS:
            return  # `simp (disch := tac)`: a tactic, read by the other rules like any other
        if name != "config" and head is None:
            return
        end = self.closer[i]
        self._bad = None
        try:
            stop = self._literal(i + 3, end)
        except _TooDeep:
            self.add(
                "too_deep",
                f"({name} := ... nested deeper than {_MAX_CONFIG_DEPTH} ...)",
                field.line,
                f"a configuration value nested deeper than {_MAX_CONFIG_DEPTH} levels is not read "
                "as a literal; write the configuration plainly",
            )
            return
        if stop != end:
            k = self._bad if stop is None and self._bad is not None else (stop or i + 3)
            bad = self.tok(k)
            shown = bad.text if bad is not None else ""
            self.add("config_code", f"({name} := ... {shown} ...)", field.line)

    def _tactic_before(self, i: int) -> str | None:
        """The configurable tactic whose items include the one opened at ``i``, possibly after
        other items (``simp +contextual (maxSteps := 5)``), or None.

        The walk back from a token always ends the same way, so where it has been is remembered:
        ``simp (a := 1) (a := 1) ...`` costs its length once, not once per item."""
        memo = self._heads
        j = i - 1
        path: list[int] = []
        head: str | None = None
        while True:
            if j in memo:
                head = memo[j]
                break
            t = self.tok(j)
            if t is None:
                break
            path.append(j)
            if t.kind is _NUMBER or (t.kind is _SYMBOL and t.text in ("*", "!", "?")):
                j -= 1  # `solve_by_elim* (...)`, `simpa ! (...)`, `congr! 2 (...)`
            elif t.kind is _SYMBOL and t.text == ")":
                o = self._opener(j)
                if o is None or not self.is_sym(o + 2, ":="):
                    break
                j = o - 1
            elif t.kind is _IDENT and any(self.is_sym(j - 1, s) for s in "+-"):
                j -= 2
            elif t.kind is _IDENT and not t.escaped:
                word = t.text.rstrip("?!")
                head = word if word in CONFIG_TACTICS else None
                break
            else:
                break
        for k in path:
            memo[k] = head
        return head

    @property
    def declares_instance(self) -> bool:
        """The text declares an instance (``instance``, ``@[instance]``, ``attribute
        [instance]``, ``@[default_instance]``): literals could then elaborate through it."""
        if self._instance is None:
            self._instance = any(
                t.kind is _IDENT
                and not t.escaped
                and t.text in ("instance", "default_instance", "renaming")
                for t in self.toks
            )
        return self._instance

    @property
    def declared(self) -> frozenset[str]:
        """Last components of the names the text may declare: after a declaring keyword, or
        the first word of a line that goes on with ``:=`` (``where`` clauses)."""
        if self._declared is None:
            out: set[str] = set()
            toks = self.toks
            for k, t in enumerate(toks):
                if t.kind is not _IDENT:
                    continue
                prev = toks[k - 1] if k else None
                after_kw = prev is not None and prev.kind is _IDENT and prev.text in _DECLARING
                first = (
                    prev is None
                    or prev.line != t.line
                    or (prev.kind is _SYMBOL and prev.text == "|")
                )
                if first and not after_kw:
                    rest = [u for u in toks[k + 1 : k + 40] if u.line == t.line]
                    first = any(u.kind is _SYMBOL and u.text == ":=" for u in rest) or (
                        prev is not None and prev.text == "|"
                    )
                if after_kw or first:
                    out.add(t.value.rsplit(".", 1)[-1])
            self._declared = frozenset(out)
        return self._declared

    def _opener(self, j: int) -> int | None:
        if self._openers is None:
            self._openers = {c: o for o, c in enumerate(self.closer) if c < len(self.toks)}
        return self._openers.get(j)

    def _literal(self, i: int, end: int, depth: int = 0) -> int | None:
        """The index after the literal configuration value at ``i`` (before ``end``), or None.

        literal := number | -number | true | false | string | char | name literal
                 | .C literal* | Namespace.C      (C in CONFIG_CONSTANTS)
                 | ( literal ) | [ literal, ... ] | { field := literal, ... }

        Raises :class:`_TooDeep` past :data:`_MAX_CONFIG_DEPTH` levels (the walk recurses).
        """
        if depth > _MAX_CONFIG_DEPTH:
            raise _TooDeep(i)
        out = self._literal_at(i, end, depth)
        if out is None and self._bad is None:
            self._bad = i  # the innermost token that is not a literal: shown in the finding
        return out

    def _literal_at(self, i: int, end: int, depth: int) -> int | None:
        t = self.tok(i)
        if t is None or i >= end:
            return None
        if t.kind in (_NUMBER, _STRING, _CHAR, _NAME):
            # `100000` is `OfNat.ofNat 100000` and a string can be coerced: an instance the
            # text declares would make the literal run its code
            return None if self.declares_instance else i + 1
        if t.kind is _IDENT:
            ok = (not t.escaped and t.text in ("true", "false")) or t.value in CONFIG_QUALIFIED
            # `namespace Foo def true := ...` makes `true` mean `Foo.true` there
            return i + 1 if ok and t.value.rsplit(".", 1)[-1] not in self.declared else None
        if t.kind is not _SYMBOL:
            return None
        if t.text == "-" and (n := self.tok(i + 1)) is not None and n.kind is _NUMBER:
            return i + 2
        if t.text == ".":
            name = self.tok(i + 1)
            if name is None or name.kind is not _IDENT or name.space_before:
                return None
            if name.escaped or name.text not in CONFIG_CONSTANTS or name.text in self.declared:
                # `.asFn` resolves in the field type's namespace: `def Nat.asFn` would be it
                self._bad = i + 1
                return None
            k = i + 2
            while k < end and (nxt := self._literal(k, end, depth + 1)) is not None:
                k = nxt  # `.pos [1, 2]`
            return k
        if t.text in ("(", "[", "{"):
            close = self.closer[i]
            if close >= end:
                return None
            k = i + 1
            while k < close:
                if t.text == "{":
                    f = self.tok(k)
                    if f is None or f.kind is not _IDENT or f.escaped:
                        self._bad = k
                        return None
                    if not self.is_sym(k + 1, ":="):
                        self._bad = k  # `{ x }` means `{ x := x }`: a name, not a literal
                        return None
                    k += 2
                nxt = self._literal(k, close, depth + 1)
                if nxt is None:
                    return None
                k = nxt
                if self.is_sym(k, ","):
                    k += 1
                elif t.text == "(" and k != close:
                    return None
            return close + 1
        return None

    def name_rules(self, t: Token) -> None:
        """Rules on what a name refers to, however it is spelled."""
        parts = list(t.parts) or [t.text]
        while parts[:1] == ["_root_"]:
            parts = parts[1:]
        if not parts:
            return
        last, first = parts[-1], parts[0]
        shown = t.text
        if last in NATIVE_NAMES or any(p.startswith("_native") for p in parts):
            self.add("native", shown, t.line)
        if last in SORRY_NAMES:
            self.add("sorry", shown, t.line)
        if last.startswith("unsafe") or last.endswith("Unsafe"):
            self.add("unsafe", shown, t.line)
        if last in METAPROGRAM_NAMES or first in METAPROGRAM_NAMES:
            self.add("metaprogram", shown, t.line)

    # -- `#` commands -----------------------------------------------------------------------------

    def hash_command(self, i: int) -> None:
        nxt = self.tok(i + 1)
        if nxt is None or nxt.kind is not _IDENT or nxt.space_before or nxt.escaped:
            return
        word = nxt.text
        kind = HASH_COMMANDS.get(word)
        line = self.toks[i].line
        if kind is None:
            # Not a known command: `#s` is Mathlib's `Finset.card` notation mid-line, but a
            # `#word` that starts a line is a command the pre-scan does not know: refused.
            if self.line_start(i):
                self.add("unknown_hash", f"#{word}", line)
            return
        self.names.add(i + 1)
        if kind:
            self.add(kind, f"#{word}", line)
        elif word == "print":
            after = self.tok(i + 2)
            if after is not None and (
                after.kind is _STRING
                or (after.kind is _ERROR and after.text.startswith(('"', "r")))
            ):
                self.add("print", "#print", line)
            elif self.keyword(i + 2) in _PRINT_WORDS:
                self.names.add(i + 2)

    # -- options ------------------------------------------------------------------------------------

    def option(self, i: int) -> None:
        t = self.tok(i)
        if t is None or t.kind is not _IDENT:
            return  # not an option name: Lean rejects the command
        self.names.add(i)
        name = t.value
        shown = f"set_option {t.text}"
        if name in UNSAFE_OPTIONS or name.startswith(UNSAFE_OPTION_PREFIXES):
            self.add("option_unsafe", shown, t.line)
        elif name not in ALLOWED_OPTIONS and not name.startswith(ALLOWED_OPTION_PREFIXES):
            self.add("option_unknown", shown, t.line)

    # -- attributes ---------------------------------------------------------------------------------

    def attributes(self, i: int, opener: str) -> int:
        """Check the attribute instances from ``i`` up to the ``]`` that closes ``opener``;
        return the index after it."""
        if i in self.checked:
            return i
        self.checked.add(i)
        end = self.closer[i - 1]
        for a, b in self._split(i, end):
            self.attribute(a, b, opener)
        return end + 1

    def attribute(self, a: int, b: int, opener: str, depth: int = 0) -> None:
        """One attribute instance, tokens [a, b): ``[-] [local|scoped] name args...``; ``depth``
        counts the ``(attr := ...)`` it is inside (bounded: the walk recurses)."""
        k = a
        if opener.startswith("attribute") and self.is_sym(k, "-"):
            k += 1  # `attribute [-simp] foo` removes an attribute: harmless
            erase = True
        else:
            erase = False
        if self.keyword(k) in ("local", "scoped"):
            self.names.add(k)
            k += 1
        t = self.tok(k)
        if t is None or k >= b or t.kind is not _IDENT:
            where = self.tok(a) or self.toks[-1]
            self.add("attr_unknown", f"{opener}{where.text}]", where.line)
            return
        self.names.add(k)
        name = t.value
        shown = f"{opener}{name}]"
        if _is_code_attribute(name):
            if not erase:
                self.add("attr_code", shown, t.line)
        elif name not in ALLOWED_ATTRIBUTES and not erase:
            self.add("attr_unknown", shown, t.line)
        j = k + 1
        while j < b:
            # `(attr := simp, norm_cast)` (`to_additive`, `simps`): more attribute instances.
            if self.keyword(j) == "attr" and self.is_sym(j + 1, ":=") and self.is_sym(j - 1, "("):
                close = self.closer[j - 1]
                if depth >= _MAX_CONFIG_DEPTH:
                    self.add(
                        "too_deep",
                        f"(attr := ...) nested deeper than {_MAX_CONFIG_DEPTH}",
                        self.toks[j].line,
                        f"`(attr := ...)` nested deeper than {_MAX_CONFIG_DEPTH} levels is not "
                        "read; write the attributes plainly",
                    )
                    return
                for x, y in self._split(j + 2, min(close, b)):
                    self.attribute(x, y, "(attr := ", depth + 1)
                j = close + 1
                continue
            arg = self.toks[j]
            if arg.kind is _SYMBOL and arg.text == "@[":
                j = self.closer[j] + 1  # a list of its own: read when the pass gets there
                continue
            self.args.add(j)
            if arg.kind in (_IDENT, _NAME) and _is_code_attribute(arg.value):
                # `simps (config := {attrs := [`norm_num]})` names attributes as data
                self.add("attr_code", f"{opener}{name} … {arg.text}]", arg.line)
            j += 1

    def _split(self, a: int, b: int) -> list[tuple[int, int]]:
        """[a, b) split at the commas outside brackets."""
        parts: list[tuple[int, int]] = []
        start, j = a, a
        while j < b:
            t = self.toks[j]
            if bracket_delta(t) > 0:
                j = self.closer[j] + 1  # skip the bracketed part at once
                continue
            if t.kind is _SYMBOL and t.text == ",":
                parts.append((start, j))
                start = j + 1
            j += 1
        parts.append((start, b))
        return [(x, y) for x, y in parts if x < y]


_DECLARING = frozenset(
    "def abbrev theorem lemma instance opaque structure class inductive axiom".split()
)

# A command's first token: a command word, a `#` command, an attribute list, a doc comment.
# Nothing is asked of what comes before it: recovery tries every position, so `xdef f` holds
# the command `def f`; what follows must end the word (`defined` is an identifier).
_COMMAND_START = re.compile(
    r"#[A-Za-z_]\w*|@\[|/--|/-!|(?:"
    + "|".join(sorted((re.escape(w) for w in COMMANDS), key=len, reverse=True))
    + r")(?![\w'!?»])"
)


def _refused_command(word: str) -> bool:
    if word.startswith("#"):
        return HASH_COMMANDS.get(word[1:]) != ""
    if word in ("@[", "/--", "/-!"):
        return False
    return bool(COMMANDS.get(word))


def _closers(tokens: list[Token]) -> tuple[list[int], int | None]:
    """For each opening bracket, the index of the token that closes it (``len(tokens)`` when
    nothing does; other entries are unused), and the first opening bracket nested deeper than
    :data:`MAX_NESTING` (None when there is none)."""
    closer = [len(tokens)] * len(tokens)
    stack: list[int] = []
    too_deep: int | None = None
    for j, t in enumerate(tokens):
        delta = bracket_delta(t)
        if delta > 0:
            stack.append(j)
            if too_deep is None and len(stack) > MAX_NESTING:
                too_deep = j
        elif delta < 0 and stack:
            closer[stack.pop()] = j
    return closer, too_deep


def _is_code_attribute(name: str) -> bool:
    return (
        name in CODE_ATTRIBUTES
        or name.endswith(("_parser", "_proc", "_elab", "_delab"))
        or name.startswith(("builtin_", "aesop"))
    )


def _notation_atoms(tokens: list[Token]) -> tuple[list[str], list[Finding]]:
    """The new tokens that notation commands declare (their string atoms before ``=>``), and
    findings for atoms that would change how comments, strings or names are read."""
    atoms: list[str] = []
    bad: list[Finding] = []
    for i, t in enumerate(tokens):
        if t.kind is not _IDENT or t.escaped or t.text not in NOTATION_COMMANDS:
            continue
        for k in range(i + 1, len(tokens)):  # (no slice: a copy per command is quadratic)
            u = tokens[k]
            if u.kind is _SYMBOL and u.text == "=>":
                break
            if u.kind is _IDENT and not u.escaped and u.text in COMMANDS:
                break
            if u.kind is not _STRING:
                continue
            atom = _atom_text(u.text)
            if any(s in atom for s in ('"', "`", "«", "»", "--", "/-", "-/")) or not atom:
                bad.append(
                    Finding(
                        Reason.FORBIDDEN,
                        f"{t.text} {u.text}",
                        u.line,
                        "a notation token with a quote, backtick, `«»` or comment marker changes "
                        "where Lean's comments, strings and names begin and end",
                    )
                )
            else:
                atoms.append(atom)
    return atoms, bad


def _atom_text(literal: str) -> str:
    if literal.startswith("r"):
        body = literal.lstrip("r").strip("#")[1:-1]
    else:
        body = literal[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    return body.strip()
