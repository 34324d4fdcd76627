"""A Kimina-compatible front door on ``leanrl serve``: ``POST /verify`` and ``POST /api/check``.

Tools built on the Kimina Lean server (verl's Kimina-Prover recipe, ``kimina-client``) send a
whole Lean file per proof and read back what the Lean REPL said. These two endpoints take the
Kimina server's request shapes and answer in its response shapes, with leanrl's verdicts:

=====================  ===========================================  ==========================
endpoint               body (Kimina's)                              answer (Kimina's)
=====================  ===========================================  ==========================
``POST /verify``       :class:`VerifyRequest` (``codes``)           :class:`VerifyResponse`
``POST /api/check``    :class:`SnippetsRequest` (``snippets``;      :class:`SnippetsResponse`
                       what ``KiminaClient.check`` sends)
=====================  ===========================================  ==========================

Which statement a file is judged against (docs/interop.md):

* **a registered taskset's**, when the file declares a theorem whose name is a task of one of
  :attr:`KiminaConfig.tasksets`: the file is read like a model's answer for that task (its
  header lines are dropped, its helper lemmas become the preamble, a restated statement is
  compared with the reference by the trusted checker), under that taskset's policy;
* **the request's own**, otherwise (unless :attr:`KiminaConfig.own_statements` is off), under a
  stricter rule: after its header (imports, ``open``, ``set_option`` lines) the file is exactly
  one ``theorem``/``lemma`` and its proof; the header after its imports and the statement get the
  pre-scan with no finding allowed (not even the options a taskset may set), and the strict
  default :class:`~leanrl.VerificationPolicy` judges the proof. The verdict then says only that
  this file's theorem was proved soundly, and its ``leanrl.statement`` says ``request's own``.

Verdicts become Kimina fields so that Kimina's own reading (``ReplResponse.analyze``: valid,
sorry, lean_error, timeout_error, repl_error, server_error) agrees with leanrl's: see
:func:`kimina_result` and the table in docs/interop.md. Every result also carries leanrl's own
verdict under ``leanrl`` (Kimina's client ignores the extra key).
"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from leanrl._sandbox_config import ServiceLimits
from leanrl.environment import load_environment
from leanrl.errors import ConfigError, DatasetError
from leanrl.harnesses.whole_proof.extract import extract_proof
from leanrl.lean.source import assemble
from leanrl.lean.trust.lexer import Kind, bracket_delta, code_only, tokenize
from leanrl.lean.trust.syntax import scan
from leanrl.service.protocol import CheckResponse
from leanrl.task import Task
from leanrl.verdict import Attempt, Message, Reason, Verdict, VerificationPolicy

if TYPE_CHECKING:
    from fastapi import APIRouter

__all__ = [
    "KiminaConfig",
    "KiminaTaskset",
    "SnippetsRequest",
    "SnippetsResponse",
    "Statements",
    "VerifyRequest",
    "VerifyResponse",
    "kimina_result",
    "kimina_router",
    "prepare",
]

OWN = "request's own"
"""``leanrl.statement`` of a verdict judged against the statement in the request itself."""
FILE = "file"
"""``leanrl.statement`` of a file check: every declaration of the file, no reference."""


# -- configuration -------------------------------------------------------------------------------


class KiminaTaskset(BaseModel):
    """One taskset whose statements ``POST /verify`` looks theorems up in, by name."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    env: str
    """Environment id (``leanrl envs`` lists them), e.g. ``core`` or ``minif2f``."""
    split: str | None = None
    """Its split (default: the taskset's own default split; ``all`` for every split)."""
    path: str | None = None
    """A local copy of its data (default: the taskset's own source)."""


