"""Run a function on N real ranks (fresh processes, gloo over loopback), as torchrun would.

Each child gets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, exactly the variables
``torchrun`` sets, so the code under test initialises ``torch.distributed`` itself. On ranks
other than 0 every method that writes to the run folder (``RunDir``'s, the ES history's, and the
kept proofs' ``ProofStore``, whose ``open`` may cut a torn line) is replaced by one that fails
the rank: a test that passes has shown that only rank 0 wrote to the run folder.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_WRITES = ("log", "save_checkpoint", "bind_config", "truncate_metrics", "plot")


def _forbid_writes(rank: int) -> None:
    from leanrl.train.common import RunDir

    def refuse(name: str) -> Callable[..., Any]:
        def method(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError(f"rank {rank} called {name}: only rank 0 may write")

        return method

    for name in _WRITES:
        setattr(RunDir, name, refuse(f"RunDir.{name}"))
    from leanrl.train.es.history import ESHistory

    for name in ("append", "_create"):
        setattr(ESHistory, name, refuse(f"ESHistory.{name}"))
    from leanrl.proofs import ProofStore

    for name in ("open", "add"):  # add_rollouts goes through add
        setattr(ProofStore, name, refuse(f"ProofStore.{name} (proofs.jsonl)"))


def _child(
    rank: int,
    world: int,
    port: int,
    env: dict[str, str],
    fn: Callable[..., Any],
    args: tuple[Any, ...],
) -> None:
    # The caller's environment as it is now (a forked rank would otherwise have the fork
    # server's, from when it started), as a spawned process gets it.
    os.environ.clear()
    os.environ.update(env)
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        TORCHELASTIC_RUN_ID="leanrl-test",
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    import torch

    torch.set_num_threads(1)
    if rank != 0:
        _forbid_writes(rank)
    fn(*args)


# What every rank imports anyway. A fork server imports these once per test process, and each
# rank is forked from it instead of importing them afresh (spawned: ~3 s of CPU per rank, most
# of a short test's). The server is a fresh interpreter that imported modules and ran nothing
# (no model, no thread pool, no CUDA), so a rank forked from it starts as clean as a spawned
# one; it gets the caller's environment (``_child``), working folder and ``sys.path``.
_PRELOAD = [
    "torch",
    "torch.distributed",
    "safetensors.torch",
    "transformers",
    "transformers.models.llama.modeling_llama",
]


def _start_method() -> str:
    import multiprocessing

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return "spawn"  # Windows
    multiprocessing.set_forkserver_preload(_PRELOAD)  # only read when the server starts
    return "forkserver"


def run_ranks(world: int, fn: Callable[..., Any], *args: Any) -> None:
    """``fn(*args)`` on ``world`` fresh ranks; raises if any rank fails (with its traceback)."""
    import torch.multiprocessing as mp

    mp.start_processes(
        _child,
        args=(world, free_port(), dict(os.environ), fn, args),
        nprocs=world,
        start_method=_start_method(),
    )
