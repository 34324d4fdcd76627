"""Run files that must never block a resume or fail without saying which file.

- ``proofs.jsonl`` survives bad lines as ``results.jsonl`` does: a cut line, a garbage line in
  the middle, a byte that is not UTF-8 are moved to ``proofs.jsonl.quarantined`` with one
  warning naming the file and how many; the other proofs are kept. For the store itself, for a
  resumed ``leanrl eval`` and for a GRPO run (which reads the file before loading the model).
- A full disk while keeping a proof is a one-line error naming ``proofs.jsonl``.
- A planted pickle in ``optimizer.pt`` is refused without torch's advice to unpickle it.

Eval uses the scripted TEST runtime (a rule, not Lean); GRPO the digit-reward test environment.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest

from leanrl import EnvironmentConfig, RuntimeConfig, TasksetConfig
from leanrl.errors import DatasetError, DiskFullError
from leanrl.eval import EvalConfig, run_eval
from leanrl.proofs import ProofStore, kept_from, read_proofs
from leanrl.task import Task
from tests._scripted_runtime import ScriptedPolicy

TOY = Path(__file__).parent / "fixtures" / "toy_tasks.jsonl"
RT = "tests._scripted_runtime:ScriptedRuntime"
TASK = Task(name="t", header="", formal_statement="theorem t : 1 = 1 := by")

# Three ways a complete line goes bad: cut short (then a newline), garbage, not UTF-8.
CUT = b'{"task_id": "t", "name": "t", "header": "", "formal_sta\n'
GARBAGE = b"#### not json at all ####\n"
NOT_UTF8 = b'{"task_id": "t", "name": "t\xff\xfe", "header": ""}\n'


def _three_proofs(path: Path) -> bytes:
    ProofStore(path).add([kept_from(TASK, f"\n  {tac}") for tac in ("omega", "simp", "rfl")])
    return path.read_bytes()


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize(
    ("where", "bad"),
    [("last", CUT), ("middle", GARBAGE), ("middle", NOT_UTF8), ("middle", CUT)],
    ids=["cut-last-line", "garbage-in-the-middle", "not-utf8", "cut-in-the-middle"],
)
def test_the_store_quarantines_a_bad_line_and_keeps_the_rest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, where: str, bad: bytes
) -> None:
    path = tmp_path / "proofs.jsonl"
    good = _three_proofs(path).splitlines(keepends=True)
    lines = [*good, bad] if where == "last" else [good[0], bad, *good[1:]]
    path.write_bytes(b"".join(lines))
    with caplog.at_level(logging.WARNING, logger="leanrl"):
        store = ProofStore(path).open()
    assert len(store) == 3 and store.count("t") == 3
    [warning] = _warnings(caplog)
    assert str(path) in warning and "not a valid kept proof" in warning
    assert (tmp_path / "proofs.jsonl.quarantined").read_bytes() == bad
    assert path.read_bytes() == b"".join(good)  # the file is whole again
    assert [r.proof for r in read_proofs(path)] == ["\n  omega", "\n  simp", "\n  rfl"]
    assert len(store.add([kept_from(TASK, "\n  decide")])) == 1  # and takes new proofs


def test_the_warning_counts_every_bad_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "proofs.jsonl"
    good = _three_proofs(path).splitlines(keepends=True)
    path.write_bytes(b"".join([good[0], GARBAGE, good[1], NOT_UTF8, good[2], CUT]))
    with caplog.at_level(logging.WARNING, logger="leanrl"):
        assert len(ProofStore(path).open()) == 3
    [warning] = _warnings(caplog)
    assert "line 2" in warning and "and 2 more line(s)" in warning, warning


def test_read_proofs_names_the_line_of_a_byte_that_is_not_utf8(tmp_path: Path) -> None:
    """As input (``--data.proofs``) a bad line is the user's to fix: a DatasetError naming the
    line and the byte, not a UnicodeDecodeError traceback."""
    path = tmp_path / "proofs.jsonl"
    good = _three_proofs(path).splitlines(keepends=True)
    path.write_bytes(b"".join([good[0], NOT_UTF8, *good[1:]]))
    with pytest.raises(
        DatasetError, match=r"proofs\.jsonl, line 2, column 28: byte ff is not UTF-8"
    ):
        read_proofs(path)


def test_a_full_disk_while_keeping_a_proof_names_proofs_jsonl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "proofs.jsonl"
    store = ProofStore(path).open()

    def full(fd: int, data: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(DiskFullError) as got:
        store.add([kept_from(TASK, "\n  omega")])
    monkeypatch.undo()
    msg = str(got.value)
    assert "\n" not in msg and str(path) in msg and "kept proofs" in msg, msg
    # nothing counts as kept that is not on disk: a retry writes it
    assert len(store.add([kept_from(TASK, "\n  omega")])) == 1
    assert [r.proof for r in read_proofs(path)] == ["\n  omega"]


# -- a resumed eval -----------------------------------------------------------------------------


def _eval_config(out: Path) -> EvalConfig:
    return EvalConfig(
        env=EnvironmentConfig(
            id="dataset",
            taskset=TasksetConfig(path=TOY, split="train", limit=4),
            runtime=RuntimeConfig(name=RT),
        ),
        samples=2,
        out=out,
        chunk_tasks=2,
        progress=False,
    )


@pytest.mark.parametrize("bad", [CUT, GARBAGE, NOT_UTF8], ids=["cut", "garbage", "not-utf8"])
async def test_an_eval_resumes_past_a_damaged_proofs_jsonl(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, bad: bytes
) -> None:
    out = tmp_path / "run"
    cfg = _eval_config(out)
    await run_eval(cfg, policy=ScriptedPolicy(["\n  omega\n", "\n  simp\n"]))
    kept = out / "proofs.jsonl"
    good = kept.read_bytes().splitlines(keepends=True)
    assert len(good) == 4  # one proof per task
    # a damaged line in the middle, and the last proof cut as a crash would leave it
    kept.write_bytes(b"".join([good[0], bad, *good[1:3], good[3][:40] + b"\n"]))
    (out / "summary.json").unlink()
    with caplog.at_level(logging.WARNING, logger="leanrl"):
        summary = await run_eval(cfg, policy=ScriptedPolicy(["never called"]))
    assert summary["results"]["solved"] == 4 and (out / "summary.json").is_file()
    assert any(str(kept) in w and "not a valid kept proof" in w for w in _warnings(caplog))
    assert [r.task_id for r in read_proofs(kept)] == ["toy_0", "toy_1", "toy_2"]
    assert (out / "proofs.jsonl.quarantined").read_bytes() == bad + good[3][:40] + b"\n"


# -- a resumed GRPO run -------------------------------------------------------------------------


def test_grpo_reads_proofs_jsonl_before_loading_the_model(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from leanrl.train.grpo.engine import GRPOEngine
    from tests.test_grpo_trainer import _config, _train

    out = tmp_path / "run"
    out.mkdir()
    kept = out / "proofs.jsonl"
    good = _three_proofs(kept).splitlines(keepends=True)
    kept.write_bytes(b"".join([good[0], GARBAGE, good[1], NOT_UTF8, good[2], CUT]))
    seen_at_load: list[bool] = []
    real_load = GRPOEngine.load

    def load(self: GRPOEngine, resumed: bool) -> None:
        seen_at_load.append((out / "proofs.jsonl.quarantined").is_file())
        real_load(self, resumed)

    monkeypatch.setattr(GRPOEngine, "load", load)
    cfg = _config(tiny_model_dir, out, steps=1, sampling={"max_tokens": 4})
    rows = _train(cfg)
    assert [r["step"] for r in rows] == [1]
    assert seen_at_load == [True]  # moved aside before the model loaded
    assert [r.proof for r in read_proofs(kept)] == ["\n  omega", "\n  simp", "\n  rfl"]
    assert (out / "proofs.jsonl.quarantined").read_bytes() == GARBAGE + NOT_UTF8 + CUT


# -- a planted pickle ---------------------------------------------------------------------------


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_in_optimizer_pt_is_refused_without_advice_to_unpickle_it(
    tmp_path: Path,
) -> None:
    import torch

    from leanrl.errors import ConfigError
    from leanrl.train.grpo.engine import load_optimizer_file

    ck = tmp_path / "checkpoint-3"
    ck.mkdir()
    marker = tmp_path / "payload-ran"
    torch.save({"optimizer": {}, "python_rng": _Payload(marker)}, ck / "optimizer.pt")
    with pytest.raises(ConfigError) as got:
        load_optimizer_file(ck / "optimizer.pt", torch.device("cpu"))
    msg = str(got.value)
    assert not marker.exists()
    assert "\n" not in msg and str(ck / "optimizer.pt") in msg
    assert "leanrl never unpickles run files" in msg
    assert f"Delete {ck}" in msg and "start the run over" in msg
    assert "system" in msg  # what torch found (the global it refused), kept
    # torch's own advice (retry with weights_only=False) is not repeated
    assert "weights_only" not in msg and "will likely succeed" not in msg, msg
