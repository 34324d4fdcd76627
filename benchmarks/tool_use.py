"""Agents that use Lean as a tool: tool latency, overlap, episodes, and a CPU learning check.

Four measurements, each its own subcommand (all on this machine's CPU, one torch thread):

``latency``  Lean tool calls (``check``, ``goals``, ``search``) through the local runtime's pool
             on the stand-in REPL processes of ``tests/fake_repl.py`` (NOT Lean: it answers at
             once, so the figures are leanrl's plumbing per call: a tactic session from the
             pool, the pre-scan, the REPL requests, the release), one at a time and C at once.
``overlap``  the ``tool-use`` harness on E episodes with a SIMULATED policy (a scripted answer
             per turn after ``--gen-s`` of sleep per batched call, like one decode step of a
             GPU batch) and tool calls that take ``--tool-s`` on the stand-in REPL (its
             ``delay`` directive): wall time against the sum of each episode's generation and
             tool time, and against running the episodes one after another (same calls).
``external`` the ``external`` harness running the test agent program (``tests/agents/``) per
             episode against the loopback endpoint, with the simulated policy: all at once
             against one at a time.
``episodes`` a real model, SmolLM2-135M-Instruct (``leanrl models get smollm2``), given the
             Hermes tool template (its own ChatML template has no tools), on the minif2f
             fixture theorems with the stand-in REPL: tool calls, turns and tokens per episode.
``learn``    the learning check: a tiny random model (made here), warm-started by SFT on
             scripted transcripts in which 3 episodes in 10 call ``calc`` before ``submit``,
             then trained by GRPO on Countdown through the ``tool-use`` harness with
             ``calc_first`` (an answer is taken only once ``calc`` has evaluated something) and
             two turns; the reward is the Countdown judge's on the submitted answer
             (TinyZero's ``paper`` reward: 1 correct, 0.1 any other answer, 0 none). Reported: how often the first call is ``calc``, and the mean reward, on
             held-out puzzles before and after GRPO.

    python benchmarks/tool_use.py latency --calls 40
    python benchmarks/tool_use.py overlap --episodes 16
    python benchmarks/tool_use.py external --episodes 8
    python benchmarks/tool_use.py episodes --tasks 4 --samples 2
    python benchmarks/tool_use.py learn --steps 60
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("LEANRL_ALLOW_UNSANDBOXED", "1")

from leanrl import HarnessConfig, SamplingConfig, Task, Taskset
from leanrl.harnesses.tool_use import HERMES_TOOL_TEMPLATE, ToolUseHarness
from leanrl.policy import Completion, Policy, PolicyConfig, Prompt
from leanrl.runtime import RuntimeConfig
from leanrl.verdict import VerificationPolicy

REPO = Path(__file__).resolve().parent.parent
FAKE = [sys.executable, str(REPO / "tests" / "fake_repl.py")]
FIXTURE = REPO / "tests" / "fixtures" / "data" / "minif2f.jsonl"
TASK = Task(
    name="t1",
    header="import Mathlib\n\n",
    formal_statement="theorem t1 (x : ℕ) (h : x + 1 = 2) : x = 1 := by",
)


def stats(xs: Sequence[float]) -> str:
    """min / median / max in ms."""
    return f"{min(xs) * 1e3:.1f} / {statistics.median(xs) * 1e3:.1f} / {max(xs) * 1e3:.1f} ms"


def local_runtime(workers: int, load_time: float = 0.0) -> Any:
    from leanrl.runtimes.local import LocalRuntime

    cmd = [*FAKE, "--load-time", str(load_time)]
    return LocalRuntime(
        RuntimeConfig(workers=workers, timeout_s=60, options={"repl_command": cmd, "spares": 0})
    )


def call(name: str, **args: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


class ScriptPolicy(Policy):
    """A SIMULATED policy: turn k's answer is ``answer(turn, prompt_text)``, tokenized by a real
    tokenizer and closed with ``<|im_end|>``; each batched call sleeps ``gen_s``."""

    name = "scripted"

    def __init__(self, tok: Any, answer: Callable[[int, str], str], gen_s: float = 0.0) -> None:
        super().__init__(PolicyConfig(model="scripted"))
        self.tokenizer, self.answer, self.gen_s = tok, answer, gen_s
        self.calls = 0

    async def generate(self, prompts: Sequence[Prompt], sampling: SamplingConfig) -> Any:
        raise NotImplementedError

    async def generate_from_ids(self, prompt_ids: Any, sampling: SamplingConfig) -> Any:
        self.calls += 1
        if self.gen_s:
            await asyncio.sleep(self.gen_s)
        out = []
        end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        for ids in prompt_ids:
            text = str(self.tokenizer.decode(list(ids)))
            turn = text.count("<|im_start|>assistant") - 1
            a = self.answer(turn, text)
            tids = [*self.tokenizer(a, add_special_tokens=False).input_ids, end]
            out.append(
                [
                    Completion(
                        text=a,
                        token_ids=tuple(tids),
                        logprobs=tuple([-0.5] * len(tids)),
                        prompt_token_ids=tuple(ids),
                    )
                ]
            )
        return out


def tool_tokenizer(texts: Sequence[str] = ()) -> Any:
    from transformers import AutoTokenizer

    from leanrl.testing import make_tiny_model

    d = make_tiny_model(
        tempfile.mkdtemp(prefix="tool-bench-"),
        [call("check", code="intro x"), "goals search submit omega", *texts] * 3,
    )
    tok = AutoTokenizer.from_pretrained(d)
    tok.chat_template = HERMES_TOOL_TEMPLATE
    return tok


# -- latency ---------------------------------------------------------------------------------------


async def latency(calls: int, workers: int) -> dict[str, Any]:
    from leanrl.harnesses.tool_use.lean_tools import check_code, goals_after, search_lean

    rt = local_runtime(workers)
    rules = VerificationPolicy()
    jobs: dict[str, Callable[[], Any]] = {
        "check": lambda: check_code(rt, TASK, "theorem a : True := by\n  trivial", rules),
        "goals": lambda: goals_after(rt, TASK, "intro y\nsimp", rules),
        "search": lambda: search_lean(rt, TASK.header, "Nat.add_comm", rules),
    }
    out: dict[str, Any] = {}
    async with rt:
        await jobs["goals"]()  # first processes start (not counted)
        for name, job in jobs.items():
            text, _ = await job()
            assert not text.startswith("Error"), (name, text)  # it reached the REPL and back
            walls, cpus = [], []
            for _ in range(calls):
                t0, c0 = time.perf_counter(), time.process_time()
                await job()
                walls.append(time.perf_counter() - t0)
                cpus.append(time.process_time() - c0)
            t0 = time.perf_counter()
            await asyncio.gather(*(job() for _ in range(calls)))
            burst = time.perf_counter() - t0
            out[name] = {"wall": walls, "cpu": cpus, "burst_per_call": burst / calls}
    return out


# -- overlap ---------------------------------------------------------------------------------------


async def overlap(episodes: int, gen_s: float, tool_s: float, workers: int) -> dict[str, Any]:
    tok = tool_tokenizer()
    slow = f'-- fake: {{"delay": {tool_s}}}\ntheorem a : True := by\n  trivial'
    script = [call("check", code=slow), call("check", code=slow), call("submit", proof="simp")]

    def answer(turn: int, _text: str) -> str:
        return script[min(turn, len(script) - 1)]

    h = ToolUseHarness(HarnessConfig(name="tool-use", max_turns=4))
    rows: dict[str, list[float]] = {"together": [], "one_by_one": [], "sum": [], "cpu": []}
    rt = local_runtime(workers)
    async with rt:
        await h.run([TASK], ScriptPolicy(tok, answer), rt, SamplingConfig(), Taskset())  # warm
        for _ in range(3):  # modes alternated
            pol = ScriptPolicy(tok, answer, gen_s)
            t0, c0 = time.perf_counter(), time.process_time()
            (group,) = await h.run([TASK], pol, rt, SamplingConfig(n=episodes), Taskset())
            rows["together"].append(time.perf_counter() - t0)
            rows["cpu"].append(time.process_time() - c0)
            rows["sum"].append(
                sum(
                    r.timings["generate"] + r.timings["tools"] - r.timings["tool_wait"]
                    for r in group
                )
            )
            t0 = time.perf_counter()
            for _ in range(episodes):
                await h.run(
                    [TASK], ScriptPolicy(tok, answer, gen_s), rt, SamplingConfig(), Taskset()
                )
            rows["one_by_one"].append(time.perf_counter() - t0)
    return {**rows, "policy_calls": pol.calls, "episodes": episodes}


# -- external agent programs ----------------------------------------------------------------------


async def external(episodes: int, concurrency: int) -> dict[str, Any]:
    """The external harness with the test agent program (the `openai` client, httpx) and a
    SIMULATED policy: per-episode program time and request round trips, all at once against
    one at a time."""
    from leanrl.harnesses.external import ExternalHarness

    tok = tool_tokenizer()
    script = [call("goals", proof_so_far="intro y"), call("submit", proof="simp")]

    def answer(turn: int, _text: str) -> str:
        return script[min(turn, len(script) - 1)]

    agent = [sys.executable, str(REPO / "tests" / "agents" / "openai_agent.py")]
    out: dict[str, Any] = {"round_trip": await _round_trips(tok, answer, 50)}
    rt = local_runtime(2)
    async with rt:
        for c in (concurrency, 1):
            h = ExternalHarness(
                HarnessConfig(
                    name="external",
                    max_turns=4,
                    options={"command": agent, "concurrency": c, "timeout_s": 300},
                )
            )
            t0 = time.perf_counter()
            (group,) = await h.run(
                [TASK], ScriptPolicy(tok, answer), rt, SamplingConfig(n=episodes), Taskset()
            )
            out[f"wall_c{c}"] = time.perf_counter() - t0
            out[f"program_s_c{c}"] = [r.timings["program"] for r in group]
            out[f"ok_c{c}"] = sum(r.proof is not None for r in group)
            out["requests"] = [r.meta["requests"] for r in group]
            out["tool_calls"] = [r.meta["tool_calls"] for r in group]
    return out


async def _round_trips(tok: Any, answer: Callable[[int, str], str], n: int) -> list[float]:
    """Seconds per chat request through the endpoint (httpx client, the simulated policy
    answering at once): the endpoint's own cost per model turn."""
    import httpx

    from leanrl.harnesses.external.endpoint import Endpoint
    from leanrl.harnesses.external.session import Session
    from leanrl.harnesses.tool_use.chat import ChatFormat, TokenBackend
    from leanrl.harnesses.tool_use.lean_tools import LeanTools

    pol = ScriptPolicy(tok, answer)
    fmt = ChatFormat(tok, [])
    ep = Endpoint(pol, SamplingConfig(), TokenBackend(pol, fmt, ids=True), fmt, "hermes")
    await ep.start()
    times = []
    try:
        async with httpx.AsyncClient(timeout=60) as client:
            for k in range(n):
                tools = LeanTools(TASK, None, VerificationPolicy(), asyncio.Semaphore(1))  # type: ignore[arg-type]
                s = Session(k, TASK, tools, max_turns=4, max_total_tokens=10**6, max_tool_calls=4)
                ep.open(s)
                body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
                t0 = time.perf_counter()
                r = await client.post(
                    f"{ep.base_url}/v1/chat/completions",
                    json=body,
                    headers={"Authorization": f"Bearer {s.key}"},
                )
                times.append(time.perf_counter() - t0)
                assert r.status_code == 200, r.text
                ep.close_session(s)
    finally:
        await ep.close()
    return times[5:]  # the first few warm the connection