class KiminaConfig(BaseModel):
    """The Kimina-compatible endpoints (``POST /verify``, ``POST /api/check``)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    tasksets: list[KiminaTaskset] = Field(default_factory=list)
    """Tasksets whose reference statements a file is judged against when it declares a
    theorem of theirs by name (e.g. '[{"env": "minif2f"}]'). Loaded when the service starts."""
    own_statements: bool = True
    """Judge a file that names no registered theorem against its own statement (one theorem
    per file, strict pre-scan of its header and statement; docs/interop.md). Off: such a file
    is rejected, so only registered statements can be proved."""


class Statements:
    """The registered reference statements: theorem name -> (task, policy, taskset label)."""

    def __init__(self, config: KiminaConfig) -> None:
        self.config = config
        self.by_name: dict[str, tuple[Task, VerificationPolicy, str]] = {}
        self.ambiguous: set[str] = set()
        for ts in config.tasksets:
            kw: dict[str, Any] = {k: v for k, v in (("split", ts.split), ("path", ts.path)) if v}
            env = load_environment(ts.env, **kw)
            label = f"taskset {ts.env}" + (f" ({ts.split})" if ts.split else "")
            policy = env.taskset.config.policy
            for task in env.tasks():
                old = self.by_name.get(task.name)
                if old is None:
                    self.by_name[task.name] = (task, policy, label)
                elif (old[0].header, old[0].formal_statement) != (
                    task.header,
                    task.formal_statement,
                ):
                    # Two different statements under one name: a file naming it could be judged
                    # against either, so it is judged against neither.
                    self.ambiguous.add(task.name)


# -- Kimina's wire format (kimina-client's models; frozen mirrors) ---------------------------------


class _Wire(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class _Request(BaseModel):
    # Kimina's request models ignore fields they do not know (pydantic's default): a client
    # written for a newer server, or one that sends its own extras, is answered, not refused.
    model_config = ConfigDict(frozen=True, extra="ignore")


class Code(_Request):
    """One file to check (``/verify``): Kimina's ``Code``."""

    custom_id: str | int
    """The caller's id, echoed back (as a string, as Kimina's server does)."""
    proof: str | None = None
    """The whole Lean file: header, theorem and proof."""
    code: str | None = None
    """The same, under the older name Kimina still accepts."""

    @model_validator(mode="after")
    def _has_text(self) -> Code:
        if self.proof is None and self.code is None:
            raise ValueError(f"code {self.custom_id!r} has neither 'proof' nor 'code'")
        return self

    def text(self) -> str:
        return self.proof if self.proof is not None else (self.code or "")


Infotree = Literal["full", "tactics", "original", "substantive"]


class VerifyRequest(_Request):
    """``POST /verify``: Kimina's ``VerifyRequestBody``."""

    codes: tuple[Code, ...]
    """The files, answered in this order."""
    timeout: int = Field(default=300, ge=0)
    """Accepted, not honoured: the runtime's own time limit applies (a caller never raises it)."""
    infotree_type: Infotree | None = None
    """Accepted, not honoured: leanrl returns no info trees."""
    disable_cache: bool = False
    """Accepted; leanrl keeps no result cache for these endpoints."""


class Snippet(_Request):
    """One file to check (``/api/check``): Kimina's ``Snippet``."""

    id: str
    """The caller's id, echoed back."""
    code: str
    """The whole Lean file."""


class SnippetsRequest(_Request):
    """``POST /api/check``: Kimina's ``CheckRequest`` (what ``KiminaClient.check`` sends)."""

    snippets: tuple[Snippet, ...]
    """The files, answered in this order."""
    timeout: int = Field(default=30, ge=0)
    """Accepted, not honoured (see :attr:`VerifyRequest.timeout`)."""
    debug: bool = False
    """Accepted; no diagnostics are returned."""
    reuse: bool = True
    """Accepted; the runtime reuses its Lean processes anyway."""
    infotree: Infotree | None = None
    """Accepted, not honoured: leanrl returns no info trees."""

    @model_validator(mode="after")
    def _snippets(self) -> SnippetsRequest:
        # Kimina's CheckRequest refuses both (422): an empty batch, and ids it could not tell
        # apart in the answer.
        if not self.snippets:
            raise ValueError("`snippets` must be non empty")
        if len({s.id for s in self.snippets}) != len(self.snippets):
            raise ValueError("`snippets` must have unique ids")
        return self


class Pos(_Wire):
    """A position as the Lean REPL gives it."""

    line: int
    column: int


class KMessage(_Wire):
    """A Lean message as the REPL gives it (``severity``, ``pos``, ``endPos``, ``data``)."""

    severity: Literal["trace", "info", "warning", "error"]
    pos: Pos
    endPos: Pos | None = None  # (the REPL's spelling)
    data: str


class Sorry(_Wire):
    """A ``sorry`` as the REPL lists it."""

    pos: Pos
    endPos: Pos  # (the REPL's spelling)
    goal: str


class CommandResponse(_Wire):
    """What the REPL answered for the file (Kimina's ``ExtendedCommandResponse``)."""

    env: int = 0
    """The REPL's environment number, in Kimina's shape; always 0: leanrl offers no REPL
    environment to build on (each file is checked from its header)."""
    messages: tuple[KMessage, ...] = ()
    sorries: tuple[Sorry, ...] = ()
    time: float | None = None


