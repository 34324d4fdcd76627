"""Configuration: one pydantic model per concept, read from TOML and overridden on the command line.

The command line is parsed by pydantic-settings (dotted flags such as ``--env.taskset.limit 20``
come from the models themselves); TOML is read by the standard library. The precedence is
*defaults < TOML file < command-line flags*: :func:`merge` lays the flags the user actually typed
over the file.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from leanrl.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["ConfigCommand", "load_toml", "merge", "validate"]

M = TypeVar("M", bound=BaseModel)


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file into a dict, with an error that names the file and line."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise ConfigError(
            f"config file {p} is a folder: --config takes a TOML file (e.g. {p / 'run.toml'})"
        )
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise ConfigError(f"config file {p} cannot be read ({e.strerror})") from None
    try:
        # Decoded here, not by tomllib, whose UnicodeDecodeError names neither file nor line.
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = len(data[data.rfind(b"\n", 0, e.start) + 1 : e.start].decode("utf-8", "replace"))
        raise ConfigError(
            f"config file {p}, line {line}, column {col + 1}: byte "
            f"{data[e.start : e.end][:4].hex(' ')} (byte offset {e.start}) is not UTF-8 "
            f"({e.reason}). TOML files are UTF-8: save it as UTF-8 (e.g. `iconv -f latin1 -t "
            "utf-8 IN > OUT`) or fix that line."
        ) from None
    # A byte-order mark (Windows editors write one) is not TOML, and tomllib's answer was
    # "Invalid statement (at line 1, column 1)": it says nothing, so it is taken off.
    text = text.removeprefix("\ufeff")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {p} is not valid TOML: {e}") from None


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def validate(cls: type[M], data: dict[str, Any], origin: str = "config") -> M:
    """Validate ``data`` as ``cls``; errors name each bad field by its dotted path."""
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            where = ".".join(str(p) for p in err["loc"]) or "(top level)"
            msg = err["msg"]
            if err["type"] == "extra_forbidden":  # a misspelt key in a TOML file, say
                msg = _unknown_key(cls, err["loc"])
            lines.append(f"  {where}: {msg}")
        raise ConfigError(f"invalid {origin}:\n" + "\n".join(lines)) from None


def _unknown_key(cls: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    """What to say about the unknown key at ``loc``: the closest option of the section it is in
    ("did you mean env.taskset.limit?"), as the command line says for a misspelt flag."""
    from leanrl._cli_help import _model_type, suggest

    model: type[BaseModel] | None = cls
    for part in loc[:-1]:
        info = None
        if model is not None and isinstance(part, str):
            info = model.model_fields.get(part) or next(
                (f for f in model.model_fields.values() if f.alias == part), None
            )
        model = _model_type(info.annotation) if info is not None else None
    if model is None:
        return "not an option here"
    names = sorted({f.alias or name for name, f in model.model_fields.items() if not f.exclude})
    section = ".".join(str(p) for p in loc[:-1])
    hit = suggest(str(loc[-1]), names)
    if hit is not None:
        return f"no such option (did you mean {section + '.' if section else ''}{hit}?)"
    where = f"of [{section}]" if section else "at the top level"
    return f"no such option; the options {where} are: {', '.join(names)}"


def merge(cls: type[M], toml_path: str | Path | None, overrides: dict[str, Any]) -> M:
    """Defaults < the TOML file < ``overrides`` (the command-line flags), validated as ``cls``.

    Each side is put in ``cls``'s own names first (``translate_input``, where ``cls`` has one:
    TRL's ``learning_rate`` is GRPO's ``lr``), so a file that uses another spelling of a field
    the flags also set is overridden, not refused as giving the field twice."""
    data: dict[str, Any] = load_toml(toml_path) if toml_path else {}
    origin = f"config {toml_path}" if toml_path else "command line"
    merged = _deep_merge(_own_names(cls, data), _own_names(cls, overrides))
    return validate(cls, merged, origin)


def _own_names(cls: type[BaseModel], data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with ``cls.translate_input`` applied (unchanged when ``cls`` has none, or when
    the translation refuses it: validation then reports why, naming the file)."""
    translate = getattr(cls, "translate_input", None)
    if translate is None:
        return data
    try:
        out = translate(data)
    except ValueError:
        return data
    return out if isinstance(out, dict) else data


class ConfigCommand(BaseModel):
    """Base of CLI commands whose options can also come from a TOML file (``--config``).

    The ``leanrl`` CLI applies the file: defaults < TOML < the flags typed on the command line.
    """

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    # An explicit description: docstrings of inherited fields are not always found by pydantic.
    config: Path | None = Field(
        default=None,
        description="A TOML file with the same options (nested tables, e.g. ``[env.taskset]``); "
        "flags given on the command line override it.",
    )

    def resolved(self: M) -> M:
        """This command with its ``config`` file applied under the values set explicitly.

        The ``leanrl`` CLI has already done this (and gives back an equal object). It matters for
        commands built in Python: ``EvalCommand(config="a.toml", samples=4).resolved()``.
        """
        path = getattr(self, "config", None)
        if path is None:
            return self
        typed = self.model_dump(exclude_unset=True)
        return merge(type(self), path, typed)

    def build_config(
        self,
        cls: type[M],
        what: str,
        shortcuts: dict[str, tuple[str, ...]],
        command_only: tuple[str, ...] = (),
    ) -> M:
        """The ``cls`` config this command describes: the TOML file under the flags typed, each
        shortcut flag (e.g. ``model``) written to its nested place (``("policy", "model")``),
        and the flags that only steer the command (``command_only``, e.g. ``dry_run``) left out.
        ``what`` names the config in validation errors."""
        cmd = self.resolved()
        data: dict[str, Any] = cmd.model_dump(exclude_unset=True)
        for key in ("config", *shortcuts, *command_only):
            data.pop(key, None)
        for flag, place in shortcuts.items():
            value = getattr(cmd, flag)
            if value is None:
                continue
            node = data
            for key in place[:-1]:
                node = node.setdefault(key, {})
            node[place[-1]] = value
        return validate(cls, data, what)
