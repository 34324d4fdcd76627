"""Hints that send a newcomer the right way: the hub's `hf` command, a GGUF file named as such,
doctor never recommending a `setup` that refuses, a dying sandbox reported with its cause, and
no "no running event loop" traceback in front of the real error."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from leanrl import ConfigError, PolicyError, RuntimeConfig
from leanrl._sandbox_config import PoolConfig
from leanrl.policies._common import resolve_model

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


def test_offline_model_hint_uses_the_hf_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PolicyError) as e:
        resolve_model("someone/not-cached-model")
    assert "hf download someone/not-cached-model --local-dir DIR" in str(e.value)
    assert "huggingface-cli" not in str(e.value)
    from shutil import which

    assert which("hf", path=str(Path(sys.executable).parent)), "huggingface_hub ships `hf`"


def test_a_gguf_file_is_named_as_such(tmp_path: Path) -> None:
    gguf = tmp_path / "model-q4.gguf"
    gguf.write_bytes(b"GGUF\x03\x00")
    with pytest.raises(ConfigError) as e:
        resolve_model(str(gguf))
    msg = str(e.value)
    assert "is a GGUF file" in msg and "does not exist" not in msg
    assert "--backend openai" in msg
    other = tmp_path / "weights.bin"
    other.write_bytes(b"x")
    with pytest.raises(ConfigError, match="is a file; --model takes a model folder"):
        resolve_model(str(other))


def test_doctor_never_recommends_a_setup_that_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from leanrl.cli import main

    with pytest.raises(SystemExit):
        main(["doctor", "--env", "dataset", "--no-smoke",
              "--env.runtime.lean-project", str(tmp_path / "none")])  # fmt: skip
    out = capsys.readouterr().out
    assert "leanrl setup --env dataset" not in out
    assert "LEANRL_LEAN_PROJECT" in out
    # and the command doctor would have suggested does refuse:
    assert main(["setup", "--env", "dataset"]) == 2
    assert "does not say which Lean toolchain" in capsys.readouterr().err


async def test_a_sandbox_that_dies_while_starting_is_reported_with_its_cause() -> None:
    from leanrl.runtimes.modal.local_backend import LocalProcessBackend
    from leanrl.service.client import ServiceClient
    from leanrl.service.pool import PoolUnavailable, WarmPool
    from leanrl.service.sandbox import Sandbox
    from leanrl.service.sandbox_runtime import inner_runtime_args

    async def probe(sb: Sandbox) -> bool:
        async with ServiceClient(sb.url, sb.token) as c:
            return (await c.health(retries=0, timeout_s=2)).status == "ok"

    # The service's runtime fails to start and it exits (its port file, written only once the
    # runtime has started, never appears: the local backend sees the exit itself).
    args = inner_runtime_args(
        RuntimeConfig(), "_echo_runtime:EchoRuntime", {"start_error": "planted: no Lean here"}
    )
    be = LocalProcessBackend(args, pythonpath=[TESTS])
    pool = WarmPool(be, PoolConfig(target_ready=1, max_sandboxes=1, start_timeout_s=900), probe)
    with pytest.raises(PoolUnavailable) as e:
        await pool.start()
    await pool.close()
    msg = str(e.value)
    assert "planted: no Lean here" in msg and "exited with code 2" in msg
    assert "within 900 s" not in msg


def test_run_sync_shows_only_the_real_error(tmp_path: Path) -> None:
    """The README's Python example, as written, without Lean: one traceback, the
    LeanNotFoundError (after it printed the task it picked)."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    code = next(
        b for b in re.findall(r"```python\n(.*?)```", readme, flags=re.S) if "check_sync" in b
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
        timeout=120,
    )  # fmt: skip
    assert out.returncode == 1
    assert out.stdout.startswith("amc12a_2021_p3 leanprover/lean4:")  # the task it names exists
    assert "LeanNotFoundError" in out.stderr
    assert "no running event loop" not in out.stderr
    assert "During handling of the above exception" not in out.stderr


# -- one model check for every command (issue 22, items 2 and 5) -----------------------------------

_MODEL_COMMANDS = [
    ["eval", "--env", "countdown", "--model"],
    ["train", "grpo", "--env", "countdown", "--policy.model"],
    ["train", "es", "--env", "countdown", "--policy.model"],
    ["train", "sft", "--policy.model"],
    ["train", "expert-iteration", "--env", "countdown", "--policy.model"],
    ["compare", "--policy.model"],
]


