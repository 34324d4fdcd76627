"""Difficulty-aware task sampling (leanrl.train.curriculum): the table, the samplers, resume,
warm start, and the GRPO and expert-iteration wiring."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
from test_grpo_trainer import DigitEnv, PromptHarness, _config, _Crash, _train

from leanrl import Harness, Rollout, Task, load_environment
from leanrl.errors import ConfigError
from leanrl.policy import Policy, SamplingConfig
from leanrl.runtime import Runtime
from leanrl.taskset import Taskset
from leanrl.train.common import RunDir, batch_for_step
from leanrl.train.curriculum import (
    DIFFICULTY_FILE,
    Curriculum,
    CurriculumConfig,
    DifficultyTable,
    TaskCounts,
)
from leanrl.verdict import Reason, Verdict


def tasks(n: int) -> list[Task]:
    return [
        Task(id=f"t{i}", name=f"t{i}", header="", formal_statement=f"theorem t{i} : True := by")
        for i in range(n)
    ]


def cur(mode: str, ts: Sequence[Task], tmp: Path, **kw: Any) -> Curriculum:
    return Curriculum.open(CurriculumConfig(mode=mode, **kw), ts, tmp, before=0)  # type: ignore[arg-type]


def outcomes(task_id: str, passes: int, fails: int) -> list[tuple[str, bool, float]]:
    return [(task_id, True, 1.0)] * passes + [(task_id, False, 0.0)] * fails


# -- the table -------------------------------------------------------------------------------------


def test_table_records_replaces_saves_and_loads(tmp_path: Path) -> None:
    t = DifficultyTable()
    t.record(0, outcomes("a", 1, 3))
    t.record(1, outcomes("a", 2, 0) + outcomes("b", 0, 2))
    t.record(1, outcomes("a", 1, 1))  # step 1 redone: its first record is replaced
    c = t.counts()
    assert (c["a"].attempts, c["a"].passes) == (6, 2) and "b" not in c
    assert t.counts(before=1)["a"] == TaskCounts(4, 1, 1.0)
    path = tmp_path / DIFFICULTY_FILE
    t.save(path)
    back = DifficultyTable.load(path)
    assert back.counts() == c and back.written_at == 2
    back.fold(1)  # step 0 into the base: the totals stay, step 0 can no longer be taken back
    assert back.counts() == c and back.base_before == 1 and list(back.steps) == [1]
    with pytest.raises(ValueError, match="folded"):
        back.rollback(0)


def test_save_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import leanrl.train.common as common

    path = tmp_path / DIFFICULTY_FILE
    t = DifficultyTable()
    t.record(0, outcomes("a", 1, 0))
    t.save(path)
    before = path.read_text()

    def boom(src: Any, dst: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(common.os, "replace", boom)
    t.record(1, outcomes("a", 0, 5))
    with pytest.raises(Exception):  # noqa: B017 - disk_errors names the file; any error will do
        t.save(path)
    assert path.read_text() == before  # the old table, whole
    assert DifficultyTable.load(path).counts()["a"].attempts == 1


def test_damaged_table_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / DIFFICULTY_FILE).write_text('{"format": 1, "base": ')
    with pytest.raises(ConfigError, match=r"difficulty.json is damaged.*delete it"):
        cur("pools", tasks(4), tmp_path)


# -- resume ----------------------------------------------------------------------------------------


def _fake_checkpoint(run: Path, step: int) -> None:
    folder = run / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"step": step}))


def test_resume_repeats_the_next_batch_and_counts_nothing_twice(tmp_path: Path) -> None:
    ts = tasks(12)
    kw = dict(min_attempts=2, easy_fraction=0.25, hard_fraction=0.25)

    def attempts(step: int) -> list[tuple[str, bool, float]]:
        out: list[tuple[str, bool, float]] = []
        for i, t in enumerate(ts):  # t0-t3 always solved, t8-t11 never, the rest half the time
            out += (
                outcomes(t.id, 2, 0)
                if i < 4
                else outcomes(t.id, 0, 2)
                if i >= 8
                else outcomes(t.id, 1, 1)
            )
        return out[: 6 * (step + 1)]  # each step sees a different slice

    straight = cur("pools", ts, tmp_path / "a", **kw)
    batches = []
    for s in range(6):
        batches.append([t.id for t in straight.select(s, 4, seed=3)])
        straight.record(s, attempts(s))

    run = tmp_path / "b"
    first = cur("pools", ts, run, **kw)
    for s in range(5):  # steps 0-4 recorded, but the last checkpoint is after step 2
        first.select(s, 4, seed=3)
        first.record(s, attempts(s))
        if s == 1:
            _fake_checkpoint(run, 2)  # written after steps 0 and 1: resume at step 2
    saved = json.loads((run / DIFFICULTY_FILE).read_text())
    assert saved["step"] == 5 and saved["base_before"] == 2  # steps < the oldest checkpoint folded
    again = Curriculum.open(CurriculumConfig(mode="pools", **kw), ts, run, before=2)
    assert again.table is not None and again.table.written_at == 2  # steps 2-4 taken back
    assert json.loads((run / DIFFICULTY_FILE).read_text())["step"] == 2  # and on disk at once
    for s in range(2, 6):
        assert [t.id for t in again.select(s, 4, seed=3)] == batches[s]
        again.record(s, attempts(s))
    assert again.table.counts() == straight.table.counts()  # type: ignore[union-attr]
    total = sum(c.attempts for c in again.table.counts().values())
    assert total == sum(len(attempts(s)) for s in range(6))  # no attempt twice


def test_a_run_started_over_rebuilds_from_the_warm_start(tmp_path: Path) -> None:
    t = DifficultyTable(steps={})
    t.record(0, outcomes("t0", 3, 0))
    t.record(1, outcomes("t0", 3, 0))
    t.fold(2)
    t.save(tmp_path / DIFFICULTY_FILE)
    # every checkpoint was damaged: the trainer starts over at 0, and so does the table
    c = Curriculum.open(CurriculumConfig(mode="pools"), tasks(2), tmp_path, before=0)
    assert c.table is not None and c.table.counts() == {}


# -- the samplers ----------------------------------------------------------------------------------


def test_off_is_batch_for_step_and_keeps_no_table(tmp_path: Path) -> None:
    ts = tasks(7)
    c = cur("off", ts, tmp_path)
    for seed in (0, 5):
        for s in range(10):
            assert c.select(s, 3, seed) == batch_for_step(ts, s, 3, seed)
    c.record(0, outcomes("t0", 1, 0))
    assert c.metrics(0) == {} and not (tmp_path / DIFFICULTY_FILE).exists()


def test_drop_solved_drops_tasks_above_the_threshold(tmp_path: Path) -> None:
    ts = tasks(4)
    c = cur("drop_solved", ts, tmp_path, easy_above=0.5, min_attempts=4)
    c.record(0, outcomes("t0", 3, 1) + outcomes("t1", 2, 2) + outcomes("t2", 0, 4))
    c.record(
        0, outcomes("t0", 3, 1) + outcomes("t1", 2, 2) + outcomes("t2", 0, 4) + outcomes("t3", 3, 0)
    )
    # t0: 0.75 > 0.5 dropped; t1: exactly 0.5 kept; t2: never solved, kept; t3: 3 < 4 attempts
    drawn = Counter(t.id for s in range(1, 30) for t in c.select(s, 5, seed=0))
    assert "t0" not in drawn and set(drawn) == {"t1", "t2", "t3"}
    assert c.metrics(1) == {
        "curriculum/easy": 1,
        "curriculum/frontier": 2,
        "curriculum/hard": 1,
        "curriculum/unseen": 1,
        "curriculum/dropped": 1,
    }
    # before step 1 nothing was known: nothing dropped
    assert "t0" in {t.id for s in range(5) for t in c.select(0, 4, seed=s)}


def test_drop_solved_with_everything_solved_draws_from_all(tmp_path: Path) -> None:
    ts = tasks(3)
    c = cur("drop_solved", ts, tmp_path, min_attempts=1)
    c.record(0, [o for t in ts for o in outcomes(t.id, 2, 0)])
    assert len(c.select(1, 4, seed=0)) == 4  # a batch, not an empty step


def _three_pools(c: Curriculum, easy: int, front: int, hard: int) -> None:
    got: list[tuple[str, bool, float]] = []
    for i in range(easy + front + hard):
        p = 4 if i < easy else 0 if i >= easy + front else 2
        got += outcomes(f"t{i}", p, 4 - p)
    c.record(0, got)


def test_pools_meet_their_target_fractions(tmp_path: Path) -> None:
    kw = dict(easy_fraction=0.2, hard_fraction=0.3, min_attempts=4)
    c = cur("pools", tasks(30), tmp_path / "a", **kw)
    _three_pools(c, 10, 10, 10)  # t0-t9 easy, t10-t19 frontier, t20-t29 hard
    for s in range(1, 20):
        batch = c.select(s, 10, seed=s)
        kinds = Counter(
            "e" if int(t.id[1:]) < 10 else "h" if int(t.id[1:]) >= 20 else "f" for t in batch
        )
        assert kinds == {"e": 2, "f": 5, "h": 3} and len({t.id for t in batch}) == 10
    assert c.metrics(1)["curriculum/hard"] == 10


def test_a_short_pool_gives_its_share_to_the_others(tmp_path: Path) -> None:
    c = cur("pools", tasks(12), tmp_path / "a", easy_fraction=0.2, hard_fraction=0.3)
    _three_pools(c, 10, 1, 1)  # one frontier task, one hard: the easy pool fills the rest
    batch = c.select(1, 10, seed=0)
    ids = Counter(int(t.id[1:]) for t in batch)
    assert ids[10] == 1 and ids[11] == 1 and sum(ids[i] for i in range(10)) == 8
    small = cur("pools", tasks(3), tmp_path / "b")
    assert len(small.select(0, 8, seed=0)) == 8  # fewer tasks than a batch: drawn again


def test_frontier_is_drawn_frontier_weight_times_as_often(tmp_path: Path) -> None:
    c = cur("frontier", tasks(5), tmp_path, frontier_weight=4.0, min_attempts=2)
    # t0 on the frontier (half solved); t1, t2 easy; t3, t4 hard
    c.record(
        0,
        outcomes("t0", 1, 1)
        + outcomes("t1", 2, 0)
        + outcomes("t2", 2, 0)
        + outcomes("t3", 0, 2)
        + outcomes("t4", 0, 2),
    )
    drawn = Counter(c.select(s, 1, seed=0)[0].id for s in range(1, 4001))
    # one draw: P(t0) = 4 / (4 + 4 * 1) = 0.5, each other 0.125
    assert abs(drawn["t0"] / 4000 - 0.5) < 0.03, drawn
    assert all(abs(drawn[f"t{i}"] / 4000 - 0.125) < 0.03 for i in range(1, 5)), drawn


def test_bad_settings_say_what_to_change() -> None:
    with pytest.raises(ValueError, match="must be below"):
        CurriculumConfig(easy_above=0.2, hard_at_most=0.2)
    with pytest.raises(ValueError, match="is over 1"):
        CurriculumConfig(easy_fraction=0.6, hard_fraction=0.6)


# -- warm start ------------------------------------------------------------------------------------


def _results(path: Path) -> Path:
    ok = {"accepted": True, "reward": 1.0, "verdict": {"accepted": True, "reason": "ok"}}
    bad = {"accepted": False, "reward": 0.0, "verdict": {"accepted": False, "reason": "error"}}
    rows = [
        *({"task_id": "t0", "sample": i, **ok} for i in range(4)),
        *({"task_id": "t1", "sample": i, **bad} for i in range(4)),
        {"task_id": "t1", "sample": 9, "accepted": False, "verdict": {"reason": "infra"}},
        {"task_id": "t2", "sample": 0, "accepted": False, "verdict": None},  # never checked
        {"task_id": "t0", "sample": 0, **ok},  # the same attempt again: once
        {"task_id": "other", "sample": 0, **ok},  # not a training task
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + '\n{"task_id": "t2", "sam')
    return path


def test_warm_start_from_an_evals_results(tmp_path: Path) -> None:
    ws = _results(tmp_path / "results.jsonl")
    c = cur("drop_solved", tasks(3), tmp_path / "run", warm_start=ws, min_attempts=4)
    counts = c.table.counts()  # type: ignore[union-attr]
    assert counts["t0"] == TaskCounts(4, 4, 4.0) and counts["t1"] == TaskCounts(4, 0, 0.0)
    assert set(counts) == {"t0", "t1"}
    assert {t.id for s in range(10) for t in c.select(s, 2, seed=0)} == {"t1", "t2"}
    with pytest.raises(ConfigError, match="no attempt at a training task"):
        cur(
            "pools",
            [Task(id="zz", name="zz", header="", formal_statement="x")],
            tmp_path / "r2",
            warm_start=ws,
        )
    with pytest.raises(ConfigError, match="cannot be read"):
        cur("pools", tasks(2), tmp_path / "r3", warm_start=tmp_path / "missing.jsonl")


# -- configuration ---------------------------------------------------------------------------------


def test_config_from_toml_and_cli(tmp_path: Path) -> None:
    from leanrl.cli import parse_command
    from leanrl.train.grpo.cli import GRPOCommand
    from leanrl.train.sft.expert_iteration_cli import ExpertIterationCommand

    toml = tmp_path / "c.toml"
    toml.write_text(
        '[curriculum]\nmode = "pools"\neasy_fraction = 0.25\nwarm_start = "ev/results.jsonl"\n'
    )
    cmd = parse_command(GRPOCommand, ["--config", str(toml), "--curriculum.hard_fraction", "0.5"])
    cfg = cmd.to_grpo_config()
    assert cfg.curriculum.mode == "pools" and cfg.curriculum.easy_fraction == 0.25
    assert cfg.curriculum.hard_fraction == 0.5 and cfg.curriculum.warm_start == Path(
        "ev/results.jsonl"
    )
    ei = parse_command(
        ExpertIterationCommand, ["--curriculum.mode", "drop_solved", "--tasks_per_round", "3"]
    ).to_config()
    assert ei.curriculum.mode == "drop_solved" and ei.tasks_per_round == 3
    from leanrl.train.grpo import GRPOConfig

    assert GRPOConfig().curriculum.mode == "off"  # the default replays existing runs


# -- GRPO ------------------------------------------------------------------------------------------


class FixedHarness(PromptHarness):
    """Task t0-t1 always solved, t6-t7 never, the rest by the digit reward; records task ids."""

    name = "test-fixed"
    seen: ClassVar[list[str]] = []

    async def run(
        self,
        tasks: Sequence[Task],
        policy: Policy,
        runtime: Runtime,
        sampling: SamplingConfig,
        taskset: Taskset,
    ) -> list[list[Rollout]]:
        groups = await super().run(tasks, policy, runtime, sampling, taskset)
        for task, g in zip(tasks, groups, strict=True):
            FixedHarness.seen.append(task.id)
            i = int(task.name[1:])
            for r in g:
                ok = i < 2
                r.reward = 1.0 if ok else 0.0 if i >= 6 else r.reward
                reason = Reason.OK if ok else Reason.ERROR
                r.verdict = Verdict(accepted=ok, reason=reason)
        return groups


class FixedEnv(DigitEnv):
    def make_harness(self) -> Harness:
        h = FixedHarness(self.config.harness)
        h.fail_at = self.fail_at
        return h


def test_grpo_mode_off_draws_todays_batches(tiny_model_dir: Path, tmp_path: Path) -> None:
    FixedHarness.seen = []
    cfg = _config(tiny_model_dir, tmp_path / "run", steps=3, dynamic_sampling="off")
    rows = _train(cfg, env=FixedEnv())
    ts = FixedEnv(cfg.env).tasks()
    want = [t.id for s in range(3) for t in batch_for_step(ts, s, cfg.tasks_per_step, cfg.seed)]
    assert FixedHarness.seen == want
    assert not any(k.startswith("curriculum/") for r in rows for k in r)
    assert not (tmp_path / "run" / DIFFICULTY_FILE).exists()


def test_grpo_with_a_curriculum_logs_pools_and_resumes_exactly(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    curriculum = CurriculumConfig(mode="drop_solved", min_attempts=4)
    kw: dict[str, Any] = dict(steps=6, save_every=2, keep_checkpoints=5, curriculum=curriculum)
    kw["dynamic_sampling"] = "off"
    FixedHarness.seen = []
    straight = _train(_config(tiny_model_dir, tmp_path / "a", **kw), env=FixedEnv())
    seen_straight = list(FixedHarness.seen)
    assert straight[0]["curriculum/dropped"] == 0  # nothing known at step 1
    assert all("curriculum/easy" in r and "curriculum/hard" in r for r in straight)
    table = json.loads((tmp_path / "a" / DIFFICULTY_FILE).read_text())
    assert table["step"] == 6
    # once t0 and t1 have 4 judged attempts each (solved every time) no later step draws them
    dropped_from = next(i for i, r in enumerate(straight) if r["curriculum/dropped"] == 2)
    assert {"t0", "t1"}.isdisjoint(seen_straight[4 * dropped_from :]), seen_straight
    assert {"t0", "t1"} <= set(seen_straight[: 4 * dropped_from])

    out = tmp_path / "b"
    PromptHarness.calls = 0
    crashing = FixedEnv()
    crashing.fail_at = 5  # step 6's rollouts: steps 1-5 recorded, checkpoint-4 the last
    with pytest.raises(_Crash):
        _train(_config(tiny_model_dir, out, **kw), env=crashing)
    assert json.loads((out / DIFFICULTY_FILE).read_text())["step"] == 5
    resumed = _train(_config(tiny_model_dir, out, **kw), env=FixedEnv())
    keys = ("reward_mean", "curriculum/easy", "curriculum/frontier", "curriculum/dropped")
    assert [[r[k] for k in keys] for r in resumed] == [[r[k] for k in keys] for r in straight]
    again = json.loads((out / DIFFICULTY_FILE).read_text())
    assert (
        DifficultyTable.load(out / DIFFICULTY_FILE).counts()
        == DifficultyTable.load(tmp_path / "a" / DIFFICULTY_FILE).counts()
    )  # step 5 redone, counted once
    assert again["step"] == 6


# -- expert iteration ------------------------------------------------------------------------------


def _ei(tmp_path: Path, tiny_model_dir: Path, **kw: Any) -> Any:
    from leanrl.train.sft.expert_iteration import ExpertIteration, ExpertIterationConfig

    cfg = ExpertIterationConfig(
        env={"id": "countdown", "taskset": {"split": "train", "limit": 6}},
        policy={"model": str(tiny_model_dir)},
        out=tmp_path / "ei",
        samples=2,
        unsolved_only=False,
        **kw,
    )
    ei = ExpertIteration(cfg)
    sampled: list[list[str]] = []

    async def fake_sample(r: int, model: str, todo: Sequence[Task]) -> float:
        sampled.append([t.id for t in todo])
        folder = ei._round_dir(r) / "sample"
        folder.mkdir(parents=True, exist_ok=True)
        lines = []
        for t in todo:  # the first task always solved, the others never
            ok = t.id == todo[0].id
            v = {"accepted": ok, "reason": "ok" if ok else "error"}
            lines += [
                json.dumps(
                    {
                        "task_id": t.id,
                        "sample": j,
                        "accepted": ok,
                        "reward": float(ok),
                        "verdict": v,
                    }
                )
                for j in range(2)
            ]
        (folder / "results.jsonl").write_text("\n".join(lines) + "\n")
        return 0.0

    async def fake_sft(r: int, model: str, tasks: Any) -> dict[str, Any]:
        return {}

    ei._sample = fake_sample  # type: ignore[method-assign]
    ei._sft = fake_sft  # type: ignore[method-assign]
    return ei, sampled


def test_expert_iteration_off_samples_every_task_and_drop_solved_drops(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    ei, sampled = _ei(tmp_path / "off", tiny_model_dir, rounds=2)
    ei.kept.open()
    ei._curriculum = Curriculum.open(ei.config.curriculum, [], ei.run.path, before=1)
    env_tasks = load_environment(ei.config.env).tasks()
    for r in (1, 2):
        asyncio.run(ei._round(r, env_tasks))
    assert sampled == [[t.id for t in env_tasks]] * 2  # today's: every task, every round

    ei, sampled = _ei(
        tmp_path / "on",
        tiny_model_dir,
        rounds=2,
        curriculum=CurriculumConfig(mode="drop_solved", min_attempts=2),
    )
    ei.kept.open()
    ei._curriculum = Curriculum.open(ei.config.curriculum, env_tasks, ei.run.path, before=1)
    row1 = asyncio.run(ei._round(1, env_tasks))
    row2 = asyncio.run(ei._round(2, env_tasks))
    assert sampled[0] == [t.id for t in env_tasks]
    assert sampled[1] == [t.id for t in env_tasks[1:]]  # round 1 solved the first: dropped
    assert row1["curriculum/dropped"] == 0 and row2["curriculum/dropped"] == 1
    table = DifficultyTable.load(ei.run.path / DIFFICULTY_FILE)
    assert table.counts()[env_tasks[1].id].attempts == 4 and table.written_at == 3


# -- the learning check script ---------------------------------------------------------------------


@pytest.mark.slow
def test_recipes_benchmark_runs_every_variant_at_equal_tokens(tmp_path: Path) -> None:
    import importlib.util

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "grpo_recipes.py"
    spec = importlib.util.spec_from_file_location("grpo_recipes", script)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    argv = ["--seeds", "1", "--tokens", "1500", "--eval-limit", "2", "--out", str(tmp_path)]
    assert mod.main([*argv, "--plot", str(tmp_path / "p.png")]) == 0
    got = json.loads((tmp_path / "results.json").read_text())
    variants = [k for k in got if k != "base"]
    assert {"plain", "curriculum"} <= set(variants)
    for name in variants:
        [run] = got[name]
        assert abs(run["tokens"] - 1500) <= 300, (name, run["tokens"])  # within about a step
        assert 0.0 <= run["pass@8"] <= 1.0
    rows = RunDir(tmp_path / "curriculum-seed0").metrics()
    assert all("curriculum/frontier" in r for r in rows if "reward_mean" in r)
    assert (tmp_path / "p.png").stat().st_size > 0
