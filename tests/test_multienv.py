"""Several environments in one run (issue 40): weighted task draws, per-environment metrics and
held-out evaluations, one expert per environment in on-policy distillation, the CLI's
``--env A --env B``.

The environments are the digit-reward test environment of ``tests/test_grpo_trainer.py`` (no
Lean), a copy of it with other task ids, and Countdown (checked without Lean).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import torch

from leanrl.errors import ConfigError
from leanrl.taskset import RawRow
from leanrl.train.multienv import MixedEnvironment
from tests.conftest import tiny_model_texts
from tests.test_grpo_trainer import DigitEnv, DigitTaskset, _config


def _train(cfg: Any) -> list[dict[str, Any]]:
    """A GRPO run on the environments its config names (``envs``)."""
    from leanrl.train.grpo import GRPOTrainer

    trainer = GRPOTrainer(cfg)
    trainer.train_sync()
    return trainer.run.metrics()


class OtherDigitTaskset(DigitTaskset):
    """The digit tasks under other ids (u0..u7), so that they can share a run with DigitEnv's."""

    name = "test-digits-other"

    def load_rows(self) -> Iterable[RawRow]:
        for row in super().load_rows():
            name = "u" + str(row.data["name"])[1:]
            stmt = str(row.data["formal_statement"]).replace(str(row.data["name"]), name, 1)
            data = dict(row.data, name=name, formal_statement=stmt)
            yield RawRow(origin=row.origin, index=row.index, data=data)


class OtherDigitEnv(DigitEnv):
    name = "test-digits-other"
    taskset_class = OtherDigitTaskset


DIGITS = "tests.test_grpo_trainer:DigitEnv"
OTHER = f"{__name__}:OtherDigitEnv"


def test_each_task_is_drawn_by_weight_and_in_its_own_epoch_order() -> None:
    env = MixedEnvironment([("a", 3.0, DigitEnv()), ("b", 1.0, OtherDigitEnv())])
    draws = [t for s in range(50) for t in env.batch(s, 4, seed=7)]
    share = Counter(env.env_of(t.id) for t in draws)
    assert abs(share["a"] / len(draws) - 0.75) < 0.07, share
    # within a part, no task twice before every task of it came once (epochs of a permutation)
    first_a = [t.id for t in draws if env.env_of(t.id) == "a"][:8]
    assert sorted(first_a) == [f"t{i}" for i in range(8)]
    # a pure function of (seed, step): a fresh environment, or a step asked for alone
    again = MixedEnvironment([("a", 3.0, DigitEnv()), ("b", 1.0, OtherDigitEnv())])
    assert [t.id for t in again.batch(31, 4, seed=7)] == [t.id for t in draws[124:128]]
    with pytest.raises(ConfigError, match="is in both"):
        MixedEnvironment([("a", 1.0, DigitEnv()), ("b", 1.0, DigitEnv())]).tasks()


def test_the_cli_reads_env_given_twice_as_a_mixed_run() -> None:
    from leanrl.cli import parse_command
    from leanrl.train.grpo.cli import GRPOCommand

    cmd = parse_command(GRPOCommand, ["--env", "countdown", "--env", f"{OTHER}=3"])
    cfg = cmd.to_grpo_config()
    assert [(e.name, e.id, e.weight) for e in cfg.envs] == [
        ("countdown", "countdown", 1.0),
        (OTHER, OTHER, 3.0),
    ]
    single = parse_command(GRPOCommand, ["--env", "countdown"]).to_grpo_config()
    assert single.env.id == "countdown" and single.envs == []
    with pytest.raises(ConfigError, match="weight after '='"):
        parse_command(GRPOCommand, ["--env", "countdown", "--env", "minif2f=lots"])


