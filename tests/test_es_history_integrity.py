"""The ES history's hash chain and the checkpoints' digests: an edited record is refused.

A per-record CRC let a coefficient be changed, its CRC recomputed, and the run resume or replay
other weights without a word. These tests make exactly those edits (and stronger ones: every
later checksum recomputed, an old format 2 file) and check that resume and ``replay`` refuse
with one line naming the history and the iteration.
"""

from __future__ import annotations

import json
import shutil
import struct
import zlib
from dataclasses import replace
from pathlib import Path

import pytest
from test_es_learning import toy_config

from leanrl.errors import ConfigError
from leanrl.train.es import ESTrainer
from leanrl.train.es.history import (
    DIGEST_KEY,
    MAGIC_V2,
    ESHistory,
    HistoryMeta,
    HistoryRecord,
    chain_digest,
    draw_seeds,
    f32,
    header_digest,
    master_equal,
    replay,
)

META = HistoryMeta(run_seed=0, device_type="cpu", dtype="float32")


@pytest.fixture(scope="module")
def run5(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> ESTrainer:
    """A finished 5-iteration run with checkpoints 2, 4 and 5."""
    out = tmp_path_factory.mktemp("es-int") / "run"
    tr = ESTrainer(toy_config(tiny_model_dir, out, steps=5, save_every=2))
    tr.train_sync()
    assert [s for s, _ in tr.run.checkpoints()] == [2, 4, 5]
    return tr


def _copy(run5: ESTrainer, dst: Path) -> Path:
    shutil.copytree(run5.run.path, dst)
    return dst


def _changed(rec: HistoryRecord) -> HistoryRecord:
    """``rec`` with its first coefficient changed (the seeds stay, so it still encodes)."""
    (seed, c), *rest = rec.coeffs
    return replace(rec, coeffs=((seed, f32(c + 0.5)), *rest))


def _tamper(path: Path, iteration: int, *, relink: str) -> None:
    """Change one coefficient of ``iteration`` and "fix" the checksums as an editor would.

    ``relink``: ``"own"`` recomputes only the changed record's checksum (what recomputing its
    CRC was in format 2); ``"all"`` recomputes every checksum after it too.
    """
    hist = ESHistory(path)
    records = hist.open(read_only=True)
    data = path.read_bytes()
    seed = hist.meta.run_seed if hist.meta else None
    sizes = [len(r.body(hist.version, seed)) + 4 for r in records]
    start = len(data) - sum(sizes)
    out = bytearray(data[:start])
    prev = header_digest(bytes(out))
    for r in records:
        body = r.body(hist.version, seed)
        if r.iteration == iteration:
            r = _changed(r)
            body = r.body(hist.version, seed)
        new_prev = chain_digest(prev, body)
        orig = data[len(out) : len(out) + len(body) + 4]
        if r.iteration == iteration or (relink == "all" and r.iteration > iteration):
            if hist.version < 3:
                out += body + struct.pack("<I", zlib.crc32(body))
            else:
                out += body + new_prev[:4]
        else:
            out += orig  # as it was written
        prev = new_prev
    assert len(out) == len(data) and bytes(out) != data
    path.write_bytes(bytes(out))


def _refusal(run: Path, steps: int, tiny_model_dir: Path) -> tuple[str, str]:
    """The errors of a resume and of a replay of ``run``."""
    cfg = toy_config(tiny_model_dir, run, steps=steps, save_every=2)
    with pytest.raises(ConfigError) as resumed:
        ESTrainer(cfg).train_sync()
    with pytest.raises(ConfigError) as replayed:
        replay(run)
    return str(resumed.value), str(replayed.value)


def test_changed_last_coefficient_with_recomputed_checksum_is_refused(
    run5: ESTrainer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The last record has no later link to break: checkpoint-5's digest catches it."""
    run = _copy(run5, tmp_path / "last")
    _tamper(run / "es_history.bin", 5, relink="own")
    for err in _refusal(run, 6, tiny_model_dir):
        assert "\n" not in err
        assert str(run / "es_history.bin") in err
        assert "a record in iteration 5 " in err and "checkpoint-5" in err


def test_changed_coefficient_with_every_later_checksum_recomputed_is_refused(
    run5: ESTrainer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A whole consistent rewrite of the tail passes the chain; checkpoint-4 vouches against it
    (checkpoint-2 still matches, so the change lies in iterations 3-4)."""
    run = _copy(run5, tmp_path / "all")
    _tamper(run / "es_history.bin", 3, relink="all")
    assert len(ESHistory(run / "es_history.bin").open(read_only=True)) == 5  # the chain holds
    for err in _refusal(run, 6, tiny_model_dir):
        assert "\n" not in err
        assert str(run / "es_history.bin") in err and "iterations 3-4" in err


def test_changed_middle_coefficient_breaks_the_next_link(
    run5: ESTrainer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """With only its own checksum recomputed, iteration 3's edit breaks iteration 4's link,
    which needs no checkpoint at all."""
    run = _copy(run5, tmp_path / "mid")
    _tamper(run / "es_history.bin", 3, relink="own")
    for p in run.glob("checkpoint-*"):
        shutil.rmtree(p)
    for err in _refusal(run, 6, tiny_model_dir):
        assert "\n" not in err
        assert str(run / "es_history.bin") in err
        assert "record of iteration 4, whose checksum chains onto that of iteration 3" in err
        # what is known intact stops before iteration 3, which may be the one changed
        assert "delete any checkpoint-N folder with N > 2 " in err


def test_replay_refuses_a_history_of_another_seed(run5: ESTrainer, tmp_path: Path) -> None:
    """The history's header seed must be the run's (resume checked it; replay did not)."""
    run = _copy(run5, tmp_path / "seed")
    cfg = json.loads((run / "config.json").read_text())
    cfg["seed"] = 7
    (run / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError) as e:
        replay(run)
    err = str(e.value)
    assert "\n" not in err
    assert f"{run / 'es_history.bin'} belongs to a run with seed 0" in err and "seed 7" in err


def _to_format_2(path: Path) -> None:
    """Rewrite a history as the previous release wrote it (format 2: CRC32 per record)."""
    hist = ESHistory(path)
    records = hist.open(read_only=True)
    assert hist.meta is not None
    head = hist.meta.to_json()
    blob = MAGIC_V2 + struct.pack("<H", len(head)) + head + struct.pack("<I", zlib.crc32(head))
    path.write_bytes(blob + b"".join(r.encode(2, hist.meta.run_seed) for r in records))


def test_format_2_history_replays_and_is_protected_by_new_checkpoints(
    run5: ESTrainer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """An old run (format 2, checkpoints without digests) still replays to its weights; once a
    checkpoint records a digest, a CRC-recomputed edit of that file is refused too."""
    run = _copy(run5, tmp_path / "v2")
    hist_path = run / "es_history.bin"
    _to_format_2(hist_path)
    for p in run.glob("checkpoint-*/trainer_state.json"):
        state = json.loads(p.read_text())
        del state[DIGEST_KEY]  # written before digests existed
        p.write_text(json.dumps(state))
    _, _, w = replay(run)
    assert master_equal(run5.weights.master, w.master)
    # a checkpoint this release writes for the old run records the digest of the format 2 bytes
    hist = ESHistory(hist_path)
    hist.open(read_only=True)
    assert hist.version == 2
    state_file = run / "checkpoint-5" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    state[DIGEST_KEY] = hist.digest(5)
    state_file.write_text(json.dumps(state))
    _tamper(hist_path, 5, relink="own")  # a coefficient changed, its CRC32 recomputed
    assert len(ESHistory(hist_path).open(read_only=True)) == 5  # the CRCs all pass
    for err in _refusal(run, 6, tiny_model_dir):
        assert "\n" not in err and str(hist_path) in err and "iterations 1-5" in err


def test_append_writes_the_chain_and_digest_matches_a_fresh_read(tmp_path: Path) -> None:
    path = tmp_path / "h.bin"
    h = ESHistory(path)
    h.open(META)
    d0 = h.digest()
    h.append(HistoryRecord(1, ((draw_seeds(0, 1, 1)[0], f32(0.25)),)))
    h.append(HistoryRecord(2, (), skipped=True))
    again = ESHistory(path)
    again.open(read_only=True)
    assert again.digest(0) == d0 and again.digest() == h.digest() != d0
    # a record added without append() (the other ranks of torchrun) is hashed the same way
    other = ESHistory(path)
    other.open(read_only=True)
    rec = HistoryRecord(3, ((draw_seeds(0, 3, 1)[0], f32(-1.0)),))
    other.records.append(rec)
    h.append(rec)
    assert other.digest() == h.digest()
    with pytest.raises(ValueError, match="has 3 iterations"):
        h.digest(4)
