"""ES inside a vLLM engine (GPU): perturb/restore/update in place via collective_rpc."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def vllm_scorer(tiny_model_dir: Path):  # type: ignore[no-untyped-def]
    pytest.importorskip("vllm", reason="needs vLLM (the vllm extra) and a GPU")
    from test_es_learning import ToyEnv

    from leanrl.environment import EnvironmentConfig
    from leanrl.policy import PolicyConfig
    from leanrl.runtime import run_sync
    from leanrl.train.es.history import WeightsSource
    from leanrl.train.es.workers import VLLMScorer

    source = WeightsSource(str(tiny_model_dir), "float32", "cuda")
    env = ToyEnv(EnvironmentConfig(id="test_es_learning:ToyEnv"))
    scorer = VLLMScorer(env, source, PolicyConfig(gpu_memory_utilization=0.3), None)
    run_sync(scorer.start())
    yield scorer
    run_sync(scorer.close())


def _greedy(scorer, prompts):  # type: ignore[no-untyped-def]
    from vllm import SamplingParams

    outs = scorer.llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def test_engine_perturb_and_exact_restore(vllm_scorer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from safetensors.torch import load_file

    prompts = ["theorem toy_a : True := by", "theorem toy_b : True := by"]
    before = _greedy(vllm_scorer, prompts)
    vllm_scorer.llm.collective_rpc("es_save_master", args=(str(tmp_path / "m0.safetensors"),))
    vllm_scorer.llm.collective_rpc("es_perturb", args=(3, 1.0))  # large: output must change
    vllm_scorer.llm.reset_prefix_cache()
    assert _greedy(vllm_scorer, prompts) != before
    vllm_scorer.llm.collective_rpc("es_restore")
    vllm_scorer.llm.reset_prefix_cache()
    assert _greedy(vllm_scorer, prompts) == before
    vllm_scorer.llm.collective_rpc("es_save_master", args=(str(tmp_path / "m1.safetensors"),))
    m0, m1 = (
        load_file(str(tmp_path / "m0.safetensors")),
        load_file(str(tmp_path / "m1.safetensors")),
    )
    assert all(m0[k].equal(m1[k]) for k in m0)


def test_engine_update_matches_hf_replay_bitwise(
    vllm_scorer, tiny_model_dir: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    from safetensors.torch import load_file

    from leanrl.train.es.history import HistoryRecord, WeightsSource, load_weights

    rec = HistoryRecord(1, ((11, 0.01), (12, -0.02)))
    vllm_scorer.sync([rec])
    vllm_scorer.llm.collective_rpc("es_save_master", args=(str(tmp_path / "m.safetensors"),))
    engine = load_file(str(tmp_path / "m.safetensors"))
    _, _, hf = load_weights(WeightsSource(str(tiny_model_dir), "float32", "cuda"), [rec])
    assert set(engine) == set(hf.master)
    assert all(engine[k].equal(hf.master[k].cpu()) for k in engine)
