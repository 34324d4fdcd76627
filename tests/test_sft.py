"""SFT: examples in the harness prompt formats (prompt ids exactly as `leanrl eval` tokenizes
them, loss on the proof only), training that lowers the loss on a fixed set, the run folder,
resume, datasets with a proof column, and the command line.

The model is the tiny random toy model (tests/conftest.py); nothing is downloaded.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from leanrl import ConfigError, HarnessConfig, LeanNotFoundError, Task, load_environment
from leanrl.cli import parse_command
from leanrl.environment import EnvironmentConfig
from leanrl.errors import RuntimeUnavailable
from leanrl.policy import PolicyConfig
from leanrl.proofs import ProofStore, kept_from
from leanrl.train.common import RunDir
from leanrl.train.sft.data import (
    IGNORE,
    Pair,
    SFTDataConfig,
    encode_pairs,
    load_pairs,
    prompt_token_ids,
    target_text,
)

TOY = Path(__file__).parent / "fixtures" / "toy_tasks.jsonl"
CORPORA = Path(__file__).parent / "fixtures" / "corpora"
TASK = Task(name="t0", header="", formal_statement="theorem t0 (n : Nat) : n + 0 = 0 + n := by")


def _tok(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@pytest.mark.parametrize("fmt", ["deepseek", "deepseek-cot", "chat", "kimina"])
def test_prompt_ids_are_what_leanrl_eval_feeds_the_model(toy_model_dir: Path, fmt: str) -> None:
    from leanrl.harnesses.whole_proof.prompts import build_prompt
    from leanrl.policies.hf import HFPolicy

    pol = HFPolicy(PolicyConfig(model=str(toy_model_dir)))
    asyncio.run(pol.start())
    prompt = build_prompt(TASK, HarnessConfig(prompt_format=fmt))
    text, has_specials = pol.render(prompt)
    expected = list(pol.tokenizer(text, add_special_tokens=not has_specials).input_ids)
    assert prompt_token_ids(pol.tokenizer, prompt) == expected


def test_answers_in_each_layout() -> None:
    deepseek, chat = HarnessConfig(prompt_format="deepseek"), HarnessConfig(prompt_format="chat")
    assert target_text(Pair(TASK, "\n  simp\n  omega"), deepseek) == "  simp\n  omega\n```"
    assert target_text(Pair(TASK, "omega"), deepseek) == "  omega\n```"
    helper = Pair(TASK, "\n  exact h n", "lemma h (n : Nat) : n + 0 = 0 + n := by omega")
    assert target_text(helper, deepseek) == (
        "\nlemma h (n : Nat) : n + 0 = 0 + n := by omega\n\n"
        "theorem t0 (n : Nat) : n + 0 = 0 + n := by\n  exact h n\n```"
    )
    assert target_text(Pair(TASK, "\n  omega"), chat) == (
        "```lean4\ntheorem t0 (n : Nat) : n + 0 = 0 + n := by\n  omega\n```"
    )
    mine = Pair(TASK, "\n  omega", completion="<think>easy</think>\n  omega\n")
    assert target_text(mine, deepseek, "completion") == "<think>easy</think>\n  omega\n```"
    assert target_text(Pair(TASK, "\n  omega"), deepseek, "completion") == "  omega\n```"


@pytest.mark.parametrize("fmt", ["deepseek", "chat"])
def test_loss_falls_on_the_answer_only(toy_model_dir: Path, fmt: str) -> None:
    tok = _tok(toy_model_dir)
    harness = HarnessConfig(prompt_format=fmt)
    [ex] = encode_pairs([Pair(TASK, "\n  omega")], harness, tok)
    from leanrl.harnesses.whole_proof.prompts import build_prompt

    n_prompt = len(prompt_token_ids(tok, build_prompt(TASK, harness)))
    assert ex["labels"][:n_prompt] == [IGNORE] * n_prompt
    answer = ex["labels"][n_prompt:]
    assert IGNORE not in answer and ex["input_ids"][n_prompt:] == answer
    text = tok.decode(answer, skip_special_tokens=False)
    if fmt == "deepseek":
        assert text == "  omega\n```" + tok.eos_token  # generation ends with EOS
    else:
        assert text.startswith("```lean4\ntheorem t0") and text.endswith("```<|im_end|>\n")
    long = encode_pairs([Pair(TASK, "\n  omega")], harness, tok, max_length=8)
    assert long == []  # too long: left out, never cut


def test_pairs_from_proofs_files_dedup_and_cap(tmp_path: Path) -> None:
    f = tmp_path / "proofs.jsonl"
    store = ProofStore(f)
    store.add([kept_from(TASK, p) for p in ("\n  omega", "\n  simp", "\n  decide")])
    other = Task(name="t1", header="", formal_statement="theorem t1 : True := by")
    store.add([kept_from(other, "\n  trivial")])
    pairs = load_pairs(SFTDataConfig(proofs=[f, f], max_per_task=2))
    assert [(p.task.id, p.proof) for p in pairs] == [
        ("t0", "\n  omega"),
        ("t0", "\n  simp"),
        ("t1", "\n  trivial"),
    ]


def test_a_kept_proof_of_a_restatement_trains_with_its_own_statement(tmp_path: Path) -> None:
    # The checker accepted the proof under the model's own (equivalent) statement, whose
    # hypothesis names the proof uses; the answer must restate it, not the reference.
    restated = "theorem t0 (m : Nat) : (m + 0 = 0 + m) := by"
    f = tmp_path / "proofs.jsonl"
    ProofStore(f).add([kept_from(TASK, "\n  omega", restated_statement=restated)])
    [pair] = load_pairs(SFTDataConfig(proofs=[f]))
    assert pair.statement == restated
    deepseek, chat = HarnessConfig(prompt_format="deepseek"), HarnessConfig(prompt_format="chat")
    assert target_text(pair, deepseek) == f"\n{restated}\n  omega\n```"
    assert target_text(pair, chat) == f"```lean4\n{restated}\n  omega\n```"


def test_pairs_from_a_dataset_proof_column() -> None:
    env = load_environment(
        "leanrl.environments.corpora:DeepSeekProverV1", path=CORPORA / "deepseek_prover_v1.jsonl"
    )
    pairs = load_pairs(SFTDataConfig(from_env=True), env.tasks())
    assert [(p.task.name, p.proof) for p in pairs] == [
        ("induction_12", "\n  simp"),
        ("algebra_77", "\n  ring"),
    ]
    numina = load_environment(
        "leanrl.environments.corpora:NuminaLean", path=CORPORA / "numina_lean.jsonl"
    )
    # whole files: the proof is pulled out of the restated theorem
    got = load_pairs(
        SFTDataConfig(from_env=True, proof_column="formal_ground_truth"), numina.tasks()
    )
    assert [(p.task.name, p.proof.strip()) for p in got] == [("algebra_1", "linarith")]
    both = load_pairs(SFTDataConfig(from_env=True), numina.tasks())  # first column a row has
    assert [(p.task.name, p.proof.strip()) for p in both] == [
        ("algebra_1", "linarith"),
        ("number_theory_2", "decide"),
    ]


def test_a_dataset_proof_of_another_statement_is_left_out() -> None:
    # Extraction passes a differing restatement on for the checker; as training data it would
    # teach a proof of another theorem under this one's statement.
    stmt = "theorem t (n : ℕ) : n + 0 = n := by"
    same = Task(
        name="t", header="", formal_statement=stmt, extra={"formal_proof": f"{stmt}\n  simp"}
    )
    other = Task(
        name="t",
        header="",
        formal_statement=stmt,
        extra={"formal_proof": "theorem t (n : ℕ) : n = n := by\n  rfl"},
    )
    got = load_pairs(SFTDataConfig(from_env=True, proof_column="formal_proof"), [same, other])
    assert [(p.task.extra["formal_proof"], p.proof) for p in got] == [
        (f"{stmt}\n  simp", "\n  simp")
    ]


def _pairs(n: int = 6) -> list[Pair]:
    tasks = load_environment("dataset", path=TOY, split="train").tasks()[:n]
    return [Pair(t, "\n  omega") for t in tasks]


def _config(model: Path, out: Path, **kw: Any) -> Any:
    from leanrl.train.sft import SFTConfig

    base: dict[str, Any] = dict(
        policy=PolicyConfig(model=str(model)),
        env=EnvironmentConfig(id="dataset", taskset={"path": TOY, "split": "train"}),
        out=out,
        epochs=None,
        steps=12,
        batch_size=4,
        micro_batch_size=2,
        lr=3e-3,
        lr_schedule="constant",
        save_every=4,
        seed=0,
    )
    base.update(kw)
    return SFTConfig(**base)


def test_sft_lowers_the_loss_on_a_fixed_set(toy_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from leanrl.train.sft import SFTTrainer, answer_loss

    tok = _tok(toy_model_dir)
    examples = encode_pairs(_pairs(), HarnessConfig(), tok)
    before = answer_loss(
        AutoModelForCausalLM.from_pretrained(toy_model_dir), examples, tok.pad_token_id
    )
    trainer = SFTTrainer(_config(toy_model_dir, tmp_path / "run"), pairs=_pairs())
    rows = trainer.train_sync()
    assert [r["step"] for r in rows] == list(range(1, 13))
    assert all(r["tokens"] > 0 and r["tokens_per_s"] > 0 for r in rows)
    run = trainer.run
    assert [s for s, _ in run.checkpoints()] == [4, 8, 12][-3:]
    after = answer_loss(
        AutoModelForCausalLM.from_pretrained(run.checkpoint_path(12)), examples, tok.pad_token_id
    )
    assert after < 0.5 * before, (before, after)
    assert rows[-1]["loss"] < rows[0]["loss"]
    assert (run.path / "loss_curve.png").read_bytes().startswith(b"\x89PNG")
    assert json.loads((run.path / "config.json").read_text())["lr"] == 3e-3


def test_rerun_resumes_from_the_last_checkpoint(
    toy_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from leanrl.train.sft import SFTTrainer

    straight = SFTTrainer(_config(toy_model_dir, tmp_path / "a", steps=8), pairs=_pairs())
    full = straight.train_sync()
    first = SFTTrainer(_config(toy_model_dir, tmp_path / "b", steps=4), pairs=_pairs())
    first.train_sync()
    more = SFTTrainer(_config(toy_model_dir, tmp_path / "b", steps=8), pairs=_pairs())
    with caplog.at_level(logging.INFO, logger="leanrl"):
        rows = more.train_sync()
    assert f"resuming from {tmp_path / 'b' / 'checkpoint-4'} (step 4)" in caplog.messages
    assert [r["step"] for r in rows] == [5, 6, 7, 8]  # nothing redone
    assert [r["step"] for r in more.run.metrics()] == list(range(1, 9))
    for a, b in zip(full[4:], rows, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)  # same data order and weights


class _Said(logging.Handler):
    """Keeps the messages logged to it."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_a_run_resumed_mid_epoch_ends_bit_exact(toy_model_dir: Path, tmp_path: Path) -> None:
    """Five examples of varied length in micro-batches of 2 with 2 per step: an epoch is 2
    optimizer steps, so checkpoint-3 is in the middle of the second epoch. A run resumed there
    (its later checkpoints gone, as after a kill) ends with exactly the weights of the run that
    never stopped, on the default cosine schedule and length-grouped order; and the resume does
    not report the tied lm_head (not saved: it is the embedding) as missing."""
    import shutil

    import torch
    from safetensors.torch import load_file

    from leanrl.train.sft import SFTTrainer

    tasks = load_environment("dataset", path=TOY, split="train").tasks()[:5]
    pairs = [Pair(t, "\n  omega" + " simp" * (i % 3)) for i, t in enumerate(tasks)]
    kw: dict[str, Any] = dict(steps=9, save_every=3, lr_schedule="cosine", group_by_length=True)
    SFTTrainer(_config(toy_model_dir, tmp_path / "a", **kw), pairs=pairs).train_sync()
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    for step in (6, 9):
        shutil.rmtree(tmp_path / "b" / f"checkpoint-{step}")
    said = _Said()  # transformers' own handler does not propagate to pytest's
    logging.getLogger("transformers").addHandler(said)
    try:
        resumed = SFTTrainer(_config(toy_model_dir, tmp_path / "b", **kw), pairs=pairs)
        rows = resumed.train_sync()
    finally:
        logging.getLogger("transformers").removeHandler(said)
    assert [r["step"] for r in rows] == list(range(4, 10))
    assert not [m for m in said.lines if "lm_head" in m or "missing keys" in m], said.lines
    whole = load_file(tmp_path / "a" / "checkpoint-9" / "model.safetensors")
    split = load_file(tmp_path / "b" / "checkpoint-9" / "model.safetensors")
    assert whole.keys() == split.keys()
    assert all(torch.equal(whole[k], split[k]) for k in whole)  # bit for bit
    losses = [[r["loss"] for r in RunDir(tmp_path / d).metrics()] for d in ("a", "b")]
    assert losses[0] == losses[1]


