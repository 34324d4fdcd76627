"""Countdown: exact arithmetic, the shipped puzzles and their generator, the checker, rewards,
pass@k through the eval runner, and GRPO learning the dense reward on a tiny CPU model."""

from __future__ import annotations

import json
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from leanrl import load_environment
from leanrl.environments.countdown import (
    CountdownChecker,
    check_answer,
    evaluate,
    parse_statement,
    puzzle_statement,
)
from leanrl.environments.countdown.generate import make_splits
from leanrl.policy import Completion, Policy, PolicyConfig, Prompt, SamplingConfig
from leanrl.runtime import run_sync
from leanrl.verdict import Attempt, Reason

DATA = Path(__file__).resolve().parent.parent / "environments" / "countdown" / "data"


def test_evaluate_is_exact_and_runs_no_code() -> None:
    assert evaluate("7 / 2 * 2") == (Fraction(7), [7, 2, 2])
    assert evaluate("-(3 - 5) * 4") == (Fraction(8), [3, 5, 4])
    for bad in ("__import__('os')", "2 ** 10", "x + 1", "1.5 + 2", "3 // 2", "(1 +", "4 / (2 - 2)"):
        with pytest.raises(ValueError):
            evaluate(bad)


@pytest.mark.parametrize(
    ("answer", "correct", "detail"),
    [
        ("(25 - 5) * 3", False, "does not use every number: [7] unused"),
        ("(25 - 5) * 3 + 7", True, ""),
        ("7 + 3 * (25 - 5)", True, ""),
        ("(25 - 5) * 3 + 7 + 5", False, "not given"),
        ("25 + 5 + 3 + 7", False, "equals 40, not 67"),
        ("import os", False, "not an arithmetic answer"),
        ("", False, "no answer"),
    ],
)
def test_check_answer(answer: str, correct: bool, detail: str) -> None:
    c = check_answer(answer, [25, 5, 3, 7], 67)
    assert c.correct is correct
    assert detail in c.detail


@pytest.mark.parametrize(
    "answer",
    [r'"\d" + 1', r"'\q' * 2", "1 is 1", "x is 3", "1if 1 else 2", "0x1for 2", r"b'\d'"],
)
def test_hostile_answers_leak_no_warnings_and_judge_alike_under_any_filter(answer: str) -> None:
    # Python's parser warns on some texts (invalid escapes, `is` with a literal, `1if`):
    # DeprecationWarning or SyntaxWarning by version, printed on the user's terminal, and
    # turned into a SyntaxError by `-W error`, which would change the verdict's detail.
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        shown = check_answer(answer, [1, 2, 3], 6)
    assert caught == [], [str(w.message) for w in caught]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        strict = check_answer(answer, [1, 2, 3], 6)
    assert strict == shown and not shown.correct and not shown.parsed


def test_statement_round_trip() -> None:
    s = puzzle_statement([44, 19, 35], 98)
    assert s == "countdown: numbers 44 19 35 target 98"
    assert parse_statement(s) == ([44, 19, 35], 98)
    with pytest.raises(ValueError):
        parse_statement("theorem x : True := by")


def test_shipped_puzzles_are_the_generators_output_and_solvable() -> None:
    made = make_splits(0, 1000, 200)
    for split in ("train", "test"):
        rows = [json.loads(x) for x in (DATA / f"countdown_{split}.jsonl").read_text().splitlines()]
        assert rows == made[split]  # reproducible: the files are the generator's, seed 0
        for r in rows:
            assert check_answer(r["solution"], r["numbers"], r["target"]).correct, r
    keys = {(tuple(sorted(r["numbers"])), r["target"]) for r in made["train"]}
    assert not keys & {(tuple(sorted(r["numbers"])), r["target"]) for r in made["test"]}


