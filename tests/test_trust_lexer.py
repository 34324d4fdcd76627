"""The lexer reads Lean text the way Lean's own `whitespace` and `tokenFn` do
(`src/Lean/Parser/Basic.lean`, `Init/Meta/Defs.lean`). Each case below names the rule of Lean's
lexer it follows; the point of the lexer is that a comment or string is exactly where Lean has
one, so nothing can hide from the pre-scan and nothing inert can trigger it."""

from __future__ import annotations

import pytest

from leanrl.lean.trust.lexer import (
    MAX_TOKENS,
    Kind,
    Token,
    code_only,
    mask_comments,
    tokenize,
    too_many_tokens,
)


def kinds(text: str) -> list[tuple[str, str]]:
    return [(t.kind.value, t.text) for t in tokenize(text)]


def idents(text: str) -> list[str]:
    return [t.text for t in tokenize(text) if t.kind is Kind.IDENT]


def error(text: str) -> Token:
    toks = tokenize(text)
    assert toks and toks[-1].kind is Kind.ERROR, kinds(text)
    return toks[-1]


# -- comments (Lean.Parser.whitespace, finishCommentBlock) ---------------------------------------


def test_block_comments_nest() -> None:
    # finishCommentBlock counts `/-` and `-/`: the first `-/` closes the inner comment only.
    assert idents("/- a /- b -/ native_decide -/ x") == ["x"]
    assert idents("/- /- /- -/ -/ sorry -/ y") == ["y"]


def test_a_block_comment_that_starts_with_a_slash() -> None:
    # `/-/` is `/-` followed by `/`: a block comment, closed by the later `-/`.
    assert idents("/-/ sorry -/ y") == ["y"]


def test_line_comment_runs_to_the_end_of_the_line() -> None:
    assert idents("x -- sorry /- not a block\ny") == ["x", "y"]
    assert idents("x --- triple dash is a comment too\ny") == ["x", "y"]


def test_a_string_holding_a_comment_opener_hides_nothing() -> None:
    # The desync of the old word list: `"/-"` is a string, the code after it is code.
    toks = kinds('example := "/-" ++ native_decide -- -/')
    assert ("string", '"/-"') in toks and ("ident", "native_decide") in toks
    assert idents('"--" native_decide') == ["native_decide"]


def test_a_line_comment_holding_a_block_opener_hides_only_its_line() -> None:
    assert idents("-- /-\nnative_decide\n-- -/") == ["native_decide"]


def test_doc_comments_are_tokens_and_nest() -> None:
    # whitespace stops at `/--` and `/-!`: they are tokens, their body read by commentBody.
    toks = tokenize("/-- doc /- inner -/ still doc -/ theorem /-! module -/")
    assert [t.kind for t in toks] == [Kind.DOC, Kind.IDENT, Kind.DOC]
    assert toks[0].text == "/-- doc /- inner -/ still doc -/"


def test_a_doc_opener_followed_by_a_slash() -> None:
    # `/--/`: the doc token `/--`, then a body that starts with `/` and never closes.
    assert "unterminated" in error("/--/ x").error


@pytest.mark.parametrize("text", ["/- never closed", "x /- a /- b -/", "/-- doc"])
def test_unterminated_comments_are_errors(text: str) -> None:
    assert "unterminated" in error(text).error


def test_symbols_are_split_by_longest_match_before_comments_are_seen() -> None:
    # `//` is a token (subtypes), so `//-` is `//` then `-`: no comment starts there.
    assert kinds("a //- b -/") == [
        ("ident", "a"),
        ("symbol", "//"),
        ("symbol", "-"),
        ("ident", "b"),
        ("symbol", "-"),
        ("symbol", "/"),
    ]
    # `<-` is a token: `<--y` is `<-`, `-`, `y`.
    assert kinds("x <--y")[1:] == [("symbol", "<-"), ("symbol", "-"), ("ident", "y")]


def test_a_comment_glued_to_an_unknown_symbol_is_refused() -> None:
    # If Lean knew a token `+-`, `+-- c` would be `+-` then code; the lexer does not guess.
    assert "comment opener" in error("a +-- sorry\n b").error
    assert "comment opener" in error("a <--- b").error
    # after brackets and commas no Lean token can continue: an ordinary comment
    assert idents("f (-- first\n x, -- second\n y)") == ["f", "x", "y"]


# -- strings (strLitFnAux, quotedCharCoreFn, stringGapFn, rawStrLitFnAux) ------------------------


@pytest.mark.parametrize(
    "literal",
    ['"a\\"b"', '"\\\\"', '"\\n\\t\\r\\\'\\x41\\u00e9"', '"-- /- «»"', '"multi\nline"'],
)
def test_string_escapes(literal: str) -> None:
    assert kinds(literal + " x") == [("string", literal), ("ident", "x")]