class ReplError(_Wire):
    """The REPL itself failed on the file (Kimina's ``ExtendedError``)."""

    message: str
    time: float | None = None


class LeanrlVerdict(_Wire):
    """leanrl's verdict, added to every result under ``leanrl`` (Kimina's client ignores it)."""

    accepted: bool
    reason: Reason
    detail: str = ""
    statement: str
    """What the file was judged against: ``taskset <env>``, ``request's own`` (one theorem),
    ``file`` (every declaration of the file, no reference statement); empty when the file named
    nothing checkable."""
    theorem: str | None = None
    """The theorem judged."""
    axioms: tuple[str, ...] = ()
    checked: str = ""
    """The text after the header that Lean checked."""
    line_offset: int = 0
    """What was added to the line of each of Lean's positions in ``messages`` and ``sorries``
    (as Kimina's server adds its header's line count), so that they point into the request's
    file; subtract it to point into ``checked``."""


class VerifyResult(_Wire):
    """One file's answer (``/verify``): Kimina's ``BackwardResponse``."""

    custom_id: str
    error: str | None = None
    response: CommandResponse | ReplError | None = None
    leanrl: LeanrlVerdict | None = None


class VerifyResponse(_Wire):
    """``POST /verify``'s answer."""

    results: tuple[VerifyResult, ...]


class SnippetResult(_Wire):
    """One file's answer (``/api/check``): Kimina's ``ReplResponse``."""

    id: str
    time: float = 0.0
    error: str | None = None
    response: CommandResponse | ReplError | None = None
    leanrl: LeanrlVerdict | None = None


class SnippetsResponse(_Wire):
    """``POST /api/check``'s answer."""

    results: tuple[SnippetResult, ...]


# -- reading a file --------------------------------------------------------------------------------


_HEADER_LINE = re.compile(r"(import|open|set_option)\s")
_THEOREM = ("theorem", "lemma")


class Prepared(BaseModel):
    """A file made ready to check: an attempt, or the verdict it gets without Lean."""

    model_config = ConfigDict(frozen=True)

    attempt: Attempt | None = None
    refusal: Verdict | None = None
    statement: str = ""
    theorem: str | None = None
    line_offset: int = 0
    """Lines of the request's file before the checked text's first line (Lean's positions are
    shifted by it, as Kimina shifts them by its header's lines)."""


def split_header(text: str) -> tuple[str, str]:
    """``text`` as (header, the rest): the header is its leading ``import``/``open``/
    ``set_option`` lines with the blank and comment lines among them (a doc comment starts the
    rest: it belongs to the declaration after it; an ``... in`` line too: it scopes one)."""
    header, body, _ = _split(text)
    return header, body


def _split(text: str) -> tuple[str, str, int]:
    """:func:`split_header`, and how many of the file's lines the header took."""
    raw = text.split("\n")
    code = code_only(text).split("\n")
    n = 0
    for ln, c in zip(raw, code, strict=True):
        s = c.strip()
        if ln.lstrip().startswith("/--"):
            break
        if s and not (_HEADER_LINE.match(s) and not s.endswith(" in")):
            break
        n += 1
    header = "\n".join(raw[:n]).strip("\n")
    return (header + "\n" if header else ""), "\n".join(raw[n:]), n


def _theorem_names(body: str) -> list[str]:
    """Names of the theorems/lemmas ``body`` declares (outside comments and strings)."""
    tokens = tokenize(body)
    return [
        tokens[k + 1].value
        for k, t in enumerate(tokens[:-1])
        if t.kind is Kind.IDENT and not t.escaped and t.text in _THEOREM
        if tokens[k + 1].kind is Kind.IDENT
    ]


