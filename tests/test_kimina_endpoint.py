"""The Kimina-compatible endpoints of ``leanrl serve`` (``POST /verify``, ``POST /api/check``),
called by the real ``kimina-client`` package over loopback HTTP.

The service's runtime is the echo test runtime (``ok``/``rfl`` accepted, ``sorry`` rejected as
sorry, anything else an error) or the scripted one (records what reached it): never Lean, so
what is tested is the wire format, the choice of statement and the mapping of verdicts, not
Lean's judgement.
"""

from __future__ import annotations

import importlib
import sys
import typing
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
from _echo_runtime import EchoRuntime
from _scripted_runtime import ScriptedRuntime
from _service_testing import running_service

from leanrl.errors import ConfigError, DatasetError
from leanrl.runtime import RuntimeConfig
from leanrl.service.app import ServiceConfig, create_app
from leanrl.service.kimina import (
    OWN,
    KiminaConfig,
    KiminaTaskset,
    Prepared,
    Statements,
    kimina_result,
    prepare,
)
from leanrl.task import Task
from leanrl.verdict import Reason, Verdict, VerificationPolicy


def _kimina() -> ModuleType:
    """``kimina_client``, or skip. kimina-client 0.2.1 takes ``TypedDict`` from ``typing`` when
    it has one, which pydantic refuses before Python 3.12 (PydanticUserError at import): there
    the import is retried with typing_extensions' (what the package's own fallback imports),
    for the import only. Its request and response code runs unchanged."""
    try:
        return importlib.import_module("kimina_client")
    except ImportError:
        pytest.skip("kimina-client is not installed (pip install -e '.[kimina]')")
    except Exception as e:  # only pydantic's refusal (below) is worked around
        if "typing_extensions.TypedDict" not in str(e):
            raise
    import typing_extensions

    for name in [m for m in sys.modules if m.split(".")[0] == "kimina_client"]:
        del sys.modules[name]
    saved = typing.TypedDict, typing.NotRequired
    typing.TypedDict, typing.NotRequired = (
        typing_extensions.TypedDict,
        typing_extensions.NotRequired,
    )  # type: ignore[assignment,misc]
    try:
        return importlib.import_module("kimina_client")
    finally:
        typing.TypedDict, typing.NotRequired = saved  # type: ignore[misc]


kc = _kimina()


def echo() -> EchoRuntime:
    return EchoRuntime(RuntimeConfig(name="echo-test"))


FILES = {
    "valid": "import Lean\nopen Nat\n\ntheorem t1 : 1 + 1 = 2 := by\n  rfl\n",
    "sorry": "theorem t2 : 2 + 2 = 4 := by\n  sorry\n",
    "error": "theorem t3 : 2 + 2 = 5 := by\n  simp\n",
    "forbidden": "import Lean\nset_option debug.skipKernelTC true\ntheorem t4 : True := by rfl\n",
    "example": "example : True := by rfl\n",
    "trailing": "theorem t5 : True := by rfl\n#eval IO.println 1\n",
}


async def test_kimina_client_check_gets_leanrl_verdicts_in_kimina_shape() -> None:
    rt = echo()
    async with running_service(rt) as url:
        client = kc.AsyncKiminaClient(api_url=url, n_retries=1)
        try:
            snippets = [kc.Snippet(id=k, code=v) for k, v in FILES.items()]
            # safe=False: a transport or format error raises instead of becoming a result
            resp = await client.api_check(snippets, safe=False)
        finally:
            await client.close()
    by_id = {r.id: r for r in resp.results}
    assert list(by_id) == list(FILES)  # in order, ids echoed
    status = {k: r.analyze().status.value for k, r in by_id.items()}
    assert status == {
        "valid": "valid",
        "sorry": "sorry",
        "error": "lean_error",
        "forbidden": "lean_error",
        "example": "lean_error",
        "trailing": "lean_error",
    }
    raw = {k: r.model_dump() for k, r in by_id.items()}
    # Kimina's client keeps only its own fields; leanrl's verdict is checked over plain HTTP below
    assert raw["error"]["response"]["messages"][0]["severity"] == "error"
    assert "unknown tactic" in raw["error"]["response"]["messages"][0]["data"]
    assert raw["sorry"]["response"]["sorries"][0]["pos"] == {"line": 1, "column": 0}
    assert "leanrl forbidden" in raw["forbidden"]["response"]["messages"][-1]["data"]
    assert "skipKernelTC" in raw["forbidden"]["response"]["messages"][-1]["data"]
    # The forbidden header was refused before Lean; the `example` and the theorem followed by a
    # command are not one theorem, so they went to the runtime as file checks (judged there; the
    # echo runtime's rule rejects them; tests/test_interop_round3_kimina.py has the real pool).
    assert rt.checked == 5


