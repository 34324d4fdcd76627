"""One run per folder: a second GRPO, ES or compare run on a folder another process is running
in is refused with one line, the first carries on unharmed, and a run killed with SIGKILL leaves
the folder free (the kernel drops an flock with its process).

The first run is a real trainer in a child process; it pauses (waits for a file) right after
its first metrics row, so the second one certainly meets it mid-run. The second runs here.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from leanrl.errors import ConfigError
from leanrl.runlock import LOCK_FILE, FolderLock
from leanrl.train.common import RunDir

pytestmark = pytest.mark.slow  # trainers in child processes

TESTS = Path(__file__).resolve().parent

# The first run: a real trainer that pauses after its first metrics row until GO exists.
_HOLDER = """
import pathlib, sys, time
sys.path.insert(0, {tests!r})
kind, model, out, mark, go = sys.argv[1:]
from leanrl.train import common

_log = common.MetricsLogger.log

def log(self, row):
    _log(self, row)
    if not pathlib.Path(mark).exists():
        pathlib.Path(mark).write_text("paused")
        while not pathlib.Path(go).exists():
            time.sleep(0.05)

common.MetricsLogger.log = log
if kind == "grpo":
    from test_run_locks import grpo_run
    grpo_run(pathlib.Path(model), pathlib.Path(out))
elif kind == "es":
    from test_run_locks import es_run
    es_run(pathlib.Path(model), pathlib.Path(out))
else:
    from test_run_locks import compare_run
    compare_run(pathlib.Path(model), pathlib.Path(out))
"""


def grpo_run(model: Path, out: Path) -> None:
    from test_grpo_trainer import DigitEnv, _config

    from leanrl.train.grpo import GRPOTrainer

    cfg = _config(model, out, steps=3, save_every=1, tasks_per_step=2)
    GRPOTrainer(cfg, env=DigitEnv()).train_sync()


def es_run(model: Path, out: Path) -> None:
    from test_es_learning import toy_config

    from leanrl.train.es import ESTrainer

    ESTrainer(toy_config(model, out, steps=3, save_every=1)).train_sync()


def compare_run(model: Path, out: Path) -> None:
    from test_compare import _config

    from leanrl.compare import run_compare

    run_compare(_config(model, out))


class Holder:
    """The first run, in a child process, paused after its first metrics row."""

    def __init__(self, kind: str, model: Path, out: Path, tmp: Path) -> None:
        self.mark, self.go = tmp / f"{kind}.paused", tmp / f"{kind}.go"
        args = [kind, str(model), str(out), str(self.mark), str(self.go)]
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HOLDER.format(tests=str(TESTS)), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def wait_paused(self) -> None:
        """Until the run has written its first row and holds the folder (or died: its output)."""
        deadline = time.monotonic() + 600  # a generous bound on a loaded 2-core machine
        while not self.mark.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                out = self.proc.communicate()[0] if self.proc.poll() is not None else ""
                self.kill()
                pytest.fail(f"the first run never paused (rc {self.proc.returncode}):\n{out}")
            time.sleep(0.05)

    def finish(self) -> str:
        self.go.write_text("go")
        out = self.proc.communicate(timeout=600)[0]
        assert self.proc.returncode == 0, out
        return out

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    started: list[Holder] = []
    yield started
    for h in started:  # a failed test leaves no paused child behind
        h.kill()


def _snapshot(folder: Path) -> dict[str, bytes]:
    """Every file of the run folder but the lock (what a refused run must not touch)."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != LOCK_FILE
    }


def _refused(e: pytest.ExceptionInfo[ConfigError], kind: str, folder: Path, pid: int) -> None:
    msg = str(e.value)
    assert "\n" not in msg
    assert msg == (
        f"another {kind} is running in {folder} (it holds {folder / LOCK_FILE}; process {pid}). "
        "Wait for it to finish, or give this one another --out."
    )


