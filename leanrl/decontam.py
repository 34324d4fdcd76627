"""Decontamination: drop training rows that are evaluation benchmark problems in disguise.

The matching (statement keys, informal n-grams, the report) is :mod:`leanrl.decontam_match`;
this module adds what needs the environment layer: loading the benchmarks through their
environments (every split), from a local copy (``minif2f=path``) or the hub. Every drop is
reported with the benchmark task it matched.
"""

from __future__ import annotations

from collections.abc import Sequence

from leanrl.decontam_config import DecontaminationConfig
from leanrl.decontam_match import (
    BenchmarkIndex,
    DecontaminationMatch,
    DecontaminationReport,
    drop_matches,
    informal_ngrams,
    save_taskset_report,
    statement_key,
    write_report,
)
from leanrl.environment import load_environment
from leanrl.errors import ConfigError
from leanrl.task import Task

__all__ = [
    "BenchmarkIndex",
    "DecontaminationMatch",
    "DecontaminationReport",
    "decontaminate",
    "informal_ngrams",
    "save_taskset_report",
    "statement_key",
    "write_report",
]


def decontaminate(
    tasks: Sequence[Task],
    config: DecontaminationConfig,
    index: BenchmarkIndex | None = None,
    *,
    announce: bool = True,
) -> tuple[list[Task], DecontaminationReport]:
    """``tasks`` without those matching a benchmark of ``config``, and the report.

    ``index``: benchmarks already loaded (default: load them from ``config.against``).
    ``announce``: log the report's summary (False where the caller prints it).
    """
    if not config.against and index is None:
        raise ConfigError(
            "decontamination needs benchmarks to check against: give `against` "
            "(e.g. --against minif2f=data/minif2f.jsonl,proofnet=data/proofnet.jsonl)"
        )
    index = index or BenchmarkIndex.load(config, load_environment)
    return drop_matches(tasks, config, index, announce=announce)