async def test_verify_takes_kimina_codes_and_answers_its_backward_response() -> None:
    codes = [
        kc.Code(custom_id="a", proof=FILES["valid"]),
        kc.Code(custom_id=7, code=FILES["error"]),  # the older field name, an int id
    ]
    body = kc.VerifyRequestBody(codes=codes, timeout=60, infotree_type=None).model_dump(mode="json")
    async with running_service(echo()) as url, httpx.AsyncClient() as http:
        r = await http.post(f"{url}/verify", json=body)
    assert r.status_code == 200, r.text
    data = r.json()
    parsed = kc.VerifyResponse.model_validate(data)  # Kimina's own response model reads it
    assert [x["custom_id"] for x in parsed.results] == ["a", "7"]
    first, second = data["results"]
    assert "error" not in first and first["response"]["messages"] == []
    assert first["leanrl"]["accepted"] is True and first["leanrl"]["statement"] == OWN
    assert first["leanrl"]["theorem"] == "t1"
    assert "theorem t1 : 1 + 1 = 2 := by" in first["leanrl"]["checked"]
    assert second["leanrl"]["reason"] == "error" and not second["leanrl"]["accepted"]


async def test_a_registered_theorem_is_judged_against_the_tasksets_statement() -> None:
    """A file naming a core theorem is checked under core's reference statement; its own
    (forged) statement only travels as the restatement the trusted checker compares."""
    rt = ScriptedRuntime(RuntimeConfig(name="scripted", options={"accept": "decide"}))
    config = ServiceConfig(kimina=KiminaConfig(tasksets=[KiminaTaskset(env="core", split="all")]))
    forged = "import Lean\n\ntheorem amc12_2001_p2 : True := by\n  decide\n"
    async with running_service(rt, config) as url, httpx.AsyncClient() as http:
        r = await http.post(f"{url}/verify", json={"codes": [{"custom_id": 1, "proof": forged}]})
    assert r.status_code == 200, r.text
    (result,) = r.json()["results"]
    assert result["leanrl"]["statement"] == "taskset core (all)"
    (a,) = rt.attempts
    assert a.name == "amc12_2001_p2" and a.id == "1"
    assert a.formal_statement != "theorem amc12_2001_p2 : True := by"
    assert a.formal_statement.startswith("theorem amc12_2001_p2")  # the reference's
    assert a.restated_statement == "theorem amc12_2001_p2 : True := by"
    assert a.proof.strip() == "decide"


async def test_without_own_statements_an_unregistered_theorem_is_refused() -> None:
    rt = ScriptedRuntime()
    config = ServiceConfig(kimina=KiminaConfig(own_statements=False))
    async with running_service(rt, config) as url, httpx.AsyncClient() as http:
        r = await http.post(
            f"{url}/verify", json={"codes": [{"custom_id": "x", "proof": FILES["valid"]}]}
        )
    (result,) = r.json()["results"]
    assert result["leanrl"]["reason"] == "statement_changed"
    assert "own_statements" in result["response"]["messages"][-1]["data"]
    assert rt.attempts == []  # nothing ran


async def test_the_token_is_kiminas_api_key() -> None:
    config = ServiceConfig(token="s3cret")
    async with running_service(echo(), config) as url:
        good = kc.AsyncKiminaClient(api_url=url, api_key="s3cret", n_retries=1)
        bad = kc.AsyncKiminaClient(api_url=url, api_key="wrong", n_retries=1)
        try:
            files = [kc.Snippet(id=k, code=FILES[k]) for k in ("valid", "forbidden")]
            ok = await good.api_check(files, safe=False)
            # a token makes the caller trusted, but never the request's own header: that is
            # the model's text, pre-scanned with or without a token
            assert [r.analyze().status.value for r in ok.results] == ["valid", "lean_error"]
            with pytest.raises(RuntimeError, match="retries"):  # 401, retried, then given up
                await bad.api_check([kc.Snippet(id="v", code=FILES["valid"])], safe=False)
        finally:
            await good.close()
            await bad.close()


