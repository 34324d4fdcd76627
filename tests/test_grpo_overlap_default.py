"""``async_generation = "auto"`` (issue 23): which mode a run resolves to, and why; that the
default on ``hf`` is exactly the synchronous run; and that old run folders resume as they ran."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from leanrl.errors import ConfigError
from leanrl.policy import PolicyConfig
from leanrl.train.grpo import GRPOConfig, GRPOTrainer
from leanrl.train.grpo.config import resolve_async_generation, torchrun_ranks
from leanrl.train.vllm_server import VLLMServerConfig
from tests.test_grpo_trainer import DigitEnv, _config

_SERVER: dict[str, Any] = dict(
    policy=PolicyConfig(backend="openai", base_url="http://127.0.0.1:8000/v1"),
    vllm_server=VLLMServerConfig(transport="gloo"),
)
_VLLM: dict[str, Any] = dict(policy=PolicyConfig(backend="vllm"))


@pytest.mark.parametrize(
    ("kw", "ranks", "stored", "on", "why"),
    [
        ({}, None, None, False, "hf: generation shares the trainer's device"),
        (_VLLM, None, None, True, "vllm: the engine holds its own copy"),
        (_SERVER, None, None, True, "vllm server: the engine is separate"),
        ({**_SERVER, "old_logprobs": "recompute"}, None, None, False, "'recompute'"),
        (_SERVER, 2, None, False, "2 rank(s) under torchrun"),
        (_SERVER, 1, None, False, "1 rank(s) under torchrun"),  # torchrun --nproc_per_node 1
        (_SERVER, None, False, False, "run folder ran with async_generation = false"),
        ({}, None, True, True, "run folder ran with async_generation = true"),
        (_SERVER, 2, True, False, "2 rank(s)"),  # auto never fails: off, with the reason
        ({"async_generation": True}, None, None, True, "async_generation = true"),
        ({"async_generation": False, **_SERVER}, None, True, False, "async_generation = false"),
        ({"async_generation": True}, 2, None, True, "async_generation = true"),  # refused later
    ],
)
def test_resolution(
    kw: dict[str, Any], ranks: int | None, stored: bool | None, on: bool, why: str
) -> None:
    cfg = GRPOConfig(**kw)
    choice = resolve_async_generation(cfg, ranks, stored)
    assert choice.on is on
    assert why in choice.reason
    assert choice.line().startswith(f"async generation: {'on' if on else 'off'} (")


def test_the_default_is_auto_and_the_resolved_mode_drives_dual_clip(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert GRPOConfig().async_generation == "auto"
    assert torchrun_ranks() is None
    # "auto" is a truthy string: every reader must use the resolved mode, not the field
    assert GRPOConfig(max_staleness=3).async_mode is False
    assert GRPOConfig(max_staleness=3).dual_clip_c is None
    assert GRPOConfig(max_staleness=3, **_SERVER).dual_clip_c == 3.0
    assert GRPOConfig(max_staleness=3, **_VLLM).async_mode is True
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert torchrun_ranks() == 2
    assert GRPOConfig(max_staleness=3, **_SERVER).dual_clip_c is None  # auto: off on 2 ranks


def test_config_validation_messages() -> None:
    # auto with recompute resolves off instead of refusing
    cfg = GRPOConfig(**_SERVER, old_logprobs="recompute")
    assert cfg.async_mode is False
    with pytest.raises(ValidationError, match="async_generation = true needs old_logprobs"):
        GRPOConfig(async_generation=True, old_logprobs="recompute")
    with pytest.raises(ValidationError, match="async_generation"):
        GRPOConfig(async_generation="sometimes")  # type: ignore[arg-type]
    # the CLI's spellings of the field
    assert GRPOConfig(async_generation="true").async_generation is True  # type: ignore[arg-type]
    assert GRPOConfig(async_generation="auto").async_generation == "auto"


def test_ranks_refuse_only_an_explicit_true(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from leanrl.train.grpo.trainer import _check_ranks

    monkeypatch.setenv("WORLD_SIZE", "2")
    _check_ranks(GRPOConfig(out=tmp_path))  # auto: falls back, no error
    with pytest.raises(ConfigError, match="async_generation with 2 ranks is not supported"):
        _check_ranks(GRPOConfig(async_generation=True, out=tmp_path))


def _rows(cfg: Any) -> list[dict[str, Any]]:
    trainer = GRPOTrainer(cfg, env=DigitEnv())
    trainer.train_sync()
    assert trainer.config.async_generation is False  # resolved, a plain bool from here on
    return trainer.run.metrics()


_SAME = ("step", "reward_mean", "reward_std", "loss", "kl", "entropy", "clip_frac", "adv_mean",
         "tokens", "staleness", "time_wait")  # fmt: skip


def test_auto_on_hf_is_the_synchronous_run_and_old_folders_resume(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kw: dict[str, Any] = dict(steps=3, tasks_per_step=2, group_size=4)
    # an old run folder: written with async_generation = false stored, 2 of 3 steps done
    _rows(_config(tiny_model_dir, tmp_path / "old", async_generation=False, **{**kw, "steps": 2}))
    stored = json.loads((tmp_path / "old" / "config.json").read_text(encoding="utf-8"))
    assert stored["async_generation"] is False
    with caplog.at_level(logging.INFO, logger="leanrl.train.grpo"):
        resumed = _rows(_config(tiny_model_dir, tmp_path / "old", **kw))  # default: auto
    assert "async generation: off (auto: the run folder ran with async_generation = false" in (
        caplog.text
    )
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="leanrl.train.grpo"):
        fresh = _rows(_config(tiny_model_dir, tmp_path / "new", **kw))
    assert "async generation: off (hf: generation shares the trainer's device" in caplog.text
    assert caplog.text.count("async generation:") == 1  # logged once
    stored = json.loads((tmp_path / "new" / "config.json").read_text(encoding="utf-8"))
    assert stored["async_generation"] is False  # the folder records what ran
    assert len(resumed) == len(fresh) == 3
    # a synchronous step is a pure function of (seed, step): the resumed false run and the
    # fresh auto one are the same run
    for a, b in zip(resumed, fresh, strict=True):
        assert {k: a[k] for k in _SAME} == {k: b[k] for k in _SAME}


def test_auto_resuming_a_stored_mode_keeps_it(tmp_path: Path) -> None:
    # a vLLM-server config would resolve on, but the folder holds a synchronous run
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"async_generation": False}), encoding="utf-8")
    (out / "metrics.jsonl").write_text(json.dumps({"step": 1}) + "\n", encoding="utf-8")
    trainer = GRPOTrainer(GRPOConfig(out=out, **_SERVER))
    trainer._resolve_async()
    assert trainer.config.async_generation is False
    # a folder with a config but no run (a failed start) binds nothing: auto decides afresh
    (out / "metrics.jsonl").unlink()
    trainer = GRPOTrainer(GRPOConfig(out=out, **_SERVER))
    trainer._resolve_async()
    assert trainer.config.async_generation is True


@pytest.mark.parametrize(
    ("argv", "want"),
    [
        ([], "auto"),
        (["--async-generation"], True),
        (["--no-async-generation"], False),
        (["--async-generation", "false"], False),
        (["--async-generation", "auto"], "auto"),
    ],
)
def test_the_command_line_spells_it_like_a_bool(argv: list[str], want: object) -> None:
    from leanrl.cli import parse_command
    from leanrl.train.grpo.cli import GRPOCommand

    cmd = parse_command(GRPOCommand, ["--model", "m", *argv])
    assert cmd.to_grpo_config().async_generation == want
