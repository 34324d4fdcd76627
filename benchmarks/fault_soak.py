"""Fault soak: eval, GRPO and ES under random kill -9 and REPL start failures.

There is no Lean here: the REPL the pool runs is the stand-in ``tests/fake_repl.py`` (it speaks
the REPL's wire protocol and proves nothing; an attempt without ``sorry`` passes). What is
tested is leanrl's machinery around Lean, with real processes: each round starts a real
``python -m leanrl.cli eval`` / ``train grpo`` / ``train es`` subprocess on a tiny random model
made here, and meanwhile

* kills the leanrl process with SIGKILL at a random moment (seeded: after a random number of
  records, plus a random delay), then runs the same command again until the run is done;
* kills random REPL processes of the run with SIGKILL (found through ``--pid-file``);
* makes the first N REPL starts of the round fail (``--fail-starts N``): for eval N may exceed
  the pool's ``start_retries`` (attempts then get ``infra``, which a resume must redo); for the
  trainers, which leave ``infra`` attempts out of a step rather than redo them, N stays below
  ``start_retries`` (the pool must absorb them by retrying).

At the end of each round the run is compared with an undisturbed reference run of the same
config (made once per mode, in this process, with a REPL that never fails) and counted:

* records: eval attempts; trainer steps in ``metrics.jsonl`` plus the distinct proofs in
  ``proofs.jsonl`` (a proof is its task and digest; the file keeps each once);
* lost: reference records missing from the run; duplicated: records the run holds twice;
* infra-as-error: attempts a fault of the checker (a killed REPL, a REPL that did not start)
  turned into a rejection (``crash``, ``error``, ...) instead of ``infra``;
* identical: final results equal the reference's (eval: every attempt's completion and verdict
  reason, and pass@k; trainers: per-step rewards, the proofs, and the final checkpoint's weights
  bit for bit);
* resumes: the same command once more on the finished run does nothing and succeeds.

Then two phases with the service and several workers (``benchmarks/soak_phases.py``):
**hung-start** (REPLs that hang or die while they start: every attempt still gets a verdict,
``infra`` while Lean cannot start, and starts follow the back-off) and **session-starvation**
(tactic sessions held open, then abandoned by a killed client, never starve ``/check``).

Run (the defaults: 2 rounds of each mode, about 4 minutes per mode on a 2-core CPU machine that
other work shares; most of it is the runs' start-up, importing torch and loading the model)::

    python benchmarks/fault_soak.py                 # all three modes, 2 rounds each, 2 phases
    python benchmarks/fault_soak.py --only grpo --rounds 5 --seed 3 --out runs/soak
    python benchmarks/fault_soak.py --only hung-start --only session-starvation

It prints a table and writes the figures to ``OUT/fault_soak.json``; it exits 1 if any
assertion fails (the failures are printed), 0 otherwise. See docs/faults.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import soak_phases

# Before torch/transformers are imported (by leanrl, in this process, for the reference runs):
# no hub calls, one thread per process (2 cores are shared by the run and its REPLs).
CHILD_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "OMP_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
os.environ.update(CHILD_ENV)

REPO = Path(__file__).resolve().parent.parent
FAKE = REPO / "tests" / "fake_repl.py"
FIXTURES = REPO / "tests" / "fixtures"
MODES = ("eval", "grpo", "es")
START_RETRIES = {"eval": 2, "grpo": 5, "es": 5}
"""The pool's ``start_retries`` per mode (see the module docstring for why they differ)."""
# Stop strings that end the random model's text within a few tokens: short completions are not
# truncated, so they reach the REPL (and get a verdict) instead of being rejected before it.
STOPS = [" ", "e", "t", "a", "o", "i", "n", "s", "\n"]


@dataclass
class Size:
    """How big each run is."""

    tasks: int = 4
    """eval: tasks (2 samples each)."""
    steps: int = 4
    """GRPO and ES: steps / iterations."""
    repl_kills: int = 3
    """The most REPL processes a round kills (at least one, unless 0)."""


