"""The eval's progress display: attempts done, tokens generated and tokens/s as they happen.

A run with long completions can spend minutes inside one ``generate`` call (8,192 tokens on a
CPU), so attempts alone would sit at 0 for that long and the run would look hung. The policy
reports tokens as it decodes (:attr:`leanrl.Policy.on_tokens`: every decoding step for ``hf``
and ``vllm``'s stream, every response for ``openai``) and finished completions
(:attr:`leanrl.Policy.on_completions`); the runtime reports verdicts. What is shown:

* on a terminal, a tqdm bar over attempts with the tokens, tokens/s, attempts/s and the pass
  rate beside it, redrawn at least every second (the elapsed time moves even while a server
  has not answered yet); log lines written meanwhile go above the bar, not into it;
* otherwise (stderr to a file or a pipe, where a bar's carriage returns would write the same
  line again and again), one plain line every :attr:`Progress.line_every_s` seconds and a last
  one at the end;
* with a ``label`` (the trainers' held-out evaluations, ``leanrl compare``), the same lines as
  log records of ``leanrl.eval``, prefixed by the label, so they interleave with the trainer's
  own step lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from leanrl.eval.config import EvalConfig
from leanrl.eval.store import ResultStore
from leanrl.task import Task

__all__ = ["Progress"]

log = logging.getLogger("leanrl.eval")


class Progress:
    """The progress of one eval run (see the module docstring). Thread-safe: the policy's
    worker thread reports tokens and completions, the event loop verdicts and chunks."""

    line_every_s: ClassVar[float] = 30.0
    """Seconds between two plain progress lines (no terminal, or a labelled run)."""
    redraw_every_s: ClassVar[float] = 0.5
    """Least seconds between two redraws of the terminal bar on token reports."""
    tick_s: ClassVar[float] = 1.0
    """Seconds between two :meth:`tick` calls of :meth:`ticker`."""

    def __init__(
        self,
        config: EvalConfig,
        tasks: Sequence[Task],
        store: ResultStore,
        *,
        by_generation: bool = False,
        label: str | None = None,
        stream: Any = None,
    ) -> None:
        self.n = config.samples
        self._lock = threading.Lock()
        self.by_generation = by_generation  # the bar moves as completions are generated
        self.generated_n = 0  # completions generated in this run
        self.tokens = 0  # tokens the policy reported generating in this run
        self.recorded_tokens = 0  # tokens of the attempts recorded by this run
        self.store = store
        self.generate_only = config.generate_only
        self.label = label
        self.t0 = time.perf_counter()
        self.new = 0  # attempts recorded by this run
        self.verdicts = 0  # verdicts that arrived in this run (some not recorded yet)
        done = [t for t in tasks if self._complete(t)]
        self.done = len(done)
        self.solved = sum(1 for t in done if self._solved(t))
        self.initial = sum(1 for t in tasks for s in range(self.n) if store.has((t.id, s)))
        self.total = len(tasks) * self.n
        self.at = self.initial  # attempts shown as done
        out = sys.stderr if stream is None else stream
        self.out = out
        self.mode: Literal["bar", "lines", "log", "off"]
        if label is not None:
            self.mode = "log"
        elif not config.progress:
            self.mode = "off"
        else:
            isatty = getattr(out, "isatty", None)
            self.mode = "bar" if callable(isatty) and isatty() else "lines"
        self._last_line = -float("inf")
        self._last_draw = 0.0
        self._closed = False
        self._logs = contextlib.ExitStack()
        self.bar: Any = None
        if self.mode == "bar":
            from tqdm import tqdm
            from tqdm.contrib.logging import logging_redirect_tqdm

            # log lines written while the bar is up go above it (tqdm.write), not into it
            self._logs.enter_context(
                logging_redirect_tqdm(loggers=[logging.getLogger(), logging.getLogger("leanrl")])
            )
            self.bar = tqdm(
                total=self.total,
                initial=self.initial,
                unit="attempt",
                desc="eval",
                dynamic_ncols=True,
                file=out,
                # tqdm's own rate is left out: the postfix says attempts/s and tokens/s
                bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]",
            )
            self.bar.set_postfix_str(self._status(), refresh=True)
        else:
            self._line(force=True)

    # -- what the policy, the runtime and the runner report ------------------------------------

    def _complete(self, t: Task) -> bool:
        return all(self.store.has((t.id, s)) for s in range(self.n))

    def _solved(self, t: Task) -> bool:
        return any(self.store.records[(t.id, s)].get("accepted") for s in range(self.n))

    def checked(self, verdicts: int) -> None:
        """Verdicts arrived (called by the runtime wrapper, before the chunk is recorded)."""
        with self._lock:
            self.verdicts += verdicts
            self._move()

    def generated(self, n: int) -> None:
        """Completions finished inside a generate call (:attr:`Policy.on_completions`)."""
        with self._lock:
            self.generated_n += n
            self._move()

    def generated_tokens(self, n: int) -> None:
        """Tokens generated (:attr:`Policy.on_tokens`): every decoding step, so only a cheap
        count here; the display is redrawn at most every :attr:`redraw_every_s`."""
        with self._lock:
            self.tokens += n
            self._show()

    def update(self, chunk: Sequence[Task], written: int, tokens: int = 0) -> None:
        """A chunk was recorded: ``written`` attempts holding ``tokens`` generated tokens."""
        with self._lock:
            self.new += written
            self.recorded_tokens += tokens
            finished = [t for t in chunk if self._complete(t)]
            self.done += len(finished)
            self.solved += sum(1 for t in finished if self._solved(t))
            self._move()

    def tick(self) -> None:
        """Called every :attr:`tick_s` while the run lasts: the elapsed time moves on a terminal, and a
        line is written when one is due, even while no token arrives (a server thinking, a
        long prompt being read)."""
        with self._lock:
            if self.bar is not None:
                self.bar.set_postfix_str(self._status(), refresh=False)
                self.bar.refresh()
                self._last_draw = time.perf_counter()
            else:
                self._line()

    async def ticker(self) -> None:
        """:meth:`tick` every :attr:`tick_s` until cancelled (the runner runs it beside the
        work)."""
        while True:
            await asyncio.sleep(self.tick_s)
            self.tick()

    def close(self) -> None:
        """The last state, once: the bar's final line, or a last plain line."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self.bar is not None:
                self.bar.set_postfix_str(self._status(), refresh=False)
                self.bar.close()
            else:
                self._line(force=True)
            self._logs.close()

    # -- drawing --------------------------------------------------------------------------------

    def _moved(self) -> int:
        """Attempts of this run counted as done."""
        return max(self.new, self.verdicts, self.generated_n if self.by_generation else 0)

    def _move(self) -> None:
        # Attempts rejected before Lean (no proof in the text) never reach the runtime: they
        # count when their chunk is recorded; the count never moves back.
        at = min(self.total, self.initial + self._moved())
        step = max(0, at - self.at)
        self.at = max(self.at, at)
        if self.bar is not None:
            self.bar.set_postfix_str(self._status(), refresh=False)
            self.bar.update(step)
        else:
            self._line()

    def _show(self) -> None:
        now = time.perf_counter()
        if self.bar is not None:
            if now - self._last_draw >= self.redraw_every_s:
                self._last_draw = now
                self.bar.set_postfix_str(self._status(), refresh=False)
                self.bar.refresh()
        else:
            self._line()

    def _status(self) -> str:
        """Tokens, rates and the pass rate, e.g. ``1,234 tok at 41.2 tok/s, 0.52 att/s, pass
        12.5%``."""
        elapsed = max(1e-9, time.perf_counter() - self.t0)
        parts = []
        tokens = max(self.tokens, self.recorded_tokens)
        if tokens:
            parts.append(f"{tokens:,} tok at {tokens / elapsed:.1f} tok/s")
        parts.append(f"{self._moved() / elapsed:.2f} att/s")
        if self.generate_only:  # nothing is checked: no pass rate to show
            parts.append("not checked")
        else:
            parts.append(f"pass {100 * (self.solved / self.done if self.done else 0.0):.1f}%")
        # With Lean, generation runs ahead of the verdicts: say how far, so the count is not
        # "stuck".
        ahead = self.generated_n - max(self.new, self.verdicts)
        if not self.by_generation and ahead > 0:
            parts.append(f"{ahead} generated awaiting Lean")
        return ", ".join(parts)

    def _line(self, force: bool = False) -> None:
        """A plain progress line, when one is due (or ``force``)."""
        if self.mode not in ("lines", "log"):
            return
        now = time.perf_counter()
        if not force and now - self._last_line < self.line_every_s:
            return
        self._last_line = now
        elapsed = int(now - self.t0)
        text = (
            f"{self.at}/{self.total} attempts, {self._status()} "
            f"[{elapsed // 60}:{elapsed % 60:02d} elapsed]"
        )
        if self.mode == "log":
            log.info("%s: %s", self.label, text)
        else:
            print(f"{time.strftime('%H:%M:%S')} eval: {text}", file=self.out, flush=True)
