"""``leanrl mcp``: serve an environment's Lean tools (check, goals, search, verify) over MCP.

Imports nothing heavy at module level (the CLI lists every command at start-up).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from leanrl.config import ConfigCommand
from leanrl.environment import EnvironmentConfig

__all__ = ["McpCommand"]


class McpCommand(ConfigCommand):
    """Serve leanrl's Lean tools as an MCP server: check (Lean's messages on a snippet), goals
    (after a partial proof), search (#check / exact?) and verify (the trusted judge's verdict on
    a proof of one of the taskset's theorems).

    Example: leanrl mcp --env minif2f (stdio, for an MCP client to start);
    leanrl mcp --env minif2f --transport streamable-http --port 8765
    """

    cli_common: ClassVar[tuple[str, ...]] = (
        "transport", "port", "env.taskset.path", "env.runtime.workers",
    )  # fmt: skip
    """Options ``--help`` shows in full (the others by name; ``--help-all`` shows every one)."""

    env: EnvironmentConfig = Field(default_factory=EnvironmentConfig)
    """The environment (``--env minif2f``): its theorems are what ``verify`` judges against,
    its runtime runs Lean."""
    transport: Literal["stdio", "streamable-http"] = "stdio"
    """``stdio``: speak MCP on stdin/stdout (an MCP client starts the command);
    ``streamable-http``: serve MCP over HTTP on loopback at ``/mcp``."""
    port: int = Field(default=8765, ge=1, le=65535)
    """``streamable-http``: the loopback port."""

    def cli_cmd(self) -> None:
        from leanrl._dist import require
        from leanrl.environment import load_environment
        from leanrl.interop.mcp_server import build_server

        require("mcp", "mcp", "leanrl mcp")
        cmd = self.resolved()
        env = load_environment(cmd.env)
        server = build_server(env)
        if cmd.transport == "stdio":
            server.run("stdio")
        else:
            server.run("streamable-http", host="127.0.0.1", port=cmd.port)
