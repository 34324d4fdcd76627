"""leanrl's trust boundary: everything that decides whether a proof is accepted, in one place.

Read docs/verification.md (the threat model) first. The modules, in the order an attempt meets
them:

- ``lexer`` / ``allowlist`` / ``syntax``: the pre-scan of the model's text (a cheap first filter with clear
  messages; never the defence), with its allow-list and refusal tables in ``allowlist``;
- ``containment``: what a Lean process can see, inherit and outlive;
- ``judge``: the trusted checker processes, which never run model text, and the hand-off of an
  attempt's compiled constants to them;
- ``LeanrlRestate.lean``, ``LeanrlCheck.lean`` and ``report``: the checker itself (the first file
  decides restated statements; a judge elaborates both as one text) and how its report is read;
- ``rules``: the verification policy as pure functions, Lean's facts in, a Verdict out;
- ``kernel_bugs``: the kernel bugs known for the pinned toolchains and the rule that stops each.
"""

from __future__ import annotations

__all__: list[str] = []
