"""``leanrl decontaminate``: write a training set without the rows that match a benchmark.

Imports nothing heavy at module level (the CLI lists every command at start-up).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic import Field

from leanrl.config import ConfigCommand
from leanrl.decontam_config import DecontaminationConfig
from leanrl.environment import EnvironmentConfig

__all__ = ["DecontaminateCommand", "task_row"]


class DecontaminateCommand(ConfigCommand, DecontaminationConfig):
    """Drop training rows whose statement (or, with --informal_ngram, informal text) matches a
    row of the evaluation benchmarks; write the kept rows and a report of what was dropped.

    Example: leanrl decontaminate --env goedel-pset --env.taskset.path goedel.jsonl --against
    minif2f=data/minif2f.jsonl,proofnet=data/proofnet.jsonl --out runs/goedel-clean. The folder
    gets kept.jsonl (load it with --env dataset --env.taskset.path runs/goedel-clean/kept.jsonl),
    dropped.jsonl, decontamination.json and decontamination.md.
    """

    env: EnvironmentConfig = Field(default_factory=lambda: EnvironmentConfig(id="dataset"))
    """The training set (``--env goedel-pset``, or ``--env dataset --env.taskset.path F``)."""
    out: Path | None = None
    """Output folder. Default: ``runs/decontaminate-<env>``."""

    def cli_cmd(self) -> None:
        from leanrl.decontam import decontaminate, write_report
        from leanrl.environment import load_environment

        cmd = self.resolved()
        config = DecontaminationConfig(against=cmd.against, informal_ngram=cmd.informal_ngram)
        if not config.against:
            from leanrl.errors import ConfigError

            raise ConfigError(
                "nothing to check against: give --against ENV=PATH[,ENV=PATH...] "
                "(e.g. minif2f=data/minif2f.jsonl)"
            )
        # The training set's own decontamination option is this command's job here.
        taskset = cmd.env.taskset.model_copy(update={"decontaminate": DecontaminationConfig()})
        env = load_environment(cmd.env.model_copy(update={"taskset": taskset}))
        tasks = env.tasks()
        kept, report = decontaminate(tasks, config, announce=False)  # printed below
        slug = re.sub(r"[^\w.-]+", "_", cmd.env.id)
        out = cmd.out or Path("runs") / f"decontaminate-{slug}"
        out.mkdir(parents=True, exist_ok=True)
        dropped_ids = {m.task_id for m in report.dropped}
        _write_jsonl(out / "kept.jsonl", (task_row(t) for t in kept))
        _write_jsonl(
            out / "dropped.jsonl",
            (
                {**task_row(t), "matched": m.model_dump(mode="json")}
                for t, m in zip(
                    [t for t in tasks if t.id in dropped_ids], report.dropped, strict=True
                )
            ),
        )
        write_report(report, out)
        print(report.summary())
        print(f"kept rows: {out / 'kept.jsonl'}\nreport:    {out / 'decontamination.md'}")


def task_row(task: Any) -> dict[str, Any]:
    """A task as one JSONL row in leanrl's own schema (loadable with ``--env dataset``)."""
    row = {
        "name": task.name,
        "id": task.id,
        "header": task.header,
        "formal_statement": task.formal_statement,
        "informal_statement": task.informal_statement,
        "split": task.split,
        "source": task.source,
    }
    return {**task.extra, **row}


def _write_jsonl(path: Path, rows: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False, default=str) + "\n")
    tmp.replace(path)
