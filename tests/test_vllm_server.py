"""GRPO against a separate generation server, over real HTTP on loopback.

The server is ``tests/_vllm_standin.py``: vLLM's HTTP surface (OpenAI completions,
``/collective_rpc``, ``/reset_prefix_cache``) around transformers models, with leanrl's real
``WeightReceiver`` in each of its two "workers" and a real gloo weight group. The real vLLM is
exercised by the ``gpu`` tests at the end (skipped without CUDA and vLLM).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from leanrl.errors import PolicyError
from leanrl.policy import PolicyConfig, SamplingConfig
from tests._ranks import free_port
from tests.test_grpo_trainer import DigitEnv

REPO = Path(__file__).resolve().parent.parent


def _start(model: Path, *flags: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "tests" / "_vllm_standin.py"),
            "--model",
            str(model),
            "--port",
            str(port),
            *flags,
        ],
        cwd=REPO,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the stand-in server exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError("the stand-in server did not come up in 120 s")


@pytest.fixture
def server(own_tiny_model: Path) -> Iterator[str]:
    proc, url = _start(own_tiny_model)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def _config(model: Path, out: Path, url: str, async_generation: Any = False, **sync: Any) -> Any:
    from leanrl.train.grpo import GRPOConfig

    return GRPOConfig(
        async_generation=async_generation,  # synchronous: each step's push precedes its batch
        policy=PolicyConfig(model=str(model), backend="openai", base_url=f"{url}/v1"),
        vllm_server={"group_port": free_port(), "timeout_s": 60, **sync},
        sampling=SamplingConfig(max_tokens=12, top_p=1.0, seed=0),
        out=out,
        steps=3,
        tasks_per_step=2,
        group_size=4,
        lr=3e-3,
        weight_decay=0.0,
        save_every=1,
        mask_truncated=False,
        dynamic_sampling="off",
    )


def _checksum_of(ckpt: Path) -> float:
    from transformers import AutoModelForCausalLM

    from leanrl.train.vllm_server import checksum

    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    return checksum(p for _, p in model.named_parameters())


@pytest.mark.parametrize("transport", ["gloo", "disk"])
def test_grpo_pushes_each_step_to_the_server(
    own_tiny_model: Path, tmp_path: Path, server: str, transport: str
) -> None:
    from leanrl.train.grpo import GRPOTrainer

    sync: dict[str, Any] = {"transport": transport}
    if transport == "disk":
        sync["disk_dir"] = str(tmp_path / "shared")
    before = httpx.get(f"{server}/standin/state").json()
    rows = GRPOTrainer(_config(own_tiny_model, tmp_path / "run", server, **sync), DigitEnv())
    rows = rows.train_sync()
    assert [r["step"] for r in rows] == [1, 2, 3]
    after = httpx.get(f"{server}/standin/state").json()
    # generation for steps 2 and 3 followed a push of the weights of steps 1 and 2
    assert after["resets"] == before["resets"] + 2
    assert after["checksums"][0] == after["checksums"][1]  # both workers got everything
    assert after["checksums"][0] != before["checksums"][0]
    want = _checksum_of(tmp_path / "run" / "checkpoint-2")
    assert after["checksums"][0] == pytest.approx(want, rel=1e-9)
    # the server's samples were drawn with the trainer's weights: ρ stays ~1 on fresh rollouts
    assert all(r["kl_behaviour"] < 1e-6 for r in rows), [r["kl_behaviour"] for r in rows]
    if transport == "disk":
        assert not list((tmp_path / "shared").iterdir())  # weight files are removed after use


def test_grpo_overlaps_generation_by_default_on_a_vllm_server(
    own_tiny_model: Path, tmp_path: Path, server: str
) -> None:
    # async_generation = "auto" resolves on for a vLLM server: a batch is generated while the
    # previous step trains, so the weights it was sampled with are one step stale at most
    from leanrl.train.grpo import GRPOTrainer

    before = httpx.get(f"{server}/standin/state").json()
    cfg = _config(
        own_tiny_model, tmp_path / "run", server, async_generation="auto", transport="gloo"
    )
    rows = GRPOTrainer(cfg, DigitEnv()).train_sync()
    assert [r["step"] for r in rows] == [1, 2, 3]
    import json

    stored = json.loads((tmp_path / "run" / "config.json").read_text(encoding="utf-8"))
    assert stored["async_generation"] is True  # "auto" resolved on, and recorded for resume
    after = httpx.get(f"{server}/standin/state").json()
    assert before["resets"] < after["resets"] <= before["resets"] + 2  # pushes still happen


def test_the_same_server_serves_eval_through_the_openai_backend(server: str) -> None:
    from leanrl.policies.openai import OpenAIPolicy

    async def go() -> Any:
        pol = OpenAIPolicy(PolicyConfig(model="m", backend="openai", base_url=f"{server}/v1"))
        try:
            return await pol.generate(
                ["theorem t : 1 + 1 = 2 := by"], SamplingConfig(n=2, max_tokens=5)
            )
        finally:
            await pol.close()

    [[a, b]] = asyncio.run(go())
    assert a.logprobs is not None and len(a.logprobs) >= 1 and b.finish_reason in ("stop", "length")


def test_a_resumed_run_pushes_its_weights_before_generating(
    own_tiny_model: Path, tmp_path: Path, server: str
) -> None:
    from leanrl.train.grpo import GRPOTrainer

    out = tmp_path / "run"
    GRPOTrainer(_config(own_tiny_model, out, server, transport="gloo"), DigitEnv()).train_sync()
    cfg = _config(own_tiny_model, out, server, transport="gloo").model_copy(update={"steps": 4})
    resets = httpx.get(f"{server}/standin/state").json()["resets"]
    GRPOTrainer(cfg, DigitEnv()).train_sync()
    state = httpx.get(f"{server}/standin/state").json()
    assert state["resets"] == resets + 1  # the checkpoint-3 weights, before step 4 generated
    assert state["checksums"][0] == pytest.approx(_checksum_of(out / "checkpoint-3"), rel=1e-9)


def test_clear_errors(own_tiny_model: Path, tmp_path: Path) -> None:
    from leanrl.errors import ConfigError
    from leanrl.train.grpo import GRPOTrainer
    from leanrl.train.vllm_server import VLLMServerConfig, WeightSync

    with pytest.raises(PolicyError, match="cannot reach the vLLM server"):
        WeightSync(
            VLLMServerConfig(transport="gloo"), f"http://127.0.0.1:{free_port()}/v1"
        ).connect()
    cfg = _config(own_tiny_model, tmp_path / "r", "http://x", transport="disk")
    with pytest.raises(ConfigError, match="disk_dir"):
        GRPOTrainer(cfg).check()
    cfg = cfg.model_copy(update={"policy": cfg.policy.model_copy(update={"backend": "hf"})})
    cfg.vllm_server.disk_dir = tmp_path
    with pytest.raises(ConfigError, match=r"policy\.backend = 'openai'"):
        GRPOTrainer(cfg).check()
    proc, url = _start(own_tiny_model, "--no-dev-mode", "--workers", "1")
    try:
        with pytest.raises(PolicyError, match="VLLM_SERVER_DEV_MODE=1"):
            WeightSync(VLLMServerConfig(transport="gloo"), url).connect()
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.gpu
def test_real_vllm_server_takes_nccl_pushes(own_tiny_model: Path, tmp_path: Path) -> None:
    """The real thing: ``vllm serve`` with the receiver, GRPO pushing over NCCL (GPU + vLLM)."""
    pytest.importorskip("vllm", reason="vLLM is not installed")
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs: one for the trainer, one for the server")
    import os

    from leanrl.testing import make_tiny_model
    from leanrl.train.grpo import GRPOTrainer

    model = make_tiny_model(tmp_path / "m", ["0123456789 omega simp"] * 8, hidden_size=256)
    port = free_port()
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "CUDA_VISIBLE_DEVICES": "1"}
    proc = subprocess.Popen(
        [
            "vllm",
            "serve",
            str(model),
            "--port",
            str(port),
            "--enforce-eager",
            "--max-model-len",
            "256",
            "--gpu-memory-utilization",
            "0.3",
            "--dtype",
            "float32",
            "--logprobs-mode",
            "processed_logprobs",
            "--worker-extension-cls",
            "leanrl.train.vllm_server.WeightReceiver",
        ],
        env=env,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(1)
        cfg = _config(model, tmp_path / "run", url, transport="nccl")
        rows = GRPOTrainer(cfg, DigitEnv()).train_sync()
        assert [r["step"] for r in rows] == [1, 2, 3]
        assert all(r["clip_frac"] is None or r["clip_frac"] < 0.05 for r in rows)
    finally:
        proc.terminate()
        proc.wait(60)
