"""SFT data: (statement, proof) pairs turned into token ids in the harnesses' own prompt formats.

A harness with a layout of its own (``Harness.sft_example``: Countdown's) gives the prompt and
the answer. Otherwise (the Lean harnesses) each example is the prompt the ``whole-proof``
harness would give the task (the configured ``prompt_format``, few-shot examples included when
configured), followed by the answer the harness expects from the model; either way the prompt
is tokenized exactly as ``leanrl eval``'s ``hf`` policy tokenizes it:

- completion formats (``deepseek``, ``deepseek-cot``, completion ``custom``): the proof body,
  continuing the open code block the prompt ends in, the closing fence, then end-of-sequence.
  With helper lemmas, the model restates: lemmas, then the theorem with its proof.
- chat formats: an assistant message holding the complete code (header, helper lemmas, the
  theorem and its proof) in a ```` ```lean4 ```` block, as the chat template renders it.

Only the answer's tokens carry loss (labels ``-100`` on the prompt). Pairs come from
``proofs.jsonl`` files (what every leanrl run keeps) and/or from the rows of a dataset with a
proof column (DeepSeek-Prover-V1's ``formal_proof``, NuminaMath-LEAN's ``formal_ground_truth``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from leanrl.harness import Harness, HarnessConfig
from leanrl.policy import Prompt
from leanrl.proofs import Pair, proof_digest, read_proofs
from leanrl.task import Task
from leanrl.train.prompt_ids import as_messages, is_chat, prompt_token_ids

__all__ = [
    "IGNORE",
    "Pair",
    "SFTDataConfig",
    "collate",
    "encode_pairs",
    "load_pairs",
    "prompt_token_ids",
    "target_text",
]

log = logging.getLogger("leanrl.train.sft")

IGNORE = -100
"""Label of a token that carries no loss (the prompt, the padding)."""

#: Dataset columns that hold a proof, tried in order when ``proof_column`` is unset.
PROOF_COLUMNS = ("formal_proof", "proof", "formal_ground_truth", "full_proof")


class SFTDataConfig(BaseModel):
    """Where SFT pairs come from and how they become examples."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    proofs: list[Path] = Field(default_factory=list)
    """``proofs.jsonl`` files (kept by every leanrl run), or any JSONL with ``name``,
    ``header``, ``formal_statement`` and ``proof`` per line."""
    from_env: bool = False
    """Also take pairs from ``env``'s taskset: every row with a proof in ``proof_column``."""
    proof_column: str | None = None
    """The dataset column holding the proof (default: the first of ``formal_proof``, ``proof``,
    ``formal_ground_truth``, ``full_proof`` that is not empty in a row). A proof may be the tactic block after
    ``:= by`` or a whole Lean file restating the theorem (the proof is pulled out of it)."""
    target: Literal["proof", "completion"] = "proof"
    """The answer trained on: ``proof`` builds it from the proof in the format's layout;
    ``completion`` uses the model's own text kept with the proof (its reasoning included),
    where there is one."""
    max_per_task: int | None = Field(default=None, ge=1)
    """Most distinct proofs per task (the first ones, in file order); None keeps all."""
    max_length: int = Field(default=4096, ge=8)
    """Examples longer than this many tokens (prompt + answer) are left out (never cut: a cut
    proof teaches the model to stop half-way)."""


# -- sources ----------------------------------------------------------------------------------------


def load_pairs(data: SFTDataConfig, env_tasks: Sequence[Task] | None = None) -> list[Pair]:
    """Every pair of the configured sources, deduplicated per task and capped per task."""
    pairs: list[Pair] = []
    for path in data.proofs:
        for row in read_proofs(path):
            pairs.append(
                Pair(row.task(), row.proof, row.preamble, row.completion, row.restated_statement)
            )
    if data.from_env:
        pairs += _pairs_from_tasks(env_tasks or [], data.proof_column)
    out: list[Pair] = []
    seen: dict[str, set[str]] = {}
    for p in pairs:
        digests = seen.setdefault(p.task.id, set())
        digest = proof_digest(p.proof, p.preamble)
        if digest in digests or (data.max_per_task and len(digests) >= data.max_per_task):
            continue
        digests.add(digest)
        out.append(p)
    return out


def _pairs_from_tasks(tasks: Sequence[Task], column: str | None) -> list[Pair]:
    from leanrl.harnesses.whole_proof.extract import extract_proof

    out: list[Pair] = []
    unusable = 0
    for t in tasks:
        names = (column,) if column else PROOF_COLUMNS
        value = next(
            (t.extra[c] for c in names if isinstance(t.extra.get(c), str) and t.extra[c].strip()),
            None,
        )
        if value is None:
            continue
        if _declares(value, t.name):  # a whole file: pull the proof out of it
            ex = extract_proof(f"```lean4\n{value.strip()}\n```", t)
            # A restatement that differs from the reference (`restated_statement`) proves
            # another theorem: not a proof of this task to train on.
            if ex.proof is None or ex.restated_statement:
                unusable += 1
                continue
            out.append(Pair(t, ex.proof, ex.preamble))
        else:
            out.append(Pair(t, value if value.startswith("\n") else "\n" + value.rstrip()))
    if unusable:
        log.warning("%d dataset proofs restate a different theorem and were left out", unusable)
    return out


