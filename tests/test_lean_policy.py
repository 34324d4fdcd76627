"""Every soundness rule, without Lean: one test per known cheat, plus valid proofs.

The inputs are shaped exactly like real answers: the attempt's REPL answer (``env``,
``messages`` with ``pos``/``endPos``, ``sorries`` with ``proofState``/``goal``) and the check
step's answer (one ``LEANRL-CHECK`` info message from the trusted checker). The functions under
test are the ones the pool and one-shot mode call, in the same order: pre-scan, elaboration,
report. Most cheats are tested twice: caught by the pre-scan, and -- with the pre-scan switched
off -- caught by the trusted checks after elaboration.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from leanrl.lean.protocol import CommandResponse, ReplError, parse_response
from leanrl.lean.source import assemble, split_header
from leanrl.lean.trust.report import parse_report
from leanrl.lean.trust.rules import judge_elaboration, judge_prescan, judge_report
from leanrl.verdict import Attempt, Reason, Verdict, VerificationPolicy

HEADER = (
    "import Mathlib\nimport Aesop\nset_option maxHeartbeats 400000\nopen BigOperators Real Nat\n\n"
)
STMT = "theorem t (a b : ℕ) (h : a = b) : b = a := by"
NONCE = "0123456789abcdef0123456789abcdef"
NO_SCAN = VerificationPolicy(forbid_tokens=False)


def attempt(proof: str, preamble: str = "", policy: VerificationPolicy | None = None) -> Attempt:
    return Attempt(
        name="t",
        header=HEADER,
        formal_statement=STMT,
        proof=proof,
        preamble=preamble,
        policy=policy or VerificationPolicy(),
        id="t/0",
    )


def report(**kw: Any) -> list[dict]:
    """The check step's messages, as the REPL returns them for the trusted #eval."""
    body = {
        "nonce": NONCE,
        "status": "ok",
        "detail": "",
        "kind": "theorem",
        "ref_kind": "theorem",
        "axioms": ["propext"],
        "constants": ["t"],
        "replayed": True,  # the clean checker replays by default
    }
    body.update(kw)
    return [
        {
            "severity": "info",
            "pos": {"line": 1, "column": 0},
            "endPos": {"line": 1, "column": 5},
            "data": "LEANRL-CHECK " + json.dumps(body),
        }
    ]


def judge(a: Attempt, elab: dict | None = None, check: list[dict] | None = None) -> Verdict:
    """Pre-scan, then the elaboration answer, then the check report (the pool's order)."""
    v = judge_prescan(a)
    if v is not None:
        return v
    ans = parse_response(elab if elab is not None else {"env": 7})
    assert isinstance(ans, CommandResponse | ReplError)
    v, messages = judge_elaboration(a, assemble(a), ans)
    if v is not None:
        return v
    ck = parse_response({"messages": check if check is not None else report(), "env": 9})
    assert isinstance(ck, CommandResponse)
    return judge_report(a, parse_report(ck.messages, NONCE), messages)


def sorry_answer(line: int, column: int) -> dict:
    """What the REPL answers for a declaration with a tactic `sorry` at line:column."""
    return {
        "sorries": [
            {
                "proofState": 0,
                "pos": {"line": line, "column": column},
                "goal": "a b : ℕ\nh : a = b\n⊢ b = a",
                "endPos": {"line": line, "column": column + 5},
            }
        ],
        "messages": [
            {
                "severity": "warning",
                "pos": {"line": 1, "column": 8},
                "endPos": {"line": 1, "column": 9},
                "data": "declaration uses `sorry`",
            }
        ],
        "env": 7,
    }


# -- valid proofs are accepted -------------------------------------------------------------------


def test_plain_proof_is_accepted() -> None:
    v = judge(attempt("exact h.symm"))
    assert v.accepted and v.reason is Reason.OK and v.axioms == ("propext",)


