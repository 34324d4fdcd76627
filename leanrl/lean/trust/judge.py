"""The trusted checker processes ("judges"), and handing an attempt's constants over to them.

An attempt is elaborated in one process (:class:`leanrl.lean.worker.ReplWorker`), which may run
the attempt's code. Its verdict comes from another process, a judge, that the attempt never
touched. A judge REPL process loads, and only ever elaborates, trusted text::

    {"cmd": "import Lean\\nimport Mathlib"}                   -> E_imp  (the header's imports)
    {"cmd": <LeanrlCheck.lean>, "env": E_imp}                 -> E_chk  (the trusted checker)
    {"cmd": <header rest: options, open>, "env": E_chk}       -> envC   (once per header)
    {"cmd": statement + " sorry", "env": envC}                -> envR   (once per statement)
    {"cmd": "#eval LeanrlCheck.run <file> <name> <nonce> ...", "env": envR}  -> the report

The attempt reaches it only as data: :func:`take_pickle` copies the compiled constants the
elaborating process wrote in its private folder into the judge's hand-off folder (which
elaborating processes cannot see when sandboxed), refusing anything that is not a plain file of
bounded size. The nonce is made after elaboration and travels only in the check command. The
report is read only from the judge's own answer to that command.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import stat
import time
from pathlib import Path

from leanrl.lean.protocol import CommandRequest, CommandResponse, ProtocolError, ReplError
from leanrl.lean.repl import ReplDied, ReplGone, ReplMemory, ReplProcess, ReplTimeout
from leanrl.lean.source import split_header
from leanrl.lean.trust.report import (
    CheckReport,
    check_command,
    check_file_command,
    checker_source,
    parse_report,
    reference_command,
)

__all__ = [
    "CHECK_FLOOR_S",
    "JudgeLimit",
    "JudgeStartError",
    "JudgeWorker",
    "ReferenceProblem",
    "take_pickle",
]

CHECK_FLOOR_S = 5.0
"""The trusted check gets what is left of the attempt's time limit, but at least this long, so a
proof that elaborated just inside the limit is not lost to the check's own few seconds."""


class JudgeStartError(RuntimeError):
    """A judge could not load the imports, the checker or a header. ``header_fault`` is True
    when the taskset's own text does not elaborate (retrying will not help)."""

    def __init__(self, detail: str, *, header_fault: bool) -> None:
        super().__init__(detail)
        self.detail = detail
        self.header_fault = header_fault


class JudgeLimit(RuntimeError):
    """The judge died, ran out of time or went over its memory cap while it ran the check of
    one attempt's constants (the judge has been killed). The judge elaborates only trusted
    text, so it was the attempt's terms that did it: the attempt's ``judge_limit``. A judge
    killed from outside (SIGKILL, SIGTERM, ... while not near its memory cap) is not: that
    propagates as the process's own :class:`~leanrl.lean.repl.ReplDied`, and the pool runs
    the check again on a fresh judge.

    ``kind`` is ``"time"``, ``"memory"`` or ``"died"``; ``detail`` is the verdict's detail.
    """

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


class ReferenceProblem(str):
    """The reference statement does not elaborate in the clean environment (a taskset bug)."""


def take_pickle(src: Path, handoff: Path, max_bytes: int) -> Path | str:
    """Copy the attempt's compiled constants from ``src`` (in the elaborating process's folder)
    to a fresh file in ``handoff``; the path of the copy, or why there is none.

    The source folder is writable by code the attempt may have run, so ``src`` is opened without
    following links and without blocking (a planted FIFO or symlink to another attempt's file is
    refused), must be a regular file of at most ``max_bytes``, and is copied, not moved: a writer
    that kept it open cannot change the copy the judge reads. The original is removed.
    """
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(src, flags)
    except FileNotFoundError:
        return "the elaborating process wrote no compiled environment"
    except OSError as e:
        return f"the attempt's compiled environment cannot be opened safely ({e.strerror})"
    dst = handoff / f"{secrets.token_hex(12)}.olean"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "the attempt's compiled environment is not a regular file"
        if st.st_size > max_bytes:
            return (
                f"the attempt's compiled environment is {st.st_size / 2**20:.0f} MiB, over the "
                f"hand-off limit of {max_bytes / 2**20:.0f} MiB"
            )
        out = os.open(
            dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600
        )
        with os.fdopen(fd, "rb", closefd=False) as fin, os.fdopen(out, "wb") as fout:
            copied = _copy_bounded(fin, fout, max_bytes)
        if copied > max_bytes:
            dst.unlink(missing_ok=True)
            return "the attempt's compiled environment grew past the hand-off limit while copied"
        return dst
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            src.unlink()


def _copy_bounded(fin: object, fout: object, max_bytes: int) -> int:
    n = 0
    read = fin.read  # type: ignore[attr-defined]
    write = fout.write  # type: ignore[attr-defined]
    while n <= max_bytes:
        chunk = read(1 << 20)
        if not chunk:
            break
        n += len(chunk)
        write(chunk)
    return n


