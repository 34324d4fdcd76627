"""The launched functions run in local processes, behind the same interface as Modal.

:class:`LocalFunctions` stands in for a deployed Modal app: each function name has a body (its
import path, :data:`~leanrl.launch.specs.FUNCTION_BODIES`), a most number of containers and of
inputs per container.
A *container* is a spawned process with the Volume (a folder) as its working folder; it keeps
what it loaded between calls, and runs up to ``concurrency`` calls at once on its event loop.
``map`` streams ``(index, result)`` pairs as calls finish (like ``Function.map`` with
``order_outputs=False``: the caller restores the order); a call whose container dies is retried
on a fresh container up to ``retries`` times (Modal's ``retries``), then fails the map.

A container never outlives the process that started it (a killed CLI must not leave its ES
orchestrator training on, nor a rerun start a second one): it exits at once when its pipe to
that process reaches end-of-file or its parent changes (a watchdog thread polls
``os.getppid()``), and on Linux the kernel kills it when its parent dies
(``PR_SET_PDEATHSIG``). The containers it started itself (an orchestrator's members) follow it
the same way. It ignores SIGINT: Ctrl-C is the launcher's to handle, which closes it.
"""

from __future__ import annotations

import asyncio
import ctypes
import importlib
import inspect
import itertools
import multiprocessing as mp
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn

from leanrl.errors import LeanrlError
from leanrl.launch.specs import ROLE_ENV, VOLUME_ENV

__all__ = ["FunctionError", "FunctionSpec", "LocalFunctions"]


class FunctionError(LeanrlError):
    """A launched function failed (its error, or its container died past the retries)."""


@dataclass(frozen=True)
class FunctionSpec:
    """How one function runs: its body and its containers."""

    body: str
    """``module:function`` (sync or async; one payload in, one result out)."""
    max_containers: int = 1
    concurrency: int = 1
    """Calls one container runs at once."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment of its containers (besides the Volume's and the caller's)."""


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _orphaned() -> NoReturn:
    """The launcher is gone: stop now, with the containers this one started. Calls in flight
    are abandoned (no one is left to read their results; a rerun resumes from the Volume),
    and waiting for them would leave a training loop running that nobody can stop."""
    for child in mp.active_children():
        child.kill()
    os._exit(70)


def _die_with_parent(parent: int, pdeathsig: bool) -> None:
    """Make this container exit when ``parent`` (the process that spawned it) dies."""
    if pdeathsig and sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # no prctl: the watchdog below still works
            pass
    if os.getppid() != parent:  # it died before the death signal was armed
        _orphaned()

    def watch() -> None:
        # portable: an orphan is re-parented (to init or a subreaper), so its ppid changes
        while os.getppid() == parent:
            time.sleep(0.5)
        _orphaned()

    threading.Thread(target=watch, name="leanrl-parent-watchdog", daemon=True).start()


