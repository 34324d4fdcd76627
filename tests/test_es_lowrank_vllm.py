"""Low-rank ES scored by the vLLM scorer through multi-LoRA, on a machine without vLLM.

vLLM is replaced by a stand-in (:class:`StandInLLM`): ``generate`` decodes every prompt with its
``LoRARequest``'s adapter in one PEFT mixed-adapter batch (the folders loaded from their paths,
as vLLM loads them, cached by ``lora_int_id``), and ``collective_rpc`` calls the real
:class:`~leanrl.train.es.vllm_scorer.ESLowRankWorkerExtension` mixed into one "worker" whose
model is the very model PEFT decodes with, its ``load_weights`` as strict as vLLM's (PEFT wraps
the adapted layers under ``base_layer``, as vLLM's LoRA manager does). Checked against the
in-process low-rank path with ``lowrank_targets = "linear"`` (fp32): the same member rewards,
the same fp32 master bit for bit after an update, the same run end to end; plus the config's
and the history header's handling of the new setting."""

from __future__ import annotations

import importlib
import json
import shutil
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from pydantic import ValidationError  # noqa: E402
from test_es_learning import NoLeanRuntime, ToyTaskset, toy_config  # noqa: E402
from test_es_population_vllm import PeftLLM, _LoRARequest  # noqa: E402

from leanrl.environment import Environment, EnvironmentConfig  # noqa: E402
from leanrl.errors import ConfigError  # noqa: E402
from leanrl.harness import Harness, HarnessConfig  # noqa: E402
from leanrl.policy import Policy, PolicyConfig, SamplingConfig  # noqa: E402
from leanrl.rollout import Rollout, Turn  # noqa: E402
from leanrl.runtime import Runtime, run_sync  # noqa: E402
from leanrl.task import Task  # noqa: E402
from leanrl.taskset import Taskset  # noqa: E402
from leanrl.train.es import ESTrainer  # noqa: E402
from leanrl.train.es.history import (  # noqa: E402
    ESHistory,
    HistoryMeta,
    HistoryRecord,
    WeightsSource,
    master_equal,
    replay,
)
from leanrl.train.es.lowrank import LowRankSpec, linear_weight_names, make_weights  # noqa: E402
from leanrl.train.es.pipeline import inprocess_scorer  # noqa: E402
from leanrl.train.es.policy import TorchPolicy, load_model  # noqa: E402
from leanrl.train.es.trainer import es_coefficients, shape_rewards  # noqa: E402
from leanrl.train.es.vllm_scorer import LowRankVLLMScorer, engine_weight_name  # noqa: E402
from leanrl.train.es.workers import IterationState, Member  # noqa: E402

LINEAR = {"perturbation": "lowrank", "rank": 2, "lowrank_targets": "linear"}
SIGMA = 0.3  # large enough that members decode differently on the tiny model
TEXT_ENV = "test_es_lowrank_vllm:TextEnv"


class TextHarness(Harness):
    """Generates, and rewards a fixed function of the generated token ids (no policy call
    outside ``generate``, which vLLM adapters could not serve)."""

    name = "text-reward"

    async def run(
        self,
        tasks: Sequence[Task],
        policy: Policy,
        runtime: Runtime,
        sampling: SamplingConfig,
        taskset: Taskset,
    ) -> list[list[Rollout]]:
        prompts = [t.formal_statement for t in tasks]
        comps = await policy.generate(prompts, sampling)
        out = []
        for task, prompt, group in zip(tasks, prompts, comps, strict=True):
            rows = []
            for i, c in enumerate(group):
                ids = list(c.token_ids)
                reward = sum((t * 37) % 101 for t in ids) / (101 * max(1, len(ids)))
                rows.append(
                    Rollout(
                        task_id=task.id,
                        sample=i,
                        prompt=prompt,
                        turns=[Turn.from_completion(c)],
                        reward=reward,
                    )
                )
            out.append(rows)
        return out


class TextEnv(Environment):
    name = "es-text"
    taskset_class = ToyTaskset

    def make_harness(self) -> Harness:
        return TextHarness(self.config.harness)

    def make_runtime(self) -> Runtime:
        return NoLeanRuntime(self.config.runtime)


def _env_config() -> EnvironmentConfig:
    return EnvironmentConfig(id=TEXT_ENV, harness=HarnessConfig(name="text-reward"))


def _config(model: Path, out: Path, **kw: Any) -> Any:
    base = {
        "env": _env_config(),
        "sigma": SIGMA,
        "sampling": SamplingConfig(max_tokens=4),
        "population": 4,
        "mirrored": True,
        **LINEAR,
    }
    base.update(kw)
    return toy_config(model, out, **base)