def _own_statement(body: str) -> tuple[str, str, int, int] | str:
    """(name, statement ending in ``:= by``, offset of its ``:=``, offset of its first token)
    of the one theorem ``body`` is, or why it is not."""
    tokens = tokenize(body)
    if tokens and tokens[-1].kind is Kind.ERROR:
        return f"the file cannot be read as Lean (line {tokens[-1].line})"
    code = [t for t in tokens if t.kind is not Kind.DOC]
    if not code:
        return "the file has no theorem"
    first = code[0]
    if first.kind is not Kind.IDENT or first.text not in _THEOREM:
        what = "an `example`" if first.text == "example" else f"`{first.text}`"
        return (
            f"after its header the file starts with {what}; under the request's own statement "
            "it must be exactly one named `theorem` (or register a taskset whose theorem it "
            "names: --kimina.tasksets)"
        )
    if len(code) < 2 or code[1].kind is not Kind.IDENT:
        return "the theorem has no name"
    depth, local = 0, False
    for t in code[2:]:
        depth += bracket_delta(t)
        if t.kind is Kind.SYMBOL and t.text == ":=" and depth == 0:
            if not local:
                stmt = body[first.start : t.start].rstrip() + " := by"
                return code[1].value, stmt, t.start, first.start
            local = False
        elif t.kind is Kind.IDENT and t.text in ("let", "have") and depth == 0:
            local = True
    return "the theorem has no `:=` proof"


_PRINT_AXIOMS = re.compile(r"#print\s+axioms\s+\S+\s*$")


def _trailing_command(body: str, assign: int) -> str | None:
    """The first line after the statement's ``:=`` (at offset ``assign``) that starts at column
    0, where Lean starts a new command, other than ``#print axioms``; None when the theorem ends
    the file."""
    for ln in code_only(body)[assign:].split("\n")[1:]:
        if ln[:1].strip() and not _PRINT_AXIOMS.match(ln):
            return ln.strip()
    return None


def _strict_problem(header: str, statement: str) -> str | None:
    """Why the request's own header (after its imports) or statement has any pre-scan finding."""
    rest = "\n".join(ln for ln in header.split("\n") if not ln.lstrip().startswith("import "))
    strict = VerificationPolicy()
    for what, text in (("header", rest), ("statement", statement)):
        found = scan(text, strict)
        if found:
            f = found[0]
            return f"the {what} uses `{f.token}` (line {f.line}): {f.why}"
    return None


def prepare(text: str, statements: Statements, cid: str) -> Prepared:
    """The attempt for the Kimina file ``text`` (id ``cid``), or the verdict it gets unchecked:
    a registered theorem's check, the request's own one theorem's check, else a file check."""
    header, body, n_header = _split(text)
    names = [n for n in dict.fromkeys(_theorem_names(body)) if n in statements.by_name]
    if names:
        return _registered(text, body, n_header, names, statements, cid)
    if not statements.config.own_statements:
        return _refuse(
            Reason.STATEMENT_CHANGED,
            "the file declares no theorem of the registered tasksets, and this service judges "
            "only those (--kimina.own_statements false)",
            "",
            None,
        )
    own = _own_statement(body)
    if not isinstance(own, str) and _trailing_command(body, own[2]) is None:
        name, statement, _, start = own
        why = _strict_problem(header, statement)
        if why is not None:
            return _refuse(Reason.FORBIDDEN, why, OWN, name)
        task = Task(name=name, header=header, formal_statement=statement)
        ex = extract_proof(body, task)
        if ex.proof is not None and not ex.preamble.strip():
            attempt = Attempt(
                name=name, header=header, formal_statement=statement, proof=ex.proof, id=cid
            )
            offset = n_header + body[:start].count("\n")
            return Prepared(attempt=attempt, statement=OWN, theorem=name, line_offset=offset)
    # Anything else (a `#check`, a `def` before a lemma, several theorems, an `example`) is
    # checked as a file: Lean elaborates it as it is, and the trusted checker replays every
    # constant it adds and walks their axioms. The header after its imports gets the strict
    # pre-scan; the rest is the attempt's text, pre-scanned by the strict default policy.
    why = _strict_problem(header, "")
    if why is not None:
        return _refuse(Reason.FORBIDDEN, why, FILE, None)
    if not body.strip():
        return _refuse(Reason.NO_PROOF, "the file has nothing after its header", FILE, None)
    attempt = Attempt(name="", header=header, formal_statement="", proof=body, check="file", id=cid)
    return Prepared(attempt=attempt, statement=FILE, line_offset=n_header)


