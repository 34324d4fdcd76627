"""The `modal` runtime: image and Sandbox definitions built offline, and one real run (marker).

Nothing here contacts Modal except the test marked `modal` (skipped unless LEANRL_TEST_MODAL=1).
Batching, the pool, retries and cost are tested with the local backend in test_warm_pool.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import modal
import pytest

from leanrl import registry
from leanrl._sandbox_config import (
    ClientConfig,
    DockerConfig,
    ModalConfig,
    PoolConfig,
    ServiceLimits,
)
from leanrl.errors import ConfigError
from leanrl.runtime import RuntimeConfig
from leanrl.runtimes.modal import ModalRuntime
from leanrl.runtimes.modal.backend import ModalBackend, sandbox_command
from leanrl.runtimes.modal.image import DOCKER_DIR, build_image, image_recipe
from leanrl.runtimes.modal.local_backend import LocalProcessBackend
from leanrl.service.sandbox import SandboxStartError
from leanrl.service.sandbox_runtime import inner_runtime_args
from leanrl.verdict import Attempt

REPO = Path(__file__).resolve().parent.parent


def test_modal_runtime_is_registered() -> None:
    assert registry.resolve("runtimes", "modal") is ModalRuntime
    assert ModalRuntime.description


def test_image_recipe_matches_the_dockerfile_and_pins_versions() -> None:
    cfg = ModalConfig(
        lean_toolchain="leanprover/lean4:v4.9.0", mathlib_rev="abc123", repl_rev="v4.9.0"
    )
    r = image_recipe(cfg)
    ((script, remote),) = r.local_files
    assert script == DOCKER_DIR / "install-lean.sh" and script.is_file()
    assert r.lean_commands == (
        f"LEAN_HOME=/opt/lean bash {remote} leanprover/lean4:v4.9.0 abc123 v4.9.0",
    )
    dockerfile = (DOCKER_DIR / "Dockerfile").read_text()
    # the Dockerfile runs the same script and installs the same requirements
    assert "install-lean.sh" in dockerfile and "requirements-service.txt" in dockerfile
    assert r.requirements == DOCKER_DIR / "requirements-service.txt"
    lines = [x for x in r.requirements.read_text().splitlines() if x and not x.startswith("#")]
    names = {x.split(">")[0].split("=")[0].strip() for x in lines}
    assert {"fastapi", "uvicorn", "httpx", "pydantic", "pydantic-settings", "psutil"} <= names
    assert not names & {"torch", "transformers", "datasets", "modal"}
    src, _ = r.source
    assert (src / "pyproject.toml").is_file() or (src / "runtimes").is_dir()
    assert r.env["LEANRL_LEAN_PROJECT"] == "/opt/lean/project"
    assert "curl" in r.apt_packages and "git" in r.apt_packages


def test_images_are_built_offline() -> None:
    assert isinstance(build_image(ModalConfig()), modal.Image)
    assert isinstance(build_image(ModalConfig(image_source="dockerfile")), modal.Image)
    assert isinstance(
        build_image(ModalConfig(image_source="registry", image_ref="ghcr.io/x/leanrl:1")),
        modal.Image,
    )
    with pytest.raises(ConfigError, match="image_ref"):
        build_image(ModalConfig(image_source="registry"))
    # an app with the image can be defined offline too (for `modal deploy`-style use)
    app = modal.App("leanrl-verifier-test", image=build_image(ModalConfig()))
    assert app.name == "leanrl-verifier-test"


def test_the_service_needs_no_heavy_packages() -> None:
    # What requirements-service.txt promises: the service imports neither torch, transformers,
    # datasets nor modal, so the sandbox image does not need them.
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in {'torch', 'transformers', 'datasets', 'modal'}:\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import leanrl.service.server, leanrl.service.app\n"
        "from leanrl.service.__main__ import main\n"
        "sys.exit(main(['--help']))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "python -m leanrl.service" in r.stdout, r.stderr


def test_settings_and_commands() -> None:
    rc = RuntimeConfig(
        name="modal",
        timeout_s=30,
        memory_mb=4096,
        isolate=True,
        modal=ModalConfig(warm_sandboxes=5, pool=PoolConfig(max_sandboxes=2, max_uses=1)),
    )
    rt = ModalRuntime(rc)
    s = rt.settings()
    assert s.batch_size == 64 and s.pool.target_ready == 5 and s.pool.max_sandboxes == 5
    # Modal default: Sandboxes reused only where their Lean runs isolated, else one batch each
    assert ModalConfig().pool.max_uses == 0 and ModalConfig().pool.reuse == "auto"
    assert s.pool.max_age_s == 0.5 * rc.modal.sandbox_timeout_s  # retired before Modal kills it
    args = inner_runtime_args(rc, "local", {"x": 1})
    assert args[:2] == ["--runtime.name", "local"]
    assert "--runtime.timeout_s" in args and args[args.index("--runtime.timeout_s") + 1] == "30.0"
    assert "--runtime.isolate" in args and args[-2:] == ["--runtime.options", '{"x": 1}']
    cmd = sandbox_command(rc.modal, args)
    assert cmd[:3] == ["python", "-m", "leanrl.service"]
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0" and cmd[cmd.index("--port") + 1] == "8000"
    assert isinstance(rt.make_backend(), ModalBackend)
    rt_local = ModalRuntime(rc.model_copy(update={"modal": ModalConfig(backend="local")}))
    assert isinstance(rt_local.make_backend(), LocalProcessBackend)
    limited = inner_runtime_args(rc, "local", None, ServiceLimits(max_batch=7))
    assert limited[limited.index("--limits.max_batch") + 1] == "7"


async def test_batch_size_over_the_service_limit_is_a_config_error() -> None:
    m = ModalConfig(backend="local", batch_size=100, service=ServiceLimits(max_batch=50))
    with pytest.raises(ConfigError, match="batch_size 100 is over the sandbox service's max_batch"):
        await ModalRuntime(RuntimeConfig(name="modal", modal=m)).start()


def _modal_accepts(kw: dict[str, Any], args: tuple[Any, ...]) -> None:
    """Run the installed modal's own offline validation of Sandbox.create arguments."""
    try:
        from modal.sandbox._common import SandboxCreateArgs, SandboxCreateCommon
    except ImportError:  # pragma: no cover - modal moved its internals
        pytest.skip("this modal version has no offline Sandbox argument validation to call")
    known = {k: v for k, v in kw.items() if k not in ("app", "secrets")}
    create_args = SandboxCreateArgs(args=args, **known)
    SandboxCreateCommon(create_args, secrets=list(kw["secrets"]))  # raises InvalidError if bad
    with pytest.raises(modal.exception.InvalidError, match="block_network"):
        SandboxCreateCommon(
            SandboxCreateArgs(args=args, **{**known, "block_network": True}), secrets=[]
        )


