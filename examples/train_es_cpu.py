"""A CPU-sized evolution-strategies run that needs no Lean, no GPU and no download.

    python examples/train_es_cpu.py [--out runs/es-cpu]

It makes a tiny random model (leanrl.testing.make_tiny_model), then trains it with
``examples/train-es-cpu.toml`` on ``TargetEnv`` below: theorem statements as prompts, and as
reward the mean per-token log-probability the model gives a target proof (" omega"). That reward
is smooth in the weights, so ES climbs it within seconds. It demonstrates the trainer (population,
history, checkpoints, resume, plot); it is not a Lean result, and no Lean runs.

The same run from the command line, once the tiny model exists:

    PYTHONPATH=examples leanrl train es --config examples/train-es-cpu.toml \
        --model runs/tiny-model-es
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
STATEMENTS = [
    ("add_zero'", "theorem add_zero' (n : Nat) : n + 0 = n := by"),
    ("two_mul'", "theorem two_mul' (n : Nat) : 2 * n = n + n := by"),
    ("lt_succ'", "theorem lt_succ' (n : Nat) : n < n + 1 := by"),
    ("le_refl'", "theorem le_refl' (n : Nat) : n ≤ n := by"),
]


class StatementTaskset(Taskset):
    """Four core-Lean statements, in memory."""

    name = "es-cpu-statements"

    def load_rows(self) -> list[RawRow]:
        return [
            RawRow(
                origin="example", index=i + 1, data={"name": n, "header": "", "formal_statement": s}
            )
            for i, (n, s) in enumerate(STATEMENTS)
        ]


class NoLeanRuntime(Runtime):
    """This example never checks proofs; if asked, it answers that there is no Lean here."""

    name = "no-lean"

    async def check(self, attempts: Sequence[Attempt]) -> list[Verdict]:
        return [Verdict.reject(Reason.INFRA, "no Lean in this CPU example") for _ in attempts]


class TargetHarness(Harness):
    """Generate from the statement; reward = mean log-prob of ``options.target`` after it."""

    name = "target-logprob"

    async def run(
        self,
        tasks: Sequence[Task],
        policy: Policy,
        runtime: Runtime,
        sampling: SamplingConfig,
        taskset: Taskset,
    ) -> list[list[Rollout]]:
        target = str(self.config.options.get("target", " omega"))
        prompts = [t.formal_statement for t in tasks]
        completions = await policy.generate(prompts, sampling)
        out = []
        for task, prompt, comps in zip(tasks, prompts, completions, strict=True):
            # TorchPolicy (the ES in-process policy) can score a continuation directly.
            reward = policy.continuation_logprob(prompt, target)  # type: ignore[attr-defined]
            out.append(
                [
                    Rollout(
                        task_id=task.id,
                        sample=i,
                        prompt=prompt,
                        turns=[Turn(completion=c.text, completion_ids=list(c.token_ids))],
                        reward=reward,
                    )
                    for i, c in enumerate(comps)
                ]
            )
        return out


class TargetEnv(Environment):
    """Statements + target-log-prob harness + no Lean."""

    name = "es-cpu-target"
    taskset_class = StatementTaskset

    def make_harness(self) -> Harness:
        return TargetHarness(self.config.harness)

    def make_runtime(self) -> Runtime:
        return NoLeanRuntime(self.config.runtime)


def main() -> None:
    import sys

    from leanrl.cli import setup_logging
    from leanrl.config import merge
    from leanrl.testing import make_tiny_model
    from leanrl.train.es import ESTrainer
    from leanrl.train.es.cli import ESCommand

    setup_logging()  # the trainer's own lines: "resuming from ...", one per iteration

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/es-cpu", help="run folder (rerun to resume)")
    # Its own folder: the README's first run leaves another tiny model in runs/tiny-model.
    ap.add_argument(
        "--model-dir", default="runs/tiny-model-es", help="its tiny model (made on the first run)"
    )
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))  # so `train_es_cpu:TargetEnv` resolves (also in workers)
    model = Path(args.model_dir)
    if not (model / "config.json").is_file():
        texts = [s for _, s in STATEMENTS] + [" omega", " simp", " rfl", " decide"]
        make_tiny_model(model, texts * 20)
    cmd = merge(ESCommand, HERE / "train-es-cpu.toml", {"model": str(model), "out": args.out})
    trainer = ESTrainer(cmd.to_es_config())
    rows = trainer.train_sync()
    if rows:
        first, last = rows[0], rows[-1]
        print(
            f"reward_mean: iteration {first['step']} {first['reward_mean']:.3f} -> iteration "
            f"{last['step']} {last['reward_mean']:.3f}"
        )
    made = [n for n in ("reward_curve.png", "es_history.bin") if (trainer.run.path / n).is_file()]
    made += ["checkpoint-N/"] if any(trainer.run.path.glob("checkpoint-*")) else []
    print(f"run folder: {trainer.run.path} ({', '.join(made)})")


if __name__ == "__main__":
    main()
