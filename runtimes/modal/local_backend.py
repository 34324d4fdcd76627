"""A :class:`SandboxBackend` whose "sandboxes" are ``leanrl serve`` processes on this machine.

Same interface as the Modal backend, no account needed: tests and ``benchmarks/pool_latency.py``
use it to exercise the pool, batching, retries and cost accounting with real processes and real
HTTP. It is no isolation boundary; use ``docker`` or ``modal`` for that.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from leanrl.service.sandbox import Sandbox, SandboxBackend, SandboxStartError

__all__ = ["LocalProcessBackend", "LocalSandbox"]

_GRACE_S = 2.0
"""Seconds between SIGTERM and SIGKILL when a sandbox process is terminated."""


@dataclass(eq=False)
class LocalSandbox(Sandbox):
    """A ``leanrl serve`` child process in its own process group."""

    proc: Any = None
    """The ``asyncio.subprocess.Process``."""
    workdir: str = ""
    """Its private temporary folder (port file, log)."""
    _cpu_last: float = 0.0

    async def alive(self) -> bool:
        return self.terminated_at is None and self.proc.returncode is None

    async def exit_reason(self) -> str:
        """Its exit code and the end of its log (``leanrl serve``'s error)."""
        code = self.proc.returncode
        try:
            tail = (Path(self.workdir) / "serve.log").read_text(errors="replace").strip()
        except OSError:
            tail = ""
        lines = tail.splitlines()[-6:]
        return f"exit code {code}" + ("; log ends: " + " | ".join(lines) if lines else "")

    def cpu_seconds(self) -> float | None:
        try:
            import psutil

            p = psutil.Process(self.proc.pid)
            total = sum(p.cpu_times()[:4])  # user, system, and waited-for children
            for child in p.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    total += sum(child.cpu_times()[:2])
            self._cpu_last = max(self._cpu_last, total)
        except Exception:  # noqa: BLE001 - gone: keep the last reading
            pass
        return self._cpu_last

    def kill(self) -> None:
        """Kill it at once (SIGKILL to the whole group), as a crash would."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    async def terminate(self) -> None:
        if self.terminated_at is not None:
            return
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                # A little grace to close its runtime; a hung one is killed.
                await asyncio.wait_for(self.proc.wait(), _GRACE_S)
            except asyncio.TimeoutError:
                self.kill()
                await self.proc.wait()
        # Children that outlived the service (a Lean process) go with the group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.terminated_at = time.monotonic()
        shutil.rmtree(self.workdir, ignore_errors=True)


class LocalProcessBackend(SandboxBackend):
    """Starts ``python -m leanrl.service`` (``leanrl serve``) processes on 127.0.0.1 with a random token."""

    name = "local"

    def __init__(
        self,
        serve_args: Sequence[str],
        cpu: float = 1.0,
        pythonpath: Sequence[Path] = (),
        python: str | None = None,
        start_timeout_s: float = 120.0,
    ) -> None:
        super().__init__(serve_args)
        self.cpu = cpu
        self.pythonpath = [str(p) for p in pythonpath]
        self.python = python or sys.executable
        self.start_timeout_s = start_timeout_s
        self.started: list[LocalSandbox] = []

    async def create(self) -> Sandbox:
        t0 = time.monotonic()
        token = secrets.token_urlsafe(24)
        workdir = tempfile.mkdtemp(prefix="leanrl-sandbox-")
        port_file = Path(workdir) / "port"
        log_path = Path(workdir) / "serve.log"
        env = dict(os.environ, LEANRL_SERVICE_TOKEN=token)
        if self.pythonpath:
            env["PYTHONPATH"] = os.pathsep.join(
                [*self.pythonpath, *filter(None, [env.get("PYTHONPATH")])]
            )
        cmd = [
            self.python, "-m", "leanrl.service", "--host", "127.0.0.1", "--port", "0",
            "--port_file", str(port_file), *self.service_args(),
        ]  # fmt: skip
        try:
            with log_path.open("wb") as log:
                proc = await asyncio.create_subprocess_exec(
                    *cmd,
                    env=env,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,  # its own group: terminate() takes its children too
                )
        except BaseException:
            # Failed or cancelled (a pool closing while it refills) before there is a sandbox
            # whose terminate() would remove the folder: remove it here.
            shutil.rmtree(workdir, ignore_errors=True)
            raise
        sb = LocalSandbox(
            id=f"local-{proc.pid}",
            url="",
            token=token,
            cpu=self.cpu,
            created_at=t0,
            proc=proc,
            workdir=workdir,
        )
        try:
            deadline = t0 + self.start_timeout_s
            while not port_file.exists():
                if proc.returncode is not None:
                    tail = log_path.read_text(errors="replace")[-2000:]
                    raise SandboxStartError(
                        f"local service exited with code {proc.returncode} before listening:\n"
                        f"{tail}"
                    )
                if time.monotonic() > deadline:
                    raise SandboxStartError(
                        f"local service did not listen within {self.start_timeout_s:g} s"
                    )
                await asyncio.sleep(0.02)
            sb.url = f"http://127.0.0.1:{port_file.read_text().strip()}"
        except BaseException:
            await asyncio.shield(sb.terminate())
            raise
        self.started = [s for s in self.started if s.terminated_at is None] + [sb]
        return sb

    async def close(self) -> None:
        for sb in self.started:
            await sb.terminate()
        self.started.clear()
