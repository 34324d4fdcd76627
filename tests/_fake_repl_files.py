#!/usr/bin/env python3
"""FAKE Lean REPL (tests/fake_repl.py) that also answers file checks. NOT Lean; proves nothing.

On top of fake_repl.py's behaviour it stands in for two things a Kimina file check needs:

* ``#check NAME`` lines of a command answer the info message ``NAME : TYPE`` for the few names
  in :data:`TYPES` (``Nat : Type``), at the ``#check`` keyword's range, as Lean prints it;
* ``#eval LeanrlCheck.runFile "<path>" "<nonce>" <olean> <replay>`` (the trusted checker's file
  mode, which the real ``LeanrlCheck.lean`` does not have yet: see docs/interop.md) reads the
  pickle back and answers a ``LEANRL-CHECK`` report with ``kind`` ``file``: ``constants`` are the
  names the text declares (``theorem``/``lemma``/``def``/``abbrev``/``instance``/``structure``/
  ``inductive``/``axiom``), ``axioms`` ``propext`` when there is any, ``sorryAx`` when the text
  says ``sorry``, every ``axiom NAME`` it declares (also in ``new_axioms``), ``inductives`` the
  ``structure``/``inductive`` names, and ``replay_failed`` when it set ``debug.skipKernelTC
  true``. ``-- fake: {"check": {...}}`` overrides fields, as for the theorem check.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fake_repl

TYPES = {"Nat": "Type", "Int": "Type", "Prop": "Type"}
_RUN_FILE = re.compile(
    r'#eval LeanrlCheck\.runFile "((?:[^"\\]|\\.)*)" "([0-9a-f]+)" (true|false) (true|false)'
)
_DECL = re.compile(
    r"^(?:@\[[^\]]*\]\s*)?(?:private |protected |noncomputable )*"
    r"(theorem|lemma|def|abbrev|instance|structure|inductive|axiom)\s+([^\s:({\[]+)",
    re.MULTILINE,
)
_CHECK = re.compile(r"^#check\s+(\S+)\s*$", re.MULTILINE)


class FileFake(fake_repl.Fake):
    def command(self, req: dict) -> dict:
        text = req["cmd"]
        if text.startswith("#eval LeanrlCheck.runFile"):
            return self.check_file(text)
        out = super().command(req)
        infos = []
        for m in _CHECK.finditer(text):
            if m.group(1) in TYPES:
                p = fake_repl.pos_of(text, m.start())
                end = {"line": p["line"], "column": p["column"] + len("#check")}
                data = f"{m.group(1)} : {TYPES[m.group(1)]}"
                infos.append({"severity": "info", "pos": p, "endPos": end, "data": data})
        if infos and "env" in out:
            out["messages"] = [*out.get("messages", []), *infos]
        return out

    def check_file(self, text: str) -> dict:
        m = _RUN_FILE.match(text)
        if not m:
            return {"messages": [{"severity": "error", "data": "bad file check"}], "env": 0}
        path, nonce, replay = m.group(1), m.group(2), m.group(4) == "true"
        with open(path, encoding="utf-8") as f:
            attempt = json.load(f)["text"]
        decls = _DECL.findall(attempt)
        names = [n for _, n in decls]
        declared_axioms = [n for k, n in decls if k == "axiom"]
        axioms = (["propext"] if names else []) + (
            ["sorryAx"] if re.search(r"\bsorry\b", attempt) else []
        )
        report = {
            "nonce": nonce,
            "status": "ok",
            "detail": "",
            "kind": "file",
            "ref_kind": "file",
            "axioms": axioms + declared_axioms,
            "new_axioms": declared_axioms,
            "inductives": [n for k, n in decls if k in ("structure", "inductive")],
            "constants": names,
            "replayed": replay,
        }
        if replay and "skipKernelTC true" in attempt:
            report["status"] = "replay_failed"
            report["detail"] = "kernel rejected the attempt's declaration: (kernel) type mismatch"
            report["replayed"] = False
        report.update(fake_repl.directives(attempt).get("check", {}))
        data = "LEANRL-CHECK " + json.dumps(report)
        p = {"line": 1, "column": 0}
        msg = {"severity": "info", "pos": p, "endPos": {"line": 1, "column": 5}, "data": data}
        return {"messages": [msg], "env": self.new_env(text)}


if __name__ == "__main__":
    fake_repl.Fake = FileFake  # type: ignore[misc]
    fake_repl.main()