@pytest.mark.parametrize("argv", _MODEL_COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_every_command_refuses_an_uncached_hub_id_offline_at_once(
    argv: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from leanrl.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    assert main([*argv, "someone/not-cached-model", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "not in the local Hugging Face cache and offline mode is on" in err
    assert "hf download someone/not-cached-model --local-dir DIR" in err
    assert "Traceback" not in err
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


@pytest.mark.parametrize("argv", _MODEL_COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_every_command_takes_a_typo_under_a_local_folder_as_a_path(
    argv: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from leanrl.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "grpo-countdown").mkdir(parents=True)
    assert main([*argv, "runs/grpo-coutndown", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    # A path, not "hf download runs/grpo-coutndown": the folder `runs` is right here.
    assert "model folder runs/grpo-coutndown does not exist" in err
    assert "did you mean runs/grpo-countdown?" in err
    assert "hf download" not in err


def test_a_hub_owner_named_like_a_local_folder_still_uses_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import leanrl.policies._common as common

    monkeypatch.chdir(tmp_path)
    (tmp_path / "Qwen").mkdir()
    monkeypatch.setattr(common, "_cached", lambda repo_id: repo_id == "Qwen/Qwen3-0.6B")
    assert resolve_model("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"


def test_trainers_refuse_an_adapter_folder_with_what_to_pass(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoint-4"
    ckpt.mkdir()
    (ckpt / "adapter_config.json").write_text("{}")
    with pytest.raises(ConfigError, match="holds LoRA adapters, not a full model"):
        resolve_model(str(ckpt), flag="--policy.model", adapters=False)


# -- prompt settings checked before the model loads (issue 22, item 10) ----------------------------


@pytest.fixture
def no_model_load(monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers

    def load(*a: object, **k: object) -> None:
        raise AssertionError("a model was loaded before the prompt settings were checked")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", load)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", load)


@pytest.mark.parametrize("command", [["eval", "--model"], ["train", "grpo", "--policy.model"]])
@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--env.harness.prompt-format", "kimna"], "unknown prompt_format 'kimna' (did you mean 'kimina'?)"),
        (["--env.harness.few-shot", "missing.jsonl"], "few_shot file missing.jsonl does not exist"),
        (["--env.harness.name", "self-correction", "--env.harness.prompt-format", "chatt"], "did you mean 'chat'?"),
        (["--env.harness.name", "tactic-loop", "--env.harness.prompt-format", "goedl"], "did you mean 'goedel'?"),
    ],
)  # fmt: skip
def test_bad_prompt_settings_fail_before_the_model_loads(
    command: list[str],
    flags: list[str],
    said: str,
    tiny_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    no_model_load: None,
) -> None:
    from leanrl.cli import main

    monkeypatch.chdir(tmp_path)
    data = REPO / "tests" / "fixtures" / "data" / "minif2f.jsonl"
    argv = [*command, str(tiny_model_dir), "--env", "minif2f", "--env.taskset.path", str(data)]
    assert main([*argv, *flags, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert said in err, err
    assert "Traceback" not in err


def test_countdown_refuses_a_prompt_format_it_would_ignore(
    tiny_model_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    no_model_load: None,
) -> None:
    from leanrl.cli import main

    argv = ["eval", "--env", "countdown", "--model", str(tiny_model_dir), "--out", str(tmp_path)]
    assert main([*argv, "--env.harness.prompt-format", "chat"]) == 2
    assert "countdown harness writes its own prompt" in capsys.readouterr().err
    assert main([*argv, "--env.harness.options", '{"style": "dirct"}']) == 2
    assert "style must be 'think' or 'direct', got 'dirct'" in capsys.readouterr().err


def test_a_catalogue_model_not_made_yet_says_how_to_make_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEANRL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from leanrl.models import models_root

    for given in ("smollm2", str(models_root() / "smollm2")):
        with pytest.raises((ConfigError, PolicyError), match="leanrl models get smollm2"):
            resolve_model(given)
    with pytest.raises(ConfigError) as e:
        resolve_model(str(tmp_path / "elsewhere" / "smollm2"))  # not the cache: no such hint
    assert "models get" not in str(e.value)
