"""An environment's own one-turn harness, run on a reply that was sampled elsewhere.

The verifiers plugin (a model's reply from a verifiers rollout) and the trace converters (a
reply read from ``traces.jsonl``) must prompt, extract and reward exactly as the environment's
harness does under ``leanrl eval``: Countdown's ``<answer>`` tags and its own reward, the
whole-proof harness's Lean blocks, a third party's harness. Rather than re-implement any of
that, the harness itself is run with :class:`ReplyPolicy`, a policy whose "sampling" hands back
the given reply (cut at the harness's stop strings, as a server asked to stop there would have
cut it). No verifiers import here: plain leanrl types only.

A harness qualifies when it is one turn: it has ``prompt(task)`` (the prompt it samples) and
``generate`` (its sampling and extraction without a check), and needs no Lean between turns.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine, Sequence
from typing import Any, Literal, TypeVar

from leanrl.environment import Environment
from leanrl.errors import ConfigError
from leanrl.harness import Harness
from leanrl.policy import Completion, Policy, PolicyConfig, Prompt, SamplingConfig
from leanrl.rollout import Rollout
from leanrl.runtime import Runtime
from leanrl.task import Task

__all__ = [
    "ReplyPolicy",
    "chat_parts",
    "one_turn_harness",
    "replay_generate",
    "replay_run",
    "run_sync",
]

T = TypeVar("T")


class ReplyPolicy(Policy):
    """A policy that answers every prompt with one fixed reply (``n`` must be 1).

    The reply is cut at the first of ``sampling.stop`` that occurs in it, stop string
    excluded, with ``finish_reason`` ``stop``: what a server told to stop there returns. The
    prompts the harness asked about are kept in :attr:`prompts`."""

    name = "reply"

    def __init__(
        self,
        reply: str,
        finish_reason: Literal["stop", "length"] = "stop",
        usage_tokens: int | None = None,
    ) -> None:
        super().__init__(PolicyConfig(model="reply"))
        self.reply = reply
        self.finish_reason: Literal["stop", "length"] = finish_reason
        self.usage_tokens = usage_tokens
        self.prompts: list[Prompt] = []

    def stream_replays(self, sampling: SamplingConfig) -> bool:
        return False  # nothing to stream: the reply exists already

    async def generate(
        self, prompts: Sequence[Prompt], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        if sampling.n != 1:
            raise ConfigError("a recorded reply is one sample; ask for n = 1")
        self.prompts.extend(prompts)
        text, finish = self.reply, self.finish_reason
        cuts = [i for i in (text.find(s) for s in sampling.stop if s) if i >= 0]
        if cuts:
            text, finish = text[: min(cuts)], "stop"
        c = Completion(text=text, finish_reason=finish, usage_tokens=self.usage_tokens)
        return [[c] for _ in prompts]


def one_turn_harness(env: Environment) -> Harness:
    """``env``'s harness, or a one-line ConfigError when it is not a one-turn harness."""
    h = env.harness
    ok = (
        callable(getattr(h, "prompt", None))
        and type(h).generate is not Harness.generate
        and not h.needs_tactic_sessions
    )
    if not ok:
        raise ConfigError(
            f"environment {env.config.id!r} works with harness {h.name!r}, which is not one "
            "model turn (it talks to Lean between turns, or writes no single prompt); only "
            "one-turn harnesses (whole-proof, countdown, verifiers, or any with prompt() and "
            "generate()) can score a reply sampled elsewhere"
        )
    return h


def chat_parts(prompt: Prompt) -> tuple[str | None, str]:
    """``(system, user)`` of a prompt: a text prompt is the user turn; chat messages give their
    system message and their user messages (joined by a blank line)."""
    if isinstance(prompt, str):
        return None, prompt
    others = [m.role for m in prompt if m.role not in ("system", "user")]
    if others:
        raise ConfigError(
            f"the harness's prompt has {others[0]!r} messages; a verifiers task carries only a "
            "system prompt and a user prompt"
        )
    system = next((m.content for m in prompt if m.role == "system"), None)
    return system, "\n\n".join(m.content for m in prompt if m.role == "user")


async def replay_generate(harness: Harness, task: Task, policy: ReplyPolicy) -> Rollout:
    """The rollout ``harness`` makes of the policy's reply to ``task``, not checked: its proof
    extracted (or the rejection of a reply with none)."""
    (group,) = await harness.generate([task], policy, SamplingConfig(n=1))
    (rollout,) = group
    return rollout


async def replay_run(
    env: Environment, task: Task, policy: ReplyPolicy, runtime: Runtime
) -> Rollout:
    """The rollout the environment's harness makes of the reply: extracted, checked on
    ``runtime`` and rewarded by the taskset, as ``leanrl eval`` would have."""
    harness = one_turn_harness(env)
    (group,) = await harness.run([task], policy, runtime, SamplingConfig(n=1), env.taskset)
    (rollout,) = group
    return rollout


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to its end from synchronous code, also where an event loop is running
    already (a notebook): there it runs on its own loop in a worker thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()
