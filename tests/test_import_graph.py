"""The import graph: no circles, and a ground floor that imports nothing above it.

The graph is read with ``ast`` from every ``.py`` file of ``leanrl/``, ``environments/``,
``harnesses/`` and ``runtimes/`` (the last three install as ``leanrl.environments``,
``leanrl.harnesses`` and ``leanrl.runtimes``; pyproject's ``package-dir``). A module is a node;
every import statement is an edge, wherever it stands:

- at module level;
- inside a function: a lazy import is still a dependency, and one that is lazy only to dodge a
  circle is still a circle (it only moves the failure from import time to call time);
- under ``if TYPE_CHECKING:``: the types a module names are part of what it depends on.

Two things are not edges. Importing ``a.b`` first runs ``a/__init__.py``; that implicit parent
import is left out (else every module would close a circle through ``leanrl/__init__.py``, the
public facade that re-exports the core). And imports by string (``importlib.import_module``,
entry points, ``"module:attr"`` names) are not statements: they are how plugins, CLI commands and
launched function bodies are found at run time, by name, from above.

``docs/architecture.md`` draws the same graph (``docs/img/make_architecture.py`` imports this
module).
"""

from __future__ import annotations

import ast
import importlib.util
import itertools
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

ROOTS: dict[str, str] = {
    "leanrl": "leanrl",
    "environments": "leanrl.environments",
    "harnesses": "leanrl.harnesses",
    "runtimes": "leanrl.runtimes",
}
"""Source folder -> the package it installs as."""

GROUND: tuple[str, ...] = (
    "leanrl.errors",
    "leanrl.verdict",
    "leanrl.task",
    "leanrl.config",
    "leanrl.registry",
    "leanrl.jsonl",
    "leanrl.integrity",
    "leanrl.runlock",
    "leanrl.models",
    "leanrl.costs",
    "leanrl.decontam_config",
    "leanrl.lean.versions",
    "leanrl._dist",
    "leanrl._hub",
    "leanrl._cli_help",
)
"""The ground floor: the exception tree, the verdict and the task (the data every layer passes
around), the config base of the commands, the plugin registry, and small helpers (JSONL files,
checkpoint integrity, run-folder locks, prices, the decontamination options, the REPL revision table, install
hints). A ground-floor module imports only ground-floor modules, never anything above."""

HIGHER: tuple[str, ...] = (
    "leanrl.train",
    "leanrl.eval",
    "leanrl.service",
    "leanrl.launch",
    "leanrl.cli",
)
"""The application layers (named in the failure message when the ground floor reaches one)."""

Graph = Mapping[str, Mapping[str, int]]
"""module -> {imported module: line of the first import statement}."""


# -- building the graph ---------------------------------------------------------------------------


def find_modules(repo: Path = REPO, roots: Mapping[str, str] = ROOTS) -> dict[str, Path]:
    """Every module under ``roots`` by its import name (a package by its ``__init__.py``)."""
    out: dict[str, Path] = {}
    for folder, package in roots.items():
        for path in sorted((repo / folder).rglob("*.py")):
            parts = list(path.relative_to(repo / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


def _deepest(name: str, modules: Iterable[str]) -> str | None:
    """``name`` or its deepest prefix that is a module (``a.b.C`` -> ``a.b``); None: not ours."""
    known = set(modules)
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, path: Path, modules: Mapping[str, Path]) -> dict[str, int]:
    """The modules ``module`` (the file ``path``) imports: every import statement in the file."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            # `from a import b`: b is the submodule a.b when there is one, else a name in a.
            names = [
                f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                for alias in node.names
            ]
        else:
            continue
        for name in names:
            target = _deepest(name, modules)
            if target is not None and target != module:
                out.setdefault(target, node.lineno)
    return out


def import_graph(modules: Mapping[str, Path]) -> dict[str, dict[str, int]]:
    """The import graph of ``modules`` (see the module docstring for what counts)."""
    return {m: imports_of(m, p, modules) for m, p in modules.items()}


# -- the checks -----------------------------------------------------------------------------------


def find_cycles(graph: Graph) -> list[list[str]]:
    """One circle per strongly connected component of ``graph`` (Tarjan), each as the path
    ``[a, b, ..., a]``. Empty when the graph has none."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, {}):
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_circle_in(graph, c) for c in components]


