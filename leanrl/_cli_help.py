"""What the ``leanrl`` command line says besides parsing: the short ``--help``, the list of a
command's flags, and "did you mean" suggestions.

pydantic-settings builds the full parser (and ``--help-all`` is its help); a full listing of a
command with every nested option runs to hundreds of lines, so ``--help`` prints the options a
newcomer needs (the command's own fields and the few nested ones it names in ``cli_common``) and
points at the rest.
"""

from __future__ import annotations

import difflib
import re
import textwrap
import types
import typing
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

__all__ = [
    "command_flags",
    "kebab_flag",
    "mentioned_flags",
    "root_help",
    "short_help",
    "suggest",
]

_WIDTH = 100
_MANY = 12
"""A command with more top-level options than this lists the inherited ones by name only."""


def kebab_flag(token: str) -> str:
    """``--env.taskset.hub_id=x`` -> ``--env.taskset.hub-id=x``: flags are kebab-case; the
    snake_case spelling of the same flag is accepted too. Values are left alone."""
    if not token.startswith("--") or len(token) < 3:
        return token
    name, eq, value = token.partition("=")
    return name.replace("_", "-") + eq + value


def _flag_name(field: str, info: FieldInfo) -> str:
    return (info.alias or field).replace("_", "-")


def _model_type(ann: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds (``Model`` or ``Model | None``), if any."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        models = [
            a for a in typing.get_args(ann) if isinstance(a, type) and issubclass(a, BaseModel)
        ]
        return models[0] if len(models) == 1 else None
    return None


def _walk(cls: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, FieldInfo]]:
    """(dotted flag name, field) for every field, nested models included."""
    for name, info in cls.model_fields.items():
        flag = prefix + _flag_name(name, info)
        sub = _model_type(info.annotation)
        if sub is not None:
            yield flag, info
            yield from _walk(sub, flag + ".")
        else:
            yield flag, info


def command_flags(cls: type[BaseModel]) -> set[str]:
    """Every ``--flag`` the command accepts (kebab-case, without the ``--``), with the short
    forms the CLI adds (``--env ID``, ``--k``) and ``--no-X`` for switches."""
    flags: set[str] = set()
    for flag, info in _walk(cls):
        flags.add(flag)
        if info.annotation is bool:
            flags.add("no-" + flag)
    if "env.id" in flags:
        flags.add("env")
    return flags | {"help", "help-all", "version"}


def suggest(word: str, choices: Iterable[str]) -> str | None:
    """The closest of ``choices`` to ``word`` (None when nothing is close)."""
    options = list(choices)
    hits = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    if not hits and "." in word:  # a typo in the last part of a dotted flag
        tail = word.rsplit(".", 1)[1]
        by_tail = {c.rsplit(".", 1)[-1]: c for c in options if c.startswith(word.rsplit(".", 1)[0])}
        hits = [by_tail[h] for h in difflib.get_close_matches(tail, list(by_tail), n=1)]
    return hits[0] if hits else None


def _type_name(ann: Any) -> str:
    origin = typing.get_origin(ann)
    if origin is typing.Literal:
        return "{" + ",".join(str(a) for a in typing.get_args(ann)) + "}"
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        return _type_name(args[0]) if len(args) == 1 else "VALUE"
    if origin in (list, tuple, set):
        return "LIST"
    if origin is dict or ann is dict:
        return "JSON"
    simple = {int: "INT", float: "FLOAT", str: "TEXT", Path: "PATH"}
    return simple.get(ann, "VALUE")


def _wrap(text: str, width: int, **kw: Any) -> list[str]:
    return textwrap.wrap(text, width, break_on_hyphens=False, **kw)


def _first_paragraph(text: str | None) -> str:
    return " ".join((text or "").strip().split("\n\n")[0].split())


def _lookup(cls: type[BaseModel], dotted: str) -> FieldInfo | None:
    model: type[BaseModel] | None = cls
    info: FieldInfo | None = None
    for part in dotted.split("."):
        if model is None:
            return None
        info = model.model_fields.get(part)
        if info is None:
            return None
        model = _model_type(info.annotation)
    return info


