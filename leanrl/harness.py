"""Harness: how the model works on a task. Prompts, turns, and pulling the proof out of text.

Built-ins: ``whole-proof`` (one turn), ``tactic-loop`` (many turns, REPL tactic mode) and
``self-correction`` (a whole proof, then revisions shown Lean's errors).
Subclass :class:`Harness` and implement :meth:`Harness.run`.
"""

from __future__ import annotations

import abc
import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from leanrl.errors import ConfigError

if TYPE_CHECKING:
    from leanrl.policy import Policy, Prompt, SamplingConfig
    from leanrl.proofs import Pair
    from leanrl.rollout import Rollout
    from leanrl.runtime import Runtime
    from leanrl.task import Task
    from leanrl.taskset import Taskset

__all__ = [
    "GroupListener",
    "Harness",
    "HarnessConfig",
    "SFTEpisode",
    "SFTTurn",
    "listen_for_groups",
    "report_group",
]

GroupListener = Callable[["Task", "Sequence[Rollout]"], None]
"""Called with a task and its group once the group's rewards are final (:func:`report_group`)."""

_LISTENER: contextvars.ContextVar[GroupListener | None] = contextvars.ContextVar(
    "leanrl_group_listener", default=None
)


def report_group(task: Task, group: Sequence[Rollout]) -> None:
    """Say that ``task``'s group of rollouts is final: verdicts in, rewards set, nothing about
    it will change before :meth:`Harness.run` returns it. A harness that knows a group is done
    before its other groups are calls this then, so that whoever runs the rollout can start on
    it at once (GRPO's ``stream_training`` accumulates its gradient while the other groups are
    still generated and checked). Optional: a group never reported is taken when ``run``
    returns, so a harness that never calls it is still correct, only not overlapped. Does
    nothing when nobody listens; it returns at once, and may be called from a worker thread
    started within the rollout (``asyncio.to_thread`` carries the listener along)."""
    listener = _LISTENER.get()
    if listener is not None:
        listener(task, group)


@contextlib.contextmanager
def listen_for_groups(listener: GroupListener | None) -> Iterator[None]:
    """Within this block (and the tasks it starts), :func:`report_group` calls ``listener``."""
    token = _LISTENER.set(listener)
    try:
        yield
    finally:
        _LISTENER.reset(token)


