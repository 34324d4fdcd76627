"""Prompt formats for whole-proof generation.

- ``deepseek``: DeepSeek-Prover-V1.5 completion style (its ``quick_start.py``). The prompt opens
  a ```lean4 block with the header, the informal statement as a doc comment and the statement,
  ending in ``:= by`` and a newline; the model continues with the indented proof and closes the
  block (so ``"```"`` is the natural stop string).
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

from leanrl.errors import ConfigError
from leanrl.harness import HarnessConfig
from leanrl.policy import Prompt
from leanrl.rollout import ChatMessage
from leanrl.task import Task

__all__ = ["FORMATS", "build_prompt", "default_stop", "informal_comment", "is_completion_style"]

FORMATS = ("deepseek", "chat", "kimina", "kimina-preview", "goedel", "custom")

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


def _check(config: HarnessConfig) -> None:
    if config.prompt_format not in FORMATS:
        raise ConfigError(
            f"unknown prompt_format {config.prompt_format!r}; use one of {', '.join(FORMATS)}"
        )
    if config.prompt_format == "custom" and not config.template:
        raise ConfigError(
            "prompt_format 'custom' needs a template (--env.harness.template '...{formal_statement}')"
        )


def is_completion_style(config: HarnessConfig) -> bool:
    """True when the model continues the statement in an open code block (no fences to find)."""
    _check(config)
    if config.prompt_format == "deepseek":
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
    if fmt == "deepseek":
        # Ends in a newline after `:= by`, as in DeepSeek-Prover-V1.5's own prompt: the model
        # then starts with the indented first tactic, the way it was trained.
        return (
            "Complete the following Lean 4 code:\n\n```lean4\n"
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
