"""A training run's W&B run: one id per run folder, made once and kept, files under the folder.

W&B's run id names the run on the server; two runs with the same id are one run once synced
(``resume="allow"`` appends to it). The run folder's name is no id: ``--out runs/sft`` and
``--out other/sft`` share it. So the id is drawn at random the first time a run folder logs to
W&B, stored in the folder (``wandb_id``), and read back when the run resumes, so a resumed run
continues its own W&B run and no other. W&B's local files (``wandb/``, synced later with
``wandb sync`` when offline) go under the run folder too, not into the current folder.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import string
from pathlib import Path
from typing import Any

from leanrl.errors import ConfigError

__all__ = ["WANDB_ID_FILE", "start_wandb", "wandb_id"]

WANDB_ID_FILE = "wandb_id"
"""The file in the run folder that holds the run's W&B id."""

_ID = re.compile(r"^[a-z0-9]{8,64}$")
_ALPHABET = string.ascii_lowercase + string.digits


def wandb_id(run_path: str | Path) -> str:
    """The W&B id of the run in ``run_path``: the stored one, else a new random one, stored
    (created exclusively, so two processes starting one folder at once agree on one id)."""
    folder = Path(run_path).expanduser()
    path = folder / WANDB_ID_FILE
    if path.is_file():
        stored = path.read_text(encoding="utf-8").strip()
        if not _ID.match(stored):
            raise ConfigError(
                f"{path} holds {stored[:40]!r}, not a W&B run id (8-64 lower-case letters and "
                "digits); delete the file to start a new W&B run for this folder"
            )
        return stored
    folder.mkdir(parents=True, exist_ok=True)
    new = "".join(secrets.choice(_ALPHABET) for _ in range(12))
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:  # another process of this run wrote it first: use theirs
        return wandb_id(folder)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(new + "\n")
    return new


def start_wandb(run_path: str | Path, name: str, config: dict[str, Any]) -> Any:
    """``wandb.init`` for the run in ``run_path``: its stored id (resumed when the run is),
    ``name`` as the display name, and W&B's files under the run folder."""
    try:
        import wandb
    except ImportError:
        raise ConfigError(
            "log_to includes 'wandb' but wandb is not installed: pip install wandb (or leanrl's "
            "[wandb] extra)"
        ) from None
    folder = Path(run_path).expanduser()
    rid = wandb_id(folder)
    with contextlib.suppress(OSError):
        folder.mkdir(parents=True, exist_ok=True)
    return wandb.init(id=rid, name=name, config=config, resume="allow", dir=str(folder))
