"""The ES history: the whole training state as per-iteration coefficients, and ``replay``.

An ES run's weights after iteration ``t`` are a pure function of the base model and the records of
iterations ``1..t``: ``θ_t = θ_{t-1} + Σ_k c_{t,k} ε(seed_{t,k})``. The seeds of iteration ``t``
are themselves a pure function of (run seed, ``t``) (:func:`draw_seeds`), so a record stores only
the coefficients: 16 + 4·K bytes per iteration, 136 bytes for a population of 30 (K = 30 seeds),
76 with mirrored pairs (K = 15), 16 for a skipped iteration.

File layout, format 3 (little-endian)::

    MAGIC "leanrl-es-hist3\\n" (16 bytes) | header length u16 | header JSON | crc32 u32
    record*:  b"ESIT" | iteration u32 | count u16 | flags u16 | coeff f32 * count | link u32

The records form a hash chain (blake2b-256, :func:`chain_digest`): ``D_0`` is the digest of the
header bytes, ``D_t = blake2b(D_{t-1} || record t without its link)``, and a record's ``link`` is
the first 4 bytes of its ``D_t``. A per-record CRC let anyone change a coefficient and recompute
the CRC unnoticed; a link cannot be recomputed without also recomputing every later one. That
alone still yields to rewriting the whole tail, so every checkpoint also records the full
``D_t`` of its iteration in ``trainer_state.json`` (``history_digest``), and resume and
``replay`` refuse a history that no longer hashes to it (:func:`verify_checkpoints`). The 4-byte
link adds no secrecy (nothing here is keyed); it catches damage, as the CRC did, and where the
chain breaks. An edit after the newest checkpoint, made with every later link recomputed, is not
detectable: nothing outside the file vouches for those iterations yet.

The header JSON holds ``run_seed`` (the seeds are regenerated from it), and ``device_type`` and
``dtype``: the kind of device the noise was drawn on and the model dtype. A low-rank run's header
also holds ``perturbation`` (``"lowrank"``), ``rank`` and ``lowrank_other`` (and
``lowrank_targets`` when it is ``"linear"``, so a header of a run on every 2-D tensor keeps its
bytes): the same coefficients
mean another update under another perturbation, so resume and ``replay`` follow (and check) the
header's. A header without them is a full-rank run (every history written before low rank
existed, and every full-rank one since, whose header bytes are unchanged). CPU and CUDA generators
draw different numbers from the same seed, so records only mean the same update on the same kind
of device; a resume or ``replay`` elsewhere is refused (replay can be forced). The file is created
atomically (written aside, then renamed), so a crash cannot leave a torn header.

``flags`` bit 0 marks an iteration whose update was skipped (all members scored the same, or
every coefficient was zero); its record has no coefficients. A record is appended and fsynced
after every iteration, so a crash can only tear the *last* record: fewer bytes than one whole
record at the very end. :meth:`ESHistory.open` cuts exactly that off. Anything else that does not
decode (a bad CRC on a whole record, a gap in iteration numbers, bytes after a bad record) is
corruption: it raises :class:`~leanrl.errors.ConfigError` naming the byte offset and never
truncates, since cutting there would silently drop every iteration after it. ``read_only``
opening (what ``replay`` uses) never writes or creates anything.

Older files are still read and appended to in their own format, so runs started before a format
change resume: format 2 (``leanrl-es-hist2``: as format 3 but a CRC32 of each record instead of a
link) and format 1 (``leanrl-es-hist1``: seeds stored in every record, 8 bytes per seed, no
header; it records no device kind, so that is not checked). Their records carry no chain, but the
digest is computed the same way over their bytes, so checkpoints written from now on protect them
just as they protect a format 3 file.

``replay`` rebuilds the weights: load the latest full checkpoint at or before the wanted iteration
(or the base model), then apply the remaining records with the same code the live run used.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from leanrl.errors import ConfigError, disk_errors
from leanrl.train.es.lowrank import LowRankSpec, describe

if TYPE_CHECKING:
    import torch

    from leanrl.train.common import RunDir
    from leanrl.train.es.weights import ESWeights

__all__ = [
    "ESHistory",
    "HistoryMeta",
    "HistoryRecord",
    "WeightsSource",
    "chain_digest",
    "check_perturbation",
    "draw_seeds",
    "load_weights",
    "replay",
    "verify_checkpoints",
]

MAGIC_V1 = b"leanrl-es-hist1\n"
MAGIC_V2 = b"leanrl-es-hist2\n"
MAGIC = b"leanrl-es-hist3\n"
FORMAT_VERSION = 3
"""The format new history files are written in."""
_HEADERED = {MAGIC_V2: 2, MAGIC: 3}
"""Magic -> version, for the formats with a JSON header."""
_HLEN = struct.Struct("<H")
_HEAD = struct.Struct("<4sIHH")
_PAIR = struct.Struct("<If")  # format 1: (seed, coeff)
_COEF = struct.Struct("<f")  # format 2: coeff only
_CRC = struct.Struct("<I")
_TAG = b"ESIT"
FLAG_SKIPPED = 1
HISTORY_FILE = "es_history.bin"
"""The history's file name inside the run folder."""
DIGEST_KEY = "history_digest"
"""The ``trainer_state.json`` key of a checkpoint holding the history's chain digest (hex) at the
checkpoint's iteration."""


