"""Is a saved file whole? Cheap structural checks of what leanrl reads back after a crash.

A kill, a full disk or a bad copy can leave a model folder with a truncated ``model.safetensors``,
an ``optimizer.pt`` cut short, or a JSON file that is half written. Loading such a file fails
deep inside a library with a message about headers or zip directories. These checks run first
and say, in one line, which file is damaged and how; the trainers use them to skip a damaged
checkpoint for an older intact one (:meth:`leanrl.train.common.RunDir.resumable_checkpoints`).

The structural checks: a safetensors file must be exactly as long as its header says, a torch
file must be a complete zip archive whose every member matches its CRC, and a JSON file must
parse. Nothing here unpickles or runs anything from the files.

The content check: a leanrl checkpoint lists every file with its sha256 in ``checksums.sha256``
(``sha256sum`` format; written last, so it exists only whole). :func:`checksums_problem` compares
the files with it: a flipped bit in the weights is structurally whole and loads without
complaint, so every command that loads a checkpoint checks it (:func:`content_problem`).
"""

from __future__ import annotations

import hashlib
import json
import struct
import zipfile
from pathlib import Path

__all__ = [
    "CHECKSUMS_FILE",
    "NO_CHECKSUMS",
    "checkpoint_problem",
    "checksums_problem",
    "content_problem",
    "json_problem",
    "safetensors_problem",
    "sha256_file",
    "torch_file_problem",
]

CHECKSUMS_FILE = "checksums.sha256"
"""Every file of a checkpoint with its sha256 (``sha256sum -c checksums.sha256`` checks it)."""

NO_CHECKSUMS = "no checksums"
""":func:`checksums_problem`'s answer for a folder without ``checksums.sha256`` (a checkpoint
written before leanrl recorded them, or any model folder not written by leanrl)."""

#: Small JSON files of a Hugging Face model folder or checkpoint that must parse when present.
_JSON_FILES = (
    "trainer_state.json",
    "config.json",
    "generation_config.json",
    "tokenizer_config.json",
    "tokenizer.json",
    "special_tokens_map.json",
    "model.safetensors.index.json",
    "adapter_config.json",
)


