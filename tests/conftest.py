"""Shared test set-up: offline hub, one thread, the fixture data, Lean detection, tiny model."""

from __future__ import annotations

import os

# Before anything imports transformers/datasets/torch: no hub calls (they hang ~20 s offline),
# and one thread per process (2-core machines thrash otherwise).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import json
import shutil
from pathlib import Path

from leanrl.lean.trust.containment import isolation_problem

# Where bubblewrap works (CI installs it), every local runtime in the tests runs sandboxed, as
# users' do. Where it does not, the tests run Lean stand-ins without it instead of refusing.
if isolation_problem() is not None:
    os.environ.setdefault("LEANRL_ALLOW_UNSANDBOXED", "1")

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("LEANRL_SHARED_DATA", REPO.parent / "shared" / "data"))


def lean_available() -> bool:
    """A real Lean toolchain is reachable (on PATH, or a configured project)."""
    return shutil.which("lean") is not None or bool(os.environ.get("LEANRL_LEAN_PROJECT"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_lean = pytest.mark.skip(
        reason="needs a real Lean toolchain: `lean` is not on PATH and LEANRL_LEAN_PROJECT is unset"
    )
    gpu = False
    try:
        import torch

        gpu = torch.cuda.is_available()
    except ImportError:
        pass
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (none found)")
    skip_modal = pytest.mark.skip(
        reason="needs Modal credentials and network (set LEANRL_TEST_MODAL=1 to run)"
    )
    for item in items:
        if "lean" in item.keywords and not lean_available():
            item.add_marker(skip_lean)
        if "gpu" in item.keywords and not gpu:
            item.add_marker(skip_gpu)
        if "modal" in item.keywords and not os.environ.get("LEANRL_TEST_MODAL"):
            item.add_marker(skip_modal)


FIXTURE_DATA = REPO / "tests" / "fixtures" / "data"


@pytest.fixture(scope="session")
def bench_data() -> Path:
    """The tests' own benchmark excerpts (a few rows of each file, a few REPL transcripts)."""
    return FIXTURE_DATA


@pytest.fixture(scope="session")
def data_roots() -> list[Path]:
    """Folders to run whole-data checks over: the fixtures, plus the full benchmark data when it
    is there (``../shared/data`` or ``LEANRL_SHARED_DATA``); without it the checks still run, on
    the fixtures alone."""
    roots = [FIXTURE_DATA]
    if (SHARED_DATA / "minif2f.jsonl").is_file():
        roots.append(SHARED_DATA)
    return roots


def tiny_model_texts(data: Path = FIXTURE_DATA) -> list[str]:
    """What the tiny test tokenizer is trained on: Lean statements and the usual tactics."""
    texts = []
    for line in (data / "minif2f.jsonl").open(encoding="utf-8"):
        row = json.loads(line)
        texts.append(row["header"] + row["formal_statement"] + "\n  nlinarith [sq_nonneg x]\n")
    texts += ["```lean4\n", "```", "Complete the following Lean 4 code:", "omega", "simp", "rfl"]
    return texts


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama model + a BPE tokenizer trained here on fixture text (no download)."""
    from leanrl.testing import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-model"), tiny_model_texts())


TOY_TASKS = Path(__file__).parent / "fixtures" / "toy_tasks.jsonl"


@pytest.fixture(scope="session")
def toy_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama model + a BPE tokenizer trained on the toy tasks (tests/fixtures; no
    shared data, no download). ``omega`` is one token of its vocabulary."""
    from leanrl.testing import make_tiny_model

    texts = []
    for line in TOY_TASKS.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        texts += [row["formal_statement"] + "\n  omega\n```", row["informal_statement"]]
    texts += ["Complete the following Lean 4 code:\n\n```lean4\n", "omega", "simp", "rfl"] * 4
    return make_tiny_model(tmp_path_factory.mktemp("toy-model"), texts, vocab_size=320)


@pytest.fixture(scope="session")
def own_tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama + BPE tokenizer trained on a few lines kept here (no shared data)."""
    from leanrl.testing import make_tiny_model

    texts = [f"theorem t{i} : {i} + {i} = {2 * i} := by\n  omega\n" for i in range(40)]
    texts += ["0123456789 " * 8, "simp rfl norm_num linarith", "```lean4\n```"]
    return make_tiny_model(tmp_path_factory.mktemp("own-tiny-model"), texts)


@pytest.fixture
def no_lean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """This machine without Lean: no configured project, none made by `leanrl setup`, and no
    `lean` or `repl` on PATH."""
    monkeypatch.delenv("LEANRL_LEAN_PROJECT", raising=False)
    monkeypatch.setenv("LEANRL_CACHE", str(tmp_path / "no-lean-cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "no-lean-bin"))
