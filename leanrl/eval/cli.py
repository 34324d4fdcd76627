"""``leanrl eval``: the command-line face of :func:`leanrl.eval.run_eval`.

Imports nothing heavy at module level (the CLI lists every command at start-up).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field

from leanrl.config import ConfigCommand
from leanrl.eval.config import EvalConfig

__all__ = ["EvalCommand", "generate_only_message"]


class EvalCommand(ConfigCommand, EvalConfig):
    """Evaluate a model on an environment: pass@k, every attempt in results.jsonl, a report.

    Example: leanrl eval --env minif2f --model AI-MO/Kimina-Prover-Distill-1.7B
    --env.harness.prompt_format kimina --samples 8 --k 1,8 --limit 8. Rerun the same command to
    resume an interrupted run.
    """

    cli_common: ClassVar[tuple[str, ...]] = (
        "samples", "k", "out", "sampling.temperature", "sampling.max_tokens",
        "env.harness.prompt_format", "env.taskset.path", "env.runtime.workers",
    )  # fmt: skip
    """Options ``--help`` shows in full (the others by name; ``--help-all`` shows every one)."""

    model: str | None = None
    """Shortcut for --policy.model: a local model folder, a Hugging Face id, or (with --backend
    openai) the served model name."""
    backend: Literal["hf", "openai", "vllm"] | None = None
    """Shortcut for --policy.backend (hf: transformers, openai: an OpenAI-compatible server,
    vllm: in-process vLLM)."""
    harness: str | None = None
    """Shortcut for --env.harness.name (whole-proof, tactic-loop or self-correction)."""
    runtime: str | None = None
    """Shortcut for --env.runtime.name (local, docker, modal)."""
    limit: int | None = Field(default=None, ge=1)
    """Shortcut for --env.taskset.limit: evaluate only the first N tasks."""
    print_json: bool = False
    """Print the summary as JSON on stdout instead of the pass@k table."""
    dry_run: bool = False
    """Print the launch plan (functions, GPUs, sandboxes, batches) and an estimated cost, then
    exit without starting anything (``--dry-run``)."""

    def to_eval_config(self) -> EvalConfig:
        """The EvalConfig this command describes (TOML file < flags, shortcuts applied)."""
        return self.build_config(
            EvalConfig,
            "eval config",
            {
                "model": ("policy", "model"),
                "backend": ("policy", "backend"),
                "harness": ("env", "harness", "name"),
                "runtime": ("env", "runtime", "name"),
                "limit": ("env", "taskset", "limit"),
            },
            command_only=("print_json", "dry_run"),
        )

    def cli_cmd(self) -> None:
        from leanrl.eval.runner import run_eval
        from leanrl.launch.cli import launched

        config = self.to_eval_config()
        if launched("eval", config, self.dry_run):
            return
        summary = asyncio.run(run_eval(config))
        for warning in summary.get("warnings", []):
            print(f"leanrl eval: warning: {warning}", file=sys.stderr)
        if self.print_json:
            print(json.dumps(summary, indent=2, default=str))
            return
        if summary.get("generate_only"):
            print(generate_only_message(summary, config))
            return
        table = summary["results"]["pass_at_k"]
        ks = summary["ks"]
        print(f"results in {summary['out']}")
        for name in ["all", *sorted(k for k in table if k != "all")]:
            row = table[name]
            cells = "  ".join(
                f"pass@{k}={100 * row[f'pass@{k}']:.1f}%" for k in ks if f"pass@{k}" in row
            )
            print(f"  {name:<16} tasks={row['tasks']:<4} {cells}")
        print(f"report: {Path(summary['out']) / 'report.md'}")


def generate_only_message(summary: dict[str, Any], config: EvalConfig) -> str:
    """What ``leanrl eval --generate-only`` prints: how many completions were kept and the
    ``leanrl verify`` command that checks them; for an environment judged without Lean
    (Countdown, whose completions hold answers, not proofs) in its own words, and runnable here."""
    from leanrl.eval.report import verify_command

    res = summary["results"]
    kept = res["reasons"].get("unchecked", 0)
    command = verify_command(config.env.model_dump(mode="json"), summary["completions"])
    if not summary.get("lean", True):
        return (
            f"{res['attempts']} completions ({kept} with an answer) in {summary['completions']}\n"
            "nothing was scored (--generate-only); "
            + (f"to score the answers: {command}" if kept else "no answer to score")
        )
    return (
        f"{res['attempts']} completions ({kept} with a proof) in {summary['completions']}\n"
        "nothing was checked (--generate-only); "
        + (f"where Lean is installed: {command}" if kept else "no proof to check")
    )