def chain_digest(prev: bytes, body: bytes) -> bytes:
    """``D_t`` from ``D_{t-1}`` (for iteration 1: :func:`header_digest`) and record ``t``'s bytes
    without its trailing check field."""
    return hashlib.blake2b(prev + body, digest_size=32).digest()


def header_digest(header: bytes) -> bytes:
    """``D_0``: the digest of the file's bytes before its first record (magic and header), so a
    changed header (another run seed) breaks the chain as a changed record does."""
    return hashlib.blake2b(header, digest_size=32).digest()


@dataclass(frozen=True)
class HistoryRecord:
    """One iteration: the (seed, coefficient) pairs of its update, in the order applied."""

    iteration: int
    """1-based iteration number."""
    coeffs: tuple[tuple[int, float], ...]
    """(seed, c) pairs; ``c`` is exactly representable in float32. Empty when skipped. In a
    format 2 file the seeds must be ``draw_seeds(run_seed, iteration, len(coeffs))``."""
    skipped: bool = False
    """True when no update was made (all members scored the same, or all c were zero)."""

    def encode(
        self, version: int = FORMAT_VERSION, run_seed: int | None = None, prev: bytes | None = None
    ) -> bytes:
        """The record's bytes in file format ``version`` (2 and 3 check the seeds against
        ``run_seed``; 3 links it to ``prev``, the chain digest of the record before it)."""
        body = self.body(version, run_seed)
        if version < 3:
            return body + _CRC.pack(zlib.crc32(body))
        if prev is None:
            raise ValueError("format 3 records chain onto the digest before them: pass prev")
        return body + chain_digest(prev, body)[: _CRC.size]

    def body(self, version: int = FORMAT_VERSION, run_seed: int | None = None) -> bytes:
        """The record's bytes without the trailing CRC / link (what the chain digest covers)."""
        body = _HEAD.pack(_TAG, self.iteration, len(self.coeffs), FLAG_SKIPPED * self.skipped)
        if version == 1:
            body += b"".join(_PAIR.pack(s, c) for s, c in self.coeffs)
        else:
            if self.coeffs:
                if run_seed is None:
                    raise ValueError("format 2 records need the run seed to check their seeds")
                want = draw_seeds(run_seed, self.iteration, len(self.coeffs))
                if [s for s, _ in self.coeffs] != want:
                    raise ValueError(
                        f"iteration {self.iteration}: seeds are not draw_seeds(run seed "
                        f"{run_seed}, {self.iteration}, {len(self.coeffs)}), so the history "
                        "could not regenerate them"
                    )
            body += b"".join(_COEF.pack(c) for _, c in self.coeffs)
        return body


