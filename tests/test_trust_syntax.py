"""The deny-by-default pre-scan (leanrl/lean/trust/syntax.py): attacks an RL policy could write,
each refused for its documented reason with the construct named, and valid proofs (including
comments and strings full of trigger words) accepted. Everything runs through `judge_prescan`,
the function the runtimes call before Lean runs."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from leanrl.harnesses.whole_proof.extract import extract_proof
from leanrl.lean.tactic_input import prescan_tactic
from leanrl.lean.trust.lexer import Kind, tokenize
from leanrl.lean.trust.rules import judge_prescan
from leanrl.lean.trust.syntax import scan
from leanrl.task import Task
from leanrl.verdict import Attempt, Reason, VerificationPolicy

STMT = "theorem t (a b : ℕ) (h : a = b) : b = a := by"

F, N, S, A = Reason.FORBIDDEN, Reason.NATIVE, Reason.SORRY, Reason.AXIOM


def verdict(proof: str, preamble: str = "", policy: VerificationPolicy | None = None):  # type: ignore[no-untyped-def]
    a = Attempt(
        name="t",
        header="import Mathlib\n",
        formal_statement=STMT,
        proof=proof,
        preamble=preamble,
        policy=policy or VerificationPolicy(),
    )
    return judge_prescan(a)


# (id, preamble, proof, reason, the construct as the detail names it)
ATTACKS: list[tuple[str, str, str, Reason, str]] = [
    # -- code that runs while Lean elaborates the attempt ----------------------------------------
    (
        "simproc",
        "simproc evil (_ + _) := fun _ => return .continue",
        "simp",
        F,
        "simproc",
    ),
    ("dsimproc", "dsimproc evil (_ + _) := fun _ => return .continue", "simp", F, "dsimproc"),
    (
        "simproc_decl",
        "simproc_decl evil (_ + _) := fun _ => return .continue",
        "rfl",
        F,
        "simproc_decl",
    ),
    (
        "simproc attribute",
        "@[simproc] def evil : Nat := 0",
        "simp",
        F,
        "@[simproc]",
    ),
    (
        "aesop tactic rule",
        "@[aesop safe tactic] def myTac : Nat := 0",
        "aesop",
        F,
        "@[aesop]",
    ),
    ("aesop local tactic clause", "", "aesop (add safe tactic myTac)", F, "tactic"),
    (
        "aesop rule set attribute",
        "attribute [local aesop safe apply] foo",
        "aesop",
        F,
        "attribute [aesop]",
    ),
    (
        "norm_num extension",
        "@[norm_num _ + _] def evalEvil : Nat := 0",
        "norm_num",
        F,
        "@[norm_num]",
    ),
    (
        "positivity extension",
        "@[positivity _] def evalPos : Nat := 0",
        "positivity",
        F,
        "@[positivity]",
    ),
    ("#guard", "#guard 1 = 1", "exact h.symm", F, "#guard"),
    (
        "#guard_msgs swallowing errors",
        "#guard_msgs (drop all) in\nexample : 1 = 2 := by decide",
        "exact h.symm",
        F,
        "#guard_msgs",
    ),
    ("delaborator", "@[delab app.Nat.add] def d : Nat := 0", "exact h.symm", F, "@[delab]"),
    (
        "app_unexpander",
        "@[app_unexpander Nat.add] def u : Nat := 0",
        "exact h.symm",
        F,
        "@[app_unexpander]",
    ),
    (
        "command parser attribute",
        "@[command_parser] def p : Nat := 0",
        "rfl",
        F,
        "@[command_parser]",
    ),
    (
        "any *_parser attribute",
        "attribute [tactic_parser] foo",
        "rfl",
        F,
        "attribute [tactic_parser]",
    ),
    (
        "command elaborator",
        "@[command_elab Lean.Parser.Command.check] def e : Nat := 0",
        "rfl",
        F,
        "@[command_elab]",
    ),
    ("scoped delaborator", "@[scoped delab app.foo] def d : Nat := 0", "rfl", F, "@[delab]"),
    (
        "gcongr_forward extension",
        "@[gcongr_forward] def fwd : Nat := 0",
        "rfl",
        F,
        "@[gcongr_forward]",
    ),
    (
        "nested attribute (attr := ...)",
        "@[to_additive (attr := simproc)] theorem foo : True := trivial",
        "rfl",
        F,
        "(attr := simproc]",
    ),
    (
        "attribute named as data",
        "@[simps (config := {attrs := [`norm_num]})] def foo : Nat × Nat := (1, 2)",
        "rfl",
        F,
        "@[simps … `norm_num]",
    ),
    ("unknown attribute", "@[my_magic] theorem foo : True := trivial", "rfl", F, "@[my_magic]"),
    ("plausible", "", "plausible", F, "plausible"),
    ("slim_check", "", "slim_check", F, "slim_check"),
    ("run_tac", "", "run_tac Lean.Elab.Tactic.evalTactic (← `(tactic| rfl))", F, "run_tac"),
    ("by_elab", "", "exact by_elab Lean.mkConst ``True.intro", F, "by_elab"),
    # -- IO in pure code, and whatever would evaluate it -----------------------------------------
    (
        "EStateM.run does IO without `unsafe`",
        'def leak : Nat := match (IO.getEnv "HF_TOKEN").run () with | _ => 0',
        "exact h.symm",
        F,
        "IO.getEnv",
    ),
    (
        "EStateM.run spelled out",
        'def leak2 : Nat := (EStateM.run (IO.println "x") ()).toString.length',
        "exact h.symm",
        F,
        "EStateM.run",
    ),
    ("#eval evaluates it", "#eval leak", "exact h.symm", F, "#eval"),
    ("#eval! too", "#eval! leak", "exact h.symm", F, "#eval!"),
    ("run_cmd", "run_cmd Lean.modifyEnv id", "exact h.symm", F, "run_cmd"),
    ("run_elab", "run_elab pure ()", "exact h.symm", F, "run_elab"),
    ("run_meta", "run_meta pure ()", "exact h.symm", F, "run_meta"),
    ("initialize", "initialize counter : Nat ← pure 0", "exact h.symm", F, "initialize"),
    ("builtin_initialize", "builtin_initialize pure ()", "exact h.symm", F, "builtin_initialize"),
    # -- adding a theorem without the kernel -------------------------------------------------------
    (
        "addDeclWithoutChecking",
        "def go := Lean.Environment.addDeclWithoutChecking",
        "exact h.symm",
        F,
        "Lean.Environment.addDeclWithoutChecking",
    ),
    (
        "open private",
        "open private addDeclWithoutChecking from Lean.Environment",
        "exact h.symm",
        F,
        "open private",
    ),
    ("export private", "export private foo from Bar", "exact h.symm", F, "export private"),
    # -- the comment/string desync of the old word list -----------------------------------------------
    ("a `-- /-` comment hides nothing", "", "-- /-\n  native_decide\n  -- -/", N, "native_decide"),
    ('a "/-" string hides nothing', "", 'have s := "/-"\n  native_decide', N, "native_decide"),
    (
        "a char literal quote hides nothing",
        "",
        "have c := '\"'\n  native_decide\n  -- '\"'",
        N,
        "native_decide",
    ),
    (
        "a string gap ends where Lean ends it",
        "",
        'have s : String := "a\\\n    "\n  native_decide',
        N,
        "native_decide",
    ),
    (
        "a line comment does not continue",
        "",
        "-- trailing backslash \\\n  native_decide",
        N,
        "native_decide",
    ),
    (
        "code inside an interpolated string",
        "",
        'have s := s!"{(by native_decide : 1 = 1)}"',
        N,
        "native_decide",
    ),
    # -- native evaluation, however spelled ------------------------------------------------------------
    ("native_decide", "", "native_decide", N, "native_decide"),
    ("«» spelling", "", "exact «native_decide»", N, "«native_decide»"),
    (
        "_root_.Lean.reduceBool",
        "",
        "exact _root_.Lean.reduceBool true",
        N,
        "_root_.Lean.reduceBool",
    ),
    ("@Lean.ofReduceBool", "", "exact @Lean.ofReduceBool _ _ rfl", N, "Lean.ofReduceBool"),
    ("«» component", "", "exact Lean.«reduceNat» 1", N, "Lean.«reduceNat»"),
    ("via open Lean", "", "open Lean in exact ofReduceBool _ _ rfl", N, "ofReduceBool"),
    (
        "trustCompiler name literal",
        "",
        "exact mkConst `Lean.trustCompiler",
        N,
        "`Lean.trustCompiler",
    ),
    ("decide +native", "", "decide +native", N, "decide +native"),
    ("decide config", "", "decide (config := { native := true })", N, "native :="),
    (
        "native_decide auxiliary axiom",
        "",
        "exact t._native.native_decide.ax_1",
        N,
        "t._native.native_decide.ax_1",
    ),
    ("bv_decide rests on ofReduceBool", "", "bv_decide", N, "bv_decide"),
    # -- switching the checks off -------------------------------------------------------------------------
    (
        "skipKernelTC",
        "set_option debug.skipKernelTC true",
        "exact h.symm",
        F,
        "set_option debug.skipKernelTC",
    ),
    (
        "skipKernelTC «»-quoted, in",
        "set_option «debug».«skipKernelTC» true in\ntheorem x : False := sorry",
        "exact h.symm",
        F,
        "set_option «debug».«skipKernelTC»",
    ),
    (
        "byAsSorry",
        "set_option debug.byAsSorry true",
        "exact h.symm",
        F,
        "set_option debug.byAsSorry",
    ),
    (
        "option inside a tactic block",
        "",
        "set_option debug.skipKernelTC true in\n  exact h.symm",
        F,
        "set_option debug.skipKernelTC",
    ),
    (
        "unsafe reducibility",
        "set_option allowUnsafeReducibility true",
        "rfl",
        F,
        "set_option allowUnsafeReducibility",
    ),
    ("unknown option", "set_option hygiene false", "rfl", F, "set_option hygiene"),
    ("#exit", "#exit", "exact h.symm", F, "#exit"),
    ("unknown # command at a line start", "#my_command foo", "rfl", F, "#my_command"),
    (
        "#print of a forged report",
        '#print "LEANRL-CHECK {\\"status\\": \\"ok\\"}"',
        "rfl",
        F,
        "#print",
    ),
    # -- new syntax -------------------------------------------------------------------------------------------
    (
        "macro redefining theorem",
        'macro "theorem" x:ident : command => `(axiom $x : False)',
        "rfl",
        F,
        "macro",
    ),
    ("macro_rules", "macro_rules | `(tactic| rfl) => `(tactic| sorry)", "rfl", F, "macro_rules"),
    ("syntax", 'syntax "evil" : tactic', "rfl", F, "syntax"),
    ("elab", 'elab "evil" : tactic => pure ()', "evil", F, "elab"),
    ("elab_rules", "elab_rules : tactic | `(tactic| rfl) => pure ()", "rfl", F, "elab_rules"),
    ("declare_syntax_cat", "declare_syntax_cat evil", "rfl", F, "declare_syntax_cat"),
    ("notation hijack", 'notation "trivial" => sorry', "exact trivial", F, "notation"),
    ("infixl", 'infixl:65 " +ₑ " => HAdd.hAdd', "rfl", F, "infixl"),
    ("local prefix", 'local prefix:max "√" => Real.sqrt', "rfl", F, "prefix"),
    ("register_simp_attr", "register_simp_attr evil_simps", "rfl", F, "register_simp_attr"),
    ("add_aesop_rules", "add_aesop_rules safe tactic myTac", "rfl", F, "add_aesop_rules"),
    ("import", "import Mathlib.Tactic", "exact h.symm", F, "import"),
    ("init_quot", "init_quot", "rfl", F, "init_quot"),
    ("unif_hint", "unif_hint (n : ℕ) where n =?= 0 ⊢ n + 0 =?= 0", "rfl", F, "unif_hint"),
    # -- compiled code, unsafe code, axioms, sorry -------------------------------------------------------------
    ("implemented_by", "@[implemented_by g] def f : Nat := 0", "rfl", F, "@[implemented_by]"),
    ("extern", '@[extern "c_fn"] def f : Nat := 0', "rfl", F, "@[extern]"),
    ("csimp", "@[csimp] theorem bad : @Nat.add = @Nat.mul := by rfl", "rfl", F, "@[csimp]"),
    ("unsafe def", "unsafe def f : Nat := 0", "rfl", F, "unsafe"),
    ("unsafeCast", "", "exact unsafeCast h", F, "unsafeCast"),
    (
        "meta-program monad",
        "def go : Lean.Elab.Tactic.TacticM Unit := pure ()",
        "rfl",
        F,
        "Lean.Elab.Tactic.TacticM",
    ),
    ("axiom", "axiom cheat : False", "exact cheat.elim", A, "axiom"),
    ("private axiom", "private axiom cheat : False", "exact cheat.elim", A, "axiom"),
    ("sorry", "", "sorry", S, "sorry"),
    ("admit", "", "admit", S, "admit"),
    ("sorryAx", "", "exact sorryAx _ false", S, "sorryAx"),
    ("«sorry»", "", "exact «sorry»", S, "«sorry»"),
    ("sorry in a helper", "theorem helper : False := sorry", "exact helper.elim", S, "sorry"),
    # -- text the pre-scan cannot read exactly -------------------------------------------------------
    ("unterminated comment", "", "exact h.symm /- hide the rest", F, "/- hide the rest"),
    ("comment glued to a symbol", "", "exact h.symm <--- x\n  native_decide", F, "<---"),
    ("ambiguous interpolation", "", 'exact foo "a{"b"}c"', F, '"a{"'),
    ("tab", "", "exact\th.symm", F, "\t"),
]


def test_at_least_forty_distinct_attacks() -> None:
    assert len({a[0] for a in ATTACKS}) == len(ATTACKS) >= 40


@pytest.mark.parametrize(
    ("preamble", "proof", "reason", "construct"),
    [a[1:] for a in ATTACKS],
    ids=[a[0] for a in ATTACKS],
)
def test_attack_is_refused_for_its_reason(
    preamble: str, proof: str, reason: Reason, construct: str
) -> None:
    v = verdict(proof, preamble)
    assert v is not None, "accepted"
    assert (v.reason, v.accepted) == (reason, False), v.detail
    shown = construct.split("\n")[0]
    assert f"`{shown}" in v.detail, v.detail
    assert v.detail.startswith("pre-scan: ")


def test_every_finding_says_why() -> None:
    for _, preamble, proof, _, _ in ATTACKS:
        for f in scan(preamble + "\n" + proof, VerificationPolicy()):
            assert len(f.why) > 30 and f.line >= 1


def test_native_is_allowed_when_the_taskset_allows_it() -> None:
    pol = VerificationPolicy(allow_native_decide=True)
    for proof in [
        "native_decide",
        "decide +native",
        "exact Lean.ofReduceBool _ _ rfl",
        "bv_decide",
    ]:
        assert verdict(proof, policy=pol) is None, proof
    # ... but nothing else is
    assert verdict("sorry", policy=pol).reason is S  # type: ignore[union-attr]


def test_notation_only_when_the_taskset_allows_it() -> None:
    allow = SimpleNamespace(allow_native_decide=False, allow_notation=True)
    text = 'local notation "‖" x "‖₁" => abs x\nexample : ‖(1 : ℤ)‖₁ = 1 := by decide'
    assert scan(text, VerificationPolicy())[0].token == "notation"
    assert scan(text, allow) == []  # type: ignore[arg-type]
    # a notation token with a comment marker or quote would move where comments begin
    bad = scan('notation "x/-" => 1', allow)  # type: ignore[arg-type]
    assert bad and bad[0].reason is F and "comment" in bad[0].why
    # a new token is taken into account: `x/` is one token, so `x/- ... -/` is no comment
    hidden = (
        'notation "x/" => (1 : ℕ)\nexample : True := by\n  have := x/- native_decide -/\n  trivial'
    )
    assert [f.token for f in scan(hidden, allow)] == ["native_decide"]  # type: ignore[arg-type]


def test_a_taskset_can_allow_named_constructs() -> None:
    text = "@[my_attr] theorem foo : True := trivial\nalias bar := foo\nset_option hygiene false"
    strict = [f.token for f in scan(text, VerificationPolicy())]
    assert strict == ["@[my_attr]", "alias", "set_option hygiene"]
    extended = SimpleNamespace(
        allow_native_decide=False,
        prescan_allow=("@[my_attr]", "alias", "set_option hygiene", "sorry", "\t"),
    )
    assert scan(text, extended) == []  # type: ignore[arg-type]
    # sorry and unreadable text stay refused whatever the list says
    assert [f.reason for f in scan("sorry", extended)] == [S]  # type: ignore[arg-type]
    assert [f.reason for f in scan("exact\th", extended)] == [F]  # type: ignore[arg-type]


# -- valid proofs: accepted --------------------------------------------------------------------

CONTROLS: list[tuple[str, str, str]] = [
    (
        "helper lemmas",
        "lemma helper_symm (x y : ℕ) (hxy : x = y) : y = x := by\n  exact hxy.symm\n\n"
        "theorem my_macro_free_elaboration_lemma : True := trivial",
        "exact helper_symm a b h",
    ),
    (
        "calc",
        "",
        "calc b = a := h.symm\n    _ = a + 0 := by simp\n    _ = a := by omega",
    ),
    ("conv", "", "conv_lhs => rw [← h]"),
    ("conv block", "", "conv =>\n    lhs\n    rw [← h]"),
    ("decide omega simp with lemmas", "", "subst h\n  simp [Nat.add_comm, Nat.mul_comm]\n  omega"),
    (
        "tactics named like attributes",
        "",
        "positivity\n  norm_num [h]\n  aesop\n  nlinarith [sq_nonneg (a - b)]",
    ),
    ("«» names", "theorem «my lemma» (x : ℕ) : x = x := rfl", "exact «my lemma» a ▸ h.symm"),
    (
        "comments with every trigger word",
        "-- sorry admit native_decide #eval #exit macro elab syntax import axiom unsafe run_tac\n"
        "/- simproc @[aesop] set_option debug.skipKernelTC true Lean.ofReduceBool /- nested -/ -/\n"
        "/-- doc: `decide +native`, `plausible`, `open private` -/\nlemma l : True := trivial",
        "-- native_decide\n  exact h.symm -- sorry",
    ),
    (
        "strings with every trigger word",
        "",
        'have hs : ("sorry native_decide /- -- admit" : String).length > 0'
        " := by decide\n  exact h.symm",
    ),
    (
        "char literals",
        "",
        "have : 'a' ≠ 'b' := by decide\n  have : '\\'' = '\\'' := rfl\n  exact h.symm",
    ),
    (
        "set_option ... in",
        "set_option maxHeartbeats 400000 in\nlemma l : True := trivial",
        "exact h.symm",
    ),
    ("set_option in a proof", "", "set_option maxRecDepth 1000 in\n  exact h.symm"),
    (
        "options on the allow-list",
        "set_option linter.unusedVariables false\nset_option pp.all true\n"
        "set_option synthInstance.maxHeartbeats 40000\nset_option trace.Meta.synthInstance true",
        "exact h.symm",
    ),
    (
        "@[simp] and friends",
        "@[simp, norm_cast] lemma l (x : ℕ) : x + 0 = x := rfl\n"
        "@[local simp] lemma l2 : True := trivial\nattribute [-simp] Nat.add_eq\n"
        "attribute [local instance] Classical.propDecidable\n@[to_additive (attr := simp)] lemma m : True := trivial",
        "exact h.symm",
    ),
    (
        "namespaces and sections",
        "namespace Foo\nsection\nvariable (n : ℕ)\nuniverse u\nlemma l : n = n := rfl\n"
        "end\nend Foo\nopen Foo\nnoncomputable section\nend",
        "exact h.symm",
    ),
    (
        "open ... in",
        "open Real in\nlemma l : π = π := rfl\nopen scoped BigOperators",
        "open Nat in\n  exact h.symm",
    ),
    (
        "have, show ... from, fun",
        "",
        "have h2 : b = a := h ▸ rfl\n  show b = a from (fun x => x) h2",
    ),
    (
        "pattern matching",
        "def f : ℕ → ℕ\n  | 0 => 0\n  | n + 1 => f n",
        "rcases h with rfl\n  match a with\n  | 0 => rfl\n  | _ + 1 => rfl",
    ),
    (
        "termination_by / decreasing_by",
        "def g (n : ℕ) : ℕ := if n = 0 then 0 else g (n - 1)\n"
        "termination_by n\ndecreasing_by omega",
        "exact h.symm",
    ),
    (
        "declarations",
        "structure P where\n  x : ℕ\n  deriving Repr\ninductive C | a | b\n"
        "abbrev N := ℕ\ninstance : Inhabited P := ⟨⟨0⟩⟩\nprivate lemma p : True := trivial\n"
        "noncomputable def r : ℝ := Real.sqrt 2\nexample : True := trivial\nclass K (α : Type) where\n"
        "  k : α\nopaque o : ℕ\nmutual\ndef ev : ℕ → Bool\n  | 0 => true\n  | n + 1 => od n\n"
        "def od : ℕ → Bool\n  | 0 => false\n  | n + 1 => ev n\nend",
        "exact h.symm",
    ),
    (
        "#check #print #reduce",
        "#check Nat.add_comm\n#print axioms Nat.add_comm\n#print Nat\n#reduce 2 + 2",
        "exact h.symm",
    ),
    (
        "Mathlib tokens",
        "",
        "have : ∑' (n : ℕ), (0 : ℝ) = 0 := by simp\n"
        "  have : (fun x : ℕ => x) '' {1} = {1} := by simp\n  have : (id ⁻¹' {1} : Set ℕ) = {1} := rfl\n"
        "  have : ((2 : ℝ≥0) : ℝ) = 2 := by norm_num\n  exact h.symm",
    ),
    (
        "projections and primes",
        "",
        "have h' := h.symm\n  have x'' : (1, (2, 3)).2.1 = 2 := rfl\n  exact h'",
    ),
    ("card notation mid-line", "", "have : #({1, 2} : Finset ℕ) = 2 := by decide\n  exact h.symm"),
    (
        "first and the native identifier",
        "",
        "first | omega | simp\n  have native : ℕ := 0\n  let native := 1\n  exact h.symm",
    ),
    ("decide kernel switch", "", "decide +kernel"),
]


def test_enough_controls() -> None:
    assert len(CONTROLS) >= 20


@pytest.mark.parametrize(
    ("preamble", "proof"), [c[1:] for c in CONTROLS], ids=[c[0] for c in CONTROLS]
)
def test_valid_proof_is_accepted(preamble: str, proof: str) -> None:
    v = verdict(proof, preamble)
    assert v is None, v.detail if v else ""


def test_tactic_mode_uses_the_same_scan() -> None:
    assert prescan_tactic("-- native_decide\nsimp [foo] -- sorry", VerificationPolicy()) is None
    # what is scanned is what the REPL is sent: tabs become spaces there, so they pass here
    assert prescan_tactic("constructor\n\tsimp\r\n\tsimp", VerificationPolicy()) is None
    why = prescan_tactic('have s := "/-"\nnative_decide', VerificationPolicy())
    assert why is not None and why.startswith("pre-scan (native): `native_decide`")


def test_findings_are_in_text_order_one_per_construct() -> None:
    text = "sorry\nsorry\nnative_decide\n#eval 1"
    got = [(f.reason, f.token, f.line) for f in scan(text, VerificationPolicy())]
    assert got == [(S, "sorry", 1), (N, "native_decide", 3), (F, "#eval", 4)]


# -- a fixture of hand-written valid whole-proof answers ------------------------------------------

FIXTURE = Path(__file__).parent / "data" / "valid_proofs.txt"
HEADER = "import Mathlib\nimport Aesop\n\nopen BigOperators Real Nat Topology Rat\n\n"


def _fixture() -> list[tuple[Task, str]]:
    blocks = FIXTURE.read_text(encoding="utf-8").split("\n=====\n")[1:]
    out = []
    for block in blocks:
        statement, code = block.split("\n-----\n")
        toks = tokenize(statement)
        name = next(toks[k + 1].value for k, t in enumerate(toks) if t.text == "theorem")
        assert toks[0].kind is Kind.IDENT
        out.append((Task(name=name, header=HEADER, formal_statement=statement.strip()), code))
    return out


def test_the_fixture_has_twenty_proofs() -> None:
    assert len(_fixture()) >= 20


@pytest.mark.parametrize(("task", "code"), _fixture(), ids=[t.name for t, _ in _fixture()])
def test_hand_written_valid_proof_passes_extraction_and_prescan(task: Task, code: str) -> None:
    ex = extract_proof(f"Here is the proof.\n```lean4\n{code}\n```\n", task)
    assert ex.reason is None and ex.proof, ex.detail
    # every restatement in the fixture matches the reference up to layout, comments, `«»`
    # and redundant parentheses: the proof goes under the reference statement itself
    assert ex.restated_statement == ""
    attempt = Attempt(
        name=task.name,
        header=task.header,
        formal_statement=task.formal_statement,
        proof=ex.proof,
        preamble=ex.preamble,
    )
    v = judge_prescan(attempt)
    assert v is None, v.detail if v else ""


def test_hostile_structure_gives_findings_not_crashes() -> None:
    # Nested attribute lists and long inputs are read in one pass each.
    found = scan("@[" * 5000 + "simproc" + "]" * 5000, VerificationPolicy())
    assert found and found[0].reason is F
    assert scan("@[simp] " * 5000 + "theorem x : True := trivial", VerificationPolicy()) == []


@pytest.mark.parametrize(
    "text",
    [
        # `logInfo` is an ordinary name here: Lean reads a plain string "{ ", while a lexer that
        # took it for interpolated would hide everything up to a later "}" (found by red-teaming).
        'example (logInfo : String → Nat) : Nat := logInfo "{ "\n'
        "run_cmd pure ()\n"
        'example : String := "}"',
        'theorem h : True := by\n  dbg_trace "{ "\n  native_decide\n  dbg_trace "}"\n  trivial',
        'def f (throwError : String → Nat) : Nat := throwError "{ "\n#eval 1\ndef g := "}"',
    ],
)
def test_a_string_after_a_name_that_sometimes_interpolates_cannot_hide_code(text: str) -> None:
    assert scan(text, VerificationPolicy()), "the hidden command was not found"


def test_a_tactic_configuration_that_runs_the_proofs_own_code_is_refused() -> None:
    """The configuration is evaluated as code (`declare_config_elab`): a definition of the
    proof's own can run `Lean.Elab.runFrontend` through `EStateM` with no forbidden word."""
    text = (
        "def leanrl_steps : Nat := 100000\n"
        "theorem h : 1 + 1 = 2 := by\n  simp (config := { maxSteps := leanrl_steps })"
    )
    (f,) = scan(text, VerificationPolicy())
    assert f.reason is Reason.FORBIDDEN and "leanrl_steps" in f.token
    literal = "theorem h : 1 + 1 = 2 := by\n  simp (config := { maxSteps := 100000 })"
    assert scan(literal, VerificationPolicy()) == []


