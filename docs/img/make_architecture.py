"""Draw docs/img/architecture.png: leanrl's import graph, package by package, in layers.

    .venv/bin/python docs/img/make_architecture.py        # needs matplotlib (the `plot` extra)

The graph is the one ``tests/test_import_graph.py`` checks (every import statement of
``leanrl/``, ``environments/``, ``harnesses/`` and ``runtimes/``, lazy and TYPE_CHECKING ones
included), with its modules grouped into the boxes of :data:`BOXES`. A box's row is its longest
chain of imports down to the ground floor, so every arrow points down; an arrow implied by a
longer path is left out (transitive reduction). The script fails if a module belongs to no box
or if the boxes import each other in a circle, so the picture cannot drift from the code.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent / "architecture.png"

_spec = importlib.util.spec_from_file_location("import_graph", REPO / "tests/test_import_graph.py")
assert _spec is not None and _spec.loader is not None
ig = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ig)

_COMMANDS = (
    "leanrl.cli",
    "leanrl.config_reference",
    "leanrl.decontam_cli",
    "leanrl.models_cli",
    "leanrl.interop.traces_cli",
    "leanrl.lean.commands",
    "leanrl.eval.cli",
    "leanrl.launch.cli",
    "leanrl.service.cli",
    "leanrl.service.__main__",
    "leanrl.train.grpo.cli",
    "leanrl.train.es.cli",
    "leanrl.train.es_cli",
    "leanrl.train.sft.cli",
    "leanrl.train.sft.expert_iteration_cli",
    "leanrl.train.distill.cli",
)

BOXES: dict[str, tuple[str, tuple[str, ...]]] = {
    "ground floor\nerrors · verdict · task · config\nregistry · jsonl · costs · runlock\nmodels · lean.versions · ...": (
        "ground",
        ig.GROUND,
    ),
    "policy · rollout": ("core", ("leanrl.policy", "leanrl.rollout")),
    "runtime": ("core", ("leanrl.runtime", "leanrl._sandbox_config")),
    "proofs": ("core", ("leanrl.proofs",)),
    "taskset": ("core", ("leanrl.taskset", "leanrl.decontam_match")),
    "harness": ("core", ("leanrl.harness",)),
    "environment": ("core", ("leanrl.environment",)),
    "decontam": ("core", ("leanrl.decontam",)),
    "lean/\nREPL · pool · trusted judge": ("lean", ("leanrl.lean",)),
    "policies/\nhf · openai · vllm": ("core", ("leanrl.policies",)),
    "service/ (client)\nsandbox pool · client": ("core", ("leanrl.service",)),
    "service/ (server)\nleanrl serve": (
        "app",
        (
            "leanrl.service.app",
            "leanrl.service.guard",
            "leanrl.service.server",
            "leanrl.service.kimina",
        ),
    ),
    "environments/": ("plugin", ("leanrl.environments",)),
    "harnesses/": ("plugin", ("leanrl.harnesses",)),
    "runtimes/\nlocal · docker · modal": ("plugin", ("leanrl.runtimes",)),
    "eval/": ("app", ("leanrl.eval",)),
    "train/ (shared)\nrun folder · metrics\nin-run eval · vLLM sync": ("app", ("leanrl.train",)),
    "train/lora.py": ("app", ("leanrl.train.lora",)),
    "train/grpo/\n+ on-policy distillation": (
        "app",
        (
            "leanrl.train.grpo",
            "leanrl.train.distill.config",
            "leanrl.train.distill.teacher",
            "leanrl.train.distill.objective",
            "leanrl.train.distill.onpolicy",
        ),
    ),
    "train/distill/\nsequence-level · experts": ("app", ("leanrl.train.distill",)),
    "train/es/": (
        "app",
        (
            "leanrl.train.es",
            "leanrl.train.es_history",
            "leanrl.train.es_workers",
            "leanrl.train.es_fanout",
        ),
    ),
    "train/sft/\nSFT · expert iteration": (
        "app",
        ("leanrl.train.sft", "leanrl.train.sft_data", "leanrl.train.expert_iteration"),
    ),
    "launch/config": ("core", ("leanrl.launch.config",)),
    "launch/\nlocal · Modal": ("app", ("leanrl.launch",)),
    "compare": ("app", ("leanrl.compare",)),
    "average": ("app", ("leanrl.average",)),
    "interop/\nverifiers · traces · tactics": ("app", ("leanrl.interop",)),
    "import leanrl\n(the public API)": ("api", ("=leanrl", "=leanrl.train")),
    "commands\nleanrl eval · train · serve · ...": ("cli", tuple("=" + m for m in _COMMANDS)),
}
"""The boxes of the picture: ``label -> (kind, module names)``. A name holds its submodules too,
unless it starts with ``=`` (that module only); the longest name that holds a module wins."""

LEFT_OUT = ("leanrl.testing",)
"""Modules not drawn: test helpers for users (a tiny model), importing nothing of leanrl."""

COLOURS = {
    "ground": "#d9d9d9",
    "core": "#c6dbef",
    "lean": "#c7e9c0",
    "plugin": "#fdd0a2",
    "app": "#dadaeb",
    "api": "#fcbba1",
    "cli": "#fcbba1",
}

EDGE_COLOURS = {
    "ground": "#737373",
    "core": "#2171b5",
    "lean": "#238b45",
    "plugin": "#d94801",
    "app": "#6a51a3",
    "api": "#cb181d",
    "cli": "#cb181d",
}
"""An arrow has the colour of the box that imports."""


def box_of(module: str) -> str | None:
    """The box a module is drawn in: the box with the longest name that holds it."""
    if module in LEFT_OUT:
        return None
    best, length = None, -1.0
    for label, (_, names) in BOXES.items():
        for name in names:
            exact = name.startswith("=")
            name = name.lstrip("=")
            holds = module == name or (not exact and module.startswith(name + "."))
            if holds and len(name) + exact > length:  # a tie goes to the exact name
                best, length = label, len(name) + exact
    if best is None:
        raise SystemExit(f"{module} belongs to no box: add it to BOXES in {__file__}")
    return best


def box_graph(graph: Mapping[str, Mapping[str, int]]) -> dict[str, set[str]]:
    """Box -> the boxes it imports."""
    out: dict[str, set[str]] = {label: set() for label in BOXES}
    for module, targets in graph.items():
        a = box_of(module)
        for target in targets:
            b = box_of(target)
            if a is not None and b is not None and a != b:
                out[a].add(b)
    return out


def layers(edges: Mapping[str, set[str]]) -> dict[str, int]:
    """Each box's row: the length of its longest chain of imports (the ground floor is 0)."""
    cycles = ig.find_cycles({a: dict.fromkeys(bs, 0) for a, bs in edges.items()})
    if cycles:
        raise SystemExit(f"boxes import each other in a circle: {cycles}; regroup BOXES")

    @cache
    def row(box: str) -> int:
        return 1 + max((row(b) for b in edges[box]), default=-1)

    return {box: row(box) for box in edges}


