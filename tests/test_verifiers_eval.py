"""verifiers' own `vf-eval` on leanrl's `core` taskset, end to end, offline.

The model is an OpenAI-compatible stand-in served on loopback by this test (it answers with a
fixed proof per theorem, no model runs); `vf-eval` resolves the taskset by its plugin id
(`leanrl-verifiers`), runs leanrl's chat harness through verifiers' interception server to the
stand-in, and scores with leanrl's checker on the scripted test runtime (accepts a proof
containing ``omega``; never Lean). What is tested is that verifiers' results carry leanrl's
verdicts, not Lean's judgement.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent

for _mod, _why in (
    ("verifiers", "verifiers is not installed (pip install -e '.[verifiers]', Python 3.11+)"),
    ("fastapi", "the stand-in model endpoint needs fastapi (pip install -e '.[serve]')"),
    ("uvicorn", "the stand-in model endpoint needs uvicorn (pip install -e '.[serve]')"),
):
    if importlib.util.find_spec(_mod) is None:
        pytest.skip(_why, allow_module_level=True)

import uvicorn  # noqa: E402
from fastapi import FastAPI, Request  # noqa: E402

_THEOREM = re.compile(r"```lean4\n(theorem (\S+).*?:= by)\n```", re.S)


@contextmanager
def standin_model(proof_for: dict[str, str], seen: list[dict[str, Any]]) -> Iterator[str]:
    """An OpenAI-compatible ``/v1/chat/completions`` on 127.0.0.1 (in a thread, so that a
    subprocess can call it): it restates the theorem of the prompt and proves it with
    ``proof_for[name]``. Yields the base URL (``.../v1``)."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(req: Request) -> dict[str, Any]:
        body = await req.json()
        seen.append(body)
        m = _THEOREM.search(body["messages"][-1]["content"])
        text = f"```lean4\n{m.group(1)}\n  {proof_for[m.group(2)]}\n```" if m else "no idea"
        return {
            "id": f"cmpl-{len(seen)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "standin"),
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": text},
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    server = uvicorn.Server(uvicorn.Config(app, log_level="critical", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    for _ in range(1000):
        if server.started:
            break
        time.sleep(0.01)
    try:
        assert server.started, "the stand-in model endpoint did not start"
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def vf_eval(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """verifiers' real CLI (its console script), in a fresh process, offline."""
    exe = shutil.which("vf-eval", path=str(Path(sys.executable).parent)) or "vf-eval"
    env = {
        **os.environ,
        # the scripted test runtime is imported by name from tests/ (never shipped)
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "PRIME_API_KEY": "",
    }
    return subprocess.run(
        [exe, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=240
    )


@pytest.mark.slow  # a vf-eval process (verifiers' import takes seconds) and a server
def test_vf_eval_on_core_returns_leanrls_verdicts(tmp_path: Path) -> None:
    from leanrl import load_environment

    names = [t.name for t in load_environment("core", limit=3).tasks()]
    # the first two proved (the scripted runtime accepts `omega`), the third refuted
    proof_for = {names[0]: "omega", names[1]: "omega", names[2]: "simp"}
    seen: list[dict[str, Any]] = []
    with standin_model(proof_for, seen) as url:
        r = vf_eval(
            [
                "leanrl-verifiers",  # resolved by id: the top-level `leanrl_verifiers` module
                "--env.taskset.env",
                "core",
                "--env.taskset.limit",
                "3",
                "--env.taskset.runtime",
                "_scripted_runtime:ScriptedRuntime",
                "--client.base-url",
                url,
                "-m",
                "standin",
                "--no-push",
                "--no-rich",
                "-o",
                str(tmp_path / "outputs"),
                "--run.name",
                "core-standin",
            ],
            cwd=tmp_path,
        )
    assert r.returncode == 0, r.stderr[-4000:]
    # verifiers' results: one episode per line, each with its traces (one seat: one trace)
    out = tmp_path / "outputs" / "core-standin" / "traces.jsonl"
    episodes = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(e["ok"] and len(e["traces"]) == 1 for e in episodes)
    traces = [e["traces"][0] for e in episodes]
    by_name = {t["task"]["data"]["name"]: t for t in traces}
    assert set(by_name) == set(names)
    for name in names[:2]:
        t = by_name[name]
        assert t["rewards"]["leanrl"]["score"] == 1.0
        assert t["info"]["leanrl_verdict"]["accepted"] is True
        assert t["info"]["leanrl_verdict"]["reason"] == "ok"
    bad = by_name[names[2]]
    assert bad["rewards"]["leanrl"]["score"] == 0.0
    assert bad["info"]["leanrl_verdict"]["reason"] == "error"
    # the model saw leanrl's own prompt (system turn and the statement), one call per task
    assert len(seen) == 3
    assert all(b["model"] == "standin" for b in seen)
    assert all(b["messages"][0]["role"] == "system" for b in seen)
    assert any(names[0] in b["messages"][-1]["content"] for b in seen)
    # vf-eval also printed each trace as JSON (its --no-rich output)
    assert r.stdout.count('"leanrl_verdict"') == 3


@pytest.mark.slow  # a vf-eval process (verifiers' import takes seconds) and a server
def test_vf_eval_retries_an_infra_verdict_and_records_no_score(tmp_path: Path) -> None:
    """leanrl's checker cannot run (the scripted runtime answers `infra` while the flag file
    exists): verifiers' own retry rule reruns the rollout, and what is recorded is an errored
    trace with no reward, which the trace converter does not keep."""
    from leanrl import load_environment
    from leanrl.interop.traces import vf_to_proofs

    (name,) = [t.name for t in load_environment("core", limit=1).tasks()]
    flag = tmp_path / "checker-down"
    flag.write_text("")
    seen: list[dict[str, Any]] = []
    with standin_model({name: "omega"}, seen) as url:
        r = vf_eval(
            [
                "leanrl-verifiers",
                "--env.taskset.env",
                "core",
                "--env.taskset.limit",
                "1",
                "--env.taskset.runtime",
                "_scripted_runtime:ScriptedRuntime",
                "--env.taskset.runtime-options",
                json.dumps({"infra_file": str(flag)}),
                "--env.agent.retries.rules",
                json.dumps([{"type": "LeanrlInfraError", "max_retries": 2}]),
                "--client.base-url",
                url,
                "-m",
                "standin",
                "--no-push",
                "--no-rich",
                "-o",
                str(tmp_path / "outputs"),
                "--run.name",
                "infra",
            ],
            cwd=tmp_path,
        )
    assert r.returncode == 0, r.stderr[-4000:]
    assert len(seen) == 3  # the first rollout and the two retries the rule allows
    run = tmp_path / "outputs" / "infra"
    (episode,) = [json.loads(x) for x in (run / "traces.jsonl").read_text().splitlines()]
    (trace,) = episode["traces"]
    assert trace["ok"] is False
    assert trace["rewards"]["leanrl"] is None  # no score: not a 0 to learn from
    assert trace["info"]["leanrl_verdict"]["reason"] == "infra"
    assert {e["type"] for e in trace["errors"]} == {"LeanrlInfraError"}
    report = vf_to_proofs(run, tmp_path / "proofs.jsonl")
    assert report.written == 0 and report.skipped == {"errored rollout": 1}
