"""Distillation runs killed with SIGKILL mid-run resume without loss or duplicates (issue 40):
the same command rerun ends where an uninterrupted run ends, on-policy (GRPO with a teacher)
and sequence-level (`leanrl train distill`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from leanrl.proofs import read_proofs
from leanrl.train.common import RunDir
from tests.conftest import tiny_model_texts
from tests.test_distill_sequence import RT, TOY, omega_teacher  # noqa: F401 - the fixture

HERE = Path(__file__).resolve().parent

pytestmark = pytest.mark.slow  # real `leanrl` processes killed and rerun, 8-10 s each


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def _kill_when(argv: list[str], ready: Path) -> None:
    """Run ``argv`` and SIGKILL it once ``ready`` exists (it must still be running then)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), *sys.path]))
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while proc.poll() is None and not ready.exists():
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from leanrl.testing import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("teacher"), tiny_model_texts(), seed=1)


def test_on_policy_distillation_killed_resumes_exactly(
    tiny_model_dir: Path, teacher: Path, tmp_path: Path
) -> None:
    cfg = tmp_path / "opd.toml"
    cfg.write_text(
        'env = { id = "tests.test_grpo_trainer:DigitEnv", harness = { options = { delay_s = 0.2 '
        "} } }\nsteps = 6\ntasks_per_step = 2\ngroup_size = 2\nsave_every = 2\n"
        "keep_checkpoints = 8\nlr = 1e-3\nmask_truncated = false\n[sampling]\nmax_tokens = 8\n"
        f'top_p = 1.0\n[distill]\nteacher = "{teacher}"\ncoef = 0.5\n'
    )
    out = tmp_path / "killed"
    argv = [sys.executable, "-m", "leanrl.cli", "train", "grpo", "--config", str(cfg)]
    argv += ["--model", str(tiny_model_dir), "--out", str(out)]
    _kill_when(argv, out / "checkpoint-2" / "trainer_state.json")
    assert 2 <= len(RunDir(out).metrics()) < 6

    from leanrl.cli import main

    assert main(argv[3:]) == 0  # the same command
    rows = RunDir(out).metrics()
    assert [r["step"] for r in rows] == list(range(1, 7))  # none lost, none twice
    straight = tmp_path / "straight"
    assert main([*argv[3:-1], str(straight)]) == 0
    want = RunDir(straight).metrics()
    for key in ("reward_mean", "distill/reverse_kl", "loss"):
        assert [r[key] for r in rows] == [r[key] for r in want], key
    wa, wb = _weights(straight / "checkpoint-6"), _weights(out / "checkpoint-6")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_sequence_distillation_killed_resumes_without_loss_or_duplicates(
    tiny_model_dir: Path,
    omega_teacher: Path,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    cfg = tmp_path / "seq.toml"
    cfg.write_text(
        f'teacher = "{omega_teacher}"\nrounds = 2\nsamples = 2\nchunk_tasks = 2\n'
        "unsolved_only = false\n"
        f'[env]\nid = "dataset"\ntaskset = {{ path = "{TOY}", split = "train" }}\n'
        f'runtime = {{ name = "{RT}", options = {{ accept = "omega", delay_s = 0.15 }} }}\n'
        "[sampling]\ntemperature = 1.0\nmax_tokens = 8\nseed = 0\n"
        "[sft]\nepochs = 2\nbatch_size = 2\nmicro_batch_size = 2\nlr = 1e-3\n"
    )
    out = tmp_path / "killed"
    argv = [sys.executable, "-m", "leanrl.cli", "train", "distill", "--config", str(cfg)]
    argv += ["--student", str(tiny_model_dir), "--out", str(out)]
    # mid-way through round 2's sampling: round 1 done, round 2's first chunk checked
    _kill_when(argv, out / "round-2" / "sample" / "results.jsonl")

    from leanrl.cli import main

    assert main(argv[3:]) == 0
    rows = RunDir(out).metrics()
    assert [r["step"] for r in rows] == [1, 2]
    straight = tmp_path / "straight"
    assert main([*argv[3:-1], str(straight)]) == 0
    want = RunDir(straight).metrics()
    for key in ("tasks_sampled", "new_proofs", "solved_total", "sft_pairs", "sft_loss_last"):
        assert [r[key] for r in rows] == [r[key] for r in want], key
    kept = read_proofs(out / "proofs.jsonl")
    assert len({(p.task_id, p.digest) for p in kept}) == len(kept)  # no proof twice
    assert sorted(p.digest for p in kept) == sorted(
        p.digest for p in read_proofs(straight / "proofs.jsonl")
    )
    wa, wb = _weights(straight / "checkpoint-2"), _weights(out / "checkpoint-2")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert json.loads((out / "config.json").read_text())["revisions"]