@dataclass
class Round:
    """What one round injected and found."""

    mode: str
    index: int
    run_kills: int = 0
    repl_kills: int = 0
    start_failures: int = 0
    launches: int = 0
    wall_s: float = 0.0
    records: int = 0
    lost: int = 0
    duplicated: int = 0
    infra_as_error: int = 0
    infra_left: int = 0
    infra_redone: int = 0
    """eval: attempts first recorded ``infra`` (a failed start) and redone by a resume."""
    orphans: int = 0
    extra: int = 0
    """Trainers: proofs in ``proofs.jsonl`` the reference does not have (from a step that a
    fault changed before the kill that made it be redone)."""
    identical: bool = False
    resumes: bool = False
    failures: list[str] = field(default_factory=list)


# -- the tiny model and the configs ------------------------------------------------------------


def tiny_model(work: Path) -> Path:
    """The tests' tiny random model (tests/conftest.py's ``tiny_model_dir``), made once."""
    out = work / "model"
    if (out / "model.safetensors").is_file():
        return out
    from leanrl.testing import make_tiny_model

    texts = []
    for line in (FIXTURES / "data" / "minif2f.jsonl").open(encoding="utf-8"):
        row = json.loads(line)
        texts.append(row["header"] + row["formal_statement"] + "\n  nlinarith [sq_nonneg x]\n")
    texts += ["```lean4\n", "```", "Complete the following Lean 4 code:", "omega", "simp", "rfl"]
    return make_tiny_model(out, texts)


def repl_command(pids: Path | None, starts: Path | None, fail_starts: int) -> list[str]:
    """The stand-in REPL: a short import and trusted check, so kills land mid-attempt."""
    cmd = [sys.executable, str(FAKE), "--load-time", "0.2", "--check-time", "0.3"]
    if pids is not None:
        cmd += ["--pid-file", str(pids)]
    if fail_starts and starts is not None:
        cmd += ["--fail-starts", str(fail_starts), "--starts-file", str(starts)]
    return cmd


def runtime_toml(mode: str, cmd: list[str]) -> str:
    opts = {
        "spares": 1,
        "start_retries": START_RETRIES[mode],
        "start_backoff_s": 0.05,
        "max_start_backoff_s": 0.2,
        "repl_command": cmd,
    }
    inline = ", ".join(f"{k} = {json.dumps(v)}" for k, v in opts.items())
    # isolate = false: the stand-in writes its pid and start files outside any sandbox
    return (
        '[env.runtime]\nname = "local"\nworkers = 1\ntimeout_s = 30\nisolate = false\n'
        f"options = {{ {inline} }}\n"
    )


def config_toml(mode: str, model: Path, size: Size, cmd: list[str]) -> str:
    stops = json.dumps(STOPS)
    if mode == "eval":
        head = (
            "samples = 2\nk = [1, 2]\nchunk_tasks = 1\npipeline_depth = 1\nprogress = false\n"
            f'[env]\nid = "minif2f"\n[env.taskset]\npath = {json.dumps(str(FIXTURES / "data"))}\n'
            f"limit = {size.tasks}\n"
        )
        tail = (
            f"[policy]\nmodel = {json.dumps(str(model))}\nbatch_size = 4\n"
            f"[sampling]\nmax_tokens = 12\nstop = {stops}\n"
        )
        return head + runtime_toml(mode, cmd) + tail
    env = (
        f'[env]\nid = "dataset"\n[env.taskset]\n'
        f'path = {json.dumps(str(FIXTURES / "toy_tasks.jsonl"))}\nsplit = "train"\n'
        '[env.harness]\nname = "whole-proof"\n'
    )
    if mode == "grpo":
        head = (
            f"steps = {size.steps}\ntasks_per_step = 2\ngroup_size = 2\nsave_every = 2\n"
            "keep_checkpoints = 50\nlr = 1e-3\nmask_truncated = false\n"
        )
        tail = f"[sampling]\nmax_tokens = 8\ntop_p = 1.0\nstop = {stops}\n"
    else:
        head = (
            f"steps = {size.steps}\ntasks_per_step = 2\npopulation = 4\nsamples_per_task = 2\n"
            "greedy = false\nsigma = 0.05\nalpha = 0.05\nsave_every = 2\nkeep_checkpoints = 50\n"
            'seed = 0\n[scorer]\nbackend = "inprocess"\n'
        )
        tail = f'[policy]\ndevice = "cpu"\nbatch_size = 8\n[sampling]\nmax_tokens = 8\nstop = {stops}\n'
    return head + env + runtime_toml(mode, cmd) + tail


