"""A small verifiers (v1) taskset for the tests, found by its id ``_vf_letters`` (verifiers
imports an id as a top-level module; tests/ is on the path). No network, no model, no runtime.

Each task asks for a word; the reward ``letters`` is the share of the word's letters that the
reply contains (dense, so a random tiny model already gets varied rewards), and ``exact`` is 1.0
when the reply says the word. A metric records the reply's length.
"""

from __future__ import annotations

from collections.abc import Iterator

import verifiers.v1 as vf

WORDS = ("cat", "dog", "owl", "emu", "yak", "ant")


class LettersData(vf.TaskData):
    """The word to say."""

    word: str


class LettersConfig(vf.TasksetConfig):
    """``count``: how many tasks (cycling over the words)."""

    count: int = 4
    offset: int = 0
    """Start at this task index (a held-out set of other words: ``offset`` past the training
    tasks)."""
    broken: bool = False
    """Make the ``letters`` reward raise (a rubric that cannot score)."""


class LettersTask(vf.Task[LettersData, vf.State, vf.TaskConfig]):
    broken = False

    @property
    def key(self) -> str:
        return f"letters-{self.data.idx}-{self.data.word}"

    @vf.reward
    async def letters(self, task: LettersData, trace: vf.Trace) -> float:
        if self.broken:
            raise RuntimeError("the judge is down")
        reply = trace.last_reply.lower()
        return sum(c in reply for c in task.word) / len(task.word) / 2

    @vf.reward
    async def exact(self, task: LettersData, trace: vf.Trace) -> float:
        # read from the message chain, as a rubric written for verifiers' harnesses would
        last = trace.messages[-1]
        return 0.5 if task.word in (last.content or "").lower() else 0.0

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class LettersTaskset(vf.Taskset[LettersTask, LettersConfig]):
    def load(self) -> Iterator[LettersTask]:
        for i in range(self.config.offset, self.config.offset + self.config.count):
            w = WORDS[i % len(WORDS)]
            data = LettersData(
                idx=i,
                name=f"say_{w}" + (f"_{i // len(WORDS)}" if i >= len(WORDS) else ""),
                word=w,
                prompt=f"Say the word {w}.",
                system_prompt="Answer with one word.",
            )
            task = LettersTask(data, self.config.task)
            task.broken = self.config.broken
            yield task


__all__ = ["LettersTaskset"]
