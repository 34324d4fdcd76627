"""Prompt formats for whole-proof generation.

- ``deepseek``: DeepSeek-Prover-V1.5 completion style (its ``quick_start.py``, the ``non-cot``
  mode of its ``prover/utils.py``). The prompt opens a ```lean4 block with the header, the
  informal statement as a doc comment and the statement, ending in ``:= by`` and a newline; the
  model continues with the indented proof and closes the block (so ``"```"`` is the natural stop
  string).
- ``deepseek-cot``: the same with DeepSeek-Prover-V1.5's ``cot`` instruction, "Complete the
  following Lean 4 code with explanatory comments preceding each line of code:" (the model
  writes a comment before each tactic).
- Few-shot (``HarnessConfig.few_shot``, both DeepSeek formats): solved examples go before the
  prompt, each as a closed block in the same layout followed by two blank lines, as
  DeepSeek-Prover-V1.5's few-shot sampling does.
- ``chat``: a chat prompt (system + user) asking to reason step by step and then give the
  complete Lean 4 code in a ```lean4 block. Suits reasoning provers (Kimina, Goedel-V2 style).
- ``kimina``: the chat layout of the Kimina-Prover models (Kimina-Prover-72B and its
  Distill-8B/1.7B): system prompt "You are an expert in mathematics and proving theorems in
  Lean 4.", a user turn with the instruction, ``# Problem:`` and ``# Formal statement:`` with the
  code in a ```lean4 block.
- ``kimina-preview``: the same layout with the Kimina-Prover-Preview cards' system prompt
  ("You are an expert in mathematics and Lean 4."), for the Preview-Distill-1.5B/7B models.
- ``goedel``: the Goedel-Prover-V2 README layout: one user turn (no system prompt) asking to
  complete the code, whose statement ends in ``sorry``, with a detailed proof plan first.
- ``custom``: ``HarnessConfig.template`` (``str.format`` fields ``{header}``,
  ``{formal_statement}``, ``{informal_statement}``, ``{informal_comment}``, ``{name}``). A text
  prompt, or a chat prompt (system + user) when ``system_prompt`` is set.
"""

from __future__ import annotations

import functools
import json
import random
from pathlib import Path

from leanrl.errors import ConfigError
from leanrl.harness import HarnessConfig
from leanrl.policy import Prompt
from leanrl.rollout import ChatMessage
from leanrl.task import Task

__all__ = [
    "FORMATS",
    "FewShotExample",
    "build_prompt",
    "check_config",
    "default_stop",
    "few_shot_examples",
    "informal_comment",
    "is_completion_style",
]

FORMATS = ("deepseek", "deepseek-cot", "chat", "kimina", "kimina-preview", "goedel", "custom")

#: DeepSeek-Prover-V1.5's two instructions (``non-cot`` and ``cot``), word for word.
DEEPSEEK_INSTRUCTION = "Complete the following Lean 4 code:"
DEEPSEEK_COT_INSTRUCTION = (
    "Complete the following Lean 4 code with explanatory comments preceding each line of code:"
)
_DEEPSEEK = {"deepseek": DEEPSEEK_INSTRUCTION, "deepseek-cot": DEEPSEEK_COT_INSTRUCTION}

DEFAULT_SYSTEM = (
    "You are an expert in mathematics and in proving theorems in Lean 4 with Mathlib. "
    "Your proofs are checked by the Lean compiler."
)
KIMINA_SYSTEM = "You are an expert in mathematics and proving theorems in Lean 4."
KIMINA_PREVIEW_SYSTEM = "You are an expert in mathematics and Lean 4."
# Goedel-Prover-V2's README prompt, word for word (the model was trained on it).
GOEDEL_PLAN = (
    "Before producing the Lean 4 code to formally prove the given theorem, provide a detailed "
    "proof plan outlining the main proof steps and strategies.\nThe plan should highlight key "
    "ideas, intermediate lemmas, and proof structures that will guide the construction of the "
    "final formal proof."
)


def informal_comment(task: Task) -> str:
    """The informal statement as a Lean doc comment (empty when the task has none)."""
    if not task.informal_statement:
        return ""
    text = task.informal_statement.strip().replace("-/", "- /")  # must not end the comment
    # No space before `-/`: DeepSeek-Prover's datasets (`informal_prefix`) write it this way.
    return f"/-- {text}-/\n"


def check_config(config: HarnessConfig) -> None:
    """Everything about the prompt that can be wrong, found before a model loads: the format
    (with a did-you-mean), a custom format's template, and the few-shot file (it exists and
    every line is an example)."""
    _check(config)
    if config.few_shot is not None:
        _load_examples(*_file_key(config.few_shot))


def _check(config: HarnessConfig) -> None:
    if config.prompt_format not in FORMATS:
        from leanrl._cli_help import suggest

        close = suggest(config.prompt_format, FORMATS)
        raise ConfigError(
            f"unknown prompt_format {config.prompt_format!r}"
            + (f" (did you mean {close!r}?)" if close else "")
            + f"; use one of {', '.join(FORMATS)} (--env.harness.prompt-format)"
        )
    if config.prompt_format == "custom" and not config.template:
        raise ConfigError(
            "prompt_format 'custom' needs a template (--env.harness.template '...{formal_statement}')"
        )
    if config.few_shot is not None and config.prompt_format not in _DEEPSEEK:
        raise ConfigError(
            f"few_shot examples go with the deepseek and deepseek-cot formats, not "
            f"{config.prompt_format!r}: unset --env.harness.few_shot or change the format"
        )


def is_completion_style(config: HarnessConfig) -> bool:
    """True when the model continues the statement in an open code block (no fences to find)."""
    _check(config)
    if config.prompt_format in _DEEPSEEK:
        return True
    if config.prompt_format == "custom":
        return bool(config.template and config.template.rstrip().endswith("{formal_statement}"))
    return False


