"""leanrl's Lean tools over MCP, tested with the real `mcp` client library: in process (the
client's in-memory transport) and as `leanrl mcp` over stdio (a real child process). Lean is the
stand-in REPL (tests/fake_repl.py), which proves nothing: these tests assert plumbing and the
refusals leanrl's own trust code makes (pre-scan, unknown theorems), never that a proof holds."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from leanrl import RuntimeConfig, load_environment

pytest.importorskip("mcp")

REPO = Path(__file__).resolve().parent.parent
FAKE = [sys.executable, str(REPO / "tests" / "fake_repl.py")]
DATA = REPO / "tests" / "fixtures" / "data" / "minif2f.jsonl"
THEOREM = json.loads(DATA.read_text(encoding="utf-8").splitlines()[0])["name"]


def _env() -> Any:
    rt = RuntimeConfig(workers=1, timeout_s=20.0, options={"repl_command": FAKE, "spares": 0})
    return load_environment("minif2f", path=str(DATA), split="valid", runtime=rt)


def _text(res: Any) -> str:
    return "".join(getattr(c, "text", "") for c in res.content)


def _is_error(res: Any) -> bool:
    return bool(getattr(res, "is_error", getattr(res, "isError", False)))


async def test_tools_over_the_in_memory_client() -> None:
    from mcp import Client

    from leanrl.interop.mcp_server import build_server

    server = build_server(_env())
    async with Client(server) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools) == {"check", "goals", "search", "verify"}
        schema = (
            tools["verify"].input_schema
            if hasattr(tools["verify"], "input_schema")
            else tools["verify"].inputSchema
        )
        assert set(schema["required"]) == {"theorem", "proof"}

        res = await client.call_tool("goals", {"theorem": THEOREM, "proof_so_far": "intro h"})
        assert not _is_error(res) and _text(res).startswith("Goals:")  # the stand-in's goal

        res = await client.call_tool(
            "check",
            {"code": "run_tac Lean.Elab.Tactic.evalTactic (← `(tactic| rfl))", "theorem": THEOREM},
        )
        assert "pre-scan" in _text(res) and "run_tac" in _text(res)

        res = await client.call_tool("search", {"query": "#eval 1"})
        assert "Error" in _text(res) or "error" in _text(res)

        # verify: refusals by leanrl's own rules, before any Lean verdict could count
        for proof, reason in [
            ("sorry", "sorry"),
            ("native_decide", "native"),
            ("   ", "no_proof"),
            ("run_tac Lean.Elab.Tactic.evalTactic (← `(tactic| rfl))", "forbidden"),
        ]:
            res = await client.call_tool("verify", {"theorem": THEOREM, "proof": proof})
            got = json.loads(_text(res))
            assert got["accepted"] is False and got["reason"] == reason, (proof, got)
            assert got["theorem"] == THEOREM

        # a theorem of the taskset only, named exactly
        res = await client.call_tool("verify", {"theorem": THEOREM + "x", "proof": "omega"})
        assert _is_error(res) and "did you mean" in _text(res)
        res = await client.call_tool("goals", {"theorem": "no_such", "proof_so_far": ""})
        assert _is_error(res) and "no theorem 'no_such'" in _text(res)


async def test_leanrl_mcp_over_stdio_with_the_real_client() -> None:
    from mcp import ClientSession, StdioServerParameters, stdio_client

    leanrl = Path(sys.executable).with_name("leanrl")
    args = [
        "mcp",
        "--env", "minif2f",
        "--env.taskset.path", str(DATA),
        "--env.taskset.split", "valid",
        "--env.runtime.workers", "1",
        "--env.runtime.options", json.dumps({"repl_command": FAKE, "spares": 0}),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LEANRL_ALLOW_UNSANDBOXED")}
    env |= {"HF_HUB_OFFLINE": "1", "LEANRL_ALLOW_UNSANDBOXED": "1"}
    params = StdioServerParameters(command=str(leanrl), args=args, env=env)
    with open(os.devnull, "w", encoding="utf-8") as quiet:
        async with stdio_client(params, errlog=quiet) as (read, write):
            async with ClientSession(read, write) as session:
                init = await session.initialize()
                assert THEOREM in (init.instructions or "")
                names = {t.name for t in (await session.list_tools()).tools}
                assert names == {"check", "goals", "search", "verify"}
                res = await session.call_tool("verify", {"theorem": THEOREM, "proof": "sorry"})
                got = json.loads(_text(res))
                assert got["accepted"] is False and got["reason"] == "sorry"
                res = await session.call_tool("goals", {"theorem": THEOREM})
                assert _text(res).startswith("Goals:")


def test_the_command_says_which_extra_it_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    from leanrl.errors import ConfigError
    from leanrl.interop.mcp_server import build_server

    monkeypatch.setitem(sys.modules, "mcp", None)
    with pytest.raises(ConfigError, match=r"\[mcp\]|`mcp` extra"):
        build_server(_env())
