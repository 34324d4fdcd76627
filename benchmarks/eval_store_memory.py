"""Memory an eval's result store holds: a small index per attempt vs every whole record.

``index`` is :class:`leanrl.eval.store.ResultStore` as it is (the full records go to
``results.jsonl``; memory keeps key, accepted, verdict reason and token count). ``full`` is the
same store keeping each whole record in memory as well, as it did before (completion, proof,
prompt, Lean's messages: the report needs none of them). Each measurement runs in a fresh
process: ``--attempts`` records (a ``--completion-kb`` completion, its proof, a prompt, one Lean
message) appended in chunks of 64, then the store reopened (a resume reads them all back).
Reported: RSS growth of each phase; modes alternate round by round. Also the size of
``results.jsonl`` against the same records each written with its proof spelled out (as before the
store wrote a proof found inside its completion as offsets).

    python benchmarks/eval_store_memory.py [--attempts 20000 --completion-kb 4 --rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

MODES = ("full", "index")


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child(mode: str, attempts: int, kb: int, folder: Path) -> dict[str, float]:
    from leanrl.eval.store import ResultStore

    class FullStore(ResultStore):
        """The store as it was: every whole record kept in memory."""

        def append(self, records: Any) -> int:
            records = list(records)
            n = super().append(records)
            self.records.update({(r["task_id"], r["sample"]): r for r in records})
            return n

        def _reconcile(self) -> Any:
            super()._reconcile()
            out: dict[Any, Any] = {}
            if not self.results_path.is_file():
                return out
            with self.results_path.open() as f:
                for line in f:
                    r = json.loads(line)
                    out[(r["task_id"], r["sample"])] = r
            return out

    cls = FullStore if mode == "full" else ResultStore
    completion = "x" * (kb * 1024)

    def rec(i: int) -> dict[str, Any]:
        # str(i) makes every string a distinct object, as records read from a model are
        return {
            "task_id": f"t{i // 8}", "sample": i % 8, "accepted": i % 5 == 0, "reward": 0.0,
            "verdict": {"reason": "error", "messages": [{"data": "unknown tactic " + str(i)}]},
            "completion": completion + str(i), "proof": completion[:1024] + str(i),
            "prompt": "Complete the following Lean 4 code " + str(i) * 50,
            "completion_tokens": kb * 256,
        }  # fmt: skip

    base = _rss_mb()
    st = cls(folder)
    st.open("fp", {}, "")
    for lo in range(0, attempts, 64):
        st.append(rec(i) for i in range(lo, min(lo + 64, attempts)))
    grown = _rss_mb() - base
    st.close()
    del st
    base2 = _rss_mb()
    again = cls(folder)
    again.open("fp", {}, "")
    reopened = _rss_mb() - base2
    assert len(again.records) == attempts
    spelled = sum(
        len((json.dumps(r, ensure_ascii=False) + "\n").encode()) for r in again.full_records()
    )
    again.close()
    disk = (folder / "results.jsonl").stat().st_size
    return {"run_mb": grown, "resume_mb": reopened, "disk_mb": disk / 2**20,
            "spelled_mb": spelled / 2**20}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--attempts", type=int, default=20000)
    ap.add_argument("--completion-kb", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.attempts, a.completion_kb, a.folder)))
        return
    res: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for r in range(a.rounds):
        for m in MODES if r % 2 == 0 else MODES[::-1]:
            with tempfile.TemporaryDirectory() as tmp:
                out = subprocess.run(
                    [sys.executable, __file__, "--child", m, "--attempts", str(a.attempts),
                     "--completion-kb", str(a.completion_kb), "--folder", tmp],
                    capture_output=True, text=True, check=True,
                ).stdout  # fmt: skip
            res[m].append(json.loads(out.strip().splitlines()[-1]))
    print(f"{a.attempts} attempts with {a.completion_kb} KB completions, {a.rounds} rounds")
    for m in MODES:
        for phase in ("run_mb", "resume_mb"):
            v = [x[phase] for x in res[m]]
            print(
                f"  {m:5s} {phase:9s} min {min(v):7.1f} MB  median {statistics.median(v):7.1f} MB  max {max(v):7.1f} MB"
            )
    d = res["index"][0]
    print(
        f"results.jsonl: {d['disk_mb']:.1f} MB; with every proof spelled out "
        f"{d['spelled_mb']:.1f} MB ({d['spelled_mb'] / d['disk_mb']:.2f}x)"
    )
    for phase in ("run_mb", "resume_mb"):
        full = statistics.median(x[phase] for x in res["full"])
        idx = statistics.median(x[phase] for x in res["index"])
        print(f"full / index ({phase}): {full / max(idx, 1e-9):.1f}x")


if __name__ == "__main__":
    main()
