"""``leanrl interop traces``: convert verifiers' results to leanrl's kept proofs and back.

Imports nothing heavy at module level (the CLI lists every command at start-up).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import CliPositionalArg

from leanrl.config import ConfigCommand

__all__ = ["TracesCommand"]


class TracesCommand(ConfigCommand):
    """Convert verifiers' traces.jsonl into leanrl's proofs.jsonl (for train sft and expert
    iteration), or a proofs.jsonl into verifiers' traces.jsonl.

    Examples: leanrl interop traces outputs/my-run --to proofs --out runs/vf/proofs.jsonl;
    leanrl interop traces runs/grpo/proofs.jsonl --to verifiers --out outputs/from-leanrl
    """

    src: CliPositionalArg[Path]
    """A verifiers run folder or traces.jsonl (``--to proofs``), or a leanrl run folder or
    proofs.jsonl (``--to verifiers``)."""
    to: Literal["proofs", "verifiers"]
    """``proofs``: verifiers -> leanrl (solved traces are appended, deduplicated);
    ``verifiers``: leanrl -> verifiers (the file is replaced)."""
    out: Path
    """The file to write (``proofs.jsonl`` / ``traces.jsonl``), or a folder to write it in."""
    solved_at: float = Field(default=1.0)
    """``--to proofs``: a trace of a taskset other than leanrl's is kept when its reward
    reaches this (leanrl's own tasks are kept when leanrl's verdict accepted them)."""
    env_id: str | None = None
    """``--to verifiers``: the verifiers env id the episodes are written under (default: a
    verifiers task's own taskset, ``leanrl-verifiers`` for a leanrl task)."""
    leanrl_env: str | None = None
    """``--to verifiers``: the leanrl environment the proofs are of, whose harness writes the
    prompt (default: what the run folder's config says, else Countdown for Countdown puzzles
    and the Lean whole-proof chat prompt for the rest)."""

    def cli_cmd(self) -> None:
        from leanrl.interop.traces import proofs_to_vf, vf_to_proofs

        cmd = self.resolved()
        if cmd.to == "proofs":
            report = vf_to_proofs(cmd.src, cmd.out, solved_at=cmd.solved_at)
        else:
            report = proofs_to_vf(cmd.src, cmd.out, env_id=cmd.env_id, env=cmd.leanrl_env)
        print(f"{report.summary()} -> {cmd.out}")
