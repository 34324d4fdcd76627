"""Launches that go wrong, on the local backend (containers are processes, the Volume a folder):
the launching CLI killed (its orchestrator and members die with it; a rerun resumes), an
orchestrator's ConfigError (one line on the CLI), a stale copy of a run on a second machine
(replaced by the Volume's newer one, never pushed over it), secrets (they reach the launched
containers intact and never the Volume's files)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from test_es_learning import TOY_ENV, ToyEnv

from leanrl.errors import ConfigError
from leanrl.launch.volume import FolderVolume, RunMirror
from leanrl.runtime import Runtime
from leanrl.train.es.history import ESHistory, HistoryMeta, HistoryRecord

TESTS = Path(__file__).resolve().parent
SECRET = "s3cret-TOKEN-value"


def _wait_for(
    what: str, ok: Any, deadline_s: float, cli: Any = None, log: Path | None = None
) -> None:
    """Poll ``ok()`` until it is true (a generous deadline: a stuck run, not a slow one, fails).
    ``cli``: a process whose exit ends the wait (its stderr in ``log``)."""
    end = time.monotonic() + deadline_s
    while not ok():
        if cli is not None and cli.poll() is not None:
            err = log.read_text()[-3000:] if log is not None else ""
            pytest.fail(f"the CLI exited ({cli.returncode}) before {what}:\n{err}")
        if time.monotonic() > end:
            pytest.fail(f"no {what} within {deadline_s:.0f} s")
        time.sleep(0.2)


def _cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1")
    return env


def _es_cli(model: Path, volume: Path, out: str, steps: int) -> list[str]:
    # one member container: each is a process that imports torch, and one shows the members
    env = {"id": TOY_ENV, "harness": {"name": "es-target", "options": {"mode": "logprob"}}}
    return [
        sys.executable, "-m", "leanrl.cli", "train", "es", "--env", json.dumps(env),
        "--policy.model", str(model), "--policy.device", "cpu", "--policy.batch-size", "8",
        "--sampling.max-tokens", "3", "--out", out, "--steps", str(steps),
        "--tasks-per-step", "2", "--population", "4", "--sigma", "0.02", "--alpha", "0.02",
        "--save-every", "1000", "--launcher.name", "modal", "--launcher.modal.backend", "local",
        "--launcher.modal.local-volume", str(volume), "--launcher.modal.member-containers", "1",
    ]  # fmt: skip


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def _records(path: Path) -> int:
    h = ESHistory(path)
    h.open(read_only=True)
    return len(h)


# -- the launcher killed ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_killed_cli_takes_its_orchestrator_and_members_along_and_a_rerun_resumes(
    toy_model_dir: Path, tmp_path: Path
) -> None:
    """It left the orchestrator container training on (an orphan that a rerun would race)."""
    vol = tmp_path / "vol"
    run = vol / "runs/es"
    log = tmp_path / "cli.log"
    # output to a file, not a pipe: an orphan holding the pipe would block reading it
    with log.open("w") as out:
        cli = subprocess.Popen(
            _es_cli(toy_model_dir, vol, "runs/es", steps=1000),
            cwd=tmp_path, env=_cli_env(), stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    me = psutil.Process(cli.pid)
    tree: list[psutil.Process] = []
    try:

        def training() -> bool:  # an iteration is on the Volume and members are up
            metrics = run / "metrics.jsonl"
            if not metrics.is_file() or metrics.read_text().count("\n") < 1:
                return False
            tree[:] = me.children(recursive=True)
            return any(p.ppid() != cli.pid for p in _alive(tree))  # grandchildren: members

        _wait_for("ES iteration on the Volume", training, 400, cli, log)
        cli.send_signal(signal.SIGKILL)
        cli.wait()
        _wait_for("exit of every process the CLI started", lambda: not _alive(tree), 120)
    finally:
        for p in _alive(tree):  # an orphan must not outlive the test either
            p.kill()
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    # the rerun resumes where the Volume's history ends: nothing lost, nothing counted twice
    done = _records(run / "es_history.bin")
    assert done >= 1
    again = subprocess.run(
        _es_cli(toy_model_dir, vol, "runs/es", steps=done + 1),
        cwd=tmp_path, env=_cli_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert _records(run / "es_history.bin") == done + 1
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, done + 2))


# -- an orchestrator's ConfigError --------------------------------------------------------------


@pytest.mark.slow
def test_a_config_error_in_the_orchestrator_is_one_line_on_the_cli(
    toy_model_dir: Path, tmp_path: Path
) -> None:
    """It was printed as the orchestrator container's traceback."""
    vol = tmp_path / "vol"
    (vol / "runs/bad").mkdir(parents=True)
    (vol / "runs/bad/config.json").write_text("{not json")  # found by the orchestrator
    r = subprocess.run(
        _es_cli(toy_model_dir, vol, "runs/bad", steps=1),
        cwd=tmp_path, env=_cli_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    errors = [line for line in r.stderr.splitlines() if line.startswith("leanrl: error:")]
    assert r.returncode == 2, r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert len(errors) == 1 and "config.json is damaged" in errors[0], r.stderr[-3000:]


# -- a stale copy on a second machine -----------------------------------------------------------


def _run_folder(path: Path, iterations: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text('{"steps": 100}')
    h = ESHistory(path / "es_history.bin")
    h.open(HistoryMeta(run_seed=0, device_type="cuda", dtype="float32"))
    for i in range(1, iterations + 1):
        h.append(HistoryRecord(i, (), skipped=True))
    rows = "".join(json.dumps({"step": i}) + "\n" for i in range(1, iterations + 1))
    (path / "metrics.jsonl").write_text(rows)


def test_a_stale_local_copy_is_replaced_by_the_newer_volume_copy(tmp_path: Path) -> None:
    """pull() did nothing when a config.json was here, so 8 local iterations replaced 20."""
    vol = FolderVolume(tmp_path / "vol")
    _run_folder(tmp_path / "vol/runs/r", 20)  # continued elsewhere
    here = tmp_path / "here/run"
    _run_folder(here, 8)  # this machine's copy, from before
    mirror = RunMirror(vol, here, "runs/r")
    assert mirror.pull() >= 3
    assert _records(here / "es_history.bin") == 20
    assert len((here / "metrics.jsonl").read_text().splitlines()) == 20
    assert mirror.pull() == 0  # as far along now: nothing to fetch
    assert mirror.push() >= 1  # and pushing the same progress back is allowed
    # a copy further along than the Volume's is kept, and brings the Volume up
    ahead = tmp_path / "ahead/run"
    _run_folder(ahead, 21)
    assert RunMirror(vol, ahead, "runs/r").pull() == 0
    assert RunMirror(vol, ahead, "runs/r").push() == 3
    assert _records(tmp_path / "vol/runs/r/es_history.bin") == 21


def test_an_older_history_is_never_pushed_over_a_newer_one(tmp_path: Path) -> None:
    vol = FolderVolume(tmp_path / "vol")
    _run_folder(tmp_path / "vol/runs/r", 20)
    before = (tmp_path / "vol/runs/r/es_history.bin").read_bytes()
    here = tmp_path / "here/run"
    _run_folder(here, 8)
    with pytest.raises(ConfigError, match=r"at iteration 20 .*rerun the same command") as e:
        RunMirror(vol, here, "runs/r").push()
    assert "\n" not in str(e.value)
    assert (tmp_path / "vol/runs/r/es_history.bin").read_bytes() == before
    assert len((tmp_path / "vol/runs/r/metrics.jsonl").read_text().splitlines()) == 20


# -- secrets ------------------------------------------------------------------------------------


class SecretToyEnv(ToyEnv):
    """The toy environment, noting in its working folder (the Volume, in a container) whether
    its runtime settings hold the docker env's TOKEN intact (never the value itself)."""

    def make_runtime(self) -> Runtime:
        got = self.config.runtime.docker.env.get("TOKEN")
        note = Path(f"secret-seen-{os.getpid()}.txt")
        note.write_text("intact" if got == SECRET else "wrong")
        return super().make_runtime()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_secrets_reach_launched_containers_intact_and_no_volume_file_holds_them(
    toy_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job's config was rebuilt from a redacting JSON dump: its members got "<redacted>"."""
    from test_launch import _es_config, _launcher

    from leanrl.launch.launcher import job_call, launch

    monkeypatch.chdir(tmp_path)
    cfg = _es_config(
        toy_model_dir, "runs/es", steps=1, population=2,
        launcher=_launcher(tmp_path, orchestrator="function", member_containers=1),
    )  # fmt: skip
    env = cfg.env.model_copy(
        update={
            "id": "test_launch_faults:SecretToyEnv",
            "runtime": cfg.env.runtime.model_copy(
                update={
                    "docker": cfg.env.runtime.docker.model_copy(update={"env": {"TOKEN": SECRET}})
                }
            ),
        }
    )
    cfg = cfg.model_copy(update={"env": env})
    payload = job_call("es", cfg).config
    assert payload["env"]["runtime"]["docker"]["env"] == {"TOKEN": SECRET}
    assert launch("es", cfg)["iterations"] == 1
    vol = tmp_path / "vol"
    notes = [p.read_text() for p in vol.glob("secret-seen-*.txt")]
    assert notes and set(notes) == {"intact"}, notes
    saved = json.loads((vol / "runs/es/config.json").read_text())
    assert saved["env"]["runtime"]["docker"]["env"] == {"TOKEN": "<redacted>"}
    for p in vol.rglob("*"):
        if p.is_file():
            assert SECRET.encode() not in p.read_bytes(), p


# -- the same on Modal: a Function's ConfigError is raised as it is ------------------------------


def test_a_config_error_of_a_modal_function_is_raised_as_it_is() -> None:
    """It was wrapped in a FunctionError, printed with Modal's remote traceback."""
    from leanrl.launch.config import ModalLaunchConfig
    from leanrl.launch.local_functions import FunctionError
    from leanrl.launch.modal_app import ModalFunctions

    class Remote:  # what modal re-raises: the Function's own exception
        def __init__(self, error: Exception) -> None:
            self.error = error

        async def aio(self, payload: Any) -> None:
            raise self.error

    fns = ModalFunctions(ModalLaunchConfig())
    fns._fns["orchestrate"] = type("F", (), {"remote": Remote(ConfigError("bad --out"))})()
    with pytest.raises(ConfigError, match=r"^bad --out$"):
        asyncio.run(fns.call("orchestrate", {}))
    fns._fns["evaluate"] = type("F", (), {"remote": Remote(KeyError("bug"))})()
    with pytest.raises(FunctionError, match="evaluate failed on Modal: KeyError"):
        asyncio.run(fns.call("evaluate", {}))