def leanrl_args(mode: str, toml: Path, model: Path, out: Path) -> list[str]:
    """The command's arguments after ``leanrl``."""
    if mode == "eval":
        return ["eval", "--config", str(toml), "--out", str(out)]
    return ["train", mode, "--config", str(toml), "--model", str(model), "--out", str(out)]


# -- reading a run ----------------------------------------------------------------------------


def jsonl(path: Path) -> list[dict[str, Any]]:
    """The complete, parseable lines of a log (a kill may leave a torn last line)."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def progress(mode: str, out: Path) -> int:
    """Records so far: eval attempts, trainer steps."""
    return len(jsonl(out / ("results.jsonl" if mode == "eval" else "metrics.jsonl")))


def total_records(mode: str, size: Size) -> int:
    return 2 * size.tasks if mode == "eval" else size.steps


# -- faults -----------------------------------------------------------------------------------


def our_repls(pids: Path) -> list[int]:
    """Live stand-in REPLs of this round (their command line names the round's pid file)."""
    if not pids.is_file():
        return []
    found = []
    for text in set(pids.read_text().split()):
        pid = int(text)
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if str(pids).encode() in cmdline and state != "Z":
            found.append(pid)
    return sorted(found)


class ReplKiller(threading.Thread):
    """Kills a random REPL of the round after random gaps (exponential, counted in time that
    some REPL of the round is alive, so kills land while there is one), up to ``limit``."""

    POLL_S = 0.1

    def __init__(self, pids: Path, rng: random.Random, mean_gap_s: float, limit: int) -> None:
        super().__init__(daemon=True)
        self.pids, self.rng, self.mean_gap_s, self.limit = pids, rng, mean_gap_s, limit
        self.kills = 0
        self.stop = threading.Event()

    def run(self) -> None:
        left = self.rng.expovariate(1.0 / self.mean_gap_s)
        while self.kills < self.limit and not self.stop.wait(self.POLL_S):
            alive = our_repls(self.pids)
            if not alive:
                continue
            left -= self.POLL_S
            if left > 0:
                continue
            try:
                os.kill(self.rng.choice(alive), signal.SIGKILL)
                self.kills += 1
            except ProcessLookupError:
                pass
            left = self.rng.expovariate(1.0 / self.mean_gap_s)


def launch(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, **CHILD_ENV, "PYTHONPATH": str(REPO)}
    with log.open("ab") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "leanrl.cli", *argv], cwd=REPO, env=env, stdout=f, stderr=f
        )


def kill_when(
    proc: subprocess.Popen[bytes], done: Callable[[], int], target: int, total: int, delay_s: float
) -> bool:
    """SIGKILL ``proc`` once ``done()`` reaches ``target`` records and ``delay_s`` more passed
    (or at once when it has recorded all ``total``: it is then writing its summary, a moment
    worth killing too); False when it exited first."""
    while proc.poll() is None and done() < target:
        time.sleep(0.02)
    deadline = time.monotonic() + delay_s
    while proc.poll() is None and time.monotonic() < deadline and done() < total:
        time.sleep(0.02)
    if proc.poll() is not None:
        return False
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return True


# -- comparing with the reference -------------------------------------------------------------


