"""The commands' side of launching: ``--dry-run`` and ``--launcher.name modal``."""

from __future__ import annotations

import json
import os
from typing import Any

from leanrl.launch.functions import ROLE_ENV

__all__ = ["launched"]


def launched(kind: str, config: Any, dry_run: bool) -> bool:
    """Handle the command here when it is a dry run or a Modal launch; True when handled.

    Inside a launched container (the job itself) the command always runs in place.
    """
    if dry_run:
        from leanrl.launch.plan import plan_for

        print(plan_for(kind, config).render())
        return True
    if config.launcher.name != "modal" or os.environ.get(ROLE_ENV):
        return False
    from leanrl.launch.launcher import launch

    result = launch(kind, config)
    m = config.launcher.modal
    where = m.local_volume if m.backend == "local" else f"Modal Volume {m.volume!r}"
    print(f"done on {m.backend}; run folder on {where}: {result.get('out')}")
    if kind == "eval":
        print(json.dumps(result.get("results", {}).get("pass_at_k", {}).get("all", {})))
    return True
