"""The ``verifiers`` environment: a PrimeIntellect verifiers (v1) taskset as a leanrl Environment.

``--env verifiers --env.harness.options '{"env": "<taskset id>", "taskset": {...}}'`` loads the
verifiers taskset by its id (verifiers' own resolution: an installed package or module of that
name) and trains or evaluates leanrl's policy on it, with no Lean (``needs_lean = False``):

* **Tasks** are the taskset's tasks; each becomes a leanrl :class:`~leanrl.Task` whose id is the
  verifiers task key, whose ``informal_statement`` is the prompt text and whose
  ``formal_statement`` is the canonical line ``verifiers <id>: <key>`` (no Lean statement).
* **Rollouts**: one chat turn through leanrl's policy (the task's system prompt and prompt),
  so the token ids and log-probs are leanrl's own and ``train grpo`` / ``train es`` /
  ``train expert-iteration`` / ``leanrl compare`` consume them as from any harness.
* **Rewards** come from the verifiers task's own ``@vf.reward`` functions and judges
  (``Task.score`` on a verifiers ``Trace`` holding the conversation): the reward is the
  trace's weighted sum; a reward at or above ``solved_at`` (default 1.0) counts as solved
  (an accepted verdict, for pass@k and kept proofs). Scoring that fails (``vf.TaskError``:
  the reward could not be computed) is an ``infra`` verdict, never a 0 to learn from.

Not run: verifiers' own harness programs (multi-turn agents, tool servers in sandboxes).
Signals that need a verifiers runtime (a box to run code in) are skipped by verifiers'
offline scoring; a task left with no reward at all is refused, so no run trains on nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from leanrl._dist import require
from leanrl.environment import Environment
from leanrl.errors import ConfigError
from leanrl.harness import Harness, HarnessConfig
from leanrl.policy import ChatMessage, Policy, Prompt, SamplingConfig
from leanrl.rollout import Rollout, Turn
from leanrl.runtime import Runtime, RuntimeConfig
from leanrl.task import Task
from leanrl.taskset import RawRow, Taskset, TasksetConfig
from leanrl.verdict import Attempt, Reason, Verdict

if TYPE_CHECKING:
    from leanrl.proofs import Pair

__all__ = ["VerifiersEnvironment", "VerifiersHarness", "VerifiersScorer", "VerifiersTaskset"]

_UNSET_HARNESS: str = HarnessConfig.model_fields["name"].default
_UNSET_RUNTIME: str = RuntimeConfig.model_fields["name"].default
OPTION_KEYS = frozenset({"env", "taskset", "solved_at"})
_HOW = '--env.harness.options \'{"env": "<verifiers taskset id>", "taskset": {...}}\''


def _vf() -> Any:
    """verifiers' v1 API, or a one-line ConfigError naming the extra."""
    return require("verifiers.v1", "verifiers", "environment 'verifiers' (Python 3.11+)")


def _messages(system: str | None, prompt: Any) -> list[ChatMessage]:
    """A verifiers prompt (text or messages) as leanrl chat messages."""
    out = [ChatMessage(role="system", content=system)] if system else []
    if isinstance(prompt, str):
        out.append(ChatMessage(role="user", content=prompt))
        return out
    for m in prompt or []:
        content = (
            m.content if isinstance(m.content, str) else _vf().TaskData(prompt=[m]).prompt_text
        )
        if m.role not in ("system", "user", "assistant"):
            raise ConfigError(
                f"a verifiers prompt with a {m.role!r} message cannot be sampled by leanrl's "
                "one-turn chat; use tasks whose prompt is system, user and assistant turns"
            )
        out.append(ChatMessage(role=m.role, content=content or ""))
    return out


