"""The eval runner: ``leanrl eval`` and :func:`run_eval` (pass@k, results.jsonl, report)."""

from __future__ import annotations

from leanrl.eval.config import EvalConfig
from leanrl.eval.passk import pass_at_k, pass_at_k_table
from leanrl.eval.runner import run_eval, run_eval_sync
from leanrl.eval.store import read_results

__all__ = [
    "EvalConfig",
    "pass_at_k",
    "pass_at_k_table",
    "read_results",
    "run_eval",
    "run_eval_sync",
]
