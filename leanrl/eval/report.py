"""summary.json, report.md and the pass@k plot, computed from results.jsonl."""

from __future__ import annotations

import platform
from collections import Counter
from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from leanrl.errors import disk_errors
from leanrl.eval.passk import pass_at_k_table
from leanrl.jsonl import json_text

__all__ = [
    "harness_name",
    "model_name",
    "package_versions",
    "pass_at_k_figure",
    "plot_title",
    "summarize",
    "write_report",
]


def package_versions() -> dict[str, str | None]:
    """Versions of leanrl and the libraries that shape the samples (read, not imported)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for pkg in ("leanrl", "torch", "transformers", "vllm", "httpx"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def summarize(
    records: Sequence[Mapping[str, Any]],
    task_ids: Sequence[str],
    categories: Mapping[str, str | None],
    samples: int,
    ks: Sequence[int],
) -> dict[str, Any]:
    """The pass@k tables (reported ks, and every k up to ``samples`` for the curve)."""
    wanted = set(task_ids)
    counts: dict[str, list[int]] = {t: [0, 0] for t in task_ids}
    reasons: Counter[str] = Counter()
    gen_tokens = 0
    infra_tasks: set[str] = set()
    for r in records:
        if r["task_id"] not in wanted or r["sample"] >= samples:
            continue
        verdict = r.get("verdict")
        reason = str(verdict.get("reason", "?")) if verdict else "unchecked"
        reasons[reason] += 1
        gen_tokens += int(r.get("completion_tokens", 0))
        if reason == "infra":
            # The checker did not run: not the model's failure. The attempt is left out of
            # pass@k (its task stays incomplete) and redone by the next resume.
            infra_tasks.add(r["task_id"])
            continue
        c = counts[r["task_id"]]
        c[0] += 1
        c[1] += 1 if r.get("accepted") else 0
    complete = {t: (n, c) for t, (n, c) in counts.items() if n >= samples}
    return {
        "tasks": len(task_ids),
        "tasks_complete": len(complete),
        "infra": reasons.get("infra", 0),
        "tasks_with_infra": len(infra_tasks),
        "attempts": sum(n for n, _ in counts.values()) + reasons.get("infra", 0),
        "accepted": sum(c for _, c in counts.values()),
        "solved": sum(1 for _, c in counts.values() if c > 0),
        "generated_tokens": gen_tokens,
        "reasons": dict(reasons.most_common()),
        "pass_at_k": pass_at_k_table(complete, ks, categories),
        "pass_at_k_curve": pass_at_k_table(complete, range(1, samples + 1), categories),
        "solved_tasks": sorted(t for t, (_, c) in complete.items() if c > 0),
    }


def run_warnings(summary: Mapping[str, Any]) -> list[str]:
    """What a reader of the summary must not miss: attempts the checker could not judge
    (``infra``), loudly when they are most of the run; the Lean that ran differing from the
    taskset's."""
    res, out = summary["results"], []
    infra, attempts = res.get("infra", 0), res.get("attempts", 0)
    if infra:
        share = infra / max(1, attempts)
        text = (
            f"{infra} of {attempts} attempts ({100 * share:.0f}%) could not be checked (`infra`: "
            "the checker did not run, e.g. a Lean process or sandbox failed to start). They are "
            f"not counted as model failures: their {res.get('tasks_with_infra', 0)} tasks are left "
            "out of pass@k until the same command is rerun, which retries them."
        )
        if share >= 0.5:
            text = "MOST ATTEMPTS WERE NOT CHECKED; pass@k covers only the rest. " + text
        out.append(text)
    ver = summary.get("versions", {})
    want, ran = _version_part(ver.get("lean_toolchain")), _version_part(ver.get("lean_ran"))
    if want and ran and want != ran:
        out.append(
            f"the Lean that checked the attempts is {ran}, but the taskset was written for {want}: "
            "results may differ from the benchmark's (point the runtime at a project or image "
            f"with Lean {want}; `leanrl setup --env {summary['config']['env']['id']}` makes one)."
        )
    return out


def _version_part(text: Any) -> str | None:
    """``leanprover/lean4:v4.24.0`` or ``Lean (version 4.24.0, ...)`` -> ``4.24.0``."""
    import re

    m = re.search(r"(\d+\.\d+\.\d+(?:-rc\d+)?)", str(text or ""))
    return m.group(1) if m else None


