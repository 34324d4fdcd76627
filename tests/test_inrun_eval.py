"""In-run held-out evaluation (GRPO, ES, SFT) and kept proofs from the RL trainers.

Training and held-out tasks are the toy tasks (tests/fixtures/toy_tasks.jsonl: split `train`
and `test`); Lean is the scripted TEST runtime (a rule, not Lean): for training it accepts every
proof (``accept = ""``, through the tactic loop, where any tactic the random model writes closes
the goal) so that verified proofs exist to keep; for evaluation it accepts proofs containing
``omega``. The model is the tiny random toy model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from leanrl.environment import EnvironmentConfig
from leanrl.policy import PolicyConfig, SamplingConfig
from leanrl.proofs import read_proofs
from leanrl.train.inrun_eval_config import InRunEvalConfig

TOY = Path(__file__).parent / "fixtures" / "toy_tasks.jsonl"
RT = "tests._scripted_runtime:ScriptedRuntime"


def _env(split: str, accept: str, harness: str = "whole-proof") -> EnvironmentConfig:
    return EnvironmentConfig(
        id="dataset",
        taskset={"path": TOY, "split": split},
        harness={"name": harness, "max_turns": 3},
        runtime={"name": RT, "options": {"accept": accept}},
    )


def _eval(every: int, **kw: Any) -> InRunEvalConfig:
    return InRunEvalConfig(
        every=every,
        env=_env("test", "omega"),
        sampling=SamplingConfig(temperature=0.0, max_tokens=6),
        **kw,
    )


def _eval_rows(run: Path) -> dict[int, float]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["eval/pass@1"] for r in rows if "eval/pass@1" in r}


def test_eval_config_checks_and_schedule() -> None:
    with pytest.raises(ValueError, match=r"eval\.env is not"):
        InRunEvalConfig(every=2)
    with pytest.raises(ValueError, match=r"larger than eval\.samples"):
        InRunEvalConfig(every=2, env=_env("test", "x"), k="1,4")
    cfg = _eval(3, at_start=True)
    assert [s for s in range(0, 8) if cfg.due(s, 7)] == [0, 3, 6, 7]
    assert cfg.baseline_due([]) and not cfg.baseline_due([{"step": 0, "eval/pass@1": 0.0}])
    assert not InRunEvalConfig().due(5, 5)


def test_grpo_evaluates_every_n_steps_and_keeps_its_proofs(
    toy_model_dir: Path, tmp_path: Path
) -> None:
    from leanrl.train.grpo import GRPOConfig, GRPOTrainer

    env = _env("train", "", "tactic-loop")
    bench = Path(__file__).parent / "fixtures" / "decontam" / "bench.jsonl"
    env.taskset.decontaminate.against = [f"dataset={bench}"]
    cfg = GRPOConfig(
        policy=PolicyConfig(model=str(toy_model_dir)),
        env=env,
        sampling=SamplingConfig(max_tokens=6, top_p=1.0, seed=0),
        out=tmp_path / "run",
        steps=3,
        tasks_per_step=2,
        group_size=2,
        save_every=3,
        dynamic_sampling="off",
        eval=_eval(2, at_start=True),
    )
    GRPOTrainer(cfg).train_sync()
    run = tmp_path / "run"
    evals = _eval_rows(run)
    assert sorted(evals) == [0, 2, 3] and all(0.0 <= v <= 1.0 for v in evals.values())
    results = (run / "eval" / "step-2" / "results.jsonl").read_text().splitlines()
    assert len(results) == 4  # the four held-out tasks, one greedy sample each
    assert json.loads(results[0])["task_id"] == "toy_8"
    assert (run / "eval_curve.png").read_bytes().startswith(b"\x89PNG")
    kept = read_proofs(run / "proofs.jsonl")
    assert kept and {p.source for p in kept} == {"grpo"}
    assert {p.step for p in kept} == {0, 1, 2}  # the weights version that wrote each proof
    assert all(p.task_id in {f"toy_{i}" for i in range(8)} for p in kept)  # never held-out
    report = json.loads((run / "decontamination.json").read_text())
    assert (report["checked"], report["kept"]) == (8, 8)  # the taskset option's report is kept


def test_es_evaluates_and_keeps_member_proofs(toy_model_dir: Path, tmp_path: Path) -> None:
    from leanrl.train.es import ESConfig, ESTrainer

    cfg = ESConfig(
        policy=PolicyConfig(model=str(toy_model_dir)),
        env=_env("train", "", "tactic-loop"),
        sampling=SamplingConfig(max_tokens=6, seed=0),
        out=tmp_path / "run",
        steps=2,
        tasks_per_step=2,
        population=2,
        greedy=False,  # greedy, the random model writes only newlines: no tactic at all
        save_every=2,
        eval=_eval(1),
    )
    ESTrainer(cfg).train_sync()
    run = tmp_path / "run"
    assert sorted(_eval_rows(run)) == [1, 2]
    kept = read_proofs(run / "proofs.jsonl")
    assert kept and {p.source for p in kept} == {"es"} and {p.step for p in kept} <= {1, 2}
    extra = kept[0].model_extra or {}
    assert extra["member_sign"] in (1, -1) and isinstance(extra["member_seed"], int)


def test_es_with_vllm_cannot_evaluate_in_run(tmp_path: Path, toy_model_dir: Path) -> None:
    import asyncio

    from leanrl.errors import ConfigError
    from leanrl.train.es import ESConfig, ESTrainer

    cfg = ESConfig(
        policy=PolicyConfig(model=str(toy_model_dir), backend="vllm"),
        scorer={"backend": "vllm"},
        out=tmp_path / "run",
        eval=_eval(1),
    )
    with pytest.raises(ConfigError, match="evaluate the checkpoints with leanrl eval"):
        asyncio.run(ESTrainer(cfg).start())


def test_sft_evaluates_every_n_steps(toy_model_dir: Path, tmp_path: Path) -> None:
    from leanrl import load_environment
    from leanrl.train.sft import SFTConfig, SFTTrainer
    from leanrl.train.sft.data import Pair

    tasks = load_environment("dataset", path=TOY, split="train").tasks()
    cfg = SFTConfig(
        policy=PolicyConfig(model=str(toy_model_dir)),
        out=tmp_path / "run",
        epochs=None,
        steps=4,
        batch_size=2,
        micro_batch_size=2,
        lr=3e-3,
        save_every=4,
        eval=_eval(2, at_start=True),
    )
    SFTTrainer(cfg, pairs=[Pair(t, "\n  omega") for t in tasks]).train_sync()
    run = tmp_path / "run"
    assert sorted(_eval_rows(run)) == [0, 2, 4]
    assert (run / "eval" / "step-4" / "summary.json").is_file()
    # a rerun of the finished run evaluates nothing again
    SFTTrainer(cfg, pairs=[Pair(t, "\n  omega") for t in tasks]).train_sync()
    assert sorted(_eval_rows(run)) == [0, 2, 4]


def test_a_held_out_split_alone_means_the_training_environment() -> None:
    # `--eval.env.taskset.split test` while training on countdown evaluates countdown's test
    # split with countdown's harness, not EnvironmentConfig's default (miniF2F, Lean).
    from leanrl.train.grpo import GRPOConfig

    cfg = GRPOConfig.model_validate(
        {
            "env": {"id": "countdown", "taskset": {"split": "train"},
                    "harness": {"options": {"style": "direct"}}},
            "eval": {"every": 2, "env": {"taskset": {"split": "test", "limit": 5}}},
        }
    )  # fmt: skip
    held = cfg.eval.env
    assert held is not None and held.id == "countdown"
    assert held.taskset.split == "test" and held.taskset.limit == 5
    assert held.harness.options == {"style": "direct"}
    named = GRPOConfig.model_validate(
        {"env": {"id": "countdown"}, "eval": {"every": 2, "env": {"id": "minif2f"}}}
    )
    assert named.eval.env is not None and named.eval.env.id == "minif2f"
    assert named.eval.env.harness.name == "whole-proof"