@dataclass(frozen=True)
class HistoryMeta:
    """What a history's header records about its run (format 2)."""

    run_seed: int
    """The run seed: member seeds are ``draw_seeds(run_seed, iteration, count)``."""
    device_type: str
    """Kind of device the noise is drawn on (``cpu``, ``cuda``): it decides the noise numbers."""
    dtype: str
    """Model dtype (``float32``, ``bfloat16``...): it decides the starting fp32 master."""
    lowrank: LowRankSpec | None = None
    """Low-rank perturbation settings; None: full-rank noise (and no keys in the header)."""

    def to_json(self) -> bytes:
        data: dict[str, Any] = {
            "run_seed": self.run_seed,
            "device_type": self.device_type,
            "dtype": self.dtype,
        }
        if self.lowrank is not None:
            data.update(self.lowrank.header())
        return json.dumps(data, sort_keys=True).encode()


def f32(x: float) -> float:
    """``x`` rounded to the nearest float32 (what the history can store exactly)."""
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


@dataclass
class _Decoded:
    records: list[HistoryRecord] = field(default_factory=list)
    end: int = 0
    """Offset just past the last whole, valid record."""
    problem: str | None = None
    """Why decoding stopped before the end of the data (None: it reached the end)."""
    torn: bool = False
    """The bytes left are fewer than one whole record: a write cut short by a crash."""
    links: list[bytes] = field(default_factory=list)
    """Chain digests: ``links[t]`` after ``t`` records (``links[0]``: the header's)."""
    safe_end: int = 0
    """Offset up to which the records are known intact (before ``end`` when a broken link may
    mean the record *before* it was changed, its own link recomputed)."""


def decode_records(
    data: bytes, offset: int, version: int = FORMAT_VERSION, run_seed: int | None = None
) -> _Decoded:
    """Parse records from ``data[offset:]`` and say why (and where) decoding stopped."""
    out = _Decoded(end=offset, safe_end=offset, links=[header_digest(data[:offset])])
    starts: list[int] = []
    pos = offset
    item = _PAIR.size if version == 1 else _COEF.size
    while pos < len(data):
        if pos + _HEAD.size > len(data):
            out.problem, out.torn = "an incomplete record header", True
            break
        tag, it, count, flags = _HEAD.unpack_from(data, pos)
        if tag != _TAG:
            out.problem = "no record tag (not a record boundary)"
            break
        end = pos + _HEAD.size + count * item + _CRC.size
        if end > len(data):
            out.problem, out.torn = (
                f"a record cut short ({len(data) - pos} of {end - pos} bytes)",
                True,
            )
            break
        body = data[pos : end - _CRC.size]
        link = chain_digest(out.links[-1], body)
        if version < 3:
            (crc,) = _CRC.unpack_from(data, end - _CRC.size)
            if crc != zlib.crc32(body):
                out.problem = f"a CRC mismatch in the record of iteration {it}"
                break
        elif data[end - _CRC.size : end] != link[: _CRC.size]:
            # Either this record changed, or the one before did and its link was recomputed
            # (which an edit that "fixes the checksum" does): neither can be trusted.
            before = f"iteration {it - 1}" if out.records else "the header"
            out.problem = (
                f"a checksum mismatch in the record of iteration {it}, whose checksum chains "
                f"onto that of {before}: one of the two was changed after it was written, or the file "
                "is damaged"
            )
            out.safe_end = starts[-1] if starts else offset
            break
        expected = (out.records[-1].iteration + 1) if out.records else 1
        if it != expected:
            out.problem = f"iteration {it} where iteration {expected} was expected"
            break
        base = pos + _HEAD.size
        if version == 1:
            pairs = [_PAIR.unpack_from(data, base + i * item) for i in range(count)]
            coeffs = tuple((int(s), float(c)) for s, c in pairs)
        else:
            if count and run_seed is None:
                raise ConfigError("a format 2 history without a run seed in its header")
            seeds = draw_seeds(run_seed, it, count) if count else []  # type: ignore[arg-type]
            cs = [_COEF.unpack_from(data, base + i * item)[0] for i in range(count)]
            coeffs = tuple((s, float(c)) for s, c in zip(seeds, cs, strict=True))
        out.records.append(HistoryRecord(it, coeffs, bool(flags & FLAG_SKIPPED)))
        out.links.append(link)
        starts.append(pos)
        pos = end
        out.end = out.safe_end = pos
    return out