def write_report(out: Path, summary: Mapping[str, Any], plot: bool = True) -> None:
    """Write summary.json, report.md and (when matplotlib is there) pass_at_k.png."""
    # refused before anything is written: a bare NaN would make summary.json unreadable JSON
    text = json_text(summary, f"{out / 'summary.json'}", indent=2, default=str) + "\n"
    with disk_errors(out / "summary.json", "the eval report"):
        (out / "summary.json").write_text(text)
        png = out / "pass_at_k.png"
        plot = plot and not summary.get("generate_only")
        has_plot = plot and _plot(summary["results"]["pass_at_k_curve"], png, plot_title(summary))
        text = _markdown(summary, png.name if has_plot else None)
        if plot and not has_plot:
            from leanrl._dist import install_hint

            text += f"\n(The pass@k plot needs matplotlib: `{install_hint('plot')}`.)\n"
        (out / "report.md").write_text(text)


def model_name(summary: Mapping[str, Any]) -> str:
    """The model the run evaluated (the policy's, also when it was passed in ready-made)."""
    return str(summary["versions"].get("model") or summary["config"]["policy"]["model"] or "?")


def harness_name(summary: Mapping[str, Any]) -> str:
    """The harness that ran (summaries from before it was recorded: the configured one)."""
    ran = summary.get("harness", {}).get("name")
    return str(ran or summary["config"]["env"]["harness"]["name"])


def plot_title(summary: Mapping[str, Any]) -> str:
    """What the pass@k figure shows: taskset, model, harness and samples per task. The harness
    is left out where it is the environment's own (Countdown's is named ``countdown``: the name
    would stand there twice)."""
    cfg = summary["config"]
    env_id = str(cfg["env"]["id"])
    harness = harness_name(summary)
    # the prompt format is a Lean harnesses' setting; an environment without Lean has its own
    fmt = f" ({cfg['env']['harness']['prompt_format']})" if summary.get("lean", True) else ""
    n = int(cfg["samples"])
    samples = f"n = {n} sample{'s' if n != 1 else ''} per task"
    own = harness == env_id.split(":")[-1] or not summary.get("lean", True)
    return f"{env_id}: {model_name(summary)}\n" + (samples if own else f"{harness}{fmt}, {samples}")