def test_helper_lemmas_are_accepted() -> None:
    pre = (
        "lemma helper_symm (x y : ℕ) (hxy : x = y) : y = x := by\n  exact hxy.symm\n\n"
        "theorem my_macro_free_elaboration_lemma : True := trivial"
    )
    v = judge(attempt("exact helper_symm a b h", pre), check=report(constants=["helper_symm", "t"]))
    assert v.accepted, v.detail


def test_classical_proof_is_accepted() -> None:
    axioms = ["propext", "Classical.choice", "Quot.sound"]
    v = judge(attempt("by_contra hne\n  exact hne h.symm"), check=report(axioms=axioms))
    assert v.accepted and set(v.axioms) == set(axioms)


def test_long_proof_is_accepted() -> None:
    steps = "\n".join(f"  have h{i} : {i} + 0 = {i} := by norm_num" for i in range(400))
    v = judge(attempt(steps + "\n  exact h.symm"))
    assert v.accepted


def test_near_miss_identifiers_and_comments_are_not_flagged() -> None:
    proof = (
        "-- no sorry here, and no admit either; by the axiom of choice; import nothing\n"
        "  /- we do not use native_decide -/\n"
        "  have h_elab := h\n  have syntax_ok : True := trivial\n"
        "  have macro' := h_elab\n  exact macro'.symm"
    )
    v = judge(attempt(proof))
    assert v.accepted, v.detail


def test_statement_placeholder_sorry_is_not_the_models() -> None:
    # PutnamBench: `abbrev ..._solution : ℕ := sorry` is part of the trusted statement.
    a = Attempt(
        name="p",
        header=HEADER,
        formal_statement="abbrev p_solution : ℕ := sorry\ntheorem p : p_solution = p_solution := by",
        proof="rfl",
    )
    elab = sorry_answer(1, 25)
    v = judge(a, elab, report(kind="theorem"))
    assert v.accepted, v.detail


def test_native_decide_accepted_when_the_taskset_allows_it() -> None:
    pol = VerificationPolicy(allow_native_decide=True)
    v = judge(attempt("native_decide", policy=pol), check=report(axioms=["Lean.ofReduceBool"]))
    assert v.accepted


# -- errors, timeouts of the statement itself ---------------------------------------------------


def test_lean_error_is_rejected_with_position() -> None:
    elab = {
        "messages": [
            {
                "severity": "error",
                "pos": {"line": 2, "column": 2},
                "endPos": {"line": 2, "column": 9},
                "data": "unknown identifier 'nonsense'",
            }
        ],
        "env": 7,
    }
    v = judge(attempt("exact nonsense"), elab)
    assert v.reason is Reason.ERROR and "line 2:2" in v.detail and v.messages[0].pos is not None


def test_kernel_error_is_rejected() -> None:
    elab = {
        "messages": [
            {
                "severity": "error",
                "pos": {"line": 1, "column": 0},
                "endPos": {"line": 1, "column": 7},
                "data": "(kernel) application type mismatch",
            }
        ],
        "env": 7,
    }
    assert judge(attempt("exact h.symm"), elab).reason is Reason.ERROR


def test_repl_lean_error_answer_is_rejected() -> None:
    v = judge(attempt("exact h.symm"), {"message": "Lean error:\n<input>:1:1: unknown tactic"})
    assert v.reason is Reason.ERROR and "unknown tactic" in v.messages[0].data


def test_empty_proof() -> None:
    assert judge(attempt("   ")).reason is Reason.NO_PROOF


# -- sorry -----------------------------------------------------------------------------------


def test_cheat_sorry_prescan() -> None:
    v = judge(attempt("sorry"))
    assert v.reason is Reason.SORRY and "pre-scan" in v.detail


def test_cheat_sorry_structured_sorries_list() -> None:
    v = judge(attempt("sorry", policy=NO_SCAN), sorry_answer(2, 2))
    assert v.reason is Reason.SORRY and "line 2:2" in v.detail


