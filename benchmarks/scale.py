"""Scaling GRPO, measured in one run on one random Llama-architecture model (no download).

    python benchmarks/scale.py [--hidden 256 --layers 4 --seqs 32 --repeats 3 --steps 3]

Reports, with the modes alternated repeat by repeat (the order too: odd repeats run the second mode
first) and one torch thread per process, min / median / max of the per-repeat ratios:

1. **2 ranks vs 1 rank**: sequences trained per second by ``GRPOEngine.train_step`` on the same
   batch (``--seqs`` sequences of ``--prompt`` + ``--resp`` tokens), with 2 ranks (gloo over
   loopback, each rank a spawned process with one thread; DDP and FSDP2) against 1 rank (a
   spawned process with one thread). The ratio is the speed-up; 2.0 is perfect scaling. It is
   only meaningful with at least 2 free cores.
2. **LoRA vs full fine-tuning memory** on the same model and batch: the bytes of training state
   (weights + gradients + AdamW moments, summed exactly over the tensors), and the rise of peak
   RSS over the process's RSS after loading the model, each mode in a fresh process.

Ratios are the figures to compare across machines; absolute times depend on the CPU and on what
else runs there.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _engine(a: dict[str, Any], world: Any, strategy: str, lora: int) -> Any:
    from leanrl.policy import PolicyConfig
    from leanrl.train.common import RunDir
    from leanrl.train.grpo.config import GRPOConfig
    from leanrl.train.grpo.engine import GRPOEngine

    cfg = GRPOConfig(
        policy=PolicyConfig(model=a["model"], device="cpu"),
        out=Path(a["tmp"]) / "run",
        tasks_per_step=a["seqs"] // 4,
        group_size=4,
        micro_batch_size=a["micro"],
        lr=1e-5,
        precision="fp32",
        distributed={"strategy": "ddp" if strategy == "single" else strategy},
        lora={"rank": lora},
    )
    engine = GRPOEngine(cfg, RunDir(cfg.out), world)
    engine.load(False)
    return engine


def _batch(a: dict[str, Any], step: int) -> Any:
    import random

    from leanrl.train.grpo.data import _Batch, _Sample

    rng = random.Random(step)
    samples = [
        _Sample(
            prompt=[rng.randrange(4, a["vocab"]) for _ in range(a["prompt"])],
            resp=[rng.randrange(4, a["vocab"]) for _ in range(a["resp"])],
            mask=[1] * a["resp"],
            old=[-6.0] * a["resp"],  # given: no recompute pass
            adv=1.0 if i % 2 else -1.0,
        )
        for i in range(a["seqs"])
    ]
    return _Batch(step, [], [], samples, 0, 0.0, 0.0)


def _env(rank: int, world: int, port: int) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )  # fmt: skip


def _time_child(rank: int, world: int, port: int, strategy: str, a: dict[str, Any]) -> None:
    _env(rank, world, port)
    import torch

    from leanrl.train.distributed import DistributedConfig, World

    torch.set_num_threads(1)
    w = World.from_env(DistributedConfig(strategy=strategy)) if world > 1 else World()
    engine = _engine(a, w, strategy, 0)
    engine.train_step(_batch(a, 0))  # warm-up
    times = []
    for s in range(1, a["steps"] + 1):
        w.barrier()
        t0 = time.perf_counter()
        engine.train_step(_batch(a, s))
        w.barrier()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        Path(a["result"]).write_text(json.dumps(times))
    w.close()


def _time_mode(world: int, strategy: str, a: dict[str, Any]) -> float:
    """Median seconds per train_step with ``world`` spawned ranks."""
    import torch.multiprocessing as mp

    mp.start_processes(
        _time_child, args=(world, _free_port(), strategy, a), nprocs=world, start_method="spawn"
    )
    return statistics.median(json.loads(Path(a["result"]).read_text()))


def _memory_child(rank: int, lora: int, a: dict[str, Any]) -> None:
    _env(0, 1, 0)
    import torch

    from leanrl.train.distributed import World

    torch.set_num_threads(1)
    engine = _engine(a, World(), "single", lora)
    base = _rss_mb()
    for s in range(2):
        engine.train_step(_batch(a, s))
    peak = _peak_mb() - base
    model = engine.model
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    grads = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    adam = sum(
        t.numel() * t.element_size()
        for st in engine.optimizer.state.values()
        for t in st.values()
        if torch.is_tensor(t) and t.dim() > 0
    )
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    out = {"state_mb": (weights + grads + adam) / 2**20, "rss_rise_mb": peak,
           "trainable": trainable}  # fmt: skip
    Path(a["result"]).write_text(json.dumps(out))


def _memory_mode(lora: int, a: dict[str, Any]) -> dict[str, float]:
    import torch.multiprocessing as mp

    mp.start_processes(_memory_child, args=(lora, a), nprocs=1, start_method="spawn")
    return json.loads(Path(a["result"]).read_text())  # type: ignore[no-any-return]


def _stats(xs: list[float]) -> str:
    return f"min {min(xs):.2f} / median {statistics.median(xs):.2f} / max {max(xs):.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--seqs", type=int, default=32, help="sequences per step (multiple of 4)")
    ap.add_argument("--prompt", type=int, default=48)
    ap.add_argument("--resp", type=int, default=64)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per mode and repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--lora-rank", type=int, default=16)
    args = ap.parse_args()
    from leanrl.testing import make_tiny_model

    tmp = tempfile.mkdtemp(prefix="leanrl-scale-")
    texts = [f"theorem t{i} : {i} + {i} = {2 * i} := by omega" for i in range(200)]
    model = make_tiny_model(
        Path(tmp) / "model", texts, vocab_size=args.vocab, hidden_size=args.hidden,
        layers=args.layers,
    )  # fmt: skip
    a = {**vars(args), "model": str(model), "tmp": tmp, "result": str(Path(tmp) / "r.json")}
    a["vocab"] = min(args.vocab, 400)  # ids below the trained tokenizer's size
    ratios: dict[str, list[float]] = {"ddp": [], "fsdp": []}
    one: list[float] = []
    for r in range(args.repeats):
        for strategy in ("ddp", "fsdp"):
            # The order alternates repeat by repeat: a machine that gets busier (or calmer) during
            # the run then weighs on both modes alike instead of always on the second.
            first_two = r % 2 == 1
            if first_two:
                t2 = _time_mode(2, strategy, a)
                t1 = _time_mode(1, "single", a)
            else:
                t1 = _time_mode(1, "single", a)
                t2 = _time_mode(2, strategy, a)
            one.append(args.seqs / t1)
            ratios[strategy].append(t1 / t2)
            print(
                f"repeat {r + 1} {strategy} ({'2 ranks first' if first_two else '1 rank first'}): "
                f"1 rank {t1 * 1e3:.0f} ms, 2 ranks {t2 * 1e3:.0f} ms, ratio {t1 / t2:.2f}"
            )
    mem: dict[str, list[dict[str, float]]] = {"full": [], "lora": []}
    for r in range(args.repeats):
        for mode in ("full", "lora") if r % 2 == 0 else ("lora", "full"):
            mem[mode].append(_memory_mode(0 if mode == "full" else args.lora_rank, a))
    print()
    print(f"model: hidden {args.hidden}, {args.layers} layers; step: {args.seqs} sequences of "
          f"{args.prompt}+{args.resp} tokens, micro-batches of {args.micro}")  # fmt: skip
    print(f"1 rank: {statistics.median(one):.1f} sequences/s (median)")
    for strategy, xs in ratios.items():
        print(f"2 ranks / 1 rank throughput, {strategy}: {_stats(xs)}")
    f, lo = mem["full"], mem["lora"]
    fs = statistics.median(m["state_mb"] for m in f)
    ls = statistics.median(m["state_mb"] for m in lo)
    print(f"training state (weights + grads + AdamW), full: {fs:.1f} MB, LoRA r={args.lora_rank}: "
          f"{ls:.1f} MB, LoRA/full {ls / fs:.2f}")  # fmt: skip
    fr = [m["rss_rise_mb"] for m in f]
    lr = [m["rss_rise_mb"] for m in lo]
    per_repeat = [b / x for x, b in zip(fr, lr, strict=True)]
    print(f"peak RSS rise over 2 steps, full: {_stats(fr)} MB; LoRA: {_stats(lr)} MB; "
          f"LoRA/full per repeat: {_stats(per_repeat)}")  # fmt: skip
    print(f"trainable parameters, full: {int(f[0]['trainable'])}, LoRA: {int(lo[0]['trainable'])}")


if __name__ == "__main__":
    main()
