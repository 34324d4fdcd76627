"""What a verification service without a token accepts from its callers.

An attempt's ``header`` and ``formal_statement`` are *trusted* input: they come from the taskset
and go into the Lean file as they are, without the pre-scan that the model's text gets
(:mod:`leanrl.lean.trust.syntax`). A header of ``#eval IO.Process.run ...`` would run that program
as the service's user. With a token, only callers holding it can send attempts, and they are
trusted like the trainer that owns the service.

Without a token (``leanrl serve`` on loopback or on a unix socket) *any local user* can reach
the service (loopback TCP is open to every user of the machine). So such a service treats every
request as untrusted:

* a header's leading ``import`` lines are taken as they are (the imports are the point of a
  header); everything after them, and the statement (a session's statement too), gets the
  pre-scan (:mod:`leanrl.lean.trust.syntax`), counting its ``forbidden`` findings: no
  ``#eval``/``run_cmd``, no new syntax or elaborators, no attributes that run code, no
  ``unsafe``, no ``#exit``, no further ``import``. Options are the exception: a taskset may set
  ones the model may not (ProofNet sets ``checkBinderAnnotations``), so only the options that
  switch checks off (``debug.*``, ``kernel.*``, ...) count. Definitions and ``open`` lines pass
  (ProofNet's headers define things), and so does ``sorry`` (PutnamBench's answer
  placeholders);
* the attempt's policy must keep the pre-scan on (``forbid_tokens``) and waive none of its rules
  (``prescan_allow``): a caller cannot switch off the check of its own proof.

A request that breaks one of these gets 403 with the reason and the fix (use a token).
"""

from __future__ import annotations

import re

from leanrl.lean.trust.allowlist import UNSAFE_OPTION_PREFIXES, UNSAFE_OPTIONS
from leanrl.lean.trust.syntax import Finding, scan
from leanrl.verdict import Attempt, Reason, VerificationPolicy

__all__ = ["header_problem", "statement_problem", "untrusted_attempt_problem"]

_IMPORT = re.compile(r"import(\s+[\w.'«»!?]+)+")

FIX = (
    "This service runs without a token, so it cannot tell its callers from any other local "
    "user and accepts only plain headers and statements. To send this, start the service with "
    "a token (--token or LEANRL_SERVICE_TOKEN) and have the client send it."
)


def header_problem(header: str, policy: VerificationPolicy) -> str | None:
    """Why ``header`` holds, after its imports, a construct that runs code or disables checks."""
    lines = header.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        code = lines[i].split("--", 1)[0].strip()
        if code and not _IMPORT.fullmatch(code):
            break
        i += 1
    why = statement_problem("".join(lines[i:]), policy, "header")
    if why is None:
        return None
    # report the line number within the whole header
    m = re.search(r"\(line (\d+)\)", why)
    return why if m is None else why.replace(m.group(0), f"(line {int(m.group(1)) + i})")


def statement_problem(text: str, policy: VerificationPolicy, what: str) -> str | None:
    """Why ``text`` (a statement) uses a construct that runs code or disables the checks."""
    found = [f for f in scan(text, policy) if f.reason == Reason.FORBIDDEN and _dangerous(f)]
    if not found:
        return None
    f = found[0]
    return f"the {what} uses `{f.token}` (line {f.line}): {f.why}"


def policy_problem(policy: VerificationPolicy) -> str | None:
    """Why an unauthenticated caller may not ask for ``policy``: it may not turn the pre-scan
    off (``forbid_tokens``) nor waive its rules (``prescan_allow``)."""
    if not policy.forbid_tokens:
        return "its policy turns the pre-scan off (forbid_tokens = false)"
    if policy.prescan_allow:
        return f"its policy waives pre-scan rules (prescan_allow = {list(policy.prescan_allow)})"
    return None


def untrusted_attempt_problem(a: Attempt, index: int) -> str | None:
    """Why an unauthenticated caller may not send attempt ``index`` (None when it may)."""
    # The caller's policy decides how its proof is judged, never how its header is scanned.
    strict = VerificationPolicy()
    why = policy_problem(a.policy) or header_problem(a.header, strict)
    if why is None:
        why = statement_problem(a.formal_statement, strict, "formal_statement")
    if why is None:
        return None
    return f"attempt {index}{f' ({a.id})' if a.id else ''}: {why}. {FIX}"


def _dangerous(finding: Finding) -> bool:
    """Whether a pre-scan finding matters in a taskset's text. The model's text may only set
    allow-listed options; a taskset's header sets options the model may not (ProofNet sets
    ``checkBinderAnnotations``), so there only the options that switch checks off count."""
    if not finding.token.startswith("set_option "):
        return True
    name = finding.token.split()[1] if len(finding.token.split()) > 1 else ""
    return name in UNSAFE_OPTIONS or name.startswith(UNSAFE_OPTION_PREFIXES)
