"""TRL users: TRL's GRPOConfig field names work where they mean the same, say which leanrl field
to use where they do not, and `from leanrl import GRPOConfig, GRPOTrainer` works."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from leanrl.cli import main


def test_trl_names_with_the_same_meaning_are_accepted() -> None:
    from leanrl import GRPOConfig, GRPOTrainer  # TRL-style import

    cfg = GRPOConfig(
        learning_rate=1e-5, num_generations=8, max_completion_length=512, temperature=0.9,
        epsilon=0.2, epsilon_high=0.3, num_iterations=2, loss_type="dr_grpo", max_steps=7,
        output_dir="runs/x", save_steps=5, save_total_limit=2, report_to="none",
        lr_scheduler_type="cosine", mask_truncated_completions=False, beta=0.04,
        policy={"model": "m"},
    )  # fmt: skip
    assert (cfg.lr, cfg.group_size, cfg.sampling.max_tokens, cfg.sampling.temperature) == (
        1e-5, 8, 512, 0.9,
    )  # fmt: skip
    assert (cfg.eps_low, cfg.eps_high, cfg.ppo_epochs, cfg.loss_agg) == (0.2, 0.3, 2, "dr_grpo")
    assert (cfg.steps, str(cfg.out), cfg.save_every, cfg.keep_checkpoints) == (7, "runs/x", 5, 2)
    assert cfg.log_to == [] and cfg.lr_schedule == "cosine" and cfg.mask_truncated is False
    assert cfg.beta == 0.04
    assert GRPOTrainer.__name__ == "GRPOTrainer"
    assert GRPOConfig(scale_rewards=False).scale_rewards == "none"  # TRL's boolean form


@pytest.mark.parametrize(
    ("trl", "leanrl"),
    [
        ("per_device_train_batch_size", "tasks_per_step"),
        ("gradient_accumulation_steps", "minibatches"),
        ("adam_beta1", "adam_betas"),
        ("bf16", "precision"),
        ("max_prompt_length", "env.harness"),
        ("use_vllm", "policy.backend"),
    ],
)
def test_trl_names_with_another_meaning_name_the_leanrl_field(trl: str, leanrl: str) -> None:
    from leanrl import GRPOConfig

    with pytest.raises(ValidationError) as e:
        GRPOConfig(**{trl: 1})
    msg = str(e.value)
    assert f"'{trl}' is TRL's GRPOConfig field" in msg and leanrl in msg


def test_both_spellings_at_once_is_an_error() -> None:
    from leanrl import GRPOConfig

    with pytest.raises(ValidationError, match=r"both 'learning_rate'.*and 'lr'"):
        GRPOConfig(learning_rate=1e-5, lr=1e-6)


def test_a_toml_file_with_trl_names(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    from pathlib import Path

    from leanrl.config import merge
    from leanrl.train.grpo.cli import GRPOCommand

    toml = Path(str(tmp_path)) / "trl.toml"
    toml.write_text("learning_rate = 2e-6\nnum_generations = 4\ntasks_per_step = 2\n")
    cfg = merge(GRPOCommand, toml, {"model": "m"}).to_grpo_config()
    assert cfg.lr == 2e-6 and cfg.group_size == 4


def test_the_cli_names_leanrls_flag_for_a_trl_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "grpo", "--learning-rate", "1e-5"]) == 2
    err = capsys.readouterr().err
    assert "--learning-rate is TRL's name; leanrl: --lr" in err
    assert main(["train", "grpo", "--per_device_train_batch_size", "8"]) == 2
    assert "tasks_per_step" in capsys.readouterr().err


def test_trl_only_trainers_and_typos_get_a_helpful_message() -> None:
    with pytest.raises(ImportError, match="DPOTrainer is TRL's; leanrl trains"):
        from leanrl import DPOTrainer  # noqa: F401
    from leanrl import SFTTrainer  # leanrl has its own

    assert SFTTrainer.__module__ == "leanrl.train.sft.trainer"
    import leanrl

    with pytest.raises(AttributeError, match=r"Did you mean leanrl\.GRPOTrainer"):
        _ = leanrl.GRPOTrainr  # type: ignore[attr-defined]
