"""Shaped rewards that trainers add to the taskset's reward: format checks and DAPO's soft
overlong punishment. Both are off by default.

- **Format** (Kimina-Prover RL's format checks, Numina & Kimi Team 2025): an attempt should hold
  exactly one reasoning block (``<think>`` ... ``</think>``), exactly one Lean code block outside
  it (```` ```lean4 ```` or ```` ```lean ````), and no line repeated within the reasoning or within
  the rest (a looping, degenerate output). Each rule that fails subtracts its penalty.
- **Overlong** (DAPO's soft overlong punishment, Yu et al. 2025, eq. 13): for a response of L
  tokens, with maximum ``L_max`` and buffer ``L_cache``::

      R_length(L) = 0                                  if L <= L_max - L_cache
                  = ((L_max - L_cache) - L) / L_cache  if L_max - L_cache < L <= L_max
                  = -1                                 if L > L_max

  times ``penalty``.

The shaping value is *added* to the taskset's reward (``Rollout.reward``) before advantages are
taken. It never touches the Verdict: pass rates still count Lean's acceptances, so shaping can
move rewards but never turns a failure into a pass. Attempts the checker could not judge
(``infra``) get no shaping: they carry no weight anyway.

Trainers call :func:`shape_groups` on a step's groups right after the rewards are checked and
before anything uses them (GRPO does in ``_collect``, before dynamic sampling looks at the
groups; ES would call it on each member's groups before averaging), and
:func:`shaping_metrics` for the step's columns. Nothing here imports torch.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from leanrl.errors import ConfigError
from leanrl.rollout import Rollout

__all__ = [
    "FormatRewardConfig",
    "OverlongConfig",
    "check_shaping",
    "format_penalty",
    "format_violations",
    "overlong_penalty",
    "shape_groups",
    "shaping_metrics",
    "shaping_of",
]

_LEAN_FENCE = re.compile(r"^[ \t]*```lean4?[ \t]*$", re.MULTILINE)


class FormatRewardConfig(BaseModel):
    """Penalties for attempts that break the reasoning-then-Lean format (Kimina-Prover RL's
    format checks). Off by default; meant for chat formats whose model writes a reasoning block
    and then one Lean code block (``deepseek-cot``-like, Kimina's ``<think>`` models). A
    completion format whose prompt already opens the code block gets no Lean fence from the
    model: turn ``lean_block_penalty`` to 0 there."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    enabled: bool = False
    """Subtract the penalties below from the reward of attempts that break a rule (off: no
    change to any reward)."""
    reasoning_penalty: float = Field(default=1.0, ge=0.0)
    """Subtracted unless the attempt holds exactly one reasoning block: one ``think_open``, one
    ``think_close``, in that order (Kimina-Prover RL). 0 turns the rule off."""
    lean_block_penalty: float = Field(default=1.0, ge=0.0)
    """Subtracted unless the text outside the reasoning block holds exactly one Lean code block
    (a line ```` ```lean4 ```` or ```` ```lean ````). Lean snippets inside the reasoning do not
    count (Kimina's reasoning interleaves them). 0 turns the rule off."""
    repeated_line_penalty: float = Field(default=1.0, ge=0.0)
    """Subtracted when some line (stripped, at least ``repeat_min_chars`` long) appears more than
    ``repeat_limit`` times within the reasoning block, or within the rest (Kimina-Prover RL's
    no-repetition check against looping outputs). 0 turns the rule off."""
    think_open: str = Field(default="<think>", min_length=1)
    """The tag that opens the reasoning block."""
    think_close: str = Field(default="</think>", min_length=1)
    """The tag that closes the reasoning block."""
    repeat_min_chars: int = Field(default=8, ge=1)
    """Lines shorter than this (stripped) are never counted as repeats (``}``, ``· simp``)."""
    repeat_limit: int = Field(default=1, ge=1)
    """How many times one line may appear in a section before it is a repeat (1: none)."""


class OverlongConfig(BaseModel):
    """DAPO's soft overlong punishment (Yu et al. 2025, "DAPO", eq. 13): a length-aware penalty
    growing linearly from 0 to -``penalty`` over the last ``buffer_tokens`` tokens before the
    maximum length. Off by default."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    enabled: bool = False
    """Add the length penalty to every judged attempt's reward (off: no change)."""
    max_tokens: int | None = Field(default=None, ge=1)
    """L_max, in model tokens of the longest turn. Unset: ``sampling.max_tokens``."""
    buffer_tokens: int | None = Field(default=None, ge=1)
    """L_cache, the soft buffer before L_max where the penalty ramps. Unset: L_max // 5 (DAPO's
    4096 of 20480), at least 1. Must be at most L_max."""
    penalty: float = Field(default=1.0, ge=0.0)
    """Scale of the penalty: -``penalty`` at L_max and beyond (DAPO: 1)."""

    def resolved(self, max_tokens: int) -> tuple[int, int]:
        """(L_max, L_cache) with the defaults applied; ``max_tokens``: the sampling limit."""
        l_max = self.max_tokens or max_tokens
        l_cache = self.buffer_tokens or max(1, l_max // 5)
        if l_cache > l_max:
            raise ValueError(
                f"overlong.buffer_tokens = {l_cache} is larger than L_max = {l_max} (overlong."
                "max_tokens, default sampling.max_tokens): the buffer is the last part of the "
                "allowed length; lower --overlong.buffer-tokens"
            )
        return l_max, l_cache

    @model_validator(mode="after")
    def _buffer_fits(self) -> OverlongConfig:
        if self.max_tokens is not None and self.buffer_tokens is not None:
            self.resolved(self.max_tokens)
        return self


def _split_reasoning(text: str, cfg: FormatRewardConfig) -> tuple[str, str]:
    """(reasoning, rest): the text of the first reasoning block, and everything outside it."""
    start = text.find(cfg.think_open)
    if start < 0:
        return "", text
    end = text.find(cfg.think_close, start + len(cfg.think_open))
    if end < 0:  # never closed: everything after the tag is reasoning
        return text[start + len(cfg.think_open) :], text[:start]
    inner = text[start + len(cfg.think_open) : end]
    return inner, text[:start] + text[end + len(cfg.think_close) :]


def _has_repeat(section: str, cfg: FormatRewardConfig) -> bool:
    counts = Counter(
        s for s in (ln.strip() for ln in section.splitlines()) if len(s) >= cfg.repeat_min_chars
    )
    return any(n > cfg.repeat_limit for n in counts.values())


def format_violations(text: str, cfg: FormatRewardConfig) -> list[str]:
    """The format rules ``text`` breaks: ``reasoning``, ``lean_block``, ``repeated_lines``
    (rules whose penalty is 0 are not checked)."""
    out: list[str] = []
    reasoning, rest = _split_reasoning(text, cfg)
    if cfg.reasoning_penalty:
        opens, closes = text.count(cfg.think_open), text.count(cfg.think_close)
        ordered = opens == 1 and text.find(cfg.think_open) < text.find(cfg.think_close)
        if not (opens == 1 and closes == 1 and ordered):
            out.append("reasoning")
    if cfg.lean_block_penalty and len(_LEAN_FENCE.findall(rest)) != 1:
        out.append("lean_block")
    if cfg.repeated_line_penalty and (_has_repeat(reasoning, cfg) or _has_repeat(rest, cfg)):
        out.append("repeated_lines")
    return out


def format_penalty(text: str, cfg: FormatRewardConfig) -> float:
    """The (non-positive) format shaping of one text: minus the penalty of each broken rule."""
    if not cfg.enabled:
        return 0.0
    weights = {
        "reasoning": cfg.reasoning_penalty,
        "lean_block": cfg.lean_block_penalty,
        "repeated_lines": cfg.repeated_line_penalty,
    }
    return -sum(weights[v] for v in format_violations(text, cfg))


def overlong_penalty(length: int, l_max: int, l_cache: int) -> float:
    """DAPO's R_length(L) (eq. 13): 0, then a linear ramp to -1 over the buffer, -1 past L_max."""
    if length <= l_max - l_cache:
        return 0.0
    if length <= l_max:
        return ((l_max - l_cache) - length) / l_cache
    return -1.0


def shaping_of(
    r: Rollout, fmt: FormatRewardConfig, over: OverlongConfig, max_tokens: int
) -> tuple[float, float]:
    """(format, overlong) shaping of one attempt. Format: each turn's text is checked and the
    worst turn counts (a multi-turn attempt must keep the format every turn). Overlong: the
    longest turn's model tokens (``sampling.max_tokens`` is a per-turn limit)."""
    texts = [t.completion for t in r.turns] or [""]  # no turn at all: an empty text
    f = min(format_penalty(t, fmt) for t in texts)
    o = 0.0
    if over.enabled:
        l_max, l_cache = over.resolved(max_tokens)
        longest = max((len(t.completion_ids) for t in r.turns), default=0)
        o = over.penalty * overlong_penalty(longest, l_max, l_cache)
    return f, o


def shape_groups(
    groups: Iterable[Sequence[Rollout]],
    fmt: FormatRewardConfig,
    over: OverlongConfig,
    max_tokens: int,
) -> None:
    """Add the shaping to every judged attempt's reward, in place, and keep each attempt's
    values in ``Rollout.meta["shaping"]`` (nothing at all when both are off). Rewards must be
    finite floats already (``check_rewards``)."""
    if not (fmt.enabled or over.enabled):
        return
    for g in groups:
        for r in g:
            if r.infra:
                continue
            f, o = shaping_of(r, fmt, over, max_tokens)
            r.reward = float(r.reward) + f + o
            r.meta["shaping"] = {"format": f, "overlong": o}


def shaping_metrics(
    groups: Iterable[Sequence[Rollout]], fmt: FormatRewardConfig, over: OverlongConfig
) -> dict[str, Any]:
    """A step's shaping columns: ``shaping_format`` and ``shaping_overlong``, the mean value
    per shaped attempt (only the columns of the shapings that are on: default rows are
    unchanged)."""
    seen = [r.meta["shaping"] for g in groups for r in g if "shaping" in r.meta]
    out: dict[str, Any] = {}
    for key, cfg in (("format", fmt), ("overlong", over)):
        if cfg.enabled:
            vals = [float(m[key]) for m in seen]
            out[f"shaping_{key}"] = sum(vals) / len(vals) if vals else None
    return out


def check_shaping(fmt: FormatRewardConfig, harness: str) -> None:
    """Refuse format rewards where the model writes no reasoning-then-Lean text."""
    if fmt.enabled and harness == "tactic-loop":
        raise ConfigError(
            "format_reward.enabled with the tactic-loop harness: its turns are single tactics, "
            "not a reasoning block and a Lean block, so every attempt would be penalised; "
            "drop --format-reward.enabled or use the whole-proof or self-correction harness"
        )
