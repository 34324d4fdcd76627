"""Expert iteration grows the solved set, on a tiny CPU model with a learnable toy reward.

The reward is the scripted TEST runtime's rule (not Lean): a proof is accepted when it contains
``omega``. The starting model is the tiny random toy model after a short warm-up SFT on other
theorems (tests below), so that it writes proof-shaped answers ("  <tactic>" and the closing
fence), mostly with the wrong tactic: ``omega`` is one tactic in twelve of its warm-up data. A
round then finds ``omega`` proofs for a few tasks by sampling; SFT on them makes ``omega``
likelier, and the next round solves tasks the first could not.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest

from leanrl import ConfigError, LeanNotFoundError, Task
from leanrl.cli import parse_command
from leanrl.environment import EnvironmentConfig
from leanrl.policy import PolicyConfig, SamplingConfig
from leanrl.proofs import read_proofs
from leanrl.train.inrun_eval_config import InRunEvalConfig

TOY = Path(__file__).parent / "fixtures" / "toy_tasks.jsonl"
RT = "tests._scripted_runtime:ScriptedRuntime"
TACTICS = ["simp", "rfl", "ring", "linarith", "decide", "norm_num"] * 2
TACTICS[-1] = "omega"


@pytest.fixture(scope="module")
def warm_model(toy_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The toy model after a warm-up SFT on twelve other theorems (one proved by omega)."""
    from leanrl.train.sft import SFTConfig, SFTTrainer
    from leanrl.train.sft.data import Pair

    pairs = [
        Pair(
            Task(
                name=f"warm_{i}",
                header="",
                formal_statement=f"theorem warm_{i} (m : Nat) : m * {i} = {i} * m := by",
            ),
            "\n  " + tac,
        )
        for i, tac in enumerate(TACTICS)
    ]
    out = tmp_path_factory.mktemp("warm")
    cfg = SFTConfig(
        policy=PolicyConfig(model=str(toy_model_dir)),
        out=out / "run",
        epochs=None,
        steps=120,
        batch_size=4,
        micro_batch_size=4,
        lr=3e-3,
        # Decayed to 0: with a constant rate the model ended wherever its last few batches left
        # it, so its omega rate (about 1 in 12 wanted) ranged from 2% to 35% with the data
        # order; decayed, 4% to 13% over warm-up seeds 0-4.
        lr_schedule="cosine",
        save_every=1000,
    )
    trainer = SFTTrainer(cfg, pairs=pairs)
    trainer.train_sync()
    latest = trainer.run.latest_checkpoint()
    assert latest is not None
    return latest[1]


def _env(split: str) -> EnvironmentConfig:
    return EnvironmentConfig(
        id="dataset",
        taskset={"path": TOY, "split": split},
        runtime={"name": RT, "options": {"accept": "omega"}},
    )


def _config(model: Path, out: Path, **kw: Any) -> Any:

    base: dict[str, Any] = dict(
        policy=PolicyConfig(model=str(model)),
        env=_env("train"),
        out=out,
        rounds=2,
        samples=4,
        sampling=SamplingConfig(temperature=1.0, top_p=1.0, max_tokens=12, seed=0),
        sft={"epochs": 8, "batch_size": 2, "micro_batch_size": 2, "lr": 3e-3},
        eval=InRunEvalConfig(
            every=1,
            at_start=True,
            env=_env("test"),
            sampling=SamplingConfig(temperature=0.0, max_tokens=12),
        ),
    )
    base.update(kw)
    return base