class ESHistory:
    """The append-only, crash-safe history file of one run."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.records: list[HistoryRecord] = []
        self.version = FORMAT_VERSION
        """File format of the open file (1 or 2)."""
        self.meta: HistoryMeta | None = None
        """The header of a format 2 or 3 file (None for format 1, which has none)."""
        self._links: list[bytes] = []
        """Chain digests of the records so far (``_links[t]`` after ``t``), see :meth:`digest`."""

    def open(
        self, meta: HistoryMeta | None = None, *, read_only: bool = False
    ) -> list[HistoryRecord]:
        """Read the file and return its records.

        Not ``read_only``: a missing file is created with header ``meta``, and a torn last record
        (fewer bytes than one record at the very end, from a crash mid-append) is cut off so
        appends continue cleanly. ``read_only``: nothing is ever written or created; a torn tail
        is ignored. Corruption anywhere else raises :class:`ConfigError` and changes nothing.
        """
        if not self.path.exists():
            if read_only:
                raise ConfigError(
                    f"{self.path} does not exist: this is not an ES run folder, or its history "
                    "was deleted (without it the run cannot be replayed)"
                )
            if meta is None:
                raise ValueError("creating a history needs its HistoryMeta")
            self._create(meta)
        data = self.path.read_bytes()
        start = self._read_header(data)
        dec = decode_records(data, start, self.version, self.meta.run_seed if self.meta else None)
        if dec.problem is not None and not dec.torn:
            n = len(dec.records) - (dec.safe_end < dec.end)  # the iterations known intact
            raise ConfigError(
                f"{self.path} is corrupt at byte offset {dec.end}: {dec.problem}. The "
                f"{n} iteration(s) before byte offset {dec.safe_end} are intact; "
                f"{len(data) - dec.end} bytes start at the bad record. Restore the file from a "
                "backup if you have one. To keep only the intact iterations, cut the file "
                f"there (`truncate -s {dec.safe_end} {self.path}`) and delete any "
                f"checkpoint-N folder with N > {n} before resuming."
            )
        if dec.torn and not read_only:  # a crash mid-append: drop the partial record
            with self.path.open("r+b") as f:
                f.truncate(dec.end)
                f.flush()
                os.fsync(f.fileno())
        self.records = dec.records
        self._links = dec.links
        return list(dec.records)

    def _create(self, meta: HistoryMeta) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        head = meta.to_json()
        blob = MAGIC + _HLEN.pack(len(head)) + head + _CRC.pack(zlib.crc32(head))
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with disk_errors(self.path, "the ES history"):
            with tmp.open("wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)  # atomic: the file appears whole or not at all

    def _read_header(self, data: bytes) -> int:
        """Check the magic (and header, format 2); set version/meta; return the records' offset."""
        if data.startswith(MAGIC_V1):
            self.version, self.meta = 1, None
            return len(MAGIC_V1)
        version = _HEADERED.get(data[: len(MAGIC)])
        hint = (
            "Point --out at the run folder that wrote it, or move this file away to start a "
            "new run there."
        )
        if version is None:
            raise ConfigError(
                f"{self.path} is not an ES history file (its first bytes are {data[:16]!r}, "
                f"expected {MAGIC!r}). {hint}"
            )
        pos = len(MAGIC)
        try:
            (hlen,) = _HLEN.unpack_from(data, pos)
            head = data[pos + _HLEN.size : pos + _HLEN.size + hlen]
            (crc,) = _CRC.unpack_from(data, pos + _HLEN.size + hlen)
            if len(head) != hlen or crc != zlib.crc32(head):
                raise ValueError("header CRC mismatch")
            info = json.loads(head)
            self.meta = HistoryMeta(
                int(info["run_seed"]),
                str(info["device_type"]),
                str(info["dtype"]),
                LowRankSpec.from_header(info),
            )
        except (struct.error, ValueError, KeyError, TypeError, ConfigError) as e:
            raise ConfigError(
                f"{self.path}: the ES history header is damaged ({e}). Restore the file from a "
                f"backup; the run cannot be replayed without it. {hint}"
            ) from None
        self.version = version
        return pos + _HLEN.size + hlen + _CRC.size

    def append(self, record: HistoryRecord) -> None:
        """Append one iteration and fsync (after this returns, the iteration survives a crash)."""
        want = len(self.records) + 1
        if record.iteration != want:
            raise ValueError(f"history expects iteration {want}, got {record.iteration}")
        prev = bytes.fromhex(self.digest())
        seed = self.meta.run_seed if self.meta else None
        blob = record.encode(self.version, seed, prev)
        with disk_errors(self.path, f"the ES history (iteration {record.iteration})"):
            with self.path.open("ab") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
        self.records.append(record)

    def digest(self, iteration: int | None = None) -> str:
        """The chain digest (hex) after ``iteration`` records (default: all of them): what a
        checkpoint at that iteration records, and :func:`verify_checkpoints` compares."""
        n = len(self.records) if iteration is None else iteration
        if not 0 <= n <= len(self.records):
            raise ValueError(f"the history has {len(self.records)} iterations, not {n}")
        if not self._links:
            raise RuntimeError("open() the history first")
        seed = self.meta.run_seed if self.meta else None
        # Records added without append() (the other ranks of a torchrun launch) are hashed here,
        # from the same bytes the file holds.
        while len(self._links) <= n:
            body = self.records[len(self._links) - 1].body(self.version, seed)
            self._links.append(chain_digest(self._links[-1], body))
        return self._links[n].hex()

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


