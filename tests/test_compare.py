"""``leanrl compare``: ES and GRPO on Countdown with a tiny CPU model, equal token budgets, the
same held-out eval; the report, its plot and its numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from leanrl.compare import CompareConfig, run_compare
from leanrl.errors import ConfigError


@pytest.fixture(scope="module")
def cd_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from test_countdown import make_countdown_model

    return make_countdown_model(tmp_path_factory.mktemp("cmp-model"))


def _config(model: Path, out: Path, **kw: object) -> CompareConfig:
    base: dict[str, object] = {
        "env": {
            "id": "countdown",
            "taskset": {"split": "train", "limit": 16},
            "harness": {"options": {"style": "direct", "reward": "dense"}},
        },
        "eval_limit": 6,
        "eval_every": 2,
        "policy": {"model": str(model), "device": "cpu"},
        "sampling": {"max_tokens": 8, "temperature": 1.0, "top_p": 1.0, "seed": 0},
        "budget": {"tokens": 600},
        "tasks_per_step": 4,
        "es": {"population": 4, "sigma": 0.02, "alpha": 0.02},
        "grpo": {"group_size": 4, "lr": 3e-3, "mask_truncated": False},
        "out": str(out),
    }
    base.update(kw)
    return CompareConfig.model_validate(base)


def test_compare_es_and_grpo_on_countdown(cd_model: Path, tmp_path: Path) -> None:
    cfg = _config(cd_model, tmp_path / "cmp")
    report = run_compare(cfg)
    out = tmp_path / "cmp"
    assert (out / "compare.png").stat().st_size > 5000
    md = (out / "report.md").read_text()
    assert "ES vs GRPO on countdown" in md and "compare.png" in md
    saved = json.loads((out / "compare.json").read_text())
    assert saved["x"] == "total_tokens" and set(saved["methods"]) == {"es", "grpo"}
    for r in report["runs"]:
        rows = [json.loads(x) for x in (Path(r["run"]) / "metrics.jsonl").read_text().splitlines()]
        steps = [x for x in rows if x["step"] > 0]

        # each run stopped at the step boundary nearest the budget (leanrl/train/budget.py):
        # reached, or one more mean-sized step would have ended further past it
        totals = [x["total_tokens"] for x in steps]
        near = [t >= 600 or t + t / (i + 1) / 2 > 600 for i, t in enumerate(totals)]
        assert near[-1] and not any(near[:-1])
        assert r["tokens"] == steps[-1]["total_tokens"]
        # the same held-out set: evaluated at the start (step 0) and at the end
        assert rows[0]["step"] == 0 and rows[0]["eval/tasks"] == 6
        assert steps[-1]["eval/pass@1"] is not None
        assert r["acc_start"] is not None and r["wall_s"] > 0 and r["usd"] == 0.0
    es = next(r for r in report["runs"] if r["method"] == "es")
    grpo = next(r for r in report["runs"] if r["method"] == "grpo")
    assert es["acc_start"] == grpo["acc_start"]  # same model, same greedy held-out eval
    # a rerun resumes every run (finished: nothing trains again) and writes the same report
    again = run_compare(cfg)
    assert [r["steps"] for r in again["runs"]] == [r["steps"] for r in report["runs"]]


def test_compare_needs_a_budget_and_grpo_needs_sampling(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="give a budget"):
        CompareConfig(budget={})  # type: ignore[arg-type]
    cfg = _config(Path("m"), tmp_path, sampling={"temperature": 0.0})
    with pytest.raises(ConfigError, match="temperature"):
        cfg.run_config("grpo", 0)
    assert CompareConfig.model_validate({"seeds": "0,3"}).seeds == [0, 3]


def test_compare_trains_on_train_and_evaluates_on_test_with_its_own_length(
    tmp_path: Path,
) -> None:
    # As documented (`leanrl compare --env countdown`): no split given -> train on `train`,
    # evaluate on `test`, and the held-out evaluation generates at most sampling.max_tokens.
    cfg = CompareConfig.model_validate(
        {"policy": {"model": "m"}, "budget": {"tokens": 10}, "out": str(tmp_path),
         "sampling": {"max_tokens": 64}}
    )  # fmt: skip
    for method in ("es", "grpo"):
        run = cfg.run_config(method, 0)
        assert run.env.taskset.split == "train"
        assert run.eval.env.taskset.split == "test"
        assert run.eval.sampling.max_tokens == 64 and run.eval.sampling.temperature == 0.0
        assert run.sampling.max_tokens == 64
    grpo = cfg.run_config("grpo", 0)
    assert grpo.sampling.top_p == 1.0  # GRPO's own default, not SamplingConfig's 0.95
    # another sampling field given: the 256-token default stays
    cfg2 = CompareConfig.model_validate(
        {"policy": {"model": "m"}, "budget": {"tokens": 10}, "sampling": {"temperature": 0.7}}
    )
    assert cfg2.sampling.max_tokens == 256
    assert cfg2.run_config("grpo", 0).sampling.temperature == 0.7
    # a split named on purpose is kept; the trainers then refuse the overlap (tested there)
    cfg3 = _config(Path("m"), tmp_path, env={"id": "countdown", "taskset": {"split": "test"}})
    assert cfg3.run_config("es", 0).env.taskset.split == "test"


def test_a_held_out_set_that_overlaps_training_is_refused(
    own_tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from leanrl.environment import load_environment
    from leanrl.train.inrun_eval_config import InRunEvalConfig

    env = {"id": "countdown", "taskset": {"split": "test", "limit": 5}}
    train = [
        t.name for t in load_environment(CompareConfig(budget={"tokens": 1}, env=env).env).tasks()
    ]  # type: ignore[arg-type]
    ev = InRunEvalConfig(every=1, env=env)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"shares 5 of its 5 tasks.*allow-overlap"):
        ev.check_held_out(train)
    InRunEvalConfig(every=1, env=env, allow_overlap=True).check_held_out(train)  # type: ignore[arg-type]
    other = InRunEvalConfig(
        every=1, env={"id": "countdown", "taskset": {"split": "train", "limit": 5}}
    )  # type: ignore[arg-type]
    other.check_held_out(train)  # disjoint splits: fine
    # and a trainer stops before loading any model
    import transformers

    from leanrl.train.es import ESConfig, ESTrainer

    def no_load(*a: object, **k: object) -> None:
        raise AssertionError("the model was loaded before the overlap was refused")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_load)
    cfg = ESConfig(
        env=env,  # type: ignore[arg-type]
        policy={"model": str(own_tiny_model)},  # type: ignore[arg-type]
        out=tmp_path / "es",
        eval={"every": 1, "env": env},  # type: ignore[arg-type]
    )
    with pytest.raises(ConfigError, match="shares"):
        ESTrainer(cfg).train_sync()


def test_help_names_the_environment_compare_really_defaults_to() -> None:
    # --help said "(default: minif2f)", the default of EnvironmentConfig.id; the compare's own
    # default is Countdown.
    from leanrl.compare import CompareConfig
    from leanrl.environment import EnvironmentConfig

    assert CompareConfig(budget={"tokens": 10}).env.id == "countdown"
    field = CompareConfig.model_fields["env"].annotation
    assert field.model_fields["id"].default == "countdown"  # what --help prints
    given = CompareConfig(env=EnvironmentConfig(id="minif2f"), budget={"tokens": 10})
    assert given.env.id == "minif2f"
    unset = CompareConfig(env=EnvironmentConfig(), budget={"tokens": 10})
    assert unset.env.id == "minif2f"  # a plain config keeps its own id


def test_plot_tells_seeds_apart_and_keeps_zero_curves_above_zero(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from leanrl import compare

    zero = {"acc_x": [0, 1, 2], "acc": [0.0, 0.0, 0.0], "reward_x": [1, 2], "reward": [0.0, 0.0]}
    runs = [{"method": m, "seed": s, "curve": zero} for m in ("es", "grpo") for s in (0, 1)]
    seen: list[Any] = []
    real_savefig = plt.Figure.savefig

    def keep(fig: Any, *a: Any, **k: Any) -> None:
        seen.append(fig)
        real_savefig(fig, *a, **k)

    plt.Figure.savefig = keep  # type: ignore[method-assign]
    try:
        compare._plot(runs, "tokens", tmp_path / "c.png")
    finally:
        plt.Figure.savefig = real_savefig  # type: ignore[method-assign]
    acc, reward = seen[0].axes
    styles = {(ln.get_color(), ln.get_marker(), ln.get_linestyle()) for ln in acc.get_lines()}
    assert len(styles) == 4  # every (method, seed) looks different
    for ax in (acc, reward):
        assert ax.get_ylim()[0] == 0.0  # all-zero curves: no negative range
    assert (tmp_path / "c.png").stat().st_size > 0