def _declares(text: str, name: str) -> bool:
    import re

    return re.search(rf"(?m)^\s*(?:theorem|lemma)\s+{re.escape(name)}(?![\w'.])", text) is not None


# -- prompt and answer ------------------------------------------------------------------------------


def _body(proof: str) -> str:
    """The proof as a tactic block starting on the line after ``:= by``."""
    if proof.startswith("\n"):
        return proof.rstrip()
    return "\n" + (proof if proof.startswith((" ", "\t")) else "  " + proof).rstrip()


def target_text(pair: Pair, harness: HarnessConfig, target: str = "proof") -> str:
    """The answer the model is trained to give to the harness's prompt for ``pair.task``."""
    from leanrl.harnesses.whole_proof.prompts import is_completion_style

    completion_style = is_completion_style(harness)
    if target == "completion" and pair.completion.strip():
        return pair.completion + ("```" if completion_style else "")
    task = pair.task
    body = _body(pair.proof)
    statement = (pair.statement or task.formal_statement).rstrip()
    if completion_style:
        if pair.preamble.strip() or pair.statement:
            # Helpers must come first, and a proof of a restatement needs its own statement:
            # the model starts over and restates the theorem.
            pre = f"{pair.preamble.strip()}\n\n" if pair.preamble.strip() else ""
            return f"\n{pre}{statement}{body}\n```"
        return body[1:] + "\n```"
    pre = f"{pair.preamble.strip()}\n\n" if pair.preamble.strip() else ""
    return f"```lean4\n{task.header}{pre}{statement}{body}\n```"


def _answer_ids(tokenizer: Any, prompt: Prompt, answer: str, chat: bool | None) -> list[int]:
    """The answer's ids, ending the way generation ends: EOS for text prompts; the chat
    template's end of the assistant turn for chat prompts."""
    if not is_chat(prompt, chat):
        ids = list(tokenizer(answer, add_special_tokens=False).input_ids)
        eos = tokenizer.eos_token_id
        return ids + ([int(eos)] if eos is not None else [])
    msgs = as_messages(prompt)
    head = str(tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))
    full = str(
        tokenizer.apply_chat_template(
            [*msgs, {"role": "assistant", "content": answer}], tokenize=False
        )
    )
    rest = full[len(head) :] if full.startswith(head) else answer + (tokenizer.eos_token or "")
    return list(tokenizer(rest, add_special_tokens=False).input_ids)


def encode_pairs(
    pairs: Sequence[Pair],
    harness: Harness | HarnessConfig,
    tokenizer: Any,
    *,
    chat: bool | None = None,
    target: str = "proof",
    max_length: int = 4096,
) -> list[dict[str, list[int]]]:
    """Examples ``{"input_ids", "labels"}`` (labels ``IGNORE`` on the prompt); pairs longer
    than ``max_length`` tokens are left out (with a warning). ``harness``: the environment's
    harness (``env.harness``), whose own layout is used when it has one; a bare config means
    the ``whole-proof`` layout."""
    from leanrl.harnesses.whole_proof.prompts import build_prompt

    config = harness.config if isinstance(harness, Harness) else harness
    out: list[dict[str, list[int]]] = []
    too_long = 0
    for pair in pairs:
        own = harness.sft_example(pair, target) if isinstance(harness, Harness) else None
        if own is not None:
            prompt, answer = own
        else:
            prompt, answer = build_prompt(pair.task, config), target_text(pair, config, target)
        p_ids = prompt_token_ids(tokenizer, prompt, chat)
        a_ids = _answer_ids(tokenizer, prompt, answer, chat)
        if len(p_ids) + len(a_ids) > max_length:
            too_long += 1
            continue
        out.append({"input_ids": p_ids + a_ids, "labels": [IGNORE] * len(p_ids) + a_ids})
    if too_long:
        log.warning(
            "%d of %d examples are longer than max_length = %d tokens and were left out",
            too_long,
            len(pairs),
            max_length,
        )
    return out


def collate(features: Sequence[dict[str, list[int]]], pad_id: int) -> dict[str, Any]:
    """A right-padded batch: ``input_ids``, ``attention_mask``, ``labels`` (``IGNORE`` on
    padding). [B, L] each."""
    import torch

    width = max(len(f["input_ids"]) for f in features)
    n = len(features)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    labels = torch.full((n, width), IGNORE, dtype=torch.long)
    for i, f in enumerate(features):
        k = len(f["input_ids"])
        ids[i, :k] = torch.tensor(f["input_ids"], dtype=torch.long)
        attn[i, :k] = 1
        labels[i, :k] = torch.tensor(f["labels"], dtype=torch.long)
    return {"input_ids": ids, "attention_mask": attn, "labels": labels}