class JudgeWorker:
    """One trusted checker process, warmed for one set of imports. It never elaborates model
    text: only the header, the taskset's reference statements and the check command."""

    def __init__(self, proc: ReplProcess, imports: tuple[str, ...], folder: Path) -> None:
        self.proc = proc
        self.imports = imports
        self.folder = folder
        self.attempts = 0
        self._e_chk = -1
        self._headers: dict[str, int] = {}
        self._refs: dict[tuple[str, int], int] = {}

    async def start(self, timeout: float) -> None:
        """Spawn, load the imports and the checker (raises :class:`JudgeStartError`)."""
        deadline = time.monotonic() + timeout
        try:
            await self.proc.start()
            e_imp = await self._cmd("\n".join(self.imports), None, deadline, "the imports")
            self._e_chk = await self._cmd(
                checker_source(), e_imp, deadline, "leanrl's checker", header_fault=False
            )
            self.proc.mark_spine()
        except (ProtocolError, OSError, RuntimeError) as e:
            if isinstance(e, JudgeStartError):
                raise
            raise JudgeStartError(f"the Lean REPL did not start: {e}", header_fault=False) from e

    async def _cmd(
        self, text: str, env: int | None, deadline: float, what: str, header_fault: bool = True
    ) -> int:
        ans = await self.proc.request(CommandRequest(cmd=text, env=env), _left(deadline))
        if isinstance(ans, ReplError):
            raise JudgeStartError(
                f"loading {what} failed: {ans.message}", header_fault=header_fault
            )
        if not isinstance(ans, CommandResponse):
            raise ProtocolError(f"unexpected answer while loading {what}")
        if ans.errors:
            e = ans.errors[0]
            line = f" (line {e.pos.line})" if e.pos else ""
            raise JudgeStartError(
                f"{what} does not elaborate{line}: {e.data[:500]}", header_fault=header_fault
            )
        return ans.env

    async def _header_env(self, header: str, deadline: float) -> int:
        """The clean environment after the header's options and ``open`` lines (cached)."""
        rest = split_header(header)[1]
        if rest not in self._headers:
            self._headers[rest] = (
                await self._cmd(rest, self._e_chk, deadline, "the header")
                if rest.strip()
                else self._e_chk
            )
        return self._headers[rest]

    async def _reference(self, header: str, statement: str, deadline: float) -> int | str:
        """The clean environment holding the reference statement (cached per statement)."""
        env_c = await self._header_env(header, deadline)
        key = (statement, env_c)
        if key not in self._refs:
            cmd = CommandRequest(cmd=reference_command(statement), env=env_c)
            ans = await self.proc.request(cmd, _left(deadline))
            if isinstance(ans, ReplError):
                return ReferenceProblem(f"the reference statement failed: {ans.message}")
            if not isinstance(ans, CommandResponse):
                raise ProtocolError("unexpected answer to the reference statement")
            if ans.errors:
                return ReferenceProblem(
                    "the reference statement itself does not elaborate in a clean environment "
                    f"(a taskset problem): {ans.errors[0].data[:300]}"
                )
            self._refs[key] = ans.env
        return self._refs[key]

    async def check(
        self,
        *,
        header: str,
        statement: str,
        name: str,
        pickle: Path,
        olean: bool,
        replay: bool,
        timeout: float,
        file: bool = False,
    ) -> CheckReport | str:
        """Run the trusted check of the constants in ``pickle``. ``file``: a file check
        (``Attempt.check == "file"``): no target and no reference statement (``statement`` and
        ``name`` are unused), every constant of the file is checked in the header's clean
        environment (:func:`~leanrl.lean.trust.report.check_file_command`).

        Returns the report, a :class:`ReferenceProblem` when the taskset's statement does not
        elaborate, or another string when the check did not run as intended. A process failure
        while the check command runs (the judge dies, or goes past ``timeout`` or its memory
        cap) raises :class:`JudgeLimit`; one before it (loading the header or the reference
        statement, both trusted text) propagates as the process's own exception.
        """
        deadline = time.monotonic() + timeout
        self.attempts += 1
        try:
            if file:
                env_ref: int | str = await self._header_env(header, deadline)
            else:
                env_ref = await self._reference(header, statement, deadline)
        except JudgeStartError as e:
            return ReferenceProblem(f"taskset header problem: {e.detail}")
        if isinstance(env_ref, str):
            return env_ref
        nonce = secrets.token_hex(16)  # made now: nothing the attempt ran could have seen it
        if file:
            cmd = check_file_command(str(pickle), nonce, olean=olean, replay=replay)
        else:
            cmd = check_command(str(pickle), name, nonce, olean=olean, replay=replay)
        limit = _left(deadline)
        try:
            rep = await self.proc.request(CommandRequest(cmd=cmd, env=env_ref), limit)
        except ReplGone:
            raise  # dead before the check reached it: not this attempt's doing
        except ReplTimeout as e:
            raise JudgeLimit(
                "time",
                f"the judge's wall-clock limit of {limit:.3g} s (what was left of the attempt's "
                f"time limit) ran out while it checked this attempt ({e}); the judge was "
                "replaced",
            ) from e
        except ReplMemory as e:
            raise JudgeLimit(
                "memory",
                f"the judge went over its memory cap while it checked this attempt ({e}); the "
                "judge was replaced",
            ) from e
        except ReplDied as e:
            if self.proc.killed_from_outside() and not self._near_cap():
                # SIGKILL/SIGTERM from outside (an operator, another program's memory pressure):
                # not the attempt's terms. The pool runs the check again (``crash_retries``).
                raise
            raise JudgeLimit(
                "died",
                f"the judge process died while it checked this attempt ({e}); the judge was "
                "replaced and the attempt is not retried",
            ) from e
        if isinstance(rep, ReplError):
            return f"the trusted check failed: {rep.message}"
        if not isinstance(rep, CommandResponse):
            raise ProtocolError("the REPL answered the check with a proof state")
        return parse_report(rep.messages, nonce)

    def _near_cap(self) -> bool:
        """The judge was near its memory cap (a kernel OOM kill then is the check's doing)."""
        cap = self.proc.memory_mb
        return self.proc.out_of_memory() or bool(cap and self.proc.peak_rss_mb >= 0.8 * cap)

    async def close(self) -> None:
        """Stop the process and remove its folder."""
        await self.proc.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def _left(deadline: float) -> float:
    return max(0.001, deadline - time.monotonic())
