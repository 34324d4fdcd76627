"""A CPU-sized GRPO run that needs no Lean, no GPU and no download.

    python examples/train_grpo_cpu.py [--out runs/grpo-cpu]

It makes a tiny random model (leanrl.testing.make_tiny_model), then trains it with
``examples/train-grpo-cpu.toml`` on ``DigitsEnv`` below: theorem statements as prompts, and as
reward the share of digit characters in the model's completion. That reward is learnable by a
random model within seconds, so the run shows every part of the trainer (groups, advantages,
clipped loss, metrics, checkpoints, resume, the reward plot). It is not a Lean result, and no
Lean runs.

The same run from the command line, once the tiny model exists:

    PYTHONPATH=examples leanrl train grpo --config examples/train-grpo-cpu.toml \
        --model runs/tiny-model-grpo
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from leanrl.environment import Environment
from leanrl.harness import Harness
from leanrl.policy import Policy, SamplingConfig
from leanrl.rollout import Rollout, Turn
from leanrl.runtime import Runtime
from leanrl.task import Task
from leanrl.taskset import RawRow, Taskset
from leanrl.verdict import Attempt, Reason, Verdict

HERE = Path(__file__).resolve().parent
STATEMENTS = [f"theorem t{i} (n : Nat) : n + {i} = {i} + n := by" for i in range(8)]


class DigitsTaskset(Taskset):
    """Eight core-Lean statements in memory; the reward is the share of digits written."""

    name = "grpo-cpu-digits"

    def load_rows(self) -> list[RawRow]:
        return [
            RawRow(origin="example", index=i + 1, data={"name": f"t{i}", "formal_statement": s})
            for i, s in enumerate(STATEMENTS)
        ]

    def group_rewards(self, task: Task, rollouts: Sequence[Rollout]) -> list[float]:
        return [
            sum(c.isdigit() for c in r.completion) / max(len(r.completion), 1) for r in rollouts
        ]


class OneTurnHarness(Harness):
    """Prompt with the statement, keep the completion's token ids and log-probs, reward it."""

    name = "grpo-cpu-one-turn"

    async def run(
        self,
        tasks: Sequence[Task],
        policy: Policy,
        runtime: Runtime,
        sampling: SamplingConfig,
        taskset: Taskset,
    ) -> list[list[Rollout]]:
        completions = await policy.generate([t.formal_statement for t in tasks], sampling)
        out = []
        for task, group in zip(tasks, completions, strict=True):
            rollouts = [
                Rollout(
                    task_id=task.id,
                    sample=j,
                    prompt=task.formal_statement,
                    prompt_ids=list(c.prompt_token_ids),
                    turns=[Turn.from_completion(c)],
                )
                for j, c in enumerate(group)
            ]
            for r, reward in zip(rollouts, taskset.group_rewards(task, rollouts), strict=True):
                r.reward = reward
            out.append(rollouts)
        return out


class NoLeanRuntime(Runtime):
    """This example never checks proofs; if asked, it answers that there is no Lean here."""

    name = "grpo-cpu-no-lean"

    async def check(self, attempts: Sequence[Attempt]) -> list[Verdict]:
        return [
            Verdict.reject(Reason.INFRA, "the CPU example has no Lean runtime", id=a.id)
            for a in attempts
        ]


class DigitsEnv(Environment):
    name = "grpo-cpu-digits"
    description = "Toy GRPO environment: reward = share of digits in the completion (no Lean)."
    taskset_class = DigitsTaskset

    def make_harness(self) -> Harness:
        return OneTurnHarness()

    def make_runtime(self) -> Runtime:
        return NoLeanRuntime()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/grpo-cpu", help="run folder")
    # Its own folder: the README's first run leaves another tiny model in runs/tiny-model.
    ap.add_argument(
        "--model-dir", default="runs/tiny-model-grpo", help="its tiny model (made on the first run)"
    )
    args = ap.parse_args()

    from leanrl.cli import setup_logging
    from leanrl.config import merge
    from leanrl.testing import make_tiny_model
    from leanrl.train.grpo import GRPOConfig, GRPOTrainer

    setup_logging()  # the trainer's own lines: "resuming from ...", one per step, as the CLI

    model = Path(args.model_dir)
    if not (model / "config.json").is_file():
        make_tiny_model(model, [*STATEMENTS, "0123456789", "omega", "simp", "rfl"] * 4)
    config = merge(GRPOConfig, HERE / "train-grpo-cpu.toml", {"out": args.out})
    config.policy.model = str(model)
    trainer = GRPOTrainer(config, env=DigitsEnv(config.env))
    trainer.train_sync()
    rows = trainer.run.metrics()
    first, last = rows[0]["reward_mean"], rows[-1]["reward_mean"]
    print(f"reward: step 1 {first:.3f} -> step {rows[-1]['step']} {last:.3f}")
    made = [n for n in ("metrics.jsonl", "reward_curve.png") if (trainer.run.path / n).is_file()]
    made += ["checkpoint-*/"] if any(trainer.run.path.glob("checkpoint-*")) else []
    print(f"run folder: {trainer.run.path} ({', '.join(made)})")


if __name__ == "__main__":
    main()
