"""Pruning old checkpoints never deletes the one a running run still reads.

A launched ES run resumed from ``checkpoint-N`` rebuilds its weights from that checkpoint plus
the history every time a function builds a checkpoint (or a container starts a member's
engine). Pruning used to delete ``checkpoint-N`` once ``keep_checkpoints`` newer ones existed,
and the next checkpoint then crashed. The run now records the checkpoint it reads
(``in_use.json``), and every save, in any process, keeps it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_launch import _es_config, _launcher

from leanrl.train.common import IN_USE_FILE, RunDir

pytestmark = pytest.mark.slow  # launched ES, its functions in processes


@pytest.mark.timeout(900)  # two launches, each starting its function processes
def test_a_resumed_launched_es_run_keeps_the_checkpoint_it_started_from(
    toy_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from leanrl.launch.launcher import launch
    from leanrl.train.es import ESTrainer
    from leanrl.train.es.history import replay
    from leanrl.train.es.policy import load_model
    from leanrl.train.es.weights import ESWeights

    monkeypatch.chdir(tmp_path)
    # the run folder is on the Volume; one member container starts a member's engine (which
    # rebuilds θ from the start checkpoint) as well as two would
    launcher = _launcher(tmp_path, orchestrator="function", member_containers=1)

    def cfg(steps: int) -> object:
        kw = {"steps": steps, "save_every": 1, "keep_checkpoints": 1, "launcher": launcher}
        return _es_config(toy_model_dir, "runs/es", **kw)

    assert launch("es", cfg(2))["iterations"] == 2
    vol = RunDir(tmp_path / "vol" / "runs/es")
    assert [s for s, _ in vol.checkpoints()] == [2]
    # resumed from checkpoint-2; checkpoint-3 is the newest one kept, and checkpoint-4 is built
    # from checkpoint-2 + the history: it crashed here when pruning had deleted checkpoint-2
    assert launch("es", cfg(4))["iterations"] == 4
    assert [s for s, _ in vol.checkpoints()] == [2, 4]
    assert json.loads((vol.path / IN_USE_FILE).read_text())["checkpoint"] == "checkpoint-2"

    # the weights are the run's, as if it had never stopped
    local = ESTrainer(_es_config(toy_model_dir, tmp_path / "local", steps=4, save_every=100))
    local.train_sync()
    _, _, w = replay(tmp_path / "local")
    m4, _ = load_model(str(vol.path / "checkpoint-4"), "float32", "cpu")
    assert w.equal(ESWeights.from_model(m4).master)


def test_the_kept_start_checkpoint_is_pruned_once_a_later_run_no_longer_reads_it(
    toy_model_dir: Path, tmp_path: Path
) -> None:
    """Worker processes rebuild θ from the start checkpoint too (the same keeping, in one
    process here). Each start records what it reads, so the checkpoint an earlier run started
    from is pruned like any other later; the in-process scorer, which holds θ itself, keeps
    nothing extra."""
    from leanrl.train.es import ESTrainer

    def train(out: Path, steps: int, **kw: object) -> RunDir:
        tr = ESTrainer(
            _es_config(toy_model_dir, out, steps=steps, save_every=1, keep_checkpoints=1, **kw)
        )
        tr.train_sync()
        return tr.run

    workers = {"scorer": {"backend": "processes", "workers": 1}}
    out = tmp_path / "es"
    run = train(out, 2, **workers)
    assert [s for s, _ in run.checkpoints()] == [2] and not (out / IN_USE_FILE).exists()
    assert [s for s, _ in train(out, 4, **workers).checkpoints()] == [2, 4]  # started from 2
    assert [s for s, _ in train(out, 5, **workers).checkpoints()] == [4, 5]  # from 4: 2 goes
    assert run.pinned() == {"checkpoint-4"}

    here = tmp_path / "inprocess"
    train(here, 2)
    assert [s for s, _ in train(here, 4).checkpoints()] == [4] and not RunDir(here).pinned()
