"""Low-rank ES members as vLLM LoRA adapters, on a machine without vLLM: the adapter tensors are
the members' σ·A·Bᵀ/√r, the folders load in PEFT (the format vLLM reads) and decode what the
materialised weights decode, and one generate call carries every member's rows with its own
adapter (vLLM's API replaced by a stand-in doing PEFT mixed-adapter batches)."""

from __future__ import annotations

import math
import sys
import types
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from leanrl.environment import Environment  # noqa: E402
from leanrl.errors import ConfigError, PolicyError  # noqa: E402
from leanrl.harness import Harness  # noqa: E402
from leanrl.policy import Policy, PolicyConfig, SamplingConfig  # noqa: E402
from leanrl.rollout import Rollout, Turn  # noqa: E402
from leanrl.runtime import Runtime, run_sync  # noqa: E402
from leanrl.task import Task  # noqa: E402
from leanrl.taskset import Taskset  # noqa: E402
from leanrl.train.es.lowrank import lowrank_delta  # noqa: E402
from leanrl.train.es.policy import TorchPolicy, load_model  # noqa: E402
from leanrl.train.es.vllm_lora import (  # noqa: E402
    VLLMLoRAEngine,
    lora_engine_kwargs,
    lora_plan,
    member_adapter,
)

RANK = 2
MEMBERS = [(3, 0.05), (3, -0.05), (7, 0.05), (9, -0.05)]
PROMPTS = ["theorem a : 1 + 1 = 2 := by", "theorem b (x : Nat) : x = x", "simp"]
GREEDY = SamplingConfig(temperature=0.0, max_tokens=10)


def _linear_params(model: Any) -> dict[str, Any]:
    """The decoder's linear layers only (what adapters can carry)."""
    return {
        n: p
        for n, p in model.named_parameters()
        if p.dim() == 2 and "embed" not in n and "lm_head" not in n
    }


def test_adapter_tensors_are_the_members_perturbation(tiny_model_dir: Path) -> None:
    model, _ = load_model(str(tiny_model_dir), "float32", "cpu")
    plan = lora_plan(model, _linear_params(model))
    assert plan.uncovered == () and len(plan.targets) == 7 * model.config.num_hidden_layers
    seed, scale = MEMBERS[3]
    t = member_adapter(seed, scale, plan, RANK, "cpu")
    for name, (path, shape) in plan.targets.items():
        a = t[f"base_model.model.{path}.lora_A.weight"]  # [r, in]
        b = t[f"base_model.model.{path}.lora_B.weight"]  # [out, r]
        assert tuple(a.shape) == (RANK, shape[1]) and tuple(b.shape) == (shape[0], RANK)
        want = scale * lowrank_delta(seed, name, shape, RANK, "cpu")
        torch.testing.assert_close((RANK / RANK) * (b @ a), want)  # lora_alpha / r = 1


def test_embeddings_and_flat_tensors_are_refused(tiny_model_dir: Path) -> None:
    model, _ = load_model(str(tiny_model_dir), "float32", "cpu")
    plan = lora_plan(model, dict(model.named_parameters()))
    assert "model.embed_tokens.weight" in plan.uncovered  # (tied lm_head: the same tensor)
    with pytest.raises(ConfigError, match="linear layers only"):
        plan.check()
    full = lora_plan(model, dict(model.named_parameters()), lowrank_other="full")
    assert any(n.endswith("norm.weight") for n in full.uncovered)


def test_engine_kwargs() -> None:
    assert lora_engine_kwargs(16, 2) == {
        "enable_lora": True,
        "max_loras": 16,
        "max_cpu_loras": 32,
        "max_lora_rank": 8,
    }
    assert lora_engine_kwargs(4, 1)["max_lora_rank"] == 1
    with pytest.raises(ConfigError, match="largest LoRA rank"):
        lora_engine_kwargs(4, 1000)


@dataclass
class _LoRARequest:  # vllm.lora.request.LoRARequest's fields
    lora_name: str
    lora_int_id: int
    lora_path: str


class PeftLLM:
    """STAND-IN for ``vllm.LLM(enable_lora=True)``: ``generate(prompts, params, lora_request=
    [one per prompt])`` decodes each row with its adapter, all rows in one PEFT mixed-adapter
    batch (the adapter folders loaded as vLLM would load them, from their paths)."""

    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(str(model_dir))
        self.base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        self.model: Any = None
        self.calls: list[list[str]] = []

    def get_tokenizer(self) -> Any:
        return self.tok

    def generate(self, prompts: list[str], params: Any, lora_request: Any, use_tqdm: bool) -> Any:
        from peft import PeftModel

        assert len(lora_request) == len(prompts)
        for req in lora_request:
            if self.model is None:
                self.model = PeftModel.from_pretrained(
                    self.base, req.lora_path, adapter_name=req.lora_name
                )
            elif req.lora_name not in self.model.peft_config:
                self.model.load_adapter(req.lora_path, adapter_name=req.lora_name)
        self.model.eval()
        self.calls.append([r.lora_name for r in lora_request])
        self.tok.padding_side = "left"
        enc = self.tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            seq = self.model.generate(
                **enc,
                adapter_names=[r.lora_name for r in lora_request],
                max_new_tokens=params.max_tokens,
                do_sample=False,
                pad_token_id=self.tok.pad_token_id,
                eos_token_id=self.tok.eos_token_id,
            )
        outs = []
        for row, ids in zip(
            seq[:, enc["input_ids"].shape[1] :].tolist(), enc["input_ids"], strict=True
        ):
            toks = []
            finish = "length"
            for t in row:
                if t == self.tok.eos_token_id:
                    finish = "stop"
                    break
                if t != self.tok.pad_token_id:
                    toks.append(t)
            o = types.SimpleNamespace(
                text=self.tok.decode(toks, skip_special_tokens=True),
                token_ids=toks,
                logprobs=None,
                finish_reason=finish,
            )
            outs.append(types.SimpleNamespace(outputs=[o], prompt_token_ids=ids.tolist()))
        return outs