def test_cheat_admit() -> None:
    assert judge(attempt("admit")).reason is Reason.SORRY
    v = judge(attempt("admit", policy=NO_SCAN), check=report(axioms=["propext", "sorryAx"]))
    assert v.reason is Reason.SORRY


def test_cheat_sorry_in_helper_lemma() -> None:
    pre = "theorem helper : False := sorry"
    assert judge(attempt("exact helper.elim", pre)).reason is Reason.SORRY
    # Without the pre-scan: the REPL lists the helper's sorry (line 1, outside the statement).
    v = judge(attempt("exact helper.elim", pre, NO_SCAN), sorry_answer(1, 26))
    assert v.reason is Reason.SORRY


def test_cheat_sorry_through_opaque_helper_seen_only_by_axioms() -> None:
    # A term-mode sorry the REPL does not list (no expected type): only sorryAx gives it away.
    pre = "opaque magic : False"
    v = judge(attempt("exact magic.elim", pre, NO_SCAN), check=report(axioms=["sorryAx"]))
    assert v.reason is Reason.SORRY


# -- axioms ----------------------------------------------------------------------------------


def test_cheat_user_axiom() -> None:
    pre = "axiom cheat : False"
    assert judge(attempt("exact cheat.elim", pre)).reason is Reason.AXIOM
    v = judge(attempt("exact cheat.elim", pre, NO_SCAN), check=report(axioms=["propext", "cheat"]))
    assert v.reason is Reason.AXIOM and "cheat" in v.detail


def test_sorry_ax_is_never_allowed_even_if_listed() -> None:
    pol = VerificationPolicy(allowed_axioms=("propext", "sorryAx"), forbid_tokens=False)
    v = judge(attempt("exact h.symm", policy=pol), check=report(axioms=["sorryAx"]))
    assert v.reason is Reason.SORRY


def test_custom_allowed_axioms() -> None:
    pol = VerificationPolicy(allowed_axioms=("propext",))
    v = judge(attempt("exact h.symm", policy=pol), check=report(axioms=["Classical.choice"]))
    assert v.reason is Reason.AXIOM


# -- native code -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "proof",
    [
        "native_decide",
        "exact Lean.ofReduceBool _ _ rfl",
        "exact Lean.trustCompiler",
        "decide +native",
        "decide (config := { native := true })",
    ],
)
def test_cheat_native_prescan(proof: str) -> None:
    assert judge(attempt(proof)).reason is Reason.NATIVE


@pytest.mark.parametrize("ax", ["Lean.ofReduceBool", "Lean.ofReduceNat", "Lean.trustCompiler"])
def test_cheat_native_by_axioms(ax: str) -> None:
    v = judge(attempt("native_decide", policy=NO_SCAN), check=report(axioms=["propext", ax]))
    assert v.reason is Reason.NATIVE


# -- switching off or faking the checks ---------------------------------------------------------


@pytest.mark.parametrize(
    ("preamble", "proof"),
    [
        ("#exit", "exact h.symm"),
        ("set_option debug.skipKernelTC true in\ntheorem x : False := by simp", "exact h.symm"),
        ("set_option «debug».«skipKernelTC» true", "exact h.symm"),
        ('macro_rules | `(#print axioms $x) => `(#eval IO.println "no axioms")', "exact h.symm"),
        ('elab "fake" : tactic => pure ()', "fake"),
        ('syntax "fake" : tactic', "exact h.symm"),
        ("@[implemented_by foo] def bar : Nat := 0", "exact h.symm"),
        ('@[extern "c_fn"] def bar : Nat := 0', "exact h.symm"),
        ("@[csimp] theorem bad : @Nat.add = @Nat.mul := sorry", "exact h.symm"),
        ("run_cmd Lean.modifyEnv id", "exact h.symm"),
        ('#eval IO.println "LEANRL-CHECK {\\"status\\": \\"ok\\"}"', "exact h.symm"),
        ("initialize counter : IO.Ref Nat ← IO.mkRef 0", "exact h.symm"),
        (
            "@[command_elab Lean.Parser.Command.check] def e : Lean.Elab.Command.CommandElab := fun _ => pure ()",
            "exact h.symm",
        ),
        ("unsafe def f : Nat := 0", "exact h.symm"),
        ("", "run_tac Lean.Elab.Tactic.evalTactic (← `(tactic| rfl))"),
        ("", "exact by_elab Lean.mkConst ``True.intro"),
        ("import Mathlib.Tactic", "exact h.symm"),
        ("attribute [tactic Lean.Parser.Tactic.rfl] myTac", "exact h.symm"),
    ],
)
def test_cheat_forbidden_constructs_prescan(preamble: str, proof: str) -> None:
    v = judge(attempt(proof, preamble))
    assert v.reason is Reason.FORBIDDEN, (preamble, proof, v.reason, v.detail)
    assert "pre-scan" in v.detail


