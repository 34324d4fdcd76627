"""The ``tool-use`` harness: the model calls tools in its chat template's own format.

The model is offered tools (``check``, ``goals``, ``search``, ``submit`` on Lean tasks; ``calc``
and ``submit`` on Countdown) the way its chat template offers them
(``apply_chat_template(tools=...)``; the OpenAI ``tools`` field for a server), and calls them
as it likes within ``max_turns`` model turns, ``max_tool_calls`` calls and ``max_total_tokens``
tokens. Each episode runs on its own: while one waits for Lean, the others generate (every
pending turn of every episode goes into one batched ``Policy.stream`` call; ``chat.py``).

A turn is read for calls with the template's layout (``calls.py``). Each call is answered with
a tool message: a result, or an error for a call that could not be read, names no tool, has
arguments that do not fit, or is past the budget; none of these ends the episode. The episode
ends when ``submit`` hands in an answer, when a turn calls no tool (its text is then read for an
answer: a Lean code block on Lean tasks), when a turn is cut off, or when a budget runs out.
Nothing a tool says is a verdict: the answer is judged afterwards by the runtime's trusted check
under the taskset's rules, like every attempt, and the reward is the taskset's for that verdict.

Rollouts are token-exact where the policy generates from ids (``hf``, ``vllm``, the trainers'
policies): ``prompt_ids`` is the template's rendering of the system and user messages with the
tools, each Turn's ``completion_ids`` are the model's tokens (tool-call tokens included; loss 1)
and its ``feedback_ids`` the template's tokens for the tool results (loss 0). ``meta`` records
the calls (tool, turn, ok, seconds), ``timings`` the time generating, in tools (``tools``,
waiting for a Lean process included) and waiting for one (``tool_wait``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from leanrl.errors import ConfigError
from leanrl.harness import Harness
from leanrl.policy import ChatMessage, Completion, Policy, SamplingConfig
from leanrl.rollout import Rollout, Turn
from leanrl.runtime import Runtime
from leanrl.task import Task
from leanrl.taskset import Taskset
from leanrl.verdict import Reason, Verdict

from ..whole_proof.harness import check_and_reward
from .calls import PARSERS, ParsedTurn, ToolCall, detect_parser, parse_turn
from .chat import ChatFormat, MessagesBackend, TokenBackend, generation_mode
from .countdown_tools import CountdownTools
from .lean_tools import LeanTools
from .tools import Answer, EpisodeTools, ToolResult

__all__ = ["ToolUseHarness"]

_LEAN_SYSTEM = (
    "You are proving a theorem in Lean 4 with Mathlib. Use the tools: check Lean code, see the "
    "goals after a partial proof, search for lemmas. When the proof is done, call submit with "
    "it; it is checked once, after you submit."
)
_COUNTDOWN_SYSTEM = (
    "Solve the arithmetic puzzle. Evaluate expressions with calc, then hand in the answer with "
    "submit."
)
_DEFAULTS: dict[str, Any] = {
    "tools": "auto",
    "tool_parser": "auto",
    "max_tool_calls": 16,
    "max_sessions": 0,
    "max_result_chars": 4000,
    "search": True,
    "calc_first": False,
}


@dataclass
class _Episode:
    task: Task
    sample: int
    tools: EpisodeTools
    prompt: list[ChatMessage]
    messages: list[dict[str, Any]]
    ids: list[int] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    tokens: int = 0
    tool_calls: int = 0
    answer: Answer | None = None
    verdict: Verdict | None = None
    gen_s: float = 0.0
    tool_s: float = 0.0
    log: list[dict[str, Any]] = field(default_factory=list)
    mode: str = ""


class ToolUseHarness(Harness):
    """The model calls tools (Lean's, or a calculator on Countdown) and submits an answer."""

    name = "tool-use"
    description = (
        "the model calls tools in its chat template's format (Lean: check, goals, search, "
        "submit; Countdown: calc, submit); the submitted answer is judged"
    )
    option_keys = frozenset({*_DEFAULTS, "reward"})  # reward: read by the countdown environment

    def option(self, key: str) -> Any:
        """``config.options[key]``, or its default."""
        return self.config.options.get(key, _DEFAULTS[key])

    def check_config(self) -> None:
        """The options' values, and no prompt settings (this harness writes its own chat
        prompt; a prompt format given for it would be silently ignored)."""
        cfg = self.config
        ignored = [
            f"--env.harness.{n.replace('_', '-')}"
            for n in ("prompt_format", "template", "few_shot")
            if n in cfg.model_fields_set and getattr(cfg, n) != type(cfg).model_fields[n].default
        ]
        if ignored:
            raise ConfigError(
                f"the tool-use harness writes its own chat prompt, so {', '.join(ignored)} would "
                "be ignored: leave it out (--env.harness.system-prompt sets the system message)"
            )
        if self.option("tools") not in ("auto", "lean", "countdown"):
            raise ConfigError(
                f"harness option tools must be auto, lean or countdown, got {self.option('tools')!r}"
            )
        if self.option("tool_parser") not in ("auto", *PARSERS):
            raise ConfigError(
                f"harness option tool_parser must be auto or one of {', '.join(PARSERS)}, got "
                f"{self.option('tool_parser')!r}"
            )
        for key in ("max_tool_calls", "max_sessions", "max_result_chars"):
            v = self.option(key)
            if (
                not isinstance(v, int)
                or isinstance(v, bool)
                or v < (0 if key == "max_sessions" else 1)
            ):
                raise ConfigError(f"harness option {key} must be a positive integer, got {v!r}")

    def toolset(self, taskset: Taskset) -> str:
        """``lean`` or ``countdown``: the ``tools`` option, or (``auto``) the taskset's kind."""
        kind = str(self.option("tools"))
        if kind == "auto":
            return "countdown" if taskset.name == "countdown" else "lean"
        return kind

    def first_messages(self, task: Task, kind: str) -> list[ChatMessage]:
        """The system and user messages an episode starts from."""
        if kind == "countdown":
            system = self.config.system_prompt or _COUNTDOWN_SYSTEM
            return [
                ChatMessage(role="system", content=system),
                ChatMessage(role="user", content=task.informal_statement or task.formal_statement),
            ]
        informal = (
            f"Problem: {task.informal_statement.strip()}\n\n" if task.informal_statement else ""
        )
        code = f"```lean4\n{task.header}{task.formal_statement}\n```"
        return [
            ChatMessage(role="system", content=self.config.system_prompt or _LEAN_SYSTEM),
            ChatMessage(role="user", content=f"{informal}Prove this theorem:\n\n{code}"),
        ]

    async def run(
        self,
        tasks: Sequence[Task],
        policy: Policy,
        runtime: Runtime,
        sampling: SamplingConfig,
        taskset: Taskset,
    ) -> list[list[Rollout]]:
        self.check_config()
        kind = self.toolset(taskset)
        if kind == "lean" and not runtime.supports_tactic_sessions():
            raise ConfigError(
                f"the tool-use harness's Lean tools need a runtime with tactic sessions, and "
                f"{runtime.name!r} has none: use `local` in repl mode, `docker` or `modal`"
            )
        cap = getattr(runtime, "max_tactic_sessions", None)
        room = int(self.option("max_sessions")) or (cap if isinstance(cap, int) and cap else 8)
        limiter = asyncio.Semaphore(room)
        rules = taskset.config.policy

        def tools_for(task: Task) -> EpisodeTools:
            if kind == "countdown":
                return CountdownTools(calc_first=bool(self.option("calc_first")))
            return LeanTools(
                task,
                runtime,
                rules,
                limiter,
                max_chars=int(self.option("max_result_chars")),
                search=bool(self.option("search")),
            )

        episodes: list[_Episode] = []
        for task in tasks:
            first = self.first_messages(task, kind)
            for i in range(sampling.n):
                episodes.append(
                    _Episode(task, i, tools_for(task), first, [m.model_dump() for m in first])
                )
        if episodes:
            await self._run_episodes(episodes, policy, sampling)
        groups: list[list[Rollout]] = []
        for k, _task in enumerate(tasks):
            groups.append(
                [self._rollout(ep) for ep in episodes[k * sampling.n : (k + 1) * sampling.n]]
            )
        await check_and_reward(tasks, groups, runtime, taskset)
        return groups

    async def _run_episodes(
        self, episodes: list[_Episode], policy: Policy, sampling: SamplingConfig
    ) -> None:
        schemas = [t.schema() for t in episodes[0].tools.tools]
        mode, tok = generation_mode(policy)
        backend: TokenBackend | MessagesBackend
        parser = ""
        fmt: ChatFormat | None = None
        if mode == "messages":
            backend = MessagesBackend(policy, schemas)
        else:
            parser = str(self.option("tool_parser"))
            if parser == "auto":
                parser = detect_parser(getattr(tok, "chat_template", None))
            fmt = ChatFormat(tok, schemas)
            backend = TokenBackend(policy, fmt, ids=mode == "ids")
        jobs = [
            asyncio.ensure_future(self._episode(ep, k, backend, fmt, parser, mode, sampling))
            for k, ep in enumerate(episodes)
        ]
        try:
            await asyncio.gather(*jobs)
        except BaseException:
            for j in jobs:
                j.cancel()
            await asyncio.gather(*jobs, return_exceptions=True)
            raise
        finally:
            if isinstance(backend, TokenBackend):
                await backend.close()

    async def _episode(
        self,
        ep: _Episode,
        k: int,
        backend: TokenBackend | MessagesBackend,
        fmt: ChatFormat | None,
        parser: str,
        mode: str,
        sampling: SamplingConfig,
    ) -> None:
        cfg = self.config
        ep.mode = mode
        if fmt is not None:
            ep.prompt_ids = fmt.prompt_ids(ep.messages)
            ep.ids = list(ep.prompt_ids)
        for turn in range(cfg.max_turns):
            left = cfg.max_total_tokens - ep.tokens
            if left <= 0:
                ep.verdict = Verdict.reject(
                    Reason.TRUNCATED, f"token budget ({cfg.max_total_tokens}) ran out"
                )
                return
            s = sampling.model_copy(update={"n": 1, "max_tokens": min(sampling.max_tokens, left)})
            if isinstance(backend, MessagesBackend):
                c, parsed, assistant, gen_s = await backend.complete(ep.messages, s, turn)
                ep.messages.append(assistant)
            else:
                c, gen_s = await backend.complete(ep.ids, s, slot=k * (cfg.max_turns + 1) + turn)
                parsed = parse_turn(c.text, parser, turn)
                if not ep.turns and mode == "text" and c.prompt_token_ids:
                    ep.prompt_ids = list(c.prompt_token_ids)
            ep.gen_s += gen_s
            if c.finish_reason == "length":
                self._record(ep, c, fmt, [])
                ep.verdict = Verdict.reject(Reason.TRUNCATED, f"turn {turn + 1} was cut off")
                return
            if not parsed.calls:
                self._record(ep, c, fmt, [])
                ep.answer = ep.tools.read_text(parsed.content, c.finish_reason)
                return
            results = await self._call_all(ep, turn, parsed)
            if ep.tools.answer is not None:
                self._record(ep, c, fmt, [])
                ep.answer = ep.tools.answer
                return
            replies = [
                {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": r.text}
                for call, r in zip(parsed.calls, results, strict=True)
            ]
            self._record(ep, c, fmt, replies)
            if isinstance(backend, MessagesBackend):
                ep.messages += replies
        ep.verdict = Verdict.reject(Reason.NO_PROOF, f"nothing submitted in {cfg.max_turns} turns")

    async def _call_all(self, ep: _Episode, turn: int, parsed: ParsedTurn) -> list[ToolResult]:
        """Every call of one turn, run at once; results in the calls' order."""
        budget = int(self.option("max_tool_calls"))
        submit = ep.tools.submit_name

        async def one(call: ToolCall) -> ToolResult:
            if call.error is not None:
                return ToolResult(f"Error: {call.error}", ok=False)
            refused = ep.tools.refuse(call.name, call.arguments)
            if refused is not None:
                return refused
            if call.name != submit:
                if ep.tool_calls >= budget:
                    return ToolResult(
                        f"Error: the tool budget ({budget} calls) is spent; call {submit}",
                        ok=False,
                    )
                ep.tool_calls += 1
            t0 = time.perf_counter()
            r = await ep.tools.call(call.name, call.arguments)
            dt = time.perf_counter() - t0
            ep.tool_s += dt
            ep.log.append({"turn": turn, "tool": call.name, "ok": r.ok, "s": round(dt, 6)})
            return r

        return list(await asyncio.gather(*(one(c) for c in parsed.calls)))

    def _record(
        self,
        ep: _Episode,
        c: Completion,
        fmt: ChatFormat | None,
        replies: list[dict[str, Any]],
    ) -> None:
        """Append one turn: the model's ids and the ids of the template's rendering of the
        replies (none when the episode ends here)."""
        fb_ids: list[int] = []
        feedback = ""
        if replies:
            if fmt is not None:
                fb_ids = fmt.after_turn(c, replies)
                feedback = fmt.decode(fb_ids)
            else:
                feedback = "\n".join(f"[{r['name'] or 'error'}] {r['content']}" for r in replies)
        ep.ids += [*c.token_ids, *fb_ids]
        ep.turns.append(Turn.from_completion(c, feedback, fb_ids))
        ep.tokens += len(c.token_ids) + len(fb_ids)

    def _rollout(self, ep: _Episode) -> Rollout:
        answer = ep.answer
        verdict = ep.verdict
        if verdict is None and (answer is None or answer.proof is None):
            reason = answer.reason if answer is not None and answer.reason else Reason.NO_PROOF
            detail = answer.detail if answer is not None and answer.detail else "no answer"
            verdict = Verdict.reject(reason, detail)
        tools: dict[str, int] = {}
        for e in ep.log:
            tools[e["tool"]] = tools.get(e["tool"], 0) + 1
        return Rollout(
            task_id=ep.task.id,
            sample=ep.sample,
            prompt=ep.prompt,
            prompt_ids=ep.prompt_ids,
            turns=ep.turns,
            proof=answer.proof if verdict is None and answer is not None else None,
            preamble=answer.preamble if answer is not None else "",
            restated_statement=answer.restated_statement if answer is not None else "",
            verdict=verdict,
            timings={"generate": ep.gen_s, "tools": ep.tool_s, "tool_wait": ep.tools.wait_s},
            meta={
                "turns": len(ep.turns),
                "tokens": ep.tokens,
                "tool_calls": len(ep.log),
                "tools": tools,
                "calls": ep.log,
                "context": ep.mode,
            },
        )
