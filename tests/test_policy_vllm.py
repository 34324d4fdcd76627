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
    with pytest.raises(PolicyError, match=r'pip install -e ".*\[vllm\]"'):
        await p.start()


def test_importing_the_backend_does_not_import_vllm() -> None:
    import sys

    import leanrl.policies.vllm  # noqa: F401

    assert HAS_VLLM or "vllm" not in sys.modules


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_VLLM, reason="needs vLLM (the vllm extra) and a GPU")
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


class _FakeTokenizer:
    """Stands in for a tokenizer whose chat template starts with BOS (DeepSeek/Llama style)."""

    def apply_chat_template(self, messages, tokenize: bool, add_generation_prompt: bool) -> str:
        assert tokenize is False and add_generation_prompt is True
        return "<s>" + "".join(f"[{m['role']}]{m['content']}" for m in messages) + "[assistant]"

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        body = text.removeprefix("<s>")
        ids = [1] if text.startswith("<s>") else []
        ids += [ord(c) for c in body]
        return ([1] if add_special_tokens else []) + ids


def test_chat_prompts_reach_vllm_as_token_ids_with_one_bos(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The glue code only (vLLM's API replaced by a recorder; real generation is the gpu test):
    a chat template that already holds BOS must not get a second one from vLLM's tokenizer."""
    import sys
    import types

    from leanrl import ChatMessage
    from leanrl.policies.vllm import VLLMPolicy

    seen: list[object] = []
    out = types.SimpleNamespace(
        text="ok", token_ids=[5], logprobs=None, finish_reason="stop", cumulative_logprob=None
    )

    class LLM:
        def get_tokenizer(self) -> _FakeTokenizer:
            return _FakeTokenizer()

        def generate(self, prompts, params, use_tqdm=False):
            seen.extend(prompts)
            return [types.SimpleNamespace(outputs=[out], prompt_token_ids=[1]) for _ in prompts]

    fake = types.SimpleNamespace(SamplingParams=lambda **kw: kw, LLM=LLM)
    monkeypatch.setitem(sys.modules, "vllm", fake)
    p = VLLMPolicy(PolicyConfig(model=str(tiny_model_dir), backend="vllm"))
    p._llm = LLM()
    chat = [ChatMessage(role="user", content="hi")]
    got = p._generate_sync([chat, "text prompt"], SamplingConfig())
    assert [c.text for row in got for c in row] == ["ok", "ok"]
    ids = seen[0]["prompt_token_ids"]  # type: ignore[index]
    assert ids[:2] != [1, 1] and ids[0] == 1 and ids.count(1) == 1
    assert seen[1] == "text prompt"  # a completion prompt is passed as text (vLLM adds BOS once)


async def test_generate_from_ids_passes_the_exact_ids(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The glue only (vLLM's API replaced by a recorder): multi-turn contexts reach the engine as
    the exact ids the harness recorded, and the tactic loop sees that this backend can do it."""
    import sys
    import types

    from leanrl.harnesses.tactic_loop.context import ids_capable
    from leanrl.policies.vllm import VLLMPolicy

    seen: list[object] = []
    out = types.SimpleNamespace(
        text="simp", token_ids=[7, 8], logprobs=None, finish_reason="stop", cumulative_logprob=None
    )

    class LLM:
        def get_tokenizer(self) -> _FakeTokenizer:
            return _FakeTokenizer()

        def generate(self, prompts, params, use_tqdm=False):
            seen.extend(prompts)
            return [
                types.SimpleNamespace(outputs=[out], prompt_token_ids=p["prompt_token_ids"])
                for p in prompts
            ]

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(SamplingParams=lambda **kw: kw))
    p = VLLMPolicy(PolicyConfig(model=str(tiny_model_dir), backend="vllm"))
    p._llm = LLM()
    got = await p.generate_from_ids([[1, 5, 6], [1, 9]], SamplingConfig())
    assert seen == [{"prompt_token_ids": [1, 5, 6]}, {"prompt_token_ids": [1, 9]}]
    assert got[0][0].prompt_token_ids == (1, 5, 6) and got[0][0].token_ids == (7, 8)
    assert ids_capable(p, chat=False)
    with pytest.raises(PolicyError, match="empty prompt"):
        await p.generate_from_ids([[]], SamplingConfig())
