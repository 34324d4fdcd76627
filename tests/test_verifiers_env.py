"""verifiers in leanrl: the ``verifiers`` environment wraps a verifiers (v1) taskset.

The taskset is tests/_vf_letters.py, a small real verifiers taskset (real ``vf.Taskset``,
``vf.Task``, ``@vf.reward`` functions, scored by verifiers' own ``Task.score``), loaded by its id
through verifiers' plugin loader. No network, no Lean. The trainers run a few CPU steps on a tiny
random model: what is tested is that the rubric's rewards drive them, not that they learn.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from _scripted_runtime import ScriptedPolicy

from leanrl import load_environment
from leanrl.errors import ConfigError
from leanrl.policy import PolicyConfig, SamplingConfig
from leanrl.verdict import Reason

if importlib.util.find_spec("verifiers") is None:
    pytest.skip(
        "verifiers is not installed (pip install -e '.[verifiers]', Python 3.11+)",
        allow_module_level=True,
    )

import verifiers.v1  # noqa: F401  (its import takes seconds: paid once, at collection)


def env_config(count: int = 2, **taskset: Any) -> dict[str, Any]:
    return {
        "id": "verifiers",
        "harness": {"options": {"env": "_vf_letters", "taskset": {"count": count, **taskset}}},
    }


def make_env(count: int = 2, **taskset: Any) -> Any:
    cfg = env_config(count, **taskset)
    return load_environment("verifiers", harness=cfg["harness"])


def rollouts(env: Any, texts: list[str]) -> list[list[Any]]:
    async def go() -> list[list[Any]]:
        async with env:
            return await env.rollout(
                env.tasks(), ScriptedPolicy(texts), SamplingConfig(n=len(texts))
            )

    return asyncio.run(go())


@pytest.mark.slow  # the first load through verifiers' plugin loader
def test_tasks_and_prompts_come_from_the_verifiers_taskset() -> None:
    env = make_env(3)
    assert env.needs_lean is False
    tasks = env.tasks()
    assert [t.id for t in tasks] == ["letters-0-cat", "letters-1-dog", "letters-2-owl"]
    assert [t.name for t in tasks] == ["say_cat", "say_dog", "say_owl"]
    assert tasks[0].informal_statement == "Say the word cat."
    prompt = env.harness.prompt(tasks[0])
    assert [(m.role, m.content) for m in prompt] == [
        ("system", "Answer with one word."),
        ("user", "Say the word cat."),
    ]
    assert len(make_env(5).tasks()) == 5
    assert (
        len(load_environment("verifiers", harness=env_config(5)["harness"], limit=2).tasks()) == 2
    )


def test_the_reward_is_the_verifiers_rubrics_and_solved_means_reaching_solved_at() -> None:
    (cat, dog) = rollouts(make_env(2), ["cat", "c", "zzz"])
    # letters: half the share of the word's letters in the reply; exact: 0.5 for the word
    assert [r.reward for r in cat] == pytest.approx([1.0, 1 / 6, 0.0])
    assert [r.verdict.accepted for r in cat] == [True, False, False]
    assert cat[1].verdict.reason is Reason.ERROR and "solved_at 1" in cat[1].verdict.detail
    assert cat[0].meta["verifiers_rewards"]["exact"] == {"score": 0.5, "weight": 1.0}
    assert cat[0].meta["verifiers_metrics"] == {"reply_chars": 3.0}
    assert [r.reward for r in dog] == [0.0, 0.0, 0.0]
    # the policy's own turn is the rollout's token data (what the trainers train on)
    assert cat[0].turns[0].completion == "cat" and cat[0].proof == "cat"
    env = load_environment(
        "verifiers",
        harness={"options": {"env": "_vf_letters", "taskset": {"count": 1}, "solved_at": 0.1}},
    )
    (only,) = rollouts(env, ["c"])
    assert only[0].verdict.accepted  # 1/6 >= 0.1


def test_a_rubric_that_cannot_score_is_an_infra_verdict_not_a_zero() -> None:
    (cat,) = rollouts(make_env(1, broken=True), ["cat"])
    assert cat[0].verdict.reason is Reason.INFRA
    assert "the judge is down" in cat[0].verdict.detail


def test_bad_configs_are_refused_saying_what_to_give() -> None:
    with pytest.raises(ConfigError, match="needs the taskset to wrap"):
        load_environment("verifiers").tasks()
    with pytest.raises(ConfigError, match="cannot be loaded"):
        load_environment("verifiers", harness={"options": {"env": "no-such-vf-env"}}).tasks()
    with pytest.raises(ConfigError, match="has its own harness"):
        _ = load_environment("verifiers", harness="tactic-loop").harness
    with pytest.raises(ConfigError, match="unknown harness option 'tasket'"):
        _ = load_environment(
            "verifiers", harness={"options": {"env": "_vf_letters", "tasket": {}}}
        ).harness


# -- the trainers, a few CPU steps on a tiny model ---------------------------------------------


@pytest.fixture(scope="module")
def letters_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from leanrl.testing import make_tiny_model

    words = ["cat", "dog", "owl", "emu", "yak", "ant"]
    texts = [f"Answer with one word. Say the word {w}. {w}" for w in words] * 20
    return make_tiny_model(tmp_path_factory.mktemp("vf-model"), texts, vocab_size=300)


def _reward_rows(run: Path) -> list[dict[str, Any]]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r for r in rows if "reward_mean" in r]


@pytest.mark.slow  # a few trainer steps on CPU
def test_grpo_trains_on_a_verifiers_taskset(letters_model: Path, tmp_path: Path) -> None:
    from leanrl.train.grpo import GRPOConfig, GRPOTrainer

    cfg = GRPOConfig(
        env=env_config(4),  # type: ignore[arg-type]
        policy=PolicyConfig(model=str(letters_model)),
        sampling=SamplingConfig(max_tokens=6, top_p=1.0, seed=0),
        out=tmp_path / "run",
        steps=2,
        tasks_per_step=2,
        group_size=4,
        lr=1e-3,
        micro_batch_size=16,
        save_every=100,
    )
    trainer = GRPOTrainer(cfg)
    trainer.train_sync()
    rows = _reward_rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    # the rubric's dense reward reached the trainer: a random model gets some letters right
    assert all(0.0 <= r["reward_mean"] <= 1.0 for r in rows)
    assert any(r["reward_mean"] > 0 for r in rows), rows


@pytest.mark.slow  # a few trainer steps on CPU
def test_es_trains_on_a_verifiers_taskset(letters_model: Path, tmp_path: Path) -> None:
    from leanrl.train.es import ESConfig, ESTrainer

    cfg = ESConfig(
        env=env_config(4),  # type: ignore[arg-type]
        policy=PolicyConfig(model=str(letters_model)),
        sampling=SamplingConfig(max_tokens=6, seed=0),
        out=tmp_path / "run",
        steps=2,
        tasks_per_step=2,
        population=2,
        greedy=False,
        save_every=100,
    )
    ESTrainer(cfg).train_sync()
    rows = _reward_rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    assert any(r["reward_mean"] > 0 for r in rows), rows


@pytest.mark.slow  # an eval round and an SFT epoch on CPU
def test_expert_iteration_keeps_solved_tasks_and_fine_tunes_on_the_verifiers_prompt(
    letters_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import leanrl.eval.runner as runner
    import leanrl.train.sft.data as sft_data
    from leanrl.train.sft.expert_iteration import ExpertIteration, ExpertIterationConfig

    def say(prompt: Any, sample: int) -> str:  # the word the user turn asks for
        return str(prompt[-1].content).removeprefix("Say the word ").removesuffix(".")

    monkeypatch.setattr(runner, "_make_policy", lambda config: ScriptedPolicy([], pick=say))
    seen: list[str] = []
    encode = sft_data.encode_pairs

    def spy(pairs: Any, h: Any, tok: Any, **kw: Any) -> Any:
        out = encode(pairs, h, tok, **kw)
        seen.extend(tok.decode(e["input_ids"]) for e in out)
        return out

    monkeypatch.setattr(sft_data, "encode_pairs", spy)
    cfg = ExpertIterationConfig(
        env=env_config(3),  # type: ignore[arg-type]
        policy=PolicyConfig(model=str(letters_model)),
        out=tmp_path / "ei",
        rounds=1,
        samples=1,
        sampling=SamplingConfig(max_tokens=8, seed=0),
        sft={"epochs": 1, "batch_size": 3, "micro_batch_size": 3},  # type: ignore[arg-type]
    )
    [row] = ExpertIteration(cfg).train_sync()
    assert row["solved_total"] == 3 and row["sft_pairs"] == 3, row
    # trained on the verifiers task's own prompt (system and user turns) and the kept reply
    assert sorted(seen) == [
        "<|im_start|>system\nAnswer with one word.<|im_end|>\n<|im_start|>user\n"
        f"Say the word {w}.<|im_end|>\n<|im_start|>assistant\n{w}<|im_end|>\n"
        for w in ("cat", "dog", "owl")
    ], seen


@pytest.mark.slow  # two short trainings and three held-out evals on CPU
def test_compare_runs_es_and_grpo_on_a_verifiers_taskset(
    letters_model: Path, tmp_path: Path
) -> None:
    from leanrl.compare import CompareConfig, run_compare

    held_out = env_config(2, offset=4)  # yak, ant: words the runs never train on
    cfg = CompareConfig.model_validate(
        {
            "env": env_config(4),
            "eval_env": held_out,
            "eval_limit": 2,
            "eval_every": 1,
            "policy": {"model": str(letters_model), "device": "cpu"},
            "sampling": {"max_tokens": 6, "temperature": 1.0, "top_p": 1.0, "seed": 0},
            "budget": {"tokens": 60},
            "tasks_per_step": 2,
            "es": {"population": 2, "sigma": 0.02, "alpha": 0.02},
            "grpo": {"group_size": 2, "lr": 1e-3, "mask_truncated": False},
            "seeds": [0],
            "out": str(tmp_path / "cmp"),
        }
    )
    report = run_compare(cfg)
    assert {r["method"] for r in report["runs"]} == {"es", "grpo"}
    for r in report["runs"]:
        rows = _reward_rows(Path(r["run"]))
        assert rows and all(0.0 <= x["reward_mean"] <= 1.0 for x in rows)
        assert r["tokens"] > 0 and r["acc_start"] is not None
    assert "ES vs GRPO on verifiers" in (tmp_path / "cmp" / "report.md").read_text()
