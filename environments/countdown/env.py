"""The Countdown environment: taskset, a pure-Python checker (its "runtime") and the harness.

A Task's ``formal_statement`` is the canonical puzzle text ``countdown: numbers 44 19 35 target
98`` (what the checker reads), its ``informal_statement`` the question the model sees, and
``extra`` holds ``numbers``, ``target`` and a known ``solution``. The harness prompts, samples,
takes the answer out of ``<answer> ... </answer>``, and has the checker judge it; a Verdict is
accepted when the answer uses every number exactly once and equals the target. No Lean runs.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from leanrl.environment import Environment
from leanrl.errors import ConfigError, DatasetError
from leanrl.harness import Harness, HarnessConfig
from leanrl.policy import Policy, Prompt, SamplingConfig
from leanrl.rollout import Rollout, Turn
from leanrl.runtime import Runtime, RuntimeConfig
from leanrl.task import Task
from leanrl.taskset import RawRow, Taskset, TasksetConfig
from leanrl.verdict import Attempt, Reason, Verdict

from .arith import check_answer

if TYPE_CHECKING:
    from leanrl.proofs import Pair

__all__ = [
    "Countdown",
    "CountdownChecker",
    "CountdownHarness",
    "CountdownTaskset",
    "parse_statement",
    "puzzle_statement",
]

DATA_DIR = Path(__file__).resolve().parent / "data"
"""The shipped puzzles (``countdown_train.jsonl``, ``countdown_test.jsonl``)."""

Style = Literal["think", "direct"]
RewardMode = Literal["paper", "dense"]

_UNSET_HARNESS: str = HarnessConfig.model_fields["name"].default
_UNSET_RUNTIME: str = RuntimeConfig.model_fields["name"].default
"""What ``env.harness.name`` / ``env.runtime.name`` hold when nobody set them."""
_TOOL_HARNESS = "tool-use"
"""The tool-calling harness, which runs Countdown with a calculator tool (the learning check
of ``benchmarks/tool_use.py``)."""

_STATEMENT = re.compile(r"^countdown: numbers ((?:-?\d+ )+)target (-?\d+)$")


def puzzle_statement(numbers: Sequence[int], target: int) -> str:
    """The canonical text of a puzzle (a Task's ``formal_statement``)."""
    return f"countdown: numbers {' '.join(str(n) for n in numbers)} target {target}"


def parse_statement(text: str) -> tuple[list[int], int]:
    """(numbers, target) of :func:`puzzle_statement` text; ValueError for anything else."""
    m = _STATEMENT.match(text.strip())
    if m is None:
        raise ValueError(f"not a Countdown statement: {text[:80]!r}")
    return [int(x) for x in m.group(1).split()], int(m.group(2))


def _question(numbers: Sequence[int], target: int) -> str:
    return (
        f"Using the numbers {list(numbers)}, create an equation that equals {target}. You can "
        "use basic arithmetic operations (+, -, *, /) and each number must be used once."
    )


class CountdownTaskset(Taskset):
    """Countdown puzzles: reach a target with given numbers and + - × ÷ (1,000 train, 200 test
    shipped with leanrl; ``generate.py`` makes more). Rewards: ``paper`` (TinyZero's rule, used
    by Qiu et al. 2025: 1 for a correct answer, 0.1 for any other answer in the tags, 0
    without one) or ``dense`` (partial credit for using the given numbers and for getting
    close, for small models learning from scratch; not the paper's)."""

    name = "countdown"
    description = "Countdown arithmetic puzzles (reach a target with + - * /), pure-Python reward"
    hub_id = None
    default_split = "test"
    reward_mode: RewardMode = "paper"

    def __init__(self, config: TasksetConfig | None = None, reward: RewardMode = "paper") -> None:
        super().__init__(config)
        self.reward_mode = reward

    def load_rows(self) -> Iterable[RawRow]:
        if self.config.path is not None:
            yield from super().load_rows()
            return
        for path in sorted(DATA_DIR.glob("countdown_*.jsonl")):
            yield from self._rows_from_path(path)

    def row_to_task(self, row: RawRow) -> Task:
        d = row.data
        try:
            numbers = [int(x) for x in d["numbers"]]
            target = int(d["target"])
            name = str(d.get("name") or f"countdown_{row.index}")
        except (KeyError, TypeError, ValueError) as e:
            raise DatasetError(
                f"{row.origin}, row {row.index}: a Countdown row needs 'numbers' (a list of "
                f"integers) and 'target' (an integer): {e}"
            ) from None
        if not 2 <= len(numbers) <= 8:
            raise DatasetError(f"{row.origin}, row {row.index}: 2 to 8 numbers, got {numbers}")
        return Task(
            name=name,
            header="",
            formal_statement=puzzle_statement(numbers, target),
            informal_statement=_question(numbers, target),
            split=d.get("split"),
            source=row.origin,
            category=f"{len(numbers)}-numbers",
            extra={"numbers": numbers, "target": target, "solution": d.get("solution")},
        )

    def group_rewards(self, task: Task, rollouts: Sequence[Rollout]) -> list[float]:
        return [self.answer_reward(task, r) for r in rollouts]

    def answer_reward(self, task: Task, r: Rollout) -> float:
        """The reward of one rollout (see the class docstring for the two modes)."""
        if r.verdict is not None and r.verdict.accepted:
            return 1.0
        if r.proof is None or not r.proof.strip():
            return 0.0
        if self.reward_mode == "paper":
            return 0.1
        numbers, target = task.extra["numbers"], task.extra["target"]
        # 0.1 for an answer; up to 0.4 for the given numbers appearing in it; up to 0.4 more
        # for closeness once it is an expression over the given numbers only (other literals
        # forfeit that part). 1.0 is kept for a correct answer.
        literals = Counter(int(x) for x in re.findall(r"\d+", r.proof)[:64])
        given = Counter(numbers)
        hits = sum((literals & given).values())
        score = 0.1 + 0.4 * hits / len(numbers)
        c = check_answer(r.proof, numbers, target)
        if c.parsed and not c.foreign and c.value is not None:
            miss = abs(float(c.value) - target) / max(abs(target), 1)
            score += 0.4 * max(0.0, 1.0 - miss)
        return min(score, 0.9)


class CountdownChecker(Runtime):
    """Judges Countdown answers in Python (the Countdown environment's runtime; no Lean)."""

    name = "countdown"
    description = "pure-Python checker of Countdown answers (no Lean)"

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        self.checked = 0

    def metrics(self) -> dict[str, float]:
        return {"checked": float(self.checked)}

    async def check(self, attempts: Sequence[Attempt]) -> list[Verdict]:
        out = []
        for a in attempts:
            t0 = time.perf_counter()
            try:
                numbers, target = parse_statement(a.formal_statement)
            except ValueError as e:
                out.append(Verdict.reject(Reason.INFRA, str(e), id=a.id))
                continue
            c = check_answer(a.proof, numbers, target)
            self.checked += 1
            dt = time.perf_counter() - t0
            if c.correct:
                out.append(Verdict(accepted=True, reason=Reason.OK, time_s=dt, id=a.id))
            else:
                out.append(Verdict.reject(Reason.ERROR, c.detail, time_s=dt, id=a.id))
        return out


_ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.S)