def test_cheat_exit_without_prescan_loses_the_theorem() -> None:
    # `#exit` stops elaboration before the statement: the trusted check finds no theorem.
    a = attempt("exact h.symm", "#exit", NO_SCAN)
    v = judge(a, {"env": 7}, report(status="missing", kind="missing", detail="no declaration t"))
    assert v.reason is Reason.STATEMENT_CHANGED


def test_cheat_printed_fake_report_is_ignored() -> None:
    # The attempt prints a perfect-looking report; it lands in the attempt's own answer. The
    # check step's separate answer (from the clean environment) says sorry.
    fake = report()[0]
    a = attempt("exact h.symm", '#eval IO.println "..."', NO_SCAN)
    v = judge(a, {"messages": [fake], "env": 7}, report(axioms=["sorryAx"]))
    assert v.reason is Reason.SORRY


def test_cheat_fake_report_with_wrong_nonce_in_check_answer() -> None:
    bad = report()
    bad[0]["data"] = bad[0]["data"].replace(NONCE, "f" * 32)
    v = judge(attempt("exact h.symm"), check=bad)
    assert not v.accepted and v.reason is Reason.INFRA and "nonce" in v.detail


def test_two_reports_in_check_answer_are_rejected() -> None:
    v = judge(attempt("exact h.symm"), check=report() + report())
    assert not v.accepted and "2 reports" in v.detail


def test_check_that_errored_is_rejected() -> None:
    err = {"severity": "error", "pos": {"line": 1, "column": 0}, "data": "unknown constant"}
    v = judge(attempt("exact h.symm"), check=[err, *report()])
    assert not v.accepted and v.reason is Reason.INFRA


def test_no_report_at_all_is_rejected() -> None:
    v = judge(attempt("exact h.symm"), check=[])
    assert not v.accepted and v.reason is Reason.INFRA


def test_cheat_metaprogram_added_unchecked_declaration_caught_by_replay() -> None:
    pol = VerificationPolicy(forbid_tokens=False)
    rep = report(status="replay_failed", detail="kernel rejected t: (kernel) type mismatch")
    v = judge(attempt("exact h.symm", "run_cmd addFakeDecl", pol), check=rep)
    assert v.reason is Reason.FORBIDDEN and "kernel rejected" in v.detail


def test_kernel_replay_is_required_by_default() -> None:
    pol = VerificationPolicy()
    assert pol.kernel_replay and not pol.trust_elaboration
    v = judge(attempt("exact h.symm", policy=pol), check=report(replayed=False))
    assert not v.accepted and v.reason is Reason.INFRA
    ok = judge(attempt("exact h.symm", policy=pol), check=report(replayed=True))
    assert ok.accepted


def test_trusting_elaboration_skips_the_replay_requirement() -> None:
    pol = VerificationPolicy(trust_elaboration=True)
    assert not pol.kernel_replay
    v = judge(attempt("exact h.symm", policy=pol), check=report(replayed=False))
    assert v.accepted


def test_old_kernel_replay_flag_maps_to_trust_elaboration() -> None:
    assert VerificationPolicy.model_validate({"kernel_replay": True}).kernel_replay
    with pytest.warns(DeprecationWarning, match="trust_elaboration"):
        old = VerificationPolicy.model_validate({"kernel_replay": False})
    assert old.trust_elaboration


