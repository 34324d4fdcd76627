"""The soundness rules against a real Lean (skipped, with the reason, where there is none).

Core Lean only (no Mathlib), so any Lean project or plain `lean` + REPL can run them. REPL mode
needs a built REPL (`leanrl setup`, or LEANRL_LEAN_PROJECT); one-shot mode needs only `lean`.
Most cheats run with the pre-scan switched off, so the trusted checks themselves are exercised.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from leanrl.errors import LeanNotFoundError
from leanrl.lean.project import FORGE_TACTIC, FORGED_PREAMBLE
from leanrl.runtime import RuntimeConfig
from leanrl.runtimes.local import LocalRuntime
from leanrl.verdict import Attempt, Reason, Verdict, VerificationPolicy

pytestmark = pytest.mark.lean

SYMM = "theorem t (a b : Nat) (h : a = b) : b = a := by"
FALSE = "theorem t : 2 + 2 = 5 := by"
NO_SCAN = VerificationPolicy(forbid_tokens=False)

# (id, statement, preamble, proof, policy, expected reasons)
CASES: list[tuple[str, str, str, str, VerificationPolicy, set[Reason]]] = [
    ("valid", SYMM, "", "exact h.symm", VerificationPolicy(), {Reason.OK}),
    (
        "helper_lemma",
        SYMM,
        "theorem helper (x y : Nat) (e : x = y) : y = x := e.symm",
        "exact helper a b h",
        VerificationPolicy(),
        {Reason.OK},
    ),
    (
        "classical",
        SYMM,
        "",
        "exact Classical.byContradiction fun hne => hne h.symm",
        VerificationPolicy(),
        {Reason.OK},
    ),
    (
        "long_proof",
        SYMM,
        "",
        "\n".join(f"  have h{i} : {i} + 0 = {i} := rfl" for i in range(150)) + "\n  exact h.symm",
        VerificationPolicy(),
        {Reason.OK},
    ),
    (
        "kernel_replay_with_inductive",
        SYMM,
        "inductive Color where\n  | red\n  | blue\n\ndef Color.f : Color → Nat\n"
        "  | .red => 0\n  | .blue => 1",
        "have : Color.f .red = 0 := rfl\n  exact h.symm",
        VerificationPolicy(allow_new_inductives=True),
        {Reason.OK},
    ),
    (
        "new_inductive_refused_by_default",
        SYMM,
        "inductive Color where\n  | red\n  | blue\n\ndef Color.f : Color → Nat\n"
        "  | .red => 0\n  | .blue => 1\n\ntheorem uses : Color.f .red = 0 := rfl",
        "have := uses\n  exact h.symm",
        VerificationPolicy(),
        {Reason.FORBIDDEN},
    ),
    (
        # Code run during elaboration adds `False` as a theorem without the kernel; only the
        # clean checker's replay can see it.
        "forged_theorem_without_kernel",
        FALSE,
        FORGED_PREAMBLE,
        "exact leanrl_doctor_forged.elim",
        NO_SCAN,
        {Reason.FORBIDDEN},
    ),
    (
        # The target itself forged (issue 19): the attempt's tactic closes `2 + 2 = 5` with
        # `True.intro` and the theorem is added without the kernel. Its body holds no axiom, so
        # only a judge that replays the attempt's own body against the reference catches it (a
        # judge that re-added the reference's `sorry` body under a fresh name accepted it).
        "forged_target_without_kernel",
        FALSE,
        FORGE_TACTIC,
        "leanrl_forge",
        NO_SCAN,
        {Reason.FORBIDDEN},
    ),
    (
        # The target forged under its root name by code run in the preamble, then a namespace
        # left open so that the model's own `theorem t` becomes `Foo.t` and does not collide.
        "forged_target_in_an_open_namespace",
        FALSE,
        "open Lean Elab Command Term Meta in\n"
        "set_option debug.skipKernelTC true in\n"
        "#eval show CommandElabM Unit from liftTermElabM do\n"
        "  let ty ← instantiateMVars (← elabType (← `(2 + 2 = 5)))\n"
        "  addDecl (.thmDecl { name := `t, levelParams := [], type := ty,\n"
        "    value := mkConst ``True.intro })\n"
        "namespace Foo",
        "exact _root_.t",
        NO_SCAN,
        {Reason.FORBIDDEN},
    ),
    (
        # A forged helper, added by the attempt's own tactic without the kernel, used by a
        # target whose proof looks honest.
        "forged_helper_used_by_an_honest_target",
        FALSE,
        FORGE_TACTIC + "\ntheorem helper : 2 + 2 = 5 := by leanrl_forge",
        "exact helper",
        NO_SCAN,
        {Reason.FORBIDDEN},
    ),
    (
        # A theorem that points back at the target, added without the kernel: in the judge the
        # only `t` is the reference, proved with `sorry`, so a checker that resolved `t` there
        # would accept the cycle `cheat := t`, `t := cheat` (found by red-teaming).
        "cycle_through_the_reference",
        FALSE,
        "open Lean Elab Command Term Meta in\n"
        "set_option debug.skipKernelTC true in\n"
        "#eval show CommandElabM Unit from liftTermElabM do\n"
        "  let ty ← instantiateMVars (← elabType (← `(2 + 2 = 5)))\n"
        "  addDecl (.thmDecl { name := `cheat, levelParams := [], type := ty,\n"
        "    value := .const `t [] })",
        "exact cheat",
        NO_SCAN,
        {Reason.FORBIDDEN, Reason.ERROR},
    ),
    (
        # The attempt prints something shaped like a REPL answer into the REPL's own output
        # (old `#eval` does not capture stdout); the pool must not take it for an answer.
        "fake_repl_answer_on_stdout",
        FALSE,
        'axiom cheat : False\n#eval IO.println "{\\"env\\": 0}\\n"',
        "exact cheat.elim",
        NO_SCAN,
        {Reason.AXIOM, Reason.CRASH},
    ),
    ("sorry", SYMM, "", "sorry", NO_SCAN, {Reason.SORRY}),
    (
        "sorry_in_helper",
        FALSE,
        "theorem helper : False := sorry",
        "exact helper.elim",
        NO_SCAN,
        {Reason.SORRY},
    ),
    ("axiom", FALSE, "axiom cheat : False", "exact cheat.elim", NO_SCAN, {Reason.AXIOM}),
    (
        "native_decide",
        "theorem t : 2 + 2 = 4 := by",
        "",
        "native_decide",
        NO_SCAN,
        {Reason.NATIVE},
    ),
    ("exit", FALSE, "#exit", "rfl", NO_SCAN, {Reason.STATEMENT_CHANGED}),
    (
        "namespace",
        FALSE,
        "namespace Foo",
        "sorry",
        NO_SCAN,
        {Reason.SORRY, Reason.STATEMENT_CHANGED},
    ),
    (
        "instance_overrides_arithmetic",
        FALSE,
        "instance : Add Nat := ⟨fun _ _ => 5⟩",
        "rfl",
        NO_SCAN,
        {Reason.STATEMENT_CHANGED},
    ),
    (
        "local_notation",
        FALSE,
        'local notation:50 a:51 " = " b:51 => a ≤ b + 10',
        "decide",
        NO_SCAN,
        {Reason.STATEMENT_CHANGED, Reason.ERROR},
    ),
    (
        "variable_hypothesis",
        FALSE,
        "variable (hf : False)",
        "exact hf.elim",
        NO_SCAN,
        {Reason.STATEMENT_CHANGED, Reason.ERROR},
    ),
    (
        "def_instead_of_theorem",
        FALSE,
        "def t : 2 + 2 = 5 := sorry",
        "rfl",
        NO_SCAN,
        {Reason.ERROR, Reason.SORRY, Reason.STATEMENT_CHANGED},
    ),
    (
        "printed_fake_report",
        FALSE,
        "axiom cheat : False\n"
        '#eval IO.println "LEANRL-CHECK {\\"status\\": \\"ok\\", \\"axioms\\": []}"',
        "exact cheat.elim",
        NO_SCAN,
        {Reason.AXIOM},
    ),
    (
        "macro_rules_hijack_eval",
        FALSE,
        'axiom cheat : False\nmacro_rules | `(#eval $e) => `(#print "LEANRL-CHECK fake")',
        "exact cheat.elim",
        NO_SCAN,
        {Reason.AXIOM},
    ),
    *[
        (f"prescan_{i}", FALSE, pre, "rfl", VerificationPolicy(), {Reason.FORBIDDEN})
        for i, pre in enumerate(
            [
                "set_option debug.skipKernelTC true",
                "@[implemented_by id] def g (n : Nat) : Nat := n",
                "@[csimp] theorem c : @Nat.add = @Nat.add := rfl",
                "run_cmd pure ()",
                'elab "fake" : tactic => pure ()',
                "unsafe def u : Nat := 0",
                "initialize pure ()",
            ]
        )
    ],
    (
        "prescan_forbids_eval",
        FALSE,
        "#eval 1",
        "sorry",
        VerificationPolicy(),
        {Reason.FORBIDDEN},
    ),
]


async def _runtime(mode: str) -> LocalRuntime:
    rt = LocalRuntime(RuntimeConfig(mode=mode, workers=2, timeout_s=300, startup_timeout_s=600))  # type: ignore[arg-type]
    try:
        await rt.start()
    except LeanNotFoundError as e:
        pytest.skip(f"no usable Lean for {mode} mode: {e}")
    return rt


@pytest.fixture(params=["repl", "oneshot"])
async def lean_runtime(request: pytest.FixtureRequest) -> AsyncIterator[LocalRuntime]:
    rt = await _runtime(request.param)
    try:
        yield rt
    finally:
        await rt.close()


async def test_every_rule_against_real_lean(lean_runtime: LocalRuntime) -> None:
    attempts = [
        Attempt(name="t", header="", formal_statement=s, preamble=pre, proof=p, policy=pol, id=i)
        for i, s, pre, p, pol, _ in CASES
    ]
    verdicts: list[Verdict] = await lean_runtime.check(attempts)
    wrong = [
        (case[0], v.reason.value, v.detail)
        for case, v in zip(CASES, verdicts, strict=True)
        if v.reason not in case[5]
    ]
    assert not wrong, wrong
    classical = verdicts[2]
    assert "Classical.choice" in classical.axioms


async def test_restated_statement_is_judged_by_its_elaborated_type(
    lean_runtime: LocalRuntime,
) -> None:
    """A restatement that differs only cosmetically is accepted; one that changes the theorem is
    `statement_changed`, decided by the clean checker's type comparison."""
    base = Attempt(name="t", header="", formal_statement=SYMM, proof="exact h.symm")
    same = base.model_copy(
        update={"restated_statement": "theorem t (a b : Nat) (h : (a = b)) : (b = a) := by"}
    )
    other = base.model_copy(
        update={
            "restated_statement": "theorem t (a b : Nat) (h : a = b) : a = a := by",
            "proof": "rfl",
        }
    )
    ok, changed = await lean_runtime.check([same, other])
    assert ok.accepted, ok.detail
    assert changed.reason is Reason.STATEMENT_CHANGED, changed.detail


