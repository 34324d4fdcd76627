"""Make Countdown puzzles: ``python -m leanrl.environments.countdown.generate --out DIR``.

Each puzzle is 3 or 4 numbers from 1 to 99 and a target reached by combining *all* of them with
``+ - * /`` (every intermediate result a positive integer), so every puzzle has a solution, which
is kept in the row (never shown to the model). Splits do not share a (numbers, target) pair. The
files shipped in ``data/`` were made with the defaults (``--seed 0``).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

__all__ = ["main", "make_puzzle", "make_splits"]

_OPS = "+-*/"


def make_puzzle(
    rng: random.Random, count: int, max_number: int = 99, max_target: int = 999
) -> dict:
    """One solvable puzzle: ``numbers``, ``target`` and one ``solution``."""
    while True:
        numbers = [rng.randint(1, max_number) for _ in range(count)]
        # combine in a random order, keeping every intermediate value a positive integer
        items = [(n, str(n)) for n in numbers]
        ok = True
        while len(items) > 1:
            i, j = rng.sample(range(len(items)), 2)
            (a, ea), (b, eb) = items[i], items[j]
            op = rng.choice(_OPS)
            if op == "+":
                v = a + b
            elif op == "-":
                if a <= b:
                    (a, ea), (b, eb) = (b, eb), (a, ea)
                v = a - b
            elif op == "*":
                v = a * b
            else:
                if b == 0 or a % b:
                    (a, ea), (b, eb) = (b, eb), (a, ea)
                if b == 0 or a % b:
                    ok = False
                    break
                v = a // b
            if v <= 0 or v > 10 * max_target:
                ok = False
                break
            items = [x for k, x in enumerate(items) if k not in (i, j)] + [(v, f"({ea} {op} {eb})")]
        if not ok:
            continue
        target, expr = items[0]
        if 1 <= target <= max_target:
            rng.shuffle(numbers)
            return {"numbers": numbers, "target": target, "solution": expr[1:-1]}


def make_splits(seed: int, train: int, test: int) -> dict[str, list[dict]]:
    """``train`` and ``test`` puzzles, disjoint, with names ``countdown_<split>_<i>``."""
    rng = random.Random(seed)
    seen: set[tuple[tuple[int, ...], int]] = set()
    out: dict[str, list[dict]] = {}
    for split, n in (("train", train), ("test", test)):
        rows: list[dict] = []
        while len(rows) < n:
            p = make_puzzle(rng, rng.choice((3, 4)))
            key = (tuple(sorted(p["numbers"])), p["target"])
            if key in seen:
                continue
            seen.add(key)
            rows.append({"name": f"countdown_{split}_{len(rows):04d}", "split": split, **p})
        out[split] = rows
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "data")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train", type=int, default=1000)
    ap.add_argument("--test", type=int, default=200)
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    for split, rows in make_splits(a.seed, a.train, a.test).items():
        path = a.out / f"countdown_{split}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        print(f"{path}: {len(rows)} puzzles")


if __name__ == "__main__":
    main()