def test_native_auxiliary_axioms_reported_by_the_checker_are_native() -> None:
    # Recent `native_decide` leaves an auxiliary axiom of the proof's own; the checker reports
    # it in `native` (by its shape), and the policy treats it like Lean.ofReduceBool.
    aux = "t._native.native_decide.ax_1_1"
    rep = report(axioms=["propext", aux], new_axioms=[aux], native=[aux])
    v = judge(attempt("exact h.symm"), check=rep)
    assert v.reason is Reason.NATIVE and aux in v.detail
    ok = judge(
        attempt("exact h.symm", policy=VerificationPolicy(allow_native_decide=True)), check=rep
    )
    assert ok.accepted, ok.detail


def test_an_axiom_merely_named_like_a_native_one_is_an_axiom() -> None:
    # The name alone proves nothing: only what the checker classified as native counts.
    fake = "t._native.native_decide.ax_1_1"
    pol = VerificationPolicy(allow_native_decide=True)
    v = judge(
        attempt("exact h.symm", policy=pol),
        check=report(axioms=[fake], new_axioms=[fake], native=[]),
    )
    assert v.reason is Reason.AXIOM and fake in v.detail and "declares its own" in v.detail


@pytest.mark.parametrize("name", ["propext", "Classical.choice", "Quot.sound", "sorryAx"])
def test_an_axiom_the_attempt_declares_is_refused_whatever_its_name(name: str) -> None:
    # A file can hold a `Name` spelled `propext` whose stored hash is wrong: the checker rebuilds
    # every name (so the clean environment's lookup is honest) and reports an axiom it did not
    # find there as declared by the attempt. Its spelling must not let it through the allow-list.
    rep = report(axioms=[name], new_axioms=[name])
    for pol in (VerificationPolicy(), VerificationPolicy(allow_native_decide=True)):
        v = judge(attempt("exact h.symm", policy=pol), check=rep)
        assert not v.accepted
        assert v.reason in (Reason.AXIOM, Reason.SORRY)
        if name != "sorryAx":
            assert v.reason is Reason.AXIOM and "declares its own axiom" in v.detail


def test_a_taskset_cannot_allow_an_axiom_the_proof_declares() -> None:
    # `allowed_axioms` names axioms of the clean environment (the header's, the taskset's); the
    # same name declared by the proof is a different axiom, and is refused.
    pol = VerificationPolicy(allowed_axioms=("propext", "Classical.choice", "Quot.sound", "myAx"))
    v = judge(
        attempt("exact h.symm", policy=pol), check=report(axioms=["myAx"], new_axioms=["myAx"])
    )
    assert v.reason is Reason.AXIOM and "myAx" in v.detail
    ok = judge(attempt("exact h.symm", policy=pol), check=report(axioms=["myAx"]))
    assert ok.accepted, ok.detail


def test_replay_needing_compiled_code_is_native_not_tampering() -> None:
    rep = report(status="replay_failed", uses_reduce=True, detail="(kernel) failed to evaluate")
    for pol in (VerificationPolicy(), VerificationPolicy(allow_native_decide=True)):
        v = judge(attempt("exact h.symm", policy=pol), check=rep)
        assert v.reason is Reason.NATIVE and "cannot be replayed" in v.detail


def test_a_restatement_keeps_the_references_placeholders_out_of_the_prescan() -> None:
    # PutnamBench: the extractor copies the reference's `abbrev ... := sorry` into the model's
    # restatement; that `sorry` is the taskset's, the rest of the restatement is the model's.
    stmt = "abbrev p_solution : ℕ := sorry\ntheorem p : p_solution = p_solution := by"
    a = Attempt(
        name="p",
        header=HEADER,
        formal_statement=stmt,
        restated_statement="abbrev p_solution : ℕ := sorry\ntheorem p : (p_solution = p_solution) := by",
        proof="rfl",
    )
    assert judge_prescan(a) is None
    sneaky = a.model_copy(
        update={"restated_statement": stmt.replace("theorem p", "theorem p (h : sorry)")}
    )
    v = judge_prescan(sneaky)
    assert v is not None and v.reason is Reason.SORRY


