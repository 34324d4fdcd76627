"""Function bodies for the local-functions tests (run in the container processes)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any


async def slow_echo(payload: dict[str, Any]) -> dict[str, Any]:
    """Waits ``delay`` seconds, then answers with its index and who ran it."""
    await asyncio.sleep(payload["delay"])
    return {"index": payload["index"], "pid": os.getpid(), "cwd": os.getcwd()}


def die_once(payload: dict[str, Any]) -> int:
    """Kills its container the first time a marker file is missing; then doubles ``x``."""
    marker = Path(payload["marker"])
    if not marker.exists():
        marker.write_text("died")
        os._exit(3)
    return int(payload["x"]) * 2


def always_die(payload: Any) -> None:
    os._exit(4)


def raise_error(payload: Any) -> None:
    raise ValueError(f"bad payload {payload!r}")