# -- episodes with SmolLM2 -------------------------------------------------------------------------


async def real_episodes(tasks: int, samples: int, max_tokens: int) -> dict[str, Any]:
    from leanrl import load_environment
    from leanrl.models import models_root
    from leanrl.policies.hf import HFPolicy

    folder = models_root() / "smollm2"
    if not (folder / "config.json").is_file():
        raise SystemExit("make SmolLM2 first: leanrl models get smollm2")
    policy = HFPolicy(PolicyConfig(model=str(folder), device="cpu", batch_size=16))
    await policy.start()
    policy.tokenizer.chat_template = HERMES_TOOL_TEMPLATE  # ChatML markers, as SmolLM2's own
    env = load_environment("minif2f", path=str(FIXTURE), split="valid", limit=tasks)
    rt = local_runtime(2)
    h = ToolUseHarness(HarnessConfig(name="tool-use", max_turns=4, max_total_tokens=4096))
    t0 = time.perf_counter()
    async with rt:
        groups = await h.run(
            env.tasks(),
            policy,
            rt,
            SamplingConfig(n=samples, temperature=0.7, max_tokens=max_tokens, seed=0),
            Taskset(),
        )
    wall = time.perf_counter() - t0
    rs = [r for g in groups for r in g]
    malformed = sum(t.feedback.count("Error: the tool call") for r in rs for t in r.turns)
    return {
        "episodes": len(rs),
        "wall_s": wall,
        "tool_calls": [r.meta["tool_calls"] for r in rs],
        "turns": [r.meta["turns"] for r in rs],
        "model_tokens": [sum(len(t.completion_ids) for t in r.turns) for r in rs],
        "tool_tokens": [sum(len(t.feedback_ids) for t in r.turns) for r in rs],
        "prompt_tokens": [len(r.prompt_ids) for r in rs],
        "malformed_calls": malformed,
        "submitted": sum(r.proof is not None for r in rs),
        "tools": [r.meta["tools"] for r in rs],
        "generate_s": sum(r.timings["generate"] for r in rs),
        "tools_s": sum(r.timings["tools"] for r in rs),
        "reasons": [r.verdict.reason.value if r.verdict else None for r in rs],
    }