def test_policy_fields_reach_the_prescan() -> None:
    notation = 'local notation "‖" x "‖" => x + 1'
    assert judge_prescan(attempt("rfl", notation)) is not None
    assert judge_prescan(attempt("rfl", notation, VerificationPolicy(allow_notation=True))) is None
    attr = "@[my_attr] theorem helper : True := trivial"
    assert judge_prescan(attempt("rfl", attr)) is not None
    waived = VerificationPolicy(prescan_allow=("@[my_attr]",))
    assert judge_prescan(attempt("rfl", attr, waived)) is None


def test_new_inductive_types_are_refused_unless_allowed() -> None:
    rep = report(inductives=["MyNat"])
    v = judge(attempt("exact h.symm"), check=rep)
    assert v.reason is Reason.FORBIDDEN and "MyNat" in v.detail and "lean4#14576" in v.detail
    pol = VerificationPolicy(allow_new_inductives=True)
    assert judge(attempt("exact h.symm", policy=pol), check=rep).accepted


def test_oversized_model_text_is_rejected_before_lean() -> None:
    pol = VerificationPolicy(max_proof_chars=100)
    v = judge_prescan(attempt("simp\n" * 50, policy=pol))
    assert v is not None and v.reason is Reason.TOO_LARGE and "max_proof_chars" in v.detail


def test_cheat_dangling_reference_means_tampering() -> None:
    rep = report(status="missing_dependency", detail="depends on unknown constants #[ghost]")
    assert judge(attempt("exact h.symm"), check=rep).reason is Reason.FORBIDDEN


# -- the statement must not change -------------------------------------------------------------


@pytest.mark.parametrize(
    ("preamble", "status"),
    [
        ("open Real in", "type_mismatch"),  # `open ... in` changing how names resolve
        ("namespace Foo", "missing"),  # theorem becomes Foo.t
        ('local notation a " = " b => True', "type_mismatch"),  # notation changing meaning
        ("instance : Add ℕ := ⟨fun _ _ => 0⟩", "type_mismatch"),  # arithmetic overridden
        ("variable (hf : False)", "type_mismatch"),  # an extra hypothesis
        ("universe u", "type_mismatch"),
    ],
)
def test_cheat_statement_changed(preamble: str, status: str) -> None:
    rep = report(status=status, detail="the type of t differs from the reference statement's")
    # Notation commands are refused by the pre-scan already (see the next test); with it off,
    # the trusted checker still sees the changed statement.
    policy = NO_SCAN if "notation" in preamble else None
    v = judge(attempt("exact h.symm", preamble, policy), check=rep)
    assert v.reason is Reason.STATEMENT_CHANGED, (preamble, v.detail)


def test_notation_is_refused_by_the_prescan() -> None:
    v = judge(attempt("exact h.symm", 'local notation a " = " b => True'))
    assert v.reason is Reason.FORBIDDEN and "`notation`" in v.detail


def test_cheat_theorem_replaced_by_def() -> None:
    rep = report(status="wrong_kind", kind="def", detail="t is a def, the reference is a theorem")
    assert judge(attempt("exact h.symm"), check=rep).reason is Reason.STATEMENT_CHANGED


def test_cheat_kind_disagreement_even_if_status_ok() -> None:
    rep = report(status="ok", kind="def")
    assert judge(attempt("exact h.symm"), check=rep).reason is Reason.STATEMENT_CHANGED


def test_cheat_statement_helper_redefined() -> None:
    rep = report(status="helper_mismatch", detail="p_solution is declared differently")
    assert judge(attempt("exact h.symm"), check=rep).reason is Reason.STATEMENT_CHANGED


