"""Issue 37's small items that are not the verifiers plugin's: token counts from a server's
``usage`` when it returns no log-probs, ``--policy openai`` answered with ``--backend openai``,
``read_results(typed=True)``, and docs that name ``make_policy`` and the registered ``leanrl
interop traces`` command."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_policy_openai import Server

from leanrl import PolicyConfig, Reason, SamplingConfig, Verdict
from leanrl.cli import main
from leanrl.policies import make_policy
from leanrl.policies.openai import OpenAIPolicy
from leanrl.rollout import Turn

REPO = Path(__file__).resolve().parent.parent


class NoLogprobs(Server):
    """An OpenAI-compatible server that sends no token ids and no log-probs, only ``usage``
    (llama.cpp's server and many hosted APIs unless asked): the tokens are 3 per word."""

    def answer(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        texts = ["one two" if i == 0 else "one two three four" for i in range(body["n"])]
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": t},  # /chat/completions
                "text": t,  # /completions
                "finish_reason": "stop",
                "logprobs": None,
            }
            for i, t in enumerate(texts)
        ]
        used = sum(3 * len(t.split()) for t in texts)
        return {"choices": choices, "usage": {"prompt_tokens": 5, "completion_tokens": used}}


async def test_token_counts_come_from_usage_when_the_server_sends_no_logprobs() -> None:
    with NoLogprobs(fail=0, delay_s=0.0) as server:
        p = make_policy(PolicyConfig(model="m", backend="openai", base_url=server.url))
        assert isinstance(p, OpenAIPolicy)
        try:
            (one,) = await p.generate(["q"], SamplingConfig(n=1, max_tokens=16))
            (two,) = await p.generate(["r"], SamplingConfig(n=2, max_tokens=16))
        finally:
            await p.close()
    assert [c.usage_tokens for c in one] == [6]  # one sample: the server's own count
    # two samples in one response: usage counts them together; the split sums to it
    assert sum(c.usage_tokens or 0 for c in two) == 18
    assert two[1].usage_tokens is not None and two[0].usage_tokens is not None
    assert two[1].usage_tokens > two[0].usage_tokens
    turns = [Turn.from_completion(c) for c in (*one, *two)]
    # what results.jsonl's completion_tokens sums
    assert [t.num_tokens for t in turns] == [6, *(c.usage_tokens for c in two)]
    # ids or log-probs, where a server sends them, still count first
    assert Turn(completion="x", completion_ids=[1, 2], usage_tokens=9).num_tokens == 2


def test_policy_given_a_backend_name_points_at_backend(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "--policy", "openai", "--model", "m"]) == 2
    err = capsys.readouterr().err
    assert "error parsing value" not in err
    assert "--policy is a section of settings" in err
    assert "did you mean --backend openai (or --policy.backend openai)?" in err


def test_read_results_can_give_verdicts_as_verdicts(tmp_path: Path) -> None:
    from leanrl.eval.store import ResultStore, read_results

    store = ResultStore(tmp_path)
    v = Verdict.reject(Reason.ERROR, "no", axioms=("propext",))
    rec = {
        "task_id": "t",
        "name": "t",
        "sample": 0,
        "accepted": False,
        "reward": 0.0,
        "verdict": v.model_dump(mode="json"),
        "proof": "simp",
        "completion": "simp",
    }
    store.open("fp", {})
    store.append([rec])
    store.close()
    (plain,) = read_results(tmp_path)
    assert isinstance(plain["verdict"], dict)  # for DataFrames, as before
    (typed,) = read_results(tmp_path, typed=True)
    assert typed["verdict"] == v


def test_the_docs_name_make_policy_and_the_registered_traces_command() -> None:
    concepts = (REPO / "docs" / "concepts.md").read_text()
    assert "leanrl.policies.make_policy" in concepts and "env.rollout" in concepts
    interop = (REPO / "docs" / "interop.md").read_text()
    assert "once it is registered" not in interop
    assert main(["interop", "traces", "--help"]) == 0