def compare_eval(out: Path, ref: Path, r: Round) -> None:
    from leanrl.eval.store import read_results

    want = {(x["task_id"], x["sample"]): x for x in read_results(ref)}
    lines: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for x in read_results(out):
        lines.setdefault((x["task_id"], x["sample"]), []).append(x)
    r.records = len(want)
    for key, twin in want.items():
        got = lines.get(key, [])
        final = [x for x in got if x["verdict"]["reason"] != "infra"]
        r.infra_redone += bool(final) and len(final) < len(got)
        if not final:
            r.lost += 1
            r.infra_left += bool(got)
            continue
        r.duplicated += len(final) - 1
        for x in final:
            # the stand-in rejects nothing the reference accepted: any other verdict is a fault
            # of the checker that was charged to the model
            if x["verdict"]["reason"] != twin["verdict"]["reason"]:
                r.infra_as_error += 1
    r.duplicated += sum(len(v) for k, v in lines.items() if k not in want)
    same = all(
        (lines[k][-1]["completion"], lines[k][-1]["verdict"]["reason"])
        == (t["completion"], t["verdict"]["reason"])
        for k, t in want.items()
        if k in lines
    )
    s = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else {}
    s_ref = json.loads((ref / "summary.json").read_text())
    r.identical = (
        same
        and r.lost == 0
        and s.get("results", {}).get("pass_at_k") == s_ref["results"]["pass_at_k"]
    )


def weights_equal(a: Path, b: Path) -> bool:
    """Every tensor of every ``*.safetensors`` file of two checkpoints, bit for bit."""
    import torch
    from safetensors.torch import load_file

    files = sorted(p.name for p in a.glob("*.safetensors"))
    if not files or files != sorted(p.name for p in b.glob("*.safetensors")):
        return False
    for name in files:
        ta, tb = load_file(a / name), load_file(b / name)
        if ta.keys() != tb.keys() or not all(torch.equal(ta[k], tb[k]) for k in ta):
            return False
    return True


STEP_FIELDS = ("reward_mean", "reward_std", "pass_rate", "infra")


def compare_trainer(out: Path, ref: Path, r: Round, steps: int) -> None:
    # GRPO's proofs.jsonl numbers steps from 0, ES's from 1 (metrics.jsonl: both from 1)
    base = 1 if r.mode == "grpo" else 0
    rows, want_rows = jsonl(out / "metrics.jsonl"), jsonl(ref / "metrics.jsonl")
    counted = Counter(int(x["step"]) for x in rows)
    want_steps = {int(x["step"]) for x in want_rows}

    # proofs.jsonl holds each distinct verified proof of a task once (leanrl.proofs.ProofStore):
    # a proof is its (task, digest); its step says which step found it first
    def keys(rs: list[dict[str, Any]]) -> list[tuple[str, str]]:
        return [(str(p["task_id"]), str(p["digest"])) for p in rs]

    proofs, want_proofs = jsonl(out / "proofs.jsonl"), jsonl(ref / "proofs.jsonl")
    have, want = Counter(keys(proofs)), set(keys(want_proofs))
    r.records = len(want_steps) + len(want)
    r.lost = len(want_steps - set(counted)) + len(want - set(have))
    r.duplicated = sum(n - 1 for n in counted.values()) + sum(n - 1 for n in have.values())
    r.duplicated += len(set(counted) - want_steps)
    r.extra = len(set(have) - want)
    by_step = {int(x["step"]): x for x in rows}
    # An attempt the reference accepted that the run neither accepted nor called `infra` was
    # rejected: a fault of the checker charged to the model. Counted at the first step whose
    # proofs differ (later steps train on other weights and differ anyway).
    for step in sorted(want_steps):
        mine = {k for k, p in zip(keys(proofs), proofs, strict=True) if p["step"] + base == step}
        theirs = {
            k
            for k, p in zip(keys(want_proofs), want_proofs, strict=True)
            if p["step"] + base == step
        }
        if mine != theirs:
            infra = int(by_step.get(step, {}).get("infra", 0))
            r.infra_as_error = max(0, len(theirs - mine) - infra)
            break
    fields_same = all(
        step in by_step and all(by_step[step].get(f) == x.get(f) for f in STEP_FIELDS)
        for x in want_rows
        for step in [int(x["step"])]
    )
    last, last_ref = out / f"checkpoint-{steps}", ref / f"checkpoint-{steps}"
    r.identical = fields_same and set(have) == want and weights_equal(last, last_ref)


