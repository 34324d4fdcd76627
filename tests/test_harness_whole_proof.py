"""The whole-proof harness: prompt formats, proof extraction, and a run against a test runtime."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from leanrl import ConfigError, HarnessConfig, Reason, SamplingConfig, Task, TasksetConfig
from leanrl.environments.minif2f import MiniF2FTaskset
from leanrl.harnesses.whole_proof import WholeProofHarness, build_prompt, extract_proof
from leanrl.lean.trust.lexer import mask_comments
from leanrl.verdict import VerificationPolicy
from tests._scripted_runtime import ScriptedPolicy, ScriptedRuntime

HEADER = "import Mathlib\n\nopen Real Nat\n\n"
STMT = "theorem t1 (x : ℕ) (h₀ : x + 1 = 2) :\n  x = 1 := by"
TASK = Task(name="t1", header=HEADER, formal_statement=STMT, informal_statement="Show x = 1.")


def ex(text: str, finish: str = "stop", completion: bool = False):
    return extract_proof(text, TASK, finish_reason=finish, completion_style=completion)


# -- prompts -------------------------------------------------------------------------------------


def test_deepseek_prompt_opens_a_block_with_header_comment_and_statement() -> None:
    # DeepSeek-Prover-V1.5's quick_start.py: the code prefix ends in ":= by" and a newline.
    p = build_prompt(TASK, HarnessConfig(prompt_format="deepseek"))
    assert p == (
        "Complete the following Lean 4 code:\n\n```lean4\nimport Mathlib\n\nopen Real Nat\n\n"
        "/-- Show x = 1.-/\ntheorem t1 (x : ℕ) (h₀ : x + 1 = 2) :\n  x = 1 := by\n"
    )


def test_kimina_prompt_is_the_model_card_layout() -> None:
    user = (
        "Think about and solve the following problem step by step in Lean 4.\n"
        f"# Problem:Show x = 1.\n# Formal statement:\n```lean4\n{HEADER}{STMT}\n```\n"
    )
    msgs = build_prompt(TASK, HarnessConfig(prompt_format="kimina"))
    assert [m.role for m in msgs] == ["system", "user"]
    # Kimina-Prover-72B / Distill-8B / Distill-1.7B
    assert msgs[0].content == "You are an expert in mathematics and proving theorems in Lean 4."
    assert msgs[1].content == user
    preview = build_prompt(TASK, HarnessConfig(prompt_format="kimina-preview"))
    assert preview[0].content == "You are an expert in mathematics and Lean 4."  # Preview cards
    assert preview[1].content == user


def test_goedel_prompt_is_the_v2_readme_layout() -> None:
    # Goedel-Prover-V2 README: one user turn, the statement ends in `sorry`, then the plan request.
    msgs = build_prompt(TASK, HarnessConfig(prompt_format="goedel"))
    assert [m.role for m in msgs] == ["user"]
    assert msgs[0].content == (
        f"Complete the following Lean 4 code:\n\n```lean4\n{HEADER}{STMT}\n  sorry```\n\n"
        "Before producing the Lean 4 code to formally prove the given theorem, provide a "
        "detailed proof plan outlining the main proof steps and strategies.\nThe plan should "
        "highlight key ideas, intermediate lemmas, and proof structures that will guide the "
        "construction of the final formal proof."
    )
    sys = build_prompt(TASK, HarnessConfig(prompt_format="goedel", system_prompt="S"))
    assert [m.role for m in sys] == ["system", "user"] and sys[0].content == "S"


def test_chat_prompts_have_system_and_user_with_the_statement() -> None:
    for fmt in ("chat", "kimina"):
        msgs = build_prompt(TASK, HarnessConfig(prompt_format=fmt))
        assert isinstance(msgs, list) and [m.role for m in msgs] == ["system", "user"]
        assert f"```lean4\n{HEADER}{STMT}\n```" in msgs[1].content
    chat = build_prompt(TASK, HarnessConfig(prompt_format="chat", system_prompt="SYS"))
    assert chat[0].content == "SYS" and "step by step" in chat[1].content
    assert "Show x = 1." in chat[1].content


def test_custom_template_and_bad_formats() -> None:
    cfg = HarnessConfig(
        prompt_format="custom", template="{name}|{informal_comment}{formal_statement}"
    )
    assert build_prompt(TASK, cfg) == f"t1|/-- Show x = 1.-/\n{STMT}"
    chat = build_prompt(TASK, cfg.model_copy(update={"system_prompt": "S"}))
    assert chat[0].content == "S" and chat[1].content.startswith("t1|")
    with pytest.raises(ConfigError, match="unknown prompt_format"):
        build_prompt(TASK, HarnessConfig(prompt_format="nope"))
    with pytest.raises(ConfigError, match="needs a template"):
        build_prompt(TASK, HarnessConfig(prompt_format="custom"))
    with pytest.raises(ConfigError, match="unknown field"):
        build_prompt(TASK, HarnessConfig(prompt_format="custom", template="{proof}"))


# -- extraction ----------------------------------------------------------------------------------


def test_completion_style_takes_the_continuation_until_the_fence() -> None:
    e = ex("\n  nlinarith [sq_nonneg x]\n  omega\n```\nSome talk", completion=True)
    assert e.reason is None and e.proof == "\n  nlinarith [sq_nonneg x]\n  omega"
    # the stop string removed the fence: the whole text is the proof
    assert ex("\n  omega\n", completion=True).proof == "\n  omega"
    # cut by the token limit before the block closed
    assert ex("\n  nlinarith [sq_nonn", "length", completion=True).reason == Reason.TRUNCATED
    assert ex("   \n", completion=True).reason == Reason.NO_PROOF
    # a declaration after the proof is not part of it
    assert ex("\n  omega\n\ntheorem other : True := trivial", completion=True).proof == "\n  omega"


def test_completion_after_a_prompt_ending_in_a_newline_keeps_its_indentation() -> None:
    # The deepseek prompt ends in ":= by\n": the model starts with the indented first tactic.
    e = ex("    intro\n    simp\n```", completion=True)
    assert e.proof == "\n    intro\n    simp"  # one block, not `intro` applied to `simp`
    assert TASK.lean_text(e.proof).endswith(":= by\n    intro\n    simp\n")


def test_completion_proof_followed_by_a_restated_theorem_keeps_the_proof() -> None:
    # The continuation is the proof; whatever the model writes after it is not, and nothing of
    # it may end up in the preamble above the reference statement.
    text = "  omega\n\ntheorem t1 (x : ℕ) (h₀ : x + 1 = 2) : x = 1 := by\n  simp\n```"
    e = ex(text, completion=True)
    assert (e.reason, e.proof, e.preamble) == (None, "\n  omega", "")
    changed = "  sorry\ntheorem t1 : True := by\n  trivial"
    assert ex(changed, completion=True).preamble == ""
    # starting over with the header and theorem: the restated theorem is checked
    restart = "\nimport Mathlib\ntheorem t1 (x : ℕ) (h₀ : x + 1 = 2) : x = 1 := by\n  omega\n```"
    assert (ex(restart, completion=True).proof, ex(restart, completion=True).preamble) == (
        "\n  omega",
        "",
    )
    # a different statement is not the reference's: it goes to the checker as the model's own
    # statement, which the trusted checker rejects (`statement_changed`) unless it elaborates to
    # exactly the reference type
    other = "\nimport Mathlib\ntheorem t1 : True := by\n  trivial\n```"
    e = ex(other, completion=True)
    assert (e.reason, e.proof, e.preamble) == (None, "\n  trivial", "")
    assert e.restated_statement == "theorem t1 : True := by"


def test_a_theorem_inside_a_comment_is_not_the_answer() -> None:
    # The last `theorem t1` sits in a comment; taking it would put the model's own theorem (with
    # another statement) plus an open comment above the reference statement, hiding it.
    text = (
        "```lean4\ntheorem t1 (x : ℕ) (h₀ : x + 1 = 2) : True := by trivial\n/-\n"
        "theorem t1 (x : ℕ) (h₀ : x + 1 = 2) :\n  x = 1 := by\n  omega -/\n```"
    )
    e = ex(text)
    # the uncommented theorem is the answer (its own statement, for the checker to judge); the
    # commented one stays a closed comment after the proof and never reaches the preamble
    assert e.reason is None and e.preamble == ""
    assert e.restated_statement == "theorem t1 (x : ℕ) (h₀ : x + 1 = 2) : True := by"
    assert mask_comments(e.proof or "").strip() == "trivial"
    commented_draft = (
        "```lean4\n/- draft:\ntheorem t1 (x : ℕ) (h₀ : x + 1 = 2) : x = 1 := by\n  simp\n-/\n"
        "theorem t1 (x : ℕ) (h₀ : x + 1 = 2) : x = 1 := by\n  omega\n```"
    )
    e = ex(commented_draft)
    assert e.reason is None and e.proof == "\n  omega"
    assert e.preamble.startswith("/- draft:") and e.preamble.rstrip().endswith("-/")


PUTNAM = Task(
    name="putnam_x",
    header="import Mathlib\n\n",
    formal_statement=(
        "abbrev putnam_x_solution : ℕ := 3\n-- the answer\n"
        "theorem putnam_x : putnam_x_solution = 3 := by"
    ),
)


def test_a_statement_with_definitions_before_the_theorem() -> None:
    # PutnamBench: the reference statement starts with the answer's `abbrev`. Restating it all
    # is fine and the restated abbrev is not put in the preamble (it would be declared twice).
    full = (
        "```lean4\nimport Mathlib\n\nlemma aux : True := trivial\n\n"
        "abbrev putnam_x_solution : ℕ :=\n  3\n"
        "theorem putnam_x : putnam_x_solution = 3 := by\n  rfl\n```"
    )
    e = extract_proof(full, PUTNAM)
    assert (e.reason, e.proof, e.preamble) == (None, "\n  rfl", "lemma aux : True := trivial")
    # the theorem alone is fine too
    alone = "```lean4\ntheorem putnam_x : putnam_x_solution = 3 := by\n  rfl\n```"
    assert extract_proof(alone, PUTNAM).preamble == ""
    # a different answer is a different statement
    other = full.replace(":=\n  3\n", ":= 4\n")
    e = extract_proof(other, PUTNAM)
    assert e.reason == Reason.STATEMENT_CHANGED and "putnam_x_solution" in e.detail


def test_an_instance_statement_is_found() -> None:
    task = Task(name="i1", header="", formal_statement="instance i1 : Inhabited ℕ := by")
    e = extract_proof("```lean4\ninstance i1 : Inhabited ℕ := by\n  exact ⟨0⟩\n```", task)
    assert (e.reason, e.proof) == (None, "\n  exact ⟨0⟩")


def test_two_theorems_with_the_reference_name_are_rejected() -> None:
    text = (
        "```lean4\ntheorem t1 : True := trivial\n\n"
        "theorem t1 (x : ℕ) (h₀ : x + 1 = 2) : x = 1 := by\n  omega\n```"
    )
    e = ex(text)
    assert e.reason == Reason.STATEMENT_CHANGED and "2 times" in e.detail


def test_preamble_cannot_wrap_or_modify_the_reference_statement() -> None:
    ns = (
        "```lean4\nnamespace Foo\nlemma aux : True := trivial\n"
        "theorem t1 (x : ℕ) (h₀ : x + 1 = 2) : x = 1 := by\n  omega\nend Foo\n```"
    )
    e = ex(ns)
    # the namespace is closed before the reference statement, which stays top-level `t1`
    assert e.preamble == "namespace Foo\nlemma aux : True := trivial\nend Foo\nopen Foo"
    assert e.proof == "\n  omega"
    opened = (
        "```lean4\nopen Foo in\ntheorem t1 (x : ℕ) (h₀ : x + 1 = 2) : x = 1 := by\n  omega\n```"
    )
    # `open ... in` becomes `open`: the proof still sees the opened names; the reference
    # statement stays top-level `t1` (the checker compares its type with the reference's)
    assert ex(opened).preamble == "open Foo"
    # an `end` the model did not open would close the header's own section (ProofNet headers
    # open `noncomputable section`): dropped
    stray = "```lean4\nlemma aux : True := trivial\nend\ntheorem t1 (x : ℕ) (h₀ : x + 1 = 2) : x = 1 := by omega\n```"
    assert ex(stray).preamble == "lemma aux : True := trivial"
    sec = "```lean4\nnoncomputable section\ntheorem t1 (x : ℕ) (h₀ : x + 1 = 2) : x = 1 := by omega\n```"
    assert ex(sec).preamble == "noncomputable section\nend"


def test_chat_takes_the_last_block_ignores_reasoning_and_strips_the_header() -> None:
    text = (
        "<think>try ```lean4\ntheorem t1 : False := by sorry\n``` no</think>\n"
        "Here is a draft:\n```lean\nomega\n```\nFinal:\n```lean4\nimport Mathlib\nopen Real Nat\n\n"
        "theorem t1 (x : ℕ) (h₀ : x + 1 = 2) :\n    x = 1 := by\n  have h := h₀\n  omega\n```\nDone."
    )
    e = ex(text)
    assert e.reason is None
    assert e.proof == "\n  have h := h₀\n  omega"
    assert e.preamble == ""


def test_helper_lemmas_become_the_preamble() -> None:
    text = (
        "```lean4\nimport Mathlib\n\nlemma helper (y : ℕ) : y + 0 = y := by simp\n\n"
        "/-- the main theorem -/\ntheorem t1 (x : ℕ) (h₀ : x + 1 = 2) : x = 1 := by\n"
        "  omega\n```"
    )
    e = ex(text)
    assert e.preamble == "lemma helper (y : ℕ) : y + 0 = y := by simp"
    assert e.proof == "\n  omega"
    two_docs = (
        "```lean4\n/-- helper -/\nlemma helper : 1 = 1 := rfl\n\n/-- main -/\n"
        "set_option maxRecDepth 1000 in\ntheorem t1 (x : ℕ) (h₀ : x + 1 = 2) : x = 1 := by omega\n```"
    )
    # the theorem's doc comment is dropped; its `set_option ... in` stays an option (it only
    # affects the theorem that follows)
    assert ex(two_docs).preamble == (
        "/-- helper -/\nlemma helper : 1 = 1 := rfl\nset_option maxRecDepth 1000"
    )


def test_changed_statement_goes_to_the_checker_and_renamed_is_rejected() -> None:
    # A statement that differs from the reference is the model's own: extraction passes it on
    # and the trusted checker compares its elaborated type with the reference's.
    changed = "```lean4\ntheorem t1 (x : ℕ) (h₀ : x + 1 = 2) : x = 1 ∨ True := by\n  simp\n```"
    e = ex(changed)
    assert e.reason is None and e.proof == "\n  simp"
    assert e.restated_statement == "theorem t1 (x : ℕ) (h₀ : x + 1 = 2) : x = 1 ∨ True := by"
    # no theorem of that name at all: certainly wrong, rejected here
    renamed = "```lean4\ntheorem easier : True := by\n  trivial\n```"
    assert ex(renamed).reason == Reason.STATEMENT_CHANGED
    assert ex("```lean4\nexample : True := trivial\n```").reason == Reason.STATEMENT_CHANGED
    # comments, spacing and `lemma` do not count as a change
    same = "```lean4\nlemma t1 (x : ℕ) -- x\n (h₀ : x + 1 = 2) : x = 1 := by omega\n```"
    assert (ex(same).proof, ex(same).restated_statement) == ("omega", "")
    tight = "```lean4\ntheorem t1 (x:ℕ) (h₀:x+1=2):\n    x=1 := by omega\n```"
    assert (ex(tight).proof, ex(tight).restated_statement) == ("omega", "")
    # but whitespace between two names is part of the statement: `f a b` is not `f ab`
    task = Task(
        name="t2",
        header="",
        formal_statement="theorem t2 (f : ℕ → ℕ → ℕ) (a b ab : ℕ) : f a b = f a b := by",
    )
    merged = "```lean4\ntheorem t2 (f : ℕ → ℕ → ℕ) (a b ab : ℕ) : f ab = f ab := by\n  rfl\n```"
    e = extract_proof(merged, task)
    assert e.restated_statement.startswith("theorem t2 (f : ℕ → ℕ → ℕ) (a b ab : ℕ) : f ab")


def test_truncation_and_missing_code() -> None:
    assert ex("Let me think ```lean4\ntheorem t1", "length").reason == Reason.TRUNCATED
    assert ex("<think>long reasoning", "length").reason == Reason.TRUNCATED
    assert ex("<think>never closed").reason == Reason.NO_PROOF
    assert ex("I cannot prove this.").reason == Reason.NO_PROOF
    assert ex("words words", "length").reason == Reason.TRUNCATED
    assert ex("```lean4\n\n```").reason == Reason.NO_PROOF


def test_bare_tactics_and_term_proofs() -> None:
    assert ex("```lean4\nintro h\n  simp at h\nomega\n```").proof == (
        "\n  intro h\n    simp at h\n  omega"
    )
    assert ex("```lean4\nby\n  omega\n```").proof == "\n  omega"
    term = "```lean4\ntheorem t1 (x : ℕ) (h₀ : x + 1 = 2) : x = 1 :=\n  by_contra fun h =>\n    h rfl\n```"
    assert ex(term).proof == "exact (by_contra fun h =>\n      h rfl)"
    # a comment at the end of a term proof must not swallow the closing parenthesis
    commented = "```lean4\ntheorem t1 (x : ℕ) (h₀ : x + 1 = 2) : x = 1 :=\n  foo h₀ -- done\n```"
    assert ex(commented).proof == "exact (foo h₀ -- done\n    )"


# -- the harness ---------------------------------------------------------------------------------


@pytest.fixture
def tasks(bench_data: Path) -> tuple[MiniF2FTaskset, list[Task]]:
    ts = MiniF2FTaskset(
        TasksetConfig(path=bench_data, limit=3, policy=VerificationPolicy(allow_native_decide=True))
    )
    return ts, ts.tasks()


async def test_run_checks_under_the_reference_statement(tasks) -> None:
    taskset, ts = tasks
    texts = [
        "\n  omega\n",  # accepted by the test runtime
        "\n  simp\n",  # rejected by it (error)
        "\n  nlinarith [sq_nonneg",  # truncated by "length"? no: finish is stop -> checked
    ]
    policy = ScriptedPolicy(texts)
    rt = ScriptedRuntime()
    h = WholeProofHarness(HarnessConfig(prompt_format="deepseek"))
    groups = await h.run(ts, policy, rt, SamplingConfig(n=3), taskset)
    assert [len(g) for g in groups] == [3, 3, 3]
    assert [[r.reward for r in g] for g in groups] == [[1.0, 0.0, 0.0]] * 3
    assert len(rt.attempts) == 9
    for a, (task, i) in zip(rt.attempts, [(t, i) for t in ts for i in range(3)], strict=True):
        assert a.formal_statement == task.formal_statement and a.header == task.header
        assert a.name == task.name and a.id == f"{task.id}/{i}"
        assert a.policy.allow_native_decide is True  # the taskset's rules travel with it
    # the prompt format's stop string was passed on
    assert policy.calls and isinstance(policy.calls[0][0], str)
    r = groups[0][0]
    assert r.verdict and r.verdict.accepted and r.proof == "\n  omega"
    ids, mask, lps = r.token_ids_and_mask()
    assert ids == [ord(c) for c in texts[0]] and mask == [1] * len(ids) and lps[0] == -0.5


async def test_rejected_extractions_never_reach_lean_and_shaping_applies(tasks) -> None:
    taskset, ts = tasks
    taskset.config.shortest_proof_bonus = 0.5
    policy = ScriptedPolicy(["```lean4\nomega\n```", "```lean4\nsimp\nomega\n```", "no code"])
    rt = ScriptedRuntime()
    h = WholeProofHarness(HarnessConfig(prompt_format="chat"))
    groups = await h.run(ts[:1], policy, rt, SamplingConfig(n=3), taskset)
    g = groups[0]
    assert [r.verdict.reason for r in g] == [Reason.OK, Reason.OK, Reason.NO_PROOF]
    assert [r.reward for r in g] == [1.5, 1.0, 0.0]  # bonus for the shortest accepted proof
    assert len(rt.attempts) == 2
    policy_t = ScriptedPolicy(["<think>still thinking"], finish="length")
    groups = await h.run(ts[:1], policy_t, rt, SamplingConfig(n=2), taskset)
    assert {r.verdict.reason for r in groups[0]} == {Reason.TRUNCATED}
    assert len(rt.attempts) == 2  # nothing new was sent to the runtime


async def test_tiny_model_end_to_end(tasks, tiny_model_dir: Path) -> None:
    from leanrl import PolicyConfig
    from leanrl.policies import make_policy

    taskset, ts = tasks
    policy = make_policy(PolicyConfig(model=str(tiny_model_dir), batch_size=4))
    await policy.start()
    rt = ScriptedRuntime()
    h = WholeProofHarness(HarnessConfig(prompt_format="deepseek"))
    groups = await h.run(ts[:2], policy, rt, SamplingConfig(n=2, max_tokens=16), taskset)
    for g in groups:
        for r in g:
            assert r.verdict is not None  # every attempt gets exactly one verdict
            t = r.turns[0]
            assert len(t.completion_ids) == len(t.logprobs or []) > 0
            assert r.prompt_ids and all(lp <= 0 for lp in t.logprobs or [])
    # every attempt that had a proof went to the runtime under the reference statement
    checked = {a.id for a in rt.attempts}
    assert checked == {f"{g[0].task_id}/{r.sample}" for g in groups for r in g if r.proof}


def test_a_reasoning_prover_style_answer() -> None:
    text = (
        "<think>\nWe have x + 1 = 2 so x = 1.\n```lean4\ntheorem t1 : False := by sorry\n```\n"
        "</think>\nThe proof subtracts one.\n\n```lean4\nimport Mathlib\nimport Aesop\n\n"
        "set_option maxHeartbeats 400000\n\nopen Real Nat\n\n"
        "theorem t1 (x : ℕ) (h₀ : x + 1 = 2) :\n  x = 1 := by\n  -- subtract\n  omega\n```\n"
    )
    e = ex(text)
    assert e.reason is None
    assert e.preamble == "set_option maxHeartbeats 400000"  # imports and header lines dropped
    assert e.proof == "\n  -- subtract\n  omega"
    assert TASK.lean_text(e.proof, e.preamble) == (
        f"{HEADER}set_option maxHeartbeats 400000\n\n{STMT}\n  -- subtract\n  omega\n"
    )


class _ShuffledRuntime(ScriptedRuntime):
    """A TEST runtime that answers a batch in reverse order (as-completed style), ids echoed."""

    async def check(self, attempts):  # type: ignore[no-untyped-def]
        return list(reversed(await super().check(attempts)))


async def test_verdicts_go_to_their_own_attempts(tasks) -> None:
    taskset, ts = tasks
    policy = ScriptedPolicy(["\n  omega\n", "\n  simp\n", "\n  ring\n"])
    h = WholeProofHarness(HarnessConfig(prompt_format="deepseek"))
    groups = await h.run(ts[:1], policy, _ShuffledRuntime(), SamplingConfig(n=3), taskset)
    # only sample 0 has the accepted tactic; a verdict must never be credited to another proof
    assert [r.verdict.accepted for r in groups[0]] == [True, False, False]
    assert [r.verdict.id for r in groups[0]] == [f"{ts[0].id}/{i}" for i in range(3)]


# -- reading the model's code with Lean's lexer ------------------------------------------------


def test_a_quoted_theorem_name_is_the_theorem() -> None:
    e = ex("```lean4\ntheorem «t1» (x : ℕ) (h₀ : x + 1 = 2) : x = 1 := by\n  omega\n```")
    assert (e.reason, e.proof, e.restated_statement) == (None, "\n  omega", "")


def test_strings_and_comments_do_not_confuse_extraction() -> None:
    text = (
        "```lean4\n"
        'lemma opener : "/-".length = 2 := by decide\n'
        'def msg : String := "theorem t1 : False := by sorry"\n'
        "-- theorem t1 (x : ℕ) : False := by simp   (a note, not code)\n"
        "theorem t1 (x : ℕ) (h₀ : x + 1 = 2) : x = 1 := by\n"
        '  have : "end" = "end" := rfl -- not the end of anything\n'
        "  omega\n```"
    )
    e = ex(text)
    assert e.reason is None and e.restated_statement == ""
    assert e.preamble.startswith('lemma opener : "/-".length = 2 := by decide\ndef msg')
    assert e.proof == '\n  have : "end" = "end" := rfl -- not the end of anything\n  omega'


def test_cosmetic_differences_still_match_the_reference() -> None:
    # redundant parentheses, `«»`, `->`/`→`, `fun`/`λ`, attributes, layout, comments
    task = Task(
        name="t3",
        header="",
        formal_statement=(
            "theorem t3 (f : ℕ → ℕ) (h : ∀ x, f x = x) : (fun x => f x) 2 = 2 ∧ f (3) = 3 := by"
        ),
    )
    restated = (
        "```lean4\n@[simp] theorem «t3» (f : ℕ -> ℕ) (h : (∀ x, f x = x)) :\n"
        "    ((λ x => f x) 2 = 2 ∧ f 3 = 3) -- the goal\n    := by\n  simp [h]\n```"
    )
    e = extract_proof(restated, task)
    assert (e.reason, e.restated_statement, e.proof) == (None, "", "\n  simp [h]")
    # but `a[i]` is not `a [i]`: a space there changes what Lean reads
    index = Task(
        name="t4", header="", formal_statement="theorem t4 (a : Array ℕ) : a[0]! = 0 := by"
    )
    spaced = "```lean4\ntheorem t4 (a : Array ℕ) : a [0]! = 0 := by\n  sorry\n```"
    assert extract_proof(spaced, index).restated_statement != ""


def test_a_restated_putnam_statement_keeps_the_reference_definitions() -> None:
    other = (
        "```lean4\nabbrev putnam_x_solution : ℕ := 3\n"
        "theorem putnam_x : (putnam_x_solution) = 3 ∧ True := by\n  simp\n```"
    )
    e = extract_proof(other, PUTNAM)
    assert e.reason is None and e.preamble == ""
    assert e.restated_statement == (
        "abbrev putnam_x_solution : ℕ := 3\n-- the answer\n"
        "theorem putnam_x : (putnam_x_solution) = 3 ∧ True := by"
    )


def test_an_equation_style_proof_is_no_proof() -> None:
    text = "```lean4\ntheorem t1 (x : ℕ) (h₀ : x + 1 = 2) : x = 1\n  | _ => by omega\n```"
    assert ex(text).reason == Reason.NO_PROOF


async def test_the_harness_sends_the_restated_statement(tmp_path: Path) -> None:
    row = {"name": "t1", "split": "test", "header": HEADER, "formal_statement": STMT}
    (tmp_path / "minif2f.jsonl").write_text(json.dumps(row) + "\n", encoding="utf-8")
    taskset = MiniF2FTaskset(TasksetConfig(path=tmp_path))
    (task,) = taskset.tasks()
    head = task.formal_statement.rsplit(":= by", 1)[0]
    texts = [f"```lean4\n{head} ∧ True := by\n  omega\n```"]
    rt = ScriptedRuntime()
    h = WholeProofHarness(HarnessConfig(prompt_format="chat"))
    await h.run([task], ScriptedPolicy(texts), rt, SamplingConfig(n=1), taskset)
    (a,) = rt.attempts
    assert a.formal_statement == task.formal_statement and a.proof == "\n  omega"
    assert a.restated_statement.endswith("∧ True := by")
    assert a.restated_statement.startswith(f"theorem {task.name}")


# -- options ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("harness", "options", "hint"),
    [
        ("whole-proof", {"prompt_fromat": "kimina"}, "takes no options"),
        ("self-correction", {"max_revisons": 3}, "takes no options"),
        ("tactic-loop", {"max_sesions": 4}, "did you mean 'max_sessions'?"),
    ],
)
def test_an_unknown_harness_option_is_refused_with_the_known_ones(
    harness: str, options: dict[str, object], hint: str
) -> None:
    # A typo in a free-form options table used to be ignored: the run went on with defaults.
    from leanrl import load_environment

    env = load_environment("minif2f", harness=HarnessConfig(name=harness, options=options))
    with pytest.raises(ConfigError, match="unknown harness option") as e:
        _ = env.harness
    assert hint in str(e.value) and repr(next(iter(options))) in str(e.value)
    known = HarnessConfig(name="tactic-loop", options={"max_sessions": 4})
    assert load_environment("minif2f", harness=known).harness.wave_size == 4  # type: ignore[attr-defined]