@pytest.mark.parametrize(
    ("text", "token"),
    [
        # configuration items after the tactic (Lean's `optConfig` syntax)
        ("def f : Nat := 5\nexample : True := by\n  simp (maxSteps := f)", "f"),
        ("def b : Bool := true\nexample : 2 = 2 := by decide (kernel := b)", "b"),
        ("example : True := by simp +contextual (maxSteps := Foo.steps x)", "Foo.steps"),
        # names a word list of the proof's definitions would miss
        (
            "def g : Nat := 1\n  where steps : Nat := 5\n"
            "example : True := by simp (config := { maxSteps := steps })",
            "steps",
        ),
        (
            "namespace A\ndef c : Nat := 1\nend A\nopen A in\nexample : True := by "
            "simp (config := { maxSteps := A.c })",
            "A.c",
        ),
        (
            "instance : Inhabited Simp.Config := ⟨{}⟩\nexample : True := by simp (config := default)",
            "default",
        ),
        ("example : True := by simp (config := Simp.Config.mk 1)", "Simp.Config.mk"),
        ("example : True := by simp (config := ⟨1⟩)", "⟨"),
        ("example : True := by simp (config := { contextual })", "contextual"),
        (
            "example : True := by simp (config := { Simp.neutralConfig with zeta := true })",
            "Simp.neutralConfig",
        ),
        ("example : True := by omega (config := .evil)", "evil"),
        # attribute arguments and other tactics' items
        ("@[simps (config := cfg)] def p : Nat × Nat := (1, 2)", "cfg"),
        ("example : True := by aesop (simp_config := { maxSteps := n })", "n"),
        # a field that is a program: linarith's `discharger : TacticM Unit`
        ("example : 1 < 2 := by linarith (config := { discharger := do pure () })", "do"),
        ("example : 1 < 2 := by linarith (discharger := evalTacticAt stx g)", "evalTacticAt"),
        ("example : 1 < 2 := by linarith (config := { preprocessors := [f] })", "f"),
        # second red team: escaped field names, heads with `*`/`!`/numbers, more tactics
        ("example : True := by simp («config» := cfg)", "cfg"),
        ("example : True := by simp («maxSteps» := f)", "f"),
        ("@[simps («config» := c)] def x : Nat × Nat := (1, 2)", "c"),
        ("example : True := by simp_rw (maxSteps := f) [h]", "f"),
        ("example : True := by solve_by_elim* (maxDepth := f)", "f"),
        ("example : True := by simpa ! (maxSteps := f)", "f"),
        ("example : True := by congr! 2 (closePre := f)", "f"),
        ("example : True := by aesop (options := evil)", "evil"),
        # literals that are not: the text's own instances and names change what they mean
        (
            "instance : OfNat Nat 100000 := ⟨evil⟩\nexample : True := by simp (maxSteps := 100000)",
            "100000",
        ),
        (
            "namespace Foo\ndef true : Bool := evil\nexample : True := by simp (zeta := true)",
            "true",
        ),
        ("def Nat.asFn : Nat := evil\nexample : True := by simp (maxSteps := .asFn)", "asFn"),
        (
            "def g := 1\nwhere\n  true : Bool := evil\nexample : True := by simp (zeta := true)",
            "true",
        ),
    ],
)
def test_a_configuration_value_must_be_a_literal(text: str, token: str) -> None:
    """Lean compiles and runs a configuration value, so anything but a literal in it is code the
    proof controls (its own definitions, `where` helpers, instances, program-valued fields)."""
    found = [f for f in scan(text, VerificationPolicy()) if "config" in f.why.lower()]
    assert found, scan(text, VerificationPolicy())
    assert any(token in f.token for f in found), found
    assert all(f.reason is Reason.FORBIDDEN for f in found)