class _FakeTunnel:
    url = "https://example.modal.host"


class _Recorder:
    """Stands in for `modal.Sandbox` to see exactly what leanrl asks Modal for."""

    def __init__(self, fail_tunnel: bool) -> None:
        self.fail_tunnel = fail_tunnel
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self.terminated = 0
        self.object_id = "sb-123"
        outer = self

        class _Aio:
            def __init__(self, fn: Any) -> None:
                self.aio = fn

        async def create(*args: Any, **kw: Any) -> _Recorder:
            outer.calls.append((args, kw))
            return outer

        async def tunnels(timeout: int = 50) -> dict[int, _FakeTunnel]:
            if outer.fail_tunnel:
                raise TimeoutError("no tunnel")
            return {8000: _FakeTunnel()}

        async def terminate() -> None:
            outer.terminated += 1

        self.create = _Aio(create)
        self.tunnels = _Aio(tunnels)
        self.terminate = _Aio(terminate)


async def test_modal_backend_asks_for_limits_tunnel_and_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = ModalConfig(cpu=2.5, memory_mb=8192, sandbox_timeout_s=600, region="us-east")
    for fail in (False, True):
        rec = _Recorder(fail_tunnel=fail)
        monkeypatch.setattr(modal, "Sandbox", rec)
        be = ModalBackend(cfg, ["--runtime.name", "local"])
        be._image = build_image(cfg)
        if fail:
            with pytest.raises(SandboxStartError, match="tunnel"):
                await be.create()
            assert rec.terminated == 1  # never leave a paid Sandbox behind
            continue
        sb = await be.create()
        ((args, kw),) = rec.calls
        assert list(args) == sandbox_command(cfg, ["--runtime.name", "local"])
        assert kw["cpu"] == 2.5 and kw["memory"] == 8192 and kw["timeout"] == 600
        assert kw["encrypted_ports"] == [8000] and kw["outbound_cidr_allowlist"] == []
        assert "block_network" not in kw  # Modal refuses it together with a tunnel
        _modal_accepts(kw, args)
        assert kw["region"] == "us-east" and len(kw["secrets"]) == 1
        assert kw["tags"] == be.tags and kw["tags"]["leanrl-pid"].isdigit()
        assert sb.url == "https://example.modal.host" and sb.token and sb.cpu == 2.5
        await sb.terminate()
        assert rec.terminated == 1 and sb.terminated_at is not None