class CountdownHarness(Harness):
    """One turn: the question, the model's work, the expression in ``<answer>`` tags.

    ``options.style``: ``think`` (the TinyZero prompt Qiu et al. 2025 used: reason in
    ``<think>`` tags, answer in ``<answer>`` tags) or ``direct`` (the prompt ends in
    ``<answer>``, so the completion is the expression; for small models).
    """

    name = "countdown"
    description = "Countdown: one turn, the answer in <answer> tags"
    option_keys = frozenset({"style", "reward"})  # reward: read by the environment

    def check_config(self) -> None:
        """The style option, and no prompt format: this harness writes its own prompt, so a
        ``prompt_format`` (or template, few-shot file) given for it would be silently ignored."""
        _ = self.style
        cfg = self.config
        ignored = [
            f"--env.harness.{name.replace('_', '-')}"
            for name in ("prompt_format", "template", "few_shot")
            if name in cfg.model_fields_set
            and getattr(cfg, name) != type(cfg).model_fields[name].default
        ]
        if ignored:
            raise ConfigError(
                f"the countdown harness writes its own prompt, so {', '.join(ignored)} would be "
                "ignored: leave it out, and choose the prompt with --env.harness.options "
                """'{"style": "direct"}' (or "think", the default)"""
            )

    @property
    def style(self) -> Style:
        s = self.config.options.get("style", "think")
        if s not in ("think", "direct"):
            raise ConfigError(
                f"harness option style must be 'think' or 'direct', got {s!r} "
                """(--env.harness.options '{"style": "direct"}')"""
            )
        return s  # type: ignore[no-any-return]

    def prompt(self, task: Task) -> str:
        q = task.informal_statement or task.formal_statement
        if self.style == "direct":
            return f"{q}\nAnswer: <answer>"
        return (
            f"{q} Show your work in <think> </think> tags. And return the final answer in "
            "<answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>.\n"
            "Let me solve this step by step.\n<think>"
        )

    def sft_example(self, pair: Pair, target: str = "proof") -> tuple[Prompt, str]:
        """This harness's prompt and the answer to train on: ``direct``: the expression and the
        closing tag; ``think``: the expression in ``<answer>`` tags after an empty ``<think>``
        (a bare solution has no reasoning to train on). ``target = "completion"``: the model's
        own text, closed with the ``</answer>`` generation stopped at."""
        prompt = self.prompt(pair.task)
        if target == "completion" and pair.completion.strip():
            text = pair.completion
            return prompt, text if text.rstrip().endswith("</answer>") else text + "</answer>"
        expr = pair.proof.strip()  # a dataset's proof comes with a Lean body's leading newline
        if self.style == "direct":
            return prompt, f"{expr}</answer>"
        return prompt, f"</think>\n<answer> {expr} </answer>"

    def answer(self, completion: str) -> str | None:
        """The expression in the completion, or None when there is none."""
        if self.style == "direct":
            text = completion.split("</answer>", 1)[0]
            return text.strip() or None
        found = _ANSWER.findall(completion)
        return found[-1].strip() if found and found[-1].strip() else None

    async def generate(
        self, tasks: Sequence[Task], policy: Policy, sampling: SamplingConfig
    ) -> list[list[Rollout]]:
        """Sample and take the answers out, without checking them (``run`` checks them next;
        ``leanrl eval --generate-only`` stops here): ``verdict`` is None, or the rejection of a
        completion with no answer."""
        prompts = [self.prompt(t) for t in tasks]
        if not sampling.stop:
            sampling = sampling.model_copy(update={"stop": ["</answer>"]})
        t0 = time.perf_counter()
        completions = await policy.generate(prompts, sampling)
        gen_s = time.perf_counter() - t0
        groups: list[list[Rollout]] = []
        for task, prompt, comps in zip(tasks, prompts, completions, strict=True):
            group = []
            for i, c in enumerate(comps):
                ans = self.answer(c.text)
                r = Rollout(
                    task_id=task.id,
                    sample=i,
                    prompt=prompt,
                    prompt_ids=list(c.prompt_token_ids),
                    turns=[Turn.from_completion(c)],
                    proof=ans,
                    timings={"generate_batch": gen_s},
                )
                if ans is None:
                    r.verdict = Verdict.reject(Reason.NO_PROOF, "no <answer> in the completion")
                group.append(r)
            groups.append(group)
        return groups

    async def run(
        self,
        tasks: Sequence[Task],
        policy: Policy,
        runtime: Runtime,
        sampling: SamplingConfig,
        taskset: Taskset,
    ) -> list[list[Rollout]]:
        groups = await self.generate(tasks, policy, sampling)
        pending: list[tuple[Rollout, Attempt]] = [
            (
                r,
                Attempt(
                    name=task.name,
                    header="",
                    formal_statement=task.formal_statement,
                    proof=r.proof,
                    id=f"{task.id}/{r.sample}",
                ),
            )
            for task, group in zip(tasks, groups, strict=True)
            for r in group
            if r.verdict is None and r.proof is not None
        ]
        if pending:
            verdicts = await runtime.check([a for _, a in pending])
            for (r, _), v in zip(pending, verdicts, strict=True):
                r.verdict = v
                r.timings["verify"] = v.time_s
        for task, group in zip(tasks, groups, strict=True):
            for r, reward in zip(group, taskset.group_rewards(task, group), strict=True):
                r.reward = reward
        return groups


