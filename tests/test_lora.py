"""LoRA (peft) for GRPO on the tiny CPU model: it learns, its adapters reload in plain peft, the
merged checkpoint loads in plain transformers and computes what the adapted model computes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from leanrl.errors import ConfigError
from leanrl.policy import PolicyConfig, SamplingConfig
from tests.test_grpo_trainer import DigitEnv

pytest.importorskip("peft", reason="LoRA needs peft (the lora extra)")


@pytest.fixture(scope="module")
def lora_model(own_tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with 5x larger embeddings. Its random embeddings (std 0.02) and frozen
    final norm bound every logit of the tied output head to about ±0.2, so no adapter inside the
    layers can make a token likely; a trained model has no such bound (it is a property of the
    random test model, not of LoRA)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("lora-model")
    model = AutoModelForCausalLM.from_pretrained(own_tiny_model)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(5.0)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(own_tiny_model).save_pretrained(out)
    return out


def _config(model: Path, out: Path, **kw: Any) -> Any:
    from leanrl.train.grpo import GRPOConfig

    base: dict[str, Any] = dict(
        policy=PolicyConfig(model=str(model)),
        sampling=SamplingConfig(max_tokens=16, top_p=1.0, seed=0),
        out=out,
        steps=30,
        tasks_per_step=4,
        group_size=4,
        lr=1e-2,
        weight_decay=0.0,
        micro_batch_size=16,
        save_every=100,
        mask_truncated=False,
        lora={"rank": 8, "save_merged": True},
    )
    base.update(kw)
    return GRPOConfig(**base)


def _ids() -> torch.Tensor:
    return torch.tensor([[5, 17, 33, 2, 9, 41, 7, 12]])


def test_lora_grpo_learns_and_saves_peft_adapters_and_a_merged_model(
    lora_model: Path, tmp_path: Path
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from leanrl.train.grpo import GRPOTrainer

    out = tmp_path / "run"
    trainer = GRPOTrainer(_config(lora_model, out), env=DigitEnv())
    rows = trainer.train_sync()
    rewards = [r["reward_mean"] for r in rows]
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.15, rewards

    ckpt = out / "checkpoint-30"
    files = {p.name for p in ckpt.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "optimizer.pt"} <= files
    assert "model.safetensors" not in files  # adapters only: a few KB, not the model
    info = json.loads((ckpt / "adapter_config.json").read_text())
    assert info["r"] == 8 and info["lora_alpha"] == 16

    # plain peft, nothing from leanrl
    base = AutoModelForCausalLM.from_pretrained(lora_model)
    plain = AutoModelForCausalLM.from_pretrained(lora_model)
    adapted = PeftModel.from_pretrained(base, str(ckpt)).eval()
    with torch.no_grad():
        la = adapted(input_ids=_ids()).logits
        lp = plain.eval()(input_ids=_ids()).logits
    assert float((la - lp).abs().max()) > 1e-3  # the adapters changed the model
    # the merged folder is a plain transformers model computing the same
    merged = AutoModelForCausalLM.from_pretrained(ckpt / "merged").eval()
    with torch.no_grad():
        lm = merged(input_ids=_ids()).logits
    assert torch.allclose(lm, la, atol=1e-5), float((lm - la).abs().max())

    from leanrl.train.lora import merge_checkpoint

    again = merge_checkpoint(ckpt, tmp_path / "merged-after")
    with torch.no_grad():
        l2 = AutoModelForCausalLM.from_pretrained(again).eval()(input_ids=_ids()).logits
    assert torch.allclose(l2, la, atol=1e-3)


def test_lora_resume_is_exact(lora_model: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from leanrl.train.grpo import GRPOTrainer

    whole, split = tmp_path / "whole", tmp_path / "split"
    kw = {"steps": 4, "save_every": 2, "lora": {"rank": 4}, "beta": 0.05}
    GRPOTrainer(_config(lora_model, whole, **kw), env=DigitEnv()).train_sync()
    GRPOTrainer(_config(lora_model, split, **{**kw, "steps": 2}), env=DigitEnv()).train_sync()
    rows = GRPOTrainer(_config(lora_model, split, **kw), env=DigitEnv()).train_sync()
    assert [r["step"] for r in rows] == [3, 4]
    assert rows[-1]["kl"] is not None and rows[-1]["kl"] > 0  # reference = adapters off
    a = load_file(str(whole / "checkpoint-4" / "adapter_model.safetensors"))
    b = load_file(str(split / "checkpoint-4" / "adapter_model.safetensors"))
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_merge_stream_matches_peft_merge(lora_model: Path) -> None:
    from transformers import AutoModelForCausalLM

    from leanrl.train.lora import LoRAConfig, apply_lora, merge_stream

    cfg = LoRAConfig(rank=4, alpha=8, target_modules=["q_proj", "down_proj"])
    model = apply_lora(AutoModelForCausalLM.from_pretrained(lora_model), cfg, seed=1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_()  # B starts at zero; make the merge non-trivial
    streamed = dict(merge_stream(model.named_parameters(), cfg.scale))
    import copy

    want = copy.deepcopy(model).merge_and_unload()
    ref = dict(want.named_parameters())
    assert set(streamed) == set(ref)
    assert all(torch.allclose(streamed[k], ref[k], atol=1e-6) for k in ref)


def test_lora_config_errors(lora_model: Path) -> None:
    from pydantic import ValidationError
    from transformers import AutoModelForCausalLM

    from leanrl.train.lora import LoRAConfig, apply_lora

    with pytest.raises(ValidationError, match="target_modules is empty"):
        LoRAConfig(rank=4, target_modules=[])
    model = AutoModelForCausalLM.from_pretrained(lora_model)
    with pytest.raises(ConfigError, match=r"lora\.target_modules"):
        apply_lora(model, LoRAConfig(rank=4, target_modules=["no_such_proj"]), seed=0)


# -- SFT ------------------------------------------------------------------------------------------

TOY = Path(__file__).parent / "fixtures" / "toy_tasks.jsonl"


def _sft_config(model: Path, out: Path, **kw: Any) -> Any:
    from leanrl.environment import EnvironmentConfig
    from leanrl.train.sft import SFTConfig

    base: dict[str, Any] = dict(
        policy=PolicyConfig(model=str(model)),
        env=EnvironmentConfig(id="dataset", taskset={"path": TOY, "split": "train"}),
        out=out,
        epochs=None,
        steps=12,
        batch_size=4,
        micro_batch_size=2,
        lr=1e-2,
        lr_schedule="constant",
        save_every=6,
        seed=0,
        lora={"rank": 8, "save_merged": True},
    )
    base.update(kw)
    return SFTConfig(**base)


def _sft_pairs() -> list[Any]:
    from leanrl import load_environment
    from leanrl.train.sft.data import Pair

    tasks = load_environment("dataset", path=TOY, split="train").tasks()[:6]
    return [Pair(t, "\n  omega") for t in tasks]


def test_lora_sft_learns_and_saves_peft_adapters_and_a_merged_model(
    lora_model: Path, tmp_path: Path
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from leanrl.harness import HarnessConfig
    from leanrl.train.sft import SFTTrainer, answer_loss
    from leanrl.train.sft.data import encode_pairs

    tok = AutoTokenizer.from_pretrained(lora_model)
    examples = encode_pairs(_sft_pairs(), HarnessConfig(), tok)
    before = answer_loss(AutoModelForCausalLM.from_pretrained(lora_model), examples, 0)
    trainer = SFTTrainer(_sft_config(lora_model, tmp_path / "run"), pairs=_sft_pairs())
    rows = trainer.train_sync()
    assert [r["step"] for r in rows] == list(range(1, 13))

    ckpt = tmp_path / "run" / "checkpoint-12"
    files = {p.name for p in ckpt.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "merged"} <= files
    assert "model.safetensors" not in files  # adapters only
    assert json.loads((ckpt / "adapter_config.json").read_text())["r"] == 8
    # plain peft, nothing from leanrl: the reloaded adapters learned the answers
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(lora_model), ckpt)
    after = answer_loss(adapted, examples, 0)
    assert after < 0.5 * before, (before, after)
    # the base weights did not move: all of it is in the adapters
    plain = AutoModelForCausalLM.from_pretrained(lora_model)
    with torch.no_grad():
        la = adapted.eval()(input_ids=_ids()).logits
        lp = plain.eval()(input_ids=_ids()).logits
        lm = AutoModelForCausalLM.from_pretrained(ckpt / "merged").eval()(input_ids=_ids()).logits
        # transformers' own peft integration (what `leanrl eval --model checkpoint-N` loads)
        lt = AutoModelForCausalLM.from_pretrained(ckpt).eval()(input_ids=_ids()).logits
    assert float((la - lp).abs().max()) > 1e-3
    assert torch.allclose(lm, la, atol=1e-5), float((lm - la).abs().max())
    assert torch.allclose(lt, la, atol=1e-5), float((lt - la).abs().max())


def test_lora_sft_resumes_from_its_adapters(lora_model: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from leanrl.train.sft import SFTTrainer

    cfg = {"steps": 4, "save_every": 2, "lora": {"rank": 4}}
    SFTTrainer(_sft_config(lora_model, tmp_path / "a", **cfg), pairs=_sft_pairs()).train_sync()
    half = {**cfg, "steps": 2}
    SFTTrainer(_sft_config(lora_model, tmp_path / "b", **half), pairs=_sft_pairs()).train_sync()
    rows = SFTTrainer(
        _sft_config(lora_model, tmp_path / "b", **cfg), pairs=_sft_pairs()
    ).train_sync()
    assert [r["step"] for r in rows] == [3, 4]
    a = load_file(str(tmp_path / "a" / "checkpoint-4" / "adapter_model.safetensors"))
    b = load_file(str(tmp_path / "b" / "checkpoint-4" / "adapter_model.safetensors"))
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_lora_on_the_sft_command_line(tmp_path: Path) -> None:
    from leanrl.cli import parse_command
    from leanrl.train.sft.cli import SFTCommand
    from leanrl.train.sft.expert_iteration_cli import ExpertIterationCommand

    cfg = parse_command(SFTCommand, ["--model", "m", "--lora.rank", "16"]).to_sft_config()
    assert cfg.lora.rank == 16 and cfg.lora.lora_alpha == 32
    ei = parse_command(ExpertIterationCommand, ["--model", "m", "--lora.rank", "4"])
    assert ei.to_config().lora.rank == 4


def test_a_lora_checkpoint_is_evaluable_by_its_folder(
    lora_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """`leanrl eval --model RUN/checkpoint-N` works for a LoRA run, as the trainer promises: the
    adapters are merged into the recorded base model once, into `checkpoint-N/merged/`, and every
    backend loads that like any model folder."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from leanrl.cli import main
    from leanrl.errors import PolicyError
    from leanrl.policies._common import resolve_model
    from leanrl.train.grpo import GRPOTrainer

    out = tmp_path / "run"
    cfg = _config(lora_model, out, steps=2, save_every=2, lora={"rank": 4, "alpha": 64})
    GRPOTrainer(cfg, env=DigitEnv()).train_sync()
    ckpt = out / "checkpoint-2"
    assert not (ckpt / "merged").exists() and not (ckpt / "config.json").exists()
    with torch.no_grad():  # a large alpha, so that the merge visibly changes the model
        for p in (ckpt / "adapter_model.safetensors",):
            from safetensors.torch import load_file, save_file

            w = load_file(str(p))
            save_file({k: v + 0.05 if "lora_B" in k else v for k, v in w.items()}, str(p))
    from leanrl.train.common import write_checksums

    write_checksums(ckpt)  # an edit made on purpose: eval refuses files that differ from the list

    folder = resolve_model(str(ckpt))
    assert Path(folder) == ckpt / "merged"
    assert "merging them" in capsys.readouterr().err
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(lora_model), ckpt)
    merged = AutoModelForCausalLM.from_pretrained(folder).eval()
    plain = AutoModelForCausalLM.from_pretrained(lora_model).eval()
    with torch.no_grad():
        la, lm, lp = (m.eval()(input_ids=_ids()).logits for m in (adapted, merged, plain))
    assert float((la - lp).abs().max()) > 1e-3
    # fp32 merge of large adapters: rounding of W + scale·B·A, not a wrong merge
    assert torch.allclose(lm, la, atol=1e-3), float((lm - la).abs().max())
    stamp = (ckpt / "merged" / "config.json").stat().st_mtime_ns
    assert resolve_model(str(ckpt)) == folder  # made once, then reused
    assert (ckpt / "merged" / "config.json").stat().st_mtime_ns == stamp
    assert "merging" not in capsys.readouterr().err

    # the whole command, on an environment that needs no Lean
    rc = main(
        [
            "eval", "--env", "countdown", "--model", str(ckpt), "--samples", "1",
            "--env.taskset.limit", "2", "--sampling.max-tokens", "4",
            "--out", str(tmp_path / "ev"), "--no-progress",
        ]
    )  # fmt: skip
    assert rc == 0
    summary = json.loads((tmp_path / "ev" / "summary.json").read_text())
    assert summary["results"]["pass_at_k"]["all"]["tasks"] == 2

    # a checkpoint whose recorded base has moved: a clear error, and a way to point at it
    moved = tmp_path / "moved"
    moved.mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (moved / name).write_bytes((ckpt / name).read_bytes())
    info = json.loads((moved / "adapter_config.json").read_text())
    info["base_model_name_or_path"] = str(tmp_path / "gone")
    (moved / "adapter_config.json").write_text(json.dumps(info))
    with pytest.raises(PolicyError, match="LEANRL_LORA_BASE"):
        resolve_model(str(moved))
    monkeypatch.setenv("LEANRL_LORA_BASE", str(lora_model))
    # a read-only checkpoint folder: the merge goes to leanrl's cache instead
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    import os

    real_access = os.access
    monkeypatch.setattr(  # root may write anywhere: say the folder is read-only the other way
        os, "access", lambda p, mode: False if Path(p) == moved else real_access(p, mode)
    )
    moved.chmod(0o555)
    try:
        again = Path(resolve_model(str(moved)))
    finally:
        moved.chmod(0o755)
    assert not (moved / "merged").exists()
    assert (tmp_path / "cache" / "leanrl" / "merged") in again.parents
    with torch.no_grad():
        l2 = AutoModelForCausalLM.from_pretrained(again).eval()(input_ids=_ids()).logits
    assert torch.allclose(l2, la, atol=1e-3)