def _registered(
    text: str, body: str, n_header: int, names: list[str], statements: Statements, cid: str
) -> Prepared:
    """A file that names a registered theorem, read like a model's answer for that task."""
    if len(names) > 1:
        return _refuse(
            Reason.STATEMENT_CHANGED,
            f"the file declares several registered theorems ({', '.join(names)}); send one "
            "per code",
            "",
            None,
        )
    name = names[0]
    task, policy, label = statements.by_name[name]
    if name in statements.ambiguous:
        return _refuse(
            Reason.STATEMENT_CHANGED,
            f"the registered tasksets state {name!r} in different ways; it cannot be judged",
            label,
            name,
        )
    ex = extract_proof(text, task)
    if ex.proof is None:
        return _refuse(ex.reason or Reason.NO_PROOF, ex.detail, label, name)
    attempt = Attempt(
        name=task.name,
        header=task.header,
        formal_statement=task.formal_statement,
        proof=ex.proof,
        preamble=ex.preamble,
        restated_statement=ex.restated_statement,
        policy=policy,
        id=cid,
    )
    # The checked text is not the file's (the taskset's header, the preamble re-laid): its
    # statement's line is put on the file's theorem line, which is exact from there on.
    tokens = tokenize(body)
    pairs = itertools.pairwise(tokens)
    at = next((t.start for t, nxt in pairs if t.text in _THEOREM and nxt.value == name), 0)
    theorem_line = n_header + body[:at].count("\n") + 1
    offset = theorem_line - assemble(attempt).statement_lines[0]
    return Prepared(attempt=attempt, statement=label, theorem=name, line_offset=offset)


def _refuse(reason: Reason, detail: str, statement: str, theorem: str | None) -> Prepared:
    return Prepared(refusal=Verdict.reject(reason, detail), statement=statement, theorem=theorem)


# -- verdicts as Kimina fields ---------------------------------------------------------------------

_START = Pos(line=1, column=0)


def _kmessage(m: Message, offset: int = 0) -> KMessage:
    """A Lean message in the REPL's shape, its lines moved by ``offset`` into the request's file
    (a message without a position gets the file's start)."""
    severity = m.severity if m.severity in ("trace", "info", "warning", "error") else "info"

    def moved(line: int, column: int) -> Pos:
        return Pos(line=max(1, line + offset), column=column)

    pos = moved(m.pos.line, m.pos.column) if m.pos is not None else _START
    end = moved(m.end_pos.line, m.end_pos.column) if m.end_pos is not None else None
    return KMessage(severity=severity, pos=pos, endPos=end, data=m.data)  # type: ignore[arg-type]


def kimina_result(
    v: Verdict, p: Prepared
) -> tuple[str | None, CommandResponse | ReplError | None, LeanrlVerdict]:
    """A verdict as Kimina's (``error``, ``response``) pair plus leanrl's own, so that Kimina's
    reading of the result agrees with the verdict:

    * accepted: a response with Lean's messages (none of them errors), no sorries: *valid*;
    * ``sorry``: Lean's messages and one entry in ``sorries``: *sorry*;
    * ``timeout``: ``error`` saying "timed out": *timeout_error*;
    * ``crash``: a REPL-level ``{"message": ...}`` response: *repl_error*;
    * ``memory``, ``infra``: ``error``: *server_error* (not the proof's fault: retry it);
    * any other rejection (``error``, ``axiom``, ``native``, ``statement_changed``,
      ``forbidden``, ``no_proof``, ``too_large``, ``judge_limit``: the attempt's own terms went
      past the judge's bounds, no fault of the server): Lean's messages, plus an error message
      ``leanrl <reason>: <detail>`` when Lean reported none (an axiom or a changed statement is
      no Lean error): *lean_error*.
    """
    checked = assemble(p.attempt).text if p.attempt is not None else ""
    own = LeanrlVerdict(
        accepted=v.accepted,
        reason=v.reason,
        detail=v.detail,
        statement=p.statement,
        theorem=p.theorem,
        axioms=v.axioms,
        checked=checked,
        line_offset=p.line_offset,
    )
    line = f"leanrl {v.reason.value}: {v.detail}".rstrip(": ")
    if v.reason is Reason.TIMEOUT:
        return f"timed out ({line})", None, own
    if v.reason in (Reason.MEMORY, Reason.INFRA):
        return line, None, own
    if v.reason is Reason.CRASH:
        return None, ReplError(message=line, time=v.time_s), own
    messages = [_kmessage(m, p.line_offset) for m in v.messages]
    sorries: list[Sorry] = []
    if v.reason is Reason.SORRY:
        at = next((m for m in messages if "sorry" in m.data), None)
        pos = at.pos if at is not None else _START
        sorries.append(Sorry(pos=pos, endPos=(at.endPos if at and at.endPos else pos), goal=""))
        # Kimina counts a file with errors as lean_error even when it has sorries.
        messages = [m for m in messages if m.severity != "error"]
        if at is None:
            messages.append(KMessage(severity="warning", pos=pos, data="declaration uses 'sorry'"))
    elif not v.accepted and not any(m.severity == "error" for m in messages):
        messages.append(KMessage(severity="error", pos=_START, data=line))
    elif v.accepted:
        # An accepted verdict with an error message cannot happen; should a runtime send one,
        # Kimina must not read it as lean_error while leanrl says accepted (or the reverse).
        messages = [m for m in messages if m.severity != "error"]
    return (
        None,
        CommandResponse(messages=tuple(messages), sorries=tuple(sorries), time=v.time_s),
        own,
    )


