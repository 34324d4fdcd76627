"""EvalConfig: everything one evaluation run needs, as one validated config tree."""

from __future__ import annotations

import functools
import hashlib
import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from leanrl.environment import EnvironmentConfig
from leanrl.errors import ConfigError
from leanrl.launch.config import LauncherConfig
from leanrl.policy import PolicyConfig, SamplingConfig

__all__ = ["EvalConfig"]

# Settings that change neither which attempts are made nor what they produce: a run may be
# resumed with different values (a longer `limit` extends a run, other `k`s re-report it).
_NOT_FINGERPRINTED: tuple[tuple[str, ...], ...] = (
    ("out",),
    ("k",),
    ("progress",),
    ("pipeline_depth",),
    ("stream",),
    ("env", "taskset", "limit"),
    ("env", "runtime", "workers"),
    ("env", "runtime", "startup_timeout_s"),
    ("policy", "max_concurrency"),
    ("policy", "request_timeout_s"),
    ("policy", "max_retries"),
    ("policy", "base_url"),
    ("policy", "device"),
    ("launcher",),
)


class EvalConfig(BaseModel):
    """One evaluation: an environment, a model, how many samples per task, and where to write."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    env: EnvironmentConfig = Field(default_factory=EnvironmentConfig)
    """The environment (``--env minif2f``) and its taskset, harness and runtime settings."""
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    """The model and its backend."""
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    """Sampling parameters (``n`` is set from ``samples``)."""
    samples: int = Field(default=1, ge=1)
    """Attempts per task (the n of pass@k)."""
    k: list[int] | None = None
    """The k values to report (``--k 1,8,32``). Default: 1 and ``samples``. Every k from 1 to
    ``samples`` is computed for the plot either way."""
    out: Path | None = None
    """Output folder (results.jsonl, summary.json, report.md). Default:
    ``runs/<env>-<model>-<harness>``. Rerunning the same command resumes it."""
    chunk_tasks: int = Field(default=8, ge=1)
    """Tasks per chunk: one ``generate`` call and one ``check`` call. Each chunk has its own
    seed, derived from ``sampling.seed``, so a resumed chunk replays the same samples."""
    pipeline_depth: int = Field(default=2, ge=1)
    """Chunks in flight at once. 2 overlaps generation of chunk i+1 with verification of chunk
    i; 1 runs them one after the other; more helps when verification is the slower part."""
    stream: bool | Literal["auto"] = "auto"
    """Give the policy every pending task at once (``Policy.stream``: continuous batching on
    the ``hf`` backend, many requests in flight on ``openai`` and ``vllm``) and send each
    completion to Lean as it arrives, instead of one ``generate`` call per chunk; chunks stay
    the unit of writing results, and a resume redoes the unwritten ones. ``auto`` (the
    default) streams where that records what chunk-by-chunk generation would: ``openai`` and
    ``vllm`` always (each request keeps its chunk's seed), ``hf`` for greedy decoding
    (temperature 0); a sampled ``hf`` run seeds each sample on its own when streamed, so it
    runs chunk by chunk unless ``--stream`` asks for it; ``--stream false``: never. Needs a
    harness that can stream (``whole-proof``); others run chunk by chunk."""
    progress: bool = True
    """Show progress on stderr: attempts done, tokens generated and tokens/s as they are
    generated, attempts/s and the pass rate so far; a bar on a terminal, else a line every 30
    s (docs/eval.md#progress)."""
    generate_only: bool = False
    """Sample and store completions without checking them, so no Lean is needed:
    ``completions.jsonl`` in the output folder holds one row per extracted proof, for
    ``leanrl verify OUT/completions.jsonl --env ID`` where Lean is installed. Needs a harness that
    can work without Lean between turns (``whole-proof``)."""
    launcher: LauncherConfig = Field(default_factory=LauncherConfig)
    """Where the eval runs (this machine or Modal) and the prices ``summary.json``'s cost is in."""

    @field_validator("k", mode="before")
    @classmethod
    def _parse_k(cls, v: Any) -> Any:
        # "1,8,32" from the command line or a TOML string; a list from TOML. The command line
        # may hand over its text as a list of strings (`--k ""` arrives as [""]).
        if isinstance(v, list) and v and all(isinstance(x, str) for x in v):
            v = ",".join(v)
        if isinstance(v, str):
            try:
                ks = [int(x) for x in re.split(r"[,\s]+", v.strip()) if x]
            except ValueError:
                raise ValueError(f"k must be integers like 1,8,32, got {v!r}") from None
            if not ks:  # `--k ""` would silently mean the default; say so instead
                raise ValueError(
                    "k is empty: give the k values to report, like --k 1,8,32 (or leave --k out "
                    "for 1 and --samples)"
                )
            return ks
        if isinstance(v, int):
            return [v]
        if isinstance(v, list) and not v:
            raise ValueError("k is an empty list: give at least one k, like [1, 8, 32]")
        return v

    def check(self) -> None:
        """Cross-field checks, with messages that say what to change."""
        ks = self.ks
        if any(k < 1 for k in ks):
            raise ConfigError(
                f"k={[k for k in ks if k < 1]}: pass@k needs k of at least 1 (pass@1 is the "
                "share of tasks whose first sample is right); give --k 1 or --k 1,8"
            )
        bad = [k for k in ks if k > self.samples]
        if bad:
            raise ConfigError(
                f"k={bad} is larger than samples={self.samples}: pass@k needs at "
                f"least k samples per task. Raise --samples to {max(ks)} or drop those k."
            )

    @property
    def ks(self) -> list[int]:
        """The k values to report, sorted."""
        return sorted(set(self.k or [1, self.samples]))

    @property
    def out_dir(self) -> Path:
        """The output folder (the configured one, or the default under ``runs/``)."""
        if self.out is not None:
            return Path(self.out).expanduser()
        model = re.sub(r"[^\w.\-]+", "_", Path(self.policy.model.rstrip("/")).name or "model")
        # The harness is part of the name only where there is a choice of Lean harnesses: an
        # environment that runs no Lean (Countdown) has its own harness whatever the field holds.
        harness = f"-{self.env.harness.name}" if _needs_lean(self.env.id) else ""
        return Path("runs") / f"{self.env.id.split(':')[-1]}-{model}{harness}"

    def fingerprint_data(self) -> dict[str, Any]:
        """The settings that decide which attempts are made and what they produce."""
        data = self.model_dump(mode="json")
        for path in _NOT_FINGERPRINTED:
            node = data
            for key in path[:-1]:
                node = node.get(key, {})
            node.pop(path[-1], None)
        return data

    def fingerprint(self) -> str:
        """A short hash of :meth:`fingerprint_data` (refuses resuming a different run)."""
        blob = json.dumps(self.fingerprint_data(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


@functools.cache  # out_dir is read several times per run: resolve the entry point once
def _needs_lean(env_id: str) -> bool:
    """Whether the environment ``env_id`` checks with Lean (True where it cannot be loaded:
    the eval reports that error itself)."""
    from leanrl.registry import resolve

    try:
        return bool(getattr(resolve("environments", env_id), "needs_lean", True))
    except ConfigError:
        return True
