"""In-run held-out evaluation: the eval runner, on the weights being trained, every N steps.

:func:`evaluate` runs :func:`leanrl.eval.run_eval` with a policy over the live model (no copy,
no reload), writes the evaluation to ``RUN/eval/step-N/`` and returns the metrics the trainer
merges into that step's ``metrics.jsonl`` row. The evaluation resumes like any eval run, so a
trainer that died mid-evaluation redoes only what is missing. :func:`plot_eval` draws
``eval_curve.png``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from leanrl.eval.config import EvalConfig
from leanrl.policy import Policy, PolicyConfig, Prompt
from leanrl.train.common import RunDir
from leanrl.train.hf_policy import TrainPolicy
from leanrl.train.inrun_eval_config import InRunEvalConfig
from leanrl.train.prompt_ids import prompt_token_ids

__all__ = ["LivePolicy", "evaluate", "plot_eval"]

log = logging.getLogger("leanrl.train.eval")


class LivePolicy(TrainPolicy):
    """Samples from the live model, with prompts tokenized exactly as ``leanrl eval``'s ``hf``
    policy tokenizes them (so in-run figures match a later ``leanrl eval`` of the checkpoint)."""

    name = "live"

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        return prompt_token_ids(self.tokenizer, prompt, self.config.chat)


async def evaluate(
    config: InRunEvalConfig,
    step: int,
    run: RunDir,
    model: Any,
    tokenizer: Any,
    policy: PolicyConfig,
    live: Policy | None = None,
    out: Path | None = None,
) -> dict[str, Any]:
    """pass@k of the live ``model`` on ``config.env``; the metrics for step ``step``'s row.

    ``live``: a policy that already generates with the trained weights (a vLLM server the
    trainer pushes to), used instead of one over ``model``. ``out``: where the evaluation
    goes (default ``RUN/eval/step-N``; a mixed run's parts each have a folder in it)."""
    from leanrl.eval.runner import run_eval

    assert config.env is not None
    out = out or run.path / "eval" / f"step-{step}"
    eval_cfg = EvalConfig(
        env=config.env,
        policy=policy,
        sampling=config.sampling,
        samples=config.samples,
        k=config.ks,
        out=out,
        progress=False,
    )
    was_training = bool(getattr(model, "training", False))
    if live is None:
        live = LivePolicy(policy, model, tokenizer)
    try:
        # progress as log lines beside the trainer's own (a long evaluation would be silent)
        summary = await run_eval(
            eval_cfg, policy=live, progress_label=f"held-out eval at step {step}"
        )
    finally:
        model.train(was_training)
    table = summary["results"]["pass_at_k"]["all"]
    row: dict[str, Any] = {f"eval/pass@{k}": table.get(f"pass@{k}") for k in config.ks}
    row["eval/tasks"] = table.get("tasks")
    row["eval/time_s"] = summary["timing"]["wall_s"]
    log.info(
        "eval at step %d on %s: %s",
        step,
        config.env.id,
        " ".join(f"pass@{k}={row[f'eval/pass@{k}']}" for k in config.ks),
    )
    return row


def plot_eval(run: RunDir) -> Path | None:
    """Write ``eval_curve.png`` (every logged ``eval/pass@k`` against the step); None when the
    run has no evaluations."""
    rows = [r for r in run.metrics() if any(k.startswith("eval/pass@") for k in r)]
    keys = sorted(
        {k for r in rows for k in r if k.startswith("eval/pass@")},
        key=lambda k: int(k.split("@")[1]),
    )
    if not rows:
        return None
    try:
        import matplotlib
    except ImportError:
        # Called from every trainer's `finally`: a missing extra must not replace the run's own
        # outcome (or its error) with an ImportError.
        from leanrl._dist import install_hint

        log.warning("eval_curve.png not drawn: matplotlib is missing (%s)", install_hint("train"))
        return None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    for key in keys:
        pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", lw=1.5, label=key[5:])
    ax.set_xlabel("step")
    # steps are whole numbers: no 2.5 tick on a short run
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("held-out pass rate")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"in-run eval ({run.path.name})")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out = run.path / "eval_curve.png"
    fig.savefig(out)
    plt.close(fig)
    return out