def reduced(edges: Mapping[str, set[str]]) -> dict[str, set[str]]:
    """The arrows left after dropping those a longer path implies (transitive reduction)."""

    @cache
    def below(box: str) -> frozenset[str]:
        return frozenset(edges[box]).union(*(below(b) for b in edges[box]))

    return {
        a: {b for b in bs if not any(b in below(c) for c in bs - {b})} for a, bs in edges.items()
    }


def positions(
    edges: Mapping[str, set[str]], row: Mapping[str, int]
) -> dict[str, tuple[float, float]]:
    """x in each row ordered by the mean x of what a box imports (a few sweeps), rows evenly
    spaced; every row centred."""
    rows: dict[int, list[str]] = {}
    for box in BOXES:  # BOXES order is the first guess within a row
        rows.setdefault(row[box], []).append(box)
    width = max(len(r) for r in rows.values())
    x: dict[str, float] = {}

    def place() -> None:
        for boxes in rows.values():
            offset = (width - len(boxes)) / 2
            for i, box in enumerate(boxes):
                x[box] = offset + i

    place()
    up: dict[str, set[str]] = {b: set() for b in edges}
    for a, bs in edges.items():
        for b in bs:
            up[b].add(a)
    for _ in range(8):
        for level in sorted(rows):
            neigh = {b: [x[n] for n in sorted(edges[b] | up[b])] for b in rows[level]}
            rows[level].sort(key=lambda b: sum(neigh[b]) / len(neigh[b]) if neigh[b] else x[b])
            place()
    return {box: (x[box] * 2.3, row[box] * 1.25) for box in BOXES}


