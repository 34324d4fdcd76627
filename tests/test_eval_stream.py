"""The streamed eval (``eval.stream``): same results as chunk by chunk, whatever the arrival
order, checked on arrival, resumable with the same rows."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from leanrl import EnvironmentConfig, RuntimeConfig, TasksetConfig, load_environment
from leanrl.eval import EvalConfig, read_results, run_eval
from leanrl.policy import Completion, StreamCompletion, StreamRequest
from tests._scripted_runtime import ScriptedPolicy

RT = "tests._scripted_runtime:ScriptedRuntime"
TEXTS = ["\n  omega\n", "\n  simp\n", "\n  linarith\n", "\n  ring\n"]


def make(data: Path, out: Path, **kw: Any) -> EvalConfig:
    rt = kw.pop("runtime_options", {})
    return EvalConfig(
        env=EnvironmentConfig(
            id="minif2f",
            taskset=TasksetConfig(path=data, limit=kw.pop("limit", 6)),
            runtime=RuntimeConfig(name=RT, options=rt),
        ),
        samples=kw.pop("samples", 4),
        k=kw.pop("k", [1, 2, 4]),
        out=out,
        chunk_tasks=kw.pop("chunk_tasks", 2),
        progress=False,
        **kw,
    )


def rows(out: Path) -> list[dict[str, Any]]:
    """The records, timings left out (they differ run to run), in attempt order."""
    recs = [{k: v for k, v in r.items() if k != "timings"} for r in read_results(out)]
    for r in recs:
        if r.get("verdict"):
            r["verdict"] = {k: v for k, v in r["verdict"].items() if k != "time_s"}
    return sorted(recs, key=lambda r: (r["task_id"], r["sample"]))


class ShuffledStream(ScriptedPolicy):
    """Streams the scripted completions one by one in a shuffled order, ``gap_s`` apart."""

    def __init__(self, texts: Sequence[str], seed: int, gap_s: float = 0.0) -> None:
        super().__init__(texts)
        self.order_seed = seed
        self.gap_s = gap_s
        self.yielded: list[float] = []
        self.streams = 0

    async def stream(self, requests: Sequence[StreamRequest]) -> AsyncIterator[StreamCompletion]:
        self.streams += 1
        got = await self.generate([r.prompt or "" for r in requests], requests[0].sampling)
        items = [
            StreamCompletion(r.key, s, c)
            for r, comps in zip(requests, got, strict=True)
            for s, c in enumerate(comps)
        ]
        random.Random(self.order_seed).shuffle(items)
        for sc in items:
            if self.gap_s:
                await asyncio.sleep(self.gap_s)
            self.yielded.append(time.perf_counter())
            yield sc


async def test_streamed_results_equal_chunked_ones(bench_data: Path, tmp_path: Path) -> None:
    await run_eval(make(bench_data, tmp_path / "chunked"), policy=ScriptedPolicy(TEXTS))
    streamed = ScriptedPolicy(TEXTS)
    s = await run_eval(make(bench_data, tmp_path / "streamed", stream=True), policy=streamed)
    assert rows(tmp_path / "streamed") == rows(tmp_path / "chunked")
    assert len(rows(tmp_path / "streamed")) == 24
    assert s["results"]["pass_at_k"]["all"]["pass@4"] == 1.0
    # the base-class stream makes one generate call per chunk (one seed each), as before
    assert [len(c) for c in streamed.calls] == [2, 2, 2]


@pytest.mark.parametrize("order", [1, 2, 3])
async def test_arrival_order_does_not_change_results(
    bench_data: Path, tmp_path: Path, order: int
) -> None:
    await run_eval(make(bench_data, tmp_path / "ref"), policy=ScriptedPolicy(TEXTS))
    policy = ShuffledStream(TEXTS, seed=order)
    await run_eval(make(bench_data, tmp_path / "out", stream=True), policy=policy)
    assert policy.streams == 1  # every pending task in one stream
    assert rows(tmp_path / "out") == rows(tmp_path / "ref")


async def test_generate_only_streams_the_same_completions(bench_data: Path, tmp_path: Path) -> None:
    await run_eval(
        make(bench_data, tmp_path / "ref", generate_only=True), policy=ScriptedPolicy(TEXTS)
    )
    await run_eval(
        make(bench_data, tmp_path / "out", generate_only=True, stream=True),
        policy=ShuffledStream(TEXTS, seed=5),
    )
    ref = (tmp_path / "ref" / "completions.jsonl").read_text()
    assert ref and (tmp_path / "out" / "completions.jsonl").read_text() == ref
    assert rows(tmp_path / "out") == rows(tmp_path / "ref")


async def test_attempts_are_checked_as_they_arrive(bench_data: Path, tmp_path: Path) -> None:
    env = load_environment(make(bench_data, tmp_path / "o").env)
    env.config.runtime.options = {"piece": 1}
    policy = ShuffledStream(TEXTS, seed=0, gap_s=0.01)
    await run_eval(make(bench_data, tmp_path / "o", stream=True), policy=policy, env=env)
    spans = env.runtime.spans  # type: ignore[attr-defined]
    # Lean was at work long before the last completion arrived, in many small checks
    assert min(s for s, _ in spans) < policy.yielded[-1]
    assert len(spans) > 4
    assert len(rows(tmp_path / "o")) == 24


async def test_a_harness_that_cannot_stream_runs_chunk_by_chunk(
    bench_data: Path, tmp_path: Path
) -> None:
    cfg = make(bench_data, tmp_path / "o", stream=True, limit=2)
    cfg.env.harness.name = "tactic-loop"
    env = load_environment(cfg.env)
    assert not callable(getattr(env.harness, "can_stream", None)) or not env.harness.can_stream()
    from leanrl.harnesses.whole_proof.stream import can_stream

    assert not can_stream(env.harness)
    assert can_stream(load_environment(make(bench_data, tmp_path / "w").env).harness)


def test_the_stream_option_keeps_old_runs_resumable(bench_data: Path, tmp_path: Path) -> None:
    a = make(bench_data, tmp_path / "o")
    b = make(bench_data, tmp_path / "o", stream=True)
    assert a.fingerprint() == b.fingerprint() and "stream" not in a.fingerprint_data()
    assert a.stream == "auto"  # streams only where that records what chunks would


class NoReplay(ScriptedPolicy):
    """A policy whose stream would draw other samples than generate (as hf's sampled one)."""

    streamed = 0

    def stream_replays(self, sampling: Any) -> bool:
        return False

    async def stream(self, requests: Sequence[StreamRequest]) -> AsyncIterator[StreamCompletion]:
        type(self).streamed += 1
        async for c in super().stream(requests):
            yield c


@pytest.mark.parametrize(
    ("stream", "replays", "streams"),
    # one stream for the whole run, or none, or (chunk by chunk) one inside each chunk's
    # harness.run, which streams where that gives what generate would
    [("auto", True, 1), ("auto", False, 0), (True, False, 1), (False, True, 2)],
)
async def test_auto_streams_only_where_the_records_stay_the_same(
    bench_data: Path, tmp_path: Path, stream: Any, replays: bool, streams: int
) -> None:
    class P(NoReplay):
        streamed = 0

        def stream_replays(self, sampling: Any) -> bool:
            return replays

    cfg = make(bench_data, tmp_path / "o", stream=stream, limit=4)  # 2 chunks of 2 tasks
    await run_eval(cfg, policy=P(TEXTS))
    assert P.streamed == streams
    assert len(list(read_results(tmp_path / "o"))) == 4 * cfg.samples


def test_hf_streams_what_generate_would_only_when_greedy() -> None:
    from leanrl.policies.hf import HFPolicy
    from leanrl.policy import PolicyConfig, SamplingConfig

    hf = HFPolicy(PolicyConfig(model="unused"))  # no work in __init__: nothing is loaded
    assert hf.stream_replays(SamplingConfig(temperature=0.0))
    assert not hf.stream_replays(SamplingConfig(temperature=0.7, seed=1))


async def test_a_bad_stream_is_refused(bench_data: Path, tmp_path: Path) -> None:
    class Short(ShuffledStream):
        async def stream(
            self, requests: Sequence[StreamRequest]
        ) -> AsyncIterator[StreamCompletion]:
            async for sc in super().stream(requests):
                if sc.sample != 3:  # one sample of every task never comes
                    yield sc

    from leanrl import PolicyError

    with pytest.raises(PolicyError, match="missing"):
        await run_eval(make(bench_data, tmp_path / "o", stream=True), policy=Short(TEXTS, 0))
    assert rows(tmp_path / "o") == []  # no chunk was complete, none was written


async def test_resume_after_interruption_gives_the_same_rows(
    bench_data: Path, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """The real hf stream, sampled: a run cancelled after some chunks were written, then
    resumed, ends with exactly the rows of a run that was never interrupted."""
    from leanrl import PolicyConfig, SamplingConfig
    from leanrl.policies import make_policy

    def cfg(out: Path) -> EvalConfig:
        return make(
            bench_data,
            out,
            stream=True,
            chunk_tasks=1,
            limit=4,
            samples=2,
            k=[1],
            policy=PolicyConfig(model=str(tiny_model_dir), batch_size=3),
            sampling=SamplingConfig(temperature=1.0, max_tokens=12, seed=7),
            runtime_options={"delay_s": 0.05},
        )

    policy = make_policy(PolicyConfig(model=str(tiny_model_dir), batch_size=3))
    await policy.start()
    await run_eval(cfg(tmp_path / "whole"), policy=policy)
    whole = rows(tmp_path / "whole")
    assert len(whole) == 8
    out = tmp_path / "cut"
    job = asyncio.ensure_future(run_eval(cfg(out), policy=policy))
    while not (out / "results.jsonl").is_file() or not (out / "results.jsonl").read_text():
        await asyncio.sleep(0.01)
    job.cancel()
    with pytest.raises(asyncio.CancelledError):
        await job
    assert 0 < len(rows(out)) < 8
    await run_eval(cfg(out), policy=policy)
    assert rows(out) == whole
    await policy.close()


def test_stream_completion_keys_must_be_known() -> None:
    with pytest.raises(ValueError, match="exactly one of prompt"):
        StreamRequest(key=0, sampling=__import__("leanrl").SamplingConfig())
    c = StreamCompletion(key=(0, 1), sample=0, completion=Completion(text="x"))
    assert c.elapsed_s == 0.0
