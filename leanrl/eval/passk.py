"""pass@k with the unbiased estimator of Chen et al. (2021), "Evaluating Large Language Models
Trained on Code": with ``n`` samples of which ``c`` are correct,

    pass@k = 1 - C(n - c, k) / C(n, k),

averaged over tasks. Computed as a product so that large ``n`` does not overflow.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

__all__ = ["pass_at_k", "pass_at_k_table", "solved"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of ``k`` samples drawn without replacement from ``n``
    samples, ``c`` of them correct, is correct."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
    fail = 1.0
    for i in range(n - c + 1, n + 1):
        fail *= 1.0 - k / i
    return 1.0 - fail


def pass_at_k_table(
    counts: Mapping[str, tuple[int, int]],
    ks: Iterable[int],
    groups: Mapping[str, str | None] | None = None,
) -> dict[str, dict[str, float | int]]:
    """pass@k for each k, over all tasks and per group.

    ``counts`` maps task id to (samples, correct). ``groups`` maps task id to its category
    (None: not grouped). Returns ``{"all": {"tasks": N, "pass@1": ...}, "<category>": {...}}``;
    a k larger than a task's sample count is left out for that table.
    """
    ks = sorted(set(ks))
    buckets: dict[str, list[tuple[int, int]]] = {"all": list(counts.values())}
    if groups:
        for tid, nc in counts.items():
            cat = groups.get(tid)
            if cat is not None:
                buckets.setdefault(cat, []).append(nc)
    table: dict[str, dict[str, float | int]] = {}
    for name, rows in buckets.items():
        row: dict[str, float | int] = {"tasks": len(rows)}
        for k in ks:
            if rows and all(n >= k for n, _ in rows):
                row[f"pass@{k}"] = sum(pass_at_k(n, c, k) for n, c in rows) / len(rows)
        table[name] = row
    return table


def solved(counts: Sequence[tuple[int, int]]) -> int:
    """Tasks with at least one correct sample."""
    return sum(1 for _, c in counts if c > 0)