@pytest.mark.modal
async def test_real_modal_sandbox_checks_a_proof() -> None:
    cfg = ModalConfig(warm_sandboxes=1, batch_size=2)
    rt = ModalRuntime(RuntimeConfig(name="modal", modal=cfg))
    a = Attempt(name="t", header="", formal_statement="theorem t : 1 + 1 = 2 := by", proof="rfl")
    b = a.model_copy(update={"proof": "exact absurd"})
    async with rt:
        verdicts = await rt.check([a, b])
    assert verdicts[0].accepted and not verdicts[1].accepted
    assert rt.metrics()["pool_sandbox_s"] > 0


def test_request_timeouts_cover_a_whole_batch() -> None:
    rc = RuntimeConfig(name="modal", timeout_s=60, workers=4, startup_timeout_s=300)
    s = ModalRuntime(rc).settings()
    # 64 attempts on 4 workers: 16 rounds of (60 s + 5 s) plus one Lean start-up
    assert s.service.request_timeout_s == 16 * 65 + 300
    assert s.client.request_timeout_s == s.service.request_timeout_s + 60
    # explicit settings are kept as given
    m = ModalConfig(
        service=ServiceLimits(request_timeout_s=10), client=ClientConfig(request_timeout_s=5)
    )
    s2 = ModalRuntime(rc.model_copy(update={"modal": m})).settings()
    assert s2.service.request_timeout_s == 10 and s2.client.request_timeout_s == 5


def test_inner_workers_follow_the_sandbox_cpus_not_the_hosts() -> None:
    # workers = 0 means "one per CPU"; inside a container os.cpu_count() is the host's count,
    # so the runtime resolves it to the sandbox's own CPUs before starting the service.
    from leanrl.runtimes.docker import DockerRuntime

    def workers(args: list[str]) -> str:
        return args[args.index("--runtime.workers") + 1]

    rc = RuntimeConfig(name="modal", modal=ModalConfig(cpu=3.0))
    assert workers(ModalRuntime(rc).make_backend().serve_args) == "3"
    local = rc.model_copy(update={"modal": ModalConfig(cpu=2.0, backend="local")})
    assert workers(ModalRuntime(local).make_backend().serve_args) == "2"
    drc = RuntimeConfig(name="docker", docker=DockerConfig(cpus=0.5))
    assert workers(DockerRuntime(drc).make_backend().serve_args) == "1"
    explicit = RuntimeConfig(name="docker", workers=6, docker=DockerConfig(cpus=2.0))
    assert workers(DockerRuntime(explicit).make_backend().serve_args) == "6"


class _Aio:
    def __init__(self, fn: Any) -> None:
        self.aio = fn


class _ListedSandbox:
    def __init__(self, object_id: str, tags: dict[str, str]) -> None:
        self.object_id = object_id
        self.terminated = False

        async def get_tags() -> dict[str, str]:
            return tags

        async def terminate() -> None:
            self.terminated = True

        self.get_tags = _Aio(get_tags)
        self.terminate = _Aio(terminate)


async def test_modal_sandboxes_of_a_dead_owner_are_terminated_at_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A trainer killed outright leaves paid Sandboxes running until their timeout; the next
    # start on the same host finds them by their owner tags and terminates them.
    import psutil
    from modal._utils.name_utils import check_tag_dict

    be = ModalBackend(ModalConfig(), ["--runtime.name", "local"])
    check_tag_dict(be.tags)  # Modal accepts these tags
    dead = subprocess.Popen(["true"])
    dead.wait()
    other = subprocess.Popen(["sleep", "60"])
    try:
        born = psutil.Process(other.pid).create_time()
        host = be.tags["leanrl-host"]

        def tags(pid: int, started: str, on: str = host) -> dict[str, str]:
            return {"leanrl-host": on, "leanrl-pid": str(pid), "leanrl-started": started}

        listed = {
            "sb-dead": _ListedSandbox("sb-dead", tags(dead.pid, "123.00")),
            "sb-reused": _ListedSandbox("sb-reused", tags(other.pid, f"{born - 3600:.2f}")),
            "sb-alive": _ListedSandbox("sb-alive", tags(other.pid, f"{born:.2f}")),
            "sb-mine": _ListedSandbox("sb-mine", dict(be.tags)),
            "sb-elsewhere": _ListedSandbox("sb-elsewhere", tags(dead.pid, "1.00", "other-host")),
        }
        asked: list[dict[str, Any]] = []

        async def list_sandboxes(**kw: Any):  # type: ignore[no-untyped-def]
            asked.append(kw)
            for sb in listed.values():
                yield sb

        async def lookup(name: str, **kw: Any) -> Any:
            return type("App", (), {"app_id": "ap-1"})()

        monkeypatch.setattr(modal, "Sandbox", type("S", (), {"list": _Aio(list_sandboxes)}))
        monkeypatch.setattr(modal, "App", type("A", (), {"lookup": _Aio(lookup)}))
        await be.start()
        assert asked == [{"app_id": "ap-1", "tags": {"leanrl-host": host}}]
        gone = sorted(k for k, sb in listed.items() if sb.terminated)
        assert gone == ["sb-dead", "sb-reused"] and sorted(be.removed_stale) == gone
        # close() sweeps whatever of its own still runs (a creation cancelled mid-way)
        listed = {"sb-mine": _ListedSandbox("sb-mine", dict(be.tags))}
        await be.close()
        assert asked[-1] == {"app_id": "ap-1", "tags": {"leanrl-owner": be.tags["leanrl-owner"]}}
        assert listed["sb-mine"].terminated and be.swept == ["sb-mine"]
    finally:
        other.kill()
        other.wait()


