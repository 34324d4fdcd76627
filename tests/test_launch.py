"""Launchers: the Modal app defined and inspected offline, the same functions run locally in
processes (streaming map, order restored, retries, Volume = a folder), ES fanned out over them
(identical to a local run), a killed orchestrator resuming from the Volume, and --dry-run."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import modal
import pytest

from leanrl.errors import ConfigError
from leanrl.launch.config import LauncherConfig, ModalLaunchConfig
from leanrl.launch.local_functions import FunctionError, FunctionSpec, LocalFunctions
from leanrl.launch.modal_app import FUNCTION_ROLES, build_app
from leanrl.launch.plan import plan_for
from leanrl.launch.volume import FolderVolume, RunMirror

# -- the Modal app, offline ----------------------------------------------------------------------


def test_the_modal_app_is_defined_offline() -> None:
    m = ModalLaunchConfig(gpu="A100-80GB", gpu_count=2, secret="hf-token", member_containers=6)
    d = build_app(m)
    assert d.app.name == "leanrl"
    assert set(d.functions) == set(FUNCTION_ROLES)
    assert set(d.images) == {"gpu", "orchestrator", "lean"}
    assert all(isinstance(i, modal.Image) for i in d.images.values())
    spec = {name: fn._spec_ for name, fn in d.functions.items()}
    # images per role (Modal wraps its objects: the repr names the image's own recipe)
    assert repr(spec["es_member"].image) == repr(d.images["gpu"])
    assert repr(spec["orchestrate"].image) == repr(d.images["orchestrator"])
    assert repr(spec["train_grpo"].image) == repr(d.images["gpu"])
    assert repr(d.images["gpu"]) != repr(d.images["orchestrator"])
    # GPUs: one per member engine, gpu_count for GRPO and evals; none for the orchestrator
    assert spec["es_member"].gpus == "A100-80GB" and spec["es_checkpoint"].gpus == "A100-80GB"
    assert spec["train_grpo"].gpus == "A100-80GB:2" and spec["evaluate"].gpus == "A100-80GB:2"
    assert spec["orchestrate"].gpus is None and spec["orchestrate"].cpu == m.orchestrator_cpu
    # the Volume everywhere, at the mount; the Secret everywhere
    for s in spec.values():
        assert list(s.volumes) == ["/vol"] and repr(s.volumes["/vol"]) == repr(d.volume)
        names = [repr(x) for x in s.secrets]
        assert names[0] == "modal.Secret.from_name('hf-token')"
        # the containers' environment (Modal carries env= as one more secret)
        assert "LEANRL_VOLUME_ROOT" in names[1] and "HF_HOME" in names[1]
    assert "LEANRL_GPU_KIND" in repr(spec["es_member"].secrets[1])
    assert "LEANRL_GPU_KIND" not in repr(spec["orchestrate"].secrets[1])
    assert d.settings["es_member"]["max_containers"] == 6
    assert d.settings["es_member"]["timeout"] == m.member_timeout_s
    assert d.settings["orchestrate"]["timeout"] == m.timeout_s
    assert d.settings["es_member"]["retries"].max_retries == m.retries
    # the bodies run here too (.local() needs no Modal): a job of an unknown kind fails clearly
    from leanrl.launch.functions import ROLE_ENV, JobCall

    cwd = os.getcwd()
    with pytest.raises(ConfigError, match="unknown job kind"):
        d.functions["evaluate"].local(JobCall("nope", {}, "gpu"))  # type: ignore[arg-type]
    assert ROLE_ENV not in os.environ and os.getcwd() == cwd  # the caller is left as it was


def test_no_secret_and_one_gpu() -> None:
    d = build_app(ModalLaunchConfig(secret=None, gpu="H100"))
    assert d.functions["train_grpo"]._spec_.gpus == "H100"
    assert "from_name" not in repr(d.functions["es_member"]._spec_.secrets)


@pytest.mark.modal
def test_modal_app_deploys_and_runs_an_eval(tmp_path: Path) -> None:
    """The real thing: deploy the app and run a Countdown eval in a GPU Function."""
    from leanrl.eval.config import EvalConfig
    from leanrl.launch.launcher import launch

    cfg = EvalConfig(
        env={"id": "countdown", "taskset": {"limit": 2}},
        policy={"model": "Qwen/Qwen2.5-0.5B-Instruct"},
        out="runs/test-modal-eval",
        launcher=LauncherConfig(name="modal", modal=ModalLaunchConfig(gpu="T4")),
    )
    summary = launch("eval", cfg)
    assert summary["results"]["pass_at_k"]["all"]["tasks"] == 2


# -- the same functions in local processes --------------------------------------------------------


def _fns(tmp_path: Path, **spec: Any) -> LocalFunctions:
    specs = {
        "echo": FunctionSpec(
            "_launch_bodies:slow_echo", spec.get("containers", 2), spec.get("conc", 2)
        ),
        "die_once": FunctionSpec("_launch_bodies:die_once", 1, 1),
        "always_die": FunctionSpec("_launch_bodies:always_die", 1, 1),
        "raise": FunctionSpec("_launch_bodies:raise_error", 1, 1),
    }
    return LocalFunctions(specs, tmp_path / "vol", retries=2)


def test_map_streams_results_as_they_finish(tmp_path: Path) -> None:
    async def go() -> list[tuple[int, Any]]:
        fns = _fns(tmp_path, containers=2, conc=3)
        await fns.start()
        try:
            delays = [0.6, 0.1, 0.4, 0.05, 0.3, 0.2]
            inputs = [{"index": i, "delay": d} for i, d in enumerate(delays)]
            return [x async for x in fns.map("echo", inputs)]
        finally:
            await fns.close()

    got = asyncio.run(go())
    order = [i for i, _ in got]
    assert sorted(order) == list(range(6)) and order != list(range(6))  # as they finished
    assert all(r["index"] == i for i, r in got)  # each result belongs to its input
    assert len({r["pid"] for _, r in got}) == 2  # two containers, three calls each at once
    assert {Path(r["cwd"]) for _, r in got} == {(tmp_path / "vol").resolve()}  # the Volume


def test_a_dead_container_is_retried_and_errors_are_raised(tmp_path: Path) -> None:
    async def go() -> None:
        fns = _fns(tmp_path)
        await fns.start()
        try:
            marker = tmp_path / "marker"
            assert await fns.call("die_once", {"marker": str(marker), "x": 21}) == 42
            assert marker.read_text() == "died" and fns.started["die_once"] == 2
            with pytest.raises(FunctionError, match=r"failed 3 times.*no retries left"):
                await fns.call("always_die", None)
            with pytest.raises(FunctionError, match="ValueError: bad payload 7"):
                await fns.call("raise", 7)
        finally:
            await fns.close()

    asyncio.run(go())


def test_run_mirror_round_trip(tmp_path: Path) -> None:
    run = tmp_path / "here" / "run"
    (run / "checkpoint-2").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (run / "checkpoint-2" / "model.safetensors").write_bytes(b"x" * 100)
    vol = FolderVolume(tmp_path / "vol")
    mirror = RunMirror(vol, run, "runs/r")
    assert mirror.push() == 2 and mirror.push() == 0  # only what changed is sent again
    assert not (tmp_path / "vol" / "runs/r/checkpoint-2/model.safetensors").exists()
    # a checkpoint written on the Volume by the GPU function: a fresh machine pulls its state
    (tmp_path / "vol/runs/r/checkpoint-2").mkdir(parents=True)
    (tmp_path / "vol/runs/r/checkpoint-2/trainer_state.json").write_text('{"step": 2}')
    elsewhere = tmp_path / "elsewhere" / "run"
    assert RunMirror(vol, elsewhere, "runs/r").pull() == 3
    assert (elsewhere / "metrics.jsonl").read_text() == '{"step": 1}\n'
    assert (elsewhere / "checkpoint-2" / "trainer_state.json").is_file()


# -- ES over the launched functions ---------------------------------------------------------------


def _es_config(model: Path, out: Path | str, **kw: Any) -> Any:
    from test_es_learning import toy_config

    launcher = kw.pop("launcher", None)
    base: dict[str, Any] = {"steps": 3, "population": 4, "save_every": 2, **kw}
    cfg = toy_config(model, Path(out), **base)
    if launcher is not None:
        cfg = cfg.model_copy(update={"launcher": launcher})
    return cfg


def _launcher(tmp_path: Path, **m: Any) -> LauncherConfig:
    """The local Modal backend; 2 member containers unless ``m`` says otherwise (each container
    is a process that imports torch: a test that is not about the fan-out takes 1)."""
    return LauncherConfig(
        name="modal",
        modal=ModalLaunchConfig(
            backend="local", local_volume=tmp_path / "vol", **{"member_containers": 2, **m}
        ),
    )


def test_es_fanned_out_equals_a_local_run(
    toy_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from leanrl.launch.launcher import launch
    from leanrl.train.es import ESTrainer
    from leanrl.train.es.history import ESHistory

    local = ESTrainer(_es_config(toy_model_dir, tmp_path / "local"))
    local_rows = local.train_sync()
    monkeypatch.chdir(tmp_path)
    cfg = _es_config(toy_model_dir, "runs/es", launcher=_launcher(tmp_path, orchestrator="local"))
    result = launch("es", cfg)
    assert result["iterations"] == 3
    here = ESHistory(tmp_path / "runs/es/es_history.bin")
    here.open(read_only=True)
    assert here.records == local.history.records  # the same updates, bit for bit
    rows = [json.loads(x) for x in (tmp_path / "runs/es/metrics.jsonl").read_text().splitlines()]
    assert [r["reward_mean"] for r in rows] == [r["reward_mean"] for r in local_rows]
    assert all(0.0 <= r["gpu_idle_frac"] <= 1.0 for r in rows)
    # members_per_container = "auto": 2 before anything is measured, then the containers'
    # G and V decide (a toy model and checker here: any depth up to the population)
    assert rows[0]["pipeline_depth"] == 2
    assert all(1 <= r["pipeline_depth"] <= cfg.population for r in rows)
    assert rows[-1]["update_norm"] is None  # the orchestrator holds no weights
    vol = tmp_path / "vol" / "runs/es"
    # checkpoints were built by es_checkpoint, on the Volume; the small files were mirrored
    assert (vol / "checkpoint-2" / "trainer_state.json").is_file()
    assert (vol / "checkpoint-3" / "config.json").is_file()
    assert (vol / "es_history.bin").read_bytes() == (
        tmp_path / "runs/es/es_history.bin"
    ).read_bytes()
    summary = json.loads((vol / "summary.json").read_text())
    assert summary["trainer"] == "es" and "usd" in summary["cost"]
    # the checkpoint on the Volume is the run's weights at iteration 3
    from leanrl.train.es.history import replay

    _, _, w_local = replay(tmp_path / "local")
    from leanrl.train.es.policy import load_model
    from leanrl.train.es.weights import ESWeights

    m3, _ = load_model(str(vol / "checkpoint-3"), "float32", "cpu")
    assert w_local.equal(ESWeights.from_model(m3).master)


def _container_children() -> list[int]:
    """This process's container processes (spawned children, not the resource tracker)."""
    import psutil

    out = []
    for p in psutil.Process().children(recursive=False):
        try:
            if "spawn_main" in " ".join(p.cmdline()):
                out.append(p.pid)
        except psutil.Error:
            pass
    return out