def device_kind(device: str) -> str:
    """``cuda:1`` -> ``cuda``: the part of a device that decides which numbers a generator draws."""
    return device.split(":", 1)[0]


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
    options: dict[str, Any] = field(default_factory=dict)
    """Extra ``from_pretrained`` keyword arguments (``policy.options``)."""
    lora: dict[str, Any] | None = None
    """LoRA runs: the ``LoRAConfig`` fields plus ``seed`` (the adapters' init); ES then perturbs
    only the adapters, and a checkpoint holds adapters, not a full model."""
    lowrank: LowRankSpec | None = None
    """Low-rank runs (``perturbation = "lowrank"``): the perturbation every process applies and
    replays; None: full-rank noise."""


def load_weights(
    source: WeightsSource, records: list[HistoryRecord] | None = None
) -> tuple[Any, Any, ESWeights]:
    """Load model + tokenizer from ``source`` and apply ``records`` past its iteration.

    Returns ``(model, tokenizer, weights)``; the model holds ``cast(θ_t)``.
    """
    from leanrl.train.es.lowrank import make_weights
    from leanrl.train.es.policy import load_model
    from leanrl.train.es.weights import MASTER_FILE, load_master_file

    if source.lora is not None:
        from leanrl.train.lora import LoRAConfig, apply_lora, load_adapter

        spec = dict(source.lora)
        seed = int(spec.pop("seed"))
        model, tokenizer = load_model(source.model, source.dtype, source.device, source.options)
        model = apply_lora(model, LoRAConfig(**spec), seed)
        if source.checkpoint is not None:
            load_adapter(model, source.checkpoint)
        model.eval()
        weights = make_weights(model, trainable_only=True, lowrank=source.lowrank)
    else:
        path = source.checkpoint or source.model
        model, tokenizer = load_model(path, source.dtype, source.device, source.options)
        weights = make_weights(model, lowrank=source.lowrank)
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
    allow_other_device: bool = False,
) -> tuple[Any, Any, ESWeights]:
    """Rebuild the weights of a run after iteration ``upto`` (default: the last one recorded).

    Reads ``config.json`` and the history of ``run_dir`` (read-only: the run folder is never
    changed), starts from the newest complete checkpoint at or before ``upto`` (unless
    ``use_checkpoints`` is False: then from the base model) and applies the remaining records.
    The result is bitwise identical to the live weights, which needs the kind of device and the
    dtype the run used (both recorded in the history): by default replay uses them (and the
    perturbation, full or low rank, that the history's header records), and it
    refuses another kind of device, whose generators draw different noise, unless
    ``allow_other_device`` (the result is then *not* the run's weights).
    """
    import torch

    from leanrl.policy import PolicyConfig
    from leanrl.train.common import RunDir
    from leanrl.train.es.policy import resolve_device_dtype

    run = RunDir(run_dir)
    cfg_file = run.path / "config.json"
    if not cfg_file.is_file():
        raise ConfigError(f"{run.path} is not a run folder (no config.json): pass the --out folder")
    try:
        cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
        pcfg = PolicyConfig.model_validate(cfg["policy"])
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(
            f"{cfg_file} is damaged ({type(e).__name__}: {e}): replay needs the run's policy "
            "settings from it. Restore it from a backup."
        ) from None
    hist = ESHistory(run.path / HISTORY_FILE)
    records = hist.open(read_only=True)
    check_run_seed(hist, int(cfg.get("seed", 0)), run.path)  # as a resume checks it
    verify_checkpoints(hist, run)
    meta = hist.meta
    if device is None and pcfg.device == "auto" and meta is not None:
        # the recorded kind, when this machine has it (else auto, and the check below explains)
        if meta.device_type != "cuda" or torch.cuda.is_available():
            device = meta.device_type
    if device is not None:
        pcfg = pcfg.model_copy(update={"device": device})
    if meta is not None:
        pcfg = pcfg.model_copy(update={"dtype": meta.dtype})
    dev, dtype = resolve_device_dtype(pcfg)
    if meta is not None and device_kind(dev) != meta.device_type and not allow_other_device:
        raise ConfigError(
            f"{run.path} was trained with noise drawn on {meta.device_type!r}, and this replay "
            f"would run on {dev!r}. The two kinds of device draw different noise from the same "
            f"seeds, so the result would not be the run's weights. Replay on a "
            f"{meta.device_type} machine (device={meta.device_type!r}), or pass "
            "allow_other_device=True if you knowingly want those different weights."
        )
    upto = len(records) if upto is None else upto
    if upto > len(records):
        raise ConfigError(
            f"the history of {run.path} has {len(records)} iterations, not {upto}: "
            f"pass upto <= {len(records)}"
        )
    records = records[:upto]
    opts = dict(pcfg.options)
    lora = cfg.get("lora") or {}
    spec = {**lora, "seed": int(cfg.get("seed", 0))} if int(lora.get("rank", 0)) > 0 else None
    lowrank = meta.lowrank if meta is not None else None  # the header's, which resumes checked
    if "perturbation" in cfg:  # config.json from before low rank existed has no such key
        try:
            said = LowRankSpec.from_header(cfg)
        except (ValueError, KeyError, TypeError, ConfigError) as e:
            raise ConfigError(f"{cfg_file} has bad perturbation settings ({e})") from None
        # a config.json edited, or copied from another run
        check_perturbation(hist, said, run.path, f"{cfg_file.name} says")
    source = WeightsSource(
        model=pcfg.model, dtype=dtype, device=dev, options=opts, lora=spec, lowrank=lowrank
    )
    if use_checkpoints:  # a damaged checkpoint is skipped, with a warning, for an older one
        for step, path in run.resumable_checkpoints():
            if step <= upto and checkpoint_usable(path):
                source = WeightsSource(
                    pcfg.model, dtype, dev, str(path), step, opts, spec, lowrank=lowrank
                )
                break
    return load_weights(source, records)