# -- the stand-in ---------------------------------------------------------------------------------


class _Served:
    """What vLLM's ``model_runner.model`` offers the extension: parameters, modules and a strict
    ``load_weights`` (an unknown name is an error, as in vLLM's models)."""

    packed_modules_mapping: ClassVar[dict[str, list[str]]] = {}  # HF layout: nothing fused

    def __init__(self, hf: Any) -> None:
        self.hf = hf
        self.loaded: list[str] = []

    def parameters(self) -> Any:
        return self.hf.parameters()

    def named_modules(self) -> Any:
        return self.hf.named_modules()

    def load_weights(self, weights: Any) -> set[str]:
        params = dict(self.hf.named_parameters())
        done = set()
        with torch.no_grad():
            for name, t in weights:
                if name not in params:
                    raise KeyError(f"no parameter {name!r} in the served model")
                params[name].copy_(t)
                done.add(name)
        self.loaded += sorted(done)
        return done


class StandInLLM(PeftLLM):
    """STAND-IN for ``vllm.LLM(enable_lora=True, worker_extension_cls=...)`` (module docstring)."""

    made: ClassVar[list[StandInLLM]] = []

    def __init__(self, **kw: Any) -> None:
        super().__init__(Path(kw["model"]))
        assert kw["enable_lora"] is True and kw["max_lora_rank"] >= 2
        self.kwargs = kw
        mod, _, cls = kw["worker_extension_cls"].rpartition(".")
        ext = getattr(importlib.import_module(mod), cls)
        self.worker = type("Worker", (ext,), {})()
        self.worker.rank = 0
        self.worker.model_runner = types.SimpleNamespace(model=_Served(self.base))
        self.removed: list[int] = []
        self.resets = 0
        self.llm_engine = types.SimpleNamespace(remove_lora=self.removed.append)
        StandInLLM.made.append(self)

    def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        return [getattr(self.worker, method)(*args)]

    def reset_prefix_cache(self) -> None:
        self.resets += 1

    def generate(self, prompts: list[str], params: Any, lora_request: Any, use_tqdm: bool) -> Any:
        # vLLM serves a cached adapter by id without rereading its folder: names are per id here
        reqs = [
            _LoRARequest(f"id{r.lora_int_id}", r.lora_int_id, r.lora_path) for r in lora_request
        ]
        return super().generate(prompts, params, reqs, use_tqdm)


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    vllm = types.ModuleType("vllm")
    vllm.SamplingParams = lambda **kw: types.SimpleNamespace(**kw)  # type: ignore[attr-defined]
    vllm.LLM = StandInLLM  # type: ignore[attr-defined]
    lora = types.ModuleType("vllm.lora")
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = _LoRARequest  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.lora", lora)
    monkeypatch.setitem(sys.modules, "vllm.lora.request", request)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (80 * 2**30, 80 * 2**30))
    StandInLLM.made.clear()


# -- scorer against the in-process path ----------------------------------------------------------


def _rewards(scores: Sequence[Any]) -> list[list[float]]:
    return [list(s.rewards) for s in scores]