class HarnessConfig(BaseModel):
    """How the model is prompted and how its output becomes a proof."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    name: str = "whole-proof"
    """Harness id: ``whole-proof`` (one turn, the whole proof), ``tactic-loop`` (tactics one
    turn at a time against the REPL), ``self-correction`` (a whole proof, then revisions that
    see Lean's errors), or a third-party harness (``leanrl.harnesses`` entry points)."""
    prompt_format: str = "deepseek"
    """Prompt style. ``deepseek``: DeepSeek-Prover-V1.5 completion style ("Complete the following
    Lean 4 code", the prompt ends in ``:= by`` and a newline). ``deepseek-cot``: its
    chain-of-thought variant ("... with explanatory comments preceding each line of code").
    ``kimina``: the chat layout of
    Kimina-Prover-72B and its distills (8B, 1.7B). ``kimina-preview``: the Kimina-Prover-Preview
    cards' layout. ``goedel``: the Goedel-Prover-V2 README layout (one user turn, statement ending
    in ``sorry``, no system prompt). ``chat``: a generic chat prompt asking for reasoning and a
    final Lean code block. ``custom``: use ``template``."""
    template: str | None = None
    """Your own prompt template (``str.format`` fields: ``{header}``, ``{formal_statement}``,
    ``{informal_statement}``, ``{name}``). Used when ``prompt_format = "custom"``."""
    system_prompt: str | None = None
    """System message for chat prompts (None: the format's default)."""
    max_turns: int = Field(default=8, ge=1)
    """``tactic-loop``: most model turns per attempt."""
    max_total_tokens: int = Field(default=8192, ge=1)
    """``tactic-loop``, ``self-correction``: most tokens (model + environment) per attempt."""
    max_revisions: int = Field(default=2, ge=0)
    """``self-correction``: most revisions after the first attempt, each shown Lean's errors on
    the previous one (Goedel-Prover-V2 uses 2)."""
    feedback_errors: int = Field(default=8, ge=1)
    """``self-correction``: most Lean errors shown per revision (the rest are counted)."""
    few_shot: Path | None = None
    """A JSONL file of solved examples (``name``, ``formal_statement``, ``proof`` or
    ``formal_proof``, optional ``header`` and informal statement; a ``proofs.jsonl`` works)
    put before the prompt, DeepSeek-Prover-V1.5's few-shot layout. ``deepseek`` and
    ``deepseek-cot`` formats only."""
    few_shot_num: int = Field(default=3, ge=1)
    """Examples per prompt (DeepSeek-Prover-V1.5 uses 3), drawn per task with a fixed seed
    from ``few_shot``, never the task itself."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Settings of the harness's own: ``tactic-loop``: ``max_sessions``; the ``countdown``
    environment: ``style`` and ``reward``; the ``verifiers`` environment: ``env`` (a verifiers
    taskset id), ``taskset`` (its config) and ``solved_at``; ``whole-proof`` and
    ``self-correction`` take none;
    third-party harnesses: theirs. A key the harness does not know is refused (a harness that
    declares no ``option_keys`` takes any)."""


@dataclass(frozen=True)
class SFTTurn:
    """One model turn of an episode as SFT replays it (see :meth:`Harness.sft_episode`)."""

    completion: str
    """What the model wrote (the text the harness kept, a stop string cut off)."""
    feedback: str = ""
    """What the environment answered, shown to the model before its next turn ('' at the end)."""
    train: bool = True
    """Whether the model's tokens of this turn carry loss (False: context only)."""
    end: str | None = ""
    """How the turn ended, as the model's tokens hold it: the stop string that ended it
    (completion prompts, e.g. ```` ``` ````), ``""`` for its own end (chat prompts: the chat
    template's end-of-turn token is added), None when it was cut off by the token limit."""


@dataclass(frozen=True)
class SFTEpisode:
    """A whole multi-turn episode laid out for SFT: the first prompt, then every model turn
    with the environment's answer to it; the turns with ``train`` carry loss."""

    prompt: Prompt
    """The first prompt, as the harness gave it (text, or chat messages)."""
    turns: tuple[SFTTurn, ...]
    """Every model turn, in order."""


class Harness(abc.ABC):
    """Base class of every harness. ``__init__`` stores the config, refuses option keys the
    harness does not know (:attr:`option_keys`), and does nothing else."""

    name: ClassVar[str] = ""
    """Registry id of the harness."""
    description: ClassVar[str] = ""
    """One line for ``leanrl envs``."""
    needs_tactic_sessions: ClassVar[bool] = False
    """True when the harness talks to Lean between turns (``Runtime.tactic_session``); a
    runtime without tactic mode is then refused before anything starts."""
    option_keys: ClassVar[frozenset[str] | None] = None
    """The ``config.options`` keys the harness reads; any other key is refused when the harness
    is made, since a misspelt one would otherwise be ignored and the run go on with the default.
    None (the default): options are not checked."""

    def __init__(self, config: HarnessConfig | None = None) -> None:
        self.config = config or HarnessConfig(name=self.name or "whole-proof")
        self.check_options()

    def check_config(self) -> None:
        """Refuse a config this harness cannot run (an unknown prompt format, a missing few-shot
        file), with what to use instead. Called when the environment makes the harness, so it
        fails before any model loads; cheap, builds nothing (default: nothing to check)."""
        return None

    def check_options(self) -> None:
        """Refuse ``config.options`` keys not in :attr:`option_keys`, naming the known ones."""
        known = self.option_keys
        if known is None:
            return
        unknown = sorted(k for k in self.config.options if k not in known)
        if not unknown:
            return
        from leanrl._cli_help import suggest

        bad = unknown[0]
        close = suggest(bad, known)
        takes = (
            f"it takes {', '.join(sorted(known))} (--env.harness.options)"
            if known
            else "it takes no options: leave --env.harness.options out"
        )
        raise ConfigError(
            f"unknown harness option {bad!r} for harness {self.name!r}"
            + (f" (did you mean {close!r}?)" if close else "")
            + (f" (also unknown: {', '.join(map(repr, unknown[1:]))})" if unknown[1:] else "")
            + f"; {takes}"
        )

    @abc.abstractmethod
    async def run(
        self,
        tasks: Sequence[Task],
        policy: Policy,
        runtime: Runtime,
        sampling: SamplingConfig,
        taskset: Taskset,
    ) -> list[list[Rollout]]:
        """``sampling.n`` verified, rewarded Rollouts for each task, in task order.

        Rewards come from ``taskset.group_rewards``. A bad or missing proof is a Rollout with a
        rejecting Verdict, never an exception.
        """

    def sft_example(self, pair: Pair, target: str = "proof") -> tuple[Prompt, str] | None:
        """What supervised fine-tuning (``leanrl train sft``, expert iteration) trains on for
        ``pair``: the first prompt this harness gives the task and the text the model should
        answer it with (``target = "completion"``: the model's own text kept with the proof,
        where there is one). None: the ``whole-proof`` layout (its prompt format, the proof in
        the Lean code block), which the Lean harnesses' first turns share."""
        return None

    def sft_episode(self, rollout: Rollout) -> SFTEpisode | None:
        """What SFT trains on for a verified multi-turn ``rollout`` with ``turns = "all"``
        (``--data.turns all``, expert iteration's ``turns``): the whole conversation, each turn
        marked as a target or as context; the SFT data builder tokenizes it the way the
        harness's token-id context does (:mod:`leanrl.harnesses.tactic_loop.context`), so each
        turn's prompt part is what the model saw at that turn. None (the default): train the
        first turn only (:meth:`sft_example`)."""
        return None

    async def generate(
        self, tasks: Sequence[Task], policy: Policy, sampling: SamplingConfig
    ) -> list[list[Rollout]]:
        """``sampling.n`` Rollouts per task with their proofs and no Lean check
        (``leanrl eval --generate-only``): ``verdict`` is None, or a rejection that needs no
        Lean (no proof in the text). Harnesses that need Lean between turns cannot do this."""
        raise ConfigError(
            f"harness {self.name!r} cannot generate without Lean (it needs Lean's answer after "
            "each turn); --generate-only works with the `whole-proof` harness"
        )