# -- the learning check ----------------------------------------------------------------------------

_NUMBERS = re.compile(r"Using the numbers \[([\d, ]+)\]")


def _expr(rng: random.Random, numbers: list[int]) -> str:
    nums = numbers[:]
    rng.shuffle(nums)
    out = str(nums[0])
    for n in nums[1:]:
        out = f"{out} {rng.choice('+-*')} {n}"
    return out


def _scripted_answer(rng: random.Random, p_calc: float) -> Callable[[int, str], str]:
    chosen: dict[str, tuple[bool, str]] = {}

    def answer(turn: int, text: str) -> str:
        m = _NUMBERS.search(text)
        nums = [int(x) for x in m.group(1).split(",")] if m else [1, 2]
        key = text[: text.find("<|im_start|>assistant")]
        if turn == 0 or key not in chosen:
            chosen[key] = (rng.random() < p_calc, _expr(rng, nums))
        calc_first, expr = chosen[key]
        if calc_first and turn == 0:
            return call("calc", expr=expr)
        return call("submit", expr=expr)

    return answer


def make_learner(out: Path, tasks: list[Task]) -> Path:
    """A tiny random model whose tokenizer is trained on the rendered prompts and calls, with
    ``<|im_end|>`` as its end of sequence (a turn ends there)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from leanrl.harnesses.tool_use.chat import ChatFormat
    from leanrl.harnesses.tool_use.countdown_tools import countdown_tools
    from leanrl.testing import make_tiny_model

    probe = tool_tokenizer()
    fmt = ChatFormat(probe, [t.schema() for t in countdown_tools()])
    h = ToolUseHarness(HarnessConfig(name="tool-use"))
    rng = random.Random(0)
    texts = []
    for t in tasks[:200]:
        msgs = [m.model_dump() for m in h.first_messages(t, "countdown")]
        e = _expr(rng, t.extra["numbers"])
        texts += [fmt.render(msgs), call("calc", expr=e), call("submit", expr=e), "= 123"]
    make_tiny_model(out, texts, vocab_size=1024, hidden_size=64, layers=2)
    tok = AutoTokenizer.from_pretrained(out)
    tok.chat_template = HERMES_TOOL_TEMPLATE
    tok.eos_token = "<|im_end|>"
    tok.save_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    model.config.eos_token_id = end
    model.generation_config.eos_token_id = end
    model.save_pretrained(out)
    return out


async def _collect(tok: Any, tasks: list[Task], p_calc: float, seed: int) -> list[Any]:
    from leanrl.environments.countdown import CountdownChecker, CountdownTaskset

    h = ToolUseHarness(HarnessConfig(name="tool-use", max_turns=3, options={"tools": "countdown"}))
    pol = ScriptPolicy(tok, _scripted_answer(random.Random(seed), p_calc))
    groups = await h.run(tasks, pol, CountdownChecker(), SamplingConfig(), CountdownTaskset())
    return [r for g in groups for r in g]


def sft(folder: Path, rollouts: list[Any], steps: int, lr: float) -> None:
    """Warm start: next-token loss on the model's tokens of scripted transcripts (the mask the
    rollouts carry), AdamW, batches of 16."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(folder)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    rows = []
    for r in rollouts:
        ids, mask, _ = r.token_ids_and_mask()
        rows.append((r.prompt_ids + ids, [0] * len(r.prompt_ids) + mask))
    rng = random.Random(0)
    model.train()
    for _ in range(steps):
        batch = rng.sample(rows, min(16, len(rows)))
        width = max(len(x) for x, _ in batch)
        ids = torch.tensor([x + [0] * (width - len(x)) for x, _ in batch])
        lab = torch.tensor(
            [
                [t if m else -100 for t, m in zip(x, mk, strict=True)] + [-100] * (width - len(x))
                for x, mk in batch
            ]
        )
        att = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x, _ in batch])
        loss = model(input_ids=ids, attention_mask=att, labels=lab).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(folder)


