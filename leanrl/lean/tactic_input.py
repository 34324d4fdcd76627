"""What a tactic-mode request may hold, and the pre-scan of model tactics.

The REPL parses ``{"tactic": t, "proofState": n}`` with ``Parser.runParserCategory env `tactic t``:
``t`` must be exactly ONE tactic, or Lean answers "expected end of input" at the second one
(REPL issue #43: ``ext1 x; ext1 n``). Models write several tactics per turn, so a block of
several lines (or one line with a ``;`` separator) is sent as the single tactic ``( tacticSeq )``::

    (
      tac1
      tac2
    )

The parentheses are on lines of their own so a trailing ``--`` comment cannot swallow the ``)``,
and the block is dedented and indented by two so every tactic of the sequence starts at the same
column, as ``tacticSeq`` requires (more-indented lines stay continuations of their tactic).
Blank and ``--``-comment-only lines before the first and after the last tactic are dropped; a
single tactic on one line is sent as it is, so its error positions stay those of the model's text.
"""

from __future__ import annotations

import re
import textwrap

from leanrl.lean.trust.lexer import MAX_TOKENS, tokenize, too_many_tokens
from leanrl.lean.trust.syntax import Finding, scan
from leanrl.verdict import Reason, VerificationPolicy

__all__ = ["as_one_tactic", "prescan_tactic", "relocate_positions"]

# `;` separates tactics; `<;>` is one tactic (a combinator) and must not count.
_SEPARATOR = re.compile(r"(?<!<);(?!>)")
_PRIORITY = [Reason.FORBIDDEN, Reason.AXIOM, Reason.NATIVE, Reason.SORRY]


def _is_code(line: str) -> bool:
    s = line.strip()
    return bool(s) and not s.startswith("--")


def _lines(block: str) -> list[str]:
    return block.replace("\r\n", "\n").replace("\t", "  ").split("\n")


def as_one_tactic(block: str) -> str:
    """``block`` as one tactic the REPL parses ('' when it holds no tactic at all)."""
    lines = _lines(block)
    code = [i for i, ln in enumerate(lines) if _is_code(ln)]
    if not code:
        return ""
    if len(code) == 1:
        one = lines[code[0]].strip()
        # `--` starts a comment: a `;` after it is not a separator.
        if not _SEPARATOR.search(one.split("--", 1)[0]):
            return one
    body = textwrap.dedent("\n".join(lines[code[0] : code[-1] + 1]))
    return "(\n" + textwrap.indent(body, "  ") + "\n)"


def prescan_tactic(text: str, policy: VerificationPolicy) -> str | None:
    """Why ``text`` (model-written tactics or preamble) must not reach a REPL process, or None.

    The same scan as for whole proofs (:mod:`leanrl.lean.trust.syntax`): ``run_tac``, ``by_elab``,
    ``#eval`` and friends run arbitrary code inside the process, which tactic mode would otherwise
    hand them. ``policy.forbid_tokens = False`` switches it off, as for whole proofs.
    """
    # Sizes first, before anything reads the text token by token (a hostile megabyte of `x.1`
    # is a million tokens): the same bounds as a whole proof's.
    if len(text) > policy.max_proof_chars:
        return (
            f"pre-scan (too_large): the tactic text is {len(text):,} characters, over the limit "
            f"of {policy.max_proof_chars:,} (VerificationPolicy.max_proof_chars)"
        )
    sent = "\n".join(_lines(text))
    if too_many_tokens(tokenize(sent)):
        return (
            f"pre-scan (too_large): the tactic text has more than {MAX_TOKENS:,} Lean tokens "
            "(leanrl.lean.trust.lexer.MAX_TOKENS)"
        )
    if not policy.forbid_tokens:
        return None
    # Scan what the REPL will be sent: `as_one_tactic` turns tabs into spaces and CRLF into LF.
    findings: list[Finding] = scan(sent, policy)
    if not findings:
        return None
    f = min(findings, key=lambda f: _PRIORITY.index(f.reason))
    return f"pre-scan ({f.reason.value}): `{f.token}` is not allowed in tactic mode: {f.why}"


_INPUT_POS = re.compile(r"<input>:(\d+):(\d+):")


def relocate_positions(message: str, block: str) -> str:
    """``<input>:line:col:`` positions in a parse error about the wrapped ``block`` turned back
    into positions in the block as the model wrote it (the wrapper adds a line and two columns).
    """
    if not as_one_tactic(block).startswith("(\n"):
        return message
    lines = _lines(block)
    code = [i for i, ln in enumerate(lines) if _is_code(ln)]
    body = [ln for ln in lines[code[0] : code[-1] + 1] if ln.strip()]
    dedent = min(len(ln) - len(ln.lstrip(" ")) for ln in body)

    def back(m: re.Match[str]) -> str:
        line, col = int(m.group(1)), int(m.group(2))
        if not 2 <= line <= code[-1] - code[0] + 2:
            return m.group(0)  # on the wrapper's own `(` or `)` line
        return f"<input>:{code[0] + line - 1}:{max(0, col - 2 + dedent)}:"

    return _INPUT_POS.sub(back, message)
