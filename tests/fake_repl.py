#!/usr/bin/env python3
"""FAKE Lean REPL for tests and benchmarks. It is NOT Lean and proves nothing.

A stand-in child process that speaks the real REPL wire protocol (blank-line separated JSON on
stdin/stdout, answers shaped like ``../shared/data/repl-transcripts``), so the pool, the worker
and the runtime can be tested with real processes that answer, hang, crash or eat memory.

Behaviour is chosen by directive lines inside a command's text::

    -- fake: {"hang": true}              never answer (until killed)
    -- fake: {"crash": true}             exit(3) without answering
    -- fake: {"abort": true}             abort() (SIGABRT) without answering
    -- fake: {"oom": true}               allocate memory without limit
    -- fake: {"leak_mb": 50}             allocate 50 MiB, keep it, answer normally
    -- fake: {"delay": 0.2}              sleep, then answer
    -- fake: {"garbage": true}           answer with a block that is not JSON
    -- fake: {"noise": true}             print a debug line before the answer
    -- fake: {"messages": [...]}         answer with these messages
    -- fake: {"check": {...}}            fields of the trusted check's report for this attempt
    -- fake: {"probe": "/some/path"}     try to write there and to reach the network; report
    -- fake: {"environ": true}           report the names of this process's environment variables
    -- fake: {"read": "/some/path"}      try to list/read that path; report what was seen
    -- fake: {"duplicate": true}         answer twice (the process is then out of step)
    -- fake: {"forge_answer": 0}         print a fake answer naming environment 0 first
    -- fake: {"flood_mb": 100}           print that much non-JSON output before answering
    -- fake: {"orphan": true}            start a child that keeps stdout open, then exit(3)
    -- fake: {"spawn": "/some/file"}     start a child that keeps running (it writes its pid to
                                         the file), and answer normally
    -- fake: {"compromise": true}        act as a process the attempt took over: hide this
                                         command's sorries and errors, and from now on answer
                                         every trusted check with a forged "ok" report
    -- fake: {"steal": "/some/file"}     overwrite the pickle file this process writes next
                                         with the contents of another file (a proof theft)
    -- fake: {"judge": {...}}            process-level directives ("crash", "abort", "hang", "oom",
                                         "leak_mb", "delay") the JUDGE applies while it checks
                                         this attempt (the elaborating process ignores them):
                                         a restated term that aborts, stalls or fills the
                                         trusted checker

Without directives a command succeeds; ``sorry`` in it yields a ``sorries`` entry and the
"declaration uses `sorry`" warning, like real Lean. ``pickleTo`` writes the environment's text
(JSON) to the path; ``#eval LeanrlCheck.run "<path>" "<name>" "<nonce>" ...`` reads it back and
answers with a ``LEANRL-CHECK`` report (``status`` ``missing`` when ``theorem <name>`` is absent,
``sorryAx`` among the axioms when the text says ``sorry``, every ``axiom NAME`` it declares, and
``replay_failed`` when it set ``debug.skipKernelTC true``, as the kernel replay would). Tactics: a request must hold ONE tactic, as
for the real REPL's parser (several lines at one column, or ``a; b``, answer "expected end of
input"; the parenthesised sequence ``(`` / tactics / ``)`` is one tactic). Then ``fail`` among
them -> a ``Lean error`` answer, ``bad`` -> an error message, ``hang``/``crash`` as above, a last
tactic ``done``/``rfl``/``simp`` -> ``Completed``, anything else -> one more goal.

Options: ``--load-time S`` seconds to sleep on the first (import) command, modelling
``import Mathlib``; ``--check-time S`` seconds a trusted check takes, and ``--replay-time S``
more when it replays through the kernel;
``--pid-file F`` appends this process's pid to F; ``--fail-starts N --starts-file F``: the
first N processes sharing F exit at once (killed during start-up; F gets one byte per start);
``--hang-starts N``: the next N processes sharing F (all of them without ``--starts-file``)
never answer their first command (a REPL that hangs while it loads its imports);
``--hang-while F``: neither do processes started while file F exists (an outage that ends when
F is removed); ``--check-leak-mb N``: every trusted check keeps
N MiB more (a judge whose memory grows with each pickle it reads); ``--log F`` appends one JSON
line per request (pid, kind, text) to F, so tests can see which process was asked what.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

_DIRECTIVE = re.compile(r"--\s*fake:\s*(\{.*\})")
_EVAL = re.compile(
    r'#eval LeanrlCheck\.run "((?:[^"\\]|\\.)*)" "((?:[^"\\]|\\.)*)" "([0-9a-f]+)" '
    r"(true|false) (true|false)"
)
_hoard: list[bytearray] = []


def directives(text: str) -> dict:
    out: dict = {}
    for m in _DIRECTIVE.finditer(text):
        out.update(json.loads(m.group(1)))
    return out


def pos_of(text: str, idx: int) -> dict:
    line = text.count("\n", 0, idx) + 1
    col = idx - (text.rfind("\n", 0, idx) + 1)
    return {"line": line, "column": col}


def eat_memory() -> None:
    while True:
        b = bytearray(32 * 1024 * 1024)
        for i in range(0, len(b), 4096):
            b[i] = 1
        _hoard.append(b)


_SEMI = re.compile(r"(?<!<);(?!>)")  # a tactic separator, not the `<;>` combinator


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def split_tactics(t: str) -> list[str] | str:
    """The tactics of a tactic request, or the parse error the real REPL gives.

    Like the REPL (``Parser.runParserCategory env `tactic``), the input must be ONE tactic: a
    second tactic on a later line at the first one's column or left of it, or after a `;`, is
    "expected end of input" at its position (REPL issue #43). More-indented lines continue the
    tactic (``have h : p := by`` + a nested block). One tactic may be the parenthesised sequence
    ``(`` newline, tactics at one column, newline ``)``; its tactics are returned in order.
    """
    lines = t.split("\n")
    code = [(i, ln) for i, ln in enumerate(lines) if ln.strip() and not ln.strip().startswith("--")]
    if not code:
        return "<input>:1:0: expected tactic"
    if code[0][1].strip() == "(" and code[-1][1].strip() == ")" and len(code) > 2:
        inner = code[1:-1]
        col = _indent(inner[0][1])
        seq: list[str] = []
        for i, ln in inner:
            if _indent(ln) == col:
                seq.append(ln.strip())
            elif _indent(ln) < col:
                return f"<input>:{i + 1}:{_indent(ln)}: expected ')'"
        return [p.strip() for x in seq for p in _SEMI.split(x.split("--")[0]) if p.strip()]
    first, col = code[0][0], _indent(code[0][1])
    for i, ln in code[1:]:
        if _indent(ln) <= col:
            return f"<input>:{i + 1}:{_indent(ln)}: expected end of input"
    one = lines[first].strip()
    if one.startswith("(") and one.endswith(")"):
        return [p.strip() for p in _SEMI.split(one[1:-1]) if p.strip()]
    for i, ln in code:
        m = _SEMI.search(ln.split("--")[0])
        if m:
            return f"<input>:{i + 1}:{m.start()}: expected end of input"
    return [one]


def behave(d: dict) -> dict | None:
    """Apply process-level directives; return a replacement answer when one is given."""
    if d.get("orphan"):
        import subprocess

        # Same process group, inherits stdout: the pipe stays open after this process exits.
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(119.5)"])
        sys.exit(3)
    if d.get("crash"):
        sys.exit(3)
    if d.get("abort"):
        os.abort()  # SIGABRT, as Lean's runtime does on a GMP overflow or a stack overflow
    if d.get("spawn"):
        import subprocess

        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        with open(d["spawn"], "w", encoding="utf-8") as f:
            f.write(str(child.pid))
    if d.get("hang"):
        while True:
            time.sleep(3600)
    if d.get("oom"):
        eat_memory()
    if d.get("leak_mb"):
        b = bytearray(int(d["leak_mb"]) * 1024 * 1024)
        for i in range(0, len(b), 4096):
            b[i] = 1
        _hoard.append(b)
    if d.get("delay"):
        time.sleep(float(d["delay"]))
    if d.get("noise"):
        sys.stdout.write("Processing incremental state [pos: 0..10]:\nsome text\n")
    if d.get("flood_mb"):
        line = "x" * 1023 + "\n"
        for _ in range(int(d["flood_mb"]) * 1024):
            sys.stdout.write(line)
        sys.stdout.write("\n")
    if d.get("garbage"):
        return {"__garbage__": True}
    return None


def probe(path: str) -> dict:
    """Try to write a file at ``path`` and to open a network connection; report both."""
    import socket

    results = []
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write("x")
        results.append("write=ok")
    except OSError as e:
        results.append(f"write=denied({e.errno})")
    try:
        socket.create_connection(("1.1.1.1", 53), timeout=2).close()
        results.append("net=ok")
    except OSError:
        results.append("net=denied")
    return {"severity": "info", "pos": {"line": 1, "column": 0}, "data": " ".join(results)}


class Fake:
    def __init__(
        self,
        load_time: float,
        check_time: float = 0.0,
        replay_time: float = 0.0,
        check_leak_mb: int = 0,
    ) -> None:
        self.load_time = load_time
        self.check_time = check_time
        self.replay_time = replay_time
        self.check_leak_mb = check_leak_mb
        self.envs: list[str] = []
        self.states = 0
        self.compromised = False
        self.steal_from: str | None = None

    def new_env(self, text: str) -> int:
        self.envs.append(text)
        return len(self.envs) - 1

    def command(self, req: dict) -> dict:
        text = req["cmd"]
        env = req.get("env")
        if env is not None and not (0 <= env < len(self.envs)):
            return {"message": "Unknown environment."}
        if env is None:
            time.sleep(self.load_time)  # the import
        if text.startswith("#eval LeanrlCheck.run"):
            return self.check(text)
        d = directives(text)
        replaced = behave(d)
        if replaced is not None:
            return replaced
        full = (self.envs[env] + "\n" if env is not None else "") + text
        if d.get("compromise"):
            self.compromised = True
            return {"env": self.new_env(full)}  # a clean-looking answer, whatever the text says
        if d.get("steal"):
            self.steal_from = d["steal"]
        out: dict = {}
        sorries, messages = [], list(d.get("messages", []))
        if d.get("probe"):
            messages.append(probe(d["probe"]))
        if d.get("read"):
            try:
                target = d["read"]
                seen = sorted(os.listdir(target)) if os.path.isdir(target) else ["<file>"]
                data = "read=ok " + " ".join(seen)
            except OSError as e:
                data = f"read=denied({e.errno})"
            messages.append({"severity": "info", "pos": {"line": 1, "column": 0}, "data": data})
        if d.get("environ"):
            names = " ".join(sorted(os.environ))
            messages.append({"severity": "info", "pos": {"line": 1, "column": 0}, "data": names})
        for m in re.finditer(r"\bsorry\b", text):
            p = pos_of(text, m.start())
            end = {"line": p["line"], "column": p["column"] + 5}
            sorries.append({"proofState": self.states, "pos": p, "goal": "⊢ P", "endPos": end})
            self.states += 1
        if sorries:
            decl = re.search(r"\b(theorem|lemma|def|example)\s+(\S*)", text)
            p = pos_of(text, decl.start(2)) if decl else {"line": 1, "column": 0}
            messages.append(
                {"severity": "warning", "pos": p, "endPos": p, "data": "declaration uses `sorry`"}
            )
        if sorries:
            out["sorries"] = sorries
        if messages:
            out["messages"] = messages
        out["env"] = self.new_env(full)
        return out

    def check(self, text: str) -> dict:
        m = _EVAL.match(text)
        if not m:
            return {"messages": [{"severity": "error", "data": "bad check"}], "env": 0}
        path, name, nonce, replay = m.group(1), m.group(2), m.group(3), m.group(5) == "true"
        if self.compromised:  # a taken-over process says whatever passes
            forged = {
                "nonce": nonce,
                "status": "ok",
                "kind": "theorem",
                "ref_kind": "theorem",
                "axioms": [],
                "constants": [name],
                "replayed": replay,
            }
            data = "LEANRL-CHECK " + json.dumps(forged)
            return {"messages": [{"severity": "info", "data": data}], "env": self.new_env(text)}
        time.sleep(self.check_time + (self.replay_time if replay else 0.0))
        with open(path, encoding="utf-8") as f:
            attempt = json.load(f)["text"]
        d = directives(attempt)
        if self.check_leak_mb:  # what a real judge keeps of every pickle it reads
            behave({"leak_mb": self.check_leak_mb})
        if isinstance(d.get("judge"), dict):
            behave(d["judge"])  # the attempt's terms abort, stall or fill the judge
        found = re.search(rf"\btheorem\s+{re.escape(name)}\b", attempt)
        report = {
            "nonce": nonce,
            "status": "ok" if found else "missing",
            "detail": "" if found else f"no declaration named {name}",
            "kind": "theorem" if found else "missing",
            "ref_kind": "theorem",
            "axioms": ["propext"]
            + (["sorryAx"] if re.search(r"\bsorry\b", attempt) else [])
            + re.findall(r"^axiom\s+(\S+)", attempt, re.MULTILINE),
            "constants": [name] if found else [],
            "replayed": replay,
        }
        if replay and found and "skipKernelTC true" in attempt:
            # What the real kernel replay does to a declaration added without checking.
            report["status"] = "replay_failed"
            report["detail"] = "kernel rejected the attempt's declaration: (kernel) type mismatch"
        report.update(d.get("check", {}))
        data = "LEANRL-CHECK " + json.dumps(report)
        p = {"line": 1, "column": 0}
        msg = {"severity": "info", "pos": p, "endPos": {"line": 1, "column": 5}, "data": data}
        return {"messages": [msg], "env": self.new_env(text)}

    def tactic(self, req: dict) -> dict:
        t, ps = req["tactic"], req["proofState"]
        if not (0 <= ps < max(self.states, 1)):
            return {"message": "Unknown proof state."}
        if "crash" in t:
            sys.exit(3)
        if "hang" in t:
            while True:
                time.sleep(3600)
        tactics = split_tactics(t)
        if isinstance(tactics, str):
            return {"message": f"Lean error:\n{tactics}"}
        if "fail" in tactics:
            m = re.search(r"^( *)fail *$", t, re.MULTILINE)
            line, col = (t.count("\n", 0, m.start()) + 1, len(m.group(1))) if m else (1, 0)
            return {"message": f"Lean error:\n<input>:{line}:{col}: unknown tactic"}
        new = self.states
        self.states += 1
        if "bad" in tactics:
            p = {"line": 0, "column": 0}
            err = {"severity": "error", "pos": p, "endPos": p, "data": "Unknown identifier `x`"}
            return {
                "proofStatus": "Incomplete: contains sorry",
                "proofState": new,
                "messages": [err],
                "goals": [],
            }
        if tactics[-1] in {"done", "rfl", "simp"}:
            return {"proofStatus": "Completed", "proofState": new, "goals": []}
        return {"proofStatus": "Incomplete: open goals remain", "proofState": new, "goals": ["⊢ Q"]}

    def pickle(self, req: dict) -> dict:
        env = req["env"]
        if not (0 <= env < len(self.envs)):
            return {"message": "Unknown environment."}
        with open(req["pickleTo"], "w", encoding="utf-8") as f:
            json.dump({"text": self.envs[env]}, f)
        if self.steal_from:
            try:
                with open(self.steal_from, encoding="utf-8") as src:
                    stolen = src.read()
                with open(req["pickleTo"], "w", encoding="utf-8") as f:
                    f.write(stolen)
            except OSError:
                pass
            self.steal_from = None
        return {"env": env}

    def handle(self, req: dict) -> dict:
        if "tactic" in req:
            return self.tactic(req)
        if "pickleTo" in req:
            return self.pickle(req)
        if "unpickleEnvFrom" in req:
            with open(req["unpickleEnvFrom"], encoding="utf-8") as f:
                return {"env": self.new_env(json.load(f)["text"])}
        return self.command(req)


def read_query() -> str | None:
    lines = []
    while True:
        line = sys.stdin.readline()
        if not line:
            return "".join(lines) if lines else None
        if not line.strip():
            if lines:
                return "".join(lines)
            continue
        lines.append(line.rstrip("\n"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--load-time", type=float, default=0.0)
    ap.add_argument("--check-time", type=float, default=0.0)
    ap.add_argument("--replay-time", type=float, default=0.0)
    ap.add_argument("--pid-file", default=None)
    ap.add_argument("--log", default=None)
    ap.add_argument(
        "--fail-starts",
        type=int,
        default=0,
        help="the first N processes started with the same --starts-file die before answering "
        "anything (a REPL killed during start-up)",
    )
    ap.add_argument("--starts-file", default=None)
    ap.add_argument(
        "--hang-starts",
        type=int,
        default=0,
        help="the N processes after the --fail-starts ones (every process without "
        "--starts-file) never answer their first command (a REPL hung while it starts)",
    )
    ap.add_argument(
        "--hang-while",
        default=None,
        help="processes started while this file exists never answer their first command (an "
        "outage of the REPL that ends when the file is removed)",
    )
    ap.add_argument("--check-leak-mb", type=int, default=0)
    args = ap.parse_args()
    if args.starts_file:
        # One byte per start, appended atomically: the file's size numbers this start.
        fd = os.open(args.starts_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.write(fd, b".")
        number = os.lseek(fd, 0, os.SEEK_CUR)  # where this append ended: atomic with it
        os.close(fd)
        if number <= args.fail_starts:
            sys.exit(3)
        if number <= args.fail_starts + args.hang_starts:
            hang_forever()
    elif args.hang_starts:
        hang_forever()
    if args.hang_while and os.path.exists(args.hang_while):
        hang_forever()
    if args.pid_file:
        with open(args.pid_file, "a", encoding="utf-8") as f:
            f.write(f"{os.getpid()}\n")
    fake = Fake(args.load_time, args.check_time, args.replay_time, args.check_leak_mb)
    while True:
        q = read_query()
        if q is None:
            return
        if q.startswith("#") or q.startswith("--"):
            continue
        req = json.loads(q)
        if args.log:
            log_request(args.log, req)
        ans = fake.handle(req)
        if "cmd" in req and "forge_answer" in directives(req["cmd"]):
            forged = {"env": directives(req["cmd"])["forge_answer"]}
            sys.stdout.write(json.dumps(forged) + "\n\n")
        if ans.get("__garbage__"):
            sys.stdout.write("{this is not json\n\n")
        else:
            out = json.dumps(ans, indent=1, ensure_ascii=False) + "\n\n"
            sys.stdout.write(out)
            if "cmd" in req and directives(req["cmd"]).get("duplicate"):
                sys.stdout.write(out)
        sys.stdout.flush()


def hang_forever() -> None:
    """Never answer (the process is alive, reads nothing, says nothing) until killed."""
    while True:
        time.sleep(3600)


def log_request(path: str, req: dict) -> None:
    """One JSON line: which process got which kind of request, with its text."""
    if "tactic" in req:
        kind, text = "tactic", req["tactic"]
    elif "pickleTo" in req:
        kind, text = "pickle", req["pickleTo"]
    elif req.get("cmd", "").startswith("#eval LeanrlCheck.run"):
        kind, text = "check", req["cmd"]
    else:
        kind, text = "cmd", req.get("cmd", "")
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"pid": os.getpid(), "kind": kind, "text": text}) + "\n")


if __name__ == "__main__":
    main()
