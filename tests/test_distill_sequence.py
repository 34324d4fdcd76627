"""Sequence-level distillation (issue 40): a teacher samples, the checker keeps what is right, the
student is fine-tuned on it; one expert per environment; decontamination; the teacher's
revision in the run config.

The checker is the scripted TEST runtime (``tests/_scripted_runtime.py``: a proof is accepted
iff it contains ``omega``), not Lean. The teacher is the toy model after a short SFT on
``omega`` proofs of other theorems, so it solves many toy tasks; the student is the tiny model,
whose tokenizer is another (sequence-level distillation lays the proofs out again as text).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from leanrl import Task
from leanrl.errors import ConfigError
from leanrl.policy import PolicyConfig, SamplingConfig
from leanrl.proofs import read_proofs

TOY = Path(__file__).parent / "fixtures" / "toy_tasks.jsonl"
RT = "tests._scripted_runtime:ScriptedRuntime"

pytestmark = pytest.mark.slow  # the teacher's SFT (4 s), then an eval and an SFT per test


@pytest.fixture(scope="module")
def omega_teacher(toy_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The toy model after 40 SFT steps on `omega` proofs of twelve other theorems."""
    from leanrl.train.sft import SFTConfig, SFTTrainer
    from leanrl.train.sft.data import Pair

    pairs = [
        Pair(Task(name=f"warm_{i}", header="",
                  formal_statement=f"theorem warm_{i} (m : Nat) : m * {i} = {i} * m := by"),
             "\n  omega")
        for i in range(12)
    ]  # fmt: skip
    cfg = SFTConfig(
        policy=PolicyConfig(model=str(toy_model_dir)),
        out=tmp_path_factory.mktemp("omega-teacher") / "run",
        epochs=None,
        steps=40,
        batch_size=4,
        micro_batch_size=4,
        lr=3e-3,
        save_every=1000,
    )
    trainer = SFTTrainer(cfg, pairs=pairs)
    trainer.train_sync()
    return cfg.out  # a run folder: the teacher is its newest checkpoint


def _env(names: list[str] | None = None, **taskset: Any) -> dict[str, Any]:
    ts: dict[str, Any] = {"path": str(TOY), "split": "train", **taskset}
    if names is not None:
        ts["names"] = names
    return {"id": "dataset", "taskset": ts, "runtime": {"name": RT, "options": {"accept": "omega"}}}


def _config(student: Path, out: Path, **kw: Any) -> Any:
    from leanrl.train.distill.run import DistillRunConfig

    base: dict[str, Any] = dict(
        policy=PolicyConfig(model=str(student)),
        out=out,
        samples=2,
        sampling=SamplingConfig(temperature=1.0, max_tokens=8, seed=0),
        sft={"epochs": 2, "batch_size": 2, "micro_batch_size": 2, "lr": 1e-3},
    )
    base.update(kw)
    return DistillRunConfig(**base)


