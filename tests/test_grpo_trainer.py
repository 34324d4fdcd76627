"""The GRPO trainer end to end on CPU: it learns, resumes exactly, writes loadable checkpoints.

The environment here is a test environment with a learnable reward (the share of digits in the
completion); it proves that the trainer optimises, not anything about Lean. It never calls a
runtime.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from leanrl import Environment, Harness, Rollout, Runtime, Task, Taskset, Turn
from leanrl.errors import ConfigError, LeanNotFoundError
from leanrl.policy import Policy, PolicyConfig, SamplingConfig
from leanrl.runtime import RuntimeConfig
from leanrl.taskset import RawRow
from leanrl.train.common import RunDir
from leanrl.verdict import Attempt, Verdict

# -- a test environment with a learnable reward -------------------------------------------------


def digit_share(text: str) -> float:
    """The reward: the fraction of the completion's characters that are digits."""
    return sum(ch.isdigit() for ch in text) / max(len(text), 1)


class DigitTaskset(Taskset):
    name = "test-digits"

    def load_rows(self) -> Iterable[RawRow]:
        for i in range(8):
            stmt = f"theorem t{i} : {i} + {i} = {2 * i} := by"
            yield RawRow(
                origin="test",
                index=i + 1,
                data={"name": f"t{i}", "header": "", "formal_statement": stmt},
            )

    def group_rewards(self, task: Task, rollouts: Sequence[Rollout]) -> list[float]:
        return [digit_share(r.completion) for r in rollouts]


class PromptHarness(Harness):
    """One turn: prompt with the statement, reward from the taskset (no Lean involved)."""

    name = "test-prompt"
    calls = 0
    fail_at: int | None = None  # raise on this call (simulates a crash mid-run)

    async def run(
        self,
        tasks: Sequence[Task],
        policy: Policy,
        runtime: Runtime,
        sampling: SamplingConfig,
        taskset: Taskset,
    ) -> list[list[Rollout]]:
        if self.fail_at is not None and PromptHarness.calls == self.fail_at:
            raise _Crash("simulated crash")
        PromptHarness.calls += 1
        if self.config.options.get("delay_s"):  # slows a run down so a test can kill it mid-way
            await asyncio.sleep(float(self.config.options["delay_s"]))
        comps = await policy.generate([t.formal_statement for t in tasks], sampling)
        out = []
        for task, cs in zip(tasks, comps, strict=True):
            group = [
                Rollout(
                    task_id=task.id,
                    sample=j,
                    prompt=task.formal_statement,
                    prompt_ids=list(c.prompt_token_ids),
                    turns=[Turn.from_completion(c)],
                )
                for j, c in enumerate(cs)
            ]
            for r, reward in zip(group, taskset.group_rewards(task, group), strict=True):
                r.reward = reward
            out.append(group)
        return out


class _Crash(RuntimeError):
    pass


class NoLeanRuntime(Runtime):
    name = "test-no-lean"

    def metrics(self) -> dict[str, float]:
        return {"started": 1.0}  # any counter: the trainer copies it into its metrics rows

    async def check(self, attempts: Sequence[Attempt]) -> list[Verdict]:
        raise AssertionError("the test environment never calls Lean")


class DigitEnv(Environment):
    name = "test-digits"
    taskset_class = DigitTaskset
    fail_at: int | None = None

    def make_harness(self) -> Harness:
        h = PromptHarness(self.config.harness)
        h.fail_at = self.fail_at
        return h

    def make_runtime(self) -> Runtime:
        return NoLeanRuntime(RuntimeConfig(name="test-no-lean"))


def _config(model: Path, out: Path, **kw: Any) -> Any:
    from leanrl.train.grpo import GRPOConfig

    base: dict[str, Any] = dict(
        policy=PolicyConfig(model=str(model)),
        sampling=SamplingConfig(max_tokens=16, top_p=1.0, seed=0),
        out=out,
        steps=40,
        tasks_per_step=4,
        group_size=4,
        lr=3e-3,
        weight_decay=0.0,
        micro_batch_size=16,
        save_every=100,
        mask_truncated=False,  # 16-token completions are nearly always cut; keep their loss
    )
    base.update(kw)
    return GRPOConfig(**base)


def _train(cfg: Any, env: Environment | None = None) -> list[dict[str, Any]]:
    from leanrl.train.grpo import GRPOTrainer

    trainer = GRPOTrainer(cfg, env=env or DigitEnv())
    trainer.train_sync()
    return trainer.run.metrics()


# -- learning -----------------------------------------------------------------------------------