def test_a_killed_orchestrator_resumes_from_the_volume(
    toy_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from leanrl.launch.launcher import launch
    from leanrl.train.es import ESTrainer
    from leanrl.train.es.history import ESHistory

    reference = ESTrainer(_es_config(toy_model_dir, tmp_path / "ref", steps=4))
    reference.train_sync()
    monkeypatch.chdir(tmp_path)
    cfg = _es_config(
        toy_model_dir,
        "runs/es",
        steps=4,
        launcher=_launcher(tmp_path, orchestrator="function", member_containers=1),
    )
    metrics = tmp_path / "vol" / "runs/es/metrics.jsonl"
    killed: list[int] = []
    finished = threading.Event()

    def killer() -> None:  # kill the orchestrator's container once an iteration is on the Volume
        while not finished.is_set():
            if metrics.is_file() and metrics.read_text().count("\n") >= 1:
                for pid in set(_container_children()) - before:  # the orchestrator's container
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        continue
                    killed.append(pid)
                if killed:
                    return
            time.sleep(0.05)

    before = set(_container_children())  # any left by earlier tests are not ours to kill
    t = threading.Thread(target=killer)
    t.start()
    try:
        result = launch("es", cfg)  # the call is retried on a fresh container, which resumes
    finally:
        finished.set()
        t.join()
    assert killed, "the orchestrator was never killed"
    assert result["iterations"] == 4
    hist = ESHistory(tmp_path / "vol" / "runs/es/es_history.bin")
    hist.open(read_only=True)
    assert hist.records == reference.history.records
    steps = [json.loads(x)["step"] for x in metrics.read_text().splitlines()]
    assert steps == [1, 2, 3, 4]  # nothing lost, nothing counted twice


def test_out_must_be_a_volume_path(toy_model_dir: Path, tmp_path: Path) -> None:
    from leanrl.launch.launcher import launch

    cfg = _es_config(toy_model_dir, tmp_path / "abs", launcher=_launcher(tmp_path))
    with pytest.raises(ConfigError, match="folder on the Volume"):
        launch("es", cfg)


# -- --dry-run ------------------------------------------------------------------------------------


def test_dry_run_plans_the_reference_es_loop(capsys: pytest.CaptureFixture[str]) -> None:
    from leanrl.cli import main

    rc = main(["train", "es", "--config", "examples/train-es-minif2f-modal.toml", "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "30 members x 128 tasks x 1 samples = 3840 attempts" in out
    assert "batches of 64: 2 per member, 60 per iteration" in out
    # members_per_container = "auto": the plan applies the rule to its own estimate
    assert re.search(r"es_member x\d+ containers on H100 \(auto: 2 in the first iteration", out)
    assert "estimated per iteration" in out and "$" in out
    # the sandboxes' Lean is the taskset's when none is pinned (it printed `None` once)
    from leanrl.environment import EnvironmentConfig, load_environment

    want = load_environment(EnvironmentConfig(id="minif2f")).taskset.lean_toolchain
    assert want and f"lean (sandboxes: {want})" in out


def test_plan_estimates_scale_with_the_work() -> None:
    from leanrl.train.es import ESConfig

    base = {"launcher": {"name": "modal"}, "env": {"runtime": {"name": "modal"}}}
    small = plan_for("es", ESConfig(population=10, tasks_per_step=16, **base)).estimate
    big = plan_for("es", ESConfig(population=30, tasks_per_step=128, **base)).estimate
    assert big["sandbox_core_s"] == pytest.approx(small["sandbox_core_s"] * 24)
    assert big["usd"] > small["usd"] > 0
    serial = ESConfig(population=30, tasks_per_step=128, **base)
    serial.launcher.modal.members_per_container = 1
    assert plan_for("es", serial).estimate["wall_s"] > big["wall_s"]  # pipelining shortens it


# -- GRPO and eval as whole jobs in a GPU function ---------------------------------------------


@pytest.fixture(scope="module")
def cd_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from test_countdown import make_countdown_model

    return make_countdown_model(tmp_path_factory.mktemp("launch-cd-model"))


def test_eval_and_grpo_run_as_jobs_with_the_volume_as_their_folder(
    cd_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from leanrl.eval.config import EvalConfig
    from leanrl.launch.launcher import launch
    from leanrl.train.grpo import GRPOConfig

    monkeypatch.chdir(tmp_path)
    launcher = _launcher(tmp_path)
    env = {
        "id": "countdown",
        "taskset": {"split": "train", "limit": 4},
        "harness": {"options": {"style": "direct", "reward": "dense"}},
    }
    grpo = GRPOConfig(
        env=env,
        policy={"model": str(cd_model)},
        sampling={"max_tokens": 6, "seed": 0},
        out="runs/grpo",
        steps=2,
        tasks_per_step=2,
        group_size=2,
        launcher=launcher,
    )
    launch("grpo", grpo)
    vol = tmp_path / "vol"
    assert (vol / "runs/grpo/checkpoint-2/trainer_state.json").is_file()
    assert len((vol / "runs/grpo/metrics.jsonl").read_text().splitlines()) == 2
    assert not (tmp_path / "runs").exists()  # nothing was written here: all on the Volume
    # evaluate the checkpoint where it lies: a path on the Volume
    ev = EvalConfig(
        env=env,
        policy={"model": "runs/grpo/checkpoint-2"},
        out="runs/eval-grpo",
        progress=False,
        launcher=launcher,
    )
    summary = launch("eval", ev)
    assert summary["results"]["pass_at_k"]["all"]["tasks"] == 4
    assert (vol / "runs/eval-grpo/results.jsonl").is_file()
    assert "usd" in summary["cost"]


def test_dry_run_of_countdown_plans_no_lean(capsys: pytest.CaptureFixture[str]) -> None:
    # It planned Lean checking that Countdown does not do: an ES "lean: local runtime" line, 4
    # sandbox core-s per attempt in the assumptions and the wall time, "Lean 0 sandbox core-s".
    from leanrl.cli import main
    from leanrl.train.es import ESConfig

    for cmd in (["train", "es"], ["train", "grpo"], ["eval", "--limit", "8"]):
        assert main([*cmd, "--env", "countdown", "--model", "m", "--dry-run"]) == 0
        out = capsys.readouterr().out
        assert not re.search(r"\blean\b", out, re.I) and "sandbox" not in out, out
        assert "checked in Python" in out, out
    modal_es = ["train", "es", "--env", "countdown", "--model", "m", "--launcher.name", "modal"]
    assert main([*modal_es, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert not re.search(r"\blean\b", out, re.I) and "sandbox" not in out, out
    es = ESConfig(env={"id": "countdown"}, policy={"model": "m"})
    est, assume = plan_for("es", es).estimate, es.launcher.estimate
    attempts = es.population * es.tasks_per_step * es.samples_per_task
    assert est["sandbox_core_s"] == 0.0
    assert est["wall_s"] == pytest.approx(attempts * assume.gpu_s_per_attempt)  # no check time
    # a runtime Countdown cannot use is refused, as the run itself would refuse it
    args = ["train", "grpo", "--env", "countdown", "--model", "m", "--dry-run"]
    assert main([*args, "--env.runtime.name", "modal"]) == 2
    assert "takes no runtime" in capsys.readouterr().err