class VerifiersTaskset(Taskset):
    """The tasks of a verifiers taskset (loaded by id through verifiers' plugin loader)."""

    name = "verifiers"
    description = "a verifiers (v1) taskset, rewarded by its own rubric (no Lean)"
    default_split = None  # verifiers tasks carry no split

    def __init__(self, config: TasksetConfig | None = None, options: dict[str, Any] | None = None):
        super().__init__(config)
        opts = options or {}
        self.vf_id: str = str(opts.get("env") or "")
        if not self.vf_id:
            raise ConfigError(f"environment 'verifiers' needs the taskset to wrap: {_HOW}")
        taskset_opts = opts.get("taskset") or {}
        if not isinstance(taskset_opts, dict):
            raise ConfigError(f"harness option taskset must be a JSON object, got {taskset_opts!r}")
        self.vf_options: dict[str, Any] = dict(taskset_opts)
        self.solved_at = float(opts.get("solved_at", 1.0))
        self._vf_taskset: Any = None
        self.vf_tasks: dict[str, Any] = {}
        """The verifiers Task of each leanrl task id (filled by :meth:`load_rows`)."""

    @property
    def vf_taskset(self) -> Any:
        """The verifiers taskset, loaded on first use."""
        if self._vf_taskset is None:
            _vf()
            from verifiers.v1.utils.loaders import load_taskset, taskset_config_type

            try:
                cfg_type = taskset_config_type(self.vf_id)
                cfg = cfg_type.model_validate({**self.vf_options, "id": self.vf_id})
            except (ModuleNotFoundError, TypeError, ValueError, AttributeError) as e:
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise ConfigError(
                    f"verifiers taskset {self.vf_id!r} cannot be loaded: {first}. Install the "
                    "package that provides it, or fix the harness option taskset"
                ) from None
            self._vf_taskset = load_taskset(cfg)
        return self._vf_taskset

    def load_rows(self) -> Iterable[RawRow]:
        ts = self.vf_taskset
        limit = self.config.limit
        if not ts.bounded and limit is None:
            raise ConfigError(
                f"verifiers taskset {self.vf_id!r} is endless; bound it with --env.taskset.limit"
            )
        tasks = itertools.islice(iter(ts), limit) if limit is not None else iter(ts)
        for i, t in enumerate(tasks):
            key = str(t.key)
            self.vf_tasks[key] = t
            yield RawRow(origin=f"verifiers:{self.vf_id}", index=i, data={"key": key})

    def row_to_task(self, row: RawRow) -> Task:
        key = row.data["key"]
        t = self.vf_tasks[key]
        prompt = _messages(t.data.system_prompt, t.data.prompt)
        return Task(
            id=key,
            name=str(t.data.name or t.data.id or key),
            header="",
            formal_statement=f"verifiers {self.vf_id}: {key}",
            informal_statement=t.data.prompt_text,
            source=row.origin,
            extra={"vf_index": row.index, "prompt": [m.model_dump() for m in prompt]},
        )

    def group_rewards(self, task: Task, rollouts: Sequence[Rollout]) -> list[float]:
        """The verifiers rubric's rewards (the harness scored each rollout)."""
        return [float(r.meta.get("verifiers_reward", 0.0)) for r in rollouts]


class VerifiersScorer(Runtime):
    """The environment's "runtime": nothing to start, no Lean. Rewards come from the verifiers
    task's rubric in the harness, so attempts are never sent here."""

    name = "verifiers"
    description = "scores with the verifiers task's rubric (no Lean)"

    async def check(self, attempts: Sequence[Attempt]) -> list[Verdict]:
        raise ConfigError(
            "environment 'verifiers' scores answers with the verifiers task's rubric, not with a "
            "Lean checker: `leanrl verify` does not apply to it (use `leanrl eval --env verifiers`)"
        )


