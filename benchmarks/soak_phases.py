"""The fault soak's two service-level phases (run by ``benchmarks/fault_soak.py``; docs/faults.md).

**hung-start**: Lean processes that hang while they start (the stand-in REPL never answers its
first command: ``--hang-starts``) or die at once (``--fail-starts``), with several workers.

* ``leanrl eval`` with 2 or 4 workers (seeded), first while every REPL start hangs: the launch
  must end (before the fix it never did) with every attempt that needs Lean ``infra``, and
  start at most the first wave, the retries and one process per ``startup_timeout_s`` after
  them; then the outage ends and the same command runs until no ``infra`` is left: the run must
  equal the undisturbed eval reference (0 lost, 0 duplicated, 0 infra-as-error, identical).
* ``leanrl serve`` with 4 workers whose REPL always hangs at start: ``POST /check`` must answer
  200 with ``infra`` for every attempt (before: 504 at the request limit) and start at most
  workers + ``start_retries`` processes; with starts that fail at once and a 0.2 s back-off,
  batches sent for a few seconds may start at most workers + retries + one per back-off period
  (before: 243 starts in 7.6 s).

**session-starvation**: ``leanrl serve`` with 2 workers + 1 spare and a healthy stand-in REPL. A
client process opens tactic sessions on one connection until refused and keeps them open; then
``POST /check`` must still answer with real verdicts, the sessions must stop at the runtime's
capacity with 429 (2 here; before: ``max_sessions`` 64, and ``/check`` waited for the 600-s idle
timeout), and once the client is SIGKILLed its sessions must close after ``session_orphan_s``
(1 s here) -- the capacity is free again.

Both use real processes throughout; the stand-in proves nothing (see fault_soak.py).
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PHASES = ("hung-start", "session-starvation")
GUARD_S = 300.0
"""Longest a launch or request may take before it counts as a hang (the fixed code needs
seconds; the unfixed one never ended)."""
HEADER = "import Mathlib\n"


@dataclass
class Phase:
    """What a phase measured and which of its assertions failed."""

    name: str
    figures: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    def require(self, ok: bool, what: str) -> None:
        if not ok:
            self.failures.append(what)


def starts_in(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


# -- hung-start -------------------------------------------------------------------------------


def hung_start(seed: int, work: Path, model: Path, size: Any) -> Phase:
    import fault_soak as fs

    ph = Phase("hung-start")
    t0 = time.monotonic()
    rng = random.Random(f"{seed}:hung-start")
    folder = work / "hung-start"
    if folder.exists():
        import shutil

        shutil.rmtree(folder)
    folder.mkdir(parents=True)

    # 1. leanrl eval, several workers, during an outage (every start hangs) and after it.
    ph.figures["eval"] = _eval_through_an_outage(fs, ph, rng, folder, model, size)

    # 2. leanrl serve, 4 workers, a REPL that always hangs at start: /check answers infra.
    workers = 4
    starts = folder / "serve-hang-starts"
    hang_cmd = [sys.executable, str(fs.FAKE), "--hang-starts", "1000000", "--starts-file"]
    with Service(folder / "serve-hang", workers, [*hang_cmd, str(starts)], backoff=30.0) as svc:
        t = time.monotonic()
        status, body = svc.post("/check", {"attempts": attempts(2 * workers)})
        first_s = time.monotonic() - t
        t = time.monotonic()
        status2, body2 = svc.post("/check", {"attempts": attempts(2)})
        second_s = time.monotonic() - t
    reasons = [v["reason"] for v in body.get("verdicts", [])] if status == 200 else []
    reasons2 = [v["reason"] for v in body2.get("verdicts", [])] if status2 == 200 else []
    ph.figures["serve_hang"] = {
        "workers": workers,
        "status": status,
        "first_batch_s": round(first_s, 2),
        "second_batch_s": round(second_s, 2),
        "starts": starts_in(starts),
        "start_bound": workers + 2,
    }
    ph.require(status == 200 and set(reasons) == {"infra"}, f"serve/hang: {status} {body}")
    ph.require(status2 == 200 and set(reasons2) == {"infra"}, f"serve/hang: {status2} {body2}")
    ph.require(starts_in(starts) <= workers + 2, f"serve/hang: {starts_in(starts)} starts")

    # 3. leanrl serve, starts that fail at once, 0.2 s back-off: starts follow the back-off.
    starts = folder / "serve-fail-starts"
    fail_cmd = [sys.executable, str(fs.FAKE), "--fail-starts", "1000000", "--starts-file"]
    backoff = 0.2
    with Service(folder / "serve-fail", workers, [*fail_cmd, str(starts)], backoff=backoff) as svc:
        t = time.monotonic()
        batches, bad = 0, []
        while time.monotonic() - t < 5.0:
            status, body = svc.post("/check", {"attempts": attempts(workers)})
            batches += 1
            if status != 200 or {v["reason"] for v in body["verdicts"]} != {"infra"}:
                bad.append((status, body))
        elapsed = time.monotonic() - t
    bound = workers + 2 + int(elapsed / backoff) + 1
    ph.figures["serve_fail"] = {
        "workers": workers,
        "batches": batches,
        "seconds": round(elapsed, 2),
        "starts": starts_in(starts),
        "start_bound": bound,
    }
    ph.require(not bad, f"serve/fail: {bad[:2]}")
    ph.require(starts_in(starts) <= bound, f"serve/fail: {starts_in(starts)} starts > {bound}")
    ph.wall_s = time.monotonic() - t0
    return ph


def _eval_through_an_outage(
    fs: Any, ph: Phase, rng: random.Random, folder: Path, model: Path, size: Any
) -> dict[str, Any]:
    """``leanrl eval`` with 2 or 4 workers (seeded), all attempts in one batch: one launch while
    every REPL start hangs (the stand-in's ``--hang-while`` file exists): it must end, every
    attempt that needs Lean ``infra``. Then the outage ends and the same command runs until no
    ``infra`` is left: the result must equal an undisturbed run of the same config."""
    workers = rng.choice([2, 4])
    out = folder / "eval"
    starts, outage = folder / "eval-starts", folder / "outage"
    startup_s = 1.0
    hang = ["--hang-while", str(outage), "--starts-file", str(starts)]
    toml = folder / "eval.toml"
    text = fs.config_toml("eval", model, size, [*fs.repl_command(None, None, 0), *hang])
    text = text.replace("workers = 1\n", f"workers = {workers}\nstartup_timeout_s = {startup_s}\n")
    # All the run's attempts in one batch, so that several wait for a process at once.
    text = text.replace("chunk_tasks = 1\n", f"chunk_tasks = {size.tasks}\n")
    toml.write_text(text)
    args = list(fs.leanrl_args("eval", toml, model, out))
    ref = folder / "reference"
    ref_run = fs.launch(list(fs.leanrl_args("eval", toml, model, ref)), folder / "reference.log")
    if ref_run.wait() != 0 or not fs.done("eval", ref):
        raise SystemExit(f"fault_soak: the hung-start reference eval failed; see {folder}")

    def run(n: int) -> float | None:
        t = time.monotonic()
        proc = fs.launch(args, folder / "eval.log")
        try:
            proc.wait(timeout=GUARD_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            ph.failures.append(f"eval launch {n} gave no end within {GUARD_S:g} s")
            return None
        return time.monotonic() - t

    outage.touch()
    first = run(1)
    outage.unlink()
    in_outage = starts_in(starts)
    want = {
        (x["task_id"], x["sample"]): x["verdict"]["reason"] for x in fs.jsonl(ref / "results.jsonl")
    }
    rows = fs.jsonl(out / "results.jsonl")
    # Attempts decided before Lean (no proof, cut off) keep their verdict; the rest: `infra`.
    wrong = [
        x["verdict"]["reason"]
        for x in rows
        if x["verdict"]["reason"] not in ("infra", want.get((x["task_id"], x["sample"])))
    ]
    infra = sum(1 for x in rows if x["verdict"]["reason"] == "infra")
    # Every start hangs for startup_timeout_s: after the first wave, one at a time.
    bound = workers + 2 + int((first or GUARD_S) / startup_s) + 1
    walls, launches = [first], 1
    while first is not None and launches < 6 and not fs.done("eval", out):
        launches += 1
        walls.append(run(launches))
        if walls[-1] is None:
            break
    r = fs.Round("hung-start", 0)
    fs.compare_eval(out, ref, r)
    outage_ok = first is not None and len(rows) == len(want) and infra > 0 and not wrong
    ph.require(outage_ok, f"eval outage: {len(rows)} records, {infra} infra, others {wrong}")
    ph.require(in_outage <= bound, f"eval outage: {in_outage} starts > {bound}")
    ph.require(fs.done("eval", out), "eval: the run did not finish without infra")
    ph.require((r.lost, r.duplicated, r.infra_as_error) == (0, 0, 0), f"eval: {vars(r)}")
    ph.require(r.identical, "eval: results differ from the undisturbed reference")
    return {
        "workers": workers,
        "outage_launch_s": round(first, 1) if first is not None else None,
        "outage_records": len(rows),
        "outage_infra": infra,
        "outage_starts": in_outage,
        "outage_start_bound": bound,
        "starts_after": starts_in(starts) - in_outage,
        "launches": launches,
        "launch_wall_s": [round(w, 1) if w is not None else None for w in walls],
        "records": r.records,
        "lost": r.lost,
        "duplicated": r.duplicated,
        "infra_as_error": r.infra_as_error,
        "infra_redone": r.infra_redone,
        "identical": r.identical,
    }


def attempts(n: int) -> list[dict[str, Any]]:
    return [
        {
            "name": "t",
            "header": HEADER,
            "formal_statement": "theorem t : 1 = 1 := by",
            "proof": "rfl",
            "id": f"a{i}",
        }
        for i in range(n)
    ]


class Service:
    """``python -m leanrl.cli serve`` on a free loopback port, with the stand-in REPL."""

    def __init__(
        self,
        folder: Path,
        workers: int,
        repl: list[str],
        *,
        backoff: float = 0.2,
        spares: int = 1,
        orphan_s: float = 60.0,
    ) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        options = {
            "repl_command": repl,
            "spares": spares,
            "start_retries": 2,
            "start_backoff_s": backoff,
            "max_start_backoff_s": backoff,
        }
        inline = ", ".join(f"{k} = {json.dumps(v)}" for k, v in options.items())
        (folder / "serve.toml").write_text(
            f"[runtime]\nworkers = {workers}\ntimeout_s = 10\nstartup_timeout_s = 1.0\n"
            f"isolate = false\noptions = {{ {inline} }}\n"
            f"[limits]\nrequest_timeout_s = {GUARD_S}\nsession_orphan_s = {orphan_s}\n"
        )
        self.port_file = folder / "port"
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def __enter__(self) -> Service:
        import fault_soak as fs

        self.port_file.unlink(missing_ok=True)
        args = ["serve", "--config", str(self.folder / "serve.toml"), "--port", "0"]
        args += ["--port-file", str(self.port_file)]
        self.proc = fs.launch(args, self.folder / "serve.log")
        deadline = time.monotonic() + 120
        while not self.port_file.is_file():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"soak: leanrl serve did not start; see {self.folder}/serve.log")
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port_file.read_text().strip()}"
        return self

    def post(self, path: str, body: object) -> tuple[int, Any]:
        import httpx

        try:
            r = httpx.post(self.url + path, json=body, timeout=GUARD_S + 30)
        except httpx.HTTPError as e:
            return 0, {"error": repr(e)}
        return r.status_code, r.json()

    def get(self, path: str) -> Any:
        import httpx

        return httpx.get(self.url + path, timeout=30).json()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# -- session-starvation -----------------------------------------------------------------------

# A client that opens sessions on one keep-alive connection until refused, writes the statuses
# it got, and holds its sessions (and the connection) until it is killed.
_CLIENT = r"""
import json, socket, sys, time
port, report = int(sys.argv[1]), sys.argv[2]
s = socket.create_connection(("127.0.0.1", port))
f = s.makefile("rb")
def post(path, body):
    data = json.dumps(body).encode()
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    status = int(f.readline().split()[1])
    length = 0
    while True:
        line = f.readline().strip()
        if not line:
            break
        if line.lower().startswith(b"content-length"):
            length = int(line.split(b":")[1])
    return status, json.loads(f.read(length))
got = []
for _ in range(8):
    status, body = post("/sessions", {"header": "import Mathlib\n"})
    got.append(status)
    if status != 200:
        break
with open(report, "w") as out:
    json.dump(got, out)
while True:  # hold the sessions and the connection open (keep-alive ends idle ones: refresh)
    time.sleep(1.0)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
    f.readline()
    while f.readline().strip():
        pass
"""


def session_starvation(seed: int, work: Path) -> Phase:
    import fault_soak as fs

    del seed  # nothing random: the faults are a held-open client and its kill
    ph = Phase("session-starvation")
    t0 = time.monotonic()
    folder = work / "session-starvation"
    folder.mkdir(parents=True, exist_ok=True)
    repl = [sys.executable, str(fs.FAKE)]
    with Service(folder, 2, repl, spares=1, orphan_s=1.0) as svc:
        report = folder / "client.json"
        report.unlink(missing_ok=True)
        port = svc.url.rsplit(":", 1)[1]
        client = subprocess.Popen([sys.executable, "-c", _CLIENT, port, str(report)])
        try:
            deadline = time.monotonic() + GUARD_S
            while not report.is_file() and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.1)  # the file is written whole before the client goes on
            got = json.loads(report.read_text()) if report.is_file() else []
            held = svc.get("/metrics")["sessions_open"]
            t = time.monotonic()
            status, body = svc.post("/check", {"attempts": attempts(4)})
            check_s = time.monotonic() - t
            more, refusal = svc.post("/sessions", {"header": HEADER})
        finally:
            client.send_signal(signal.SIGKILL)  # the client dies; its kernel closes its socket
            client.wait()
        t = time.monotonic()
        left = held
        while time.monotonic() - t < 60 and left:
            time.sleep(0.1)
            left = svc.get("/metrics")["sessions_open"]
        closed_s = time.monotonic() - t
        again, _ = svc.post("/sessions", {"header": HEADER})
    reasons = [v["reason"] for v in body.get("verdicts", [])] if status == 200 else []
    ph.figures = {
        "workers": 2,
        "spares": 1,
        "client_statuses": got,
        "sessions_held": held,
        "check_status": status,
        "check_s": round(check_s, 2),
        "extra_session": more,
        "sessions_left_after_kill": left,
        "closed_after_kill_s": round(closed_s, 2),
        "open_after": again,
    }
    ph.require(got == [200, 200, 429], f"sessions opened {got} (expected 2, then 429)")
    ph.require(status == 200 and reasons == ["ok"] * 4, f"/check while held: {status} {body}")
    ph.require(more == 429, f"another session while held: {more} {refusal}")
    ph.require(left == 0, f"{left} sessions still open 60 s after their client was killed")
    ph.require(again == 200, f"a session after the client was gone: {again}")
    ph.wall_s = time.monotonic() - t0
    return ph