def test_a_mixed_grpo_run_reports_and_evaluates_each_environment(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Countdown (with a held-out split) and the digit environment in one GRPO run: each step's
    groups come from both, the row has each one's reward, and the in-run evaluation is
    Countdown's, in its own folder and keys, with the task-weighted mean."""
    envs = {
        "cd": {"id": "countdown", "weight": 1.0, "taskset": {"split": "train", "limit": 8},
               "eval": {"taskset": {"split": "test", "limit": 2}}},
        "dg": {"id": DIGITS, "weight": 1.0},
    }  # fmt: skip
    cfg = _config(tiny_model_dir, tmp_path / "run", steps=2, envs=envs, dynamic_sampling="off",
                  eval={"every": 2, "sampling": {"max_tokens": 4}})  # fmt: skip
    rows = _train(cfg)
    groups = [(r["env/cd/groups"], r["env/dg/groups"]) for r in rows]
    assert all(a + b == 4 for a, b in groups) and sum(a for a, _ in groups) > 0, groups
    assert sum(b for _, b in groups) > 0
    last = rows[-1]
    assert last["env/cd/pass_rate"] is not None  # Countdown gives verdicts; digits do not
    assert last["env/dg/pass_rate"] is None
    assert last["eval/cd/tasks"] == 2 and last["eval/tasks"] == 2
    assert last["eval/pass@1"] == last["eval/cd/pass@1"]
    assert (tmp_path / "run" / "eval" / "step-2" / "cd" / "results.jsonl").is_file()
    kept = json.loads((tmp_path / "run" / "config.json").read_text())
    assert [e["name"] for e in kept["envs"]] == ["cd", "dg"]


@pytest.fixture(scope="module")
def sharp_teacher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model with the student's tokenizer and peaked next-token distributions."""
    from transformers import AutoModelForCausalLM

    from leanrl.testing import make_tiny_model

    out = make_tiny_model(tmp_path_factory.mktemp("sharp"), tiny_model_texts(), seed=1)
    model = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        model.model.norm.weight.mul_(8.0)
    model.save_pretrained(out)
    return out


def test_each_environments_tokens_are_scored_by_its_own_expert(
    tiny_model_dir: Path, sharp_teacher: Path, tmp_path: Path
) -> None:
    """distill.experts: environment a's expert is the student itself (reverse KL 0 at step
    1), b's is another model (far from it): the per-environment figures tell them apart."""
    envs: Any = {"a": {"id": DIGITS}, "b": {"id": OTHER}}
    experts = {"a": str(tiny_model_dir), "b": str(sharp_teacher)}
    cfg = _config(tiny_model_dir, tmp_path / "run", steps=1, envs=envs,
                  distill={"experts": experts, "only": True})  # fmt: skip
    [row] = _train(cfg)
    assert row["env/a/groups"] > 0 and row["env/b/groups"] > 0
    assert abs(row["distill/a/reverse_kl"]) < 1e-4
    assert row["distill/b/reverse_kl"] > 0.5
    revs = json.loads((tmp_path / "run" / "config.json").read_text())["distill"]["revisions"]
    assert set(revs) == set(experts.values())
    with pytest.raises(ValueError, match="not environments of this run"):
        _config(tiny_model_dir, tmp_path / "x", envs=envs, distill={"experts": {"c": "m"}})


def test_each_held_out_set_is_checked_against_its_own_training_tasks(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The second environment's held-out set overlaps its training tasks (the first's does
    not): refused before the model loads, as a single environment's would be."""
    envs = {
        "a": {"id": "countdown", "taskset": {"split": "train", "limit": 8},
              "eval": {"taskset": {"split": "train", "names": ["countdown_train_0500"]}}},
        "b": {"id": "countdown", "taskset": {"split": "test", "limit": 4},
              "eval": {"taskset": {"split": "test", "limit": 2}}},
    }  # fmt: skip
    cfg = _config(tiny_model_dir, tmp_path / "run", steps=1, envs=envs, eval={"every": 1})
    assert cfg.eval.env.taskset.names == ["countdown_train_0500"]  # the run's own check: a's
    with pytest.raises(ConfigError, match="shares 2 of its 2 tasks with the training set"):
        _train(cfg)
    assert not (tmp_path / "run" / "checkpoint-1").exists()
