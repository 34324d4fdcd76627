"""Trace round trips lose nothing (issue 37, item 3), for every built-in environment and a
verifiers taskset.

A kept proof is made as ``leanrl eval`` keeps one (the environment's own harness reads a model's
reply), written as a verifiers episode and read back: the kept proof comes back field for field.
A verifiers episode of another taskset comes back with its own env id, key, data (system prompt
included) and rewards. The episodes are read with verifiers' own trace reader. Nothing here runs
Lean: a kept proof is data, and its verdict is carried, not recomputed.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from leanrl import load_environment, registry
from leanrl.harness import HarnessConfig
from leanrl.interop.replay import ReplyPolicy, one_turn_harness, replay_generate
from leanrl.interop.traces import proofs_to_vf, vf_to_proofs
from leanrl.proofs import KeptProof, ProofStore, kept_from, read_proofs
from leanrl.task import Task

HAS_VF = importlib.util.find_spec("verifiers") is not None
needs_vf = pytest.mark.skipif(not HAS_VF, reason="verifiers is not installed (extra `verifiers`)")

BUILT_IN = sorted(registry.available("environments"))
MATHLIB = "import Mathlib\nimport Aesop\n\nset_option maxHeartbeats 400000\n\nopen Real Nat\n"


def test_the_built_in_environments_are_the_ones_tested_here() -> None:
    assert {"core", "countdown", "minif2f", "verifiers", "dataset"} <= set(BUILT_IN)


def lean_task(env: str) -> Task:
    """A task of a Lean environment (core: a real one; the others' data is on the hub, so a
    task of their shape: a Mathlib header and a named theorem)."""
    if env == "core":
        return load_environment("core", limit=1).tasks()[0]
    return Task(
        name=f"{env.replace('-', '_')}_t1",
        header=MATHLIB,
        formal_statement=f"theorem {env.replace('-', '_')}_t1 (x : ℕ) (h : 0 < x) : 1 ≤ x := by",
        informal_statement="Show that a positive natural number is at least one.",
    )


async def kept_as_eval_keeps(env: str, task: Task, completion: str, **fields: Any) -> KeptProof:
    """The kept proof `leanrl eval --env ENV` makes of a chat model's ``completion``."""
    harness_cfg = HarnessConfig(prompt_format="chat") if env not in ("countdown",) else None
    harness = one_turn_harness(load_environment(env, harness=harness_cfg))
    r = await replay_generate(harness, task, ReplyPolicy(completion))
    assert r.proof is not None, completion
    return kept_from(
        task,
        r.proof,
        r.preamble,
        restated_statement=r.restated_statement,
        completion=r.turns[-1].completion,
        source="eval",
        model="some/model",
        sample=3,
        step=7,
        axioms=["propext", "Quot.sound"],
        verify_s=0.25,
        **fields,
    )


def round_trip(tmp_path: Path, rows: list[KeptProof], env: str | None) -> list[KeptProof]:
    ProofStore(tmp_path / "proofs.jsonl").add(rows)
    proofs_to_vf(tmp_path / "proofs.jsonl", tmp_path / "vf", env=env)
    if HAS_VF:  # verifiers' own reader takes the episodes
        import verifiers.v1 as vf
        from verifiers.v1.utils.trace_store import read_episodes

        episodes = list(read_episodes(tmp_path / "vf", vf.Trace[vf.WireTaskData]))
        assert len(episodes) == len(rows)
        assert all(e.traces[0].reward >= 1.0 for e in episodes)
    report = vf_to_proofs(tmp_path / "vf", tmp_path / "back.jsonl")
    assert report.written == len(rows), report.summary()
    return read_proofs(tmp_path / "back.jsonl")


def episodes(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (path / "traces.jsonl").read_text().splitlines()]


LEAN_ENVS = [e for e in BUILT_IN if e not in ("countdown", "verifiers")]