@pytest.mark.parametrize(
    ("literal", "why"),
    [
        ('"\\u{41}"', "four hexadecimal"),  # Lean has `\uHHHH` only
        ('"\\x4"', "two hexadecimal"),
        ('"\\q"', "invalid escape"),
        ('"no end', "unterminated string"),
        ('"gap\\\n\n  two newlines"', "more than one newline"),
    ],
)
def test_bad_strings_are_errors(literal: str, why: str) -> None:
    assert why in error(literal).error


def test_a_string_gap_is_part_of_the_string() -> None:
    # `\` + newline + indentation: Lean's string gap.
    assert kinds('"abc\\\n    def" x') == [("string", '"abc\\\n    def"'), ("ident", "x")]


def test_raw_strings_have_no_escapes() -> None:
    assert kinds('r"a\\b" x') == [("string", 'r"a\\b"'), ("ident", "x")]
    assert kinds('r#"a"b"# x') == [("string", 'r#"a"b"#'), ("ident", "x")]
    assert kinds('r##"x"#y"## z')[0] == ("string", 'r##"x"#y"##')
    assert "unterminated raw" in error('r#"never').error


def test_interpolated_strings_hold_code() -> None:
    toks = tokenize('s!"a {native_decide} b {f "x"} c" d')
    assert toks[0].text == "s!" and toks[1].kind is Kind.STRING
    nested = [(t.kind.value, t.text) for t in toks if t.nested]
    assert nested == [("ident", "native_decide"), ("ident", "f"), ("string", '"x"')]
    assert toks[-1].text == "d" and not toks[-1].nested
    # `\{` is an escape only in interpolated strings
    assert [t.kind for t in tokenize('m!"a \\{ b" c')] == [Kind.IDENT, Kind.STRING, Kind.IDENT]


def test_a_string_read_differently_when_interpolated_is_refused() -> None:
    # Without a known `s!`/`m!`/`throwError` before it, `"a{"b"}c"` is three tokens as a plain
    # string and one as an interpolated one: Lean's reading depends on the keyword before it.
    assert "interpolated" in error('foo "a{"b"}c"').error
    # where both readings agree, the braces' contents are lexed as code (conservatively)
    toks = tokenize('"{sorry}"')
    assert [(t.kind.value, t.nested) for t in toks] == [("string", False), ("ident", True)]
    # `"{"` is ambiguous too: read as interpolated, its `{` opens code that starts with the
    # closing quote, so the literal would run on past it
    assert "interpolated" in error('"{" x').error
    # a `{...}` whose code Lean could not read at all leaves only the plain reading
    assert kinds("\"{'ab'}\" x") == [("string", "\"{'ab'}\""), ("ident", "x")]


# -- character literals vs primes (tokenFnAux, charLitFnAux, isIdRest) ---------------------------


def test_char_literals_and_primes() -> None:
    assert kinds("h' x'' 'a' '\\n' '\\''") == [
        ("ident", "h'"),
        ("ident", "x''"),
        ("char", "'a'"),
        ("char", "'\\n'"),
        ("char", "'\\''"),
    ]
    # `''` is not a character literal (tokenFnAux checks the next character): Mathlib's image
    assert kinds("f '' s") == [("ident", "f"), ("symbol", "''"), ("ident", "s")]


def test_a_char_literal_holding_a_quote_hides_nothing() -> None:
    assert idents("'\"' native_decide '\"'") == ["native_decide"]


@pytest.mark.parametrize("text", ["'ab'", "x '", "'\\q'"])
def test_bad_char_literals_are_errors(text: str) -> None:
    assert error(text).kind is Kind.ERROR


def test_tokens_with_a_prime_are_not_char_literals() -> None:
    # `∑'` (tsum) and `⁻¹'` (preimage) are Mathlib tokens: no character literal starts there.
    assert kinds("∑' x, f x") == [
        ("symbol", "∑'"),
        ("ident", "x"),
        ("symbol", ","),
        ("ident", "f"),
        ("ident", "x"),
    ]
    assert kinds("f ⁻¹' s")[1] == ("symbol", "⁻¹'")


# -- identifiers (identFnAux, isIdFirst, isIdRest, isLetterLike) ---------------------------------


def test_escaped_identifiers() -> None:
    (t,) = tokenize("«native_decide»")
    assert (t.kind, t.value, t.escaped) == (Kind.IDENT, "native_decide", True)
    (t,) = tokenize("_root_.Lean.«reduceBool»")
    assert t.parts == ("_root_", "Lean", "reduceBool") and t.value == "_root_.Lean.reduceBool"
    # the inside of «» is a name part, whatever it holds: no comment starts in it
    (t,) = tokenize("«a -- b /- c».d")
    assert t.parts == ("a -- b /- c", "d")
    assert "unterminated identifier escape" in error("«abc").error