@pytest.mark.parametrize(
    ("text", "token"),
    [
        ('example : True := ) "\n#eval evil\n--"\ntheorem t : True := trivial', "#eval"),
        ('example : True := ) "x #eval 1 --"', "#eval"),
        ('def s : String := "xdef f : Nat := by native_decide --"', "def"),
        ('def s : String := "@[simp] theorem"', "@["),
        ('def s : String := r"set_option debug.skipKernelTC true in"', "set_option"),
        ("def «x\nrun_cmd evil --» : Nat := 1", "run_cmd"),
        ("exact «h elab_rules : tactic | _ => evil»", "elab_rules"),
        ("/-- A helper.\n#eval evil\n-/\ntheorem t : True := trivial", "#eval"),
        ("/-- A helper.\n  macro x : term => `(1)\n-/\ntheorem t : True := trivial", "macro"),
    ],
)
def test_a_command_hidden_in_a_string_or_name_is_refused(text: str, token: str) -> None:
    """Defence in depth: where Lean fails to lex a string or `«»` name, its error recovery goes
    on character by character inside it, and a command there would run."""
    found = scan(text, VerificationPolicy())
    hidden = [f for f in found if "inside a string" in f.why]
    assert hidden and hidden[0].token.startswith(token), found


@pytest.mark.parametrize(
    "text",
    [
        'def s : String := "hello, world: 2 + 2 = 4"',
        "theorem «my theorem» : True := trivial",
        'def s : String := "undefined, reopened, examples"',
        "/-- The axiom of choice, for example; open and end.\nSee the theorem below. -/\n"
        "theorem t : True := trivial",
    ],
)
def test_strings_names_and_doc_comments_without_commands_pass(text: str) -> None:
    assert scan(text, VerificationPolicy()) == []