def _weights(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_the_teachers_verified_proofs_train_the_student(
    tiny_model_dir: Path, omega_teacher: Path, tmp_path: Path
) -> None:
    """The teacher (another tokenizer) samples; its verified proofs are kept and the student
    is fine-tuned on them (its own tokenizer in the published checkpoint). The student alone
    finds no proof of these tasks: what it trains on comes from the teacher."""
    import torch

    from leanrl.train.distill.run import train_distill

    out = tmp_path / "run"
    _, rows = train_distill(_config(tiny_model_dir, out, env=_env(), teacher=str(omega_teacher)))
    [row] = rows
    assert row["new_proofs"] > 0 and row["sft_pairs"] > 0 and row["sft_steps"] > 0, row
    kept = read_proofs(out / "proofs.jsonl")
    assert kept and all("omega" in p.proof for p in kept)
    assert all(p.model.startswith(str(omega_teacher)) for p in kept)  # its newest checkpoint
    published = out / "checkpoint-1"
    assert json.loads((published / "tokenizer.json").read_text()) == json.loads(
        (tiny_model_dir / "tokenizer.json").read_text()
    )  # the student's tokenizer, not the teacher's
    moved = _weights(published)
    base = _weights(tiny_model_dir)
    assert any(not torch.equal(moved[k], base[k]) for k in base)
    revs = json.loads((out / "config.json").read_text())["revisions"]
    assert revs[str(omega_teacher)].startswith("sha256:")  # a leanrl checkpoint's checksums
    # the student sampling alone (expert iteration) finds nothing to train on here
    from leanrl.train.sft.expert_iteration import ExpertIteration, ExpertIterationConfig

    alone = ExpertIterationConfig(
        policy=PolicyConfig(model=str(tiny_model_dir)), env=_env(), out=tmp_path / "alone",
        rounds=1, samples=2, sampling=SamplingConfig(temperature=1.0, max_tokens=8, seed=0),
    )  # fmt: skip
    assert ExpertIteration(alone).train_sync()[0]["new_proofs"] == 0


def test_each_environment_is_distilled_from_its_own_expert(
    tiny_model_dir: Path, omega_teacher: Path, tmp_path: Path
) -> None:
    """Two environments, two experts: each environment's tasks are sampled by its own expert
    (here the same weights in two folders, told apart by name), and the student is trained on
    the proofs of both."""
    from leanrl.train.common import RunDir
    from leanrl.train.distill.run import train_distill

    latest = RunDir(omega_teacher).latest_checkpoint()
    assert latest is not None
    second = tmp_path / "second-expert"
    shutil.copytree(latest[1], second)
    envs = {"a": _env(["toy_0", "toy_1", "toy_2"]), "b": _env(["toy_3", "toy_4", "toy_5"])}
    experts = {"a": str(omega_teacher), "b": str(second)}
    out = tmp_path / "run"
    _, [row] = train_distill(_config(tiny_model_dir, out, envs=envs, experts=experts))
    kept = read_proofs(out / "proofs.jsonl")
    by_env = {p.task_id: p.model for p in kept}
    assert {by_env[t] for t in by_env if t in ("toy_0", "toy_1", "toy_2")} <= {str(latest[1])}
    assert {by_env[t] for t in by_env if t in ("toy_3", "toy_4", "toy_5")} <= {str(second)}
    assert any(t in by_env for t in ("toy_0", "toy_1", "toy_2"))
    assert any(t in by_env for t in ("toy_3", "toy_4", "toy_5"))
    assert row["sft_pairs"] == len({p.task_id for p in kept})
    assert (out / "round-1" / "sample" / "a" / "results.jsonl").is_file()
    with pytest.raises(ValueError, match="no teacher for b"):
        _config(tiny_model_dir, tmp_path / "x", envs=envs, experts={"a": str(second)})


def test_the_training_data_is_decontaminated_against_a_benchmark(
    tiny_model_dir: Path, omega_teacher: Path, tmp_path: Path
) -> None:
    """A benchmark holding toy_0's statement: toy_0 is never sampled, so no proof of it is
    trained on, and the run folder says what was dropped."""
    from leanrl.train.distill.run import train_distill

    bench = tmp_path / "bench.jsonl"
    row = json.loads(TOY.read_text().splitlines()[0])
    bench.write_text(json.dumps(row) + "\n")
    env = _env(decontaminate={"against": [f"dataset={bench}"]})
    out = tmp_path / "run"
    _, [r] = train_distill(_config(tiny_model_dir, out, env=env, teacher=str(omega_teacher)))
    assert r["tasks"] == 7  # of the 8 training tasks
    assert "toy_0" not in {p.task_id for p in read_proofs(out / "proofs.jsonl")}
    report = json.loads((out / "decontamination.json").read_text())
    assert [d["name"] for d in report["dropped"]] == ["toy_0"]


def test_a_changed_teacher_is_refused_on_resume(
    tiny_model_dir: Path, omega_teacher: Path, tmp_path: Path
) -> None:
    from leanrl.train.common import RunDir
    from leanrl.train.distill.run import train_distill

    latest = RunDir(omega_teacher).latest_checkpoint()
    assert latest is not None
    teacher = tmp_path / "teacher"
    shutil.copytree(latest[1], teacher)
    out = tmp_path / "run"
    env = _env(["toy_0", "toy_1"])
    train_distill(_config(tiny_model_dir, out, env=env, teacher=str(teacher)))
    (teacher / "checksums.sha256").unlink()  # the teacher re-saved: another revision
    with pytest.raises(ConfigError, match="has changed since the run"):
        train_distill(_config(tiny_model_dir, out, env=env, teacher=str(teacher), rounds=2))