def checkpoint_usable(path: Path) -> bool:
    """A checkpoint that promised an fp32 master file has it (older runs could crash in between)."""
    from leanrl.train.common import RunDir
    from leanrl.train.es.weights import MASTER_FILE

    state = RunDir.load_state(path)
    return not state.get("es_master") or (path / MASTER_FILE).is_file()


def verify_checkpoints(history: ESHistory, run: RunDir) -> None:
    """Refuse an (open) history that no longer hashes to what its run's checkpoints recorded.

    Each checkpoint holds the chain digest of the history at its iteration (:data:`DIGEST_KEY`),
    written by the trainer, not alongside the records: a record changed after a checkpoint, even
    with every later link recomputed, no longer matches it. Checked oldest first, so the error
    narrows the change down to the iterations between the last matching checkpoint and the first
    mismatching one. Checkpoints from before digests were recorded, damaged ones (resume and
    replay skip those anyway) and ones past the history's end (refused elsewhere) are left out.
    """
    vouched = 0  # the newest iteration a matching checkpoint vouches for
    for step, path in run.checkpoints():
        if step > len(history):
            continue
        try:
            want = run.load_state(path).get(DIGEST_KEY)
        except ConfigError:
            continue
        if not isinstance(want, str):
            continue
        if want != history.digest(step):
            span = (
                f"iteration {step}" if vouched + 1 == step else f"iterations {vouched + 1}-{step}"
            )
            raise ConfigError(
                f"{history.path} does not match {path / 'trainer_state.json'}: the history's "
                f"records up to iteration {step} no longer hash to the digest the checkpoint "
                f"recorded, so a record in {span} (or the header) was changed after the "
                f"checkpoint was written, or the file comes from another run. Restore "
                f"{history.path.name} from a backup, or start a new --out folder."
            )
        vouched = step


