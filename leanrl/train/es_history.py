"""The ES history: the whole training state as (seed, coefficient) pairs, and ``replay``.

An ES run's weights after iteration ``t`` are a pure function of the base model and the records of
iterations ``1..t``: ``θ_t = θ_{t-1} + Σ_k c_{t,k} ε(seed_{t,k})``. The history file stores those
records and nothing else, so it is tiny (12 + 8·K + 4 bytes per iteration: 256 bytes for a
population of 30 with K = 30 seeds, 136 with mirrored pairs, K = 15).

File layout (little-endian)::

    MAGIC (16 bytes)
    record*:  b"ESIT" | iteration u32 | count u16 | flags u16 | (seed u32, coeff f32) * count | crc32 u32

``flags`` bit 0 marks an iteration whose update was skipped (all members scored the same).
A record is appended and fsynced after every iteration. A crash can only tear the last record;
:meth:`ESHistory.open` detects it (short read or bad CRC) and cuts it off, so the file always holds
whole iterations, numbered 1, 2, 3, ... without gaps.

``replay`` rebuilds the weights: load the latest full checkpoint at or before the wanted iteration
(or the base model), then apply the remaining records with the same code the live run used.
"""

from __future__ import annotations

import json
import os
import random
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from leanrl.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from leanrl.train.es_weights import ESWeights

__all__ = ["ESHistory", "HistoryRecord", "WeightsSource", "draw_seeds", "load_weights", "replay"]

MAGIC = b"leanrl-es-hist1\n"
_HEAD = struct.Struct("<4sIHH")
_PAIR = struct.Struct("<If")
_CRC = struct.Struct("<I")
_TAG = b"ESIT"
FLAG_SKIPPED = 1
HISTORY_FILE = "es_history.bin"
"""The history's file name inside the run folder."""


@dataclass(frozen=True)
class HistoryRecord:
    """One iteration: the (seed, coefficient) pairs of its update, in the order applied."""

    iteration: int
    """1-based iteration number."""
    coeffs: tuple[tuple[int, float], ...]
    """(seed, c) pairs; ``c`` is exactly representable in float32. Empty when skipped."""
    skipped: bool = False
    """True when all members scored the same and no update was made."""

    def encode(self) -> bytes:
        body = _HEAD.pack(_TAG, self.iteration, len(self.coeffs), FLAG_SKIPPED * self.skipped)
        body += b"".join(_PAIR.pack(s, c) for s, c in self.coeffs)
        return body + _CRC.pack(zlib.crc32(body))


def f32(x: float) -> float:
    """``x`` rounded to the nearest float32 (what the history can store exactly)."""
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def decode_records(data: bytes, offset: int = 0) -> tuple[list[HistoryRecord], int]:
    """Parse records from ``data[offset:]``; returns them and the end of the last whole one."""
    out: list[HistoryRecord] = []
    pos = offset
    while pos + _HEAD.size <= len(data):
        tag, it, count, flags = _HEAD.unpack_from(data, pos)
        end = pos + _HEAD.size + count * _PAIR.size + _CRC.size
        if tag != _TAG or end > len(data):
            break
        (crc,) = _CRC.unpack_from(data, end - _CRC.size)
        if crc != zlib.crc32(data[pos : end - _CRC.size]):
            break
        pairs = tuple(
            _PAIR.unpack_from(data, pos + _HEAD.size + i * _PAIR.size) for i in range(count)
        )
        expected = (out[-1].iteration + 1) if out else it
        if it != expected:
            break
        out.append(HistoryRecord(it, tuple((int(s), float(c)) for s, c in pairs), bool(flags & 1)))
        pos = end
    return out, pos


class ESHistory:
    """The append-only, crash-safe history file of one run."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.records: list[HistoryRecord] = []

    def open(self) -> list[HistoryRecord]:
        """Read the file (creating it if missing), cut off a torn last record, return records."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.path.exists():
            with self.path.open("wb") as f:
                f.write(MAGIC)
                f.flush()
                os.fsync(f.fileno())
        data = self.path.read_bytes()
        if not data.startswith(MAGIC):
            if len(data) < len(MAGIC) and MAGIC.startswith(data):  # torn while being created
                self.path.write_bytes(MAGIC)
                data = MAGIC
            else:
                raise ConfigError(f"{self.path} is not an ES history file (bad header)")
        records, end = decode_records(data, len(MAGIC))
        if records and records[0].iteration != 1:
            raise ConfigError(f"{self.path}: history starts at iteration {records[0].iteration}")
        if end < len(data):  # a torn or corrupt tail: drop it so appends continue cleanly
            with self.path.open("r+b") as f:
                f.truncate(end)
                f.flush()
                os.fsync(f.fileno())
        self.records = records
        return list(records)

    def append(self, record: HistoryRecord) -> None:
        """Append one iteration and fsync (after this returns, the iteration survives a crash)."""
        want = len(self.records) + 1
        if record.iteration != want:
            raise ValueError(f"history expects iteration {want}, got {record.iteration}")
        with self.path.open("ab") as f:
            f.write(record.encode())
            f.flush()
            os.fsync(f.fileno())
        self.records.append(record)

    def __len__(self) -> int:
        return len(self.records)