def _option_lines(flag: str, info: FieldInfo, metavar: str | None = None) -> list[str]:
    if info.annotation is bool:
        head = f"  --{flag} / --no-{flag}"
    else:
        head = f"  --{flag} {metavar or _type_name(info.annotation)}"
    text = _first_paragraph(info.description)
    if not info.is_required() and info.annotation is not bool:
        default = info.get_default(call_default_factory=True)
        if default not in (None, "", [], {}) and not isinstance(default, BaseModel):
            text += f" (default: {default})"
    elif info.is_required():
        text += " (required)"
    body = _wrap(text, _WIDTH - 8, initial_indent="      ", subsequent_indent="      ")
    return [head, *body]


def short_help(path: str, cls: type[BaseModel]) -> str:
    """``leanrl PATH --help``: what the command does, its common options, and where the rest
    are."""
    positional = [
        n for n, f in cls.model_fields.items() if any("Positional" in repr(m) for m in f.metadata)
    ]
    usage = " ".join(["usage: leanrl", path, *(n.upper() for n in positional), "[OPTIONS]"])
    doc = (cls.__doc__ or "").strip()
    lines = [usage.rstrip(), ""]
    for para in doc.split("\n\n"):
        lines += _wrap(" ".join(para.split()), _WIDTH)
        lines.append("")
    options: list[str] = []
    others: list[str] = []
    sections: list[str] = []
    common = tuple(getattr(cls, "cli_common", ()))
    if not common and len(cls.model_fields) > _MANY:
        common = ("out",)  # a long command naming none: its own options in full, others by name
    # In full: the command's own fields (its shortcuts), ``--config`` and what it names in
    # ``cli_common``; the other top-level options by name; nested sections by prefix.
    own = [n for n in cls.model_fields if n in vars(cls).get("__annotations__", {})]
    detailed = [*own, *(n for n in common if "." not in n and n not in own), "config"]
    for name in [n for n in detailed if n in cls.model_fields] + [
        n for n in cls.model_fields if n not in detailed
    ]:
        info = cls.model_fields[name]
        flag = _flag_name(name, info)
        if name in positional:
            options += [
                f"  {name.upper()}",
                *_wrap(
                    _first_paragraph(info.description),
                    _WIDTH - 8,
                    initial_indent="      ",
                    subsequent_indent="      ",
                ),
            ]
            continue
        sub = _model_type(info.annotation)
        if sub is not None:
            if "id" in sub.model_fields and name == "env":
                options += _option_lines("env", sub.model_fields["id"], "ID")
            sections.append(f"--{flag}.*")
        elif name in detailed or not common:
            options += _option_lines(flag, info)
        else:
            others.append(f"--{flag}")
    for dotted in (n for n in common if "." in n):
        found = _lookup(cls, dotted)
        if found is not None:
            options += _option_lines(dotted.replace("_", "-"), found)
    lines += ["common options:", *options, ""]
    if others:
        lines += [*_wrap("other options: " + " ".join(others), _WIDTH), ""]
    if sections:
        lines += _wrap(
            "more options, grouped: " + ", ".join(sections) + f". `leanrl {path} --help-all` lists "
            "every option; docs/configuration.md explains them.",
            _WIDTH,
        )
    example = next((f for f, _ in _walk(cls) if "-" in f and "." not in f), None)
    note = "Flags are kebab-case; the snake_case spelling works too"
    note += f" (--{example} = --{example.replace('-', '_')})." if example else "."
    if "config" in cls.model_fields:
        note += " --config FILE.toml reads the same options from a file; flags override it."
    lines += _wrap(note, _WIDTH)
    return "\n".join(lines).rstrip() + "\n"


def root_help(commands: Mapping[str, str], doc: str) -> str:
    """``leanrl --help``: one line per command."""
    width = max(len(c) for c in commands)
    lines = ["usage: leanrl COMMAND [OPTIONS]", "", doc.strip(), "", "commands:"]
    for name, summary in commands.items():
        lines.append(f"  {name:<{width}}  {summary}")
    lines += [
        "",
        "`leanrl COMMAND --help` shows a command's common options, `--help-all` all of them.",
        "`leanrl --version` prints the version and where leanrl is installed.",
    ]
    return "\n".join(lines) + "\n"


def mentioned_flags(text: str) -> set[str]:
    """The ``--flags`` a help text mentions (for the test that every one exists)."""
    return {m.rstrip(".") for m in re.findall(r"(?<![\w-])--([a-z][\w.\-]*)", text)}