@pytest.mark.parametrize(
    "text",
    [
        "example : True := by simp (config := { decide := true, maxSteps := 10 }) [foo]",
        "example : True := by simp_all (config := {decide := true})",
        "example : True := by simp (config := { contextual := true, zeta := false }) at h ⊢",
        "example : True := by simp (config := {})",
        "example : True := by simp (config := { transparency := .reducible, etaStruct := .none })",
        "example : True := by simp? +contextual (maxSteps := 5)",
        "example : True := by decide (kernel := true)",
        "example : True := by rw (occs := .pos [1, 2]) [h]",
        "example : True := by simp (disch := positivity) [h]",
        "example : True := by field_simp (disch := norm_num) [h]",
        "example : True := by exact foo (n := bar) (h := baz)",
        "example : True := by exact padicValNat_factorial (p := (2 : ℕ))",
        "example : True := by omega (config := { splitDisjunctions := false })",
        "example : True := by simp (config := { transparency := Lean.Meta.TransparencyMode.all })",
    ],
)
def test_literal_configurations_and_named_arguments_pass(text: str) -> None:
    assert scan(text, VerificationPolicy()) == []


@pytest.mark.parametrize(
    ("text", "token"),
    [
        (
            'def s : Nat := match (Lean.Elab.runFrontend "" {} "p" `p) () with | _ => 1',
            "runFrontend",
        ),
        ("theorem h : True := by\n  have := eval% (1 + 1 : Nat)\n  trivial", "eval%"),
        (
            'set_option trace.profiler.output "/tmp/x" in\ntheorem h : True := trivial',
            "trace.profiler.output",
        ),
    ],
)
def test_more_ways_to_run_code_or_write_files(text: str, token: str) -> None:
    found = scan(text, VerificationPolicy())
    assert found and any(token in f.token for f in found), found


@pytest.mark.parametrize(
    "text",
    [
        "⨆'a/-\n#eval IO.println 1\n-/",  # a Mathlib-only token Lean may not have
        "''a/-\n#eval 1\n-/",  # `''` is Mathlib's; core Lean reads a character literal
        "∑'\\n/-\n#eval 1\n-/",
        "x ⁻¹'a-- \n#eval 1",
        "xé'a/-\n#eval 1\n-/",  # before v4.22 `é` ends the name and `'a/` is a char literal
    ],
)
def test_a_comment_right_after_a_quote_token_is_refused(text: str) -> None:
    """A failed character literal makes Lean's recovery resume a few characters on; a comment
    opener there turns what the lexer calls a comment into code."""
    found = scan(text, VerificationPolicy())
    assert found and found[0].reason is Reason.FORBIDDEN and "character literal" in found[0].why


@pytest.mark.parametrize("text", ["exact h' -- done", "∑' i in s, f i", "f '' s", "xé' = 1"])
def test_quotes_in_names_and_tokens_without_a_comment_pass(text: str) -> None:
    assert scan(text, VerificationPolicy()) == []
