"""DeepSeek-Prover-V1.5's CoT and few-shot prompt formats, exactly as its prover/utils.py lays
them out (checked against the layout, with examples of our own)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from leanrl import ConfigError, HarnessConfig, Task
from leanrl.harnesses.whole_proof.prompts import (
    build_prompt,
    default_stop,
    few_shot_examples,
    is_completion_style,
)
from leanrl.proofs import ProofStore, kept_from

H = "import Mathlib\nimport Aesop\n\nset_option maxHeartbeats 0\n\nopen BigOperators Real Nat Topology Rat\n\n"
TASK = Task(
    name="mathd_algebra_10",
    header=H,
    formal_statement="theorem mathd_algebra_10 (x : ℝ) (h₀ : x + 1 = 3) : x = 2 := by",
    informal_statement="Solve $x + 1 = 3$.",
)


def test_cot_prompt_is_the_cot_instruction_then_the_open_block() -> None:
    prompt = build_prompt(TASK, HarnessConfig(prompt_format="deepseek-cot"))
    assert prompt == (
        "Complete the following Lean 4 code with explanatory comments preceding each line of "
        "code:\n\n```lean4\n" + H + "/-- Solve $x + 1 = 3$.-/\n"
        "theorem mathd_algebra_10 (x : ℝ) (h₀ : x + 1 = 3) : x = 2 := by\n"
    )
    cfg = HarnessConfig(prompt_format="deepseek-cot")
    assert is_completion_style(cfg) and default_stop(cfg) == ["```"]


def _examples(path: Path) -> Path:
    rows = [
        # DeepSeek's own few-shot layout: informal_prefix comment, statement ending ":= by\n"
        {
            "name": "ex_a",
            "informal_prefix": "/-- Show $1 + 1 = 2$.-/\n",
            "formal_statement": "theorem ex_a : (1 : ℕ) + 1 = 2 := by\n",
            "formal_proof": "  /- Compute. -/\n  norm_num",
        },
        {"name": "ex_b", "formal_statement": "theorem ex_b : True := by", "proof": "trivial"},
        {"name": "ex_c", "formal_statement": "theorem ex_c : 2 = 2 := by", "proof": "\n  rfl"},
        # the task itself: never shown as its own example
        {
            "name": "mathd_algebra_10",
            "formal_statement": TASK.formal_statement,
            "proof": "linarith",
        },
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_few_shot_blocks_come_first_in_deepseeks_layout(tmp_path: Path) -> None:
    cfg = HarnessConfig(prompt_format="deepseek", few_shot=_examples(tmp_path / "fs.jsonl"))
    prompt = build_prompt(TASK, cfg)
    blocks = prompt.split("Complete the following Lean 4 code:\n\n```lean4\n")
    assert blocks[0] == "" and len(blocks) == 5  # 3 examples + the task
    assert blocks[-1] == H + "/-- Solve $x + 1 = 3$.-/\n" + TASK.formal_statement + "\n"
    shown = {b.split("theorem ")[1].split(" ")[0]: b for b in blocks[1:-1]}
    assert set(shown) == {"ex_a", "ex_b", "ex_c"}
    assert shown["ex_a"] == (
        H + "/-- Show $1 + 1 = 2$.-/\ntheorem ex_a : (1 : ℕ) + 1 = 2 := by\n"
        "  /- Compute. -/\n  norm_num\n```\n\n\n"
    )
    assert shown["ex_b"].endswith("theorem ex_b : True := by\n  trivial\n```\n\n\n")
    assert shown["ex_c"].endswith("theorem ex_c : 2 = 2 := by\n  rfl\n```\n\n\n")


def test_few_shot_draw_is_fixed_per_task_and_sized(tmp_path: Path) -> None:
    cfg = HarnessConfig(prompt_format="deepseek", few_shot=_examples(tmp_path / "fs.jsonl"))
    two = cfg.model_copy(update={"few_shot_num": 2})
    first = [e.name for e in few_shot_examples(TASK, two)]
    assert len(first) == 2 and first == [e.name for e in few_shot_examples(TASK, two)]
    other = TASK.model_copy(update={"id": "another-id"})
    draws = {
        tuple(e.name for e in few_shot_examples(other.model_copy(update={"id": f"i{i}"}), two))
        for i in range(12)
    }
    assert len(draws) > 1  # different tasks get different examples


def test_a_proofs_file_is_a_few_shot_source(tmp_path: Path) -> None:
    path = tmp_path / "proofs.jsonl"
    other = Task(name="ex_z", header=H, formal_statement="theorem ex_z : 3 = 3 := by")
    ProofStore(path).add([kept_from(other, "\n  rfl", source="eval")])
    cfg = HarnessConfig(prompt_format="deepseek-cot", few_shot=path, few_shot_num=3)
    prompt = build_prompt(TASK, cfg)
    assert prompt.count("```lean4\n") == 2
    assert "theorem ex_z : 3 = 3 := by\n  rfl\n```\n\n\n" in prompt


def test_few_shot_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="deepseek and deepseek-cot formats"):
        build_prompt(TASK, HarnessConfig(prompt_format="chat", few_shot=tmp_path / "x.jsonl"))
    with pytest.raises(ConfigError, match="does not exist"):
        build_prompt(TASK, HarnessConfig(few_shot=tmp_path / "missing.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"name": "x", "formal_statement": "theorem x : True := by"}) + "\n")
    with pytest.raises(ConfigError, match="line 1: not an example"):
        build_prompt(TASK, HarnessConfig(few_shot=bad))