async def test_restatements_are_decided_by_the_kernel(lean_runtime: LocalRuntime) -> None:
    """A restated target passes when the elaborator's reducible check and the kernel both find it
    definitionally equal to the reference
    (`x > 0` for `0 < x`, a beta-redex, a renamed universe) and the attempt's proof checks
    against the reference's statement; a forged target restated that way is still refused."""
    gt = Attempt(
        name="t",
        header="",
        formal_statement="theorem t (x : Nat) (h : 0 < x) : 0 < x := by",
        restated_statement="theorem t (x : Nat) (h : 0 < x) : x > 0 := by",
        proof="exact h",
    )
    beta = Attempt(
        name="t",
        header="",
        formal_statement=SYMM,
        restated_statement="theorem t (a b : Nat) (h : a = b) : (fun n : Nat => n) b = a := by",
        proof="exact h.symm",
    )
    universe = Attempt(
        name="t",
        header="",
        formal_statement="theorem t.{u} (α : Sort u) (a : α) : a = a := by",
        restated_statement="theorem t.{v} (α : Sort v) (a : α) : a = a := by",
        proof="rfl",
    )
    forged = Attempt(
        name="t",
        header="",
        formal_statement=FALSE,
        restated_statement="theorem t : (fun n : Nat => n) (2 + 2) = 5 := by",
        preamble=FORGE_TACTIC,
        proof="leanrl_forge",
        policy=NO_SCAN,
    )
    v_gt, v_beta, v_universe, v_forged = await lean_runtime.check([gt, beta, universe, forged])
    for v in (v_gt, v_beta, v_universe):
        assert v.accepted, v.detail
    assert v_forged.reason is Reason.FORBIDDEN, v_forged.detail
    assert "proof of the reference statement" in v_forged.detail