class VerifiersHarness(Harness):
    """One chat turn per attempt through leanrl's policy; the verifiers rubric scores it."""

    name = "verifiers"
    description = "verifiers: one chat turn, rewarded by the verifiers task's rubric"
    option_keys = OPTION_KEYS

    def __init__(
        self, config: HarnessConfig | None = None, taskset: VerifiersTaskset | None = None
    ):
        super().__init__(config)
        self.taskset = taskset

    def prompt(self, task: Task) -> list[ChatMessage]:
        """The verifiers task's system prompt and prompt. A task rebuilt from a kept proof
        (``train sft``, expert iteration: no ``extra``) takes them from the taskset by id,
        else its ``informal_statement`` (the prompt text) is the user turn."""
        stored = task.extra.get("prompt")
        if stored is None and self.taskset is not None:
            known = {t.id: t for t in self.taskset.tasks()}.get(task.id)
            stored = known.extra.get("prompt") if known is not None else None
        if stored is None:
            return [ChatMessage(role="user", content=task.informal_statement or "")]
        return [ChatMessage.model_validate(m) for m in stored]

    def sft_example(self, pair: Pair, target: str = "proof") -> tuple[Prompt, str]:
        """The task's prompt and the reply to train on (the kept reply is the whole answer)."""
        text = pair.completion if target == "completion" and pair.completion.strip() else pair.proof
        return self.prompt(pair.task), text

    async def generate(
        self, tasks: Sequence[Task], policy: Policy, sampling: SamplingConfig
    ) -> list[list[Rollout]]:
        """Sample without scoring (``--generate-only``): the reply is the rollout's ``proof``."""
        prompts: list[Prompt] = [self.prompt(t) for t in tasks]
        t0 = time.perf_counter()
        completions = await policy.generate(prompts, sampling)
        gen_s = time.perf_counter() - t0
        return [
            [
                Rollout(
                    task_id=task.id,
                    sample=i,
                    prompt=prompt,
                    prompt_ids=list(c.prompt_token_ids),
                    turns=[Turn.from_completion(c)],
                    proof=c.text,
                    timings={"generate_batch": gen_s},
                )
                for i, c in enumerate(comps)
            ]
            for task, prompt, comps in zip(tasks, prompts, completions, strict=True)
        ]

    async def run(
        self,
        tasks: Sequence[Task],
        policy: Policy,
        runtime: Runtime,
        sampling: SamplingConfig,
        taskset: Taskset,
    ) -> list[list[Rollout]]:
        if not isinstance(taskset, VerifiersTaskset):
            raise ConfigError("the verifiers harness runs only on the verifiers environment")
        groups = await self.generate(tasks, policy, sampling)
        jobs = [
            self._score(taskset, task, r)
            for task, group in zip(tasks, groups, strict=True)
            for r in group
        ]
        await asyncio.gather(*jobs)
        for task, group in zip(tasks, groups, strict=True):
            for r, reward in zip(group, taskset.group_rewards(task, group), strict=True):
                r.reward = reward
        return groups

    async def _score(self, taskset: VerifiersTaskset, task: Task, r: Rollout) -> None:
        """Score one reply with the verifiers task (rewards, judges) and set its verdict."""
        vf = _vf()
        vf_task = taskset.vf_tasks[task.id]
        trace = vf.Trace(
            task=vf.TraceTask(type=type(vf_task).__name__, data=vf_task.data),
            agent=vf.AgentInfo(config=vf.AgentConfig()),
            nodes=_nodes(vf, r),
            root_reply=r.proof or "",
        )
        t0 = time.perf_counter()
        try:
            await vf_task.score(trace)
        except vf.TaskError as e:  # the rubric could not score: not the answer's fault
            r.verdict = Verdict.reject(Reason.INFRA, f"verifiers scoring: {e}", id=r.task_id)
            r.meta["verifiers_reward"] = 0.0
            return
        dt = time.perf_counter() - t0
        if not trace.rewards:
            raise ConfigError(
                f"verifiers task {task.id!r} of {taskset.vf_id!r} gave no reward: its reward "
                "functions all need a verifiers runtime (a box), which leanrl does not run"
            )
        reward = float(trace.reward)
        r.meta["verifiers_reward"] = reward
        r.meta["verifiers_rewards"] = {
            k: v.model_dump(mode="json") for k, v in trace.rewards.items()
        }
        if trace.metrics:
            r.meta["verifiers_metrics"] = dict(trace.metrics)
        if trace.info:
            r.meta["verifiers_info"] = dict(trace.info)
        r.timings["verify"] = dt
        if reward >= taskset.solved_at:
            r.verdict = Verdict(accepted=True, reason=Reason.OK, time_s=dt, id=r.task_id)
        else:
            r.verdict = Verdict.reject(
                Reason.ERROR,
                f"verifiers reward {reward:g} < solved_at {taskset.solved_at:g}",
                time_s=dt,
                id=r.task_id,
            )


def _nodes(vf: Any, r: Rollout) -> list[Any]:
    """The conversation as a verifiers trace's message chain (prompt, then the sampled reply),
    so that rewards reading ``trace.messages`` see it as they would after a verifiers run."""
    prompt = (
        r.prompt if isinstance(r.prompt, list) else [ChatMessage(role="user", content=r.prompt)]
    )
    wire = [{"role": m.role, "content": m.content} for m in prompt]
    reply = r.turns[-1] if r.turns else None
    wire.append({"role": "assistant", "content": reply.completion if reply else ""})
    nodes = []
    for i, m in enumerate(wire):
        last = i == len(wire) - 1
        nodes.append(
            vf.MessageNode(
                parent=i - 1 if i else None,
                message=m,
                sampled=last,
                token_ids=list(reply.completion_ids) if last and reply else [],
            )
        )
    return nodes


class VerifiersEnvironment(Environment):
    """A verifiers (v1) taskset, trained and evaluated by leanrl with no Lean."""

    name = "verifiers"
    description = VerifiersTaskset.description
    taskset_class: ClassVar[type[Taskset]] = VerifiersTaskset
    needs_lean = False

    def check_config(self) -> None:
        harness, runtime = self.config.harness.name, self.config.runtime.name
        if harness not in (VerifiersHarness.name, _UNSET_HARNESS):
            raise ConfigError(
                f"environment 'verifiers' has its own harness (one chat turn, the verifiers "
                f"rubric's reward), and harness {harness!r} cannot work on it: leave --harness "
                f"out; its settings are {_HOW}"
            )
        if runtime not in (VerifiersScorer.name, _UNSET_RUNTIME):
            raise ConfigError(
                f"environment 'verifiers' takes no runtime (got {runtime!r}): the verifiers "
                "task's rubric scores the answers in this process. Leave --runtime out"
            )

    def make_taskset(self) -> Taskset:
        return VerifiersTaskset(self.config.taskset, dict(self.config.harness.options))

    def make_harness(self) -> Harness:
        ts = self.taskset
        assert isinstance(ts, VerifiersTaskset)
        return VerifiersHarness(self.config.harness, ts)

    def make_runtime(self) -> Runtime:
        return VerifiersScorer(self.config.runtime)
