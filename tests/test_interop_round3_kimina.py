"""The Kimina endpoints of ``leanrl serve`` on the wire as kimina-lean-server answers (issue 37,
item 5), called by the real ``kimina-client`` over loopback HTTP.

The service runs the real ``local`` runtime (its REPL pool, the elaborating processes and the
judges) on a stand-in REPL (``tests/_fake_repl_files.py``: not Lean; it answers ``#check Nat``
and the trusted checker's file mode by rules). What is tested is Kimina's wire behaviour (unknown
fields, 422s, aliases without redirects, ``GET /``, the header line offset, ``env``), that
snippets which are not one theorem are checked as files through the judge, and that
kimina-client's own ``client.test()`` passes; not Lean's judgement.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from _service_testing import running_service
from test_kimina_endpoint import kc

from leanrl.lean.trust.report import CheckReport, check_file_command
from leanrl.lean.trust.rules import judge_report
from leanrl.runtime import RuntimeConfig
from leanrl.runtimes.local import LocalRuntime
from leanrl.service.app import ServiceConfig
from leanrl.service.kimina import FILE, OWN, KiminaConfig, Statements, prepare
from leanrl.verdict import Attempt, Reason, VerificationPolicy

FAKE = [sys.executable, str(Path(__file__).with_name("_fake_repl_files.py"))]


def local() -> LocalRuntime:
    """The real local runtime on the stand-in REPL."""
    return LocalRuntime(
        RuntimeConfig(workers=1, timeout_s=10.0, options={"repl_command": FAKE, "spares": 0})
    )


@asynccontextmanager
async def serve(config: ServiceConfig | None = None) -> AsyncIterator[str]:
    async with running_service(local(), config) as url:
        yield url


async def check(url: str, snippets: list[dict[str, str]], **body: Any) -> httpx.Response:
    async with httpx.AsyncClient(timeout=30) as http:
        return await http.post(f"{url}/api/check", json={"snippets": snippets, **body})


# -- kimina-client's own test ----------------------------------------------------------------------


async def test_kimina_clients_own_test_passes_against_leanrl_serve() -> None:
    """``client.test()`` sends ``#check Nat`` and asserts Lean's exact message back."""
    async with serve() as url:
        sync = kc.KiminaClient(api_url=url, n_retries=1)
        await asyncio.to_thread(sync.test)  # raises AssertionError when the answer differs
        client = kc.AsyncKiminaClient(api_url=url, n_retries=1)
        try:
            await client.test()
        finally:
            await client.close()


# -- request shapes --------------------------------------------------------------------------------


async def test_unknown_fields_are_ignored_as_kiminas_models_ignore_them() -> None:
    snippet = {"id": "a", "code": "#check Nat", "note": "mine"}
    async with serve() as url:
        r = await check(url, [snippet], timeout=20, client_version="9.9", extra={"x": 1})
        assert r.status_code == 200, r.text
        async with httpx.AsyncClient(timeout=30) as http:
            v = await http.post(
                f"{url}/verify",
                json={"codes": [{"custom_id": 1, "proof": "#check Nat", "tag": "t"}], "x": 2},
            )
    assert v.status_code == 200, v.text
    assert r.json()["results"][0]["response"]["messages"][0]["data"] == "Nat : Type"


async def test_empty_snippets_and_duplicate_ids_are_422_as_in_kimina() -> None:
    async with serve() as url:
        empty = await check(url, [])
        dup = await check(url, [{"id": "a", "code": "#check Nat"}] * 2)
        async with httpx.AsyncClient(timeout=30) as http:
            no_codes = await http.post(f"{url}/verify", json={"codes": []})
    assert empty.status_code == 422 and "non empty" in empty.text
    assert dup.status_code == 422 and "unique ids" in dup.text
    # Kimina's /verify checks neither: an empty batch is an empty answer
    assert no_codes.status_code == 200 and no_codes.json() == {"results": []}


async def test_kiminas_aliases_and_slashed_paths_answer_in_place() -> None:
    """httpx (kimina-client's transport) does not follow redirects: no 307 anywhere."""
    body = {"codes": [{"custom_id": "x", "code": "#check Nat"}]}
    async with serve() as url, httpx.AsyncClient(timeout=30) as http:
        answers = {
            "/one_pass_verify_batch": await http.post(f"{url}/one_pass_verify_batch", json=body),
            "/one_pass_verify_batch/": await http.post(f"{url}/one_pass_verify_batch/", json=body),
            "/verify/": await http.post(f"{url}/verify/", json=body),
            "/api/check/": await http.post(
                f"{url}/api/check/", json={"snippets": [{"id": "x", "code": "#check Nat"}]}
            ),
        }
    for path, r in answers.items():
        assert r.status_code == 200, (path, r.status_code, r.text)
        (res,) = r.json()["results"]
        assert res["response"]["messages"][0]["data"] == "Nat : Type", path