def test_errors_before_anything_loads(toy_model_dir: Path, tmp_path: Path) -> None:
    from leanrl.train.sft import SFTTrainer

    with pytest.raises(ConfigError, match="no training pairs"):
        SFTTrainer(_config(toy_model_dir, tmp_path / "x")).train_sync()
    tactic = _config(toy_model_dir, tmp_path / "y", env={"harness": {"name": "tactic-loop"}})
    with pytest.raises(ConfigError, match="tactic-loop harness prompts for tactics"):
        SFTTrainer(tactic, pairs=_pairs()).check()
    with pytest.raises(ValueError, match="not a multiple of micro_batch_size"):
        _config(toy_model_dir, tmp_path / "z", batch_size=5)
    # a budget would be ignored (SFT generates no tokens): refused, saying what to use instead
    spend = _config(toy_model_dir, tmp_path / "w", budget={"gpu_s": 60})
    with pytest.raises(ConfigError, match=r"SFT does not stop on a budget.*--steps N"):
        SFTTrainer(spend, pairs=_pairs()).check()


def test_steps_given_alone_wins_and_with_epochs_is_refused(
    toy_model_dir: Path, tmp_path: Path
) -> None:
    """`leanrl train sft --steps 3` trains 3 optimizer steps (it used to be ignored for the
    default of 1 epoch); `--epochs` and `--steps` together are refused, naming both; neither
    is one epoch."""
    from leanrl.train.sft import SFTTrainer
    from leanrl.train.sft.cli import SFTCommand

    def cli(*flags: str) -> Any:
        return parse_command(SFTCommand, ["--model", str(toy_model_dir), *flags]).to_sft_config()

    cfg = cli(
        "--steps", "3", "--batch-size", "4", "--micro-batch-size", "2", "--out", str(tmp_path)
    )
    assert (cfg.epochs, cfg.steps) == (None, 3)
    rows = SFTTrainer(cfg, pairs=_pairs(6)).train_sync()  # 6 examples: an epoch is 2 steps
    assert [r["step"] for r in rows] == [1, 2, 3]
    with pytest.raises(ConfigError, match=r"epochs = 2.0 and steps = 3 are both set.*remove one"):
        cli("--epochs", "2", "--steps", "3")
    assert (cli().epochs, cli().steps) == (None, None)  # one pass over the examples
    rows = SFTTrainer(
        cli("--batch-size", "4", "--micro-batch-size", "2", "--out", str(tmp_path / "e")),
        pairs=_pairs(6),
    ).train_sync()
    assert [r["step"] for r in rows] == [1, 2]


