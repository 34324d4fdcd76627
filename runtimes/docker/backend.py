"""The Docker implementation of :class:`SandboxBackend`: one container per sandbox.

Containers run ``leanrl serve`` with memory, CPU and process limits, all capabilities dropped,
a read-only root file system and a private ``/tmp``. With the default ``unix`` transport they
get ``--network none`` and the service listens on a unix socket in a host folder mounted into
the container: no network at all, and it works under ``dockerd --bridge=none``. With ``tcp``
the port is published on 127.0.0.1 only.

Every container carries the label ``<label>=docker`` and
``leanrl.owner=<host>:<pid>:<process start time>:<id>``.
Containers are removed on :meth:`DockerBackend.close`, at interpreter exit (``atexit``) and on
SIGTERM/SIGHUP (when nobody else handles them); containers left by a process that was killed
outright are removed by the next :meth:`DockerBackend.start` on the same host: a container is
stale when its owner's pid is gone or now belongs to a process started at another time (pids are
reused, and in a fresh container the trainer gets the same small pid every run).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from leanrl._sandbox_config import DockerConfig, image_tag
from leanrl.service.sandbox import (
    Sandbox,
    SandboxBackend,
    SandboxStartError,
    process_gone,
    process_start_time,
)

__all__ = ["DockerBackend", "DockerSandbox", "docker_run_args", "docker_run_env"]

_OWNER_LABEL = "leanrl.owner"
_TOKEN_VAR = "LEANRL_SERVICE_TOKEN"
_IN_SOCKET_DIR = "/run/leanrl"
_LIVE: weakref.WeakSet[DockerBackend] = weakref.WeakSet()
_HANDLERS_INSTALLED = False


async def _docker(
    binary: str, *args: str, timeout_s: float = 60.0, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    try:
        proc = await asyncio.create_subprocess_exec(
            binary,
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=None if env is None else {**os.environ, **env},
        )
    except FileNotFoundError:
        return 127, "", f"{binary}: command not found"
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")


def engine_and_image_problem(docker_bin: str, image: str) -> str | None:
    """Why containers of ``image`` cannot start here (no engine, no image), or None. Starts
    nothing: :meth:`DockerBackend.start` and the runtime's preflight both ask it."""
    import subprocess

    def run(*args: str) -> subprocess.CompletedProcess[str] | None:
        try:
            return subprocess.run(
                [docker_bin, *args], capture_output=True, text=True, timeout=60, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            return None

    ver = run("version", "--format", "{{.Server.Version}}")
    if ver is None or ver.returncode != 0:
        why = "not found or not answering" if ver is None else (ver.stderr or ver.stdout).strip()
        return (
            f"no Docker engine reachable with {docker_bin!r}: {why}. Start one (e.g. `dockerd`, "
            "or .ci/start-docker.sh) or set DOCKER_HOST."
        )
    found = run("image", "inspect", image)
    if found is None or found.returncode != 0:
        return (
            f"Docker image {image!r} not found: build it from the leanrl checkout with "
            f"`docker build -f runtimes/docker/Dockerfile -t {image} .` with the build "
            "arguments of the taskset's Lean version (see docs/sandboxes.md), or set "
            "runtime.docker.image"
        )
    return None


def docker_run_args(
    config: DockerConfig,
    name: str,
    owner: str,
    serve_args: Sequence[str],
    host_socket_dir: Path | None,
) -> list[str]:
    """The ``docker run`` arguments for one sandbox container (without the binary).

    No secret is among them (any user can read a command line in ``ps``): the service token
    and the values of ``config.env`` are named only (``--env NAME``), and the docker client
    takes their values from its own environment, :func:`docker_run_env`.
    """
    c = config
    args = [
        "run", "--detach", "--name", name,
        "--label", f"{c.label}=docker", "--label", f"{_OWNER_LABEL}={owner}",
        "--memory", f"{c.memory_mb}m", "--memory-swap", f"{c.memory_mb}m",
        "--cpus", f"{c.cpus:g}", "--pids-limit", str(c.pids_limit),
        "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
        "--tmpfs", f"/tmp:rw,nosuid,size={c.tmpfs_mb}m",
        "--env", _TOKEN_VAR,
    ]  # fmt: skip
    if c.read_only:
        # Anything that writes under $HOME (lake, elan caches) goes to the private tmpfs.
        args += ["--read-only", "--env", "HOME=/tmp"]
    for spec in c.mounts:
        parts = spec.split(":")
        args += ["--volume", spec if len(parts) >= 3 else f"{spec}:ro"]
    for k in c.env:
        args += ["--env", k]
    if c.transport == "unix":
        if host_socket_dir is None:
            raise SandboxStartError("unix transport needs a socket folder")
        sock = f"{_IN_SOCKET_DIR}/service.sock"
        # The socket folder belongs to this user and its group, mode 2770; the container's
        # user joins that group (--group-add), so it can create the socket there, and the
        # socket (mode 0660, group inherited from the folder) is reachable by this user and
        # not by every local user.
        args += ["--group-add", str(os.getgid())]
        args += ["--network", "none", "--volume", f"{host_socket_dir}:{_IN_SOCKET_DIR}:rw"]
        args += ["--env", f"LEANRL_SERVICE_UDS={sock}", *_image_and_command(c)]
        args += ["--uds_mode", "0660", "--uds", sock]
    else:
        port = str(c.service_port)
        args += ["--network", c.network, "--publish", f"127.0.0.1::{port}"]
        args += ["--env", f"LEANRL_SERVICE_PORT={port}", *_image_and_command(c)]
        args += ["--host", "0.0.0.0", "--port", port]
    return [*args, *serve_args]


def docker_run_env(config: DockerConfig, token: str) -> dict[str, str]:
    """The values :func:`docker_run_args` names: given to the docker client as its environment
    (readable only by this user), never as arguments."""
    return {**config.env, _TOKEN_VAR: token}


def _image_and_command(c: DockerConfig) -> list[str]:
    # The command replaces the image's ENTRYPOINT (the Dockerfile's is the service itself), so
    # it is never appended to it.
    image = image_tag(None) if c.image is None else c.image
    if not c.command:
        return [image]
    return ["--entrypoint", c.command[0], image, *c.command[1:]]


@dataclass(eq=False)
class DockerSandbox(Sandbox):
    """A running container."""

    docker_bin: str = "docker"
    host_dir: str = ""
    """Host folder holding its unix socket (removed with it)."""

    async def alive(self) -> bool:
        if self.terminated_at is not None:
            return False
        rc, out, _ = await _docker(
            self.docker_bin, "inspect", "--format", "{{.State.Running}}", self.id, timeout_s=20
        )
        return rc == 0 and out.strip() == "true"

    async def terminate(self) -> None:
        if self.terminated_at is not None:
            return
        try:
            await _docker(self.docker_bin, "rm", "--force", "--volumes", self.id, timeout_s=60)
        finally:
            self.terminated_at = time.monotonic()
            if self.host_dir:
                shutil.rmtree(self.host_dir, ignore_errors=True)


class DockerBackend(SandboxBackend):
    """Starts containers of ``config.image`` running the service with ``serve_args``."""

    name = "docker"

    def __init__(self, config: DockerConfig, serve_args: Sequence[str]) -> None:
        super().__init__(serve_args)
        self.config = config
        pid = os.getpid()
        start = process_start_time(pid)
        self.owner = f"{socket.gethostname()}:{pid}:{start}:{uuid.uuid4().hex[:8]}"
        self.containers: dict[str, DockerSandbox] = {}
        self.removed_stale: list[str] = []
        self._socket_root: Path | None = None
        self._own_socket_root = False

    async def start(self) -> None:
        c = self.config
        image = image_tag(None) if c.image is None else c.image
        problem = await asyncio.to_thread(engine_and_image_problem, c.docker_bin, image)
        if problem is not None:
            raise SandboxStartError(problem)
        await self.remove_stale()
        if c.transport == "unix":
            if c.socket_dir is not None:
                self._socket_root = Path(c.socket_dir)
                self._socket_root.mkdir(parents=True, exist_ok=True)
            else:
                self._socket_root = Path(tempfile.mkdtemp(prefix="leanrl-docker-"))
                self._own_socket_root = True
        _LIVE.add(self)
        _install_handlers()

    async def remove_stale(self) -> list[str]:
        """Remove containers with our label whose owning process (on this host) is gone."""
        c = self.config
        rc, out, _ = await _docker(
            c.docker_bin, "ps", "--all", "--filter", f"label={c.label}=docker", "--format", f'{{{{.ID}}}} {{{{.Label "{_OWNER_LABEL}"}}}}',
        )  # fmt: skip
        if rc != 0:
            return []
        stale = []
        host = socket.gethostname()
        for line in out.splitlines():
            cid, _, owner = line.partition(" ")
            if _owner_gone(owner, host):
                stale.append(cid)
        if stale:
            # Their unix-socket folders on this host go too (a killed owner could not remove
            # them): the folder mounted at /run/leanrl, and its parent when that is left empty.
            fmt = f'{{{{range .Mounts}}}}{{{{if eq .Destination "{_IN_SOCKET_DIR}"}}}}{{{{.Source}}}}{{{{end}}}}{{{{end}}}}'
            rc, out, _ = await _docker(c.docker_bin, "inspect", "--format", fmt, *stale)
            folders = [Path(p) for p in out.split()] if rc == 0 else []
            await _docker(c.docker_bin, "rm", "--force", *stale)
            for folder in folders:
                if folder.name.startswith("leanrl-") and folder.is_dir():
                    shutil.rmtree(folder, ignore_errors=True)
                    parent = folder.parent
                    if parent.name.startswith("leanrl-docker-"):
                        with contextlib.suppress(OSError):
                            parent.rmdir()  # only when empty: other owners may share it
        self.removed_stale += stale
        return stale

    async def create(self) -> Sandbox:
        c = self.config
        t0 = time.monotonic()
        name = f"leanrl-{uuid.uuid4().hex[:12]}"
        token = secrets.token_urlsafe(24)
        host_dir: Path | None = None
        if c.transport == "unix":
            assert self._socket_root is not None, "start() first"
            host_dir = self._socket_root / name
            host_dir.mkdir(mode=0o700)
            # Ours and our group's only (the container's user joins the group, see
            # docker_run_args); setgid so the socket inside gets the folder's group.
            os.chown(host_dir, -1, os.getgid())
            host_dir.chmod(0o2770)
        args = docker_run_args(c, name, self.owner, self.service_args(), host_dir)
        sb = DockerSandbox(
            id=name,
            url="http://localhost",
            token=token,
            cpu=c.cpus,
            created_at=t0,
            docker_bin=c.docker_bin,
            host_dir=str(host_dir or ""),
        )
        try:
            rc, _, err = await _docker(
                c.docker_bin, *args, timeout_s=120, env=docker_run_env(c, token)
            )
            if rc != 0:
                raise SandboxStartError(f"`docker run` failed: {err.strip()}")
            self.containers[name] = sb
            if host_dir is not None:
                sb.uds = str(host_dir / "service.sock")
            else:
                sb.url = await self._published_url(name)
        except BaseException:
            await asyncio.shield(sb.terminate())
            self.containers.pop(name, None)
            raise
        return sb

    async def _published_url(self, name: str) -> str:
        port = f"{self.config.service_port}/tcp"
        rc, out, err = await _docker(self.config.docker_bin, "port", name, port)
        line = out.strip().splitlines()[0] if rc == 0 and out.strip() else ""
        if not line:
            raise SandboxStartError(f"container {name} has no published port {port}: {err}")
        host, _, hport = line.rpartition(":")
        return f"http://{host.strip('[]') or '127.0.0.1'}:{hport}"

    async def close(self) -> None:
        for sb in list(self.containers.values()):
            await sb.terminate()
        self.containers.clear()
        # Anything with our owner label that slipped through (a create cancelled mid-way).
        rc, out, _ = await _docker(
            self.config.docker_bin, "ps", "--all", "--quiet",
            "--filter", f"label={_OWNER_LABEL}={self.owner}",
        )  # fmt: skip
        if rc == 0 and out.split():
            await _docker(self.config.docker_bin, "rm", "--force", *out.split())
        if self._own_socket_root and self._socket_root is not None:
            shutil.rmtree(self._socket_root, ignore_errors=True)
        _LIVE.discard(self)

    def cleanup_sync(self) -> None:
        """Blocking removal of every container this backend started (exit/signal paths)."""
        ids = [cid for cid, sb in self.containers.items() if sb.terminated_at is None]
        with contextlib.suppress(Exception):
            subprocess.run(
                [self.config.docker_bin, "rm", "--force", *ids] if ids else ["true"],
                capture_output=True,
                timeout=60,
            )
            out = subprocess.run(
                [self.config.docker_bin, "ps", "--all", "--quiet", "--filter",
                 f"label={_OWNER_LABEL}={self.owner}"],
                capture_output=True, text=True, timeout=30,
            ).stdout.split()  # fmt: skip
            if out:
                subprocess.run([self.config.docker_bin, "rm", "--force", *out], timeout=60)
        self.containers.clear()
        if self._own_socket_root and self._socket_root is not None:
            shutil.rmtree(self._socket_root, ignore_errors=True)


def _owner_gone(owner: str, host: str) -> bool:
    """True when the process named in an owner label (``host:pid:start:id``, or the older
    ``host:pid:id``) on this host no longer runs: its pid is free, or reused by a process
    that started at another time."""
    parts = owner.split(":")
    if len(parts) < 3 or parts[0] != host or not parts[1].isdigit():
        return False
    return process_gone(int(parts[1]), parts[2] if len(parts) >= 4 else None)


def _cleanup_all() -> None:
    for backend in list(_LIVE):
        backend.cleanup_sync()


def _on_signal(signum: int, frame: Any) -> None:
    _cleanup_all()
    # Then die the way the signal meant: default action, re-raised.
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_handlers() -> None:
    # atexit covers normal exit and Ctrl-C; SIGTERM/SIGHUP skip atexit, so handle them too, but
    # only where nobody else (uvicorn, a trainer) already installed a handler.
    global _HANDLERS_INSTALLED
    if _HANDLERS_INSTALLED:
        return
    _HANDLERS_INSTALLED = True
    atexit.register(_cleanup_all)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError, OSError):  # not the main thread: atexit only
            if signal.getsignal(sig) in (signal.SIG_DFL, None):
                signal.signal(sig, _on_signal)