def test_reference_missing_is_infra_not_accepted() -> None:
    v = judge(attempt("exact h.symm"), check=report(status="no_reference"))
    assert not v.accepted and v.reason is Reason.INFRA


# -- text assembly -----------------------------------------------------------------------------


def test_assembly_matches_task_lean_text_and_locates_the_statement() -> None:
    from leanrl.task import Task

    a = attempt("exact h.symm", "lemma l : True := trivial")
    asm = assemble(a)
    task = Task(name="t", header=HEADER, formal_statement=STMT)
    assert HEADER + asm.text == task.lean_text("exact h.symm", "lemma l : True := trivial")
    assert asm.statement_lines == (3, 3) and asm.proof_line == 4
    assert asm.text.splitlines()[2] == STMT


def test_header_split() -> None:
    imports, rest = split_header(HEADER)
    assert imports == ["import Lean", "import Mathlib", "import Aesop"]
    assert rest == "set_option maxHeartbeats 400000\nopen BigOperators Real Nat"
    assert split_header("")[0] == ["import Lean"]
    commented = "/- Copyright\n  2024 -/\n-- a note\nimport Mathlib\nimport Lean\n\nopen Nat\n"
    assert split_header(commented) == (["import Mathlib", "import Lean"], "open Nat")


def test_check_command_matches_the_checker_signature() -> None:
    import re

    from leanrl.lean.trust.report import (
        CHECKER_FILES,
        RESTATE_HEARTBEATS,
        check_command,
        checker_source,
    )

    src = checker_source()
    # one namespace block per file, the files in order, nothing outside them
    assert src.count("namespace LeanrlCheck") == len(CHECKER_FILES) == 2
    assert src.count("end LeanrlCheck") == 2 and src.rstrip().endswith("end LeanrlCheck")
    sig = re.search(r"^def run ((?:\([^)]*\)\s*)+): CoreM Unit", src, re.MULTILINE)
    assert sig is not None
    arity = sum(
        len(group.split(":")[0].split()) for group in re.findall(r"\(([^)]*)\)", sig.group(1))
    )
    cmd = check_command('/tmp/a "b".olean', "t", "ab12", olean=True, replay=False)
    assert cmd.startswith("#eval LeanrlCheck.run ")
    args = re.findall(r'"(?:[^"\\]|\\.)*"|\btrue\b|\bfalse\b|\b\d+\b(?= )', cmd)
    assert len(args) == arity == 6
    assert args[0] == '"/tmp/a \\"b\\".olean"'
    assert args[-1] == str(RESTATE_HEARTBEATS)


def test_every_benchmark_row_splits_and_assembles(data_roots: list[Path]) -> None:
    files = ["minif2f.jsonl", "minif2f_deepseek.jsonl", "proofnet.jsonl", "putnambench.jsonl"]
    n = 0
    for root, name in ((r, f) for r in data_roots for f in files):
        for line in (root / name).read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            imports, rest = split_header(row["header"])
            assert imports[0] == "import Lean" and all(i.startswith("import ") for i in imports)
            assert "import" not in rest
            a = Attempt(
                name=row["name"],
                header=row["header"],
                formal_statement=row["formal_statement"],
                proof="simp",
                preamble="lemma helper : True := trivial",
            )
            asm = assemble(a)
            first, last = asm.statement_lines
            lines = asm.text.splitlines()
            assert lines[first - 1 : last] == row["formal_statement"].rstrip().splitlines()
            assert lines[asm.proof_line - 1] == "  simp"
            n += 1
    assert n >= 30 + (1500 if len(data_roots) > 1 else 0)


def test_a_comment_after_an_import_is_not_a_module() -> None:
    imports, rest = split_header("import Mathlib -- everything\nimport Aesop\nopen Real\n")
    assert imports == ["import Lean", "import Mathlib", "import Aesop"] and rest == "open Real"