async def measure(folder: Path, tasks: list[Task], samples: int) -> dict[str, float]:
    """How the model behaves on ``tasks`` (sampled at temperature 1, ``calc_first`` on)."""
    from leanrl.environments.countdown import CountdownChecker, CountdownTaskset
    from leanrl.policies.hf import HFPolicy

    policy = HFPolicy(PolicyConfig(model=str(folder), device="cpu", batch_size=64))
    await policy.start()
    h = ToolUseHarness(
        HarnessConfig(
            name="tool-use", max_turns=2, options={"tools": "countdown", "calc_first": True}
        )
    )
    groups = await h.run(
        tasks,
        policy,
        CountdownChecker(),
        SamplingConfig(n=samples, temperature=1.0, top_p=1.0, max_tokens=48, seed=1),
        CountdownTaskset(),
    )
    await policy.close()
    rs = [r for g in groups for r in g]
    first = [r.meta["calls"][0]["tool"] if r.meta["calls"] else "" for r in rs]
    return {
        "episodes": len(rs),
        "first_call_calc": sum(f == "calc" for f in first) / len(rs),
        "first_call_submit": sum(f == "submit" for f in first) / len(rs),
        "answered": sum(r.proof is not None for r in rs) / len(rs),
        "reward_mean": sum(r.reward for r in rs) / len(rs),
        "solved": sum(r.reward == 1.0 for r in rs) / len(rs),
    }