def eval_finals(out: Path) -> dict[tuple[str, int], tuple[str, str]]:
    """Each attempt's final record (completion, verdict reason): the last one not ``infra``."""
    from leanrl.eval.store import read_results

    finals = {}
    for x in read_results(out):
        if x["verdict"]["reason"] != "infra":
            finals[(x["task_id"], x["sample"])] = (x["completion"], x["verdict"]["reason"])
    return finals


def resumes(mode: str, args: list[str], out: Path, steps: int) -> bool:
    """The same command on the finished run: it succeeds and adds or changes no record (for a
    trainer: it resumes from the last checkpoint, which is the finished run's)."""
    from leanrl.cli import main

    # eval: the reopen may rewrite results.jsonl without the superseded `infra` lines (by
    # design), so the records are compared, not the bytes
    logs = [out / "proofs.jsonl"] + ([] if mode == "eval" else [out / "metrics.jsonl"])
    before = [p.read_bytes() if p.is_file() else b"" for p in logs]
    finals = eval_finals(out) if mode == "eval" else {}
    try:
        rc = main(args)
    except SystemExit as e:  # some refusals leave the CLI by SystemExit
        rc = int(e.code) if isinstance(e.code, int) else 1
    after = [p.read_bytes() if p.is_file() else b"" for p in logs]
    if rc != 0 or after != before:
        return False
    if mode == "eval":
        return eval_finals(out) == finals
    state = out / f"checkpoint-{steps}" / "trainer_state.json"
    return state.is_file() and json.loads(state.read_text()).get("step") == steps


# -- a round ----------------------------------------------------------------------------------


def reference(mode: str, work: Path, model: Path, size: Size) -> Path:
    """The undisturbed run: no kill, no failing start, in this process."""
    from leanrl.cli import main

    ref = work / mode / "reference"
    if ref.exists():
        import shutil

        shutil.rmtree(ref)
    ref.mkdir(parents=True)
    toml = ref.parent / "reference.toml"
    toml.write_text(config_toml(mode, model, size, repl_command(None, None, 0)))
    rc = main(leanrl_args(mode, toml, model, ref))
    if rc != 0:
        raise SystemExit(f"fault_soak: the reference {mode} run failed (exit {rc}); see above")
    return ref


def done(mode: str, out: Path) -> bool:
    """The run finished: for eval, with no attempt left ``infra`` (a resume redoes those)."""
    summary = out / "summary.json"
    if not summary.is_file():
        return False
    if mode != "eval":
        return True
    return int(json.loads(summary.read_text())["results"].get("infra", 0)) == 0