async def test_a_restatement_needs_the_elaborators_reducible_check_too(
    lean_runtime: LocalRuntime,
) -> None:
    """Issue 35: the kernel alone no longer decides a restatement. One that matches the reference
    only after unfolding an ordinary definition (the kernel agrees, the reducible check does not)
    is `statement_changed`, naming the elaborator's check; universes written in another order
    under the same names pass; literal arithmetic that would kill the judge is `judge_limit`,
    unevaluated; and the checker's own namespace is refused."""
    unfold = Attempt(
        name="t",
        header="",
        formal_statement="theorem t (x : Nat) : x + 0 = x := by",
        preamble="def myAdd (a b : Nat) : Nat := a + b",
        restated_statement="theorem t (x : Nat) : myAdd x 0 = x := by",
        proof="rfl",
    )
    universes = Attempt(
        name="t",
        header="",
        formal_statement="theorem t.{u, v} {α : Sort v} {β : Sort u} (a : α) (b : β) : a = a := by",
        restated_statement="theorem t.{v, u} {α : Sort v} {β : Sort u} (a : α) (b : β) : a = a := by",
        proof="rfl",
    )
    shift = Attempt(
        name="t",
        header="",
        formal_statement="theorem t : True := by",
        restated_statement="theorem t : (1 <<< 4294967296 = 0) → True := by",
        proof="intro _\n  trivial",
    )
    reserved = Attempt(
        name="t",
        header="",
        formal_statement=SYMM,
        preamble="theorem LeanrlCheck.helper : True := trivial",
        proof="exact h.symm",
    )
    v_unfold, v_universes, v_shift, v_reserved = await lean_runtime.check(
        [unfold, universes, shift, reserved]
    )
    assert v_unfold.reason is Reason.STATEMENT_CHANGED, v_unfold.detail
    assert "reducible" in v_unfold.detail
    assert v_universes.accepted, v_universes.detail
    assert v_shift.reason is Reason.JUDGE_LIMIT, v_shift.detail
    assert v_reserved.reason is Reason.FORBIDDEN and "LeanrlCheck" in v_reserved.detail