def draw(path: Path = OUT) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch

    graph = ig.import_graph(ig.find_modules())
    edges = box_graph(graph)
    row = layers(edges)
    arrows = reduced(edges)
    pos = positions(arrows, row)
    xs = [p[0] for p in pos.values()]
    ys = [p[1] for p in pos.values()]
    fig, ax = plt.subplots(figsize=(16, 11))
    ax.set_xlim(min(xs) - 1.4, max(xs) + 1.4)
    ax.set_ylim(min(ys) - 0.8, max(ys) + 0.8)
    ax.axis("off")
    w = 1.75
    h = {box: 0.42 + 0.15 * box.count("\n") for box in BOXES}
    for a, bs in arrows.items():
        for b in sorted(bs):  # sorted: the same picture on every run
            (x0, y0), (x1, y1) = pos[a], pos[b]
            ax.add_patch(
                FancyArrowPatch(
                    (x0, y0 - h[a] / 2),
                    (x1, y1 + h[b] / 2),
                    arrowstyle="-|>",
                    mutation_scale=11,
                    color=EDGE_COLOURS[BOXES[a][0]],
                    lw=0.9,
                    alpha=0.8,
                    zorder=1,
                )
            )
    for box, (kind, _) in BOXES.items():
        bx, by = pos[box]
        ax.add_patch(
            FancyBboxPatch(
                (bx - w / 2, by - h[box] / 2),
                w,
                h[box],
                boxstyle="round,pad=0.02,rounding_size=0.08",
                fc=COLOURS[kind],
                ec="#525252",
                lw=0.9,
                zorder=2,
            )
        )
        title, *rest = box.split("\n")
        top = by + h[box] / 2 - 0.2
        ax.text(bx, top if rest else by, title, ha="center", va="center", fontsize=10.5,
                weight="bold", zorder=3)  # fmt: skip
        if rest:
            sub = "\n".join(rest)
            ax.text(
                bx, top - 0.14, sub, ha="center", va="top", fontsize=8, zorder=3, linespacing=1.15
            )
    legend = [
        Patch(fc=COLOURS["ground"], ec="#525252", label="ground floor (imports only itself)"),
        Patch(fc=COLOURS["core"], ec="#525252", label="the concepts and their interfaces"),
        Patch(fc=COLOURS["lean"], ec="#525252", label="Lean: processes and the trusted judge"),
        Patch(fc=COLOURS["plugin"], ec="#525252", label="built-ins (entry points)"),
        Patch(fc=COLOURS["app"], ec="#525252", label="applications: eval, trainers, launch"),
        Patch(fc=COLOURS["cli"], ec="#525252", label="entry points: the CLI, `import leanrl`"),
    ]
    ax.legend(handles=legend, loc="lower left", fontsize=9, frameon=False)
    ax.set_title(
        "leanrl's import graph: an arrow A → B means A imports B (every import, lazy ones too; an\n"
        "arrow has the importer's colour; arrows implied by a longer path are left out). No circles:"
        " everything points down.",
        fontsize=12,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    print(draw(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT))
