"""The vllm policy: a clear install hint without vLLM; real generation on a GPU."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from leanrl import PolicyConfig, PolicyError, SamplingConfig
from leanrl.policies import make_policy

HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here; this checks the message without it")
async def test_missing_vllm_says_how_to_install(tiny_model_dir: Path) -> None:
    p = make_policy(PolicyConfig(model=str(tiny_model_dir), backend="vllm"))
    with pytest.raises(PolicyError, match=r"pip install 'leanrl\[vllm\]'"):
        await p.start()


def test_importing_the_backend_does_not_import_vllm() -> None:
    import sys

    import leanrl.policies.vllm  # noqa: F401

    assert HAS_VLLM or "vllm" not in sys.modules


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_VLLM, reason="needs vLLM (pip install 'leanrl[vllm]')")
async def test_vllm_generates_with_logprobs(tiny_model_dir: Path) -> None:
    p = make_policy(
        PolicyConfig(
            model=str(tiny_model_dir), backend="vllm", gpu_memory_utilization=0.3, dtype="float32"
        )
    )
    await p.start()
    s = SamplingConfig(n=2, max_tokens=8, seed=0)
    a = await p.generate(["theorem foo"], s)
    b = await p.generate(["theorem foo"], s)
    assert [c.token_ids for c in a[0]] == [c.token_ids for c in b[0]]  # seeded
    for c in a[0]:
        assert c.logprobs is not None and len(c.logprobs) == len(c.token_ids) > 0
    await p.close()