def _rows(run: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_round_grows_the_solved_set(warm_model: Path, tmp_path: Path) -> None:
    from leanrl.train.sft.expert_iteration import ExpertIteration, ExpertIterationConfig

    run = tmp_path / "run"
    ei = ExpertIteration(ExpertIterationConfig(**_config(warm_model, run)))
    rows = ei.train_sync()
    base, r1, r2 = rows
    assert base["step"] == 0 and "eval/pass@1" in base
    assert (r1["step"], r2["step"]) == (1, 2)
    assert r1["tasks"] == 8 and r1["tasks_sampled"] == 8
    assert 0 < r1["solved_total"] < 8, r1  # sampling alone solves some, not all
    # round 2 samples only what round 1 left, and solves some of it: learned, not luck of the
    # first draw
    assert r2["tasks_sampled"] == 8 - r1["solved_total"]
    assert r2["solved_new"] > 0 and r2["solved_total"] > r1["solved_total"], (r1, r2)
    assert r2["pass_rate"] > 0.0  # pass@samples on the tasks round 1 could not solve
    assert r1["sft_pairs"] == r1["solved_total"]  # one proof per task (max_proofs_per_task)
    assert r1["sft_loss_last"] < r1["sft_loss_first"]
    kept = read_proofs(run / "proofs.jsonl")
    assert {p.step for p in kept} == {1, 2} and all("omega" in p.proof for p in kept)
    assert {p.source for p in kept} == {"expert-iteration"}
    assert len({p.task_id for p in kept}) == r2["solved_total"]
    assert [s for s, _ in ei.run.checkpoints()] == [1, 2]
    assert r2["model"] == str(run / "checkpoint-1")  # round 2 sampled round 1's model
    assert r2["eval/pass@1"] >= base["eval/pass@1"]
    assert (run / "solved.png").is_file() and (run / "eval_curve.png").is_file()
    assert not list((run / "round-1" / "sft").glob("checkpoint-*"))  # published, then removed


def test_rerun_resumes_after_the_last_finished_round(
    warm_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from leanrl.train.sft.expert_iteration import ExpertIteration, ExpertIterationConfig

    run = tmp_path / "run"
    first = ExpertIteration(
        ExpertIterationConfig(**_config(warm_model, run, rounds=1, eval=InRunEvalConfig()))
    )
    [r1] = first.train_sync()
    # a kill in round 2's SFT: the samples and proofs of round 2 are there, its row is not
    more = ExpertIteration(
        ExpertIterationConfig(**_config(warm_model, run, rounds=2, eval=InRunEvalConfig()))
    )
    with caplog.at_level(logging.INFO, logger="leanrl"):
        rows = more.train_sync()
    assert f"resuming from {run / 'checkpoint-1'} (round 1)" in caplog.messages
    assert [r["step"] for r in rows] == [2]
    assert [r["step"] for r in more.run.metrics()] == [1, 2]
    kept_before = len(read_proofs(run / "proofs.jsonl"))
    # losing the round's row (killed before it was written) redoes only what is missing
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text(lines[0] + "\n")
    shutil.rmtree(run / "checkpoint-2", ignore_errors=True)
    again = ExpertIteration(
        ExpertIterationConfig(**_config(warm_model, run, rounds=2, eval=InRunEvalConfig()))
    )
    [redo] = again.train_sync()
    assert redo["step"] == 2 and redo["solved_total"] == rows[0]["solved_total"]
    assert redo["new_proofs"] == rows[0]["new_proofs"]  # the same round-2 proofs, not re-added
    assert len(read_proofs(run / "proofs.jsonl")) == kept_before
    assert r1["step"] == 1


def test_lora_rounds_train_adapters_and_publish_merged_models(
    warm_model: Path, tmp_path: Path
) -> None:
    """--lora.rank passes through to each round's SFT (adapters, peft layout, in the round's
    SFT folder); the round's model is published merged, a plain folder the next round samples
    from."""
    pytest.importorskip("peft", reason="LoRA needs peft (the lora extra)")
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from leanrl.train.sft.expert_iteration import ExpertIteration, ExpertIterationConfig

    run = tmp_path / "run"
    cfg = _config(warm_model, run, rounds=2, eval=InRunEvalConfig(), lora={"rank": 4})
    r1, r2 = ExpertIteration(ExpertIterationConfig(**cfg)).train_sync()
    assert r1["sft_pairs"] > 0 and r1["sft_loss_last"] < r1["sft_loss_first"]
    assert json.loads((run / "round-1" / "sft" / "config.json").read_text())["lora"]["rank"] == 4
    ckpt = run / "checkpoint-1"
    assert (ckpt / "model.safetensors").is_file() and not (ckpt / "adapter_config.json").exists()
    assert json.loads((ckpt / "trainer_state.json").read_text())["lora"] is True
    merged = load_file(str(ckpt / "model.safetensors"))
    start = AutoModelForCausalLM.from_pretrained(warm_model).state_dict()
    moved = [k for k in merged if not torch.equal(merged[k], start[k])]
    assert moved and all(k.endswith("proj.weight") for k in moved)  # only adapted layers
    assert r2["model"] == str(ckpt)  # round 2 sampled the merged model


@pytest.mark.usefixtures("no_lean")
def test_no_lean_fails_before_the_model_loads(
    toy_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without Lean, the runtime's own error comes before the baseline evaluation loads the
    model."""
    from leanrl.train.sft.expert_iteration import ExpertIteration, ExpertIterationConfig

    def load(*a: Any, **kw: Any) -> None:
        raise AssertionError("the model was loaded before Lean was looked for")

    monkeypatch.setattr("leanrl.train.sft.trainer.load_model", load)
    lean = EnvironmentConfig(id="dataset", taskset={"path": TOY, "split": "train"})
    held_out = EnvironmentConfig(id="dataset", taskset={"path": TOY, "split": "test"})
    cfg = _config(
        toy_model_dir,
        tmp_path / "run",
        env=lean,
        eval=InRunEvalConfig(every=1, at_start=True, env=held_out),
    )
    with pytest.raises(LeanNotFoundError, match="leanrl setup"):
        ExpertIteration(ExpertIterationConfig(**cfg)).train_sync()


def test_checks_and_command_line(tmp_path: Path, toy_model_dir: Path) -> None:
    from leanrl.train.sft.expert_iteration import ExpertIteration, ExpertIterationConfig
    from leanrl.train.sft.expert_iteration_cli import ExpertIterationCommand

    cmd = parse_command(
        ExpertIterationCommand,
        [
            "--model",
            str(toy_model_dir),
            "--env",
            "goedel-pset",
            "--rounds",
            "4",
            "--samples",
            "16",
            "--sft.lr",
            "2e-5",
            "--train_on",
            "all",
            "--start_from",
            "base",
        ],
    )
    cfg = cmd.to_config()
    assert (cfg.rounds, cfg.samples, cfg.sft.lr, cfg.train_on) == (4, 16, 2e-5, "all")
    assert cfg.env.id == "goedel-pset" and cfg.policy.model == str(toy_model_dir)
    bad = ExpertIterationConfig(
        policy=PolicyConfig(model=str(toy_model_dir)), env={"harness": {"name": "tactic-loop"}}
    )
    with pytest.raises(ConfigError, match="trains whole proofs"):
        ExpertIteration(bad).check()
    # a budget would be ignored (nothing counts it): refused, saying what to use instead
    spend = ExpertIterationConfig(
        policy=PolicyConfig(model=str(toy_model_dir)), budget={"tokens": 9}
    )
    with pytest.raises(ConfigError, match=r"does not stop on a budget.*--rounds"):
        ExpertIteration(spend).check()
