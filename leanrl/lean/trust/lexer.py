"""A lexer for Lean 4 source text that reads comments, strings and names the way Lean does.

Lean has no separate lexer: its parser calls ``Lean.Parser.whitespace`` and ``tokenFn``
(``src/Lean/Parser/Basic.lean``) at every token boundary. This module follows those two functions
rule by rule, because the pre-scan and the proof extractor are only worth anything if they see
exactly the code Lean sees. What it follows:

* **whitespace** is ``' '``, ``'\\n'`` and ``'\\r\\n'`` only; a tab or an isolated ``'\\r'`` outside a
  literal is a Lean error. ``--`` starts a line comment and ``/-`` a block comment, unless it is
  ``/--`` or ``/-!`` (doc comments are *tokens*). Block comments nest: ``/-`` inside adds a level,
  ``-/`` removes one. An unterminated block comment is a Lean error.
* **string literals** ``"..."`` with the escapes ``\\\\ \\" \\' \\n \\t \\r``, ``\\xHH``, ``\\uHHHH``
  (exactly four hex digits; Lean has no ``\\u{...}``) and string gaps (``\\`` + newline +
  indentation). Raw strings ``r"..."``/``r#"..."#`` have no escapes. Interpolated strings
  (``s!"a{e}b"``, ``m!``, ``f!``, ``throwError``) hold code between ``{`` and ``}``: that code is
  lexed as code.
* **character literals**: a ``'`` at a token boundary that is not followed by another ``'`` starts
  one (``'a'``, ``'\\n'``); a ``'`` *inside* an identifier (``h'``, ``x''``) belongs to it.
* **identifiers**: ``isIdFirst``/``isIdRest`` (ASCII letters, ``_``, Greek except ``λΠΣ``, Coptic,
  the letter-like block with ``ℕ ℝ``, mathematical alphanumerics, Latin-1 and Latin Extended-A
  letters; digits, ``' ! ?`` and subscripts after the first character), ``«...»`` escaped parts,
  dotted names. Each identifier carries its *normalized* name: the components with ``«»`` removed.
* **numbers** (decimal with ``_`` separators, ``0x``/``0b``/``0o``, scientific), **name literals**
  (`` `foo ``) and **symbols**, split by longest match against a table of Lean's and Mathlib's
  multi-character tokens.

Where the token table matters for where a comment starts (``x //- y -/`` is ``//`` then ``-``, not a
comment), the table holds the tokens that can make a difference, and a comment that starts glued
to a symbol Lean might read as a longer token is reported as an error instead of guessed at.
Likewise a plain string literal whose ``{...}`` would be read differently if Lean took it as an
interpolated string (that depends on the keyword before it) is an error. Every error is a token
of kind ``ERROR``; the pre-scan rejects any text that has one (Lean would either fail on it too,
or the text is ambiguous).
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from copy import copy
from dataclasses import dataclass, field
from enum import Enum
from functools import lru_cache
from typing import NamedTuple

__all__ = [
    "MAX_TOKENS",
    "TOO_MANY_TOKENS",
    "Kind",
    "Token",
    "bracket_delta",
    "code_only",
    "is_id_first",
    "is_id_rest",
    "mask_comments",
    "tokenize",
    "too_many_tokens",
]


class Kind(str, Enum):
    """What a token is."""

    IDENT = "ident"
    """An identifier or a keyword (``theorem``, ``by``); keywords are told apart by their text."""
    SYMBOL = "symbol"
    """A symbol token (``:=``, ``(``, ``@[``, ``∑'``)."""
    NUMBER = "number"
    """A numeric literal (``42``, ``0x1F``, ``2.5e3``, a field index)."""
    STRING = "string"
    """A string literal, raw or interpolated (its whole text)."""
    CHAR = "char"
    """A character literal (``'a'``)."""
    NAME = "name"
    """A name literal (`` `Nat.succ ``)."""
    DOC = "doc"
    """A doc comment ``/-- ... -/`` or module doc ``/-! ... -/`` (a token in Lean)."""
    COMMENT = "comment"
    """A ``--`` or ``/- -/`` comment (only when asked for: comments are whitespace)."""
    ERROR = "error"
    """Text Lean would reject, or that the lexer cannot read unambiguously (see ``error``)."""


# The kinds as plain names: on Python 3.11 each `Kind.IDENT` is a slow attribute look-up, and
# these are read for every token.
_IDENT, _SYMBOL, _NUMBER = Kind.IDENT, Kind.SYMBOL, Kind.NUMBER
_STRING, _CHAR, _NAME = Kind.STRING, Kind.CHAR, Kind.NAME
_DOC, _COMMENT, _ERROR = Kind.DOC, Kind.COMMENT, Kind.ERROR


class Token(NamedTuple):
    """One token of Lean source text (immutable; a named tuple because a long text has hundreds
    of thousands of them, and a tuple is made several times faster than a frozen dataclass)."""

    kind: Kind
    """What the token is."""
    text: str
    """The token exactly as written."""
    start: int
    """Offset of its first character in the text."""
    end: int
    """Offset just after its last character."""
    line: int
    """1-based line of its first character."""
    col: int
    """0-based column (in code points, as Lean counts) of its first character."""
    value: str = ""
    """Identifiers and name literals: the name with ``«»`` removed from each component
    (``Lean.«reduceBool»`` -> ``Lean.reduceBool``); other tokens: their text."""
    parts: tuple[str, ...] = ()
    """Identifiers and name literals: the name's components, unescaped."""
    space_before: bool = True
    """Whether whitespace or a comment separates it from the previous token."""
    nested: bool = False
    """True for code inside an interpolated string's ``{...}``."""
    error: str = ""
    """For ``ERROR`` tokens: what is wrong, in words."""

    @property
    def escaped(self) -> bool:
        """An identifier written with ``«»`` in any component (never a keyword)."""
        return "«" in self.text


# -- character classes (Init/Meta/Defs.lean: isLetterLike, isSubScriptAlnum, isIdFirst, isIdRest)


def _is_letter_like(c: str) -> bool:
    if len(c) != 1:
        return False
    v = ord(c)
    return (
        (0x3B1 <= v <= 0x3C9 and v != 0x3BB)  # Greek lower case, but not λ
        or (0x391 <= v <= 0x3A9 and v not in (0x3A0, 0x3A3))  # Greek upper case, not Π Σ
        or 0x3CA <= v <= 0x3FB  # Coptic
        or 0x1F00 <= v <= 0x1FFE  # polytonic Greek
        or 0x2100 <= v <= 0x214F  # letter-like block: ℕ ℤ ℚ ℝ ℂ
        or 0x1D49C <= v <= 0x1D59F  # script, double-struck, Fraktur Latin letters
        # Latin-1 and Latin Extended-A letters (lean4#9035, v4.22); older Lean rejects them
        # outright, so treating them as letters only matters where that Lean fails anyway.
        or (0xC0 <= v <= 0xFF and v not in (0xD7, 0xF7))
        or 0x100 <= v <= 0x17F
    )


def _is_subscript_alnum(c: str) -> bool:
    if len(c) != 1:
        return False
    v = ord(c)
    return 0x2080 <= v <= 0x2089 or 0x2090 <= v <= 0x209C or 0x1D62 <= v <= 0x1D6A or v == 0x2C7C


def _ascii_alpha(c: str) -> bool:
    return ("a" <= c <= "z") or ("A" <= c <= "Z")


def is_id_first(c: str) -> bool:
    """Lean's ``isIdFirst``: can ``c`` start an identifier (part)."""
    return _ascii_alpha(c) or c == "_" or _is_letter_like(c)


def is_id_rest(c: str) -> bool:
    """Lean's ``isIdRest``: can ``c`` continue an identifier (part)."""
    return (
        _ascii_alpha(c)
        or "0" <= c <= "9"
        or c in "_'!?"
        or _is_letter_like(c)
        or _is_subscript_alnum(c)
    )


def _is_digit(c: str) -> bool:
    return "0" <= c <= "9"


def _is_hex(c: str) -> bool:
    return _is_digit(c) or "a" <= c <= "f" or "A" <= c <= "F"


# Multi-character symbol tokens of Lean core and Mathlib. Only their *boundaries* matter here:
# where the next token starts decides whether a `--`, `/-`, `"` or `'` there opens a comment,
# string or character literal. The ones that make a difference: `//` and `\/` (`//-` is not a
# comment), `<-` (`<--` is not one either), and the tokens with a `'` inside (`∑'`, `⁻¹'`, `''`).
SYMBOLS: frozenset[str] = frozenset(
    """
    := :: ::= -> <- <-> => <;> <|> <| |> |>. <$> <*> <* *> >>= >> << && || == != ≠ <= >= ≤ ≥ /.
    ^^ ++ .. ... %[ #[ @[ @& .( ⟨ ⟩ ⦃ ⦄ ⟦ ⟧ // /\\ \\/ ↔ ∘ ⁻¹ ⁻¹' '' ∑' ∏' ⨆' ⨅' ∑ ∏ ‖₊ ⌋₊ ⌉₊
    ∀ᶠ ∃ᶠ =ᶠ[ ≤ᶠ[ →+* ≃+* →* ≃* →+ ≃+ →ₗ[ ≃ₗ[ →L[ ×ˢ +ᵥ -ᵥ ∫⁻ ⬝ᵥ ⊆ ⊂ ⊇ ⊃ →o ↪ ≃ ≅ ⟶ ⥤ ≫ ⋙
    `( `[ `(tactic| ‹ › ⟪ ⟫ ⁅ ⁆ [MOD [ZMOD [PMOD ^[ $( $[ |-
    """.split()
)
# Tokens that start like an identifier but go on with symbol characters (`ℝ≥0` is one token).
_ID_SYMBOLS: frozenset[str] = frozenset("ℝ≥0 ℝ≥0∞ ℤ√ ℤ_[ ℚ_[ 𝓝[ 𝓝ˢ 𝓤[".split())

# A comment glued to these symbols is unambiguous: no Lean or Mathlib token starts with one of
# them followed by `-` or `/`. Glued to any other symbol it is reported (see `_glued_comment`).
_SAFE_BEFORE_COMMENT = frozenset("()[]{}⟨⟩,")

# Keywords after which a string literal is interpolated (Lean core and Batteries).
INTERPOLATING = frozenset("s! m! f!".split())
"""Tokens after which a string is always interpolated. After anything else -- ``throwError``,
``dbg_trace`` and ``logInfo`` included, which are ordinary names in some positions and take
plain strings in others -- a string with ``{`` must read the same both ways (see ``string``)."""

_QUOTABLE = frozenset("\\\"'rnt")
_ASCII_ID_REST = re.compile(r"[A-Za-z0-9_'!?]*")
# A dotted name in ASCII only: most names, read in one match (see `ident_parts`).
_ASCII_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_'!?]*(?:\.[A-Za-z_][A-Za-z0-9_'!?]*)*")
# Characters that are a symbol token on their own unless a longer symbol starts with them
# (no quote, backtick, `/`, digit or letter: those start literals, comments or names).
_SINGLE = frozenset("()[]{},;~?|&!#$%*+-.:<=>@^\\⟨⟩⦃⦄⟦⟧")
_MAX_DEPTH = 16  # interpolated strings inside interpolated strings, as far as the lexer follows

MAX_TOKENS = 32_768
"""The most tokens any tokenization of a text produces; past it the stream ends with an
``ERROR`` token whose ``error`` is :data:`TOO_MANY_TOKENS`, and the pre-scan, tactic pre-scan and
extraction answer ``too_large``. Lexing costs time per token (a few microseconds each in Python;
extraction lexes parts of its text more than once), and text like ``x.1x.1...`` is one token per
character, so without a bound one megabyte of model text held the pre-scan or the extractor for
tens of seconds. At the bound the slowest shape costs ~0.3 s of CPU in extraction and ~0.2 s in
the pre-scan (``benchmarks/prescan_scaling.py --at-cap``). The largest published prover proof we
know of (DeepSeek-Prover-V2's 438 miniF2F solutions) has 11,694 tokens in 46,804 characters:
the bound leaves it almost three times the room (about 130,000 characters of ordinary Lean)."""
TOO_MANY_TOKENS = f"token bound: more than {MAX_TOKENS:,} tokens, the lexer reads no further"
"""The ``error`` of the last token when a text is past a token bound (see :func:`too_many_tokens`)."""


@dataclass
class _Lexer:
    text: str
    symbols: frozenset[str]
    keep_comments: bool
    tokens: list[Token] = field(default_factory=list)
    line_starts: list[int] = field(default_factory=list)
    symbol_lengths: tuple[int, ...] = ()
    id_symbols: frozenset[str] = frozenset()
    id_symbol_lengths: tuple[int, ...] = ()
    id_firsts: frozenset[str] = frozenset()
    symbol_firsts: frozenset[str] = frozenset()
    single: frozenset[str] = frozenset()
    spaced: bool = True  # whether whitespace came before the token being lexed
    n: int = 0  # where the text ends for this lexer (a probe reads only up to a bound)
    depth: int = 0  # interpolated strings being read inside each other
    max_tokens: int = MAX_TOKENS  # see MAX_TOKENS; checked once per token in `run`

    def __post_init__(self) -> None:
        self.n = len(self.text)
        starts = [0]
        find = self.text.find
        k = find("\n")
        while k >= 0:  # (a loop over the newlines, not over every character)
            starts.append(k + 1)
            k = find("\n", k + 1)
        self.line_starts = starts
        (
            self.symbol_lengths,
            self.id_symbols,
            self.id_symbol_lengths,
            self.id_firsts,
            self.symbol_firsts,
            self.single,
        ) = _table(self.symbols)

    # -- positions ------------------------------------------------------------------------------

    def at(self, i: int) -> str:
        return self.text[i] if i < self.n else ""

    def emit(
        self,
        kind: Kind,
        start: int,
        end: int,
        nested: bool = False,
        *,
        value: str | None = None,
        parts: tuple[str, ...] = (),
        error: str = "",
        space_before: bool | None = None,
    ) -> Token:
        line = bisect_right(self.line_starts, start) - 1
        text = self.text[start:end]
        tok = Token(
            kind,
            text,
            start,
            end,
            line + 1,
            start - self.line_starts[line],
            text if value is None else value,
            parts,
            self.spaced if space_before is None else space_before,
            nested,
            error,
        )
        self.tokens.append(tok)
        return tok

    def error(self, start: int, end: int, msg: str, nested: bool = False) -> int:
        self.emit(_ERROR, start, max(end, start), nested, error=msg)
        return self.n  # stop: after an error nothing further can be trusted

    # -- whitespace and comments (Lean.Parser.whitespace) ---------------------------------------

    def whitespace(self, i: int, nested: bool) -> tuple[int, bool]:
        """Skip whitespace and comments from ``i``; (next position, whether anything was skipped).
        Returns position ``len(text)`` after an error token was emitted."""
        start = i
        n = self.n
        while i < n:
            c = self.text[i]
            if c == " " or c == "\n":
                i += 1
            elif c == "\r":
                if self.at(i + 1) != "\n":
                    return self.error(i, i + 1, "isolated carriage return", nested), True
                i += 2
            elif c == "\t":
                return self.error(i, i + 1, "tab character (Lean rejects tabs)", nested), True
            elif c == "-" and self.at(i + 1) == "-":
                if self._glued_comment(i, nested):
                    return n, True
                j = self.text.find("\n", i, n)
                j = n if j < 0 else j
                if self.keep_comments:
                    self.emit(_COMMENT, i, j, nested)
                i = j
            elif c == "/" and self.at(i + 1) == "-" and self.at(i + 2) not in ("-", "!"):
                if self._glued_comment(i, nested):
                    return n, True
                j = self.block_end(i + 2)
                if j < 0:
                    return self.error(i, n, "unterminated comment", nested), True
                if self.keep_comments:
                    self.emit(_COMMENT, i, j, nested)
                i = j
            else:
                break
        return i, i > start

    def block_end(self, i: int) -> int:
        """End of a block comment whose body starts at ``i`` (nesting 1), or -1 (unterminated)."""
        depth = 1
        n = self.n
        while i < n:
            c = self.text[i]
            if c == "-" and self.at(i + 1) == "/":
                depth -= 1
                i += 2
                if depth == 0:
                    return i
            elif c == "/" and self.at(i + 1) == "-":
                depth += 1
                i += 2
            else:
                i += 1
        return -1

    def _glued_comment(self, i: int, nested: bool) -> bool:
        """A comment opener right after a symbol, with no space: Lean may read the symbol and the
        opener's first character as one longer token (as it does for ``//-``), so what follows
        would be code to Lean. Reported rather than guessed."""
        prev = self.tokens[-1] if self.tokens else None
        if prev is None or prev.end != i or prev.kind is not _SYMBOL:
            return False
        if prev.text[-1] in _SAFE_BEFORE_COMMENT:
            return False
        opener = self.text[i : i + 2]
        self.error(
            prev.start,
            i + 2,
            f"a comment opener `{opener}` right after the symbol `{prev.text}`: Lean may read "
            f"them as one token (put a space before `{opener}`)",
            nested,
        )
        return True

    # -- the token loop -------------------------------------------------------------------------

    def run(self, i: int, *, stop_at_brace: bool = False, nested: bool = False) -> int:
        """Lex from ``i`` to the end, or (``stop_at_brace``) to the ``}`` that closes an
        interpolated string's ``{``; returns the position after the last token (at that ``}``),
        or ``len(text)`` after an error."""
        depth = 0
        n = self.n
        while True:
            i, spaced = self.whitespace(i, nested)
            if i >= n:
                return n
            c = self.text[i]
            if stop_at_brace and c == "}" and depth == 0:
                return i
            before = len(self.tokens)
            if before >= self.max_tokens:
                self.emit(_ERROR, i, n, nested, error=_too_many(self.max_tokens))
                return n
            self.spaced = spaced or before == 0
            i = self.token(i, nested)
            self.spaced = True
            if len(self.tokens) > before:
                tok = self.tokens[before]
                if tok.kind is _ERROR:
                    return n
                if stop_at_brace and tok.kind is _SYMBOL:
                    depth += tok.text.count("{") - tok.text.count("}")

    def token(self, i: int, nested: bool) -> int:
        """Lex one token at ``i`` (not whitespace); return the position after it."""
        t = self.text
        c = t[i]
        if c in self.single:  # a symbol of one character that starts no longer one: at once
            return self.emit(_SYMBOL, i, i + 1, nested).end
        nxt = self.at(i + 1)
        if c == '"':
            return self.string(i, i + 1, nested, interpolated=self._interpolating())
        if c == "'" and nxt != "'":
            return self.char(i, nested)
        if _is_digit(c):
            return self.number(i, nested)
        if c == "`" and (is_id_first(nxt) or nxt == "«"):
            end, parts, err = self.ident_parts(i + 1)
            if err:
                return self.error(i, end, err, nested)
            return self._emit_name(_NAME, i, end, parts, nested)
        if c == "r" and self._raw_start(i + 1):
            return self.raw_string(i, nested)
        if is_id_first(c) or c == "«":
            return self.ident(i, nested)
        return self.symbol(i, nested)

    # -- identifiers ------------------------------------------------------------------------------

    def ident_parts(self, i: int) -> tuple[int, list[str], str]:
        """Lean's ``identFnAux`` from ``i``: (end, components, error message or '')."""
        t = self.text
        n = self.n
        m = _ASCII_NAME.match(t, i, n)
        if m is not None:
            # The common case at once: the name ends where an ASCII character that cannot go
            # on with it comes (or a `.` then one). A non-ASCII one takes the general path.
            e = m.end()
            c = t[e] if e < n else ""
            if c == "." and e + 1 < n:
                c = t[e + 1]
            if c < "\x80":
                return e, t[i:e].split("."), ""
        parts: list[str] = []
        while True:
            c = self.at(i)
            if c == "«":
                j = t.find("»", i + 1, n)
                if j < 0:
                    return n, parts, "unterminated identifier escape `«`"
                parts.append(t[i + 1 : j])
                i = j + 1
            elif c and is_id_first(c):
                m = _ASCII_ID_REST.match(t, i + 1, n)  # the common case, then other letters
                j = m.end() if m else i + 1
                while j < n and is_id_rest(t[j]):
                    j = _ASCII_ID_REST.match(t, j + 1, n).end()  # type: ignore[union-attr]
                parts.append(t[i:j])
                i = j
            else:  # only reached after a `.` that `isIdCont` accepted
                return i, parts, ""
            # `isIdCont`: a `.` followed by an identifier start continues the name.
            if self.at(i) == "." and (is_id_first(self.at(i + 1)) or self.at(i + 1) == "«"):
                i += 1
                continue
            return i, parts, ""

    def ident(self, i: int, nested: bool) -> int:
        end, parts, err = self.ident_parts(i)
        if err:
            return self.error(i, end, err, nested)
        # `mkIdResult`: a token at least as long as the identifier wins (`ℝ≥0` is one token).
        if self.text[i] in self.id_firsts:
            for k in self.id_symbol_lengths:
                if k < end - i:
                    break
                if k <= self.n - i and self.text[i : i + k] in self.id_symbols:
                    return self.emit(_SYMBOL, i, i + k, nested).end
        word = self.text[i:end]
        if "'" in word and any(_version_letter(c) for c in word):
            # Before v4.22 these letters end an identifier, and the `'` after them starts a
            # character literal (see `_quote_then_comment`).
            for q in (k for k in range(i, end) if self.text[k] == "'"):
                if self._quote_then_comment(q, nested):
                    return self.n
        return self._emit_name(_IDENT, i, end, parts, nested)

    def _quote_then_comment(self, q: int, nested: bool) -> bool:
        """A `'` at ``q`` that this lexer reads inside a longer token, but that a Lean without
        that token (a header without Mathlib has no `∑'` or `''`; Lean before v4.22 has no `é`
        in names) reads as the start of a character literal. When that literal fails, Lean's
        error recovery resumes a few characters on, and if a comment opens there, what this
        lexer takes for a comment is code to Lean. Reported rather than guessed."""
        window = self.text[q + 1 : q + 9]  # `'`, an escape of up to 6 characters, one more
        hit = min((k for k in (window.find("--"), window.find("/-")) if k >= 0), default=-1)
        if hit < 0:
            return False
        self.error(
            q,
            q + 1 + hit + 2,
            "a comment opener right after a `'` that some Lean versions or headers read as the "
            "start of a character literal, resuming inside the comment (put a space after the "
            "`'`-token and keep comments away from it)",
            nested,
        )
        return True

    def _emit_name(self, kind: Kind, i: int, end: int, parts: list[str], nested: bool) -> int:
        self.emit(kind, i, end, nested, value=".".join(parts), parts=tuple(parts))
        return end

    # -- literals ---------------------------------------------------------------------------------

    def _interpolating(self) -> bool | None:
        """True after a keyword that takes an interpolated string; None when unknown. Comments
        kept as tokens (``keep_comments``) are whitespace here, as they are to Lean."""
        k = len(self.tokens) - 1
        while k >= 0 and self.tokens[k].kind is _COMMENT:
            k -= 1
        prev = self.tokens[k] if k >= 0 else None
        if prev is not None and prev.kind is _IDENT and prev.text in INTERPOLATING:
            return True
        return None

    def escape(self, i: int, in_string: bool, interp: bool) -> tuple[int, str]:
        """Lean's ``quotedCharCoreFn`` after a backslash at ``i - 1``: (end, error or '')."""
        c = self.at(i)
        if c == "":
            return i, "unterminated escape sequence"
        if c in _QUOTABLE or (interp and c == "{"):
            return i + 1, ""
        if c == "x":
            if _is_hex(self.at(i + 1)) and _is_hex(self.at(i + 2)):
                return i + 3, ""
            return i + 1, "`\\x` needs two hexadecimal digits"
        if c == "u":
            if all(_is_hex(self.at(i + k)) for k in range(1, 5)):
                return i + 5, ""
            return i + 1, "`\\u` needs exactly four hexadecimal digits (Lean has no `\\u{...}`)"
        if in_string and (c == "\n" or (c == "\r" and self.at(i + 1) == "\n")):
            # A string gap: `\` at the end of a line, then the next line's indentation. Lean's
            # `stringGapFn`: whitespace may follow, but not a second newline.
            j = i + (2 if c == "\r" else 1)
            while self.at(j) in (" ", "\t", "\r"):
                j += 1
            if self.at(j) == "\n":
                return j, "more than one newline in a string gap"
            return j, ""
        return i, f"invalid escape sequence `\\{c}`"

    def scan_plain(self, i: int) -> tuple[int, str]:
        """A plain string literal's body from ``i`` (after the opening quote): (end, error)."""
        n = self.n
        while i < n:
            c = self.text[i]
            if c == '"':
                return i + 1, ""
            if c == "\\":
                i, err = self.escape(i + 1, True, False)
                if err:
                    return i, err
            else:
                i += 1
        return n, "unterminated string literal"

    def string(self, start: int, i: int, nested: bool, interpolated: bool | None) -> int:
        if interpolated:
            return self._interpolated(start, i, nested)
        end, err = self.scan_plain(i)
        if err:
            return self.error(start, end, err, nested)
        if "{" in self.text[i : end - 1]:
            # Lean reads it as interpolated after a keyword that takes one (`s!`, `throwError`,
            # and keywords of libraries not known here): the two readings must agree on where
            # the literal ends. The interpolated reading is tried only up to the plain one's end,
            # so this costs no more than the literal itself.
            probe = copy(self)
            # (the probe sees the previous token only: all the rules look back one token)
            probe.n, probe.tokens, probe.depth = end, self.tokens[-1:], self.depth + 1
            mark = len(probe.tokens)
            p_end = probe._interpolated(start, i, nested)
            inner = probe.tokens[mark:]
            errors = [tok.error for tok in inner if tok.kind is _ERROR]
            if not errors and p_end == end:
                self.tokens.extend(inner)  # its `{...}` may be code to Lean: lexed as code
                return end
            if any("unterminated" in e or "nested too deeply" in e for e in errors):
                # the interpolated reading runs past the plain one's end: it would end elsewhere
                return self.error(
                    start,
                    end,
                    "a string literal with `{` that Lean reads differently when it is "
                    "interpolated (after `s!`, `m!`, `throwError`, ...)",
                    nested,
                )
            # otherwise Lean could not read it as interpolated at all: it is a plain string
        self.emit(_STRING, start, end, nested)
        return end

    def _interpolated(self, start: int, i: int, nested: bool) -> int:
        """Lean's ``interpolatedStrFn``: text, ``{`` code ``}``, text, ... up to ``"``."""
        n = self.n
        if self.depth > _MAX_DEPTH:
            return self.error(start, n, "interpolated strings nested too deeply", nested)
        mark = len(self.tokens)
        spaced = self.spaced  # the code inside is lexed by `run`, which resets it
        code: list[Token] = []
        while True:
            if i >= n:
                return self.error(start, n, "unterminated string literal", nested)
            c = self.text[i]
            if c == '"':
                end = i + 1
                break
            if c == "\\":
                i, err = self.escape(i + 1, True, True)
                if err:
                    return self.error(start, i, err, nested)
            elif c == "{":
                before = len(self.tokens)
                self.depth += 1
                j = self.run(i + 1, stop_at_brace=True, nested=True)
                self.depth -= 1
                piece = self.tokens[before:]
                del self.tokens[before:]
                code.extend(piece)
                # (only this piece's tokens are new: looking through all of `code` each time
                # would make a string with many `{...}` quadratic)
                if any(tok.kind is _ERROR for tok in piece):
                    self.tokens.extend(code)
                    return n
                if j >= n or self.text[j] != "}":
                    return self.error(start, n, "unterminated `{` in interpolated string", nested)
                i = j + 1
            else:
                i += 1
        del self.tokens[mark:]
        self.emit(_STRING, start, end, nested, space_before=spaced)
        self.tokens.extend(code)
        return end

    def _raw_start(self, i: int) -> bool:
        while self.at(i) == "#":
            i += 1
        return self.at(i) == '"'

    def raw_string(self, start: int, nested: bool) -> int:
        i = start + 1
        hashes = 0
        while self.at(i) == "#":
            hashes += 1
            i += 1
        i += 1  # the opening quote
        close = '"' + "#" * hashes
        j = self.text.find(close, i, self.n)
        if j < 0:
            return self.error(start, self.n, "unterminated raw string literal", nested)
        end = j + len(close)
        self.emit(_STRING, start, end, nested)
        return end

    def char(self, start: int, nested: bool) -> int:
        """Lean's ``charLitFnAux``: one character or escape, then ``'``."""
        i = start + 1
        c = self.at(i)
        if c == "":
            return self.error(start, i, "unterminated character literal", nested)
        if c == "\\":
            i, err = self.escape(i + 1, False, False)
            if err:
                return self.error(start, i, err, nested)
        else:
            i += 1
        if self.at(i) != "'":
            return self.error(start, i, "missing end of character literal", nested)
        self.emit(_CHAR, start, i + 1, nested)
        return i + 1

    def number(self, start: int, nested: bool) -> int:
        t = self.text
        prev = self.tokens[-1] if self.tokens else None
        if (
            prev is not None
            and prev.text == "."
            and prev.end == start
            and len(self.tokens) >= 2
            and self.tokens[-2].end == prev.start
            and self.tokens[-2].kind is not _COMMENT  # (kept comments are whitespace)
        ):
            # A projection `h.2.1`: Lean's `fieldIdx` takes the digits only.
            j = start
            while _is_digit(self.at(j)):
                j += 1
            self.emit(_NUMBER, start, j, nested)
            return j
        c, nxt = t[start], self.at(start + 1)
        if c == "0" and nxt in ("b", "B", "o", "O", "x", "X"):
            allowed = {"b": "01", "o": "01234567"}.get(nxt.lower())
            check: Callable[[str], bool] = (lambda d: d in allowed) if allowed else _is_hex
            j, err = self._digits(start + 2, check, True)
            if err:
                return self.error(start, j, err, nested)
            self.emit(_NUMBER, start, j, nested)
            return j
        j, _ = self._digits(start, _is_digit, False)
        if self.at(j) == ".":
            j += 1
            if _is_digit(self.at(j)):
                j, _ = self._digits(j, _is_digit, False)
        if self.at(j) in ("e", "E"):
            k = j + 1
            if self.at(k) in ("+", "-"):
                k += 1
            if not _is_digit(self.at(k)):
                return self.error(start, k, "missing exponent digits in scientific literal", nested)
            j, _ = self._digits(k, _is_digit, False)
        self.emit(_NUMBER, start, j, nested)
        return j

    def _digits(self, i: int, check: Callable[[str], bool], need: bool) -> tuple[int, str]:
        """Lean's ``takeDigitsFn``: digits with ``_`` separators (a ``_`` needs a digit after)."""
        while True:
            c = self.at(i)
            if c == "_":
                need = True
                i += 1
            elif c and check(c):
                need = False
                i += 1
            elif need:
                return i, "a digit is missing in a numeric literal"
            else:
                return i, ""

    def symbol(self, i: int, nested: bool) -> int:
        t = self.text
        if t.startswith("/--", i, self.n) or t.startswith("/-!", i, self.n):
            if self._glued_comment(i, nested):
                return self.n
            j = self.block_end(i + 3)
            if j < 0:
                return self.error(i, self.n, "unterminated doc comment", nested)
            self.emit(_DOC, i, j, nested)
            return j
        lengths = self.symbol_lengths if t[i] in self.symbol_firsts else ()
        room = self.n - i
        for k in lengths:
            if k <= room and t[i : i + k] in self.symbols:
                if "'" in t[i : i + k]:  # `∑'`, `''`, `⁻¹'`: tokens only where Mathlib is
                    for q in (j for j in range(i, i + k) if t[j] == "'"):
                        if self._quote_then_comment(q, nested):
                            return self.n
                return self.emit(_SYMBOL, i, i + k, nested).end
        return self.emit(_SYMBOL, i, i + 1, nested).end


@lru_cache(maxsize=8)
def _table(
    symbols: frozenset[str],
) -> tuple[
    tuple[int, ...], frozenset[str], tuple[int, ...], frozenset[str], frozenset[str], frozenset[str]
]:
    """What the lexer derives from its symbol table, once per table (not once per text):
    the lengths of the multi-character symbols, longest first (longest match is tried over the
    lengths the table has: a long notation atom costs one look-up per distinct length, not one
    per character); the symbols that start like an identifier, their lengths and first
    characters (``mkIdResult``: a token at least as long as the identifier wins); the symbols'
    first characters; the characters that are always a symbol on their own."""
    lengths = tuple(sorted({len(s) for s in symbols if len(s) > 1}))[::-1]
    ids = _ID_SYMBOLS | {s for s in symbols if is_id_first(s[0])}
    id_lengths = tuple(sorted({len(s) for s in ids}))[::-1]
    single = _SINGLE - {s[0] for s in symbols if len(s) > 1}
    return (
        lengths,
        frozenset(ids),
        id_lengths,
        frozenset(s[0] for s in ids),
        frozenset(s[0] for s in symbols),
        single,
    )


def _version_letter(c: str) -> bool:
    """Latin-1 and Latin Extended-A letters: identifier characters from Lean v4.22 on only."""
    v = ord(c)
    return (0xC0 <= v <= 0xFF and v not in (0xD7, 0xF7)) or 0x100 <= v <= 0x17F


_OPENS = frozenset("([{⟨⦃⟦")
_CLOSES = frozenset(")]}⟩⦄⟧")


def bracket_delta(tok: Token) -> int:
    """+1 for a symbol that opens a bracket (``(``, ``@[``, ``[MOD``, ``⟨``), -1 for one that
    closes it, 0 otherwise."""
    if tok.kind is not _SYMBOL:
        return 0
    delta = _DELTAS.get(tok.text)
    if delta is None:
        delta = sum(c in _OPENS for c in tok.text) - sum(c in _CLOSES for c in tok.text)
        if len(_DELTAS) < 4096:  # symbols are few; the odd characters of hostile text are not
            _DELTAS[tok.text] = delta
    return delta


_DELTAS: dict[str, int] = {}


def tokenize(
    text: str,
    *,
    extra_symbols: Iterable[str] = (),
    keep_comments: bool = False,
    max_tokens: int = MAX_TOKENS,
) -> list[Token]:
    """The tokens of ``text`` in order (code inside interpolated strings included, marked
    ``nested``). Comments are whitespace unless ``keep_comments``. Lexing stops at the first
    error, which is the last token (kind ``ERROR``), and after ``max_tokens`` tokens (the last
    token is then an ``ERROR`` whose ``error`` says so: :func:`too_many_tokens`)."""
    return list(_tokenize(text, frozenset(extra_symbols), keep_comments, max_tokens))


def _too_many(bound: int) -> str:
    return f"token bound: more than {bound:,} tokens, the lexer reads no further"


def too_many_tokens(tokens: Sequence[Token]) -> bool:
    """Whether ``tokens`` ended because the text is past the token bound (not a Lean error)."""
    return (
        bool(tokens) and tokens[-1].kind is _ERROR and tokens[-1].error.startswith("token bound:")
    )


@lru_cache(maxsize=32)
def _tokenize(
    text: str, extra: frozenset[str], keep_comments: bool, max_tokens: int = MAX_TOKENS
) -> tuple[Token, ...]:
    # Cached: extraction and the pre-scan read the same texts several times. Tokens are frozen.
    lx = _Lexer(text, SYMBOLS | extra if extra else SYMBOLS, keep_comments)
    lx.max_tokens = max_tokens
    lx.run(0)
    return tuple(lx.tokens)


def _blank(text: str, spans: Sequence[tuple[int, int]]) -> str:
    out = list(text)
    for a, b in spans:
        for k in range(a, b):
            if out[k] not in ("\n", "\r"):
                out[k] = " "
    return "".join(out)


def mask_comments(text: str, *, docs: bool = True) -> str:
    """``text`` with every comment (and doc comment, unless ``docs=False``) blanked out, newlines
    kept, so offsets and line/column positions still match. Text after a lexing error is kept
    as it is (it cannot be read safely; callers that care check :func:`tokenize` for errors)."""
    spans = [
        (t.start, t.end)
        for t in tokenize(text, keep_comments=True)
        if t.kind is _COMMENT or (docs and t.kind is _DOC) or _open_comment(t)
    ]
    return _blank(text, spans)


def _open_comment(t: Token) -> bool:
    """An unterminated comment: Lean reads everything after its opener as comment."""
    return t.kind is _ERROR and t.text.startswith(("/-", "--"))


def code_only(text: str) -> str:
    """``text`` with comments, doc comments and the insides of string and character literals
    blanked out (the quotes stay), positions kept: what is left is exactly the code Lean sees."""
    spans: list[tuple[int, int]] = []
    for t in tokenize(text, keep_comments=True):
        if t.kind in (_COMMENT, _DOC) or _open_comment(t):
            spans.append((t.start, t.end))
        elif t.kind in (_STRING, _CHAR) and t.end - t.start >= 2:
            spans.append((t.start + 1, t.end - 1))
    return _blank(text, spans)