async def test_sandboxes_are_retired_early_enough_to_finish_a_batch(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A batch may take the service's whole request timeout; a Sandbox handed one must live that
    # long before Modal's hard timeout kills it.
    slow = RuntimeConfig(name="modal", timeout_s=120, modal=ModalConfig(cpu=4, batch_size=64))
    s = ModalRuntime(slow).settings()
    batch = s.service.request_timeout_s  # 16 rounds of (120 + 5) s, plus a Lean start-up
    assert batch == 16 * 125 + 600
    assert s.pool.max_age_s + batch <= slow.modal.sandbox_timeout_s
    # a hard timeout shorter than the worst batch is warned about (with the number to use)
    from leanrl.service.sandbox_runtime import SandboxRuntime

    async def no_pool(self: SandboxRuntime) -> None:  # the check runs before any Sandbox
        return None

    monkeypatch.setattr(SandboxRuntime, "start", no_pool)
    short = slow.model_copy(
        update={"modal": ModalConfig(cpu=4, batch_size=64, sandbox_timeout_s=1800)}
    )
    await ModalRuntime(short).start()
    assert "Modal may kill a Sandbox mid-batch. Raise it above 2660 s" in caplog.text


def test_the_code_image_takes_the_same_sources_as_the_dockerfile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Not the whole checkout: run folders, data or a .venv there would be uploaded to Modal and
    # invalidate the image on every change.
    from leanrl.runtimes.modal import image as image_mod

    lines = (DOCKER_DIR / "Dockerfile").read_text().splitlines()
    copied = {
        Path(s).name
        for ln in lines
        if ln.startswith("COPY ") and ln.split()[-1].startswith("/opt/leanrl-src")
        for s in ln.split()[1:-1]
    }
    pinned = ModalConfig(lean_toolchain="leanprover/lean4:v4.24.0")  # what the runtime fills in
    r = image_recipe(pinned)
    assert set(r.source_paths) == copied
    added: list[str] = []

    def record(kind: str):  # type: ignore[no-untyped-def]
        def add(self, local, remote, **kw):  # type: ignore[no-untyped-def]
            added.append(f"{kind} {Path(local).relative_to(REPO)} -> {remote}")
            return self

        return add

    monkeypatch.setattr(modal.Image, "add_local_dir", record("dir"))
    monkeypatch.setattr(modal.Image, "add_local_file", record("file"))
    image_mod.build_image(pinned)
    sources = [a for a in added if "/opt/leanrl-src" in a]
    assert sorted(sources) == sorted(
        f"{'dir' if (REPO / p).is_dir() else 'file'} {p} -> /opt/leanrl-src/{p}"
        for p in r.source_paths
    )


def test_preflight_without_credentials_stops_before_anything_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Checked offline, from the environment and Modal's config file; the local backend needs
    # none. Whether a token is valid only Modal can say (when the runtime starts).
    from leanrl.errors import RuntimeUnavailable
    from leanrl.runtimes.modal import ModalRuntime

    for var in ("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MODAL_CONFIG_PATH", str(tmp_path / "none.toml"))
    rt = ModalRuntime(RuntimeConfig(name="modal"))
    with pytest.raises(RuntimeUnavailable, match="modal token new"):
        rt.preflight()
    (tmp_path / "none.toml").write_text('[default]\ntoken_id = "ak-x"\ntoken_secret = "as-y"\n')
    rt.preflight()
    monkeypatch.setenv("MODAL_CONFIG_PATH", str(tmp_path / "other.toml"))
    monkeypatch.setenv("MODAL_TOKEN_ID", "ak-x")
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "as-y")
    rt.preflight()
    monkeypatch.delenv("MODAL_TOKEN_ID")
    local = RuntimeConfig.model_validate({"name": "modal", "modal": {"backend": "local"}})
    ModalRuntime(local).preflight()