async def test_get_root_and_health_slash_answer_health_without_the_token() -> None:
    async with serve(ServiceConfig(token="s3cret")) as url, httpx.AsyncClient() as http:
        root = await http.get(f"{url}/")
        slash = await http.get(f"{url}/health/")
        guarded = await http.post(f"{url}/api/check", json={"snippets": []})
    assert root.status_code == 200 and root.json()["status"] == "ok"
    assert slash.status_code == 200 and slash.json()["status"] == "ok"
    assert guarded.status_code == 401  # everything else still needs the token


# -- what comes back ---------------------------------------------------------------------------------


async def test_positions_are_shifted_by_the_header_and_responses_carry_env() -> None:
    files = [
        {"id": "file", "code": "import Mathlib\nopen Nat\n\n#check Nat\n"},
        {"id": "sorry", "code": "import Mathlib\n\ndef f : Nat := 1\ntheorem t : f = 1 := sorry\n"},
        {
            "id": "own",
            "code": (
                "import Mathlib\n\n/-- one theorem -/\ntheorem t1 : 1 = 1 := by\n  rfl\n"
                '  -- fake: {"messages": [{"severity": "warning", "pos": {"line": 2, "column": 2}, '
                '"data": "w"}]}\n'
            ),
        },
    ]
    async with serve() as url:
        r = await check(url, files)
    assert r.status_code == 200, r.text
    by = {x["id"]: x for x in r.json()["results"]}
    (m,) = by["file"]["response"]["messages"]
    assert m["pos"] == {"line": 4, "column": 0} and m["endPos"] == {"line": 4, "column": 6}
    assert by["file"]["response"]["env"] == 0
    assert by["file"]["leanrl"]["line_offset"] == 3
    assert by["file"]["leanrl"]["checked"] == "#check Nat\n"
    # one theorem under its own statement: Lean's line 2 of the checked text is the file's 5
    (w,) = by["own"]["response"]["messages"]
    assert by["own"]["leanrl"]["statement"] == OWN and w["pos"]["line"] == 5
    assert kc.ReplResponse.model_validate(by["sorry"]).analyze().status.value == "sorry"


async def test_snippets_that_are_not_one_theorem_are_checked_as_files() -> None:
    files = {
        "def_then_lemma": "def f : Nat := 1\n\ntheorem t : f = 1 := rfl\n",
        "two_theorems": "theorem a : True := trivial\ntheorem b : 1 = 1 := rfl\n",
        "example": "example : True := by trivial\n",
        "own_axiom": "axiom cheat : False\ntheorem bad : False := cheat\n",
        "runs_code": "theorem t : True := trivial\n#eval IO.println 1\n",
        "replay_fails": 'def g := 2\n-- fake: {"check": {"status": "replay_failed", "detail": "x"}}\n',
        "inductive": "inductive T | a | b\ntheorem t : T.a ≠ T.b := by decide\n",
        "not_a_file_check": 'def h := 3\n-- fake: {"check": {"kind": "theorem"}}\n',
    }
    async with serve() as url:
        client = kc.AsyncKiminaClient(api_url=url, n_retries=1)
        try:
            resp = await client.api_check(
                [kc.Snippet(id=k, code=v) for k, v in files.items()], safe=False
            )
        finally:
            await client.close()
        raw = (await check(url, [{"id": k, "code": v} for k, v in files.items()])).json()
    status = {r.id: r.analyze().status.value for r in resp.results}
    assert status == {
        "def_then_lemma": "valid",
        "two_theorems": "valid",
        "example": "valid",
        "own_axiom": "lean_error",  # compiles in Kimina; an axiom of its own is refused here
        "runs_code": "lean_error",  # `#eval` runs code: the pre-scan refuses it
        "replay_fails": "lean_error",  # the judge's kernel replay rejected a constant
        "inductive": "lean_error",  # new inductive types: refused under the strict policy
        "not_a_file_check": "server_error",  # a report of the wrong check decides nothing
    }
    own = {x["id"]: x["leanrl"] for x in raw["results"]}
    assert own["def_then_lemma"]["statement"] == FILE
    assert own["def_then_lemma"]["axioms"] == ["propext"]  # the axioms are listed
    assert own["own_axiom"]["reason"] == "axiom"
    assert own["replay_fails"]["reason"] == "forbidden"
    assert own["inductive"]["reason"] == "forbidden"
    assert own["not_a_file_check"]["reason"] == "infra"