def json_problem(path: Path) -> str | None:
    """Why ``path`` is not a readable JSON object (None when it is)."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as e:
        return f"{path.name} cannot be read ({e.strerror})"
    except (UnicodeDecodeError, ValueError) as e:
        return f"{path.name} is not valid JSON ({e})"
    if not isinstance(data, dict):
        return f"{path.name} does not hold a JSON object"
    return None


def safetensors_problem(path: Path) -> str | None:
    """Why ``path`` is not a whole safetensors file (None when it is).

    The format is an 8-byte little-endian header length, a JSON header giving each tensor's
    byte range, then the data: the file must end exactly where the last range ends.
    """
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{path.name} is truncated ({size} bytes, not even a header)"
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                return f"{path.name} is truncated ({size} bytes; its header alone needs {8 + n})"
            header = json.loads(f.read(n).decode("utf-8"))
    except OSError as e:
        return f"{path.name} cannot be read ({e.strerror})"
    except (UnicodeDecodeError, ValueError) as e:
        return f"{path.name} has a damaged header ({e})"
    if not isinstance(header, dict):
        return f"{path.name} has a damaged header (not a JSON object)"
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            _, hi = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            return f"{path.name} has a damaged header (tensor {name!r} has no data_offsets)"
        end = max(end, hi)
    want = 8 + n + end
    if size < want:
        return f"{path.name} is truncated ({size} of {want} bytes)"
    if size > want:
        return f"{path.name} has {size - want} bytes past its last tensor (not a safetensors file)"
    return None


def torch_file_problem(path: Path) -> str | None:
    """Why ``path`` is not a whole ``torch.save`` archive (None when it is): it must be a
    complete zip file whose members all match their CRCs. Nothing is unpickled."""
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except OSError as e:
        return f"{path.name} cannot be read ({e.strerror})"
    except (zipfile.BadZipFile, EOFError, ValueError) as e:
        return f"{path.name} is truncated or damaged (not a complete torch archive: {e})"
    if bad is not None:
        return f"{path.name} is damaged (member {bad!r} fails its CRC check)"
    return None


def checkpoint_problem(folder: Path, *, torch_files: bool = True) -> str | None:
    """Why the model or checkpoint ``folder`` cannot be loaded whole (None when it looks whole):
    its JSON files parse, every ``*.safetensors`` is complete, and (with ``torch_files``) every
    ``*.pt`` is a whole archive. The first problem found is returned."""
    for name in _JSON_FILES:
        p = folder / name
        if p.is_file():
            why = json_problem(p)
            if why:
                return why
    for p in sorted(folder.glob("*.safetensors")):
        why = safetensors_problem(p)
        if why:
            return why
    for p in sorted(folder.glob("*.pt")) if torch_files else ():
        why = torch_file_problem(p)
        if why:
            return why
    return None


def sha256_file(path: Path) -> str:
    """The file's sha256, read in 1 MiB pieces (a model file never sits in memory whole)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def checksums_problem(folder: Path) -> str | None:
    """Why ``folder``'s files do not match ``checksums.sha256`` (None when they all do;
    :data:`NO_CHECKSUMS` when it has none). Files the list does not name are not checked."""
    listing = folder / CHECKSUMS_FILE
    try:
        text = listing.read_text(encoding="utf-8")
    except FileNotFoundError:
        return NO_CHECKSUMS
    except (OSError, UnicodeDecodeError) as e:
        return f"{CHECKSUMS_FILE} cannot be read ({e})"
    for n, line in enumerate(text.splitlines(), 1):
        digest, sep, rel = line.partition("  ")
        name = Path(rel)
        if not sep or len(digest) != 64 or name.is_absolute() or ".." in name.parts:
            return f"{CHECKSUMS_FILE} is damaged (line {n} is not 'SHA256  FILE')"
        path = folder / name
        if not path.is_file():
            return f"{rel} is missing ({CHECKSUMS_FILE} lists it)"
        try:
            got = sha256_file(path)
        except OSError as e:
            return f"{rel} cannot be read ({e.strerror})"
        if got != digest:
            return (
                f"{rel} is not the file that was written (sha256 {got[:12]}..., recorded "
                f"{digest[:12]}...): its content changed on disk or in a copy"
            )
    return None


_VERIFIED: dict[Path, tuple[tuple[str, int, int], ...]] = {}
"""Folders whose checksums matched in this process, with what their files looked like then."""


def _stamp(folder: Path) -> tuple[tuple[str, int, int], ...] | None:
    """(name, size, mtime) of the listing and every file under ``folder``: what a rewrite
    changes (None when the folder cannot be listed)."""
    try:
        files = sorted(p for p in folder.rglob("*") if p.is_file())
        return tuple(
            (p.relative_to(folder).as_posix(), st.st_size, st.st_mtime_ns)
            for p in files
            for st in (p.stat(),)
        )
    except OSError:
        return None


def content_problem(folder: Path) -> str | None:
    """Why the files of ``folder`` are not the ones its ``checksums.sha256`` lists (None when
    they are, or when it has no such list: a model folder not written by leanrl).

    What every command that loads a model folder runs before loading it, so a checkpoint
    with a flipped bit is refused instead of loaded. Each folder is hashed once per process
    (a command checks its model more than once); a folder whose files were rewritten since
    (another size or mtime) is hashed again."""
    key = folder.expanduser().resolve()
    stamp = _stamp(key)
    if stamp is not None and _VERIFIED.get(key) == stamp:
        return None
    why = checksums_problem(key)
    if why == NO_CHECKSUMS:
        return None
    if why is None and stamp is not None:
        _VERIFIED[key] = stamp
    return why
