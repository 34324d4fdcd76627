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

With ``turns = "all"`` a pair whose verified episode had several turns (``self-correction``'s
revisions, ``tactic-loop``'s tactic steps) is trained as the whole episode instead, read from the
``results.jsonl`` beside its ``proofs.jsonl`` (:func:`episodes_from_results`) and laid out by
the harness (:meth:`leanrl.Harness.sft_episode`). :func:`encode_episode` tokenizes it the way
the harnesses' token-id context grows (:mod:`leanrl.harnesses.tactic_loop.context`): the first
prompt as ``leanrl eval`` tokenizes it, then per turn the model's tokens (its text, the stop
string or end-of-turn token that ended it) and the feedback's, so the prefix before each turn is
what the model conditioned on there. The target turns' tokens carry loss; everything else is
context (labels ``-100``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from leanrl.harness import Harness, HarnessConfig, SFTEpisode
from leanrl.policy import Completion, Prompt
from leanrl.proofs import PROOFS_FILE, Pair, proof_digest, read_proofs
from leanrl.rollout import Rollout
from leanrl.task import Task
from leanrl.train.prompt_ids import as_messages, is_chat, prompt_token_ids

__all__ = [
    "IGNORE",
    "Pair",
    "SFTDataConfig",
    "collate",
    "encode_episode",
    "encode_pairs",
    "episodes_from_results",
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
    turns: Literal["first", "all"] = "first"
    """What is trained of a multi-turn episode. ``first``: the first turn only, in the
    whole-proof layout (``Harness.sft_example``). ``all``: a proof whose verified episode had
    several turns (``self-correction`` revisions, ``tactic-loop`` steps; found in the
    ``results.jsonl`` beside its ``proofs.jsonl``) is trained as the whole conversation,
    token-exact with what the model saw at each turn, with loss on the turns the harness marks
    as targets (``Harness.sft_episode``: the accepted revision, as Goedel-Prover-V2 trains
    self-correction; every tactic step Lean applied). Needed for the ``tactic-loop`` harness."""
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
    episodes: Mapping[tuple[str, str], Rollout] | None = None,
) -> list[dict[str, list[int]]]:
    """Examples ``{"input_ids", "labels"}`` (labels ``IGNORE`` on the prompt); pairs longer
    than ``max_length`` tokens are left out (with a warning). ``harness``: the environment's
    harness (``env.harness``), whose own layout is used when it has one; a bare config means
    the ``whole-proof`` layout. ``episodes`` (``turns = "all"``): verified episodes by (task id,
    :func:`~leanrl.proofs.proof_digest`); a pair with one the harness lays out as a
    conversation (:meth:`~leanrl.Harness.sft_episode`) is trained as that whole episode."""
    from leanrl.harnesses.whole_proof.prompts import build_prompt

    config = harness.config if isinstance(harness, Harness) else harness
    out: list[dict[str, list[int]]] = []
    too_long = whole = untrainable = 0
    for pair in pairs:
        episode = _episode_of(pair, harness, episodes)
        if episode is not None:
            example = encode_episode(episode, tokenizer, chat)
            if len(example["input_ids"]) > max_length:
                too_long += 1
            elif all(label == IGNORE for label in example["labels"]):
                untrainable += 1  # no target turn: nothing to learn from it
            else:
                out.append(example)
                whole += 1
            continue
        if episodes is not None and isinstance(harness, Harness) and harness.needs_tactic_sessions:
            # a tactic harness has no whole-proof layout to fall back on
            untrainable += 1
            continue
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
    if episodes is not None:
        log.info("%d of %d examples are whole multi-turn episodes", whole, len(out))
    if untrainable:
        log.warning(
            "%d of %d pairs were left out: no multi-turn episode with a target turn was found "
            "for them (turns = 'all' reads the results.jsonl beside each proofs.jsonl)",
            untrainable,
            len(pairs),
        )
    if too_long:
        log.warning(
            "%d of %d examples are longer than max_length = %d tokens and were left out",
            too_long,
            len(pairs),
            max_length,
        )
    return out


# -- whole episodes (turns = "all") -----------------------------------------------------------------


def episodes_from_results(paths: Iterable[Path]) -> dict[tuple[str, str], Rollout]:
    """The verified multi-turn episodes of ``leanrl eval`` runs, by (task id, proof digest):
    each path is a ``results.jsonl`` or the ``proofs.jsonl`` beside one (a missing file gives
    nothing). An episode with a text stored cut (``text_cut``) is left out: training on it
    would train on a cut text. The first episode of each proof is kept."""
    from leanrl.eval.store import read_results
    from leanrl.rollout import Turn
    from leanrl.verdict import Verdict

    out: dict[tuple[str, str], Rollout] = {}
    for path in paths:
        path = Path(path).expanduser()
        results = path.with_name("results.jsonl") if path.name == PROOFS_FILE else path
        if not results.is_file():
            continue
        for rec in read_results(results):
            turns = rec.get("turns")
            if not rec.get("accepted") or not turns or rec.get("text_cut"):
                continue
            if rec.get("proof") is None or rec.get("prompt") is None:
                continue
            key = (str(rec["task_id"]), proof_digest(rec["proof"], rec.get("preamble") or ""))
            if key in out:
                continue
            out[key] = Rollout(
                task_id=key[0],
                sample=int(rec.get("sample", 0)),
                prompt=rec["prompt"],
                turns=[
                    Turn(
                        completion=t["completion"] or "",
                        feedback=t.get("feedback") or "",
                        finish_reason=t.get("finish_reason"),
                    )
                    for t in turns
                ],
                proof=rec["proof"],
                preamble=rec.get("preamble") or "",
                verdict=Verdict.model_validate(rec["verdict"]) if rec.get("verdict") else None,
                meta=dict(rec.get("meta") or {}),
            )
    return out


def _episode_of(
    pair: Pair,
    harness: Harness | HarnessConfig,
    episodes: Mapping[tuple[str, str], Rollout] | None,
) -> SFTEpisode | None:
    """The harness's whole-episode layout of ``pair``'s verified episode, when it has both."""
    if episodes is None or not isinstance(harness, Harness):
        return None
    rollout = episodes.get((pair.task.id, proof_digest(pair.proof, pair.preamble)))
    return harness.sft_episode(rollout) if rollout is not None else None


class _Tokenizing:
    """What :func:`~leanrl.harnesses.tactic_loop.context.feedback_ids` needs of a policy: its
    tokenizer, and ``tokenize`` as the ``hf`` policy does it (no special tokens added)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)


def encode_episode(
    episode: SFTEpisode, tokenizer: Any, chat: bool | None = None
) -> dict[str, list[int]]:
    """One example ``{"input_ids", "labels"}`` of a whole episode: the first prompt's ids,
    then per turn the model's ids (labels: themselves on a target turn, ``IGNORE`` on a
    context turn) and the feedback's ids (``IGNORE``), as the harnesses' id context holds them
    (see the module doc). The last turn ends as a one-turn answer does (EOS after a completion
    prompt's stop string; the chat template's end of the assistant turn)."""
    from leanrl.harnesses.tactic_loop.context import _chat_separator, _special_ids, feedback_ids

    prompt = episode.prompt
    use_chat = is_chat(prompt, chat)
    shim: Any = _Tokenizing(tokenizer)
    ids = prompt_token_ids(tokenizer, prompt, chat)
    labels = [IGNORE] * len(ids)
    end_of_turn: list[int] = []
    if use_chat:
        sep = shim.tokenize(_chat_separator(tokenizer, "."))
        if sep and sep[0] in _special_ids(tokenizer):
            end_of_turn = sep[:1]  # the token a chat model ends its turn with
    last = len(episode.turns) - 1
    for k, turn in enumerate(episode.turns):
        end = "" if use_chat or turn.end is None else turn.end
        if k == last and turn.end is not None:
            model = _answer_ids(tokenizer, prompt, turn.completion + end, chat)
        else:
            model = shim.tokenize(turn.completion + end)
            if use_chat and turn.end is not None:
                model += end_of_turn
        ids += model
        labels += model if turn.train else [IGNORE] * len(model)
        if k == last or not turn.feedback:
            continue
        c = Completion(text=turn.completion, token_ids=tuple(model))
        fb = feedback_ids(shim, c, turn.feedback, use_chat)
        ids += fb
        labels += [IGNORE] * len(fb)
    return {"input_ids": ids, "labels": labels}


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