def one_round(
    mode: str, index: int, seed: int, work: Path, model: Path, size: Size, ref: Path
) -> Round:
    """One round: the run killed once, REPLs killed and failing to start, resumed to the end."""
    rng = random.Random(f"{seed}:{mode}:{index}")
    r = Round(mode, index)
    folder = work / mode / f"round-{index}"
    if folder.exists():
        import shutil

        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    pids, starts, out = folder / "pids", folder / "starts", folder / "run"
    log = folder / "leanrl.log"
    # eval: as many failed starts as the pool retries, or up to 2 more, so that attempts get
    # `infra` (a resume must redo them); trainers: fewer than it retries (see the docstring)
    retries = START_RETRIES[mode]
    fail_starts = (
        rng.randint(retries, retries + 2) if mode == "eval" else rng.randint(0, retries - 1)
    )
    toml = folder / "run.toml"
    toml.write_text(config_toml(mode, model, size, repl_command(pids, starts, fail_starts)))
    args = leanrl_args(mode, toml, model, out)
    killer = ReplKiller(
        pids,
        random.Random(rng.random()),
        mean_gap_s=1.0,
        limit=rng.randint(min(1, size.repl_kills), size.repl_kills),
    )
    t0 = time.monotonic()
    killer.start()
    proc = launch(args, log)
    r.launches += 1
    try:
        # after at least one record: a kill during the imports would test little
        total = total_records(mode, size)
        target = rng.randint(1, max(1, total // 2))
        delay = rng.uniform(0, 0.5)
        r.run_kills += kill_when(proc, lambda: progress(mode, out), target, total, delay)
        for _ in range(8):  # bounded: the faults of a round are finite
            if proc.poll() is not None and proc.returncode == 0 and done(mode, out):
                break
            proc = launch(args, log)
            r.launches += 1
            try:
                proc.wait(timeout=600)
            except subprocess.TimeoutExpired:
                r.failures.append(f"a launch did not finish in 600 s (see {log})")
                break
    finally:
        killer.stop.set()
        killer.join()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    r.wall_s = time.monotonic() - t0
    r.repl_kills = killer.kills
    r.start_failures = min(fail_starts, starts.stat().st_size if starts.is_file() else 0)
    if not done(mode, out):
        r.failures.append(f"not done after {r.launches} launches (see {log})")
    # REPLs must not outlive the run (they die with their owner, even after SIGKILL)
    for _ in range(50):
        if not our_repls(pids):
            break
        time.sleep(0.1)
    r.orphans = len(our_repls(pids))
    if mode == "eval":
        compare_eval(out, ref, r)
    else:
        compare_trainer(out, ref, r, size.steps)
    r.resumes = resumes(mode, args, out, size.steps)
    for what, bad in [
        ("lost", r.lost),
        ("duplicated", r.duplicated),
        ("infra-as-error", r.infra_as_error),
        ("orphan REPLs", r.orphans),
        ("proofs the reference does not have", r.extra),
    ]:
        if bad:
            r.failures.append(f"{bad} {what}")
    if not r.identical:
        r.failures.append("final results differ from the undisturbed reference run")
    if not r.resumes:
        r.failures.append("the same command on the finished run did not resume cleanly")
    return r


# -- the report -------------------------------------------------------------------------------


def figures(rounds: list[Round]) -> dict[str, Any]:
    walls = [x.wall_s for x in rounds]
    return {
        "rounds": len(rounds),
        "kills": sum(x.run_kills + x.repl_kills for x in rounds),
        "run_kills": sum(x.run_kills for x in rounds),
        "repl_kills": sum(x.repl_kills for x in rounds),
        "start_failures": sum(x.start_failures for x in rounds),
        "launches": sum(x.launches for x in rounds),
        "records": sum(x.records for x in rounds),
        "lost": sum(x.lost for x in rounds),
        "duplicated": sum(x.duplicated for x in rounds),
        "infra_as_error": sum(x.infra_as_error for x in rounds),
        "orphans": sum(x.orphans for x in rounds),
        "infra_redone": sum(x.infra_redone for x in rounds),
        "extra": sum(x.extra for x in rounds),
        "identical": all(x.identical for x in rounds),
        "resumes": all(x.resumes for x in rounds),
        "wall_s": {
            "min": min(walls, default=0.0),
            "median": statistics.median(walls) if walls else 0.0,
            "max": max(walls, default=0.0),
        },
    }


def table(modes: dict[str, dict[str, Any]]) -> str:
    cols = [
        ("mode", lambda m, f: m),
        ("rounds", lambda m, f: f["rounds"]),
        ("kills (run+REPL)", lambda m, f: f"{f['kills']} ({f['run_kills']}+{f['repl_kills']})"),
        ("start fails", lambda m, f: f["start_failures"]),
        ("records", lambda m, f: f["records"]),
        ("lost", lambda m, f: f["lost"]),
        ("dup", lambda m, f: f["duplicated"]),
        ("infra-as-error", lambda m, f: f["infra_as_error"]),
        ("infra redone", lambda m, f: f["infra_redone"]),
        ("identical", lambda m, f: "yes" if f["identical"] else "NO"),
        ("resumes", lambda m, f: "yes" if f["resumes"] else "NO"),
        (
            "wall s/round min/med/max",
            lambda m, f: "{min:.0f}/{median:.0f}/{max:.0f}".format(**f["wall_s"]),
        ),
    ]
    rows = [[str(c[0]) for c in cols]] + [[str(c[1](m, f)) for c in cols] for m, f in modes.items()]
    widths = [max(len(row[i]) for row in rows) for i in range(len(cols))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2, help="rounds per mode (default 2)")
    ap.add_argument("--seed", type=int, default=0, help="seeds every fault's choice and moment")
    ap.add_argument(
        "--only",
        action="append",
        choices=MODES + soak_phases.PHASES,
        help="a mode or phase to run instead of all (repeat for several)",
    )
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "fault-soak")
    ap.add_argument("--tasks", type=int, default=Size.tasks, help="eval tasks (2 samples each)")
    ap.add_argument("--steps", type=int, default=Size.steps, help="GRPO/ES steps (even)")
    ap.add_argument(
        "--repl-kills",
        type=int,
        default=Size.repl_kills,
        help="the most REPL processes a round kills (default 3; 0: none, to test the rest alone)",
    )
    a = ap.parse_args(argv)
    if a.rounds < 1 or a.tasks < 1 or a.steps < 2 or a.steps % 2 or a.repl_kills < 0:
        ap.error(
            "--rounds and --tasks must be at least 1, --steps even and at least 2, "
            "--repl-kills at least 0"
        )
    size = Size(tasks=a.tasks, steps=a.steps, repl_kills=a.repl_kills)
    work = a.out / "work"
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    model = tiny_model(work)
    report: dict[str, Any] = {"seed": a.seed, "size": vars(size), "modes": {}, "rounds": []}
    failures: list[str] = []
    chosen = a.only or [*MODES, *soak_phases.PHASES]
    for mode in [m for m in MODES if m in chosen]:
        ref = reference(mode, work, model, size)
        rounds = []
        for i in range(a.rounds):
            r = one_round(mode, i, a.seed, work, model, size, ref)
            print(
                f"{mode} round {i}: {r.run_kills} run kill(s), {r.repl_kills} REPL kill(s), "
                f"{r.start_failures} failed start(s), {r.launches} launch(es), "
                f"{r.wall_s:.1f} s: {'; '.join(r.failures) or 'ok'}",
                flush=True,
            )
            failures += [f"{mode} round {i} (--seed {a.seed}): {f}" for f in r.failures]
            rounds.append(r)
        report["modes"][mode] = figures(rounds)
        report["rounds"] += [vars(r) for r in rounds]
    report["phases"] = {}
    for name in [x for x in soak_phases.PHASES if x in chosen]:
        if name == "hung-start":
            ph = soak_phases.hung_start(a.seed, work, model, size)
        else:
            ph = soak_phases.session_starvation(a.seed, work)
        print(
            f"{name}: {ph.wall_s:.1f} s: {'; '.join(ph.failures) or 'ok'}\n"
            f"  {json.dumps(ph.figures)}",
            flush=True,
        )
        failures += [f"phase {name} (--seed {a.seed}): {f}" for f in ph.failures]
        report["phases"][name] = {**ph.figures, "wall_s": ph.wall_s, "ok": not ph.failures}
    report["ok"] = not failures
    report["failures"] = failures
    report["wall_s"] = time.monotonic() - started
    (a.out / "fault_soak.json").write_text(json.dumps(report, indent=1) + "\n")
    print()
    if report["modes"]:
        print(table(report["modes"]))
    print(f"\nfigures: {a.out / 'fault_soak.json'}")
    if failures:
        print("\nFAILED:\n" + "\n".join(f"  {f}" for f in failures))
        return 1
    print("all assertions held: 0 lost, 0 duplicated, 0 infra-as-error, identical to reference")
    return 0


if __name__ == "__main__":
    sys.exit(main())