def learn(steps: int, sft_steps: int, out: Path, p_calc: float, lr: float) -> dict[str, Any]:
    import torch

    from leanrl import load_environment
    from leanrl.train.grpo import GRPOConfig, GRPOTrainer

    torch.set_num_threads(1)
    train = load_environment("countdown", split="train").tasks()
    held = load_environment("countdown", split="test", limit=32).tasks()
    folder = make_learner(out / "model", train)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    rollouts = asyncio.run(_collect(tok, train[:400], p_calc=p_calc, seed=0))
    t0 = time.perf_counter()
    sft(folder, rollouts, sft_steps, 3e-3)
    sft_s = time.perf_counter() - t0
    before = asyncio.run(measure(folder, held, 4))
    cfg = GRPOConfig(
        env={
            "id": "countdown",
            "taskset": {"split": "train", "limit": 256},
            "harness": {
                "name": "tool-use",
                "max_turns": 2,
                "options": {"calc_first": True, "reward": "paper"},
            },
        },
        policy=PolicyConfig(model=str(folder)),
        sampling=SamplingConfig(max_tokens=48, top_p=1.0, temperature=1.0, seed=0),
        out=out / "grpo",
        steps=steps,
        tasks_per_step=4,
        group_size=8,
        lr=lr,
        weight_decay=0.0,
        save_every=steps,
        mask_truncated=False,
        # groups whose episodes all got the same reward carry no signal; dropping them also
        # keeps Adam's momentum from moving the weights on steps that have none
        dynamic_sampling="drop",
    )
    trainer = GRPOTrainer(cfg)
    t0 = time.perf_counter()
    trainer.train_sync()
    grpo_s = time.perf_counter() - t0
    rewards = [r["reward_mean"] for r in trainer.run.metrics() if "reward_mean" in r]
    latest = trainer.run.latest_checkpoint()
    assert latest is not None
    after = asyncio.run(measure(latest[1], held, 4))
    return {
        "sft_rollouts": len(rollouts),
        "sft_calc_first_share": sum(r.meta["calls"][0]["tool"] == "calc" for r in rollouts)
        / len(rollouts),
        "sft_s": sft_s,
        "grpo_s": grpo_s,
        "before": before,
        "after": after,
        "reward_curve": rewards,
    }