def test_the_checker_reports_every_field_the_policy_reads() -> None:
    # Lean and Python must agree on the report's keys: a field the checker never writes would
    # silently keep its default (an empty `new_axioms` would let a declared `propext` through).
    import re

    from leanrl.lean.trust.report import CheckReport, checker_source

    obj = checker_source()[checker_source().index("Json.mkObj [") :]
    written = set(re.findall(r'\("([a-z_]+)", ', obj[: obj.index("logInfo")]))
    assert written == set(CheckReport.model_fields) - {"extra"}


def test_the_checker_rebuilds_the_file_before_reading_it() -> None:
    # Cached hashes and flags in the attempt's file are forged data: `run` must rebuild every
    # constant before its first lookup (the lean-marked test forges one for real).
    from leanrl.lean.trust.report import checker_source

    src = checker_source()
    prep = src[src.index("def prepare (") : src.index("def logReport (")]
    assert "rebuild (← if olean then readOlean path else readReplPickle path)" in prep
    assert prep.index("rebuild (") < min(prep.index("byName"), prep.index("env.find?"))
    # both checks read the file only through `prepare`, before anything else
    for check in ("def run (", "def runFile ("):
        body = src[src.index(check) :]
        assert "readReplPickle" not in body.split("\ndef ", 1)[0]
        assert body.index("← prepare path olean") < body.index("lookNew")
    body = src[src.index("def run (") :]
    assert "partial def walk" not in src  # an explicit stack: no recursion depth to exhaust
    # every number is canonicalised (a big-number object with a small value proves
    # `true = false` through the kernel's Nat.beq), and shared constants come from the clean env
    for use in ("(.natVal (rbNat k))", "let k := rbNat i", "Name.num (← rbName p) (rbNat i)"):
        assert use in src, use
    look = body[body.index("let look : Name → Option ConstantInfo") :]
    assert look.index("env.find? n") < look.index("lookNew n")


# -- the target's own proof, through the kernel (issue 19) ---------------------------------------


def test_a_restatement_the_kernel_found_equal_is_accepted() -> None:
    # `status: ok` with `restated`: the kernel decided the attempt's statement is
    # definitionally equal to the reference's and checked the proof against the reference.
    v = judge(attempt("exact h.symm"), check=report(restated=True))
    assert v.accepted, v.detail


def test_a_restatement_the_kernel_found_different_is_a_changed_statement() -> None:
    rep = report(
        status="type_mismatch",
        restated=True,
        detail="the restated type of t is not definitionally equal to the reference statement's",
    )
    v = judge(attempt("exact h.symm"), check=rep)
    assert v.reason is Reason.STATEMENT_CHANGED and "definitionally" in v.detail


def test_a_forged_target_whose_proof_the_kernel_rejects_is_tampering() -> None:
    # The attempt added its target without the kernel, with a body that proves nothing: the
    # judge gives the kernel `fresh : <reference's type> := <attempt's value>`, which fails.
    rep = report(
        status="replay_failed",
        replayed=False,
        detail="kernel rejected t's proof of the reference statement: type mismatch",
    )
    v = judge(attempt("exact h.symm", policy=NO_SCAN), check=rep)
    assert v.reason is Reason.FORBIDDEN and "proof of the reference statement" in v.detail


@pytest.mark.parametrize(
    ("status", "issue"),
    [
        ("free_variable", "lean4#14484"),
        ("metavariable", "metavariable"),
        ("loose_bvar", "loose bound variable"),
        ("bad_projection", "lean4#12746"),
        ("not_safe", "lean4#14608"),
        ("kernel_internal_name", "lean4#14616"),
        ("too_deep", "lean4#8554"),
    ],
)
def test_shapes_that_reach_kernel_bugs_are_refused_before_the_kernel(
    status: str, issue: str
) -> None:
    rep = report(status=status, replayed=False, detail="cheat contains it")
    v = judge(attempt("exact h.symm", policy=NO_SCAN), check=rep)
    assert v.reason is Reason.FORBIDDEN, v.detail
    assert status in v.detail and issue in v.detail and "cheat contains it" in v.detail