async def test_file_checks_go_through_the_judges_run_file(lean_runtime: LocalRuntime) -> None:
    """A Kimina snippet that is not one theorem against a reference is a file check: every
    constant it adds is replayed and walked by `LeanrlCheck.runFile`. Sound declarations pass;
    an axiom of the file's own, a `sorry` and a forged theorem do not."""

    def file(text: str, policy: VerificationPolicy = VerificationPolicy()) -> Attempt:
        return Attempt(name="", header="", formal_statement="", proof=text, check="file",
                       policy=policy)  # fmt: skip

    ok, axiom, sorry, forged = await lean_runtime.check(
        [
            file(
                "def f : Nat := 1\n\ntheorem f_eq : f = 1 := rfl\n\n#check f_eq\n\n"
                "def a : Nat → Nat\n  | 0 => 1\n  | n + 1 => 2 * a n\n\n"
                "theorem a_one : a 1 = 2 := rfl"
            ),
            file("axiom bad : False\n\ntheorem b : 1 = 2 := bad.elim"),
            file("theorem s : 1 = 2 := by sorry"),
            file(FORGE_TACTIC + "\ntheorem g : 2 + 2 = 5 := by leanrl_forge", NO_SCAN),
        ]
    )
    assert ok.accepted, ok.detail
    assert axiom.reason is Reason.AXIOM, axiom.detail
    assert sorry.reason in (Reason.SORRY, Reason.ERROR), sorry.detail
    assert not forged.accepted and forged.reason in (Reason.FORBIDDEN, Reason.ERROR), forged.detail