# -- main ------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("latency", parents=[common])
    p.add_argument("--calls", type=int, default=40)
    p.add_argument("--workers", type=int, default=2)
    p = sub.add_parser("overlap", parents=[common])
    p.add_argument("--episodes", type=int, default=16)
    p.add_argument("--gen-s", type=float, default=0.05)
    p.add_argument("--tool-s", type=float, default=0.2)
    p.add_argument("--workers", type=int, default=4)
    p = sub.add_parser("external", parents=[common])
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=8)
    p = sub.add_parser("episodes", parents=[common])
    p.add_argument("--tasks", type=int, default=4)
    p.add_argument("--samples", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=192)
    p = sub.add_parser("learn", parents=[common])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--sft-steps", type=int, default=400)
    p.add_argument("--p-calc", type=float, default=0.3, help="SFT transcripts calling calc first")
    p.add_argument("--lr", type=float, default=1e-3, help="GRPO learning rate")
    p.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    if a.what == "latency":
        res = asyncio.run(latency(a.calls, a.workers))
        if a.json:
            print(json.dumps(res))
            return
        print(f"Lean tool calls through the pool ({a.workers} stand-in REPL processes, NOT Lean):")
        for name, r in res.items():
            print(
                f"  {name:<7} one at a time: wall {stats(r['wall'])} (min/median/max), "
                f"CPU here {stats(r['cpu'])}; {a.calls} at once: "
                f"{r['burst_per_call'] * 1e3:.1f} ms per call"
            )
    elif a.what == "overlap":
        res = asyncio.run(overlap(a.episodes, a.gen_s, a.tool_s, a.workers))
        if a.json:
            print(json.dumps(res))
            return
        tog, one, tot = res["together"], res["one_by_one"], res["sum"]
        ratio = [t / s for t, s in zip(tog, tot, strict=True)]
        speed = [o / t for o, t in zip(one, tog, strict=True)]
        print(
            f"{a.episodes} episodes x (2 tool calls of {a.tool_s} s + submit), simulated "
            f"generation {a.gen_s} s per batched call, {a.workers} stand-in REPL processes:\n"
            f"  wall together   {min(tog):.2f} / {statistics.median(tog):.2f} / {max(tog):.2f} s "
            f"(CPU {statistics.median(res['cpu']):.2f} s)\n"
            f"  sum of episodes {statistics.median(tot):.2f} s (each episode's generation share and "
            f"tool calls, waits for a process left out)\n"
            f"  wall / sum      {min(ratio):.3f} / {statistics.median(ratio):.3f} / "
            f"{max(ratio):.3f}\n"
            f"  one by one      {statistics.median(one):.2f} s: together is "
            f"{min(speed):.1f} / {statistics.median(speed):.1f} / {max(speed):.1f}x faster\n"
            f"  policy calls    {res['policy_calls']} for {3 * a.episodes} turns"
        )
    elif a.what == "external":
        res = asyncio.run(external(a.episodes, a.concurrency))
        if a.json:
            print(json.dumps(res))
            return
        c = a.concurrency
        print(
            f"{a.episodes} episodes of tests/agents/openai_agent.py (SIMULATED policy, 2 requests "
            f"and 2 tool calls each): {c} at once {res[f'wall_c{c}']:.1f} s, one at a time "
            f"{res['wall_c1']:.1f} s ({res['wall_c1'] / res[f'wall_c{c}']:.1f}x); per program "
            f"{stats(res['program_s_c1'])} alone; submitted {res[f'ok_c{c}']}/{a.episodes}\n"
            f"endpoint round trip per chat request (policy answering at once): "
            f"{stats(res['round_trip'])}"
        )
    elif a.what == "episodes":
        res = asyncio.run(real_episodes(a.tasks, a.samples, a.max_tokens))
        if a.json:
            print(json.dumps(res))
            return

        def avg(xs: list[int]) -> str:
            return f"{statistics.mean(xs):.1f} (min {min(xs)}, max {max(xs)})"

        print(
            f"SmolLM2-135M-Instruct, {res['episodes']} episodes on minif2f fixture theorems "
            f"(stand-in REPL), {res['wall_s']:.0f} s:\n"
            f"  tool calls/episode   {avg(res['tool_calls'])}; malformed calls "
            f"{res['malformed_calls']}; submitted {res['submitted']}\n"
            f"  turns/episode        {avg(res['turns'])}\n"
            f"  model tokens/episode {avg(res['model_tokens'])}; tool-result tokens "
            f"{avg(res['tool_tokens'])}; prompt {avg(res['prompt_tokens'])}\n"
            f"  time: generating {res['generate_s']:.1f} s, in tools {res['tools_s']:.2f} s "
            f"(summed over episodes)\n  tools used: {res['tools']}\n  ends: {res['reasons']}"
        )
    else:
        out = a.out or Path(tempfile.mkdtemp(prefix="tool-learn-"))
        res = learn(a.steps, a.sft_steps, out, a.p_calc, a.lr)
        if a.json:
            print(json.dumps(res))
            return
        b, f = res["before"], res["after"]
        curve = res["reward_curve"]
        k = max(1, len(curve) // 5)
        print(
            f"learning check ({res['sft_rollouts']} scripted SFT transcripts, "
            f"{res['sft_calc_first_share']:.0%} calling calc first; SFT {res['sft_s']:.0f} s, "
            f"GRPO {len(curve)} steps {res['grpo_s']:.0f} s), held-out, 4 samples each:\n"
            f"  first call calc   {b['first_call_calc']:.2f} -> {f['first_call_calc']:.2f}\n"
            f"  first call submit {b['first_call_submit']:.2f} -> {f['first_call_submit']:.2f}\n"
            f"  answered          {b['answered']:.2f} -> {f['answered']:.2f}\n"
            f"  reward mean       {b['reward_mean']:.3f} -> {f['reward_mean']:.3f} "
            f"(solved {b['solved']:.2f} -> {f['solved']:.2f})\n"
            f"  GRPO reward, first {k} steps {statistics.mean(curve[:k]):.3f}, last {k} "
            f"{statistics.mean(curve[-k:]):.3f}"
        )


if __name__ == "__main__":
    main()