@pytest.mark.usefixtures("no_lean")
def test_no_lean_for_the_in_run_eval_fails_before_the_model_loads(
    toy_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SFT itself needs no Lean, its in-run evaluation does: without Lean, the runtime's own
    error comes before the model load (it used to come at the first evaluation)."""
    from leanrl.train.inrun_eval_config import InRunEvalConfig
    from leanrl.train.sft import SFTTrainer

    def load(*a: Any, **kw: Any) -> None:
        raise AssertionError("the model was loaded before Lean was looked for")

    monkeypatch.setattr("leanrl.train.sft.trainer.load_model", load)
    held_out = {"id": "dataset", "taskset": {"path": str(TOY), "split": "test"}}
    cfg = _config(toy_model_dir, tmp_path / "run", eval=InRunEvalConfig(every=2, env=held_out))
    with pytest.raises(LeanNotFoundError, match="leanrl setup"):
        SFTTrainer(cfg, pairs=_pairs()).train_sync()
    # no sandbox, not allowed to run without: the error the runtime's start would give, first
    # (with a REPL command given, so that Lean is found: a missing Lean is reported first)
    held_out["runtime"] = {"options": {"repl_command": ["/bin/true"]}}
    cfg = _config(toy_model_dir, tmp_path / "run", eval=InRunEvalConfig(every=2, env=held_out))
    monkeypatch.setattr("leanrl.runtimes.local.isolation_problem", lambda: "no bwrap (test)")
    monkeypatch.delenv("LEANRL_ALLOW_UNSANDBOXED", raising=False)
    with pytest.raises(RuntimeUnavailable, match="cannot be sandboxed here: no bwrap"):
        SFTTrainer(cfg, pairs=_pairs()).train_sync()


def test_the_default_micro_batch_follows_the_batch_size() -> None:
    """`leanrl train sft --batch-size 2` runs (micro-batches of 2) instead of being refused for
    the default micro-batch of 4; a micro-batch given explicitly must still divide the batch."""
    from leanrl.train.sft import SFTConfig, SFTOptions
    from leanrl.train.sft.cli import SFTCommand

    cfg = parse_command(SFTCommand, ["--model", "m", "--batch-size", "2"]).to_sft_config()
    assert (cfg.batch_size, cfg.micro_batch_size) == (2, 2)
    assert SFTConfig().micro_batch_size == 4  # batch 16
    assert SFTOptions(batch_size=6).micro_batch_size == 3
    assert SFTOptions(batch_size=1).micro_batch_size == 1
    with pytest.raises(ValueError, match="not a multiple of micro_batch_size"):
        SFTOptions(batch_size=2, micro_batch_size=4)


def test_command_line(tmp_path: Path) -> None:
    from leanrl.train.sft.cli import SFTCommand

    cmd = parse_command(
        SFTCommand,
        [
            "--model",
            "./m",
            "--data.proofs",
            '["a.jsonl","b.jsonl"]',
            "--data.max_per_task",
            "2",
            "--env.harness.prompt_format",
            "deepseek-cot",
            "--epochs",
            "2",
            "--eval.every",
            "5",
            "--eval.env.id",
            "minif2f",
        ],
    )
    cfg = cmd.to_sft_config()
    assert cfg.policy.model == "./m" and cfg.epochs == 2.0
    assert [p.name for p in cfg.data.proofs] == ["a.jsonl", "b.jsonl"]
    assert cfg.env.harness.prompt_format == "deepseek-cot"
    assert cfg.eval.every == 5 and cfg.eval.env is not None and cfg.eval.env.id == "minif2f"