async def test_forged_name_hashes_in_the_attempts_file_do_not_fool_the_checker(
    lean_runtime: LocalRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attempt's process writes the file the judge reads, so it can store any bytes there.
    Here the hand-off copy is patched the way such a process could: the axiom `propexu : False`
    is respelled `propext` while its stored name hash stays that of `propexu`. Read naively, the
    name is not found in the clean environment, counts as new, and prints as an allowed axiom;
    the checker rebuilds every name first, so it is the real `propext`, declared differently."""
    import leanrl.lean.oneshot as oneshot
    import leanrl.lean.pool as pool
    from leanrl.lean.trust.judge import take_pickle

    def forging(src, handoff, max_bytes):  # type: ignore[no-untyped-def]
        out = take_pickle(src, handoff, max_bytes)
        if not isinstance(out, str):
            data = out.read_bytes()
            assert b"propexu" in data
            out.chmod(0o600)
            out.write_bytes(data.replace(b"propexu", b"propext"))
        return out

    monkeypatch.setattr(pool, "take_pickle", forging)
    monkeypatch.setattr(oneshot, "take_pickle", forging)
    cheat = Attempt(
        name="t",
        header="",
        formal_statement=FALSE,
        preamble="axiom propexu : False",
        proof="exact propexu.elim",
        policy=NO_SCAN,
    )
    (v,) = await lean_runtime.check([cheat])
    assert not v.accepted
    assert v.reason in (Reason.STATEMENT_CHANGED, Reason.AXIOM), (v.reason, v.detail)


async def test_tactic_session_real_lean() -> None:
    rt = await _runtime("repl")
    try:
        async with rt.tactic_session("") as s:
            st = await s.start(SYMM)
            assert st.proof_state is not None and "⊢ b = a" in st.goals[0]
            done = await s.apply(st.proof_state, "exact h.symm")
            assert done.solved, done
            bad = await s.apply(st.proof_state, "exact nonexistent_lemma")
            assert bad.error
    finally:
        await rt.close()


async def test_tactic_blocks_real_lean() -> None:
    # Several tactics per request (REPL issue #43) go as one `(tacticSeq)`; the pre-scan answers
    # for code-running tactics without asking Lean.
    rt = await _runtime("repl")
    try:
        async with rt.tactic_session("") as s:
            st = await s.start(SYMM)
            assert st.proof_state is not None
            for block in ["have h2 := h.symm\nexact h2", "have h2 := h.symm; exact h2"]:
                done = await s.apply(st.proof_state, block)
                assert done.solved, (block, done)
            part = await s.apply(st.proof_state, "  have h2 := h.symm\n  -- keep going\n")
            assert part.error is None and part.goals, part
            bad = await s.apply(st.proof_state, "run_tac pure ()")
            assert bad.error and "pre-scan" in bad.error
    finally:
        await rt.close()
