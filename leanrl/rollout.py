"""Rollout: one attempt at a task, everything a trainer or a report needs."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from leanrl.errors import ConfigError
from leanrl.policy import ChatMessage, Completion
from leanrl.verdict import Reason, Verdict

__all__ = ["ChatMessage", "Rollout", "Turn"]


class Turn(BaseModel):
    """One exchange: the model's output and, in multi-turn harnesses, what the environment said."""

    model_config = ConfigDict(extra="forbid")

    completion: str
    """What the model wrote this turn."""
    completion_ids: list[int] = Field(default_factory=list)
    """Token ids of the completion (model tokens: they carry loss)."""
    logprobs: list[float] | None = None
    """Sampling log-probabilities of ``completion_ids`` (same length), when the policy gives them."""
    feedback: str = ""
    """The environment's answer after this turn (goals or error), shown to the model next turn."""
    feedback_ids: list[int] = Field(default_factory=list)
    """Token ids of ``feedback`` as inserted into the context (environment tokens: masked)."""
    finish_reason: str | None = None
    """``stop`` or ``length`` (truncated)."""
    usage_tokens: int | None = None
    """Generated tokens as the server's ``usage`` counted them, where the policy returned no
    token ids or log-probs (:attr:`Completion.usage_tokens`); None otherwise."""

    @property
    def num_tokens(self) -> int:
        """Tokens the model generated this turn: its ids, else its log-probs, else the server's
        count (0 when none of them is known)."""
        return len(self.completion_ids) or len(self.logprobs or ()) or (self.usage_tokens or 0)

    @classmethod
    def from_completion(
        cls, c: Completion, feedback: str = "", feedback_ids: Sequence[int] = ()
    ) -> Turn:
        """The turn a policy :class:`~leanrl.Completion` makes (text, ids, logprobs, finish),
        with the environment's answer to it, if any."""
        return cls(
            completion=c.text,
            completion_ids=list(c.token_ids),
            logprobs=list(c.logprobs) if c.logprobs is not None else None,
            feedback=feedback,
            feedback_ids=list(feedback_ids),
            finish_reason=c.finish_reason,
            usage_tokens=c.usage_tokens,
        )


class Rollout(BaseModel):
    """One attempt at one task: prompt, turns, token ids, the final proof, the Verdict, reward."""

    model_config = ConfigDict(extra="forbid")

    task_id: str
    """The task's id."""
    sample: int = 0
    """Sample index within the task (0 .. n-1)."""
    prompt: str | list[ChatMessage]
    """The first prompt (text for completion models, messages for chat models)."""
    prompt_ids: list[int] = Field(default_factory=list)
    """Token ids of the prompt as the policy tokenized it (chat template applied)."""
    turns: list[Turn] = Field(default_factory=list)
    """Every turn, in order."""
    proof: str | None = None
    """The proof that was checked (tactic block under the reference statement); None if none
    could be extracted."""
    preamble: str = ""
    """Helper lemmas the model put before the theorem, checked together with the proof."""
    restated_statement: str = ""
    """The model's own statement when it restated the theorem differently from the reference
    (checked in its place; the trusted checker rejects it unless its type is the reference's)."""
    verdict: Verdict | None = None
    """What Lean said about ``proof``."""
    reward: float = 0.0
    """The taskset's reward for this attempt (after any group shaping)."""
    timings: dict[str, float] = Field(default_factory=dict)
    """Seconds spent per phase (``generate``, ``verify``, ...)."""
    meta: dict[str, Any] = Field(default_factory=dict)
    """Anything else a harness wants to keep (policy version, turn budget used, ...)."""

    @property
    def completion(self) -> str:
        """The model's text over all turns."""
        return "".join(t.completion for t in self.turns)

    @property
    def infra(self) -> bool:
        """True when the checker could not judge the attempt (verdict ``infra``): not the
        model's answer, so trainers give it no weight and pass rates leave it out."""
        return self.verdict is not None and self.verdict.reason == Reason.INFRA

    @property
    def truncated(self) -> bool:
        """True when any turn hit the token limit."""
        return any(t.finish_reason == "length" for t in self.turns)

    def token_ids_and_mask(self) -> tuple[list[int], list[int], list[float | None]]:
        """The flat sequence after the prompt: ids, loss mask (1 = model token), logprobs."""
        ids: list[int] = []
        mask: list[int] = []
        lps: list[float | None] = []
        for t in self.turns:
            ids += t.completion_ids
            mask += [1] * len(t.completion_ids)
            lps += list(t.logprobs) if t.logprobs is not None else [None] * len(t.completion_ids)
            ids += t.feedback_ids
            mask += [0] * len(t.feedback_ids)
            lps += [None] * len(t.feedback_ids)
        return ids, mask, lps