def _circle_in(graph: Graph, component: set[str]) -> list[str]:
    """A shortest circle through the first module of ``component`` (breadth-first)."""
    start = min(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph.get(v, {})):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start] if v != start else [start, start]
                if w in component and w not in came_from:
                    came_from[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no circle through {start} in its own component")  # pragma: no cover


def upward_imports(graph: Graph, ground: Iterable[str] = GROUND) -> list[tuple[str, str, int]]:
    """Imports from a ground-floor module to any module above the ground floor, as
    ``(importer, imported, line)``."""
    floor = set(ground)
    return sorted(
        (m, target, line)
        for m in floor
        for target, line in graph.get(m, {}).items()
        if target not in floor
    )


def describe_cycle(graph: Graph, modules: Mapping[str, Path], cycle: list[str]) -> str:
    """``a -> b -> a`` with where each import is (``leanrl/a.py:12``)."""
    steps = []
    for a, b in itertools.pairwise(cycle):
        where = modules.get(a)
        loc = f"{_shown(where)}:{graph[a][b]}" if where else f"{a}:{graph[a][b]}"
        steps.append(f"  {a} -> {b}  ({loc})")
    return " -> ".join(cycle) + "\n" + "\n".join(steps)


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


# -- the tests ------------------------------------------------------------------------------------

MODULES = find_modules()
GRAPH = import_graph(MODULES)


def test_the_graph_covers_the_whole_tree() -> None:
    assert len(MODULES) > 150, sorted(MODULES)
    for name in (
        "leanrl.environment",
        "leanrl.train.grpo.trainer",
        "leanrl.train.es.trainer",
        "leanrl.train.sft.trainer",
        "leanrl.environments.minif2f",
        "leanrl.harnesses.whole_proof.harness",
        "leanrl.runtimes.local",
        *GROUND,
    ):
        assert name in MODULES, f"{name} is not in the graph (renamed? update GROUND)"
    # the lazy import of the trainers by leanrl.train's facade is seen, and so is a
    # TYPE_CHECKING one
    assert "leanrl.train.grpo" in GRAPH["leanrl.train"]
    assert "leanrl.proofs" in GRAPH["leanrl.harness"]


def test_no_import_circles() -> None:
    cycles = find_cycles(GRAPH)
    assert not cycles, "import circles (break each by moving the shared piece down a layer):\n" + (
        "\n".join(describe_cycle(GRAPH, MODULES, c) for c in cycles)
    )


def test_the_ground_floor_imports_nothing_above_it() -> None:
    bad = upward_imports(GRAPH)
    lines = []
    for m, target, line in bad:
        layer = next((h for h in HIGHER if target == h or target.startswith(h + ".")), None)
        what = f"the {layer} layer" if layer else "a module above the ground floor"
        lines.append(f"  {_shown(MODULES[m])}:{line}: {m} imports {target} ({what})")
    assert not bad, "the ground floor imports upward:\n" + "\n".join(lines)


def test_the_architecture_picture_places_every_module() -> None:
    """docs/img/make_architecture.py draws this graph in boxes; a module no box holds, or boxes
    that import each other, would make the picture wrong (it needs no matplotlib to check)."""
    spec = importlib.util.spec_from_file_location("arch", REPO / "docs/img/make_architecture.py")
    assert spec is not None and spec.loader is not None
    arch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(arch)
    rows = arch.layers(arch.box_graph(GRAPH))  # SystemExit names the module or the circle
    assert min(rows.values()) == 0 and rows[next(iter(arch.BOXES))] == 0  # the ground floor


# -- the test of the test -------------------------------------------------------------------------


def test_the_checks_catch_a_circle_and_an_upward_import() -> None:
    clean = {"g.errors": {}, "g.task": {"g.errors": 1}, "g.train": {"g.task": 3, "g.errors": 4}}
    assert find_cycles(clean) == [] and upward_imports(clean, ["g.errors", "g.task"]) == []

    circle = {**clean, "g.task": {"g.errors": 1, "g.rollout": 2}, "g.rollout": {"g.task": 5}}
    assert find_cycles(circle) == [["g.rollout", "g.task", "g.rollout"]]
    three = {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}
    assert find_cycles(three) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"a": 1}}) == [["a", "a"]]

    upward = {**clean, "g.task": {"g.errors": 1, "g.train": 9}}
    assert upward_imports(upward, ["g.errors", "g.task"]) == [("g.task", "g.train", 9)]


def test_lazy_and_type_checking_imports_count(tmp_path: Path) -> None:
    """The graph built from files sees imports inside functions and under TYPE_CHECKING, and
    resolves relative and ``from package import submodule`` imports."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg.low import Thing\n")
    (pkg / "low.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sub.high import X\n"
    )
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "high.py").write_text("def f():\n    from .. import low\n    return low\n")
    (pkg / "other.py").write_text("import pkg.sub.high\nfrom pkg import low as L, os\n")
    modules = find_modules(tmp_path, {"pkg": "pkg"})
    graph = import_graph(modules)
    assert graph["pkg.low"] == {"pkg.sub.high": 3}
    assert graph["pkg.sub.high"] == {"pkg.low": 2}
    assert graph["pkg.other"] == {"pkg.sub.high": 1, "pkg.low": 2, "pkg": 2}
    assert find_cycles(graph) == [["pkg.low", "pkg.sub.high", "pkg.low"]]
    assert upward_imports(graph, ["pkg.low"]) == [("pkg.low", "pkg.sub.high", 3)]
