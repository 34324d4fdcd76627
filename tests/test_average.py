"""``leanrl average``: the weighted mean of checkpoints, against a direct mean of the tensors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from leanrl.average import average_checkpoints, normalised_weights
from leanrl.errors import ConfigError


def _perturbed(base: Path, out: Path, seed: int, dtype: Any = None) -> Path:
    """A copy of the tiny model ``base`` with every weight moved by seeded noise."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    return out


def _tensors(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


@pytest.fixture(scope="module")
def three(own_tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("ckpts")
    return [_perturbed(own_tiny_model, root / f"checkpoint-{i}", seed=i) for i in (1, 2, 3)]


def test_the_average_is_the_weighted_mean_and_a_model(three: list[Path], tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = average_checkpoints(three, tmp_path / "avg", [1, 1, 2])
    got = _tensors(out)
    parts = [_tensors(c) for c in three]
    assert set(got) == set(parts[0])
    for key, t in got.items():
        want = 0.25 * parts[0][key].float() + 0.25 * parts[1][key].float()
        want = want + 0.5 * parts[2][key].float()
        assert t.dtype == parts[0][key].dtype
        torch.testing.assert_close(t, want, rtol=1e-6, atol=1e-7)
    assert not torch.equal(got["model.norm.weight"], parts[0]["model.norm.weight"])
    # a Hugging Face model folder: loads, generates, keeps the first checkpoint's tokenizer
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    ids = tok("theorem t1", return_tensors="pt").input_ids
    gen = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
    assert gen.shape[1] == ids.shape[1] + 4
    assert json.loads((out / "averaged.json").read_text())["weights"] == [0.25, 0.25, 0.5]
    assert not list(tmp_path.glob(".tmp-average-*"))  # renamed into place, nothing left over


def test_bf16_checkpoints_are_averaged_in_fp32_and_stay_bf16(
    own_tiny_model: Path, tmp_path: Path
) -> None:
    import torch

    a = _perturbed(own_tiny_model, tmp_path / "a", 4, torch.bfloat16)
    b = _perturbed(own_tiny_model, tmp_path / "b", 5, torch.bfloat16)
    out = average_checkpoints([a, b], tmp_path / "avg")
    ta, tb, got = _tensors(a), _tensors(b), _tensors(out)
    for key, t in got.items():
        assert t.dtype == torch.bfloat16
        want = ((ta[key].float() + tb[key].float()) * 0.5).to(torch.bfloat16)
        assert torch.equal(t, want), key
    as_fp32 = average_checkpoints([a, b], tmp_path / "avg32", dtype="float32")
    assert _tensors(as_fp32)["model.norm.weight"].dtype == torch.float32


def test_a_lora_checkpoint_is_merged_into_its_base_first(
    own_tiny_model: Path, three: list[Path], tmp_path: Path
) -> None:
    import peft
    import torch
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(own_tiny_model)
    lora = peft.get_peft_model(
        base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    )
    with torch.no_grad():  # B is zero when made: give the adapters something to merge
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1, generator=torch.Generator().manual_seed(7))
    adapter = tmp_path / "lora-checkpoint"
    lora.save_pretrained(adapter)
    merged = lora.merge_and_unload().state_dict()
    out = average_checkpoints([adapter, three[0]], tmp_path / "avg")
    got, other = _tensors(out), _tensors(three[0])
    key = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(merged[key], _tensors(own_tiny_model)[key])  # the adapter counted
    for k in (key, "model.norm.weight"):
        torch.testing.assert_close(got[k], 0.5 * merged[k] + 0.5 * other[k], rtol=1e-5, atol=1e-6)
    assert not (out / "adapter_config.json").exists() and (out / "config.json").is_file()


def test_checkpoints_of_different_models_are_refused_by_name(
    three: list[Path], tmp_path: Path
) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    def variant(name: str, **change: int) -> Path:
        config = AutoConfig.from_pretrained(three[0])
        for k, v in change.items():
            setattr(config, k, v)
        AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / name)
        return tmp_path / name

    wider = variant("wider", intermediate_size=256)
    with pytest.raises(
        ConfigError,
        match=r"tensor '.*down_proj.*' is \[64, 128\] in .*checkpoint-1 but \[64, 256\] in .*wider",
    ):
        average_checkpoints([three[0], wider], tmp_path / "avg")
    deeper = variant("deeper", num_hidden_layers=3)
    with pytest.raises(ConfigError, match=r"deeper has tensor 'model\.layers\.2\..*which"):
        average_checkpoints([three[0], deeper], tmp_path / "avg")
    assert not (tmp_path / "avg").exists() and not list(tmp_path.glob(".tmp-average-*"))


def test_bad_weights_and_outputs_are_refused(three: list[Path], tmp_path: Path) -> None:
    assert normalised_weights(None, 4) == [0.25] * 4
    with pytest.raises(ConfigError, match="2 weights for 3 checkpoints"):
        average_checkpoints(three, tmp_path / "a", [1, 2])
    with pytest.raises(ConfigError, match=r"weight -1\.0 is not a positive number"):
        average_checkpoints(three, tmp_path / "a", [1, -1, 2])
    with pytest.raises(ConfigError, match="weight nan"):
        normalised_weights([float("nan"), 1.0], 2)
    with pytest.raises(ConfigError, match="averaging needs two or more"):
        average_checkpoints(three[:1], tmp_path / "a")
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("keep me")
    with pytest.raises(ConfigError, match="exists and is not an empty folder"):
        average_checkpoints(three[:2], full)
    assert (full / "x").read_text() == "keep me"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (average_checkpoints(three[:2], empty) / "model.safetensors").is_file()
    with pytest.raises(ConfigError, match=r"holds no model\.safetensors"):
        average_checkpoints([three[0], tmp_path / "full"], tmp_path / "b")


def test_the_command_line(three: list[Path], tmp_path: Path) -> None:
    import torch

    from leanrl.cli import main

    out = tmp_path / "avg"
    code = main(["average", str(three[0]), str(three[1]), "--out", str(out), "--weights", "1,3"])
    assert code == 0
    got, a, b = _tensors(out), _tensors(three[0]), _tensors(three[1])
    k = "model.norm.weight"
    torch.testing.assert_close(got[k], 0.25 * a[k] + 0.75 * b[k], rtol=1e-6, atol=1e-7)
    toml = tmp_path / "avg.toml"
    toml.write_text(f'checkpoints = ["{three[0]}", "{three[2]}"]\nout = "{tmp_path / "t"}"\n')
    assert main(["average", "--config", str(toml)]) == 0
    assert (tmp_path / "t" / "config.json").is_file()
    assert main(["average", str(three[0]), str(three[1]), "--out", str(out)]) != 0  # exists