class RewardError(ConfigError):
    """A reward function returned something that is not a finite number (NaN, an infinity, a
    string, None) or one too large to compute with: the message names the task, the attempt
    and the value."""


REWARD_LIMIT = 1e15
"""The largest reward magnitude leanrl takes. Rewards are averaged, centred and squared:
GRPO's advantages in float32 overflow once a squared difference passes ~3.4e38 (a reward of
1e20 already gives an infinite spread and silently no signal), and Python floats once it passes
~1.8e308 (1e308 raised OverflowError in a step's report). Below 1e15 every such sum is finite."""


def check_rewards(rollouts: Iterable[Rollout], where: str, why: str, unit: str = "rollout") -> None:
    """Refuse, naming ``where`` (e.g. ``step 3``), the task, the attempt and the value, a judged
    rollout whose reward is not a finite number or is larger in magnitude than
    :data:`REWARD_LIMIT`; make every other reward a plain ``float``.

    Rewards come from code users write (``Taskset.reward`` / ``Taskset.group_rewards``, a
    harness), and ``Rollout.reward`` is not validated on assignment. One NaN would make every
    GRPO advantage, and so every weight, NaN; in an eval it is no score, and a bare ``NaN`` in
    ``results.jsonl`` is not JSON. ``why`` says which of these is at stake.

    An ``infra`` rollout is exempt: the checker could not judge it, so its reward is no outcome
    (trainers give it no weight, pass rates leave it out). A non-finite one is set to 0.0, so it
    cannot reach a tensor or a file either (a huge one too)."""
    for r in rollouts:
        value: Any = r.reward
        number = _as_float(value)
        if number is not None and math.isfinite(number) and abs(number) <= REWARD_LIMIT:
            r.reward = number  # numpy and torch scalars: JSON and tensors take a plain float
            continue
        if r.infra:
            r.reward = 0.0
            continue
        kind = "" if number is not None else f" (a {type(value).__name__}, not a number)"
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        if number is not None and math.isfinite(number):  # finite, but too large
            raise RewardError(
                f"{where}, task {r.task_id!r}, {unit} {r.sample} got reward {shown}, more than "
                f"{REWARD_LIMIT:g} in magnitude: means and spreads over it overflow. The "
                f"Environment must return rewards within ±{REWARD_LIMIT:g}: fix its reward "
                "function (Taskset.reward or Taskset.group_rewards), e.g. rescale or clamp it"
            )
        raise RewardError(
            f"{where}, task {r.task_id!r}, {unit} {r.sample} got reward {shown}{kind}. The "
            f"Environment must return finite rewards ({why}): fix its reward function "
            "(Taskset.reward or Taskset.group_rewards), e.g. clamp log-probabilities or map "
            "failures to a finite penalty"
        )


def _as_float(value: Any) -> float | None:
    """``value`` as a float when it is a real number (int, float, a numpy or one-element torch
    scalar); None for anything else (a string, None, a list)."""
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, str | bytes) or not hasattr(value, "__float__"):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
