"""The public API: one curated ``__all__``, importable, cheap to import."""

from __future__ import annotations

import subprocess
import sys

import pydantic

import leanrl

EXPECTED = {
    # the concepts
    "Task",
    "Taskset",
    "Harness",
    "Runtime",
    "Environment",
    "Policy",
    "Verdict",
    "Rollout",
    "load_environment",
    # their config models
    "TasksetConfig",
    "HarnessConfig",
    "RuntimeConfig",
    "EnvironmentConfig",
    "PolicyConfig",
    "SamplingConfig",
    "VerificationPolicy",
    "ColumnMap",
    # the data that flows between them
    "Attempt",
    "Message",
    "Reason",
    "Completion",
    "Prompt",
    "ChatMessage",
    "Turn",
    "TacticSession",
    "TacticState",
    # the exception tree
    "LeanrlError",
    "ConfigError",
    "DatasetError",
    "LeanNotFoundError",
    "PolicyError",
    "RuntimeUnavailable",
    "__version__",
}


def test_all_is_exactly_the_curated_api() -> None:
    assert set(leanrl.__all__) == EXPECTED
    assert len(leanrl.__all__) == len(set(leanrl.__all__)), "duplicates in __all__"
    for name in leanrl.__all__:
        assert hasattr(leanrl, name), name


def test_star_import_gives_only_the_api() -> None:
    ns: dict[str, object] = {}
    exec("from leanrl import *", ns)
    assert set(ns) - {"__builtins__"} == EXPECTED


def test_exceptions_form_one_tree() -> None:
    for name in (
        "ConfigError",
        "DatasetError",
        "LeanNotFoundError",
        "PolicyError",
        "RuntimeUnavailable",
    ):
        assert issubclass(getattr(leanrl, name), leanrl.LeanrlError)


def test_config_models_are_validated_at_construction() -> None:
    import pytest

    with pytest.raises(pydantic.ValidationError):
        leanrl.TasksetConfig(limit=0)
    with pytest.raises(pydantic.ValidationError):
        leanrl.SamplingConfig(top_p=1.5)
    with pytest.raises(pydantic.ValidationError):
        leanrl.RuntimeConfig(timeout_s=-1)
    with pytest.raises(pydantic.ValidationError, match="extra"):
        leanrl.HarnessConfig(max_turn=3)  # typo of max_turns is caught, not ignored


def test_import_is_light() -> None:
    """A notebook's `import leanrl` must not pull torch/transformers/datasets in."""
    code = (
        "import sys, leanrl; heavy = [m for m in ('torch', 'transformers', 'datasets') "
        "if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/"
    )
    assert out.stdout.strip() == "[]"


def test_verdict_and_task_are_frozen() -> None:
    import pytest

    v = leanrl.Verdict.reject(leanrl.Reason.SORRY, "uses sorry")
    assert not v.accepted and v.reason is leanrl.Reason.SORRY
    with pytest.raises(pydantic.ValidationError):
        v.accepted = True  # type: ignore[misc]
    t = leanrl.Task(name="t", header="", formal_statement="theorem t : True := by")
    assert t.id == "t"
    assert t.lean_text("trivial") == "theorem t : True := by\n  trivial\n"


def test_turn_from_completion_and_the_token_mask() -> None:
    c = leanrl.Completion(
        text="simp", token_ids=(5, 6), logprobs=(-0.1, -0.2), finish_reason="length"
    )
    t = leanrl.Turn.from_completion(c, "Goals: ⊢ p", [9])
    assert (t.completion, t.completion_ids, t.logprobs) == ("simp", [5, 6], [-0.1, -0.2])
    assert (t.feedback, t.feedback_ids, t.finish_reason) == ("Goals: ⊢ p", [9], "length")
    r = leanrl.Rollout(task_id="t", prompt="p", turns=[t, leanrl.Turn.from_completion(c)])
    ids, mask, lps = r.token_ids_and_mask()
    assert ids == [5, 6, 9, 5, 6] and mask == [1, 1, 0, 1, 1]
    assert lps == [-0.1, -0.2, None, -0.1, -0.2] and r.truncated
