"""The `docker` runtime against a real Docker engine (tests marked `docker` skip without one).

Images cannot be pulled here, so the test image is built from local files: an empty `FROM
scratch` image, with this machine's Python, the venv and the checkout mounted read-only, serving
the echo test runtime. Everything else is the real runtime: containers with `--network none`,
limits, labels, health checks, a warm pool, and removal on close, on SIGTERM and at the next
start after a crash.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _service_testing import attempt

from leanrl import registry
from leanrl._sandbox_config import ClientConfig, DockerConfig, PoolConfig
from leanrl.errors import RuntimeUnavailable
from leanrl.runtime import RuntimeConfig
from leanrl.runtimes.docker import DockerRuntime
from leanrl.runtimes.docker.backend import docker_run_args, docker_run_env
from leanrl.verdict import Reason

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
ECHO = "_echo_runtime:EchoRuntime"
IMAGE = "leanrl-test-scratch:latest"


def _docker(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=120, check=check
    )


@pytest.fixture(scope="module")
def docker_image(tmp_path_factory: pytest.TempPathFactory) -> str:
    try:
        ok = _docker("version", "--format", "{{.Server.Version}}", check=False).returncode == 0
    except (FileNotFoundError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        pytest.skip("needs a reachable Docker engine (start one with .ci/start-docker.sh)")
    ctx = tmp_path_factory.mktemp("docker-ctx")
    (ctx / "README").write_text("leanrl test image: everything else is mounted read-only\n")
    (ctx / "Dockerfile").write_text("FROM scratch\nCOPY README /README\n")
    _docker("build", "--quiet", "-t", IMAGE, str(ctx))
    return IMAGE


def _host_mounts() -> list[str]:
    paths = {"/usr", "/lib", "/lib64", sys.prefix, sys.base_prefix, str(REPO)}
    paths.add(str(Path(sys.executable).resolve().parent.parent))
    real = sorted({str(Path(p).resolve()) for p in paths if Path(p).exists()} | paths)
    real = [p for p in real if Path(p).exists()]
    keep = [p for p in real if not any(p != q and p.startswith(q + "/") for q in real)]
    return [f"{p}:{p}:ro" for p in keep]


def config(image: str, tmp_path: Path, **kw: object) -> RuntimeConfig:
    d = DockerConfig(
        image=image,
        command=[sys.executable, "-m", "leanrl.service"],
        inner_runtime=ECHO,
        inner_options={"log_path": str(tmp_path / "checks.log")},
        mounts=[*_host_mounts(), f"{tmp_path}:{tmp_path}:rw"],
        env={"PYTHONPATH": str(TESTS)},
        memory_mb=512,
        cpus=1.0,
        pids_limit=256,
        containers=1,
        batch_size=2,
        pool=PoolConfig(max_sandboxes=2, health_interval_s=0.3),
        client=ClientConfig(retries=1, backoff_s=0.05),
        **kw,  # type: ignore[arg-type]
    )
    return RuntimeConfig(name="docker", docker=d)


def containers_of(owner: str) -> list[str]:
    return _docker("ps", "-aq", "--filter", f"label=leanrl.owner={owner}").stdout.split()


async def wait_for(cond, timeout_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    for _ in range(int(timeout_s / 0.05)):
        if cond():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not reached")


def test_docker_runtime_is_registered() -> None:
    assert registry.resolve("runtimes", "docker") is DockerRuntime


def test_run_args_isolate_the_container() -> None:
    d = DockerConfig(mounts=["/a:/b", "/c:/d:rw"], memory_mb=1024, cpus=2, pids_limit=64)
    args = docker_run_args(d, "n", "h:1:x", ["--runtime.name", "local"], Path("/s"))
    joined = " ".join(args)
    assert "--network none" in joined and "--volume /s:/run/leanrl:rw" in joined
    assert "--memory 1024m --memory-swap 1024m" in joined and "--cpus 2" in joined
    assert "--pids-limit 64" in joined and "--cap-drop ALL" in joined and "--read-only" in joined
    assert "--volume /a:/b:ro" in joined and "--volume /c:/d:rw" in joined
    assert "--label leanrl.runtime=docker" in joined and "--label leanrl.owner=h:1:x" in joined
    assert args[-4:] == ["--uds", "/run/leanrl/service.sock", "--runtime.name", "local"]
    # the command replaces the image's entrypoint instead of being appended to it
    i = args.index("--entrypoint")
    assert args[i + 1 : i + 5] == ["python", "leanrl-verifier:v4.24.0", "-m", "leanrl.service"]
    tcp = docker_run_args(DockerConfig(transport="tcp"), "n", "o", [], None)
    assert "--publish 127.0.0.1::8000" in " ".join(tcp) and "--network bridge" in " ".join(tcp)
    assert tcp[-4:] == ["--host", "0.0.0.0", "--port", "8000"]


def test_no_secret_is_on_the_docker_command_line() -> None:
    # `ps` shows every process's arguments to every local user: the token and env values go to
    # the docker client through its environment, and only their names are arguments.
    d = DockerConfig(env={"HF_TOKEN": "hf_s3cret", "PLAIN": "x"})
    args = docker_run_args(d, "n", "h:1:x", [], Path("/s"))
    assert not any("s3cret" in a or "tok-123" in a for a in args)
    assert "--env LEANRL_SERVICE_TOKEN --" in " ".join(args) + " --"
    assert "--env HF_TOKEN" in " ".join(args) and "--env PLAIN" in " ".join(args)
    env = docker_run_env(d, "tok-123")
    assert env == {"HF_TOKEN": "hf_s3cret", "PLAIN": "x", "LEANRL_SERVICE_TOKEN": "tok-123"}
    # the socket is shared through a group, never with every local user
    i = args.index("--uds_mode")
    assert args[i + 1] == "0660" and args[args.index("--group-add") + 1] == str(os.getgid())


async def test_no_engine_gives_a_clear_error() -> None:
    rc = RuntimeConfig(name="docker", docker=DockerConfig(docker_bin="/nonexistent/docker"))
    with pytest.raises(RuntimeUnavailable, match="no Docker engine reachable"):
        await DockerRuntime(rc).start()


@pytest.mark.docker
async def test_missing_image_names_the_build_command(docker_image: str, tmp_path: Path) -> None:
    rc = config("leanrl-no-such-image:0", tmp_path)
    with pytest.raises(RuntimeUnavailable, match="docker build -f runtimes/docker/Dockerfile"):
        await DockerRuntime(rc).start()


@pytest.mark.docker
async def test_checks_run_in_isolated_containers_removed_on_close(
    docker_image: str, tmp_path: Path
) -> None:
    rt = DockerRuntime(config(docker_image, tmp_path))
    async with rt:
        verdicts = await rt.check([attempt(p, id=p) for p in ("ok", "bad", "sorry")])
        owner = rt.pool.backend.owner  # type: ignore[union-attr,attr-defined]
        ids = containers_of(owner)
        # A container that served its batch may be removed between the listing and this
        # inspect (seen once on a fresh clone): docker inspect then still prints the others.
        infos = json.loads(_docker("inspect", *ids, check=False).stdout or "[]")
        m = rt.metrics()
    assert [v.reason for v in verdicts] == [Reason.OK, Reason.ERROR, Reason.SORRY]
    # the warm container, plus one started on demand or as refill (max_sandboxes=2)
    assert 1 <= len(infos) <= 2 and m["batches"] == 2
    assert m["pool_created"] >= 1 and len(infos) <= m["pool_created"] + m["pool_starting"]
    for info in infos:
        host = info["HostConfig"]
        assert host["NetworkMode"] == "none" and host["ReadonlyRootfs"] is True
        assert host["Memory"] == 512 * 2**20 and host["PidsLimit"] == 256
        assert host["NanoCpus"] == 10**9 and host["CapDrop"] == ["ALL"]
        assert info["Config"]["Labels"]["leanrl.runtime"] == "docker"
    assert containers_of(owner) == []


@pytest.mark.docker
async def test_dead_containers_are_replaced_and_a_batch_survives_one(
    docker_image: str, tmp_path: Path
) -> None:
    rt = DockerRuntime(config(docker_image, tmp_path))
    async with rt:
        assert rt.pool is not None
        owner = rt.pool.backend.owner  # type: ignore[attr-defined]
        (first,) = containers_of(owner)
        _docker("kill", first)
        await wait_for(lambda: rt.pool is not None and rt.pool.state()["replaced_dead"] == 1)
        marker = tmp_path / "died"
        verdicts = await rt.check([attempt("ok", id="a"), attempt(f"die-once:{marker}", id="b")])
        m = rt.metrics()
    assert marker.exists() and [v.reason for v in verdicts] == [Reason.OK, Reason.OK]
    assert m["retried_batches"] == 1 and m["infra_verdicts"] == 0
    assert containers_of(owner) == []


@pytest.mark.docker
async def test_stale_containers_of_a_dead_process_are_removed_at_start(
    docker_image: str, tmp_path: Path
) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    owner = f"{socket.gethostname()}:{dead.pid}:stale"
    _docker(
        "run", "-d", "--network", "none", "--label", "leanrl.runtime=docker",
        "--label", f"leanrl.owner={owner}", *[a for m in _host_mounts() for a in ("-v", m)],
        docker_image, sys.executable, "-c", "import time; time.sleep(600)",
    )  # fmt: skip
    assert len(containers_of(owner)) == 1
    rt = DockerRuntime(config(docker_image, tmp_path))
    async with rt:
        assert containers_of(owner) == []
        assert len(rt.pool.backend.removed_stale) == 1  # type: ignore[union-attr,attr-defined]


@pytest.mark.docker
async def test_stale_containers_are_found_even_when_the_pid_was_reused(
    docker_image: str, tmp_path: Path
) -> None:
    # The owner's pid is alive again, but as another process (pids are reused; a trainer in a
    # fresh container gets the same pid every run): its containers are stale all the same.
    import psutil

    other = subprocess.Popen(["sleep", "120"])
    try:
        born = psutil.Process(other.pid).create_time()
        host = socket.gethostname()
        reused = f"{host}:{other.pid}:{born - 3600:.2f}:stale"
        living = f"{host}:{other.pid}:{born:.2f}:alive"
        for owner in (reused, living):
            _docker(
                "run", "-d", "--network", "none", "--label", "leanrl.runtime=docker",
                "--label", f"leanrl.owner={owner}",
                *[a for m in _host_mounts() for a in ("-v", m)],
                docker_image, sys.executable, "-c", "import time; time.sleep(600)",
            )  # fmt: skip
        rt = DockerRuntime(config(docker_image, tmp_path))
        async with rt:
            assert containers_of(reused) == []
            assert len(containers_of(living)) == 1  # its owner still runs: left alone
    finally:
        other.kill()
        other.wait()
        ids = containers_of(living) + containers_of(reused)
        if ids:
            _docker("rm", "--force", *ids)


@pytest.mark.docker
def test_containers_are_removed_when_the_process_gets_sigterm(
    docker_image: str, tmp_path: Path
) -> None:
    script = textwrap.dedent(f"""
        import asyncio, sys
        sys.path.insert(0, {str(TESTS)!r})
        from test_docker import config
        from leanrl.runtimes.docker import DockerRuntime
        from pathlib import Path

        async def main():
            rt = DockerRuntime(config({docker_image!r}, Path({str(tmp_path)!r})))
            await rt.start()
            print(rt.pool.backend.owner, flush=True)
            await asyncio.sleep(600)

        asyncio.run(main())
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=str(REPO),
        env={**os.environ, "PYTHONPATH": str(TESTS)},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        owner = proc.stdout.readline().strip()
        assert owner and len(containers_of(owner)) == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == -signal.SIGTERM
        assert containers_of(owner) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_build_scripts_parse_and_check_their_inputs(tmp_path: Path) -> None:
    docker_dir = REPO / "runtimes" / "docker"
    for script in ("install-lean.sh", "build-local.sh"):
        r = subprocess.run(["bash", "-n", str(docker_dir / script)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    # build-local.sh refuses a folder that is no built Lean project before touching Docker
    build = ["bash", str(docker_dir / "build-local.sh"), str(tmp_path)]
    r = subprocess.run(build, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "no lean-toolchain" in r.stderr
    (tmp_path / "lean-toolchain").write_text("leanprover/lean4:v4.15.0\n")
    r = subprocess.run(build, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "REPL not built" in r.stderr and "leanrl setup" in r.stderr
    r = subprocess.run(
        ["bash", str(docker_dir / "install-lean.sh")], capture_output=True, text=True, timeout=30
    )
    assert r.returncode != 0 and "usage: install-lean.sh" in r.stderr


def _stub_tools(bin_dir: Path, mathlib_toolchain: str) -> None:
    # Stand-ins for elan and lake that only lay out the files `lake update` would (no Lean runs
    # and none is claimed): the script's own checks are what is tested.
    bin_dir.mkdir()
    (bin_dir / "elan").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "lake").write_text(
        textwrap.dedent(f"""\
        #!/bin/sh
        echo "lake $*" >> calls.log
        if [ "$1" = update ]; then
          mkdir -p .lake/packages/mathlib .lake/packages/REPL/.lake/build/bin
          echo '{mathlib_toolchain}' > .lake/packages/mathlib/lean-toolchain
          echo '{mathlib_toolchain}' > .lake/packages/REPL/lean-toolchain
          : > .lake/packages/REPL/.lake/build/bin/repl
          chmod +x .lake/packages/REPL/.lake/build/bin/repl
        fi
        """)
    )
    for tool in ("elan", "lake"):
        (bin_dir / tool).chmod(0o755)


@pytest.mark.parametrize(
    "mathlib_toolchain", ["leanprover/lean4:v4.15.0", "leanprover/lean4:v4.9.0"]
)
def test_install_script_refuses_a_mathlib_built_for_another_toolchain(
    tmp_path: Path, mathlib_toolchain: str
) -> None:
    _stub_tools(tmp_path / "bin", mathlib_toolchain)
    env = {
        **os.environ,
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        "LEAN_HOME": str(tmp_path / "lean"),
        "ELAN_HOME": str(tmp_path / "elan"),
    }
    script = REPO / "runtimes" / "docker" / "install-lean.sh"
    r = subprocess.run(
        ["bash", str(script), "leanprover/lean4:v4.15.0", "v4.15.0", "v4.15.0"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    project = tmp_path / "lean" / "project"
    calls = (project / "calls.log").read_text().splitlines()
    if mathlib_toolchain.endswith("v4.15.0"):
        assert r.returncode == 0, r.stderr
        assert calls == ["lake update", "lake exe cache get", "lake build repl"]
        assert (project / "lean-toolchain").read_text().strip() == "leanprover/lean4:v4.15.0"
        assert (
            'require REPL from git "https://github.com/leanprover-community/repl" @ "v4.15.0"'
            in (project / "lakefile.lean").read_text()
        )
    else:
        assert r.returncode == 3 and "built for leanprover/lean4:v4.9.0" in r.stderr
        assert calls == ["lake update"]  # no cache download, no build for the wrong Lean


@pytest.mark.docker
async def test_containers_of_a_sigkilled_owner_are_reaped_at_the_next_start(
    docker_image: str, tmp_path: Path
) -> None:
    # SIGKILL runs no handler and no atexit: the containers outlive their owner until the next
    # runtime on this host starts.
    script = textwrap.dedent(f"""
        import asyncio, sys
        sys.path.insert(0, {str(TESTS)!r})
        from test_docker import config
        from leanrl.runtimes.docker import DockerRuntime
        from pathlib import Path

        async def main():
            rt = DockerRuntime(config({docker_image!r}, Path({str(tmp_path)!r})))
            await rt.start()
            print(rt.pool.backend.owner, flush=True)
            await asyncio.sleep(600)

        asyncio.run(main())
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=str(REPO),
        env={**os.environ, "PYTHONPATH": str(TESTS)},
    )  # fmt: skip
    owner = ""
    try:
        assert proc.stdout is not None
        owner = proc.stdout.readline().strip()
        assert owner and len(containers_of(owner)) == 1
        proc.kill()
        assert proc.wait(timeout=30) == -signal.SIGKILL
        assert len(containers_of(owner)) == 1  # left behind by the crash
        (cid,) = containers_of(owner)
        fmt = '{{range .Mounts}}{{if eq .Destination "/run/leanrl"}}{{.Source}}{{end}}{{end}}'
        socket_dir = Path(_docker("inspect", "--format", fmt, cid).stdout.strip())
        assert socket_dir.is_dir()  # its unix-socket folder on this host, left behind too
        rt = DockerRuntime(config(docker_image, tmp_path / "next"))
        (tmp_path / "next").mkdir()
        async with rt:
            assert containers_of(owner) == []
            assert len(rt.pool.backend.removed_stale) == 1  # type: ignore[union-attr,attr-defined]
        assert not socket_dir.exists() and not socket_dir.parent.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if owner and containers_of(owner):
            _docker("rm", "--force", *containers_of(owner))


def test_dockerfiles_never_rewrite_the_lean_tree_in_a_later_layer() -> None:
    # chmod/chown of files an earlier layer created copies every one of them (all of Mathlib,
    # gigabytes) into the new layer: permissions must be set where the files are made.
    docker_dir = REPO / "runtimes" / "docker"
    for name in ("Dockerfile", "Dockerfile.local"):
        text = (docker_dir / name).read_text().replace("\\\n", " ")
        runs = [ln for ln in text.splitlines() if ln.startswith("RUN ")]
        for run in runs:
            touches = any(w in run for w in ("chmod", "chown")) and "/opt/lean" in run
            if touches:
                assert "install-lean.sh" in run, f"{name}: {run}"
    assert 'chmod -R a+rX "$CTX"' in (docker_dir / "build-local.sh").read_text()


def test_the_dockerfile_copies_exactly_what_builds_leanrl(tmp_path: Path) -> None:
    # The image installs leanrl from what the Dockerfile copies: that set alone must build a
    # package holding the service and the runtimes, and it must not be the whole checkout
    # (a .venv or .git there would end up in the image).
    import shutil
    import zipfile

    lines = (REPO / "runtimes" / "docker" / "Dockerfile").read_text().splitlines()
    copies = [ln.split()[1:] for ln in lines if ln.startswith("COPY ")]
    src = tmp_path / "src"
    src.mkdir()
    for *sources, dest in copies:
        assert "." not in sources, "COPY . would take the whole checkout"
        if not dest.startswith("/opt/leanrl-src"):
            continue
        for s in sources:
            target = src / dest.removeprefix("/opt/leanrl-src").strip("/")
            if (REPO / s).is_dir():
                shutil.copytree(
                    REPO / s, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
                )
            else:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy(REPO / s, target / Path(s).name)
    out = tmp_path / "wheel"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = out.glob("leanrl-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "leanrl/service/__main__.py",
        "leanrl/service/healthcheck.py",
        "leanrl/runtimes/local/__init__.py",
        "leanrl/runtimes/docker/install-lean.sh",
    ):
        assert needed in names, needed


def test_preflight_finds_a_missing_engine_without_starting_anything() -> None:
    # Trainers call preflight() before they load a model: the same error start() gives.
    rc = RuntimeConfig(name="docker", docker=DockerConfig(docker_bin="/nonexistent/docker"))
    with pytest.raises(RuntimeUnavailable, match="no Docker engine reachable"):
        DockerRuntime(rc).preflight()


@pytest.mark.docker
def test_preflight_names_the_build_command_for_a_missing_image(
    docker_image: str, tmp_path: Path
) -> None:
    with pytest.raises(RuntimeUnavailable, match="docker build -f runtimes/docker/Dockerfile"):
        DockerRuntime(config("leanrl-no-such-image:0", tmp_path)).preflight()
    DockerRuntime(config(docker_image, tmp_path)).preflight()  # the real image: no error