# -- the endpoints ---------------------------------------------------------------------------------


_INLINE_CHARS = 64 * 1024
"""Requests up to this many characters are read on the event loop (as the service's own)."""


class _Service(Protocol):
    """What the endpoints use of :class:`leanrl.service.app.VerificationService`."""

    limits: ServiceLimits

    async def check(self, attempts: tuple[Attempt, ...], key: str | None) -> CheckResponse: ...


async def _judge(
    service: _Service, statements: Statements, files: Sequence[tuple[str, str]]
) -> list[tuple[Verdict, Prepared]]:
    """One verdict per (id, text) file, in order; the checkable ones go to the runtime as one
    batch (its errors, 413/403/503, answer the whole request, as ``POST /check``'s do)."""

    def read() -> list[Prepared]:
        return [prepare(text, statements, cid) for cid, text in files]

    # Reading files is CPU work: small requests inline, large ones off the event loop.
    size = sum(len(text) for _, text in files)
    prepared = read() if size <= _INLINE_CHARS else await asyncio.to_thread(read)
    attempts = tuple(p.attempt for p in prepared if p.attempt is not None)
    verdicts = iter((await service.check(attempts, None)).verdicts if attempts else ())
    return [(p.refusal if p.refusal is not None else next(verdicts), p) for p in prepared]


def kimina_router(service: _Service, config: KiminaConfig) -> APIRouter:
    """``POST /verify`` and ``POST /api/check`` over ``service``. The tasksets of ``config`` are
    loaded here: a taskset that cannot load stops the service from starting, with its error."""
    # fastapi only here: `leanrl serve`'s options (KiminaConfig) load without the serve extra.
    from fastapi import APIRouter

    try:
        statements = Statements(config)
    except (ConfigError, DatasetError) as e:
        raise type(e)(f"--kimina.tasksets: {e}") from None
    router = APIRouter()
    # Kimina's routes and their aliases, each answered in place: a slash-ended path would
    # otherwise get a 307 redirect, which httpx (kimina-client's transport) does not follow.

    @router.post("/verify", response_model=VerifyResponse, response_model_exclude_none=True)
    @router.post(
        "/verify/",
        response_model=VerifyResponse,
        response_model_exclude_none=True,
        include_in_schema=False,
    )
    @router.post(
        "/one_pass_verify_batch",
        response_model=VerifyResponse,
        response_model_exclude_none=True,
        include_in_schema=False,
    )
    @router.post(
        "/one_pass_verify_batch/",
        response_model=VerifyResponse,
        response_model_exclude_none=True,
        include_in_schema=False,
    )
    async def verify(req: VerifyRequest) -> VerifyResponse:
        files = [(str(c.custom_id), c.text()) for c in req.codes]
        out = []
        for (cid, _), (v, p) in zip(files, await _judge(service, statements, files), strict=True):
            err, resp, own = kimina_result(v, p)
            out.append(VerifyResult(custom_id=cid, error=err, response=resp, leanrl=own))
        return VerifyResponse(results=tuple(out))

    @router.post("/api/check", response_model=SnippetsResponse, response_model_exclude_none=True)
    @router.post(
        "/api/check/",
        response_model=SnippetsResponse,
        response_model_exclude_none=True,
        include_in_schema=False,
    )
    async def check(req: SnippetsRequest) -> SnippetsResponse:
        files = [(s.id, s.code) for s in req.snippets]
        out = []
        for (cid, _), (v, p) in zip(files, await _judge(service, statements, files), strict=True):
            err, resp, own = kimina_result(v, p)
            out.append(SnippetResult(id=cid, time=v.time_s, error=err, response=resp, leanrl=own))
        return SnippetsResponse(results=tuple(out))

    return router