class Countdown(Environment):
    """Countdown with its own harness and pure-Python checker. ``env.harness.options``:
    ``style`` (``think``/``direct``) and ``reward`` (``paper``/``dense``). Another harness, or
    any runtime, is refused: nothing else would be used, and the run would name it anyway."""

    name = "countdown"
    description = CountdownTaskset.description
    taskset_class: ClassVar[type[Taskset]] = CountdownTaskset
    needs_lean = False

    def check_config(self) -> None:
        """Refuse a harness other than Countdown's own and any runtime. The names an unset
        field holds (``whole-proof``, ``local``) pass: configs are copied whole between
        commands (``compare``, Modal jobs), so an unset name cannot be told from a given one."""
        harness, runtime = self.config.harness.name, self.config.runtime.name
        if harness not in (CountdownHarness.name, _UNSET_HARNESS, _TOOL_HARNESS):
            raise ConfigError(
                f"environment 'countdown' has its own harness, and harness {harness!r} cannot "
                "work on it: leave --harness (--env.harness.name) out, or give --harness "
                "countdown; its settings are --env.harness.options style (think, direct) and "
                "reward (paper, dense). (--harness tool-use runs it with a calc tool.)"
            )
        if runtime not in (CountdownChecker.name, _UNSET_RUNTIME):
            raise ConfigError(
                f"environment 'countdown' takes no runtime (got {runtime!r}): its answers are "
                "checked in Python by its own checker, with no Lean, on the machine that runs "
                "the command. Leave --runtime (--env.runtime.name) out"
            )

    def make_taskset(self) -> Taskset:
        mode = self.config.harness.options.get("reward", "paper")
        if mode not in ("paper", "dense"):
            raise DatasetError(f"harness option reward must be 'paper' or 'dense', got {mode!r}")
        return CountdownTaskset(self.config.taskset, reward=mode)

    def make_harness(self) -> Harness:
        if self.config.harness.name == _TOOL_HARNESS:
            return super().make_harness()  # the calc and submit tools (harnesses/tool_use)
        return CountdownHarness(self.config.harness)

    def make_runtime(self) -> Runtime:
        return CountdownChecker(self.config.runtime)
