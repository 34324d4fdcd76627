"""ES trainer behaviour around its inputs: rewards, sampling seeds, skipped updates, checkpoints.

A scripted scorer (rewards given by the test) drives the trainer where the rewards themselves are
the point; the toy environment of ``test_es_learning`` is used where the real scoring path is.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from test_es_learning import toy_config

from leanrl.errors import ConfigError, LeanNotFoundError
from leanrl.runtime import run_sync
from leanrl.train.es import ESConfig, ESTrainer
from leanrl.train.es.history import ESHistory, checkpoint_usable, replay
from leanrl.train.es.weights import MASTER_FILE, ESWeights
from leanrl.train.es.workers import IterationState, Member, MemberScore


class ScriptedScorer:
    """Answers each iteration with the next list of member rewards (one task per rollout; None:
    the checker could not judge the member's one attempt, verdict ``infra``)."""

    def __init__(self, rewards: list[list[float | None]]) -> None:
        self.rewards = list(rewards)
        self.states: list[IterationState] = []

    async def start(self) -> None:
        return None

    async def score(self, state: IterationState, members: Sequence[Member]) -> list[MemberScore]:
        self.states.append(state)
        row = self.rewards.pop(0)
        assert len(row) == len(members)
        tid = str(state.tasks[0].id)
        return [
            MemberScore(reward=r, pass_rate=0.0, rewards=[r], task_ids=[tid])
            if r is not None
            else MemberScore(reward=0.0, pass_rate=0.0, infra=1)
            for r in row
        ]

    async def close(self) -> None:
        return None


def run_steps(cfg: ESConfig, scorer: Any, n: int) -> tuple[ESTrainer, list[dict[str, Any]]]:
    tr = ESTrainer(cfg, scorer=scorer)

    async def go() -> list[dict[str, Any]]:
        await tr.start()
        try:
            return [await tr.step() for _ in range(n)]
        finally:
            await tr.close()

    return tr, run_sync(go())


@pytest.mark.parametrize(
    "rewards",
    [[-math.inf] * 4, [0.0, math.nan, 1.0, 0.5], [0.0, -math.inf, 1.0, 0.5]],
)
def test_non_finite_reward_is_an_error_naming_member_and_task(
    tiny_model_dir: Path, tmp_path: Path, rewards: list[float]
) -> None:
    cfg = toy_config(tiny_model_dir, tmp_path / "r", population=4, save_every=100)
    bad = next(i for i, r in enumerate(rewards) if not math.isfinite(r))
    with pytest.raises(ConfigError, match=rf"member {bad} .*task .*must return finite rewards"):
        run_steps(cfg, ScriptedScorer([rewards]), 1)
    # nothing was recorded: the history has no iteration, the run can be fixed and resumed
    assert ESHistory(tmp_path / "r" / "es_history.bin").open(read_only=True) == []


def test_mirrored_pairs_scoring_alike_are_a_skipped_update(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    cfg = toy_config(tiny_model_dir, tmp_path / "m", population=4, mirrored=True, save_every=100)
    # each seed's +σε and -σε twins score the same: every coefficient is exactly 0
    _, rows = run_steps(cfg, ScriptedScorer([[1.0, 1.0, 0.0, 0.0]]), 1)
    assert rows[0]["skipped"] is True and rows[0]["update_norm"] == 0.0
    rec = ESHistory(tmp_path / "m" / "es_history.bin").open(read_only=True)
    assert [(r.skipped, r.coeffs) for r in rec] == [(True, ())]


def test_a_member_with_only_infra_attempts_has_no_say(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A member whose attempts the checker could not judge has no reward: it is left out of the
    shaping and of the update, which is the one the judged members alone would give."""
    from leanrl.train.es.trainer import es_coefficients, population, shape_rewards

    cfg = toy_config(tiny_model_dir, tmp_path / "i", population=4, save_every=100)
    _, rows = run_steps(cfg, ScriptedScorer([[1.0, None, 0.0, 1.0]]), 1)
    members = population(cfg, 1)
    z = shape_rewards([1.0, 0.0, 1.0]) or []
    want = es_coefficients(members, [z[0], 0.0, z[1], z[2]], cfg.lr, n=3)
    rec = ESHistory(tmp_path / "i" / "es_history.bin").open(read_only=True)
    assert list(rec[0].coeffs) == want and dict(want)[members[1].seed] == 0.0
    assert dict(want)[members[0].seed] == pytest.approx(cfg.lr / 3 * z[0], rel=1e-6)
    assert rows[0]["members_judged"] == 3 and rows[0]["population"] == 4
    assert rows[0]["reward_mean"] == pytest.approx(2 / 3) and rows[0]["reward_min"] == 0.0
    assert (rows[0]["infra"], rows[0]["infra_frac"]) == (1, 0.25)
    # one judged member left: nothing to compare it with, no update
    _, rows = run_steps(
        toy_config(tiny_model_dir, tmp_path / "j", population=4, save_every=100),
        ScriptedScorer([[None, None, 0.5, None]]),
        1,
    )
    assert rows[0]["skipped"] is True and rows[0]["reward_mean"] == 0.5


class TokenScorer(ScriptedScorer):
    """A scripted scorer whose every member generated ``tokens`` tokens."""

    def __init__(self, rewards: list[list[float | None]], tokens: int) -> None:
        super().__init__(rewards)
        self.tokens = tokens

    async def score(self, state: IterationState, members: Sequence[Member]) -> list[MemberScore]:
        got = await super().score(state, members)
        return [dataclasses.replace(s, tokens=self.tokens) for s in got]


def test_a_spent_budget_says_so_in_the_log_the_row_and_the_summary(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """4 members x 10 tokens an iteration against a budget of 100 tokens: the run stops after
    iteration 3 and says so in one line, in that iteration's row and in summary.json; rerun
    with the same budget, it trains nothing and says why."""
    import json
    import logging

    cfg = toy_config(tiny_model_dir, tmp_path / "b", population=4, steps=10, budget={"tokens": 100})
    rewards: list[list[float | None]] = [[0.0, 1.0, 2.0, 3.0]] * 3
    with caplog.at_level(logging.INFO, logger="leanrl"):
        rows = ESTrainer(cfg, scorer=TokenScorer(rewards, 10)).train_sync()
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert "budget spent: 120 generated tokens of 100; stopping after iteration 3" in (
        caplog.messages
    )
    assert [r.get("budget_spent") for r in rows] == [None, None, True]
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert summary["budget"]["spent"] is True and summary["budget"]["total_tokens"] == 120
    assert summary["budget"]["tokens"] == 100 and summary["steps"] == 3
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="leanrl"):
        assert ESTrainer(cfg, scorer=TokenScorer([], 10)).train_sync() == []
    said = "budget already spent: 120 generated tokens of 100 at iteration 3; nothing to train"
    assert [m for m in caplog.messages if m.startswith(said)], caplog.messages


@pytest.mark.usefixtures("no_lean")
def test_no_lean_fails_before_the_weights_load(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An environment that needs Lean, on a machine without it: the runtime's own error,
    before the model is loaded."""

    def load(*a: Any, **kw: Any) -> None:
        raise AssertionError("the model was loaded before Lean was looked for")

    monkeypatch.setattr("leanrl.train.es.trainer.load_weights", load)
    toy = Path(__file__).parent / "fixtures" / "toy_tasks.jsonl"
    env = {"id": "dataset", "taskset": {"path": str(toy), "split": "train"}}
    cfg = toy_config(tiny_model_dir, tmp_path / "run", population=4, env=env)
    with pytest.raises(LeanNotFoundError, match="leanrl setup"):
        ESTrainer(cfg).train_sync()
    assert not (tmp_path / "run" / "summary.json").exists()  # no run, no summary of one


def test_update_norm_is_none_without_trainer_weights(tiny_model_dir: Path, tmp_path: Path) -> None:
    """With the vLLM scorer the trainer holds no weights: the norm is unknown, not 0."""
    cfg = toy_config(
        tiny_model_dir, tmp_path / "v", population=4, save_every=100, scorer={"backend": "vllm"}
    )
    tr, rows = run_steps(cfg, ScriptedScorer([[0.0, 1.0, 2.0, 3.0]]), 1)
    assert tr.weights is None
    assert rows[0]["update_norm"] is None and rows[0]["skipped"] is False
    assert tr.run.metrics()[0]["update_norm"] is None
    assert ESHistory(tmp_path / "v" / "es_history.bin").open(read_only=True)[0].coeffs


def test_sampling_uses_one_seed_per_iteration(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """greedy = false: every member of an iteration samples with the same seed (common random
    numbers), at the configured temperature; the seed changes between iterations."""
    from leanrl.train.es.policy import TorchPolicy

    calls: list[tuple[int | None, float]] = []
    real = TorchPolicy.generate_sync

    def spy(self: TorchPolicy, prompts: Any, sampling: Any) -> Any:
        calls.append((sampling.seed, sampling.temperature))
        return real(self, prompts, sampling)

    monkeypatch.setattr(TorchPolicy, "generate_sync", spy)
    cfg = toy_config(
        tiny_model_dir,
        tmp_path / "s",
        population=4,
        steps=2,
        greedy=False,
        sampling={"temperature": 0.7, "max_tokens": 3},
    )
    ESTrainer(cfg).train_sync()
    assert len(calls) == 8  # 2 iterations x 4 members, one generate call each
    it1, it2 = calls[:4], calls[4:]
    assert len(set(it1)) == 1 and len(set(it2)) == 1
    assert it1[0][1] == 0.7 and it1[0][0] is not None
    assert it1[0][0] != it2[0][0]


def test_master_is_written_before_the_checkpoint_is_published(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kill while the fp32 master is written must leave the previous checkpoint usable and no
    new, master-less checkpoint folder."""
    cfg = toy_config(tiny_model_dir, tmp_path / "bf", steps=3, save_every=1, keep_checkpoints=1)
    cfg = cfg.model_copy(update={"policy": cfg.policy.model_copy(update={"dtype": "bfloat16"})})
    tr = ESTrainer(cfg)
    real = ESWeights.save_master
    n = {"calls": 0}

    def dies_on_second(self: ESWeights, path: Path) -> None:
        n["calls"] += 1
        if n["calls"] == 2:
            real(self, path.with_name("partial"))  # a half-written master...
            raise KeyboardInterrupt("killed while writing the master")  # ...and the kill
        real(self, path)

    monkeypatch.setattr(ESWeights, "save_master", dies_on_second)
    with pytest.raises(KeyboardInterrupt):
        tr.train_sync()
    cks = tr.run.checkpoints()
    assert [s for s, _ in cks] == [1]  # checkpoint-2 never appeared, checkpoint-1 kept
    assert checkpoint_usable(cks[0][1]) and (cks[0][1] / MASTER_FILE).is_file()
    assert list(tr.run.path.glob(".tmp-checkpoint-*"))  # the interrupted save's leftover
    # the resumed run finishes, and the leftover of the crashed save is cleaned up
    monkeypatch.setattr(ESWeights, "save_master", real)
    resumed = ESTrainer(cfg)
    resumed.train_sync()
    assert not list(tr.run.path.glob(".tmp-checkpoint-*"))
    assert [s for s, _ in resumed.run.checkpoints()] == [3]
    _, _, w = replay(tr.run.path, use_checkpoints=False)
    assert all(w.master[k].equal(resumed.weights.master[k]) for k in w.master)


def test_config_rejects_a_policy_backend_es_cannot_train(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"policy\.backend = 'hf'"):
        ESConfig(policy={"model": str(tiny_model_dir), "backend": "openai"})
    with pytest.raises(ValueError, match=r"policy\.backend = 'hf'"):
        ESConfig(
            policy={"model": str(tiny_model_dir), "backend": "vllm"},
            scorer={"backend": "processes"},
        )
    with pytest.raises(ValueError, match="cannot be trained"):
        ESConfig(policy={"backend": "openai"}, scorer={"backend": "vllm"})
    ESConfig(policy={"backend": "vllm"}, scorer={"backend": "vllm"})  # the engine runs it


def test_a_start_that_failed_before_its_first_iteration_leaves_the_folder_usable(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model would not load after the folder was bound: the rerun with the fix (here, a
    different sigma) must start, not be refused as "a run with a different config"."""

    class Boom(RuntimeError):
        pass

    def load(*a: Any, **kw: Any) -> None:
        raise Boom("the weights would not load")

    monkeypatch.setattr("leanrl.train.es.trainer.load_weights", load)
    out = tmp_path / "run"
    with pytest.raises(Boom):
        ESTrainer(toy_config(tiny_model_dir, out, sigma=0.02)).train_sync()
    assert (out / "config.json").is_file() and (out / "es_history.bin").is_file()
    with pytest.raises(Boom):  # got past bind_config: the failed start held nothing
        ESTrainer(toy_config(tiny_model_dir, out, sigma=0.05)).train_sync()
    assert '"sigma": 0.05' in (out / "config.json").read_text()


def test_a_run_with_an_iteration_still_refuses_another_config(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    cfg = toy_config(tiny_model_dir, out, steps=1, save_every=5)
    run_steps(cfg, ScriptedScorer([[1.0, 0.0, 0.5, 0.2, 0.1, 0.3]]), 1)
    assert len(ESHistory(out / "es_history.bin").open(read_only=True)) == 1
    with pytest.raises(ConfigError, match="different config"):
        ESTrainer(toy_config(tiny_model_dir, out, steps=1, sigma=0.05)).train_sync()
