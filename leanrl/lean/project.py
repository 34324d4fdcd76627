"""Finding, creating and diagnosing the Lean project that proofs are checked in.

Where the project comes from, first match wins:

1. ``RuntimeConfig.lean_project``;
2. the ``LEANRL_LEAN_PROJECT`` environment variable;
3. the project ``leanrl setup`` made last (``~/.cache/leanrl/default-project`` names it).

``leanrl setup --env ID`` makes a project under ``~/.cache/leanrl/projects/`` with the taskset's
toolchain and Mathlib revision, fetches Mathlib's build cache and builds the REPL at the matching
version, using the standard tools (elan, lake). ``leanrl doctor`` reports what is there.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from leanrl.errors import LeanNotFoundError
from leanrl.lean.versions import REPL_REVISIONS, REPL_REVS, REPL_UNTAGGED

__all__ = [
    "REPL_REPO",
    "REPL_REVISIONS",
    "REPL_UNTAGGED",
    "Check",
    "cache_root",
    "doctor",
    "elan_bin",
    "find_project",
    "find_repl",
    "install_elan",
    "lean_command",
    "project_dir",
    "repl_command",
    "repl_tag",
    "resolve_lake_env",
    "setup_project",
    "which",
]

REPL_REPO = "https://github.com/leanprover-community/repl"
ELAN_INSTALL = (
    "curl https://raw.githubusercontent.com/leanprover/elan/master/elan-init.sh -sSf | sh "
    "-s -- -y --default-toolchain none"
)


ELAN_INIT_URL = "https://raw.githubusercontent.com/leanprover/elan/master/elan-init.sh"


def elan_bin() -> Path:
    """Where elan puts ``elan``, ``lake`` and ``lean``: ``$ELAN_HOME/bin`` or ``~/.elan/bin``."""
    return Path(os.environ.get("ELAN_HOME") or Path.home() / ".elan") / "bin"


def which(tool: str) -> str | None:
    """``shutil.which``, also looking in elan's folder.

    elan's installer adds its folder to the shell profile, which a running shell (or the next
    command of a one-line set-up) does not see yet; so the folder is put on this process's PATH
    (children inherit it) when it exists.
    """
    found = shutil.which(tool)
    if found is None and (elan_bin() / tool).is_file():
        os.environ["PATH"] = f"{elan_bin()}{os.pathsep}{os.environ.get('PATH', '')}"
        found = shutil.which(tool)
    return found


def install_elan(
    log: Callable[[str], None] = print, fetch: Callable[[str], bytes] | None = None
) -> None:
    """Download and run elan's official installer (no default toolchain: each project pins its
    own), then make its folder visible to this process."""
    import tempfile

    if fetch is None:
        import httpx

        def fetch(url: str) -> bytes:
            r = httpx.get(url, follow_redirects=True, timeout=60.0)
            r.raise_for_status()
            return r.content

    log(f"installing elan from {ELAN_INIT_URL}")
    try:
        script = fetch(ELAN_INIT_URL)
    except Exception as e:
        raise LeanNotFoundError(
            f"could not download elan's installer ({type(e).__name__}: {e}). Install it by "
            f"hand: {ELAN_INSTALL}"
        ) from e
    with tempfile.NamedTemporaryFile("wb", suffix="-elan-init.sh", delete=False) as f:
        f.write(script)
    try:
        res = subprocess.run(["sh", f.name, "-y", "--default-toolchain", "none"], check=False)
    finally:
        os.unlink(f.name)
    if res.returncode != 0 or which("elan") is None:
        raise LeanNotFoundError(
            f"elan's installer failed (exit {res.returncode}); see its output above, or install "
            f"it by hand: {ELAN_INSTALL}"
        )


def cache_root() -> Path:
    """``$LEANRL_CACHE`` or ``~/.cache/leanrl``."""
    return Path(os.environ.get("LEANRL_CACHE") or Path.home() / ".cache" / "leanrl")


def repl_tag(toolchain: str) -> str:
    """The REPL revision matching a toolchain: ``leanprover/lean4:v4.24.0`` -> ``v4.24.0`` (the
    REPL tags its releases by Lean version; :data:`REPL_REVS` covers versions without a tag)."""
    tag = toolchain.rsplit(":", 1)[-1].strip()
    if not re.fullmatch(r"v\d+\.\d+\.\d+(-rc\d+)?", tag):
        raise LeanNotFoundError(
            f"cannot tell the Lean version from the toolchain {toolchain!r}; expected something "
            "like 'leanprover/lean4:v4.24.0'"
        )
    return REPL_REVS.get(tag, tag)


def project_dir(toolchain: str, mathlib_rev: str | None) -> Path:
    """Where ``leanrl setup`` keeps the project for a toolchain and Mathlib revision."""
    tag = repl_tag(toolchain)
    rev = (mathlib_rev or "core")[:12]
    digest = hashlib.sha1(f"{toolchain}|{mathlib_rev}".encode()).hexdigest()[:6]
    return cache_root() / "projects" / f"lean-{tag}-mathlib-{rev}-{digest}"


#: What an offline machine needs besides Lean (the README's promise, said where it is needed).
_OFFLINE_MODEL = (
    "Offline, the model must be a local folder too: --model ./my-model (copied from a "
    "connected machine's `hf download ID --local-dir DIR`)."
)


def setup_hint(env_id: str | None) -> str:
    """The ``leanrl setup`` to run: for the environment in use when it is known, else a
    placeholder with an example."""
    if env_id:
        return f"`leanrl setup --env {env_id}`"
    return (
        "`leanrl setup --env ENV` with the environment you use (e.g. `leanrl setup --env minif2f`)"
    )


def find_project(configured: Path | None = None, *, env_id: str | None = None) -> Path | None:
    """The Lean project to use (see the module docstring for the order), or None. ``env_id``
    (the environment in use) names the ``leanrl setup`` to run in errors."""
    if configured is not None:
        p = Path(configured).expanduser()
        if not p.is_dir():
            raise LeanNotFoundError(
                f"the configured Lean project {p} does not exist; fix runtime.lean_project or "
                f"run {setup_hint(env_id)}"
            )
        return p
    env = os.environ.get("LEANRL_LEAN_PROJECT")
    if env:
        p = Path(env).expanduser()
        if not p.is_dir():
            raise LeanNotFoundError(
                f"LEANRL_LEAN_PROJECT={env} is not a folder; point it at a Lean project or unset it"
            )
        return p
    pointer = cache_root() / "default-project"
    if pointer.is_file():
        p = Path(pointer.read_text(encoding="utf-8").strip())
        if p.is_dir():
            return p
    return None


def find_repl(project: Path | None) -> Path | None:
    """The REPL executable built in (or for) ``project``, or ``repl`` on PATH."""
    cands: list[Path] = []
    if project is not None:
        for name in ("REPL", "repl", "Repl"):
            cands.append(project / ".lake" / "packages" / name / ".lake" / "build" / "bin" / "repl")
        cands.append(project / ".lake" / "build" / "bin" / "repl")
    for c in cands:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    found = which("repl")
    return Path(found) if found else None


def _tool_missing(tool: str) -> LeanNotFoundError:
    return LeanNotFoundError(
        f"`{tool}` is not on PATH. Install the Lean toolchain manager elan: {ELAN_INSTALL} "
        "(then open a new shell), or point LEANRL_LEAN_PROJECT at a ready project"
    )


def _is_lake_project(project: Path | None) -> bool:
    return project is not None and any(
        (project / f).exists() for f in ("lakefile.lean", "lakefile.toml")
    )


def repl_command(
    project: Path | None, *, env_id: str | None = None
) -> tuple[list[str], Path | None]:
    """The command line that starts a REPL, and the folder to run it in (``env_id``: the
    environment in use, named in the ``leanrl setup`` an error suggests)."""
    repl = find_repl(project)
    if repl is None:
        if project is None and not any(which(t) for t in ("lean", "lake", "elan")):
            # Nothing of Lean here: building a REPL or one-shot mode would both fail next.
            raise LeanNotFoundError(
                "Lean is not installed here (no `lean`, `lake` or `elan` on PATH). Install the "
                f"toolchain manager elan: {ELAN_INSTALL} ; open a new shell, then run "
                f"{setup_hint(env_id)}: it installs the taskset's Lean and builds the REPL. Or "
                "point LEANRL_LEAN_PROJECT at a Lean project that has one."
            )
        where = f" in {project}" if project else ""
        oneshot = (
            ", or use --env.runtime.mode oneshot (slower, needs only `lean`)"
            if which("lean") or _is_lake_project(project)
            else ""
        )
        raise LeanNotFoundError(
            f"no Lean REPL found{where}. Run {setup_hint(env_id)} to build one{oneshot}"
        )
    if _is_lake_project(project):
        if which("lake") is None:
            raise _tool_missing("lake")
        return ["lake", "env", str(repl)], project
    return [str(repl)], project


def lean_command(project: Path | None) -> tuple[list[str], Path | None]:
    """The command line that runs ``lean`` (inside the project's ``lake env`` when there is
    one), and the folder to run it in."""
    if _is_lake_project(project):
        if which("lake") is None:
            raise _tool_missing("lake")
        return ["lake", "env", "lean"], project
    if which("lean") is None:
        raise _tool_missing("lean")
    return ["lean"], project


def resolve_lake_env(argv: list[str], cwd: Path | None) -> tuple[list[str], dict[str, str] | None]:
    """Turn ``lake env CMD...`` into ``CMD...`` plus the environment lake would set.

    Used for sandboxed processes: ``lake`` may want to write to the project (lock files, a
    re-elaborated lakefile), which a read-only sandbox forbids, so it runs once outside.
    """
    if argv[:2] != ["lake", "env"]:
        return argv, None
    res = subprocess.run(
        ["lake", "env", "env", "-0"], cwd=cwd, capture_output=True, check=False, timeout=300
    )
    if res.returncode != 0:
        raise LeanNotFoundError(
            f"`lake env` failed in {cwd}: {res.stderr.decode(errors='replace')[-500:]}"
        )
    env: dict[str, str] = {}
    for item in res.stdout.decode(errors="replace").split("\0"):
        key, sep, value = item.partition("=")
        if sep:
            env[key] = value
    return argv[2:], env


# -- doctor ------------------------------------------------------------------------------------


class Check(BaseModel):
    """One line of ``leanrl doctor``."""

    model_config = ConfigDict(frozen=True)

    name: str
    """What was looked for."""
    ok: bool
    """Whether it was found and works."""
    found: str = ""
    """What was found (path, version)."""
    fix: str = ""
    """The command that fixes it, when it is missing."""


def _version(argv: list[str], cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else ""


def doctor(
    configured: Path | None = None,
    toolchain: str | None = None,
    mathlib_rev: str | None = None,
    env_id: str = "<id>",
    smoke: bool = False,
) -> list[Check]:
    """What is installed and what is missing, each with the command that fixes it. With
    ``smoke``, also run the trusted checker once through a real REPL (:func:`smoke_test`)."""
    from leanrl.lean.trust.containment import isolation_problem

    checks: list[Check] = []
    own = "   (or export LEANRL_LEAN_PROJECT=/path/to/project)"
    setup = f"leanrl setup --env {env_id}"
    problem = isolation_problem()
    checks.append(
        Check(
            name="sandbox",
            ok=problem is None,
            found="bubblewrap works: Lean processes run isolated" if problem is None else problem,
            fix=""
            if problem is None
            else "apt-get install bubblewrap   (or use the docker runtime)",
        )
    )
    if toolchain is None:  # `leanrl setup` refuses such an environment: do not send users there
        setup = (
            "export LEANRL_LEAN_PROJECT=/path/to/project (a Lean project of the version your data "
            f"was written for: environment {env_id!r} names no Lean version, so `leanrl setup` "
            "cannot make one for it)"
        )
        own = ""
    for tool in ("elan", "lake", "lean"):
        path = which(tool)
        ver = _version([tool, "--version"]) if path else None
        fix = ELAN_INSTALL if tool == "elan" else f"{ELAN_INSTALL}  (elan provides {tool})"
        checks.append(
            Check(name=tool, ok=bool(path), found=f"{path} ({ver})" if path else "", fix=fix)
        )
    try:
        project = find_project(configured)
    except LeanNotFoundError as e:
        checks.append(Check(name="Lean project", ok=False, found=str(e), fix=setup))
        return checks
    if project is None:
        checks.append(
            Check(
                name="Lean project",
                ok=False,
                fix=f"{setup}{own}",
            )
        )
        return checks
    checks.append(Check(name="Lean project", ok=True, found=str(project)))
    tc_file = project / "lean-toolchain"
    have_tc = tc_file.read_text(encoding="utf-8").strip() if tc_file.is_file() else ""
    tc_ok = bool(have_tc) and (toolchain is None or have_tc == toolchain)
    checks.append(
        Check(
            name="toolchain",
            ok=tc_ok,
            found=have_tc or "no lean-toolchain file",
            fix="" if tc_ok else f"{setup}   (the taskset wants {toolchain})",
        )
    )
    mathlib = project / ".lake" / "packages" / "mathlib"
    manifest = project / "lake-manifest.json"
    rev = _manifest_rev(manifest, "mathlib")
    if mathlib_rev is None:
        checks.append(Check(name="Mathlib", ok=True, found=f"{rev or 'not required'}"))
    else:
        built = (mathlib / ".lake" / "build" / "lib").is_dir() or (
            mathlib / ".lake" / "build" / "lib" / "lean"
        ).is_dir()
        ok = rev == mathlib_rev and built
        checks.append(
            Check(
                name="Mathlib",
                ok=ok,
                found=f"rev {rev or '?'}" + ("" if built else " (not built)"),
                fix="" if ok else f"{setup}   (needs rev {mathlib_rev}, then `lake exe cache get`)",
            )
        )
    repl = find_repl(project)
    checks.append(
        Check(
            name="REPL",
            ok=repl is not None,
            found=str(repl) if repl else "",
            fix="" if repl else f"{setup}   (or use --env.runtime.mode oneshot)",
        )
    )
    if repl is not None and smoke:
        checks.append(smoke_test(project))
    return checks


FORGED_PREAMBLE = """set_option debug.skipKernelTC true in
#eval show Lean.Elab.Command.CommandElabM Unit from Lean.Elab.Command.liftCoreM <|
  Lean.addDecl <| .thmDecl { name := `leanrl_doctor_forged, levelParams := [],
    type := Lean.mkConst ``False, value := Lean.mkConst ``True.intro }"""
"""A forgery for :func:`smoke_test`: code run during elaboration adds ``False`` as a theorem
without the kernel. Only the clean checker's kernel replay can catch it."""


FORGE_TACTIC = """open Lean Elab Tactic in
elab "leanrl_forge" : tactic => do
  (← getMainGoal).assign (mkConst ``True.intro)
set_option debug.skipKernelTC true in"""
"""A forgery of the *target* for :func:`smoke_test`: a tactic, defined by the attempt, closes
the goal with ``True.intro`` whatever the goal says, and the theorem that follows is added
without the kernel. The attempt's constant for the target then has a body that proves nothing
and uses no axiom: only a judge that gives the kernel the attempt's own body, against the
reference statement, can catch it (issue 19: the judge once re-checked the reference's body)."""


def smoke_test(project: Path, timeout: float = 600.0) -> Check:
    """Check four attempts end to end through a real REPL pool (elaborating process, trusted
    checker process, kernel replay): a valid proof must be accepted; a forgery that adds a false
    helper theorem without the kernel, a forged target (a false theorem added without the
    kernel under the target's own name, :data:`FORGE_TACTIC`) and a proof from a new axiom must
    be rejected. The pre-scan is off for the cheats, so the trusted checker itself has to catch
    them."""
    import asyncio

    from leanrl.lean.pool import PoolConfig, ReplPool
    from leanrl.verdict import Attempt, Reason, VerificationPolicy

    async def go() -> Check:
        cmd, cwd = repl_command(project)
        cmd, env = resolve_lake_env(cmd, cwd)
        pool = ReplPool(
            PoolConfig(
                command=cmd, cwd=cwd, env=env, workers=1, spares=0, startup_timeout_s=timeout
            )
        )
        stmt = "theorem leanrl_doctor (a b : Nat) (h : a = b) : b = a := by"
        good = Attempt(name="leanrl_doctor", header="", formal_statement=stmt, proof="exact h.symm")
        unscanned = VerificationPolicy(forbid_tokens=False)
        forged = good.model_copy(
            update={
                "preamble": FORGED_PREAMBLE,
                "proof": "exact leanrl_doctor_forged.elim",
                "policy": unscanned,
            }
        )
        axiom = good.model_copy(
            update={
                "preamble": "axiom cheat : False",
                "proof": "exact cheat.elim",
                "policy": unscanned,
            }
        )
        # A false target (`a = b` for any a b), forged under its own name.
        target = good.model_copy(
            update={
                "formal_statement": "theorem leanrl_doctor (a b : Nat) : a = b := by",
                "preamble": FORGE_TACTIC,
                "proof": "leanrl_forge",
                "policy": unscanned,
            }
        )
        try:
            v_good, v_forged, v_target, v_axiom = await pool.check([good, forged, target, axiom])
        finally:
            await pool.close()
        ok = (
            v_good.accepted
            and not v_forged.accepted
            and not v_target.accepted
            and v_axiom.reason is Reason.AXIOM
        )
        found = (
            f"valid proof: {v_good.reason.value}; forged helper: {v_forged.reason.value}; "
            f"forged target: {v_target.reason.value}; axiom cheat: {v_axiom.reason.value}"
        )
        for what, v in (("helper", v_forged), ("target", v_target)):
            if v.reason is not Reason.FORBIDDEN:
                found += f" (the forged {what} did not reach the kernel replay: {v.detail[:200]})"
        if not ok:
            found += f" ({v_good.detail or v_forged.detail or v_target.detail or v_axiom.detail})"
        return Check(
            name="checker",
            ok=ok,
            found=found,
            fix="" if ok else "report this with `leanrl doctor` output and your Lean version",
        )

    return asyncio.run(go())


def _manifest_rev(manifest: Path, name: str) -> str | None:
    import json

    if not manifest.is_file():
        return None
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except ValueError:
        return None
    for pkg in data.get("packages", []):
        if str(pkg.get("name", "")).lower() == name:
            return pkg.get("rev")
    return None


# -- setup -------------------------------------------------------------------------------------


def online(host: str = "github.com", port: int = 443, timeout: float = 3.0) -> bool:
    """Whether ``host`` is reachable (a TCP connect; no data is sent)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def lakefile(mathlib_rev: str | None, mathlib_repo: str, toolchain: str) -> str:
    """The ``lakefile.lean`` of a leanrl project."""
    lines = ["import Lake", "open Lake DSL", "", "package leanrl_project", ""]
    if mathlib_rev:
        lines.append(f'require mathlib from git "{mathlib_repo}" @ "{mathlib_rev}"')
    lines.append(f'require REPL from git "{REPL_REPO}" @ "{repl_tag(toolchain)}"')
    return "\n".join(lines) + "\n"


def setup_project(
    toolchain: str,
    mathlib_rev: str | None,
    mathlib_repo: str = "https://github.com/leanprover-community/mathlib4",
    dest: Path | None = None,
    log: Callable[[str], None] = print,
    is_online: Callable[[], bool] = online,
    install: bool = False,
    fetch: Callable[[str], bytes] | None = None,
) -> Path:
    """Create (or reuse) a project with this toolchain and Mathlib, build the REPL, and make it
    the default. With ``install``, a missing elan is installed first (needs the internet).
    Fails fast, with the fix, when tools or the network are missing."""
    if which("elan") is None:
        if not install:
            raise _tool_missing("elan")
        if not is_online():
            raise LeanNotFoundError(
                "elan (the Lean toolchain manager) is missing and the internet is unreachable, "
                f"so it cannot be installed. On a connected machine: {ELAN_INSTALL}; or point "
                f"LEANRL_LEAN_PROJECT at an existing Lean project. {_OFFLINE_MODEL}"
            )
        install_elan(log, fetch)
    if which("lake") is None:
        raise _tool_missing("lake")
    dest = dest or project_dir(toolchain, mathlib_rev)
    if find_repl(dest) is not None and (dest / "lean-toolchain").is_file():
        log(f"reusing {dest}")
        _make_default(dest)
        return dest
    if not is_online():
        raise LeanNotFoundError(
            "leanrl setup needs the internet (github.com is unreachable): it downloads the "
            f"Lean toolchain {toolchain}, Mathlib and the REPL. Run it on a connected machine, "
            f"or point LEANRL_LEAN_PROJECT at an existing project. {_OFFLINE_MODEL}"
        )
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "lean-toolchain").write_text(toolchain + "\n", encoding="utf-8")
    (dest / "lakefile.lean").write_text(
        lakefile(mathlib_rev, mathlib_repo, toolchain), encoding="utf-8"
    )
    steps = [["elan", "toolchain", "install", toolchain], ["lake", "update"]]
    if mathlib_rev:
        steps.append(["lake", "exe", "cache", "get"])
    steps.append(["lake", "build", "repl"])
    for argv in steps:
        log("$ " + " ".join(argv))
        res = subprocess.run(argv, cwd=dest, check=False)
        if res.returncode != 0:
            raise LeanNotFoundError(
                f"`{' '.join(argv)}` failed in {dest} (exit {res.returncode}); see its output "
                "above. Fix the cause and re-run `leanrl setup` (finished steps are reused)"
            )
    if find_repl(dest) is None:
        raise LeanNotFoundError(f"the REPL was built but its executable is not found under {dest}")
    _make_default(dest)
    return dest


def _make_default(project: Path) -> None:
    pointer = cache_root() / "default-project"
    pointer.parent.mkdir(parents=True, exist_ok=True)
    pointer.write_text(str(project) + "\n", encoding="utf-8")