@pytest.mark.parametrize("env", LEAN_ENVS)
async def test_a_lean_environments_kept_proofs_round_trip_identically(
    env: str, tmp_path: Path
) -> None:
    task = lean_task(env)
    stmt = task.formal_statement
    plain = await kept_as_eval_keeps(
        env, task, f"I reason first.\n\n```lean4\n{stmt}\n  omega\n```\nDone."
    )
    helper = await kept_as_eval_keeps(
        env,
        task,
        f"```lean4\nlemma aux_{task.name} : True := trivial\n\n{stmt}\n  simp\n```",
    )
    assert helper.preamble.strip()  # the helper lemma travels as the preamble
    bare = kept_from(task, "  decide", source="dataset", time=1.5)  # no model text kept
    rows = [plain, helper, bare]
    back = round_trip(tmp_path, rows, env)
    assert [r.model_dump() for r in back] == [
        r.model_dump() for r in read_proofs(tmp_path / "proofs.jsonl")
    ]
    (e0, _, e2) = episodes(tmp_path / "vf")
    assert e0["env"]["id"] == "leanrl-verifiers"
    assert e0["task"]["key"] == f"leanrl:{task.id}"
    data = e0["task"]["data"]
    assert data["env"] == env and data["harness"]["prompt_format"] == "chat"
    roles = [n["message"]["role"] for n in e0["traces"][0]["nodes"]]
    assert roles == ["system", "user", "assistant"]
    assert "Lean 4" in e0["traces"][0]["nodes"][1]["message"]["content"]
    # a proof kept without model text is written as the proof in a Lean block
    assert "decide" in e2["traces"][0]["nodes"][-1]["message"]["content"]


async def test_countdowns_kept_proofs_round_trip_with_countdowns_prompt(tmp_path: Path) -> None:
    task = load_environment("countdown", limit=1).tasks()[0]
    sol = task.extra["solution"]
    row = await kept_as_eval_keeps(
        "countdown", task, f" add them up. </think>\n<answer> {sol} </answer> and more"
    )
    assert row.proof == str(sol) and row.completion.endswith(f"<answer> {sol} ")
    bare = kept_from(task, f"({sol})", source="dataset", time=2.0)
    # the environment is found from the statement: no `env` given
    back = round_trip(tmp_path, [row, bare], None)
    assert [r.model_dump() for r in back] == [
        r.model_dump() for r in read_proofs(tmp_path / "proofs.jsonl")
    ]
    e0, e1 = episodes(tmp_path / "vf")
    nodes = e0["traces"][0]["nodes"]
    assert [n["message"]["role"] for n in nodes] == ["user", "assistant"]  # no system turn
    assert "Using the numbers" in nodes[0]["message"]["content"]
    assert "Lean" not in nodes[0]["message"]["content"]
    assert e0["task"]["data"]["env"] == "countdown"
    # the bare proof is written in Countdown's answer layout, and read back by its harness
    assert f"<answer> ({sol}) </answer>" in e1["traces"][0]["nodes"][-1]["message"]["content"]


@needs_vf
async def test_a_verifiers_environments_kept_proof_round_trips_under_its_own_taskset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent))  # _vf_letters
    env = load_environment("verifiers", harness={"options": {"env": "_vf_letters"}})
    task = env.tasks()[0]
    row = kept_from(task, "cat", completion="cat", source="grpo", model="m", step=2)
    back = round_trip(tmp_path, [row], None)
    assert [r.model_dump() for r in back] == [
        r.model_dump() for r in read_proofs(tmp_path / "proofs.jsonl")
    ]
    (e,) = episodes(tmp_path / "vf")
    assert e["env"]["id"] == "_vf_letters"  # not leanrl-verifiers
    assert e["task"]["key"] == task.id  # no `leanrl:` prefix
    assert e["task"]["data"]["word"] == "cat"  # the taskset's own task data
    messages = [n["message"] for n in e["traces"][0]["nodes"]]
    assert messages[0] == {"role": "system", "content": "Answer with one word."}
    assert messages[-1] == {"role": "assistant", "content": "cat"}