def _steps(folder: Path) -> list[int]:
    return [json.loads(x)["step"] for x in (folder / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.timeout(900)  # real trainers in two processes on 2 cores
def test_a_second_grpo_run_on_a_running_folder_is_refused(
    tiny_model_dir: Path, tmp_path: Path, holders: list[Holder]
) -> None:
    out = tmp_path / "run"
    first = Holder("grpo", tiny_model_dir, out, tmp_path)
    holders.append(first)
    first.wait_paused()
    before = _snapshot(out)
    with pytest.raises(ConfigError) as e:
        grpo_run(tiny_model_dir, out)  # the same command: without the lock it would "resume"
    _refused(e, "GRPO run", out, first.proc.pid)
    assert _snapshot(out) == before  # refused before it wrote anything
    first.finish()
    assert _steps(out) == [1, 2, 3]  # every step once: none duplicated by a second run
    assert [s for s, _ in RunDir(out).checkpoints()] == [1, 2, 3]
    grpo_run(tiny_model_dir, out)  # free again once it is done (a finished run: nothing to do)
    assert _steps(out) == [1, 2, 3]


@pytest.mark.timeout(900)  # real trainers in two processes on 2 cores
def test_a_second_es_run_is_refused_and_a_killed_one_leaves_the_folder_free(
    tiny_model_dir: Path, tmp_path: Path, holders: list[Holder]
) -> None:
    from leanrl.train.es.history import ESHistory

    out = tmp_path / "es"
    first = Holder("es", tiny_model_dir, out, tmp_path)
    holders.append(first)
    first.wait_paused()
    before = _snapshot(out)
    with pytest.raises(ConfigError) as e:
        es_run(tiny_model_dir, out)
    _refused(e, "ES run", out, first.proc.pid)
    assert _snapshot(out) == before  # es_history.bin above all: two writers corrupt it
    first.kill()  # SIGKILL, mid-run, while it holds the lock

    es_run(tiny_model_dir, out)  # not refused: the kill released the lock; it resumes
    history = ESHistory(out / "es_history.bin")
    history.open(read_only=True)
    assert len(history.records) == 3 and _steps(out) == [1, 2, 3]


@pytest.mark.timeout(900)  # real trainers in two processes on 2 cores
def test_a_second_compare_is_refused_and_its_runs_lock_their_own_folders(
    tmp_path: Path, holders: list[Holder]
) -> None:
    from test_countdown import make_countdown_model

    model = make_countdown_model(tmp_path / "model")
    out = tmp_path / "cmp"
    first = Holder("compare", model, out, tmp_path)
    holders.append(first)
    first.wait_paused()  # inside its first run (ES, seed 0): it holds OUT/.lock and that run's
    with pytest.raises(ConfigError) as e:
        compare_run(model, out)
    _refused(e, "compare", out, first.proc.pid)
    with pytest.raises(ConfigError) as e:  # the run's own folder is locked, by the same process
        es_run(model, out / "es-seed0")
    _refused(e, "ES run", out / "es-seed0", first.proc.pid)
    first.finish()
    assert (out / "report.md").is_file()
    compare_run(model, out)  # free again: the rerun resumes every (finished) run


def test_runs_in_one_process_share_the_lock_and_release_it(tmp_path: Path) -> None:
    """A trainer that failed to start is retried in the same process (notebook, script): the
    lock is shared within the process and goes with its last holder."""
    a, b = RunDir(tmp_path), RunDir(tmp_path)
    a.lock("GRPO run")
    b.lock("GRPO run")  # not refused: the same process
    a.unlock()
    other = FolderLock(tmp_path, "eval")  # not re-entrant: as another process would see it
    with pytest.raises(ConfigError, match="another GRPO run is running"):
        other.acquire()
    b.unlock()
    other.acquire()  # the last holder let it go
    other.release()
    c = RunDir(tmp_path)
    c.lock("ES run")
    del c  # a RunDir that goes lets its lock go (a start that failed and was dropped)
    with FolderLock(tmp_path, "eval") as again:
        assert again.held
