"""Who may send what to the verification service, and who can reach it at all.

Without a token every local user can call the service, so it accepts only plain headers and
statements and keeps the pre-scan on; with a token the caller is trusted. A unix socket is
private (0600) unless a token guards it.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from leanrl.errors import ConfigError
from leanrl.service.app import ServiceConfig
from leanrl.service.client import ServiceClient
from leanrl.verdict import Attempt, VerificationPolicy
from tests._echo_runtime import EchoRuntime
from tests._service_testing import running_service

TESTS = Path(__file__).resolve().parent
MINIF2F_HEADER = (
    "import Mathlib\nimport Aesop\n\nset_option maxHeartbeats 400000\n\nopen Real Nat\n"
)
PROOFNET_HEADER = (
    "import Mathlib\n\nopen Filter\nopen scoped Topology\n\nabbrev I : Set ℝ := Set.Icc 0 1\n"
)


def _attempt(header: str = MINIF2F_HEADER, statement: str = "theorem t : True := by", **kw) -> dict:  # type: ignore[no-untyped-def]
    a = Attempt(name="t", header=header, formal_statement=statement, proof="ok", **kw)
    return a.model_dump(mode="json")


HOSTILE = [
    ("header", _attempt(header="import Mathlib\n#eval IO.Process.run {cmd := \"id\"}\n"), "header uses `#eval` (line 2)"),
    ("header option", _attempt(header="import Mathlib\nset_option debug.skipKernelTC true\n"), "header uses `set_option debug.skipKernelTC`"),
    ("statement", _attempt(statement="run_cmd Lean.logInfo \"x\"\ntheorem t : True := by"), "formal_statement uses `run_cmd`"),
    ("syntax", _attempt(statement="macro \"t\" : term => `(1)\ntheorem t : True := by"), "formal_statement uses `macro`"),
    ("policy", _attempt(policy=VerificationPolicy(forbid_tokens=False)), "forbid_tokens = false"),
    ("waiver", _attempt(policy=VerificationPolicy(prescan_allow=("#eval",))), "prescan_allow = ['#eval']"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "attempt", "why"), HOSTILE, ids=[h[0] for h in HOSTILE])
async def test_without_a_token_hostile_headers_and_statements_are_refused(
    what: str, attempt: dict, why: str
) -> None:
    rt = EchoRuntime()
    async with running_service(rt) as url, httpx.AsyncClient() as http:
        r = await http.post(f"{url}/check", json={"attempts": [_attempt(), attempt]})
        assert r.status_code == 403, r.text
        assert "attempt 1: " in r.json()["error"] and why in r.json()["error"]
        assert "start the service with a token" in r.json()["error"]
        assert rt.checked == 0  # nothing of the batch reached the runtime
        # real tasksets' headers pass: imports, opens, options, and ProofNet's definitions
        plain = [_attempt(), _attempt(header=PROOFNET_HEADER), _attempt(header="")]
        putnam = _attempt(statement="abbrev answer : ℕ := sorry\ntheorem t : answer = 1 := by")
        r = await http.post(f"{url}/check", json={"attempts": [*plain, putnam]})
        assert r.status_code == 200 and rt.checked == 4


async def test_with_a_token_the_caller_is_trusted() -> None:
    rt = EchoRuntime()
    async with running_service(rt, ServiceConfig(token="tok")) as url:
        vs = await ServiceClient(url, token="tok").check(
            [Attempt.model_validate(a) for _, a, _ in HOSTILE]
        )
        assert len(vs) == len(HOSTILE) and rt.checked == len(HOSTILE)


async def test_without_a_token_sessions_get_the_same_rules() -> None:
    async with running_service(EchoRuntime()) as url, httpx.AsyncClient() as http:
        r = await http.post(f"{url}/sessions", json={"header": "import Mathlib\n#eval 1\n"})
        assert r.status_code == 403 and "header uses `#eval`" in r.json()["error"]
        loose = VerificationPolicy(forbid_tokens=False).model_dump(mode="json")
        r = await http.post(f"{url}/sessions", json={"header": "", "policy": loose})
        assert r.status_code == 403 and "forbid_tokens = false" in r.json()["error"]
        sid = (await http.post(f"{url}/sessions", json={"header": MINIF2F_HEADER})).json()[
            "session_id"
        ]
        bad = {"formal_statement": "theorem t : True := by", "preamble": "initialize IO.println 1"}
        r = await http.post(f"{url}/sessions/{sid}/start", json=bad)
        assert r.status_code == 403 and "preamble uses `initialize`" in r.json()["error"]
        ok = {"formal_statement": "theorem t : True := by"}
        assert (await http.post(f"{url}/sessions/{sid}/start", json=ok)).status_code == 200


def _serve_uds(sock: Path, *flags: str, token: str | None = None) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    env.pop("LEANRL_SERVICE_TOKEN", None)
    if token:
        env["LEANRL_SERVICE_TOKEN"] = token
    cmd = [sys.executable, "-m", "leanrl.service", "--uds", str(sock),
           "--runtime.name", "_echo_runtime:EchoRuntime", *flags]  # fmt: skip
    return subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)


def _mode_once_listening(proc: subprocess.Popen[str], sock: Path) -> int:
    for _ in range(600):
        if sock.exists() or proc.poll() is not None:
            break
        time.sleep(0.05)
    assert sock.exists(), proc.stderr.read() if proc.stderr else ""
    return stat.S_IMODE(sock.stat().st_mode)


def test_the_unix_socket_is_private_unless_a_token_guards_it(tmp_path: Path) -> None:
    sock = tmp_path / "s.sock"
    proc = _serve_uds(sock)
    try:
        assert _mode_once_listening(proc, sock) == 0o600  # was 0o666: any local user
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    # a socket other users could open needs a token
    r = subprocess.run(
        [sys.executable, "-m", "leanrl.service", "--uds", str(sock), "--uds_mode", "0666",
         "--runtime.name", "_echo_runtime:EchoRuntime"],
        env={**{k: v for k, v in os.environ.items() if k != "LEANRL_SERVICE_TOKEN"},
             "PYTHONPATH": str(TESTS)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2 and "mode 0666 (other users could connect)" in r.stderr
    sock = tmp_path / "group.sock"
    proc = _serve_uds(sock, "--uds_mode", "0660", token="tok")
    try:
        assert _mode_once_listening(proc, sock) == 0o660
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_service_config_refuses_an_open_socket_without_a_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LEANRL_SERVICE_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="other users could connect"):
        ServiceConfig(uds="/x.sock", uds_mode="0606").check_auth()
    ServiceConfig(uds="/x.sock").check_auth()  # 0600 is fine
    ServiceConfig(uds="/x.sock", uds_mode="0666", token="t").check_auth()
