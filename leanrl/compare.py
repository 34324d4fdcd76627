"""``leanrl compare``: ES and GRPO on the same environment, model, budget, seeds and held-out eval.

For every seed, one ES run and one GRPO run are trained (in alternating order, so neither
always goes first on a warm machine) from the same model, on the same environment, each until
it has spent the same budget: generated tokens (``--budget.tokens``) or GPU-seconds
(``--budget.gpu_s``). Both evaluate the same held-out set every ``eval_every`` steps, starting
with the untrained model. The report (``OUT/report.md``, ``OUT/compare.json`` and
``OUT/compare.png``) puts the held-out accuracy (pass@1) and the training reward against the
budget spent, with each run's cost in dollars and wall time. Every run is an ordinary run folder
under ``OUT/<method>-seed<N>/`` (resumable: rerun the same command).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from leanrl._sandbox_config import KEEP_SECRETS
from leanrl.config import ConfigCommand, validate
from leanrl.environment import EnvironmentConfig
from leanrl.errors import ConfigError
from leanrl.launch.config import LauncherConfig
from leanrl.policy import PolicyConfig, SamplingConfig
from leanrl.train.budget import BudgetConfig

__all__ = ["CompareCommand", "CompareConfig", "run_compare"]

METHODS = ("es", "grpo")

log = logging.getLogger("leanrl.compare")


class CompareSamplingConfig(SamplingConfig):
    """Decoding for both methods' runs: SamplingConfig with a 256-token default, kept when other
    fields are set (``--sampling.temperature 0.7``). Only the fields given here are passed on, so
    each trainer keeps its own defaults for the rest (GRPO: top-p 1.0)."""

    max_tokens: int = Field(default=256, ge=1)
    """Most tokens per completion, in training and in the held-out evaluation."""


class CompareEnvironmentConfig(EnvironmentConfig):
    """EnvironmentConfig with Countdown as its default id, so that ``--help`` shows the default
    the compare really uses."""

    id: str = "countdown"
    """Environment id (``leanrl envs`` lists them) or an import path ``package.module:Class``;
    here Countdown, which needs no Lean."""


class CompareConfig(BaseModel):
    """ES against GRPO on equal terms (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    env: CompareEnvironmentConfig = Field(default_factory=CompareEnvironmentConfig)
    """The training environment (default: Countdown, which needs no Lean). Its split is
    ``train`` unless ``--env.taskset.split`` names another; the runs refuse to start when it
    shares tasks with the held-out set."""
    eval_env: EnvironmentConfig | None = None
    """The held-out environment (default: ``env`` with ``taskset.split = "test"``)."""
    eval_limit: int | None = Field(default=50, ge=1)
    """Held-out tasks evaluated (the first N of ``eval_env``); None: all of them."""
    eval_every: int = Field(default=5, ge=1)
    """Evaluate every this many steps of each trainer (and at the start and the end)."""
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    """The model both methods start from."""
    sampling: CompareSamplingConfig = Field(default_factory=CompareSamplingConfig)
    """Decoding settings both use (ES decodes greedily unless ``es.greedy = false``; GRPO
    samples with its temperature)."""
    budget: BudgetConfig = Field(default_factory=lambda: BudgetConfig(tokens=200_000))
    """What each run may spend: generated tokens or GPU-seconds."""
    seeds: list[int] = Field(default_factory=lambda: [0])
    """One ES and one GRPO run per seed."""
    max_steps: int = Field(default=10_000, ge=1)
    """A cap on steps, in case the budget is never reached."""
    tasks_per_step: int = Field(default=8, ge=1)
    """Training tasks per step, for both methods."""
    es: dict[str, Any] = Field(default_factory=dict)
    """More ``train es`` options for the ES runs (``population``, ``sigma``, ``scorer``...)."""
    grpo: dict[str, Any] = Field(default_factory=dict)
    """More ``train grpo`` options for the GRPO runs (``group_size``, ``lr``...)."""
    launcher: LauncherConfig = Field(default_factory=LauncherConfig)
    """Prices (and GPU type) the runs' cost is reported in."""
    out: Path = Path("runs/compare")
    """The report folder; each run goes to ``OUT/<method>-seed<N>/``."""

    @field_validator("env", mode="before")
    @classmethod
    def _plain_env(cls, v: Any) -> Any:
        # A plain EnvironmentConfig (from Python) keeps what was set in it, its id included.
        if isinstance(v, EnvironmentConfig) and not isinstance(v, CompareEnvironmentConfig):
            return {**v.model_dump(exclude_unset=True), "id": v.id}
        return v

    @field_validator("sampling", mode="before")
    @classmethod
    def _plain_sampling(cls, v: Any) -> Any:
        return CompareSamplingConfig.given_fields(v)

    @field_validator("seeds", mode="before")
    @classmethod
    def _parse_seeds(cls, v: Any) -> Any:
        # "0,1,2" from the command line or a TOML string; a list from TOML
        if isinstance(v, str):
            return [int(x) for x in re.split(r"[,\s]+", v.strip()) if x]
        return [v] if isinstance(v, int) else v

    @model_validator(mode="after")
    def _check(self) -> CompareConfig:
        if not self.budget.active:
            raise ValueError(
                "give a budget: --budget.tokens N (generated tokens) or --budget.gpu_s S"
            )
        return self

    def held_out(self) -> EnvironmentConfig:
        """The evaluation environment, with ``eval_limit`` applied."""
        env = self.eval_env or self.env.model_copy(
            update={"taskset": self.env.taskset.model_copy(update={"split": "test"})}, deep=True
        )
        if self.eval_limit is not None:
            ts = env.taskset.model_copy(update={"limit": self.eval_limit})
            env = env.model_copy(update={"taskset": ts})
        return env

    def train_env(self) -> EnvironmentConfig:
        """The training environment: ``env``, on its ``train`` split unless one was named."""
        if "split" in self.env.taskset.model_fields_set:
            return self.env
        ts = self.env.taskset.model_copy(update={"split": "train"})
        ts.model_fields_set.add("split")
        return self.env.model_copy(update={"taskset": ts})

    def run_config(self, method: str, seed: int) -> Any:
        """The ESConfig or GRPOConfig of one run.

        The config is rebuilt from JSON dumps that keep secret values (``KEEP_SECRETS``): a
        plain JSON dump writes ``runtime.docker.env`` values as ``<redacted>``, which the run's
        containers would then get as their credentials. The run's files redact them."""
        keep = KEEP_SECRETS
        base: dict[str, Any] = {
            "env": self.train_env().model_dump(mode="json", exclude_unset=False, context=keep),
            "policy": self.policy.model_dump(mode="json", context=keep),
            # the fields given, and always the length limit: each trainer's defaults for the rest
            "sampling": {
                **self.sampling.model_dump(mode="json", exclude_unset=True),
                "max_tokens": self.sampling.max_tokens,
            },
            "out": str(self.out / f"{method}-seed{seed}"),
            "seed": seed,
            "steps": self.max_steps,
            "tasks_per_step": self.tasks_per_step,
            "save_every": self.max_steps,
            "budget": self.budget.model_dump(mode="json"),
            "launcher": self.launcher.model_dump(mode="json", context=keep),
            "eval": {
                "every": self.eval_every,
                "env": self.held_out().model_dump(mode="json", context=keep),
                "at_start": True,
                # greedy, with the runs' own length limit (not the evaluation's 2,048 tokens)
                "sampling": {"max_tokens": self.sampling.max_tokens, "seed": self.sampling.seed},
            },
        }
        if method == "es":
            from leanrl.train.es import ESConfig

            return validate(ESConfig, _merge(base, self.es), "compare: ES config")
        from leanrl.train.grpo import GRPOConfig

        if "sampling" not in self.grpo and self.sampling.temperature <= 0:
            raise ConfigError("GRPO needs sampling.temperature > 0 (set --sampling.temperature)")
        return validate(GRPOConfig, _merge(base, self.grpo), "compare: GRPO config")


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@contextlib.contextmanager
def _labelled(label: str) -> Iterator[None]:
    """While a run trains, every ``leanrl`` log line starts with ``label`` (``ES seed 0:``), so
    the step lines and the held-out evaluations' progress say which run they belong to."""
    make = logging.getLogRecordFactory()

    def labelled(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        if record.name.startswith("leanrl"):
            record.msg = f"{label}: {record.getMessage()}"
            record.args = None
        return record

    logging.setLogRecordFactory(labelled)
    try:
        yield
    finally:
        logging.setLogRecordFactory(make)


def _train(method: str, config: Any) -> None:
    if method == "es":
        from leanrl.train.es import ESTrainer

        ESTrainer(config).train_sync()
    else:
        from leanrl.train.grpo import GRPOTrainer

        trainer = GRPOTrainer(config)
        trainer.check()
        trainer.train_sync()


def _held_out_line(config: CompareConfig) -> str:
    """The held-out evaluation in a few words, e.g. ``30 tasks of countdown``."""
    env = config.held_out()
    limit = env.taskset.limit
    return f"{limit} tasks of {env.id}" if limit else f"every task of {env.id}"


def _curve(rows: list[dict[str, Any]], x_key: str) -> dict[str, list[float]]:
    """Budget spent, held-out pass@1 and training reward along a run."""
    xs, acc_x, acc, rew_x, rew = [], [], [], [], []
    spent = 0.0
    for r in rows:
        if r.get("step", 0) == 0:
            spent = 0.0
        else:
            spent = float(r.get(x_key) or spent)
        if r.get("eval/pass@1") is not None:
            acc_x.append(spent)
            acc.append(float(r["eval/pass@1"]))
        if r.get("reward_mean") is not None:
            rew_x.append(spent)
            rew.append(float(r["reward_mean"]))
        xs.append(spent)
    return {"acc_x": acc_x, "acc": acc, "reward_x": rew_x, "reward": rew}


def _summary(method: str, seed: int, run: Path, x_key: str) -> dict[str, Any]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in rows if r.get("step", 0) > 0]
    last = steps[-1] if steps else {}
    wall = sum(float(r.get("step_time_s") or r.get("time_step") or 0.0) for r in steps)
    wall += sum(float(r.get("eval/time_s") or 0.0) for r in rows)
    curve = _curve(rows, x_key)
    return {
        "method": method,
        "seed": seed,
        "run": str(run),
        "steps": len(steps),
        "spent": float(last.get(x_key) or 0.0),
        "tokens": int(last.get("total_tokens") or 0),
        "gpu_s": float(last.get("cost/total_gpu_s") or 0.0),
        "usd": float(last.get("cost/total_usd") or 0.0),
        "wall_s": wall,
        "acc_start": curve["acc"][0] if curve["acc"] else None,
        "acc_end": curve["acc"][-1] if curve["acc"] else None,
        "acc_best": max(curve["acc"]) if curve["acc"] else None,
        "curve": curve,
    }


def _plot(runs: list[dict[str, Any]], x_label: str, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig = _figure(runs, x_label)
    fig.savefig(path)
    plt.close(fig)


def _figure(runs: list[dict[str, Any]], x_label: str) -> Any:
    """Held-out accuracy and training reward against the budget, one line per run. Each panel's
    y axis follows its data: accuracy from 0 to a little above the best value (at least 0.1;
    the whole 0-1 when every value is 0, with a note saying no run solved a held-out task),
    points on 0 drawn whole, not half under the axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.8), dpi=120)
    # One colour family per method, one shade, marker and dash per seed, so that the seeds of a
    # method can be told apart (and the methods from afar).
    families = {"es": plt.get_cmap("Blues"), "grpo": plt.get_cmap("Oranges")}
    markers, dashes = "osD^v", ["-", "--", "-.", ":"]
    seeds = sorted({r["seed"] for r in runs})
    for r in runs:
        c = r["curve"]
        i = seeds.index(r["seed"])
        shade = 0.9 - 0.45 * i / max(1, len(seeds) - 1)
        style = {
            "color": families.get(r["method"], plt.get_cmap("Greys"))(shade),
            "ls": dashes[i % len(dashes)],
            "label": f"{r['method'].upper()} (seed {r['seed']})",
            "clip_on": False,  # a point on 0 is drawn whole, not half under the axis
        }
        a1.plot(c["acc_x"], c["acc"], marker=markers[i % len(markers)], lw=1.5, **style)
        a2.plot(c["reward_x"], c["reward"], lw=1, **style)
    a1.set_title("held-out accuracy (pass@1)")
    a2.set_title("training reward")
    for a in (a1, a2):
        a.set_xlabel(x_label)
        a.grid(alpha=0.3)
        if a.get_lines():
            a.legend(fontsize=8)
    acc = [y for r in runs for y in r["curve"]["acc"]]
    top = max(acc, default=0.0)
    # all zero: the whole 0-1 scale (and a note), not a magnified band around nothing
    ceiling = min(1.0, max(0.1, 1.2 * top)) if top > 0 else 1.0
    a1.set_ylim(0.0, ceiling)
    if not acc:
        a1.text(0.5, 0.5, "no held-out evaluation yet", transform=a1.transAxes, ha="center")
    elif top == 0:
        a1.text(
            0.5, 0.55, "no run solved a held-out task\n(pass@1 = 0 at every evaluation)",
            transform=a1.transAxes, ha="center", fontsize=9, color="0.3",
        )  # fmt: skip
    # A reward that does go below 0 keeps its range; otherwise the axis starts at 0.
    rewards = [y for r in runs for y in r["curve"]["reward"] if y == y]
    if rewards and min(rewards) >= 0:
        hi = max(rewards)
        span = hi if hi > 0 else 1.0
        a2.set_ylim(0.0, hi + 0.1 * span)
    fig.tight_layout()
    return fig


def run_compare(config: CompareConfig) -> dict[str, Any]:
    """Train every (method, seed) run (resuming finished or partial ones), then report.

    The compare holds ``OUT/.lock`` throughout (a second compare on the same OUT is refused,
    not interleaved); each run locks its own folder ``OUT/<method>-seed<N>/.lock``."""
    from leanrl.runlock import FolderLock
    from leanrl.train.common import check_model_path

    check_model_path(config.policy.model)  # before OUT is made: a typo leaves nothing behind
    with FolderLock(config.out, "compare"):
        return _compare_runs(config)


def _compare_runs(config: CompareConfig) -> dict[str, Any]:
    """:func:`run_compare`'s work, under its lock."""
    x_key = "total_tokens" if config.budget.tokens is not None else "cost/total_gpu_s"
    x_label = "generated tokens" if x_key == "total_tokens" else "GPU-seconds"
    runs = []
    for i, seed in enumerate(config.seeds):
        order = METHODS if i % 2 == 0 else METHODS[::-1]
        for method in order:
            cfg = config.run_config(method, seed)
            label = f"{method.upper()} seed {seed}"
            log.info(
                "compare: %s in %s (held-out: %s, every %d steps and at the start)",
                label,
                cfg.out,
                _held_out_line(config),
                config.eval_every,
            )
            with _labelled(label):
                _train(method, cfg)
            runs.append(_summary(method, seed, Path(cfg.out), x_key))
    runs.sort(key=lambda r: (r["method"], r["seed"]))
    config.out.mkdir(parents=True, exist_ok=True)
    by_method: dict[str, Any] = {}
    for method in METHODS:
        mine = [r for r in runs if r["method"] == method]
        ends = [r["acc_end"] for r in mine if r["acc_end"] is not None]
        by_method[method] = {
            "runs": len(mine),
            "acc_end_mean": statistics.fmean(ends) if ends else None,
            "usd_mean": statistics.fmean(r["usd"] for r in mine),
            "wall_s_mean": statistics.fmean(r["wall_s"] for r in mine),
        }
    report = {
        "budget": config.budget.model_dump(),
        "x": x_key,
        "env": config.env.id,
        "model": config.policy.model,
        "seeds": config.seeds,
        "methods": by_method,
        "runs": runs,
    }
    (config.out / "compare.json").write_text(json.dumps(report, indent=2, default=str))
    _plot(runs, x_label, config.out / "compare.png")
    (config.out / "report.md").write_text(_markdown(report, x_label))
    return report


def _fmt(v: Any, f: str = ".3f") -> str:
    return "-" if v is None else format(v, f)


def _markdown(report: dict[str, Any], x_label: str) -> str:
    b = report["budget"]
    budget = f"{b['tokens']} tokens" if b.get("tokens") else f"{b['gpu_s']} GPU-seconds"
    lines = [
        f"# ES vs GRPO on {report['env']}",
        "",
        f"Model `{report['model']}`, budget {budget} per run, seeds {report['seeds']}.",
        "",
        "![held-out accuracy and training reward against the budget](compare.png)",
        "",
        "| method | seed | steps | "
        + x_label
        + " | held-out pass@1 start → end (best) | $ | wall s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in report["runs"]:
        lines.append(
            f"| {r['method']} | {r['seed']} | {r['steps']} | {r['spent']:.0f} | "
            f"{_fmt(r['acc_start'])} → {_fmt(r['acc_end'])} ({_fmt(r['acc_best'])}) | "
            f"{r['usd']:.4f} | {r['wall_s']:.1f} |"
        )
    return "\n".join(lines) + "\n"


class CompareCommand(ConfigCommand, CompareConfig):
    """Compare ES and GRPO on one environment, model and budget: held-out accuracy against
    budget, cost and wall time, in one report with plots.

    Example: leanrl compare --env countdown --model Qwen/Qwen2.5-0.5B-Instruct --budget.tokens
    500000 --seeds 0,1 --out runs/compare-countdown. Each run is a normal run folder under OUT
    (resumable); the report is OUT/report.md with OUT/compare.png.
    """

    model: str | None = None
    """Shortcut for --policy.model."""

    def to_compare_config(self) -> CompareConfig:
        return self.build_config(CompareConfig, "compare config", {"model": ("policy", "model")})

    def cli_cmd(self) -> None:
        report = run_compare(self.to_compare_config())
        for method, m in report["methods"].items():
            print(
                f"{method}: held-out pass@1 at the end {_fmt(m['acc_end_mean'])}, "
                f"${m['usd_mean']:.4f}, {m['wall_s_mean']:.0f} s (mean over {m['runs']} runs)"
            )
        print(f"report: {Path(report['runs'][0]['run']).parent / 'report.md'}")