async def test_a_code_without_text_is_a_clear_422() -> None:
    async with running_service(echo()) as url, httpx.AsyncClient() as http:
        r = await http.post(f"{url}/verify", json={"codes": [{"custom_id": "x"}]})
    assert r.status_code == 422
    assert "neither 'proof' nor 'code'" in r.json()["error"]


@pytest.mark.parametrize(
    ("reason", "status", "field"),
    [
        (Reason.TIMEOUT, "timeout_error", "error"),
        (Reason.MEMORY, "server_error", "error"),
        (Reason.INFRA, "server_error", "error"),
        (Reason.CRASH, "repl_error", "response"),
        (Reason.AXIOM, "lean_error", "response"),
        (Reason.STATEMENT_CHANGED, "lean_error", "response"),
        (Reason.NATIVE, "lean_error", "response"),
    ],
)
def test_every_verdict_reads_in_kimina_as_it_means(reason: Reason, status: str, field: str) -> None:
    """The mapping table of docs/interop.md, read back by Kimina's own ``analyze``."""
    v = Verdict.reject(reason, "what went wrong", time_s=0.5)
    err, resp, own = kimina_result(v, Prepared(statement=OWN, theorem="t"))
    body: dict[str, Any] = {"id": "x", "time": 0.5}
    if err is not None:
        body["error"] = err
    if resp is not None:
        body["response"] = resp.model_dump(mode="json", exclude_none=True)
    assert field in body
    assert kc.ReplResponse.model_validate(body).analyze().status.value == status
    assert own.reason is reason and "what went wrong" in (err or str(body["response"]))


def test_a_name_stated_twice_or_two_registered_names_are_refused() -> None:
    st = Statements(KiminaConfig())
    for name in ("a", "b"):
        task = Task(name=name, header="", formal_statement=f"theorem {name} : True := by")
        st.by_name[name] = (task, VerificationPolicy(), "taskset test")
    st.ambiguous.add("b")
    two = prepare("theorem a : True := by trivial\ntheorem b : True := by trivial", st, "x")
    assert two.refusal is not None and "several registered theorems" in two.refusal.detail
    amb = prepare("theorem b : True := by trivial", st, "y")
    assert amb.refusal is not None and "different ways" in amb.refusal.detail
    one = prepare("import Lean\ntheorem a : True := by\n  trivial", st, "z")
    assert one.attempt is not None and one.attempt.proof.strip() == "trivial"
    assert one.statement == "taskset test"


async def test_a_large_request_is_read_off_the_event_loop_with_the_same_answer() -> None:
    big = "import Lean\n-- " + "x" * 70_000 + "\ntheorem t1 : 1 + 1 = 2 := by\n  rfl\n"
    async with running_service(echo()) as url, httpx.AsyncClient() as http:
        r = await http.post(f"{url}/verify", json={"codes": [{"custom_id": 1, "proof": big}]})
    (result,) = r.json()["results"]
    assert result["leanrl"]["accepted"] is True and result["leanrl"]["theorem"] == "t1"


def test_a_taskset_that_cannot_load_stops_the_service_with_its_error(tmp_path: Path) -> None:
    bad_env = ServiceConfig(kimina=KiminaConfig(tasksets=[KiminaTaskset(env="no-such-env")]))
    with pytest.raises(ConfigError, match=r"--kimina.tasksets: unknown environment 'no-such-env'"):
        create_app(echo(), bad_env)
    missing = str(tmp_path / "none.jsonl")
    bad_path = ServiceConfig(
        kimina=KiminaConfig(tasksets=[KiminaTaskset(env="core", path=missing)])
    )
    with pytest.raises((ConfigError, DatasetError), match=r"--kimina\.tasksets: .*none\.jsonl"):
        create_app(echo(), bad_path)