# -- the Python side of the file check, without a service --------------------------------------------


def test_a_file_attempt_has_no_target_and_assembles_as_it_is() -> None:
    from leanrl.lean.source import assemble

    a = Attempt(name="", header="", formal_statement="", proof="#check Nat", check="file")
    assert assemble(a).text == "#check Nat\n"
    assert not assemble(a).in_statement(1)  # every sorry of a file is the file's own
    with pytest.raises(ValueError, match="file check has no target"):
        Attempt(name="t", header="", formal_statement="", proof="x", check="file")
    st = Statements(KiminaConfig())
    p = prepare("import Lean\n\ndef f := 1\ntheorem t : f = 1 := rfl\n", st, "c")
    assert p.attempt is not None and p.attempt.check == "file"
    assert p.attempt.proof == "def f := 1\ntheorem t : f = 1 := rfl\n"
    assert p.statement == FILE and p.line_offset == 2
    one = prepare("theorem t : 1 = 1 := by\n  rfl\n", st, "d")
    assert one.attempt is not None and one.attempt.check == "theorem" and one.statement == OWN
    bad = prepare("set_option debug.skipKernelTC true\n#check Nat\n", st, "e")
    assert bad.refusal is not None and bad.refusal.reason is Reason.FORBIDDEN


def test_a_registered_theorems_positions_point_at_its_line_in_the_file() -> None:
    from leanrl.lean.source import assemble
    from leanrl.task import Task

    st = Statements(KiminaConfig())
    task = Task(name="a", header="import Mathlib\n", formal_statement="theorem a : True := by")
    st.by_name["a"] = (task, VerificationPolicy(), "taskset test")
    text = "import Mathlib\n\nlemma helper : True := trivial\n\ntheorem a : True := by\n  trivial\n"
    p = prepare(text, st, "r")
    assert p.attempt is not None and p.statement == "taskset test"
    checked = assemble(p.attempt)
    # the statement's line in the checked text lands on the file's theorem line (5)
    assert checked.statement_lines[0] + p.line_offset == 5
    proof_line = checked.text.split("\n").index("  trivial") + 1
    assert proof_line + p.line_offset == 6


def test_the_check_command_of_a_file_names_no_target() -> None:
    cmd = check_file_command("/h/a.olean", "ab12", olean=False, replay=True)
    assert cmd == (
        '#eval LeanrlCheck.runFile "/h/a.olean" "ab12" false true |> Lean.Elab.Command.liftCoreM\n'
    )


def report(**kw: Any) -> CheckReport:
    base: dict[str, Any] = {
        "nonce": "n",
        "status": "ok",
        "kind": "file",
        "ref_kind": "file",
        "axioms": ["propext"],
        "constants": ["f", "t"],
        "replayed": True,
    }
    return CheckReport.model_validate({**base, **kw})


FILE_ATTEMPT = Attempt(name="", header="", formal_statement="", proof="def f := 1", check="file")


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({}, Reason.OK),
        ({"axioms": ["propext", "sorryAx"]}, Reason.SORRY),
        ({"axioms": ["cheat"], "new_axioms": ["cheat"]}, Reason.AXIOM),
        ({"axioms": ["Classical.choice", "Mathlib.Foo.ax"]}, Reason.AXIOM),
        ({"axioms": ["Lean.ofReduceBool"]}, Reason.NATIVE),
        ({"inductives": ["T"]}, Reason.FORBIDDEN),
        ({"status": "replay_failed"}, Reason.FORBIDDEN),
        ({"status": "helper_mismatch"}, Reason.FORBIDDEN),
        ({"status": "free_variable"}, Reason.FORBIDDEN),
        ({"status": "missing"}, Reason.INFRA),  # no target to miss: a checker problem
        ({"replayed": False}, Reason.INFRA),
        ({"kind": "theorem", "ref_kind": "theorem"}, Reason.INFRA),
    ],
)
def test_a_file_report_is_judged_by_the_same_rules(fields: dict[str, Any], reason: Reason) -> None:
    v = judge_report(FILE_ATTEMPT, report(**fields))
    assert v.reason is reason, v.detail
    if reason is Reason.OK:
        assert v.accepted and v.axioms == ("propext",)


def test_a_theorem_check_is_not_decided_by_a_file_report() -> None:
    theorem = Attempt(name="t", header="", formal_statement="theorem t : True := by", proof="x")
    assert judge_report(theorem, report()).reason is Reason.INFRA
    lax = VerificationPolicy(allow_new_inductives=True)
    ok = FILE_ATTEMPT.model_copy(update={"policy": lax})
    assert judge_report(ok, report(inductives=["T"])).accepted
