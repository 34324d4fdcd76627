"""``docs/configuration.md``: the Markdown reference of every config model and command.

Kept apart from :mod:`leanrl.config` (which the CLI imports) because the reference lists the
CLI's commands: this module imports the CLI, never the other way round. Regenerate the file with
``python -m leanrl.config_reference > docs/configuration.md`` (``tests/test_docs.py`` checks it).
"""

from __future__ import annotations

from pydantic import BaseModel

from leanrl.cli import _COMMANDS, _load
from leanrl.environment import EnvironmentConfig
from leanrl.launch.config import LauncherConfig
from leanrl.policy import PolicyConfig, SamplingConfig
from leanrl.runtime import RuntimeConfig

__all__ = ["configuration_reference", "reference_markdown"]


def reference_markdown(
    models: list[tuple[str, type[BaseModel]]], shared: dict[type[BaseModel], str] | None = None
) -> str:
    """A Markdown reference of config models (every field, type, default and docstring).

    ``docs/configuration.md`` is generated from this, and a test checks that it is up to date,
    so the reference cannot drift from the code.
    """
    shared = shared or {}
    out: list[str] = []
    for title, model in models:
        doc = " ".join((model.__doc__ or "").strip().split("\n\n")[0].split())
        out += [
            f"## `{title}`\n",
            doc,
            "",
            "| option | type | default | meaning |",
            "| --- | --- | --- | --- |",
        ]
        nested: list[tuple[str, type[BaseModel]]] = []
        for name, f in model.model_fields.items():
            ann = f.annotation
            key = f"`{title}.{name}`"
            if isinstance(ann, type) and ann in shared:
                out.append(f"| {key} | section | see `{shared[ann]}` | {_cell(f.description)} |")
                continue
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                nested.append((f"{title}.{name}", ann))
                out.append(f"| {key} | section | see below | {_cell(f.description)} |")
                continue
            type_s = getattr(ann, "__name__", None) or str(ann).replace("typing.", "")
            default = (
                "(required)" if f.is_required() else repr(f.get_default(call_default_factory=True))
            )
            out.append(f"| {key} | {_cell(type_s)} | {_cell(default)} | {_cell(f.description)} |")
        out.append("")
        if nested:
            out.append(reference_markdown(nested, shared))
    return "\n".join(out)


def _cell(text: str | None) -> str:
    """Text fit for one Markdown table cell."""
    return " ".join((text or "").split()).replace("|", "\\|")


def configuration_reference() -> str:
    """The whole of ``docs/configuration.md``: the shared sections, then every command."""

    shared: dict[type[BaseModel], str] = {
        EnvironmentConfig: "env",
        PolicyConfig: "policy",
        SamplingConfig: "sampling",
        LauncherConfig: "launcher",
    }
    commands_shared: dict[type[BaseModel], str] = {**shared, RuntimeConfig: "env.runtime"}
    head = [
        "# Configuration reference",
        "",
        "Generated from the config models by",
        "`python -m leanrl.config_reference > docs/configuration.md`;",
        "a test fails when it is out of date. Every option can be given in a TOML file",
        "(`--config run.toml`, nested tables such as `[env.taskset]`) or as a flag with dots",
        "(`--env.taskset.limit 20`); flags override the file, which overrides the defaults.",
        "",
    ]
    body = reference_markdown([(v, k) for k, v in shared.items()], {})
    cmds = [
        (f"leanrl {path}", _load(target))
        for path, target in _COMMANDS.items()
        if _load(target).model_fields
    ]
    return "\n".join(head) + body + "\n" + reference_markdown(cmds, commands_shared)


if __name__ == "__main__":
    print(configuration_reference(), end="")