def default_stop(config: HarnessConfig) -> list[str]:
    """Stop strings the format implies (``"```"`` closes the open block of completion style)."""
    return ["```"] if is_completion_style(config) else []


def build_prompt(task: Task, config: HarnessConfig) -> Prompt:
    """The prompt for ``task`` in the configured format."""
    _check(config)
    fmt = config.prompt_format
    statement = task.formal_statement
    informal = (task.informal_statement or "").strip()
    if fmt in _DEEPSEEK:
        # Ends in a newline after `:= by`, as in DeepSeek-Prover-V1.5's own prompt: the model
        # then starts with the indented first tactic, the way it was trained.
        shots = "".join(
            _example_block(ex, _DEEPSEEK[fmt], task.header)
            for ex in few_shot_examples(task, config)
        )
        return (
            f"{shots}{_DEEPSEEK[fmt]}\n\n```lean4\n"
            f"{task.header}{informal_comment(task)}{statement.rstrip()}\n"
        )
    if fmt == "custom":
        assert config.template is not None
        try:
            text = config.template.format(
                header=task.header,
                formal_statement=statement,
                informal_statement=informal,
                informal_comment=informal_comment(task),
                name=task.name,
            )
        except (KeyError, IndexError) as e:
            raise ConfigError(
                f"prompt template has an unknown field {e}; use {{header}}, "
                "{formal_statement}, {informal_statement}, {informal_comment}, {name}"
            ) from None
        if config.system_prompt is None:
            return text
        return [
            ChatMessage(role="system", content=config.system_prompt),
            ChatMessage(role="user", content=text),
        ]
    code = f"```lean4\n{task.header}{statement}\n```"
    if fmt in ("kimina", "kimina-preview"):
        user = (
            "Think about and solve the following problem step by step in Lean 4.\n"
            f"# Problem:{informal}\n# Formal statement:\n{code}\n"
        )
        system = config.system_prompt or (
            KIMINA_SYSTEM if fmt == "kimina" else KIMINA_PREVIEW_SYSTEM
        )
    elif fmt == "goedel":
        user = (
            "Complete the following Lean 4 code:\n\n```lean4\n"
            f"{task.header}{statement.rstrip()}\n  sorry```\n\n{GOEDEL_PLAN}"
        )
        if config.system_prompt is None:  # Goedel-Prover-V2 is prompted with a user turn only
            return [ChatMessage(role="user", content=user)]
        system = config.system_prompt
    else:
        problem = f"Problem (informal): {informal}\n\n" if informal else ""
        user = (
            f"{problem}Prove the following theorem in Lean 4:\n\n{code}\n\n"
            "Think step by step about a proof first. Then give the complete Lean 4 code in a "
            "```lean4 block: the theorem exactly as stated above, followed by its proof. Do not "
            "use `sorry`."
        )
        system = config.system_prompt or DEFAULT_SYSTEM
    return [ChatMessage(role="system", content=system), ChatMessage(role="user", content=user)]


# -- few-shot examples ---------------------------------------------------------------------------


class FewShotExample(Task):
    """A solved example for few-shot prompts: a task with its proof (what goes after ``:= by``).
    Its ``header`` is empty when the file gave none (the prompted task's header is used)."""

    proof: str
    """The proof body."""


def few_shot_examples(task: Task, config: HarnessConfig) -> list[FewShotExample]:
    """The examples put before ``task``'s prompt: ``few_shot_num`` of the file's, never one of
    the same name, drawn with a seed fixed by the task's id (the same for every sample and
    run)."""
    if config.few_shot is None:
        return []
    pool = [ex for ex in _load_examples(*_file_key(config.few_shot)) if ex.name != task.name]
    k = min(config.few_shot_num, len(pool))
    return random.Random(f"leanrl-few-shot:{task.id}").sample(pool, k)


def _file_key(path: Path) -> tuple[str, float]:
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(
            f"few_shot file {p} does not exist (--env.harness.few-shot takes a JSONL file of "
            "solved examples: name, formal_statement, proof per line)"
        )
    return str(p), p.stat().st_mtime


@functools.lru_cache(maxsize=8)
def _load_examples(path: str, mtime: float) -> tuple[FewShotExample, ...]:
    """The examples of a few-shot file (cached per path and modification time)."""
    out: list[FewShotExample] = []
    for i, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            proof = row.get("proof", row.get("formal_proof"))
            informal = row.get("informal_statement")
            if informal is None and row.get("informal_prefix"):
                informal = str(row["informal_prefix"]).strip()
                informal = informal.removeprefix("/--").removesuffix("-/").strip()
            out.append(
                FewShotExample(
                    name=row["name"],
                    header=row.get("header") or "",
                    formal_statement=row["formal_statement"].rstrip(),
                    informal_statement=informal,
                    proof=proof,
                )
            )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConfigError(
                f"few_shot file {path}, line {i}: not an example ({type(e).__name__}: {e}); each "
                "line needs name, formal_statement and proof (or formal_proof)"
            ) from None
    if not out:
        raise ConfigError(f"few_shot file {path} holds no examples")
    return tuple(out)


def _example_block(ex: FewShotExample, instruction: str, header: str) -> str:
    """One solved example in DeepSeek-Prover-V1.5's few-shot layout."""
    proof = ex.proof
    if not proof.startswith("\n"):
        proof = "\n" + (proof if proof.startswith((" ", "\t")) else "  " + proof)
    return (
        f"{instruction}\n\n```lean4\n{ex.header or header}{informal_comment(ex)}"
        f"{ex.formal_statement.rstrip()}{proof.rstrip()}\n```\n\n\n"
    )
