"""Is a saved file whole? Cheap structural checks of what leanrl reads back after a crash.

A kill, a full disk or a bad copy can leave a model folder with a truncated ``model.safetensors``,
an ``optimizer.pt`` cut short, or a JSON file that is half written. Loading such a file fails
deep inside a library with a message about headers or zip directories. These checks run first
and say, in one line, which file is damaged and how; the trainers use them to skip a damaged
checkpoint for an older intact one (:meth:`leanrl.train.common.RunDir.resumable_checkpoints`).

They check structure, not content: a safetensors file must be exactly as long as its header
says, a torch file must be a complete zip archive whose every member matches its CRC, and a JSON
file must parse. Nothing here unpickles or runs anything from the files.
"""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

__all__ = ["checkpoint_problem", "json_problem", "safetensors_problem", "torch_file_problem"]

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
