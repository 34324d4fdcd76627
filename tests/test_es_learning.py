"""ES learns on CPU: a tiny model, a toy environment with a smooth learnable reward.

The environment is defined here (other ES tests import it, and ES worker processes load it by
the import path ``test_es_learning:ToyEnv``). Its harness prompts the model with the theorem
statement, generates greedily, and rewards the mean per-token log-probability the model assigns
to a fixed target string after the prompt. That reward is a smooth function of the weights, so
ES can climb it in a few iterations. It is a trainer test, not a Lean result: no Lean runs, and
no Verdict claims a proof was accepted.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from leanrl.environment import Environment, EnvironmentConfig
from leanrl.harness import Harness, HarnessConfig
from leanrl.policy import Policy, PolicyConfig, SamplingConfig
from leanrl.rollout import Rollout, Turn
from leanrl.runtime import Runtime
from leanrl.task import Task
from leanrl.taskset import RawRow, Taskset
from leanrl.verdict import Attempt, Reason, Verdict

TOY_ENV = "test_es_learning:ToyEnv"


class ToyTaskset(Taskset):
    name = "es-toy"

    def load_rows(self) -> list[RawRow]:
        names = ["toy_a", "toy_b", "toy_c", "toy_d"]
        return [
            RawRow(
                origin="toy",
                index=i + 1,
                data={"name": n, "header": "", "formal_statement": f"theorem {n} : True := by"},
            )
            for i, n in enumerate(names)
        ]


class NoLeanRuntime(Runtime):
    """The toy harness never checks proofs; if anything asks, it says there is no Lean here."""

    name = "no-lean"

    def metrics(self) -> dict[str, float]:
        return {"started": 1.0}  # any counter: the trainer must copy it into its metrics rows

    async def check(self, attempts: Sequence[Attempt]) -> list[Verdict]:
        return [Verdict.reject(Reason.INFRA, "no Lean in the ES toy environment") for _ in attempts]


class TargetHarness(Harness):
    """Reward = mean log-prob of ``options.target`` after the prompt (``options.mode``:
    ``logprob``), or a constant (``constant``, for the equal-scores case)."""

    name = "es-target"

    async def run(
        self,
        tasks: Sequence[Task],
        policy: Policy,
        runtime: Runtime,
        sampling: SamplingConfig,
        taskset: Taskset,
    ) -> list[list[Rollout]]:
        opts = self.config.options
        target = str(opts.get("target", " omega"))
        prompts = [t.formal_statement for t in tasks]
        completions = await policy.generate(prompts, sampling)
        out = []
        for task, prompt, comps in zip(tasks, prompts, completions, strict=True):
            if opts.get("mode", "logprob") == "constant":
                reward = 0.25
            else:
                reward = policy.continuation_logprob(prompt, target)  # type: ignore[attr-defined]
            group = [
                Rollout(
                    task_id=task.id,
                    sample=i,
                    prompt=prompt,
                    turns=[Turn.from_completion(c)],
                    reward=reward,
                )
                for i, c in enumerate(comps)
            ]
            out.append(group)
        return out


class ToyEnv(Environment):
    name = "es-toy"
    taskset_class = ToyTaskset

    def make_harness(self) -> Harness:
        return TargetHarness(self.config.harness)

    def make_runtime(self) -> Runtime:
        return NoLeanRuntime(self.config.runtime)


def toy_config(model: Path, out: Path, **kw: Any) -> Any:
    """An ESConfig on the toy environment, CPU-sized."""
    from leanrl.train.es import ESConfig

    mode = kw.pop("mode", "logprob")
    base: dict[str, Any] = {
        "env": EnvironmentConfig(
            id=TOY_ENV, harness=HarnessConfig(name="es-target", options={"mode": mode})
        ),
        "policy": PolicyConfig(model=str(model), device="cpu", batch_size=8),
        "sampling": SamplingConfig(max_tokens=3),
        "out": out,
        "steps": 4,
        "tasks_per_step": 2,
        "population": 6,
        "sigma": 0.02,
        "alpha": 0.02,
        "save_every": 2,
    }
    base.update(kw)
    return ESConfig(**base)


def test_es_learns_on_cpu(tiny_model_dir: Path, tmp_path: Path) -> None:
    from leanrl.train.es import ESTrainer

    cfg = toy_config(
        tiny_model_dir,
        tmp_path / "run",
        steps=20,
        population=16,
        mirrored=True,
        tasks_per_step=4,
        sigma=0.01,
        alpha=0.05,
        save_every=100,
    )
    rows = ESTrainer(cfg).train_sync()
    means = [r["reward_mean"] for r in rows]
    assert len(means) == 20
    assert not any(r["skipped"] for r in rows)
    assert all(r["runtime/started"] == 1.0 for r in rows)  # runtime counters reach every row
    first, last = sum(means[:3]) / 3, sum(means[-3:]) / 3
    # a clear rise of the log-likelihood of the target (nats per token)
    assert last > first + 0.7, means
    assert max(means[:3]) < min(means[-3:]), means
    assert (tmp_path / "run" / "reward_curve.png").is_file()
    assert (tmp_path / "run" / "checkpoint-20" / "config.json").is_file()