def test_grpo_learns_the_reward(tiny_model_dir: Path, tmp_path: Path) -> None:
    rows = _train(_config(tiny_model_dir, tmp_path / "run"))
    rewards = [r["reward_mean"] for r in rows]
    assert [r["step"] for r in rows] == list(range(1, 41))
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.2, rewards  # from ~0.1 to well above
    # every metric the run folder promises is there
    want = {"reward_mean", "pass_rate", "adv_mean", "adv_std", "loss", "kl", "entropy",
            "clip_frac", "tokens_per_s", "time_step", "time_generate", "time_verify",
            "time_train"}  # fmt: skip
    assert want <= set(rows[-1])
    assert rows[-1]["staleness"] == 0
    assert all(r["runtime/started"] == 1.0 for r in rows)  # runtime counters reach every row
    assert (tmp_path / "run" / "reward_curve.png").stat().st_size > 1000


def test_async_generation_learns_within_the_staleness_bound(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    rows = _train(_config(tiny_model_dir, tmp_path / "run", async_generation=True, max_staleness=1))
    stale = [r["staleness"] for r in rows]
    assert max(stale) == 1 and min(stale) == 0  # it did run ahead, never by more than 1
    rewards = [r["reward_mean"] for r in rows]
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.15, rewards


@pytest.mark.parametrize(
    "kw",
    [
        {"loss_agg": "grpo", "ppo_epochs": 2, "minibatches": 2, "micro_batch_size": 3},
        {"loss_agg": "dr_grpo", "scale_rewards": "none", "beta": 0.05},
        {"dynamic_sampling": "refill", "lr_schedule": "cosine", "warmup_steps": 2},
    ],
    ids=["grpo-2epochs", "dr_grpo-kl", "refill-cosine"],
)
def test_variants_run_and_log(tiny_model_dir: Path, tmp_path: Path, kw: dict[str, Any]) -> None:
    rows = _train(_config(tiny_model_dir, tmp_path / "run", steps=4, **kw))
    assert len(rows) == 4
    last = rows[-1]
    assert last["loss"] is not None and math.isfinite(last["loss"])
    if kw.get("beta"):
        assert last["kl"] is not None and last["kl"] >= 0.0
    if kw.get("ppo_epochs") == 2:
        assert last["optimizer_steps"] == 4  # 2 passes x 2 mini-batches
    if "lr_schedule" in kw:
        assert rows[0]["lr"] == pytest.approx(3e-3 / 2)  # warm-up step 1 of 2


def test_first_pass_ratio_is_one(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The trainer's forward reproduces the sampler's log-probs: ρ = 1 before any update."""
    import asyncio

    from leanrl.train.grpo.engine import GRPOEngine

    cfg = _config(tiny_model_dir, tmp_path / "run", group_size=3)
    engine = GRPOEngine(cfg, RunDir(tmp_path / "run"))
    engine.load(resumed=False)
    policy = asyncio.run(engine.make_generation_policy())
    env = DigitEnv()
    groups = asyncio.run(
        env.rollout(env.tasks()[:2], policy, cfg.sampling.model_copy(update={"n": 3}))
    )
    samples = engine.make_samples(groups)
    logits, targets = engine._forward(samples, engine.model)
    from leanrl.train.grpo.loss import token_logprobs

    logp = token_logprobs(logits, targets)
    for k, s in enumerate(samples):
        mine = logp[k, logp.shape[1] - len(s.resp) :]
        assert torch.allclose(mine, torch.tensor(s.old), atol=1e-4)


# -- run folder: resume, checkpoints ------------------------------------------------------------


def _weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_a_step_whose_attempts_were_all_cut_off_and_masked_says_so(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every completion hits sampling.max_tokens and mask_truncated masks it: the step trains
    on nothing, and its line says why and what to change (it used to say "no informative
    group"), as a warning; the row records the reason."""
    cfg = _config(
        tiny_model_dir,
        tmp_path / "run",
        steps=2,
        mask_truncated=True,
        sampling=SamplingConfig(max_tokens=2, top_p=1.0, seed=0),
    )
    with caplog.at_level(logging.INFO, logger="leanrl"):
        rows = _train(cfg)
    assert [(r["skipped"], r["skip_reason"], r["truncated_frac"]) for r in rows] == [
        (True, "all_truncated", 1.0)
    ] * 2
    said = [r for r in caplog.records if r.getMessage().startswith("step ")]
    want = (
        "skipped (every attempt hit sampling.max_tokens = 2 and was masked (mask_truncated): "
        "raise --sampling.max-tokens or pass --no-mask-truncated)"
    )
    assert [(r.levelno, want in r.getMessage()) for r in said] == [(logging.WARNING, True)] * 2
    assert not any("no informative group" in m for m in caplog.messages)


@pytest.mark.usefixtures("no_lean")
def test_no_lean_fails_before_the_model_loads(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An environment that needs Lean, on a machine without it: the runtime's own error (how to
    set Lean up), before the model is loaded and before the run folder holds a config."""
    from leanrl.train.grpo import GRPOTrainer
    from leanrl.train.grpo.engine import GRPOEngine

    def load(*a: Any, **kw: Any) -> None:
        raise AssertionError("the model was loaded before Lean was looked for")

    monkeypatch.setattr(GRPOEngine, "load", load)
    toy = Path(__file__).parent / "fixtures" / "toy_tasks.jsonl"
    env = {"id": "dataset", "taskset": {"path": str(toy), "split": "train"}}
    cfg = _config(tiny_model_dir, tmp_path / "run", env=env)
    with pytest.raises(LeanNotFoundError, match="leanrl setup"):
        GRPOTrainer(cfg).train_sync()
    assert not (tmp_path / "run" / "config.json").exists()
    assert not (tmp_path / "run" / "summary.json").exists()  # no run, no summary of one


def test_crash_and_rerun_resumes_exactly(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kw = dict(steps=6, save_every=2, keep_checkpoints=5)
    straight = _train(_config(tiny_model_dir, tmp_path / "a", **kw))

    out = tmp_path / "b"
    PromptHarness.calls = 0
    crashing = DigitEnv()
    crashing.fail_at = 5  # step 6's rollouts: steps 1-5 logged, checkpoint-4 is the last
    with pytest.raises(_Crash):
        _train(_config(tiny_model_dir, out, **kw), env=crashing)
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 5
    assert [s for s, _ in RunDir(out).checkpoints()] == [2, 4]

    with caplog.at_level(logging.INFO, logger="leanrl"):
        resumed = _train(_config(tiny_model_dir, out, **kw))  # the same command again
    assert f"resuming from {out / 'checkpoint-4'} (step 4)" in caplog.messages
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5, 6]  # step 5 redone, not duplicated
    assert [r["reward_mean"] for r in resumed] == [r["reward_mean"] for r in straight]
    wa, wb = _weights(tmp_path / "a" / "checkpoint-6"), _weights(out / "checkpoint-6")
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)  # bit for bit, as if never stopped


def test_sigkill_and_rerun_same_command_resumes(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A real kill -9 of `leanrl train grpo` mid-run; the same command then finishes the run
    from the last checkpoint and ends where an uninterrupted run ends."""
    cfg = tmp_path / "train-grpo-kill.toml"
    cfg.write_text(
        f'env = {{ id = "{__name__}:DigitEnv", harness = {{ options = {{ delay_s = 0.2 }} }} }}\n'
        "steps = 6\ntasks_per_step = 2\ngroup_size = 2\nsave_every = 2\nkeep_checkpoints = 8\n"
        "lr = 1e-3\nmask_truncated = false\n[sampling]\nmax_tokens = 8\ntop_p = 1.0\n"
    )
    out = tmp_path / "killed"
    argv = [sys.executable, "-m", "leanrl.cli", "train", "grpo", "--config", str(cfg)]
    argv += ["--model", str(tiny_model_dir), "--out", str(out)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), *sys.path]))
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while proc.poll() is None and not (out / "checkpoint-2" / "trainer_state.json").exists():
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    done_before = len(RunDir(out).metrics())
    assert 2 <= done_before < 6

    from leanrl.cli import main

    assert main(argv[3:]) == 0  # the same command, in this process this time
    rows = RunDir(out).metrics()
    assert [r["step"] for r in rows] == list(range(1, 7))

    straight = tmp_path / "straight"
    assert main([*argv[3:-1], str(straight)]) == 0
    want = RunDir(straight).metrics()
    assert [r["reward_mean"] for r in rows] == [r["reward_mean"] for r in want]
    wa, wb = _weights(straight / "checkpoint-6"), _weights(out / "checkpoint-6")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_checkpoint_is_a_loadable_hf_folder(tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _train(_config(tiny_model_dir, tmp_path / "run", steps=2, save_every=1, keep_checkpoints=1))
    ckpts = sorted((tmp_path / "run").glob("checkpoint-*"))
    assert [p.name for p in ckpts] == ["checkpoint-2"]  # older ones pruned
    ck = ckpts[0]
    model = AutoModelForCausalLM.from_pretrained(ck)
    tok = AutoTokenizer.from_pretrained(ck)
    assert tok.encode("theorem") and model.config.vocab_size == len(tok)
    state = json.loads((ck / "trainer_state.json").read_text())
    assert state["step"] == 2 and state["trainer"] == "grpo"
    blob = torch.load(ck / "optimizer.pt", weights_only=True)
    assert {"optimizer", "scheduler", "torch_rng", "python_rng"} <= set(blob)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    moved = any(
        not torch.equal(a, b)
        for a, b in zip(model.state_dict().values(), base.state_dict().values(), strict=True)
    )
    assert moved  # the checkpoint holds the trained weights, not the base model


def test_rerun_with_a_different_config_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    _train(_config(tiny_model_dir, tmp_path / "run", steps=1))
    with pytest.raises(ConfigError, match="different config"):
        _train(_config(tiny_model_dir, tmp_path / "run", steps=1, lr=1e-4))


# -- bad config, before any model is loaded -----------------------------------------------------


def test_bad_configs_fail_early(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    from leanrl.train.grpo import GRPOConfig, GRPOTrainer

    with pytest.raises(ValidationError, match="group_size must be at least 2"):
        GRPOConfig(group_size=1)
    with pytest.raises(ValidationError, match="not divisible by minibatches"):
        GRPOConfig(group_size=3, tasks_per_step=3, minibatches=2)
    with pytest.raises(ValidationError, match="old_logprobs = 'sampler'"):
        GRPOConfig(async_generation=True, old_logprobs="recompute")
    trainer = GRPOTrainer(
        GRPOConfig(policy=PolicyConfig(model=str(tmp_path / "nope")), out=tmp_path / "r")
    )
    with pytest.raises(ConfigError, match="does not exist"):
        trainer.train_sync()
    assert not (tmp_path / "r").exists()  # failed before touching the run folder
    if not torch.cuda.is_available():
        # "org/model" stands for a hub model in the local cache (the model check comes first)
        monkeypatch.setattr("leanrl.policies._common._cached", lambda r: r == "org/model")
        cpu_mixed = GRPOConfig(policy=PolicyConfig(model="org/model"), precision="bf16-mixed")
        with pytest.raises(ConfigError, match="needs a CUDA device"):
            GRPOTrainer(cpu_mixed.model_copy(update={"out": tmp_path / "r"})).check()


def test_missing_logger_package_fails_early(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from leanrl.train.grpo import GRPOTrainer

    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    cfg = _config(tiny_model_dir, tmp_path / "r", log_to=["wandb"])
    with pytest.raises(ConfigError, match="pip install wandb"):
        GRPOTrainer(cfg, env=DigitEnv()).train_sync()
    assert not (tmp_path / "r").exists()


def test_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from leanrl.cli import main

    out = tmp_path / "r"
    assert main(["train", "grpo", "--model", str(tmp_path / "missing"), "--out", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["train", "grpo", "--model", "x", "--group_size", "1", "--out", str(out)]) == 2
    assert "group_size must be at least 2" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text("tasks_per_step = 3\ngroup_size = 3\nminibatches = 2\n")
    assert main(["train", "grpo", "--config", str(bad), "--model", "x", "--out", str(out)]) == 2
    assert "not divisible" in capsys.readouterr().err
    # flags and file are checked together: 3 x 3 = 9 divides by 3 (alone, 8 x 16 would not)
    good = tmp_path / "good.toml"
    good.write_text("tasks_per_step = 3\ngroup_size = 3\n")
    argv = ["train", "grpo", "--config", str(good), "--minibatches", "3", "--model", "/nope"]
    assert main([*argv, "--out", str(out)]) == 2
    assert "model folder /nope does not exist" in capsys.readouterr().err  # got past the check
    assert not out.exists()


def test_cli_trains_and_resumes(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from leanrl.cli import main

    cfg = tmp_path / "train-grpo-test.toml"
    cfg.write_text(
        f'env = {{ id = "{__name__}:DigitEnv" }}\n'
        "steps = 2\ntasks_per_step = 2\ngroup_size = 2\nsave_every = 1\nlr = 1e-3\n"
        "[sampling]\nmax_tokens = 8\ntop_p = 1.0\n"
    )
    argv = [
        "train",
        "grpo",
        "--config",
        str(cfg),
        "--model",
        str(tiny_model_dir),
        "--out",
        str(tmp_path / "r"),
    ]
    assert main(argv) == 0
    assert "checkpoint-2" in capsys.readouterr().out
    assert main([*argv, "--steps", "3"]) == 0  # extend the finished run by one step
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]


def test_cli_module_imports_without_torch() -> None:
    """`leanrl` lists every command at start-up: the GRPO command must not pull in torch."""
    code = "import sys, leanrl.train.grpo.cli; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_grpo_sampling_keeps_its_defaults_when_one_field_is_set() -> None:
    # `--sampling.max-tokens 512` must not bring back SamplingConfig's top-p 0.95.
    from leanrl.policy import SamplingConfig
    from leanrl.train.grpo import GRPOConfig

    assert GRPOConfig().sampling.top_p == 1.0
    cli = GRPOConfig.model_validate({"sampling": {"max_tokens": 512}})
    assert (cli.sampling.top_p, cli.sampling.temperature, cli.sampling.max_tokens) == (
        1.0,
        1.0,
        512,
    )
    py = GRPOConfig(sampling=SamplingConfig(max_tokens=64))
    assert py.sampling.top_p == 1.0 and py.sampling.max_tokens == 64
    assert GRPOConfig(sampling=SamplingConfig(top_p=0.9)).sampling.top_p == 0.9