def pass_at_k_figure(curve: Mapping[str, Mapping[str, float | int]], title: str = "") -> Any:
    """The pass@k figure: pass@k (%) against k on a log2 axis with plain-number ticks, the
    overall curve in bold and the largest categories, each labelled with its task count.

    The axes follow the data: with one sample per task (only pass@1) the figure is a bar per
    category instead of one dot per curve; the pass-rate axis ends a little above the highest
    value (at least 10%; 100% when every value is 0); points on 0 are drawn whole, not half
    under the axis; and when no task was solved the figure says so in words."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator

    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=150)
    ranked = sorted(curve.items(), key=lambda kv: (kv[0] != "all", -int(kv[1]["tasks"]), kv[0]))
    shown: list[tuple[str, int, list[tuple[int, float]]]] = []
    for name, row in ranked[:9]:
        pts = sorted((int(k[5:]), 100 * float(v)) for k, v in row.items() if k.startswith("pass@"))
        if pts:
            shown.append((name, int(row["tasks"]), pts))
    kmax = max((pts[-1][0] for _, _, pts in shown), default=1)
    top = max((y for _, _, pts in shown for _, y in pts), default=0.0)
    ax.set_ylabel("pass@k (%)" if kmax > 1 else "pass@1 (%)")
    # the pass-rate axis: up to a round number above the highest value (at least 10%); all
    # zero: the whole 0-100 scale, with a note
    ceiling = min(100.0, max(10.0, 10.0 * -(-top * 1.15 // 10))) if top > 0 else 100.0
    ax.set_ylim(0.0, ceiling)
    ax.grid(True, axis="y", alpha=0.3)
    if kmax == 1:
        # one sample per task: pass@1 per category, as bars (a curve would be one dot)
        names = [f"{name}\n({tasks} tasks)" for name, tasks, _ in shown]
        values = [pts[0][1] for _, _, pts in shown]
        colors = ["black" if name == "all" else "tab:blue" for name, _, _ in shown]
        bars = ax.bar(range(len(values)), values, color=colors, alpha=0.8, width=0.6)
        ax.bar_label(bars, labels=[f"{v:.1f}%" for v in values], fontsize=7, padding=2)
        ax.set_xticks(range(len(values)), names, fontsize=7)
        ax.set_xlabel("category (n = 1 sample per task: pass@1 only)")
    else:
        for name, tasks, pts in shown:
            xs, ys = zip(*pts, strict=True)
            style: dict[str, Any] = (
                {"linewidth": 2.5, "color": "black", "zorder": 3}
                if name == "all"
                else {"linewidth": 1.2, "alpha": 0.85}
            )
            ax.plot(
                xs, ys, marker="o", markersize=2.5, label=f"{name} ({tasks} tasks)",
                clip_on=False, **style,
            )  # fmt: skip
        ax.set_xscale("log", base=2)
        ticks = sorted({2**i for i in range(kmax.bit_length()) if 2**i <= kmax} | {kmax})
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([str(t) for t in ticks])
        ax.set_xlim(0.9, kmax * 1.1)
        ax.set_xlabel("k (samples drawn per task)")
        ax.grid(True, axis="x", alpha=0.3)
    if title:
        ax.set_title(title, fontsize=9)
    if not shown:
        note = "no task has all its samples recorded yet: nothing to plot"
    elif top == 0:
        note = (
            f"no task solved: pass@k is 0 for every k up to {kmax}"
            if kmax > 1
            else "no task solved: pass@1 is 0"
        )
    else:
        note = ""
    if note:
        ax.text(0.5, 0.55, note, transform=ax.transAxes, ha="center", fontsize=9, color="0.3")
    if ax.get_lines():  # a run with no complete task yet has no curve to label
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return fig


def _plot(curve: Mapping[str, Mapping[str, float | int]], path: Path, title: str = "") -> bool:
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig = pass_at_k_figure(curve, title)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return True


def _markdown(s: Mapping[str, Any], png: str | None) -> str:
    cfg, res, ver = s["config"], s["results"], s["versions"]
    ks = s["ks"]
    lines = [f"# Evaluation: {cfg['env']['id']} with {model_name(s)}", ""]
    lines += [f"> **Warning:** {w}\n" for w in s.get("warnings", [])]
    if s.get("generate_only"):
        return "\n".join([*lines, *_generate_only_lines(s)]) + "\n"
    if s.get("lean", True):  # summaries from before the key were all Lean's
        parts = (
            f"- harness: `{cfg['env']['harness']['name']}` (prompt format "
            f"`{cfg['env']['harness']['prompt_format']}`), runtime: `{cfg['env']['runtime']['name']}`"
        )
    else:  # the environment's own harness and checker (no prompt format, no Lean runtime)
        options = cfg["env"]["harness"].get("options") or {}
        shown = ", ".join(f"{k} {v}" for k, v in sorted(options.items()))
        parts = (
            f"- harness: `{harness_name(s)}`{f' ({shown})' if shown else ''}, checker: "
            f"`{s.get('runtime', {}).get('name')}` (answers checked in Python)"
        )
    lines += [
        parts,
        f"- backend: `{cfg['policy']['backend']}`, samples per task: {cfg['samples']}, "
        f"temperature {cfg['sampling']['temperature']}, top_p {cfg['sampling']['top_p']}, "
        f"max_tokens {cfg['sampling']['max_tokens']}, seed {cfg['sampling']['seed']}",
        f"- tasks: {res['tasks']} ({res['tasks_complete']} complete), attempts: "
        f"{res['attempts']}, accepted: {res['accepted']}, solved tasks: {res['solved']}",
    ]
    if s.get("lean", True):
        lines += [
            f"- Lean that ran: {ver.get('lean_ran') or 'not reported by the runtime'}"
            + ("" if "lean_ran" in ver else " (nothing was checked in the last invocation)"),
            f"- Lean: {ver.get('lean_toolchain')}, Mathlib: {ver.get('mathlib_rev')} (the "
            "taskset's)"
            + (
                f"; Lean project used: {ver.get('lean_project')} (toolchain "
                f"{ver.get('lean_project_toolchain')}, Mathlib "
                f"{ver.get('lean_project_mathlib_rev')})"
                if ver.get("lean_project")
                else ""
            ),
        ]
    lines += [
        f"- leanrl {ver.get('leanrl')}, model revision: {ver.get('model_revision')}",
        "",
        "## pass@k",
        "",
        "| group | tasks | " + " | ".join(f"pass@{k}" for k in ks) + " |",
        "|---|---:|" + "---:|" * len(ks),
    ]
    table = res["pass_at_k"]
    order = ["all", *sorted(k for k in table if k != "all")]
    for name in order:
        row = table[name]
        cells = [f"{100 * row[f'pass@{k}']:.1f}%" if f"pass@{k}" in row else "-" for k in ks]
        label = "**all**" if name == "all" else name
        lines.append(f"| {label} | {row['tasks']} | " + " | ".join(cells) + " |")
    lines += ["", "pass@k uses the unbiased estimator of Chen et al. (2021).", ""]
    if png:
        lines += [f"![pass@k]({png})", ""]
    lines += ["## Verdicts", "", "| verdict reason | attempts |", "|---|---:|"]
    lines += [f"| {k} | {v} |" for k, v in res["reasons"].items()]
    t = s.get("timing", {})
    if t:
        lines += [
            "",
            "## Time",
            "",
            f"- wall time of the last invocation: {t.get('wall_s', 0):.1f} s, "
            f"{t.get('attempts_per_s', 0):.2f} attempts/s",
        ]
    return "\n".join(lines) + "\n"


# Taskset fields that only choose which tasks run: `verify` matches rows by name over all splits.
_SELECTION = {"split", "limit", "names", "pattern", "shuffle", "seed"}


def _flags(prefix: str, given: Any, default: Any) -> list[str]:
    """``--prefix.field value`` for each leaf of ``given`` that differs from ``default``."""
    if isinstance(given, Mapping) and isinstance(default, Mapping):
        out: list[str] = []
        for key, value in given.items():
            if prefix == "--env.taskset" and key in _SELECTION:
                continue
            name = f"{prefix}.{key.replace('_', '-')}"
            out += _flags(name, value, default.get(key))
        return out
    if given == default:
        return []
    if isinstance(given, (Mapping, list)):
        import json

        text = json.dumps(given)
    elif isinstance(given, bool):  # a flag: --x.name, or --x.no-name
        head, _, name = prefix.rpartition(".")
        return [prefix if given else f"{head}.no-{name}"]
    else:
        text = str(given)
    return [prefix, text]


def verify_command(env: Mapping[str, Any], completions: str | Path) -> str:
    """The ``leanrl verify`` command that checks an eval's ``completions.jsonl`` against the
    same statements and runtime: ``--env ID`` plus every taskset and runtime option the eval set
    (a local ``path``, renamed ``columns``, a ``lean_project``...), shell-quoted."""
    import shlex

    from leanrl.environment import EnvironmentConfig

    default = EnvironmentConfig(id=env["id"]).model_dump(mode="json")
    args = ["leanrl", "verify", str(completions), "--env", str(env["id"])]
    for part in ("taskset", "runtime"):
        args += _flags(f"--env.{part}", env.get(part) or {}, default.get(part) or {})
    return shlex.join(args)


def _generate_only_lines(s: Mapping[str, Any]) -> list[str]:
    cfg, res = s["config"], s["results"]
    unchecked = res["reasons"].get("unchecked", 0)
    lean = s.get("lean", True)  # summaries from before the key were all Lean's
    check = (
        f"- check them{' where Lean is installed' if lean else ''}: "
        f"`{verify_command(cfg['env'], s.get('completions') or 'completions.jsonl')}`"
        if unchecked
        else f"- no completion holds {'a proof' if lean else 'an answer'}: nothing to verify"
    )
    return [
        f"Completions only (`--generate-only`): nothing was checked{' by Lean' if lean else ''}, "
        "so there is no pass@k yet.",
        "",
        f"- tasks: {res['tasks']}, samples per task: {cfg['samples']}, completions: "
        f"{res['attempts']}, with {'a proof' if lean else 'an answer'} to check: {unchecked}",
        check,
        "",
        f"| {'before Lean' if lean else 'unchecked'} | attempts |",
        "|---|---:|",
        *(f"| {k} | {v} |" for k, v in res["reasons"].items()),
    ]