def draw_seeds(run_seed: int, iteration: int, count: int) -> list[int]:
    """The member seeds of ``iteration`` (u32, distinct); a pure function, so resumes repeat it."""
    rng = random.Random(f"leanrl-es:{run_seed}:{iteration}")
    seeds: list[int] = []
    while len(seeds) < count:
        s = rng.getrandbits(32)
        if s not in seeds:
            seeds.append(s)
    return seeds


@dataclass(frozen=True)
class WeightsSource:
    """Where a process gets its starting weights: the base model or a full checkpoint.

    Workers and ``replay`` build the weights of iteration ``t`` from this plus history records
    ``iteration+1 .. t``; no full weights ever travel between processes.
    """

    model: str
    """Base model folder or hub id (``policy.model``)."""
    dtype: str
    """Resolved torch dtype name of the model (``float32``, ``bfloat16``...)."""
    device: str
    """Resolved device (``cpu``, ``cuda:0``)."""
    checkpoint: str | None = None
    """A full checkpoint folder to start from instead of the base model."""
    iteration: int = 0
    """The iteration the starting weights are at (0 for the base model)."""


def load_weights(
    source: WeightsSource, records: list[HistoryRecord] | None = None
) -> tuple[Any, Any, ESWeights]:
    """Load model + tokenizer from ``source`` and apply ``records`` past its iteration.

    Returns ``(model, tokenizer, weights)``; the model holds ``cast(θ_t)``.
    """
    from leanrl.train.es_policy import load_model
    from leanrl.train.es_weights import MASTER_FILE, ESWeights, load_master_file

    path = source.checkpoint or source.model
    model, tokenizer = load_model(path, source.dtype, source.device)
    weights = ESWeights.from_model(model)
    if source.checkpoint is not None and (Path(source.checkpoint) / MASTER_FILE).is_file():
        weights.load_master(load_master_file(Path(source.checkpoint) / MASTER_FILE))
    for rec in records or []:
        if rec.iteration > source.iteration:
            weights.apply_update(rec.coeffs)
    return model, tokenizer, weights


def replay(
    run_dir: str | Path,
    upto: int | None = None,
    *,
    device: str | None = None,
    use_checkpoints: bool = True,
) -> tuple[Any, Any, ESWeights]:
    """Rebuild the weights of a run after iteration ``upto`` (default: the last one recorded).

    Reads ``config.json`` and the history of ``run_dir``, starts from the newest complete
    checkpoint at or before ``upto`` (unless ``use_checkpoints`` is False: then from the base
    model) and applies the remaining records. On the device kind the run used, the result is
    bitwise identical to the live weights.
    """
    from leanrl.policy import PolicyConfig
    from leanrl.train.common import RunDir
    from leanrl.train.es_policy import resolve_device_dtype

    run = RunDir(run_dir)
    cfg_file = run.path / "config.json"
    if not cfg_file.is_file():
        raise ConfigError(f"{run.path} is not a run folder (no config.json)")
    cfg = json.loads(cfg_file.read_text())
    pcfg = PolicyConfig.model_validate(cfg["policy"])
    if device is not None:
        pcfg = pcfg.model_copy(update={"device": device})
    dev, dtype = resolve_device_dtype(pcfg)
    records = ESHistory(run.path / HISTORY_FILE).open()
    upto = len(records) if upto is None else upto
    if upto > len(records):
        raise ConfigError(f"the history of {run.path} has {len(records)} iterations, not {upto}")
    records = records[:upto]
    source = WeightsSource(model=pcfg.model, dtype=dtype, device=dev)
    if use_checkpoints:
        for step, path in reversed(run.checkpoints()):
            if step <= upto and checkpoint_usable(path):
                source = WeightsSource(pcfg.model, dtype, dev, str(path), step)
                break
    return load_weights(source, records)


def checkpoint_usable(path: Path) -> bool:
    """A checkpoint that promised an fp32 master file has it (a crash could come in between)."""
    from leanrl.train.common import RunDir
    from leanrl.train.es_weights import MASTER_FILE

    state = RunDir.load_state(path)
    return not state.get("es_master") or (path / MASTER_FILE).is_file()


def master_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    """Bitwise equality of two sets of master weights."""
    import torch

    return set(a) == set(b) and all(torch.equal(a[k], b[k].to(a[k].device)) for k in a)
