"""The Volume seen from outside a container, and a run folder mirrored onto it.

A launch keeps run folders on a Volume (a Modal Volume, or a folder for the local backend).
An orchestrator running on the user's machine works in a local copy of its run folder;
:class:`RunMirror` pushes the small files (config, history, metrics, kept proofs, plots, the
summary) after every step, and pulls them back before a resume, so a run killed on one machine
resumes from the Volume anywhere. Checkpoints are written onto the Volume by the GPU function
that builds them; the mirror pulls only their ``trainer_state.json``, which is what the resume
logic reads to pick its starting point.

Which copy is newer is decided by the run's progress, never by file times (clocks differ
between machines, and a copy's mtime is when it was copied): the number of iterations in the
ES history (``es_history.bin``), then the last metrics step. :meth:`RunMirror.pull` replaces
the local copy when the Volume's is further along (a run continued on another machine, or by
the ``orchestrate`` Function), and :meth:`RunMirror.push` refuses to send an older history over
a newer one.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Protocol

from leanrl.errors import ConfigError

__all__ = ["FolderVolume", "ModalVolume", "RunMirror", "VolumeStore", "run_progress"]

HISTORY = "es_history.bin"
METRICS = "metrics.jsonl"


class VolumeStore(Protocol):
    """Files on a Volume, by path relative to its root."""

    def put(self, local: Path, rel: str) -> None: ...

    def get(self, rel: str, local: Path) -> bool:
        """Copy ``rel`` to ``local``; False when it does not exist."""
        ...

    def listdir(self, rel: str) -> list[tuple[str, bool]]:
        """(name, is_dir) of the entries under ``rel`` (empty when it does not exist)."""
        ...


class FolderVolume:
    """The local backend's Volume: a folder."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser().resolve()

    def put(self, local: Path, rel: str) -> None:
        dst = self.root / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f".{dst.name}.part")
        shutil.copyfile(local, tmp)
        tmp.replace(dst)  # readers never see half a file

    def get(self, rel: str, local: Path) -> bool:
        src = self.root / rel
        if not src.is_file():
            return False
        local.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, local)
        return True

    def listdir(self, rel: str) -> list[tuple[str, bool]]:
        d = self.root / rel
        return sorted((p.name, p.is_dir()) for p in d.iterdir()) if d.is_dir() else []


class ModalVolume:
    """A Modal Volume, through its file API (needs an account and network)."""

    def __init__(self, name: str) -> None:
        import modal

        self.vol: Any = modal.Volume.from_name(name, create_if_missing=True)

    def put(self, local: Path, rel: str) -> None:
        with self.vol.batch_upload(force=True) as batch:
            batch.put_file(str(local), "/" + rel)

    def get(self, rel: str, local: Path) -> bool:
        try:
            data = b"".join(self.vol.read_file("/" + rel))
        except FileNotFoundError:
            return False
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(data)
        return True

    def listdir(self, rel: str) -> list[tuple[str, bool]]:
        from modal.volume import FileEntryType  # type: ignore[attr-defined]

        try:
            entries = self.vol.listdir("/" + rel)
        except FileNotFoundError:
            return []
        return [(Path(e.path).name, e.type == FileEntryType.DIRECTORY) for e in entries]


def run_progress(folder: Path) -> tuple[int, int] | None:
    """How far the run in ``folder`` got: (ES history iterations, last metrics step); None when
    the folder holds no run (no ``config.json``)."""
    if not (folder / "config.json").is_file():
        return None
    iterations = 0
    if (folder / HISTORY).is_file():
        from leanrl.train.es.history import ESHistory

        iterations = len(ESHistory(folder / HISTORY).open(read_only=True))
    step = 0
    if (folder / METRICS).is_file():
        for line in (folder / METRICS).read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                row = json.loads(line)
            except ValueError:  # a torn last line
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int):
                step = max(step, row["step"])
    return iterations, step


def _small(rel: Path) -> bool:
    """Files the mirror carries: everything but what sits inside a checkpoint folder."""
    return not any(part.startswith(("checkpoint-", ".tmp-")) for part in rel.parts[:-1])


class RunMirror:
    """Keeps ``local`` (a run folder here) and ``remote`` (its path on the Volume) in step."""

    def __init__(self, store: VolumeStore, local: str | Path, remote: str) -> None:
        self.store = store
        self.local = Path(local)
        self.remote = remote.strip("/")
        self._sent: dict[str, tuple[float, int]] = {}

    def remote_progress(self) -> tuple[int, int] | None:
        """:func:`run_progress` of the run's copy on the Volume (its small files fetched)."""
        with tempfile.TemporaryDirectory(prefix="leanrl-mirror-") as tmp:
            here = Path(tmp)
            for name in ("config.json", HISTORY, METRICS):
                self.store.get(f"{self.remote}/{name}", here / name)
            return run_progress(here)

    def _where(self) -> str:
        return f"the Volume's copy of {self.remote}"

    def push(self) -> int:
        """Send the small files that changed since the last push; returns how many.

        Refuses (:class:`ConfigError`) when the Volume's copy is further along than this one:
        another orchestrator advanced it, and this older history must not replace it."""
        n = 0
        if not self.local.is_dir():
            return 0
        mine, theirs = run_progress(self.local), self.remote_progress()
        if theirs is not None and (mine is None or theirs > mine):
            at = mine[0] if mine else 0
            raise ConfigError(
                f"{self._where()} is at iteration {theirs[0]} (step {theirs[1]}), further than "
                f"this machine's {self.local} (iteration {at}): another orchestrator advanced "
                "it, so this older history is not pushed over it. Stop the other run, then rerun "
                "the same command: it pulls the Volume's copy and continues from there."
            )
        for p in sorted(self.local.rglob("*")):
            rel = p.relative_to(self.local)
            if not p.is_file() or not _small(rel) or p.name.startswith("."):
                continue
            st = p.stat()
            stamp = (st.st_mtime, st.st_size)
            if self._sent.get(str(rel)) == stamp:
                continue
            self.store.put(p, f"{self.remote}/{rel.as_posix()}")
            self._sent[str(rel)] = stamp
            n += 1
        return n

    def pull(self) -> int:
        """Before a resume: fetch the run from the Volume when this machine has none of it, or
        an older copy (fewer iterations, by :func:`run_progress`); returns the files fetched."""
        theirs = self.remote_progress()
        if theirs is None:
            return 0
        mine = run_progress(self.local)
        if mine is not None and theirs <= mine:
            return 0  # this copy is as far along (or further: the push brings the Volume up)
        n = 0

        def walk(rel: str) -> None:
            nonlocal n
            for name, is_dir in self.store.listdir(f"{self.remote}/{rel}".rstrip("/")):
                sub = f"{rel}/{name}".lstrip("/")
                if is_dir and name.startswith("checkpoint-"):
                    n += self.store.get(
                        f"{self.remote}/{sub}/trainer_state.json",
                        self.local / sub / "trainer_state.json",
                    )
                elif is_dir:
                    walk(sub)
                elif not name.startswith("."):
                    n += self.store.get(f"{self.remote}/{sub}", self.local / sub)

        walk("")
        return n
