"""``leanrl verify``, ``leanrl setup`` and ``leanrl doctor`` (CLI command models).

Imports nothing heavy at module level (the CLI lists every command at start-up).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import CliPositionalArg

from leanrl.config import ConfigCommand
from leanrl.environment import EnvironmentConfig, load_environment
from leanrl.errors import ConfigError, DatasetError, LeanNotFoundError, disk_errors
from leanrl.jsonl import quarantine, read_jsonl, rewrite_log, scan_log
from leanrl.runlock import FolderLock
from leanrl.task import Task
from leanrl.verdict import Attempt, Verdict

__all__ = [
    "DoctorCommand",
    "SetupCommand",
    "VerifyCommand",
    "check_proofs_path",
    "read_proof_rows",
    "verify_file",
]


def check_proofs_path(path: Path) -> None:
    """A one-line :class:`ConfigError` unless ``path`` is a file (a folder is named as one)."""
    if path.is_dir():
        raise ConfigError(
            f"proofs file {path} is a folder: leanrl verify takes a JSONL file of proofs "
            "(rows with name and proof), e.g. a run's proofs.jsonl"
        )
    if not path.is_file():
        raise ConfigError(f"proofs file {path} does not exist")


def read_proof_rows(path: Path, tasks: list[Task]) -> list[tuple[int, Task, dict[str, Any]]]:
    """Read ``path`` (JSONL rows with ``name`` and ``proof``; optional ``preamble``, ``id``) and
    match each row to its task. Any bad row raises :class:`DatasetError` naming it."""
    check_proofs_path(path)
    by_name: dict[str, Task] = {}
    for t in tasks:
        by_name.setdefault(t.name, t)
        by_name.setdefault(t.id, t)
    rows: list[tuple[int, Task, dict[str, Any]]] = []
    for i, row in read_jsonl(path):  # names file, row and column of any non-UTF-8 byte
        where = f"{path}, row {i}"
        for field in ("name", "proof"):
            if not isinstance(row.get(field), str):
                raise DatasetError(f"{where}: field {field!r} is missing or not a string")
        for field in ("preamble", "id"):
            if field in row and not isinstance(row[field], str):
                raise DatasetError(f"{where}: field {field!r} must be a string")
        task = by_name.get(row["name"])
        if task is None:
            raise DatasetError(
                f"{where}: no task named {row['name']!r} in this environment's taskset "
                "(check --env and --env.taskset.split)"
            )
        rows.append((i, task, row))
    if not rows:
        raise DatasetError(f"{path}: no rows")
    return rows


VERIFY_CHUNK = 32
"""Rows ``leanrl verify`` writes together (each chunk's verdicts are appended and fsynced as it
finishes, so a kill loses the chunks being checked at that moment and no more)."""


def _row_digest(task: Task, row: dict[str, Any]) -> str:
    """What a verdict of ``row`` was given for: the task and the proof as written. A rerun
    takes an earlier verdict only when the row still says the same."""
    key = [task.id, row["proof"], row.get("preamble", ""), row.get("id")]
    return hashlib.sha256(json.dumps(key, ensure_ascii=False).encode("utf-8")).hexdigest()[:16]


def _verdict_record(value: Any) -> dict[str, Any]:
    """A line of a verdicts file, checked enough to be taken again (ValueError otherwise)."""
    if not isinstance(value, dict):
        raise TypeError("not a JSON object")
    if not isinstance(value.get("row"), int) or not isinstance(value.get("reason"), str):
        raise ValueError("no row or reason")
    if not isinstance(value.get("accepted"), bool):
        raise ValueError("no accepted")
    return value


async def verify_file(
    env_config: EnvironmentConfig, proofs: Path, out: Path, chunk: int = VERIFY_CHUNK
) -> dict[str, Any]:
    """Check every row of ``proofs``; write one verdict per row to ``out``; return a summary.

    Resumable as ``leanrl eval`` is: verdicts are appended to ``out`` a chunk of ``chunk`` rows
    at a time (whole lines, fsynced), and a rerun with the same ``out`` takes every verdict an
    earlier run wrote for a row that still says the same (``digest``: the task and the proof)
    and checks only the rest; ``infra`` verdicts (the checker did not run) are checked again.
    A torn last line (a kill mid-write) is cut off, an unreadable one moved to
    ``out.quarantined``. At the end ``out`` is rewritten in row order, one verdict per row."""
    env = load_environment(env_config)
    tasks = env.tasks()
    rows = read_proof_rows(proofs, tasks)
    policy = env.taskset.config.policy
    digests = {i: _row_digest(task, row) for i, task, row in rows}
    lock = FolderLock(out.parent, f"leanrl verify writing {out.name}")
    lock.path = out.parent / f".{out.name}.lock"  # one lock per verdicts file, not per folder
    with lock:
        done = _earlier_verdicts(out, digests)
        todo = [
            (i, task, row)
            for i, task, row in rows
            if done.get(i, {}).get("reason") in (None, "infra")
        ]
        attempts = [
            Attempt(
                name=task.name,
                header=task.header,
                formal_statement=task.formal_statement,
                proof=row["proof"],
                preamble=row.get("preamble", ""),
                policy=policy,
                id=row.get("id") or f"{task.id}#{i}",
            )
            for i, task, row in todo
        ]
        t0 = time.monotonic()
        if attempts:
            async with env.runtime as runtime:
                pieces = [
                    (todo[k : k + chunk], attempts[k : k + chunk])
                    for k in range(0, len(todo), chunk)
                ]

                async def check(
                    piece: tuple[list[tuple[int, Task, dict[str, Any]]], list[Attempt]],
                ) -> list[dict[str, Any]]:
                    verdicts: list[Verdict] = await runtime.check(piece[1])
                    return [
                        {
                            "row": i,
                            "name": task.name,
                            "digest": digests[i],
                            **v.model_dump(mode="json"),
                        }
                        for (i, task, _), v in zip(piece[0], verdicts, strict=True)
                    ]

                # Every chunk goes to the runtime at once (its queue keeps them busy as one call
                # did); each is written the moment it is done.
                running = [asyncio.ensure_future(check(piece)) for piece in pieces]
                try:
                    for finished in asyncio.as_completed(running):
                        recs = await finished
                        _append(out, recs)
                        done.update((r["row"], r) for r in recs)
                finally:
                    for t in running:
                        t.cancel()
        wall = time.monotonic() - t0
        final = [done[i] for i, _, _ in rows]
        _rewrite(out, final)
    reasons = Counter(str(r["reason"]) for r in final)
    return {
        "rows": len(final),
        "accepted": sum(bool(r["accepted"]) for r in final),
        "reasons": dict(reasons.most_common()),
        "checked": len(todo),
        "taken_from_earlier_run": len(rows) - len(todo),
        "wall_s": round(wall, 3),
        "attempts_per_s": round(len(todo) / wall, 3) if wall > 0 and todo else None,
        "verdicts": str(out),
    }


def _earlier_verdicts(out: Path, digests: dict[int, str]) -> dict[int, dict[str, Any]]:
    """The verdicts an earlier run wrote to ``out`` for rows that still say the same (the last
    one per row), after cutting a torn last line and moving unreadable lines aside."""
    scan = scan_log(out, _verdict_record)
    if scan.bad or scan.torn:
        quarantine(out, scan.bad, "verdict record")
        rewrite_log(out, {i for i, _ in scan.good}, out.name)
    done: dict[int, dict[str, Any]] = {}
    for _, rec in scan.good:
        if digests.get(rec["row"]) == rec.get("digest"):
            done[rec["row"]] = rec
    return done


def _append(out: Path, recs: list[dict[str, Any]]) -> None:
    """Append ``recs`` as whole lines, in one write, fsynced (a kill tears at most the last)."""
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs)
    with disk_errors(out, "the verdicts"):
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())


def _rewrite(out: Path, recs: list[dict[str, Any]]) -> None:
    """``out`` as an uninterrupted run leaves it: one verdict per row, in row order (written
    beside it and renamed over it, so it is whole at every moment)."""
    tmp = out.with_name(f".{out.name}.tmp")
    with disk_errors(out, "the verdicts"):
        out.parent.mkdir(parents=True, exist_ok=True)
        with tmp.open("w", encoding="utf-8") as f:
            f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)


class VerifyCommand(ConfigCommand):
    """Check a file of proofs (JSONL rows: name, proof; optional preamble, id) against an
    environment's statements, and write one verdict per row plus a summary. Verdicts are
    written as they come; rerun the same command after a kill and it checks only the rows
    without a verdict (and those the checker could not run, ``infra``).

    Example: leanrl verify proofs.jsonl --env minif2f --env.runtime.workers 8
    """

    proofs: CliPositionalArg[Path]
    """The JSONL file of proofs to check."""
    env: EnvironmentConfig = Field(default_factory=EnvironmentConfig)
    """The environment whose statements, policy and runtime are used (``--env ID``)."""
    out: Path | None = None
    """Where to write the verdicts (default: PROOFS with the suffix .verdicts.jsonl)."""
    print_json: bool = False
    """Print the summary as JSON instead of text."""
    chunk: int = Field(default=VERIFY_CHUNK, ge=1)
    """Rows whose verdicts are written together, as each such chunk is done: a kill loses at
    most the chunks being checked at that moment, and the same command run again checks only
    the rows without a verdict."""

    def cli_cmd(self) -> None:
        cmd = self.resolved()
        env = cmd.env
        if "split" not in env.taskset.model_fields_set:
            # Rows may name tasks of any split unless the user picked one.
            env = env.model_copy(update={"taskset": env.taskset.model_copy(update={"split": None})})
        check_proofs_path(cmd.proofs)  # before the taskset loads (a folder is not "missing")
        out = cmd.out or cmd.proofs.with_suffix(".verdicts.jsonl")
        if out.is_dir():
            raise ConfigError(f"--out {out} is a folder: give the verdicts file to write")
        summary = asyncio.run(verify_file(env, cmd.proofs, out, cmd.chunk))
        summary_path = out.with_suffix(".summary.json")
        with disk_errors(summary_path, "the summary"):
            summary_path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        if cmd.print_json:
            print(json.dumps(summary, indent=2))
        else:
            print(f"{summary['accepted']}/{summary['rows']} accepted  ({summary['wall_s']} s)")
            if summary["taken_from_earlier_run"]:
                print(
                    f"  ({summary['taken_from_earlier_run']} verdicts kept from an earlier run of this command "
                    f"in {out}; {summary['checked']} rows checked now)"
                )
            for reason, n in summary["reasons"].items():
                print(f"  {reason:<18} {n}")
            print(f"verdicts: {out}\nsummary:  {summary_path}")
        infra = summary["reasons"].get("infra", 0)
        if infra:
            # Those rows were not judged at all: a script must not take the file as checked.
            print(
                f"leanrl verify: error: {infra} of {summary['rows']} rows could not be checked "
                "(`infra`: the checker did not run); see their `detail` in the verdicts file, "
                "fix the runtime and rerun",
                file=sys.stderr,
            )
            raise SystemExit(1)


def _taskset_pins(env_id: str) -> tuple[str | None, str | None, str]:
    env = load_environment(EnvironmentConfig(id=env_id))
    ts = env.taskset
    return ts.lean_toolchain, ts.mathlib_rev, ts.mathlib_repo


def _no_lean(env_id: str) -> str | None:
    """Why environment ``env_id`` needs no Lean (it judges answers itself), or None when it
    does."""
    env = load_environment(EnvironmentConfig(id=env_id))
    if env.needs_lean:
        return None
    return f"environment {env_id!r} needs no Lean (it checks its answers in Python)"


def _bubblewrap_install() -> str:
    """How to install bubblewrap on this machine (by its package manager), or what to do where
    it does not exist (macOS)."""
    if sys.platform == "darwin":
        return (
            "bubblewrap is Linux-only, so on macOS use the docker runtime (--env.runtime.name "
            "docker, docs/sandboxes.md), a Linux VM, or a Modal sandbox"
        )
    ids = ""
    try:
        for line in Path("/etc/os-release").read_text(encoding="utf-8").splitlines():
            if line.startswith(("ID=", "ID_LIKE=")):
                ids += " " + line.split("=", 1)[1].strip('"').lower()
    except OSError:
        pass
    for names, cmd in (
        (("debian", "ubuntu"), "sudo apt-get install bubblewrap"),
        (("fedora", "rhel", "centos"), "sudo dnf install bubblewrap"),
        (("arch",), "sudo pacman -S bubblewrap"),
        (("suse",), "sudo zypper install bubblewrap"),
        (("alpine",), "sudo apk add bubblewrap"),
    ):
        if any(n in ids for n in names):
            return f"install it: {cmd}"
    return "install bubblewrap with your package manager (the package is called bubblewrap)"


def sandbox_preflight() -> None:
    """Refuse, before the long set-up, on a machine where the local runtime will not run Lean:
    it sandboxes every Lean process with bubblewrap and refuses to start without it unless
    ``LEANRL_ALLOW_UNSANDBOXED=1`` (then this only warns)."""
    from leanrl.lean.trust.containment import isolation_problem

    problem = isolation_problem()
    if problem is None:
        return
    if sys.platform == "darwin" and problem.startswith("bubblewrap (`bwrap`) is not installed"):
        problem = "bubblewrap (`bwrap`) does not exist on macOS"
    elif "not installed" not in problem:
        problem += (
            " (bubblewrap needs unprivileged user namespaces: in a container, run it with "
            "--privileged or use the docker runtime from the host; on Ubuntu 24.04+, AppArmor "
            "may block them: sysctl kernel.apparmor_restrict_unprivileged_userns=0)"
        )
    giving_up = (
        "LEANRL_ALLOW_UNSANDBOXED=1 runs Lean without the sandbox: an attempt that manages to "
        "run code while it is elaborated can then read your files, reach the network and "
        "interfere with the trusted checker, so only do it for proofs from a trusted source"
    )
    if os.environ.get("LEANRL_ALLOW_UNSANDBOXED") == "1":
        print(f"warning: {problem}; {giving_up}", file=sys.stderr)
        return
    raise LeanNotFoundError(
        f"the local runtime sandboxes every Lean process with bubblewrap, and {problem}: "
        f"{_bubblewrap_install()}, then rerun `leanrl setup`. ({giving_up}.)"
    )


class SetupCommand(BaseModel):
    """Create (or reuse) a Lean project with the toolchain and Mathlib an environment needs,
    fetch Mathlib's build cache and build the Lean REPL at the matching version (an environment
    that needs no Lean, such as countdown, has nothing to set up).

    Needs the internet; installs elan (the Lean toolchain manager) first if it is missing.
    Example: leanrl setup --env minif2f
    """

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    env: EnvironmentConfig = Field(default_factory=EnvironmentConfig)
    """The environment to set up for (``--env ID``)."""
    dest: Path | None = None
    """Project folder (default: under ~/.cache/leanrl/projects/)."""
    install_elan: bool = True
    """Install elan (the Lean toolchain manager, into ~/.elan) with its official installer when
    it is missing. ``--no-install_elan`` stops with the install command instead."""

    def cli_cmd(self) -> None:
        from leanrl.lean.project import setup_project

        no_lean = _no_lean(self.env.id)
        if no_lean is not None:
            print(f"{no_lean}: nothing to set up; `leanrl eval --env {self.env.id}` runs as it is")
            return
        sandbox_preflight()
        toolchain, rev, repo = _taskset_pins(self.env.id)
        if toolchain is None:
            raise LeanNotFoundError(
                f"environment {self.env.id!r} does not say which Lean toolchain it needs; "
                "point LEANRL_LEAN_PROJECT at a project instead"
            )
        path = setup_project(toolchain, rev, repo, self.dest, install=self.install_elan)
        print(
            f"ready: {path}\nleanrl uses it by default; elsewhere: export LEANRL_LEAN_PROJECT={path}"
        )


class DoctorCommand(BaseModel):
    """Report what leanrl finds (elan, lake, lean, the project, Mathlib, the REPL, versions) and
    the command that fixes whatever is missing (for an environment that needs no Lean, such as
    countdown: that it needs none)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    env: EnvironmentConfig = Field(default_factory=EnvironmentConfig)
    """The environment whose toolchain and Mathlib to check for (``--env ID``)."""
    print_json: bool = False
    """Print the report as JSON."""
    smoke: bool = True
    """When a REPL is found, also start it once and run leanrl's trusted checker on a valid
    proof and on a cheat (proves the checker works with this Lean version)."""

    def cli_cmd(self) -> None:
        from leanrl.lean.project import Check, doctor

        no_lean = _no_lean(self.env.id)
        if no_lean is not None:  # what it needs is leanrl itself, which is running
            checks = [Check(name="lean", ok=True, found=f"{no_lean}: nothing to install")]
        else:
            toolchain, rev, _ = _taskset_pins(self.env.id)
            checks = doctor(self.env.runtime.lean_project, toolchain, rev, self.env.id, self.smoke)
        if self.print_json:
            print(json.dumps([c.model_dump() for c in checks], indent=2))
            if not all(c.ok for c in checks):
                raise SystemExit(1)
            return
        for c in checks:
            mark = "ok     " if c.ok else "MISSING"
            print(f"{mark} {c.name:<13} {c.found}")
            if not c.ok and c.fix:
                print(f"        fix: {c.fix}")
        if all(c.ok for c in checks):
            print("everything needed is in place")
        else:
            raise SystemExit(1)
