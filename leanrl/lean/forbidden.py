"""The cheap static pre-scan: reject model text that uses checker-defeating constructs.

This runs on the text the *model* wrote (preamble and proof), never on the trusted header or
statement, before Lean runs. It is the first line of defence and it gives a clear reason; the
trusted checks after elaboration (:mod:`leanrl.lean.checker`) are the second and do not rely on
it for statement, ``sorry`` and axiom rules. It *is* what keeps arbitrary code from running inside
a REPL process (``#eval``, ``run_cmd``, custom elaborators, ``initialize``), which is why it is on
by default (``VerificationPolicy.forbid_tokens``).

The security patterns are matched on the raw text (comments and strings included): stripping
comments with a lexer that disagrees with Lean's in one corner case would let a construct through,
while a false alarm on a comment only costs one attempt. ``«»`` quoting is removed first, so
``set_option «debug».«skipKernelTC»`` is still seen.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from leanrl.verdict import Reason, VerificationPolicy

__all__ = ["Finding", "scan"]


class Finding(NamedTuple):
    """One forbidden construct found in the text."""

    reason: Reason
    """The verdict reason it maps to."""
    token: str
    """What was found, as written."""
    line: int
    """1-based line of the first occurrence in the scanned text."""
    why: str
    """What the construct could do to the checks."""


def _w(words: str) -> str:
    # Word boundary that treats Lean identifier characters (incl. `.`, `'`, `!`, `?`) as word
    # characters, so `my_macro` or `Foo.elab` do not match `macro` / `elab`.
    alts = "|".join(re.escape(w) for w in words.split())
    return rf"(?<![\w.'!?«])(?:{alts})(?![\w'!?»])"


# Matched on the raw text: these run code or switch checks off, and nothing after them could
# be trusted to catch them.
_RULES: list[tuple[Reason, str, str]] = [
    (
        Reason.FORBIDDEN,
        r"#eval\b|" + _w("run_cmd run_elab run_meta run_tac by_elab"),
        "runs arbitrary code inside the Lean process (can add declarations, print fake output "
        "or tamper with the process)",
    ),
    (
        Reason.FORBIDDEN,
        _w("macro macro_rules syntax elab elab_rules declare_syntax_cat"),
        "defines new syntax or elaborators, which can redefine commands and run arbitrary code",
    ),
    (
        Reason.FORBIDDEN,
        _w("initialize builtin_initialize"),
        "registers code to run inside the Lean process",
    ),
    (
        Reason.FORBIDDEN,
        _w("implemented_by command_elab term_elab tactic_elab builtin_command_elab"),
        "swaps compiled code or registers an elaborator",
    ),
    (
        Reason.FORBIDDEN,
        r"(?:@\[|attribute\s*\[)[^\]]*"
        + _w("extern csimp init builtin_init tactic macro export env_linter"),
        "swaps compiled code or registers a tactic, macro or initializer through an attribute",
    ),
    (
        Reason.FORBIDDEN,
        _w("unsafe unsafeCast unsafeBaseIO unsafeIO unsafeEIO ptrAddrUnsafe"),
        "unsafe code can break the logic's guarantees at elaboration time",
    ),
    (
        Reason.FORBIDDEN,
        r"skipKernelTC|set_option\s+debug\.|\bdebug\.(?:skip|byAsSorry)",
        "kernel-skipping or debug options let unchecked declarations into the environment",
    ),
    (
        Reason.FORBIDDEN,
        r"#exit\b",
        "`#exit` stops elaboration, so later declarations (or checks) are silently skipped",
    ),
]

# Matched with comments removed: Lean's own checks back these up (an `import` mid-file is an
# error, `#exit` loses the theorem, an axiom shows in the axiom list), so a comment that merely
# mentions them must not cost the attempt.
_BACKED: list[tuple[Reason, str, str]] = [
    (
        Reason.FORBIDDEN,
        _w("import"),
        "imports can only come from the taskset's header",
    ),
    (
        Reason.AXIOM,
        r"(?<![\w.'])axiom(?![\w'])",
        "declares a new axiom (anything can be proved from one)",
    ),
]

_NATIVE = (
    Reason.NATIVE,
    _w(
        "native_decide ofReduceBool ofReduceNat Lean.ofReduceBool Lean.ofReduceNat reduceBool "
        "Lean.reduceBool trustCompiler Lean.trustCompiler"
    )
    + r"|\bdecide\s*\+\s*native\b|\bnative\s*:=\s*true\b",
    "trusts compiled code (`native_decide`/`Lean.ofReduceBool`), which the policy does not allow",
)

_SORRY = (
    Reason.SORRY,
    _w("sorry admit sorryAx"),
    "the proof is left unfinished (`sorry`/`admit`)",
)

# Lean comments: `--` to end of line, `/- ... -/` nested. Only used for the rules that Lean's own
# checks back up (so a lexing mismatch cannot let anything through).
_LINE_COMMENT = re.compile(r"--[^\n]*")


def _strip_comments(text: str) -> str:
    out, i, depth = [], 0, 0
    while i < len(text):
        if text.startswith("/-", i):
            depth += 1
            i += 2
        elif depth and text.startswith("-/", i):
            depth -= 1
            i += 2
        elif depth:
            out.append("\n" if text[i] == "\n" else " ")
            i += 1
        else:
            out.append(text[i])
            i += 1
    return _LINE_COMMENT.sub("", "".join(out))


def scan(text: str, policy: VerificationPolicy) -> list[Finding]:
    """Every forbidden construct in ``text`` (the model-written part), first occurrence each."""
    plain = text.replace("«", "").replace("»", "")
    found: list[Finding] = []
    for reason, pattern, why in _RULES:
        m = re.search(pattern, plain)
        if m:
            found.append(_finding(plain, m, reason, why))
    stripped = _strip_comments(plain)
    rules = [*_BACKED, _SORRY] + ([] if policy.allow_native_decide else [_NATIVE])
    for reason, pattern, why in rules:
        m = re.search(pattern, stripped)
        if m:
            found.append(_finding(stripped, m, reason, why))
    return found


def _finding(text: str, m: re.Match[str], reason: Reason, why: str) -> Finding:
    line = text.count("\n", 0, m.start()) + 1
    return Finding(reason=reason, token=m.group(0).strip(), line=line, why=why)
