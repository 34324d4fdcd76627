"""The ``external`` harness: an outside agent program is the harness.

``--harness external --env.harness.options '{"command": "python my_agent.py"}'``: for each
episode leanrl starts the program with ``OPENAI_BASE_URL`` pointing at a loopback endpoint
(``endpoint.py``) backed by the policy being evaluated or trained, and its own
``OPENAI_API_KEY``. The program uses any OpenAI client as usual; each request is answered by the
policy and recorded with its token ids and log-probs (``session.py``), so the episode becomes a
token-exact rollout for GRPO without the program knowing. Its environment also says where its
task and Lean tools are:

==================  ================================================================
``OPENAI_BASE_URL``  ``http://127.0.0.1:PORT/v1``
``OPENAI_API_KEY``   the episode's key (routes its requests; dies with the episode)
``LEANRL_MODEL``     the model name to send
``LEANRL_TOOLS_URL``  ``http://127.0.0.1:PORT/leanrl`` (``/task``, ``/tools``, ``/tools/NAME``)
``LEANRL_TASK``      the task as JSON (also the program's stdin)
``LEANRL_EPISODE``   ``task_id/sample``
==================  ================================================================

The proof is what the program hands in with the ``submit`` tool, or else the Lean code block in
what it prints on stdout (read as the whole-proof harness reads a completion); the trusted
judge checks it after the episode like any attempt. Each episode is bounded: ``timeout_s`` of
wall time (then its process group is killed), ``max_turns`` model requests and
``max_total_tokens`` tokens (requests past them get HTTP 400), ``max_tool_calls`` tool calls.
A program that crashes, hangs or cannot start costs its episode only: that rollout has no proof
and says why in its verdict detail and ``meta``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
from collections.abc import Sequence
from typing import Any

from leanrl.errors import ConfigError
from leanrl.harness import Harness
from leanrl.policy import Policy, SamplingConfig
from leanrl.rollout import Rollout
from leanrl.runtime import Runtime
from leanrl.task import Task
from leanrl.taskset import Taskset
from leanrl.verdict import Reason, Verdict

from ..tool_use.calls import PARSERS, detect_parser
from ..tool_use.chat import ChatFormat, MessagesBackend, TokenBackend, generation_mode
from ..tool_use.lean_tools import LeanTools
from ..whole_proof.harness import check_and_reward
from .endpoint import Endpoint
from .program import ProgramResult, run_program
from .session import Session

__all__ = ["ExternalHarness"]

_DEFAULTS: dict[str, Any] = {
    "command": None,
    "timeout_s": 600.0,
    "concurrency": 8,
    "max_tool_calls": 32,
    "tool_parser": "auto",
    "max_sessions": 0,
    "max_result_chars": 4000,
    "search": True,
    "cwd": None,
    "env": {},
    "max_output_chars": 1 << 20,
}


class ExternalHarness(Harness):
    """An outside agent program per episode; its model requests are the policy's turns."""

    name = "external"
    description = (
        "an outside agent program per episode, talking to the policy through a loopback "
        "OpenAI endpoint that records its turns token-exactly"
    )
    option_keys = frozenset(_DEFAULTS)

    def option(self, key: str) -> Any:
        """``config.options[key]``, or its default."""
        return self.config.options.get(key, _DEFAULTS[key])

    def argv(self) -> list[str]:
        """The program's command line (``command``: a string, split like a shell would, or a
        list of arguments)."""
        cmd = self.option("command")
        if isinstance(cmd, str) and cmd.strip():
            return shlex.split(cmd)
        if isinstance(cmd, list) and cmd and all(isinstance(a, str) for a in cmd):
            return list(cmd)
        raise ConfigError(
            "the external harness needs the agent program to run: --env.harness.options "
            """'{"command": "python my_agent.py"}'"""
        )

    def check_config(self) -> None:
        """The command and the numbers, up front."""
        self.argv()
        for key in ("timeout_s", "concurrency", "max_tool_calls", "max_result_chars"):
            v = self.option(key)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"harness option {key} must be a positive number, got {v!r}")
        if self.option("tool_parser") not in ("auto", *PARSERS):
            raise ConfigError(
                f"harness option tool_parser must be auto or one of {', '.join(PARSERS)}"
            )
        env = self.option("env")
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise ConfigError("harness option env must be an object of strings")

    async def run(
        self,
        tasks: Sequence[Task],
        policy: Policy,
        runtime: Runtime,
        sampling: SamplingConfig,
        taskset: Taskset,
    ) -> list[list[Rollout]]:
        self.check_config()
        argv = self.argv()
        mode, tok = generation_mode(policy)
        fmt: ChatFormat | None = None
        parser = ""
        backend: TokenBackend | MessagesBackend
        if mode == "messages":
            backend = MessagesBackend(policy, [])
        else:
            parser = str(self.option("tool_parser"))
            if parser == "auto":
                try:
                    parser = detect_parser(getattr(tok, "chat_template", None))
                except ConfigError:
                    parser = ""  # requests that offer tools are refused, others work
            fmt = ChatFormat(tok, [])
            backend = TokenBackend(policy, fmt, ids=mode == "ids")
        cap = getattr(runtime, "max_tactic_sessions", None)
        room = int(self.option("max_sessions")) or (cap if isinstance(cap, int) and cap else 8)
        limiter = asyncio.Semaphore(room)
        sessions: list[Session] = []
        for task in tasks:
            for i in range(sampling.n):
                tools = LeanTools(
                    task,
                    runtime,
                    taskset.config.policy,
                    limiter,
                    max_chars=int(self.option("max_result_chars")),
                    search=bool(self.option("search")),
                )
                s = Session(
                    len(sessions),
                    task,
                    tools,
                    sample=i,
                    max_turns=self.config.max_turns,
                    max_total_tokens=self.config.max_total_tokens,
                    max_tool_calls=int(self.option("max_tool_calls")),
                )
                sessions.append(s)
        endpoint = Endpoint(policy, sampling, backend, fmt, parser)
        await endpoint.start()
        gate = asyncio.Semaphore(int(self.option("concurrency")))
        results: list[ProgramResult | None] = [None] * len(sessions)

        async def episode(s: Session) -> None:
            async with gate:
                endpoint.open(s)
                try:
                    results[s.index] = await self._program(argv, endpoint, s)
                finally:
                    endpoint.close_session(s)

        try:
            await asyncio.gather(*(episode(s) for s in sessions))
        finally:
            await endpoint.close()
            if isinstance(backend, TokenBackend):
                await backend.close()
        failed = next((e for s in sessions for e in s.errors), None)
        if failed is not None:
            raise failed  # the policy (or leanrl) failed, not the agent program
        groups = [
            [
                self._rollout(s, results[s.index], mode)
                for s in sessions[k * sampling.n : (k + 1) * sampling.n]
            ]
            for k in range(len(tasks))
        ]
        await check_and_reward(tasks, groups, runtime, taskset)
        return groups

    async def _program(self, argv: list[str], endpoint: Endpoint, s: Session) -> ProgramResult:
        task_json = json.dumps(
            {
                "id": s.task.id,
                "name": s.task.name,
                "header": s.task.header,
                "formal_statement": s.task.formal_statement,
                "informal_statement": s.task.informal_statement,
            }
        )
        env = {
            **os.environ,
            **self.option("env"),
            "OPENAI_BASE_URL": f"{endpoint.base_url}/v1",
            "OPENAI_API_KEY": s.key,
            "LEANRL_MODEL": endpoint.model,
            "LEANRL_TOOLS_URL": f"{endpoint.base_url}/leanrl",
            "LEANRL_TASK": task_json,
            "LEANRL_EPISODE": f"{s.task.id}/{s.sample}",
        }
        return await run_program(
            argv,
            env=env,
            stdin=(task_json + "\n").encode(),
            timeout_s=float(self.option("timeout_s")),
            cwd=self.option("cwd"),
            max_output=int(self.option("max_output_chars")),
        )

    def _rollout(self, s: Session, result: ProgramResult | None, mode: str) -> Rollout:
        seg = s.best()
        answer = s.tools.answer
        if answer is None and result is not None and result.stdout.strip():
            answer = s.tools.read_text(result.stdout, "stop")
        verdict: Verdict | None = None
        how = result.describe() if result is not None else "the agent program never ran"
        if answer is None or answer.proof is None:
            why = answer.detail if answer is not None and answer.detail else "nothing submitted"
            reason = answer.reason if answer is not None and answer.reason else Reason.NO_PROOF
            verdict = Verdict.reject(reason, f"{why}; {how}")
        tools: dict[str, int] = {}
        for e in s.log:
            tools[e["tool"]] = tools.get(e["tool"], 0) + 1
        return Rollout(
            task_id=s.task.id,
            sample=s.sample,
            prompt=seg.prompt if seg is not None else "",
            prompt_ids=seg.prompt_ids if seg is not None else [],
            turns=seg.turns if seg is not None else [],
            proof=answer.proof if verdict is None and answer is not None else None,
            preamble=answer.preamble if answer is not None else "",
            restated_statement=answer.restated_statement if answer is not None else "",
            verdict=verdict,
            timings={
                "generate": s.gen_s,
                "tools": s.tool_s,
                "program": result.seconds if result is not None else 0.0,
            },
            meta={
                "requests": s.requests,
                "segments": len(s.segments),
                "turns_recorded": sum(len(g.turns) for g in s.segments),
                "turns": len(seg.turns) if seg is not None else 0,
                "tokens": s.tokens,
                "tool_calls": len(s.log),
                "tools": tools,
                "refused_requests": s.refused,
                "exit_code": result.returncode if result is not None else None,
                "timed_out": bool(result and result.timed_out),
                "program": how,
                "stderr_tail": (result.stderr[-500:] if result is not None else ""),
                "context": mode,
            },
        )