def test_scorer_matches_the_inprocess_lowrank_path(
    tiny_model_dir: Path, tmp_path: Path, fake_vllm: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    cfg = _config(tiny_model_dir, tmp_path / "unused")
    env = TextEnv(_env_config())
    model, tok = load_model(str(tiny_model_dir), "float32", "cpu")
    weights = make_weights(model, lowrank=LowRankSpec.from_config(cfg))
    names = set(weights.lowrank_names())
    assert names == set(linear_weight_names(model)) and "model.embed_tokens.weight" not in names
    local = inprocess_scorer(env, weights, TorchPolicy(model, tok, cfg.policy), cfg)
    batched = inprocess_scorer(
        env, weights, TorchPolicy(model, tok, cfg.policy), cfg.model_copy(
            update={"scorer": cfg.scorer.model_copy(update={"members_per_batch": 3})}
        )
    )  # fmt: skip
    source = WeightsSource(
        str(tiny_model_dir), "float32", "cpu", lowrank=LowRankSpec.from_config(cfg)
    )
    vl = LowRankVLLMScorer(
        env, source, PolicyConfig(model=str(tiny_model_dir)), None, depth=2, members_per_batch=2
    )
    run_sync(vl.start())
    llm = StandInLLM.made[-1]
    assert llm.kwargs["max_loras"] == 2 and llm.kwargs["max_lora_rank"] == 8
    assert llm.kwargs["worker_extension_cls"].endswith("ESLowRankWorkerExtension")
    members = [Member(s, sign) for s in (11, 12, 13) for sign in (1, -1)]
    tasks = tuple(env.tasks()[:2])
    sampling = SamplingConfig(temperature=0.0, max_tokens=4)
    records: list[HistoryRecord] = []
    for it in (1, 2):
        state = IterationState(it, tasks, sampling, SIGMA, tuple(records))
        want = run_sync(local.score(state, members))
        got = run_sync(vl.score(state, members))
        assert _rewards(got) == _rewards(want)
        assert _rewards(run_sync(batched.score(state, members))) == _rewards(want)
        assert len({str(r) for r in _rewards(want)}) >= 3  # members really differ
        assert [len(c) for c in vl.last_calls] == [2, 2, 2]  # two members (adapters) per call
        z = shape_rewards([s.reward for s in want])
        assert z is not None
        coeffs = es_coefficients(members, z, 0.05)
        weights.apply_update(coeffs)  # the trainer's update, in-process
        records.append(HistoryRecord(it, tuple(coeffs)))
        vl.sync(records)  # the engine's, in its worker
        engine = llm.worker.es_master
        assert master_equal(weights.master, engine)  # bit for bit, frozen tensors included
    served = dict(llm.base.named_parameters())
    for n in names:  # the update reached the weights the engine decodes with (LoRA-wrapped)
        live = served[n] if n in served else served[n.replace(".weight", ".base_layer.weight")]
        assert torch.equal(live, weights.master[n]), n
    base, _ = load_model(str(tiny_model_dir), "float32", "cpu")
    emb = "model.embed_tokens.weight"
    assert torch.equal(engine[emb], base.get_parameter(emb))  # embeddings stay frozen
    ids = llm.removed
    assert len(set(ids)) == len(ids) == 2 * len(members)  # fresh ids, every adapter dropped
    assert not list(tmp.iterdir())  # the iterations' adapter folders are gone
    run_sync(vl.close())


def test_engine_weight_name_follows_fused_and_wrapped_modules() -> None:
    packed = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    wrapped = {"model.layers.0.self_attn.qkv_proj", "model.layers.0.mlp.down_proj"}
    q = "model.layers.0.self_attn.q_proj.weight"
    assert (
        engine_weight_name(q, wrapped, packed)
        == "model.layers.0.self_attn.q_proj.base_layer.weight"
    )
    down = "model.layers.0.mlp.down_proj.weight"
    assert (
        engine_weight_name(down, wrapped, packed)
        == "model.layers.0.mlp.down_proj.base_layer.weight"
    )
    for plain in (
        "model.layers.0.mlp.up_proj.weight",
        "model.embed_tokens.weight",
        "lm_head.weight",
    ):
        assert engine_weight_name(plain, wrapped, packed) == plain  # not wrapped: unchanged


# -- the trainer, end to end ----------------------------------------------------------------------


def test_vllm_lowrank_run_equals_the_inprocess_run(
    tiny_model_dir: Path, tmp_path: Path, fake_vllm: None
) -> None:
    local = ESTrainer(_config(tiny_model_dir, tmp_path / "local", steps=2, save_every=1))
    local.train_sync()
    vcfg = _config(
        tiny_model_dir, tmp_path / "vllm", steps=2, save_every=1,
        scorer={"backend": "vllm", "members_per_batch": 4},
    )  # fmt: skip
    remote = ESTrainer(vcfg)
    remote.train_sync()
    a, b = local.run.metrics(), remote.run.metrics()
    assert [r["reward_mean"] for r in a] == [r["reward_mean"] for r in b]
    assert [r["reward_max"] for r in a] == [r["reward_max"] for r in b]
    assert not any(r["skipped"] for r in b)
    hist = ESHistory(remote.run.path / "es_history.bin")
    hist.open(read_only=True)
    assert hist.meta is not None and hist.meta.lowrank == LowRankSpec(2, "frozen", "linear")
    # the engine's master, saved into the checkpoint, is the in-process run's θ bit for bit
    _, _, w = replay(remote.run.path, allow_other_device=True)  # the stand-in drew on CPU
    assert master_equal(local.weights.master, w.master)


# -- config and header --------------------------------------------------------------------------


def test_config_needs_linear_targets_and_frozen_1d_with_vllm() -> None:
    vllm = {"scorer": {"backend": "vllm"}, "policy": {"model": "m", "backend": "vllm"}}
    with pytest.raises(
        ValidationError,
        match=r"needs lowrank_targets = 'linear' and lowrank_other = 'frozen' \(got lowrank_targets = 'all'\)",
    ):
        toy_config(Path("m"), Path("o"), perturbation="lowrank", **vllm)
    with pytest.raises(ValidationError, match=r"\(got lowrank_other = 'full'\)"):
        toy_config(Path("m"), Path("o"), lowrank_other="full", **LINEAR, **vllm)
    toy_config(Path("m"), Path("o"), **LINEAR, **vllm)  # accepted
    with pytest.raises(ValidationError, match=r"lora\.rank > 0 with scorer\.backend = 'vllm'"):
        toy_config(Path("m"), Path("o"), lora={"rank": 4}, **LINEAR, **vllm)  # LoRA-ES: still no
    with pytest.raises(ValidationError, match="lowrank_targets = 'linear' only apply"):
        toy_config(Path("m"), Path("o"), lowrank_targets="linear")
    with pytest.raises(ValidationError, match="members_per_batch = 2 needs"):
        toy_config(
            Path("m"), Path("o"), scorer={"backend": "processes", "members_per_batch": 2}, **LINEAR
        )


def test_header_records_linear_targets_only_when_set(tmp_path: Path) -> None:
    all_ = HistoryMeta(0, "cpu", "float32", LowRankSpec(2)).to_json()
    assert b"lowrank_targets" not in all_  # a run on every 2-D tensor keeps its header bytes
    assert (
        all_
        == json.dumps(
            {
                "device_type": "cpu",
                "dtype": "float32",
                "lowrank_other": "frozen",
                "perturbation": "lowrank",
                "rank": 2,
                "run_seed": 0,
            },
            sort_keys=True,
        ).encode()
    )
    h = ESHistory(tmp_path / "es_history.bin")
    h.open(HistoryMeta(0, "cpu", "float32", LowRankSpec(2, "frozen", "linear")))
    again = ESHistory(tmp_path / "es_history.bin")
    again.open(read_only=True)
    assert again.meta is not None and again.meta.lowrank == LowRankSpec(2, "frozen", "linear")


def test_resume_or_replay_with_other_targets_is_refused(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    ESTrainer(_config(tiny_model_dir, out, steps=1)).train_sync()
    cfg_before = (out / "config.json").read_text()
    tr = ESTrainer(_config(tiny_model_dir, out, steps=2, lowrank_targets="all"))
    with pytest.raises(
        ConfigError,
        match=r"linear layers only\), but this run asks for lowrank \(rank 2, tensors that are not 2-D frozen\):",
    ):
        tr.train_sync()
    assert (out / "config.json").read_text() == cfg_before
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    cfg = json.loads(cfg_before)
    cfg["lowrank_targets"] = "all"
    (copy / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        ConfigError, match=r"config\.json says lowrank \(rank 2, tensors that are not 2-D frozen\)"
    ):
        replay(copy)
    _, _, w = replay(out)  # the header's setting: embeddings frozen
    base, _ = load_model(str(tiny_model_dir), "float32", "cpu")
    assert torch.equal(
        w.master["model.embed_tokens.weight"], base.get_parameter("model.embed_tokens.weight")
    )


def test_engine_arguments_and_direct_use_are_checked(tiny_model_dir: Path) -> None:
    from leanrl.train.es.workers import VLLMScorer

    spec = LowRankSpec(2, "frozen", "linear")
    source = WeightsSource(str(tiny_model_dir), "float32", "cuda", lowrank=spec)
    env = TextEnv(_env_config())
    with pytest.raises(ConfigError, match="draws full-rank noise"):
        VLLMScorer(env, source, PolicyConfig(), None)  # the full-rank scorer: refused
    with pytest.raises(ConfigError, match="lowrank_targets = 'linear'"):
        LowRankVLLMScorer(
            env, WeightsSource("m", "float32", "cuda", lowrank=LowRankSpec(2)), PolicyConfig(), None
        )
    clash = PolicyConfig(options={"max_loras": 3})
    with pytest.raises(ConfigError, match=r"sets \['max_loras'\]"):
        LowRankVLLMScorer(env, source, clash, None, members_per_batch=4).engine_kwargs(0.5)
    kw = LowRankVLLMScorer(env, source, PolicyConfig(), None, members_per_batch=4).engine_kwargs(
        0.5
    )
    assert kw["enable_lora"] is True and kw["max_loras"] == 4 and kw["max_lora_rank"] == 8
    assert kw["enable_prefix_caching"] is False and kw["gpu_memory_utilization"] == 0.5
