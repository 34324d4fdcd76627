"""``leanrl serve``: run the verification service. Imports stay light until the command runs."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from leanrl._dist import require
from leanrl._sandbox_config import ServiceLimits
from leanrl.config import ConfigCommand
from leanrl.runtime import RuntimeConfig
from leanrl.service.kimina import KiminaConfig

__all__ = ["ServeCommand"]


class ServeCommand(ConfigCommand):
    """Run the verification service: a runtime (default `local`) behind HTTP.

    Endpoints: POST /check, POST /sessions (tactic mode), GET /health, GET /metrics. Binding an
    address other than loopback needs a bearer token (--token or LEANRL_SERVICE_TOKEN). The
    docker and modal runtimes run this inside their sandboxes; see docs/sandboxes.md.
    """

    cli_common: ClassVar[tuple[str, ...]] = (
        "host", "port", "uds", "token", "port_file", "log_level", "warm_headers",
        "runtime.name", "runtime.workers", "runtime.lean_project",
    )  # fmt: skip
    """Options ``--help`` shows in full (the others by name; ``--help-all`` shows every one)."""

    host: str = "127.0.0.1"
    """Address to bind. Anything other than loopback requires a token."""
    port: int = Field(default=8000, ge=0, le=65535)
    """TCP port; 0 picks a free one (written to --port-file)."""
    uds: str | None = None
    """Listen on this unix socket instead of TCP."""
    uds_mode: str = Field(default="0600", pattern=r"^0?[0-7]{3}$")
    """Permissions of the unix socket (octal). 0600: only this user can connect. A mode that
    lets a group or other users connect (0660, 0666) needs a token."""
    token: str | None = None
    """Bearer token required on every request except GET /health. Default: the
    LEANRL_SERVICE_TOKEN environment variable."""
    port_file: Path | None = None
    """Write the bound port here once the service is listening and its runtime has started
    (useful with --port 0); removed again when the service stops. A service that fails to
    start writes none."""
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "warning"
    """uvicorn's log level."""
    limits: ServiceLimits = Field(default_factory=ServiceLimits)
    """Request size, batch length, request timeout, sessions and idempotency cache."""
    warm_headers: list[str] = Field(default_factory=list)
    """Headers whose Lean processes start (imports loaded) before the service listens, e.g.
    '["import Mathlib"]', so the first batch does not wait for them."""
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    """The runtime the service wraps (default: the local Lean pool)."""
    kimina: KiminaConfig = Field(default_factory=KiminaConfig)
    """The Kimina-compatible endpoints (POST /verify, POST /api/check): which tasksets name the
    reference statements, and whether a request's own statement is accepted
    (docs/interop.md)."""

    def cli_cmd(self) -> None:
        require("fastapi", "serve", "leanrl serve")
        require("uvicorn", "serve", "leanrl serve")
        from leanrl.service.server import serve

        cmd = self.resolved()
        serve(cmd)
