"""pass@k against values worked out by hand from 1 - C(n-c, k) / C(n, k)."""

from __future__ import annotations

import math

import pytest

from leanrl.eval import pass_at_k, pass_at_k_table


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 1, 1, 1 / 4),  # 1 - C(3,1)/C(4,1) = 1 - 3/4
        (4, 1, 2, 1 / 2),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (4, 1, 4, 1.0),  # n - c < k: every draw of 4 contains the correct one
        (5, 2, 2, 7 / 10),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (10, 3, 5, 11 / 12),  # 1 - C(7,5)/C(10,5) = 1 - 21/252
        (8, 0, 8, 0.0),
        (8, 8, 1, 1.0),
        (1, 1, 1, 1.0),
    ],
)
def test_pass_at_k_by_hand(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_matches_the_binomial_formula_for_large_n() -> None:
    for n, c, k in [(200, 7, 16), (1024, 3, 100), (64, 50, 32)]:
        exact = 1 - math.comb(n - c, k) / math.comb(n, k)
        assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-9)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="c <= n"):
        pass_at_k(4, 5, 1)


def test_table_overall_and_per_category() -> None:
    counts = {"a1": (4, 1), "a2": (4, 0), "b1": (4, 4), "x": (4, 2)}
    cats = {"a1": "alg", "a2": "alg", "b1": "nt", "x": None}
    t = pass_at_k_table(counts, [1, 2, 4], cats)
    # pass@1: (1/4 + 0 + 1 + 2/4) / 4 = 0.4375
    assert t["all"]["pass@1"] == pytest.approx(0.4375)
    # pass@2: (1/2 + 0 + 1 + (1 - C(2,2)/C(4,2) = 5/6)) / 4
    assert t["all"]["pass@2"] == pytest.approx((0.5 + 0 + 1 + 5 / 6) / 4)
    assert t["all"]["pass@4"] == pytest.approx(3 / 4)
    assert t["alg"] == {"tasks": 2, "pass@1": 0.125, "pass@2": 0.25, "pass@4": 0.5}
    assert t["nt"]["pass@1"] == 1.0 and t["all"]["tasks"] == 4
    assert "x" not in t and None not in t
    # a k above some task's sample count is left out rather than guessed
    assert "pass@8" not in pass_at_k_table(counts, [8])["all"]