def test_dotted_names_and_projections() -> None:
    assert kinds("Nat.succ x.1.2 h.symm") == [
        ("ident", "Nat.succ"),
        ("ident", "x"),
        ("symbol", "."),
        ("number", "1"),
        ("symbol", "."),
        ("number", "2"),
        ("ident", "h.symm"),
    ]
    (t,) = tokenize("Foo.«bar baz».qux")
    assert t.parts == ("Foo", "bar baz", "qux")


def test_identifier_characters() -> None:
    # `!`, `?` and subscripts continue a name; `λ`, `Π`, `Σ` are not letters; `ℕ`, Greek,
    # Latin-1 letters are.
    assert idents("simp? n! h₀ x₁' α ℕ café") == ["simp?", "n!", "h₀", "x₁'", "α", "ℕ", "café"]
    assert kinds("λx") == [("symbol", "λ"), ("ident", "x")]
    assert kinds("Π x") == [("symbol", "Π"), ("ident", "x")]
    assert kinds("n !") == [("ident", "n"), ("symbol", "!")]
    # an identifier-like token longer than the identifier wins (`mkIdResult`)
    assert kinds("ℝ≥0") == [("symbol", "ℝ≥0")]


def test_name_literals() -> None:
    (t,) = tokenize("`Lean.«reduceBool»")
    assert (t.kind, t.value) == (Kind.NAME, "Lean.reduceBool")
    assert tokenize("`(tactic| simp)")[0].kind is Kind.SYMBOL


# -- numbers (numberFnAux, decimalNumberFn) ------------------------------------------------------


def test_numbers() -> None:
    assert [t.text for t in tokenize("42 0x1F 0b101 0o17 1_000 2.5 2.5e-3 1e10")] == [
        "42",
        "0x1F",
        "0b101",
        "0o17",
        "1_000",
        "2.5",
        "2.5e-3",
        "1e10",
    ]
    assert all(t.kind is Kind.NUMBER for t in tokenize("42 0x1F 2.5e-3"))
    assert "exponent" in error("2e").error
    assert error("0x").kind is Kind.ERROR


# -- whitespace -----------------------------------------------------------------------------------


def test_tabs_and_lone_carriage_returns_are_errors_crlf_is_not() -> None:
    assert "tab" in error("x\ty").error
    assert "carriage return" in error("x\ry").error
    assert idents("x\r\ny") == ["x", "y"]
    # inside a string or comment they are just characters
    assert idents('"\t" -- \t\nz') == ["z"]


def test_positions_are_lines_and_code_point_columns() -> None:
    toks = tokenize("theorem «t» (x : ℕ) :\n  x = x")
    assert [(t.text, t.line, t.col) for t in toks if t.kind is Kind.IDENT] == [
        ("theorem", 1, 0),
        ("«t»", 1, 8),
        ("x", 1, 13),
        ("ℕ", 1, 17),
        ("x", 2, 2),
        ("x", 2, 6),
    ]
    toks = tokenize("#eval 1")
    assert [(t.text, t.space_before) for t in toks] == [("#", True), ("eval", False), ("1", True)]


# -- helpers for the extractor ----------------------------------------------------------------------


def test_mask_comments_keeps_positions() -> None:
    text = 'a -- c\n/- b\n -/ "-- s" /-- d -/ e'
    masked = mask_comments(text)
    assert len(masked) == len(text) and masked.count("\n") == text.count("\n")
    assert masked.split() == ["a", '"--', 's"', "e"]
    assert mask_comments(text, docs=False).split() == ["a", '"--', 's"', "/--", "d", "-/", "e"]
    # an unterminated comment runs to the end, as in Lean
    assert mask_comments("x /- theorem t").split() == ["x"]


def test_code_only_blanks_literals_and_comments() -> None:
    text = "theorem t : s = \"theorem u\" := by -- theorem v\n  exact 'x'"
    code = code_only(text)
    assert len(code) == len(text)
    assert code == 'theorem t : s = "' + " " * 9 + '" := by' + " " * 13 + "\n  exact ' '"


def test_hostile_nesting_is_an_error_not_a_crash() -> None:
    # Strings inside interpolated strings inside ...: the lexer stops following at a fixed depth
    # (a Python recursion error here would crash the caller instead of rejecting the text).
    assert "nested too deeply" in error('s!"{' * 5000).error
    assert error('"{' * 20000 + '"').kind is Kind.ERROR
    # deep brackets and comments are plain loops (and a text is read up to the token bound)
    assert len(tokenize("(" * 30000)) == 30000
    deep = tokenize("(" * 50000)
    assert len(deep) == MAX_TOKENS + 1 and too_many_tokens(deep)
    assert tokenize("/-" * 20000 + "-/" * 20000) == []