def test_taskset_splits_and_bad_rows(tmp_path: Path) -> None:
    env = load_environment("countdown")
    assert len(env.tasks()) == 200  # default split: test
    train = load_environment("countdown", split="train").tasks()
    assert len(train) == 1000
    t = train[0]
    assert t.formal_statement == puzzle_statement(t.extra["numbers"], t.extra["target"])
    assert str(t.extra["target"]) in (t.informal_statement or "")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"name": "x", "numbers": "12"}\n')
    from leanrl.errors import DatasetError

    with pytest.raises(DatasetError, match="needs 'numbers'"):
        load_environment("countdown", path=bad).tasks()


class ScriptedPolicy(Policy):
    """Answers each prompt with the next of ``texts`` (cycled)."""

    name = "scripted"

    def __init__(self, texts: Sequence[str]) -> None:
        super().__init__(PolicyConfig(model="scripted"))
        self.texts = list(texts)
        self.seen: list[str] = []

    async def generate(
        self, prompts: Sequence[Prompt], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        out = []
        for p in prompts:
            self.seen.append(str(p))
            out.append(
                [Completion(text=self.texts[i % len(self.texts)]) for i in range(sampling.n)]
            )
        return out


def _rollouts(env: Any, tasks: Any, texts: Sequence[str], n: int) -> Any:
    async def go() -> Any:
        async with env:
            return await env.rollout(tasks, ScriptedPolicy(texts), SamplingConfig(n=n))

    return run_sync(go())


def test_harness_checker_and_paper_rewards() -> None:
    env = load_environment("countdown", split="train")
    task = env.tasks()[0]
    sol = task.extra["solution"]
    texts = [f"I add things.</think> <answer>{sol}</answer>", "<answer>1 + 1</answer>", "no tags"]
    (group,) = _rollouts(env, [task], texts, 3)
    assert [r.reward for r in group] == [1.0, 0.1, 0.0]
    assert group[0].verdict.accepted and group[1].verdict.reason == Reason.ERROR
    assert group[2].verdict.reason == Reason.NO_PROOF
    assert env.runtime.metrics()["checked"] == 2


def test_dense_reward_orders_answers_by_how_close_they_are() -> None:
    env = load_environment("countdown", split="train")
    env.config.harness.options.update(style="direct", reward="dense")
    task = next(t for t in env.tasks() if len(t.extra["numbers"]) == 3)
    a, b, c = task.extra["numbers"]
    texts = [task.extra["solution"], f"{a} + {b} + {c}", f"{a} + {b}", "5000", "x"]
    (group,) = _rollouts(env, [task], texts, len(texts))
    rewards = [r.reward for r in group]
    assert rewards[0] == 1.0
    assert rewards[1] >= 0.5 and rewards[1] < 1.0  # every number, some distance
    assert rewards[1] > rewards[2] > rewards[4] >= 0.1 and rewards[3] <= 0.1 + 1e-9


def test_checker_rejects_a_foreign_statement() -> None:
    a = Attempt(name="t", header="", formal_statement="theorem t : True := by", proof="1")
    (v,) = run_sync(CountdownChecker().check([a]))
    assert not v.accepted and v.reason == Reason.INFRA


def test_eval_runner_reports_pass_at_k(tmp_path: Path) -> None:
    from leanrl.eval.config import EvalConfig
    from leanrl.eval.runner import run_eval_sync

    cfg = EvalConfig(
        env={"id": "countdown", "taskset": {"split": "train", "limit": 4}},
        policy={"model": "scripted"},
        samples=2,
        out=tmp_path / "ev",
        progress=False,
    )
    env = load_environment(cfg.env)
    sols = [t.extra["solution"] for t in env.tasks()]
    # sample 0 of every task is right for tasks 0 and 1 only; sample 1 is always wrong
    texts = [f"<answer>{sols[0]}</answer>", "<answer>1</answer>"]
    summary = run_eval_sync(cfg, env=env, policy=ScriptedPolicy(texts))
    passk = summary["results"]["pass_at_k"]["all"]
    assert passk["tasks"] == 4 and 0 < passk["pass@2"] <= 0.5
    assert summary["cost"]["usd"] == 0.0 and "gpu_s" in summary["cost"]


def test_the_report_names_countdowns_harness_and_checker_and_no_lean(tmp_path: Path) -> None:
    # It named the config's defaults, a Lean harness and runtime ("whole-proof", "local") that
    # Countdown does not use, and a Lean version ("Lean: None, Mathlib: None").
    from leanrl.eval.config import EvalConfig
    from leanrl.eval.report import plot_title
    from leanrl.eval.runner import run_eval_sync

    cfg = EvalConfig(
        env={"id": "countdown", "taskset": {"split": "train", "limit": 2}},
        policy={"model": "scripted"},
        out=tmp_path / "ev",
        progress=False,
    )
    summary = run_eval_sync(cfg, policy=ScriptedPolicy(["<answer>1</answer>"]))
    assert summary["harness"]["name"] == "countdown" and summary["runtime"]["name"] == "countdown"
    assert summary["lean"] is False
    assert not [k for k in summary["versions"] if k.startswith(("lean_", "mathlib"))], summary
    report = (tmp_path / "ev" / "report.md").read_text()
    assert "harness: `countdown`" in report and "checker: `countdown`" in report, report
    for lean_word in ("whole-proof", "`local`", "Lean", "Mathlib", "deepseek"):
        assert lean_word not in report, (lean_word, report)
    assert "whole-proof" not in plot_title(summary) and "deepseek" not in plot_title(summary)


# -- learning on a tiny CPU model -----------------------------------------------------------------


def make_countdown_model(out: Path) -> Path:
    """A tiny random model whose tokenizer was trained on Countdown questions and answers."""
    from leanrl.testing import make_tiny_model

    texts = []
    for line in (DATA / "countdown_train.jsonl").read_text().splitlines()[:300]:
        r = json.loads(line)
        texts.append(
            f"Using the numbers {r['numbers']}, create an equation that equals "
            f"{r['target']}.\nAnswer: <answer>{r['solution']}</answer>"
        )
    return make_tiny_model(out, texts, vocab_size=400)


@pytest.fixture(scope="module")
def countdown_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_countdown_model(tmp_path_factory.mktemp("cd-model"))


def test_generate_only_doctor_and_setup_need_no_lean(
    countdown_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # All three said Countdown needed Lean: --generate-only refused the harness, doctor listed
    # a missing Lean toolchain and project, setup asked for a Lean project.
    from leanrl.cli import main
    from leanrl.lean.commands import verify_file

    out = tmp_path / "gen"
    rc = main(
        [
            *("eval", "--env", "countdown", "--env.taskset.split", "train", "--limit", "2"),
            *("--model", str(countdown_model), "--samples", "2", "--sampling.max_tokens", "8"),
            *("--env.harness.options", '{"style": "direct"}', "--no-progress"),
            *("--generate-only", "--out", str(out)),
        ]
    )
    said = capsys.readouterr().out
    assert rc == 0, said
    assert "Lean" not in said and "leanrl verify" in said, said
    assert "Lean" not in (out / "report.md").read_text()
    rows = [json.loads(x) for x in (out / "completions.jsonl").read_text().splitlines()]
    assert all(r["proof"] for r in rows)
    env_cfg = load_environment("countdown", split="train").config
    summary = run_sync(verify_file(env_cfg, out / "completions.jsonl", tmp_path / "v.jsonl"))
    assert summary["rows"] == len(rows) and "infra" not in summary["reasons"]

    assert main(["doctor", "--env", "countdown"]) == 0
    said = capsys.readouterr().out
    assert "MISSING" not in said and "needs no Lean" in said, said
    assert main(["doctor", "--env", "countdown", "--print-json"]) == 0
    assert all(c["ok"] for c in json.loads(capsys.readouterr().out))
    assert main(["setup", "--env", "countdown"]) == 0
    said = capsys.readouterr().out
    assert "nothing to set up" in said and "needs no Lean" in said, said


@pytest.mark.parametrize(
    ("style", "answer"),
    [("direct", "{sol}</answer>"), ("think", "</think>\n<answer> {sol} </answer>")],
)
def test_sft_trains_on_countdowns_own_prompt(
    countdown_model: Path, style: str, answer: str
) -> None:
    # SFT built every example with the Lean whole-proof prompt ("Complete the following Lean 4
    # code", the puzzle as a theorem) and a Lean code block as the answer.
    from transformers import AutoTokenizer

    from leanrl.train.sft.data import IGNORE, Pair, encode_pairs

    tok = AutoTokenizer.from_pretrained(countdown_model)
    env = load_environment("countdown", split="train")
    env.config.harness.options.update(style=style)
    task = env.tasks()[0]
    sol = task.extra["solution"]
    [ex] = encode_pairs([Pair(task, "\n" + sol)], env.harness, tok)  # as --data.from_env gives it
    n_prompt = ex["labels"].count(IGNORE)
    prompt = env.harness.prompt(task)  # type: ignore[attr-defined]
    assert tok.decode(ex["input_ids"][:n_prompt]) == prompt
    assert tok.decode(ex["input_ids"][n_prompt:]) == answer.format(sol=sol) + tok.eos_token
    # the model's own text (kept by expert iteration), closed the way generation stopped
    [mine] = encode_pairs(
        [Pair(task, sol, completion=f" {sol}")], env.harness, tok, target="completion"
    )
    assert tok.decode(mine["input_ids"][n_prompt:]) == f" {sol}</answer>" + tok.eos_token


class SolvingPolicy(Policy):
    """Answers every Countdown prompt with the puzzle's known solution."""

    name = "solving"

    def __init__(self, answers: dict[str, str]) -> None:
        super().__init__(PolicyConfig(model="solving"))
        self.answers = answers

    async def generate(
        self, prompts: Sequence[Prompt], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        return [[Completion(text=self.answers[str(p)])] * sampling.n for p in prompts]


def test_expert_iteration_on_countdown_fine_tunes_on_its_own_prompt(
    countdown_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Expert iteration needs no Lean: the environment's checker keeps the right answers. Its SFT
    # phase trained them under the Lean whole-proof prompt, a prompt it never samples with.
    import leanrl.eval.runner as runner
    import leanrl.train.sft.data as sft_data
    from leanrl.train.sft.expert_iteration import ExpertIteration, ExpertIterationConfig

    env_cfg = {"id": "countdown", "taskset": {"split": "train", "limit": 3}}
    env_cfg["harness"] = {"options": {"style": "direct"}}
    env = load_environment(ExpertIterationConfig(env=env_cfg).env)
    harness = env.harness
    answers = {harness.prompt(t): f"{t.extra['solution']}" for t in env.tasks()}  # type: ignore[attr-defined]
    monkeypatch.setattr(runner, "_make_policy", lambda config: SolvingPolicy(answers))
    seen: list[str] = []
    encode = sft_data.encode_pairs

    def spy(pairs: Any, h: Any, tok: Any, **kw: Any) -> Any:
        out = encode(pairs, h, tok, **kw)
        seen.extend(tok.decode(e["input_ids"][: e["labels"].count(sft_data.IGNORE)]) for e in out)
        return out

    monkeypatch.setattr(sft_data, "encode_pairs", spy)
    cfg = ExpertIterationConfig(
        env=env_cfg,
        policy=PolicyConfig(model=str(countdown_model)),
        out=tmp_path / "ei",
        rounds=1,
        samples=1,
        sampling=SamplingConfig(max_tokens=8, seed=0),
        sft={"epochs": 1, "batch_size": 3, "micro_batch_size": 3},
    )
    [row] = ExpertIteration(cfg).train_sync()
    assert row["solved_total"] == 3 and row["sft_pairs"] == 3, row
    assert sorted(seen) == sorted(answers), seen


def test_grpo_learns_countdown_on_cpu(countdown_model: Path, tmp_path: Path) -> None:
    from leanrl.train.grpo import GRPOConfig, GRPOTrainer

    cfg = GRPOConfig(
        env={
            "id": "countdown",
            "taskset": {"split": "train", "limit": 8},
            "harness": {"options": {"style": "direct", "reward": "dense"}},
        },
        policy=PolicyConfig(model=str(countdown_model)),
        sampling=SamplingConfig(max_tokens=16, top_p=1.0, seed=0),
        out=tmp_path / "run",
        steps=50,
        tasks_per_step=4,
        group_size=8,
        lr=5e-3,
        weight_decay=0.0,
        micro_batch_size=32,
        save_every=100,
        mask_truncated=False,
        dynamic_sampling="drop",
    )
    trainer = GRPOTrainer(cfg)
    trainer.train_sync()
    rows = [r for r in trainer.run.metrics() if "reward_mean" in r]
    rewards = [r["reward_mean"] for r in rows]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    # the dense reward starts at ~0.11 (an answer, rarely a given number) and the model learns
    # to put the puzzle's numbers into its answer: about twice the reward after 50 steps
    assert last > first + 0.06, rewards
    assert max(rewards[:5]) < last, rewards


def test_a_misspelt_option_is_refused_before_anything_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from leanrl.cli import main

    args = ["eval", "--env", "countdown", "--model", str(tmp_path / "no-model"), "--limit", "1"]
    assert main([*args, "--env.harness.options", '{"stlye": "direct"}']) == 2
    err = capsys.readouterr().err
    assert "unknown harness option 'stlye'" in err and "did you mean 'style'?" in err, err
    assert "it takes reward, style" in err, err
    env = load_environment("countdown")
    env.config.harness.options.update(style="direct", reward="dense")
    assert env.harness.style == "direct"  # type: ignore[attr-defined]


def test_another_harness_or_a_runtime_is_refused_saying_what_countdown_takes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # They used to be accepted and ignored: the run went on with Countdown's own harness and
    # checker while the config (and the report) named the ones asked for.
    from leanrl.cli import main
    from leanrl.errors import ConfigError

    args = ["eval", "--env", "countdown", "--model", str(tmp_path / "no-model"), "--limit", "1"]
    assert main([*args, "--harness", "tactic-loop"]) == 2
    err = capsys.readouterr().err
    assert "harness 'tactic-loop'" in err and "--harness countdown" in err, err
    assert main([*args, "--runtime", "docker"]) == 2
    err = capsys.readouterr().err
    assert "takes no runtime" in err and "'docker'" in err and "no Lean" in err, err
    # its own names, and the defaults (what an unset field holds), are fine
    for harness, runtime in [("countdown", "countdown"), ("whole-proof", "local")]:
        env = load_environment("countdown", harness=harness, runtime=runtime)
        assert (env.harness.name, env.runtime.name) == ("countdown", "countdown")
    with pytest.raises(ConfigError, match="takes no runtime"):
        _ = load_environment("countdown", runtime="modal").runtime


def test_default_eval_folder_names_no_lean_harness() -> None:
    # Countdown runs its own harness whatever the field holds; the folder used to end in
    # "-whole-proof", a Lean harness it never uses. Lean environments keep the harness in it.
    from leanrl.environment import EnvironmentConfig
    from leanrl.eval.config import EvalConfig

    def out(env_id: str) -> Path:
        cfg = EvalConfig(env=EnvironmentConfig(id=env_id), policy=PolicyConfig(model="org/Qwen"))
        return cfg.out_dir

    assert out("countdown") == Path("runs/countdown-Qwen")
    assert out("minif2f") == Path("runs/minif2f-Qwen-whole-proof")
