"""Per-check latency of the verification service over TCP: TCP_NODELAY vs Nagle's algorithm.

Two service processes run the same app on loopback, with the echo test runtime (no Lean, so the
time is all HTTP): ``nodelay`` binds the way ``leanrl serve`` does now (an ``IPPROTO_TCP`` socket,
TCP_NODELAY on every accepted connection); ``nagle`` binds the way it did before (a plain
``socket.socket()``, on which asyncio never sets TCP_NODELAY, and uvicorn's default protocol).
One client (:class:`leanrl.service.client.ServiceClient`, a kept-alive connection) sends
single-attempt checks one after the other; the two modes alternate, round by round.

    python benchmarks/service_latency.py [--checks 200 --rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
MODES = ("nagle", "nodelay")


def child(mode: str, port_file: Path) -> None:
    """Serve the echo runtime on 127.0.0.1:<free port> in ``mode``; write the port."""
    import uvicorn

    sys.path.insert(0, str(TESTS))
    from _echo_runtime import EchoRuntime

    from leanrl._sandbox_config import ServiceLimits
    from leanrl.service.app import ServiceConfig, create_app
    from leanrl.service.cli import ServeCommand
    from leanrl.service.connections import uvicorn_settings
    from leanrl.service.server import _bind

    limits = ServiceLimits()
    app = create_app(EchoRuntime(), ServiceConfig(limits=limits))
    if mode == "nodelay":
        sock = _bind(ServeCommand(port=0))
        extra = uvicorn_settings(limits, app.state.service.connections)
    else:  # what `leanrl serve` did before: protocol 0, so asyncio skips TCP_NODELAY
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        extra = {"limit_concurrency": 1000, "http": "h11"}
    sock.listen(128)
    port_file.write_text(str(sock.getsockname()[1]))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", **extra))
    asyncio.run(server.serve(sockets=[sock]))


def start(mode: str, folder: Path) -> tuple[subprocess.Popen[bytes], int]:
    port_file = folder / f"{mode}.port"
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", mode, "--port-file", str(port_file)],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    for _ in range(600):
        if port_file.exists() and port_file.read_text():
            return proc, int(port_file.read_text())
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{mode} server did not start")


async def measure(port: int, checks: int) -> list[float]:
    """Seconds per check for ``checks`` sequential single-attempt checks (after one warm-up)."""
    from leanrl.service.client import ServiceClient
    from leanrl.verdict import Attempt

    a = Attempt(name="t", header="", formal_statement="theorem t : True := by", proof="ok")
    out = []
    async with ServiceClient(f"http://127.0.0.1:{port}") as c:
        await c.check([a])
        for _ in range(checks):
            t0 = time.perf_counter()
            await c.check([a])
            out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--checks", type=int, default=200, help="checks per mode per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--port-file", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.port_file)
        return
    with tempfile.TemporaryDirectory() as tmp:
        procs = {m: start(m, Path(tmp)) for m in MODES}
        medians: dict[str, list[float]] = {m: [] for m in MODES}
        try:
            for r in range(args.rounds):
                order = MODES if r % 2 == 0 else MODES[::-1]  # alternate who goes first
                for m in order:
                    times = asyncio.run(measure(procs[m][1], args.checks))
                    medians[m].append(statistics.median(times))
        finally:
            for proc, _ in procs.values():
                proc.terminate()
                proc.wait()
    print(f"per-check latency, median of {args.checks} checks per round, {args.rounds} rounds")
    for m in MODES:
        v = [1e3 * x for x in medians[m]]
        print(
            f"  {m:8s} min {min(v):7.2f} ms  median {statistics.median(v):7.2f} ms  max {max(v):7.2f} ms"
        )
    ratios = [a / b for a, b in zip(medians["nagle"], medians["nodelay"], strict=True)]
    print(
        f"nagle / nodelay: min {min(ratios):.1f}x  median {statistics.median(ratios):.1f}x  "
        f"max {max(ratios):.1f}x"
    )


if __name__ == "__main__":
    main()