def foreign_episode() -> dict[str, Any]:
    data = {
        "idx": 0,
        "name": "say_cat",
        "prompt": "Say the word cat.",
        "system_prompt": "Answer with one word.",
        "word": "cat",
    }
    trace = {
        "id": "t1",
        "task": {"type": "LettersTask", "key": "letters-0-cat", "data": data},
        "agent": {"config": {"model": "m"}},
        "nodes": [
            {"message": {"role": "system", "content": "Answer with one word."}},
            {"parent": 0, "message": {"role": "user", "content": "Say the word cat."}},
            {"parent": 1, "sampled": True, "message": {"role": "assistant", "content": " cat"}},
        ],
        "rewards": {"letters": {"score": 0.5, "weight": 1.0}, "exact": {"score": 0.5}},
        "info": {},
        "ok": True,
    }
    return {"id": "e1", "env": {"id": "_vf_letters"}, "task": trace["task"], "traces": [trace]}


def test_a_verifiers_episode_round_trips_with_its_key_data_and_rewards(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    original = foreign_episode()
    (src / "traces.jsonl").write_text(json.dumps(original) + "\n")
    assert vf_to_proofs(src, tmp_path / "kept.jsonl").written == 1
    (row,) = read_proofs(tmp_path / "kept.jsonl")
    assert row.task_id == "letters-0-cat" and row.proof == "cat" and row.completion == " cat"
    assert row.formal_statement == "verifiers _vf_letters: letters-0-cat"
    proofs_to_vf(tmp_path / "kept.jsonl", tmp_path / "again")
    (e,) = episodes(tmp_path / "again")
    t, o = e["traces"][0], original["traces"][0]
    assert e["env"] == original["env"]
    assert e["task"] == original["task"]  # type, key and data, system prompt included
    assert [n["message"] for n in t["nodes"]] == [n["message"] for n in o["nodes"]]
    assert t["rewards"] == o["rewards"]
    assert t["agent"]["config"]["model"] == "m"
    # ... and once more to leanrl: the same kept proof
    vf_to_proofs(tmp_path / "again", tmp_path / "kept2.jsonl")
    assert read_proofs(tmp_path / "kept2.jsonl")[0].model_dump() == row.model_dump()


@needs_vf
async def test_a_plugin_trace_of_countdown_is_kept_with_countdowns_extraction(
    tmp_path: Path,
) -> None:
    """A trace of leanrl's own verifiers taskset on Countdown, scored by the plugin, is kept by
    Countdown's harness (it used to come back as 'no proof in the reply')."""
    import verifiers.v1 as vf
    from verifiers.v1.utils.trace_store import write_episode

    from leanrl.interop.verifiers_plugin import LeanrlTaskset, LeanrlTasksetConfig

    ts = LeanrlTaskset(LeanrlTasksetConfig(id="leanrl-verifiers", env="countdown", limit=1))
    (task,) = list(ts)
    sol = task.data.leanrl_task["extra"]["solution"]
    reply = f"ok</think>\n<answer> {sol} </answer>"
    trace = vf.Trace(
        task=vf.TraceTask(type="LeanrlTask", data=task.data),
        agent=vf.AgentInfo(config=vf.AgentConfig(model="standin")),
        nodes=[
            vf.MessageNode(message={"role": "user", "content": task.data.prompt_text}),
            vf.MessageNode(parent=0, sampled=True, message={"role": "assistant", "content": reply}),
        ],
        is_completed=True,
        ok=True,
    )
    await task.score(trace)
    assert trace.rewards["leanrl"].score == 1.0
    run = tmp_path / "run"
    run.mkdir()
    write_episode(run, vf.Episode(task=trace.task, traces=[trace], ok=True))
    assert vf_to_proofs(run, tmp_path / "p.jsonl").written == 1
    (row,) = read_proofs(tmp_path / "p.jsonl")
    assert row.proof == str(sol) and row.task_id == task.data.leanrl_task["id"]
    assert row.source == "verifiers" and row.model == "standin"


def test_the_cli_takes_the_environment(tmp_path: Path) -> None:
    from leanrl.cli import main

    task = load_environment("countdown", limit=1).tasks()[0]
    ProofStore(tmp_path / "p.jsonl").add([kept_from(task, "1 + 2", source="x")])
    out = tmp_path / "vf"
    args = ["interop", "traces", str(tmp_path / "p.jsonl"), "--to", "verifiers", "--out", str(out)]
    assert main([*args, "--leanrl-env", "countdown", "--env-id", "my-env"]) == 0
    (e,) = episodes(out)
    assert e["env"]["id"] == "my-env" and e["task"]["data"]["env"] == "countdown"