class _GenerateOnly(Harness):
    """Generate, no checking; reward 0."""

    name = "generate-only"

    async def run(
        self,
        tasks: Sequence[Task],
        policy: Policy,
        runtime: Runtime,
        sampling: SamplingConfig,
        taskset: Taskset,
    ) -> list[list[Rollout]]:
        comps = await policy.generate([t.formal_statement for t in tasks], sampling)
        return [
            [Rollout(task_id=t.id, prompt=t.formal_statement, turns=[Turn.from_completion(c[0])])]
            for t, c in zip(tasks, comps, strict=True)
        ]


class GenerateOnlyEnv(Environment):
    def make_harness(self) -> Harness:
        return _GenerateOnly(self.config.harness)


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    vllm = types.ModuleType("vllm")
    vllm.SamplingParams = lambda **kw: types.SimpleNamespace(**kw)  # type: ignore[attr-defined]
    lora = types.ModuleType("vllm.lora")
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = _LoRARequest  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.lora", lora)
    monkeypatch.setitem(sys.modules, "vllm.lora.request", request)


def test_one_call_decodes_each_member_as_materialised(
    tiny_model_dir: Path, tmp_path: Path, fake_vllm: None
) -> None:
    model, tok = load_model(str(tiny_model_dir), "float32", "cpu")
    params = _linear_params(model)
    master = {k: p.detach().clone() for k, p in params.items()}
    policy = TorchPolicy(model, tok, PolicyConfig(model="x"))
    want = []
    for seed, scale in MEMBERS:  # the per-member path: linear weights written
        with torch.no_grad():
            for k, p in params.items():
                p.copy_(master[k] + scale * lowrank_delta(seed, k, tuple(p.shape), RANK, "cpu"))
        want.append([[c.token_ids for c in g] for g in policy.generate_sync(PROMPTS, GREEDY)])
    with torch.no_grad():
        for k, p in params.items():
            p.copy_(master[k])

    llm = PeftLLM(tiny_model_dir)
    plan = lora_plan(model, params)
    engine = VLLMLoRAEngine(
        llm, PolicyConfig(model=str(tiny_model_dir)), plan, RANK, tmp_path / "adapters", "cpu"
    )
    got = engine.generate_members([(m, PROMPTS) for m in MEMBERS], GREEDY)
    assert len(llm.calls) == 1 and len(llm.calls[0]) == len(MEMBERS) * len(PROMPTS)
    assert len(set(llm.calls[0])) == len(MEMBERS)  # one adapter per member
    assert [[[c.token_ids for c in g] for g in out] for out in got] == want
    assert len({str(w) for w in want}) >= 3  # members really differ
    folder = Path(engine.adapter(*MEMBERS[0]).lora_path)
    engine.forget(MEMBERS[0][0])  # both twins of seed 3
    assert not folder.exists() and all(k[0] != 3 for k in engine._adapters)


def test_pipelined_scorer_batches_members_through_adapters(
    tiny_model_dir: Path, tmp_path: Path, fake_vllm: None
) -> None:
    from test_es_pipeline import _state

    from leanrl.train.es.pipeline import PipelinedScorer
    from leanrl.train.es.workers import IterationState, Member

    model, _ = load_model(str(tiny_model_dir), "float32", "cpu")
    plan = lora_plan(model, _linear_params(model))
    llm = PeftLLM(tiny_model_dir)
    engine = VLLMLoRAEngine(
        llm, PolicyConfig(model=str(tiny_model_dir)), plan, RANK, tmp_path / "a", "cpu"
    )
    members = [Member(5, 1), Member(5, -1), Member(6, 1), Member(6, -1)]
    scorer = PipelinedScorer(GenerateOnlyEnv(), engine, 2, members_per_batch=2)  # type: ignore[arg-type]
    state = _state()
    state = IterationState(1, state.tasks, GREEDY, 0.5, ())
    scores = run_sync(scorer.score(state, members))
    assert len(scores) == 4 and all(s.tokens > 0 for s in scores)
    assert [len(c) for c in llm.calls] == [4, 4]  # 2 members x 2 tasks per call
    assert not list((tmp_path / "a").iterdir())  # adapters dropped once scored
    with pytest.raises(PolicyError, match="outside generate"):
        engine.call_member(5, 0.5, math.sqrt, 4.0)