def _container_main(
    conn: Any, body: str, env: dict[str, str], root: str, parent: int, pdeathsig: bool
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(parent, pdeathsig)
    os.environ.update(env)
    os.environ[VOLUME_ENV] = root
    os.chdir(root)
    try:
        asyncio.run(_serve(conn, body))
    except (EOFError, OSError):
        _orphaned()  # the pipe to the launcher broke: it died


async def _serve(conn: Any, body: str) -> None:
    module, _, name = body.partition(":")
    fn = getattr(importlib.import_module(module), name)
    is_async = inspect.iscoroutinefunction(fn)
    loop = asyncio.get_running_loop()
    send_lock = asyncio.Lock()
    running: set[asyncio.Task[None]] = set()

    async def one(call_id: int, payload: Any) -> None:
        try:
            result = await fn(payload) if is_async else await asyncio.to_thread(fn, payload)
            msg: tuple[Any, ...] = ("ok", call_id, result)
        except Exception as e:  # noqa: BLE001 - sent to the caller, which raises it
            msg = ("error", call_id, (traceback.format_exc(), _user_error(e)))
        async with send_lock:
            await asyncio.to_thread(conn.send, msg)

    while True:
        try:
            msg = await loop.run_in_executor(None, conn.recv)
        except (EOFError, OSError):
            _orphaned()  # end of file without a "close": the launcher died
        if msg[0] == "close":
            break
        task = asyncio.ensure_future(one(msg[1], msg[2]))
        running.add(task)
        task.add_done_callback(running.discard)
    if running:
        await asyncio.gather(*running, return_exceptions=True)


def _user_error(e: BaseException) -> bytes | None:
    """``e`` pickled when it is one of leanrl's own errors (bad config, missing Lean...): the
    caller raises it as it is, one line on the CLI as if it were raised there. Anything else is
    a bug, shown with its container's traceback."""
    if not isinstance(e, LeanrlError):
        return None
    try:
        blob = pickle.dumps(e)
        pickle.loads(blob)  # an exception class that cannot be rebuilt is sent as text
    except Exception:  # noqa: BLE001 - any failure to round-trip means "send the text"
        return None
    return blob


@dataclass(eq=False)
class _Container:
    name: str
    proc: Any
    conn: Any
    inflight: dict[int, tuple[int, Any, int]] = field(default_factory=dict)
    """call id -> (input index, payload, tries so far)."""
    dead: bool = False
    reader: Any = None


class LocalFunctions:
    """Local stand-in for a Modal app's functions (see the module docstring)."""

    def __init__(
        self,
        specs: Mapping[str, FunctionSpec],
        volume: str | Path,
        *,
        retries: int = 2,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.specs = dict(specs)
        self.volume = Path(volume).expanduser().resolve()
        self.retries = retries
        self.env = dict(env or {})
        self._containers: dict[str, list[_Container]] = {}
        self._ids = itertools.count()
        self._routes: dict[int, asyncio.Queue[tuple[_Container, Any]]] = {}
        self.started: dict[str, int] = {}
        """Containers started per function (a retry starts a fresh one)."""

    async def start(self) -> None:
        self.volume.mkdir(parents=True, exist_ok=True)

    def _spawn(self, name: str) -> _Container:
        spec = self.specs[name]
        ctx = mp.get_context("spawn")  # fork + torch threads deadlock; spawn is safe everywhere
        parent, child = ctx.Pipe()
        env = {**self.env, **spec.env, ROLE_ENV: os.environ.get(ROLE_ENV, "")}
        # The kernel's parent-death signal fires when the *thread* that spawned the child ends,
        # so it is armed only for children spawned by the main thread (which lives as long as
        # the process); a job running on a worker thread relies on the pipe and the watchdog.
        pdeathsig = threading.current_thread() is threading.main_thread()
        args = (child, spec.body, env, str(self.volume), os.getpid(), pdeathsig)
        proc = ctx.Process(target=_container_main, args=args, daemon=False)
        proc.start()
        child.close()
        c = _Container(name, proc, parent)
        self._containers.setdefault(name, []).append(c)
        self.started[name] = self.started.get(name, 0) + 1
        # One reader per container for its whole life, routing each answer to the map that
        # made the call (a reader per map would leave a thread blocked in recv() behind).
        c.reader = asyncio.ensure_future(self._read(c))
        return c

    async def _read(self, c: _Container) -> None:
        while True:
            try:
                msg = await asyncio.to_thread(c.conn.recv)
            except (EOFError, OSError):
                waiting = [self._routes[k] for k in c.inflight if k in self._routes]
                for q in {id(q): q for q in waiting}.values():
                    await q.put((c, None))  # a death notice to every map waiting on it
                c.dead = True
                return
            route = self._routes.get(msg[1])
            if route is not None:
                await route.put((c, msg))

    def with_concurrency(self, name: str, max_inputs: int) -> None:
        """Containers of ``name`` take ``max_inputs`` calls at once from the next ``map`` on
        (the running ones too: unlike Modal's ``with_concurrency``, no fresh containers)."""
        if max_inputs < 1:
            raise ValueError(f"max_inputs must be at least 1, got {max_inputs}")
        self.specs[name] = replace(self.specs[name], concurrency=max_inputs)

    def containers(self, name: str) -> list[Any]:
        """The live container processes of ``name`` (tests kill them to see retries)."""
        return [c.proc for c in self._containers.get(name, []) if not c.dead]

    async def map(self, name: str, inputs: Iterable[Any]) -> AsyncIterator[tuple[int, Any]]:
        """``(index, result)`` for every input, as they finish (not in input order)."""
        spec = self.specs[name]
        todo: list[tuple[int, Any, int]] = [(i, x, 0) for i, x in enumerate(inputs)]
        todo.reverse()  # pop() from the end hands out inputs in order
        left = len(todo)
        done: asyncio.Queue[tuple[_Container, Any]] = asyncio.Queue()
        mine: set[int] = set()

        def free(c: _Container) -> int:
            return 0 if c.dead else spec.concurrency - len(c.inflight)

        try:
            while left:
                # hand out work: fill live containers, then start new ones up to the limit
                while todo:
                    live = [c for c in self._containers.get(name, []) if free(c) > 0]
                    if not live:
                        alive = [c for c in self._containers.get(name, []) if not c.dead]
                        if len(alive) >= spec.max_containers:
                            break
                        live = [self._spawn(name)]
                    c = live[0]
                    index, payload, tries = todo.pop()
                    call_id = next(self._ids)
                    c.inflight[call_id] = (index, payload, tries)
                    self._routes[call_id] = done
                    mine.add(call_id)
                    try:
                        c.conn.send(("call", call_id, payload))
                    except OSError:
                        pass  # dead: its reader reports it and the call is retried
                c, msg = await done.get()
                if msg is None:  # the container died: retry its calls elsewhere
                    c.dead = True
                    await asyncio.to_thread(c.proc.join, 5)
                    lost = [(k, v) for k, v in c.inflight.items() if k in mine]
                    for k, _ in lost:
                        del c.inflight[k]
                    for _, (index, payload, tries) in lost:
                        if tries >= self.retries:
                            raise FunctionError(
                                f"{name}: input {index} failed {tries + 1} times: its container "
                                f"died (exit code {c.proc.exitcode}); no retries left"
                            )
                        todo.append((index, payload, tries + 1))
                    continue
                kind, call_id, value = msg
                index, _, _ = c.inflight.pop(call_id)
                if kind == "error":
                    text, user_error = value
                    if user_error is not None:
                        raise pickle.loads(user_error)  # a ConfigError stays one line
                    raise FunctionError(f"{name}: input {index} raised:\n{text}")
                left -= 1
                yield index, value
        finally:
            for k in mine:
                self._routes.pop(k, None)

    async def call(self, name: str, payload: Any) -> Any:
        """One call of ``name`` (retried like a map of one input)."""
        async for _, result in self.map(name, [payload]):
            return result
        raise FunctionError(f"{name} returned nothing")

    async def close(self) -> None:
        """Stop every container (as Modal scales them down). A container still running calls
        (the caller gave up on them: an error elsewhere, Ctrl-C) is killed, not waited for."""
        for cs in self._containers.values():
            for c in cs:
                if c.dead:
                    continue
                if c.inflight:
                    c.proc.kill()  # its own containers follow it (see the module docstring)
                    continue
                try:
                    c.conn.send(("close",))
                except OSError:
                    pass
        for cs in self._containers.values():
            for c in cs:
                await asyncio.to_thread(c.proc.join, 30)
                if c.proc.is_alive():
                    c.proc.kill()
                    await asyncio.to_thread(c.proc.join, 5)
                if c.reader is not None:
                    await asyncio.gather(c.reader, return_exceptions=True)  # EOF ends it
                c.conn.close()
        self._containers.clear()