def check_run_seed(history: ESHistory, run_seed: int, run_path: Path) -> None:
    """Refuse a history whose header names another run seed than the run's config.

    The member seeds are regenerated from the header's seed, so a history copied from another
    run (or a header edited) would replay other noise, silently.
    """
    if history.meta is not None and history.meta.run_seed != run_seed:
        raise ConfigError(
            f"{history.path} belongs to a run with seed {history.meta.run_seed}, but "
            f"{run_path / 'config.json'} has seed {run_seed}: the history was copied from "
            "another run or edited. Put the run's own es_history.bin back, or use the seed of "
            "the run that wrote it."
        )


def check_perturbation(
    history: ESHistory,
    lowrank: LowRankSpec | None,
    run_path: Path,
    asked: str = "this run asks for",
) -> None:
    """Refuse to continue a history with another perturbation than the one it was written with.

    The records hold only coefficients: under full-rank noise they weight ε(seed), under low rank
    ``A·Bᵀ/√r``, so resuming (or replaying) with another mode or rank would rebuild other weights,
    silently. A history without the keys (format 1, or written before low rank) is full-rank.
    """
    old = history.meta.lowrank if history.meta is not None else None
    if old != lowrank:
        raise ConfigError(
            f"{run_path} was trained with perturbation {describe(old)}, but {asked} "
            f"{describe(lowrank)}: the history's coefficients weight the perturbations it was "
            "written with, so they would rebuild other weights. Resume with the run's settings "
            + _perturbation_flags(old)
            + ", or start a new --out folder."
        )


def _perturbation_flags(spec: LowRankSpec | None) -> str:
    if spec is None:
        return "(perturbation = 'full')"
    targets = f", lowrank_targets = {spec.targets!r}" if spec.targets != "all" else ""
    flag = f" --lowrank_targets {spec.targets}" if spec.targets != "all" else ""
    return (
        f"(perturbation = 'lowrank', rank = {spec.rank}, lowrank_other = {spec.other!r}"
        f"{targets}; on the command line --perturbation lowrank --rank {spec.rank} "
        f"--lowrank_other {spec.other}{flag})"
    )


def master_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    """Bitwise equality of two sets of master weights."""
    import torch

    return set(a) == set(b) and all(torch.equal(a[k], b[k].to(a[k].device)) for k in a)
