"""The pre-scan's tables: which commands, attributes and options a proof may use, and why the
others are refused. Everything not listed as allowed is refused (deny by default); the refusal
tables only exist to give a precise reason.

The command and attribute names are those Lean core, Batteries, Aesop, Plausible and Mathlib
register (their ``#help command`` / ``#help attr`` output from 2024 to 2026). A command keyword is
a reserved token in Lean, so wherever one of these words appears in code (not in a comment or
string, not written with ``«»``) it *is* that command.

To allow more for one taskset, see docs/prescan.md ("Extending the allow-list").
"""

from __future__ import annotations

__all__ = [
    "ALLOWED_ATTRIBUTES",
    "ALLOWED_COMMANDS",
    "ALLOWED_HASH_COMMANDS",
    "ALLOWED_OPTIONS",
    "ALLOWED_OPTION_PREFIXES",
    "CODE_ATTRIBUTES",
    "COMMANDS",
    "CONFIG_CONSTANTS",
    "CONFIG_QUALIFIED",
    "CONFIG_TACTICS",
    "DISCHARGER_TACTICS",
    "HASH_COMMANDS",
    "METAPROGRAM_NAMES",
    "NATIVE_NAMES",
    "NATIVE_TACTICS",
    "NOTATION_COMMANDS",
    "SORRY_NAMES",
    "TACTICS",
    "TACTIC_WORDS",
    "WHY",
]

# -- why each kind of construct is refused (the text after "is not allowed in a proof:") ---------

WHY: dict[str, str] = {
    "code": (
        "it runs code written in the proof inside the Lean process that checks it (an elaborator, "
        "macro, simproc or initializer can add declarations without the kernel, read files or "
        "print fake results); prove the statement with ordinary tactics instead"
    ),
    "syntax": (
        "it changes how the rest of the text is parsed (it could redefine `theorem`, `by` or "
        "`sorry`); write the terms out in full"
    ),
    "notation": (
        "the taskset does not allow notation commands: they change how the rest of the text is "
        "parsed; write the terms out in full"
    ),
    "eval": (
        "it evaluates code inside the Lean process (arbitrary code: it can tamper with the "
        "process or print fake results); a proof needs no evaluation"
    ),
    "guard": (
        "it runs code (`#guard` evaluates a term) or swallows messages (`#guard_msgs` can hide "
        "errors); a proof needs neither"
    ),
    "exit": "`#exit` stops elaboration, so what follows (the statement itself) is never checked",
    "import": "imports can only come from the taskset's header",
    "kernel": (
        "it touches what the kernel trusts (quotient axioms, compiled code, injectivity "
        "theorems); a proof needs none of it"
    ),
    "unknown": "it is not on the allow-list of commands a proof may use (see docs/prescan.md)",
    "print": (
        "`#print` of a string only prints text a reader could mistake for a checker's output; "
        "use `#print` on a name, or nothing"
    ),
    "unknown_hash": (
        "it is a `#` command that is not on the allow-list (only `#check`, `#print` and `#reduce` "
        "are allowed; `#eval`-like commands run code)"
    ),
    "open_private": (
        "`open private` / `export private` make private declarations of the library usable "
        "(such as `addDeclWithoutChecking`, which adds a theorem without the kernel); use public "
        "lemmas"
    ),
    "attr_code": (
        "this attribute registers the declaration as code that Lean runs while elaborating or "
        "printing (a tactic, simproc, elaborator, parser, delaborator, extension or compiled "
        "implementation), so the proof could run arbitrary code; use lemma attributes such as "
        "`@[simp]` or none"
    ),
    "attr_unknown": (
        "this attribute is not on the allow-list (lemma attributes like `simp`, `ext`, "
        "`norm_cast`, `instance`, `reducible` are; see docs/prescan.md)"
    ),
    "option_unsafe": (
        "this option switches off checks (`debug.skipKernelTC` skips the kernel, "
        "`debug.byAsSorry` turns proofs into `sorry`) or changes compiled code"
    ),
    "option_unknown": (
        "this option is not on the allow-list (`maxHeartbeats`, `maxRecDepth`, `synthInstance.*`, "
        "`linter.*`, `pp.*`, `trace.*`, `autoImplicit`, ... are); see docs/prescan.md"
    ),
    "native": (
        "it trusts compiled code (the kernel evaluates it with `Lean.reduceBool`/`reduceNat`, or "
        "the compiler runs it), which the taskset does not allow; use `decide`, `norm_num`, "
        "`omega` or `simp` instead"
    ),
    "sorry": "the proof is left unfinished (`sorry`/`admit` prove anything)",
    "axiom": "it declares a new axiom (anything can be proved from one); prove a lemma instead",
    "unsafe": (
        "unsafe code (`unsafe`, `unsafeCast`, `unsafeIO`, ...) escapes the logic and can run "
        "arbitrary code while elaborating"
    ),
    "implemented_by": (
        "`implemented_by`/`extern` swap in other compiled code for a definition, which native "
        "evaluation would then trust"
    ),
    "run_code": (
        "it runs arbitrary code inside the Lean process (`run_tac`, `run_conv` and `by_elab` run "
        "a meta-program; `eval%`, `trace`, `success_if_fail_with_msg`, `from_lrat`, "
        "`include_str` and `with_panel_widgets` evaluate a term of the proof); use ordinary "
        "tactics"
    ),
    "external": (
        "it runs an external program and reaches the network while elaborating (`polyrith` "
        "sends the goal to a Sage server); use `linear_combination` with the coefficients"
    ),
    "hidden_command": (
        "a command inside a string literal or a `«»` name can run when Lean fails to read the "
        "token (its error recovery then goes on character by character, inside it; defence in "
        "depth); keep command words and `#`/`@[` out of strings and names"
    ),
    "config_code": (
        "a tactic configuration is compiled and run as code when the tactic runs (a name in it "
        "can be a definition of the proof's own, a `default` instance it declares, or a field "
        "such as linarith's `discharger` that is a tactic program), so its values must be "
        "literals: numbers, `true`/`false`, strings, `.reducible`-style constants and "
        "`{ field := literal }` (`(config := { maxSteps := 100000 })`, `(maxSteps := 100000)`, "
        "`+contextual`)"
    ),
    "plausible": (
        "it compiles and runs the statement's decidability code on random inputs (arbitrary code "
        "from the proof runs in the Lean process) and proves nothing"
    ),
    "metaprogram": (
        "it is a meta-program or IO action (a `TacticM`/`MetaM`/`IO` value, `EStateM.run`, "
        "`addDecl`, `evalExpr`, ...): it can add declarations without the kernel or do IO once "
        "something runs it, and a proof needs none; use ordinary tactics"
    ),
    "aesop_tactic": (
        "an Aesop `tactic` rule runs a meta-program named in the proof; use `aesop` with lemma "
        "rules (`(add safe foo)`) instead"
    ),
    "lexing": "",  # filled in with the lexer's own message
}

# -- commands --------------------------------------------------------------------------------------

#: Commands a proof may use: declarations and their modifiers, scoping, `open`, options (their
#: names are checked against ALLOWED_OPTIONS), `attribute` (its attributes are checked).
ALLOWED_COMMANDS: frozenset[str] = frozenset(
    """
    theorem lemma def abbrev instance structure class inductive example opaque
    private protected noncomputable partial nonrec
    namespace section end variable universe mutual include omit
    open set_option attribute local scoped deriving
    """.split()
)

NOTATION_COMMANDS: frozenset[str] = frozenset(
    "notation notation3 infix infixl infixr prefix postfix".split()
)

_CODE = """
macro macro_rules syntax elab elab_rules declare_syntax_cat elab_stx_quot binder_predicate
simproc dsimproc simproc_decl dsimproc_decl simproc_pattern builtin_simproc builtin_dsimproc
builtin_simproc_decl builtin_dsimproc_decl builtin_simproc_pattern cbv_simproc cbv_simproc_decl
cbv_simproc_pattern builtin_cbv_simproc builtin_cbv_simproc_decl builtin_cbv_simproc_pattern
register_sym_simp register_sym_dsimp register_sym_simp_attr
initialize builtin_initialize run_cmd run_elab run_meta test_extern
grind_propagator builtin_grind_propagator add_aesop_rules erase_aesop_rules
declare_aesop_rule_sets declare_config_elab declare_config_elab_legacy declare_command_config_elab
declare_command_config_elab_legacy declare_term_config_elab declare_core_config_elab
declare_config_getter def_eval_config_item declare_simp_like_tactic set_library_suggestions
set_premise_selector tactic_extension register_tactic_tag register_try?_tactic register_hint
register_option register_builtin_option register_simp_attr register_label_attr register_linter_set
register_grind_attr register_error_explanation sudo unlock_limits
""".split()
_KERNEL = """
init_quot compile_inductive compile_def gen_injective_theorems lrat_proof unif_hint seal unseal
suppress_compilation unsuppress_compilation reset_grind_attrs
""".split()
# Commands Lean or Mathlib define that print, document, assert or generate lemmas: harmless as
# far as is known, but not needed in a proof, so refused like anything else not allow-listed.
_OTHER = """
export alias irreducible_def library_note library_note2 add_decl_doc extend_docs assert_exists
assert_no_sorry assert_not_exists assert_not_imported recall proof_wanted theorem_wanted
def_wanted instance_wanted count_heartbeats whatsnew guard_min_heartbeats mk_iff_of_inductive_prop
initialize_simps_projections name_poly_vars name_power_vars deprecate deprecated_module
deprecated_syntax recommended_spelling grind_pattern grind_annotated init_grind_norm
norm_cast_add_elim to_additive_name_hint insert_to_additive_translation to_dual_insert_cast
to_dual_insert_cast_fun to_dual_name_hint declare_bitwise_int_theorems
declare_bitwise_uint_theorems declare_int_theorems declare_uint_theorems declare_sint_simprocs
declare_uint_simprocs declare_eval_bin declare_eval_bin_bitwise declare_eval_bin_bool_pred
docs_to_verso variables show_panel_widgets with_weak_namespace reprove unset_option
""".split()

#: Every command keyword the pre-scan knows, with the kind of reason (a key of WHY) it is refused
#: for; allowed ones map to "". `variable?`-style names keep their `?`; `%`-suffixed commands
#: (`compile_inductive%`) are listed without the `%` (Lean lexes the `%` as its own token).
COMMANDS: dict[str, str] = {
    **{w: "" for w in ALLOWED_COMMANDS},
    **{w: "notation" for w in NOTATION_COMMANDS},
    **{w: "code" for w in _CODE},
    **{w: "kernel" for w in _KERNEL},
    **{w: "unknown" for w in _OTHER},
    "variable?": "unknown",
    "initialize_simps_projections?": "unknown",
    "recall?": "unknown",
    "import": "import",
    "axiom": "axiom",
    "unsafe": "unsafe",
}

#: `#` commands a proof may use: they only elaborate and print (nothing reads their output).
ALLOWED_HASH_COMMANDS: frozenset[str] = frozenset({"check", "print", "reduce"})

#: Known `#` commands, with the kind of reason they are refused for. Any other `#word` at the
#: start of a line is refused as an unknown command too (deny by default).
HASH_COMMANDS: dict[str, str] = {
    **{w: "" for w in ALLOWED_HASH_COMMANDS},
    **{
        w: "eval"
        for w in """eval eval! test sample norm_num simp conv whnf whnfR unfold? rw?? find
        find_syntax push_neg push pull synth check_tactic check_tactic_failure check_simp
        string_diagram html widget defeq_abuse grind_lint time""".split()
    },
    **{w: "guard" for w in "guard guard_msgs guard_expr guard_panic".split()},
    "exit": "exit",
    **{
        w: "unknown_hash"
        for w in """adaptation_note aesop_rules aesop_stats allow_unused_tactic check'
        check_assertions check_failure clear_deprecations click_suggestions count_heartbeats
        count_heartbeats! discr_tree_key discr_tree_simp_key dump_async_env_state explode
        find_home help import_bumps import_diff import_path info_trees instances kerodon_tags
        leansearch lint list_linters lmfdb_tags long_instances long_names loogle min_imports
        minimize_imports moogle parse print_fun_prop_theorems push_discr_tree redundant_imports
        reset_min_imports search show_deprecated_modules show_kind show_unused stacks_tags
        trans_imports version whats_new where wikidata_tags with_exporting""".split()
    },
}

# -- attributes ------------------------------------------------------------------------------------

#: Attributes a declaration in a proof may carry: they register it as a lemma (for `simp`,
#: `ext`, `gcongr`, ...), change its reducibility or compilation hints, or document it.
ALLOWED_ATTRIBUTES: frozenset[str] = frozenset(
    """
    simp norm_cast push_cast ext instance reducible irreducible semireducible instance_reducible
    implicit_reducible inline noinline specialize nospecialize always_inline weak_specialize
    symm refl trans congr elab_as_elim elab_without_expected_type induction_eliminator
    cases_eliminator coe to_additive to_additive_reorder to_additive_ignore_args
    to_additive_relevant_arg to_additive_change_numeral to_additive_dont_translate
    to_additive_do_translate to_dual simps nolint deprecated deprecated_arg inherit_doc
    gcongr continuity measurability fun_prop mono bound match_pattern default_instance
    field_simps parity_simps mfld_simps zify_simps qify_simps rify_simps integral_simps
    rclike_simps functor_norm monad_norm ghost_simps coassoc_simps bool_to_prop boolToPropSimps
    bv_toNat enat_to_nat_coe enat_to_nat_top pnat_to_nat_coe reduce_mod_char seval
    grind grind! grind? grind!? grind_cases grind_norm lia fin_omega nontriviality
    elementwise reassoc higher_order higherOrder mk_iff mkIff pp_nodot
    pp_using_anonymous_constructor stacks suggest_for local scoped
    """.split()
)

#: Attributes refused because they register code (each of these runs a declaration of the proof
#: as a tactic, simproc, elaborator, parser, delaborator, extension or compiled implementation).
#: Names ending in `_parser` or `_proc`, starting with `builtin_` or `aesop` are included by rule.
CODE_ATTRIBUTES: frozenset[str] = frozenset(
    """
    simproc sevalproc simprocAttr sevalprocAttr cbvSimprocAttr aesop norm_num positivity
    delab app_delab app_unexpander tactic macro command_elab term_elab tactic_elab doElem_elab
    inductive_elab extern implemented_by export csimp init env_linter linter code_action_provider
    command_code_action tactic_code_action hole_code_action combinator_formatter
    combinator_parenthesizer category_parenthesizer formatter parenthesizer expr_presenter
    gcongr_forward grind_tactic try_tactic incremental missing_docs_handler quot_precheck
    run_parser_attribute_hooks run_builtin_parser_attribute_hooks server_rpc_method
    server_rpc_method_cancellable sym_discharger sym_dsimproc sym_simproc frameproc tacticAnalysis
    tactic_alt tactic_tag tactic_name unused_variables_ignore_fn widget widget_module
    deferred_doc_check package_code_quality_check library_suggestions doc_role doc_command
    doc_directive doc_code_block doc_code_block_suggestions doc_code_suggestions doc_block_md
    doc_inline_md computed_field never_extract macro_inline cbv_eval partial_fixpoint_monotone
    """.split()
)

# -- options ---------------------------------------------------------------------------------------

#: Options a proof may set (`set_option NAME VALUE`, also `... in`): limits, printing, linters,
#: tracing, and elaboration switches that cannot get anything past the kernel.
ALLOWED_OPTIONS: frozenset[str] = frozenset(
    """
    maxHeartbeats maxRecDepth maxSynthPendingDepth autoImplicit relaxedAutoImplicit
    diagnostics profiler exponentiation.threshold push_neg.use_distrib simprocs warningAsError
    Elab.async
    """.split()
)
#: Option name prefixes a proof may set (everything under them).
ALLOWED_OPTION_PREFIXES: tuple[str, ...] = (
    "synthInstance.",
    "linter.",
    "pp.",
    "trace.",
    "diagnostics.",
    "profiler.",
    "tactic.",
    "backward.",
)
#: Option prefixes refused with the specific reason (they switch checks off or change code).
UNSAFE_OPTION_PREFIXES: tuple[str, ...] = (
    "debug.",
    "kernel.",
    "compiler.",
    "interpreter.",
    "bootstrap.",
    "internal.",
    "eval.",
)
UNSAFE_OPTIONS: frozenset[str] = frozenset(
    "allowUnsafeReducibility debugAssertions genInjectivity genSizeOfSpec quotPrecheck "
    "trace.profiler.output trace.profiler.output.pp".split()
)

# -- names and tactics -----------------------------------------------------------------------------

#: Last name components that trust compiled code (reason `native`), however the name is spelled.
NATIVE_NAMES: frozenset[str] = frozenset(
    "native_decide nativeDecide reduceBool reduceNat ofReduceBool ofReduceNat trustCompiler".split()
)
#: Tactics whose proofs rest on `Lean.ofReduceBool` (they run compiled code in the kernel).
NATIVE_TACTICS: frozenset[str] = frozenset("bv_decide bv_decide? bv_check".split())
SORRY_NAMES: frozenset[str] = frozenset("sorry admit sorryAx".split())
#: Tactics and terms that run code or test instead of proving (reason `forbidden`). Each entry
#: names the definition it stands for, read in the source (issue 19; revisions in
#: docs/prescan.md). A keyword of the syntax, so the word is refused wherever it is code.
TACTICS: dict[str, str] = {
    # Lean core `Init/Tactics.lean` (`runTac`), elaborated by `evalRunTac` in
    # `Lean/Elab/Tactic/BuiltinTactic.lean` (Mathlib's `Tactic/RunCmd.lean` before it moved):
    # runs a `TacticM` program of the proof.
    "run_tac": "run_code",
    # Lean core `Lean/Elab/BuiltinNotation.lean` (`elabRunElab`): runs a `TermElabM` program.
    "by_elab": "run_code",
    # Mathlib `Mathlib/Tactic/Conv.lean`: `macro "run_conv" e:doSeq : conv =>
    # `(conv| tactic' => run_tac $e)`, a `run_tac` the text never spells out.
    "run_conv": "run_code",
    # Mathlib `Mathlib/Tactic/SuccessIfFailWithMsg.lean`: the message is a term, evaluated with
    # `unsafe Term.evalTerm String`.
    "success_if_fail_with_msg": "run_code",
    # Mathlib `Mathlib/Tactic/Sat/FromLRAT.lean` (`elab "from_lrat "`): both terms evaluated
    # with `unsafe evalTerm String` (the command form `lrat_proof` is refused with commands).
    "from_lrat": "run_code",
    # Lean core `Lean/Elab/BuiltinTerm.lean` (`elabIncludeStr`): the path is a term evaluated
    # with `evalTerm System.FilePath`, then the file is read.
    "include_str": "run_code",
    # ProofWidgets `ProofWidgets/Component/Panel/Basic.lean` (`withPanelWidgets`, a Mathlib
    # dependency): each `M with props` term evaluated through `evalWidgetInstance`.
    "with_panel_widgets": "run_code",
    # Mathlib `Mathlib/Tactic/Polyrith.lean`: runs `curl` to a Sage server.
    "polyrith": "external",
    # Plausible (`plausible`, formerly Mathlib's `slim_check`): compiles and runs the goal's
    # decidability code on random inputs.
    "plausible": "plausible",
    "slim_check": "plausible",
    "implemented_by": "implemented_by",
}
#: Tactics refused only where they stand as a tactic and take more than one string literal:
#: the word is also an ordinary name (`Matrix.trace` opened as `trace`). Mathlib's
#: `Mathlib/Tactic/Trace.lean` (`elab tk:"trace " val:term : tactic`) evaluates
#: `toString val` with `unsafe evalExpr String`, so `trace f 12` runs the proof's `f`; core's
#: `trace "message"` only logs its literal.
TACTIC_WORDS: dict[str, str] = {"trace": "run_code"}
#: Meta-programming and IO names (matched on the last or the first name component).
METAPROGRAM_NAMES: frozenset[str] = frozenset(
    """
    TacticM MetaM CoreM TermElabM CommandElabM MacroM DelabM SimpM Simproc DSimproc IO EIO BaseIO
    EStateM RealWorld addDecl addDeclCore addDeclWithoutChecking addAndCompile compileDecl
    compileDecls modifyEnv setEnv evalExpr evalExpr' evalConst evalConstCheck evalDecl evalTerm
    evalTactic unsafeEvalDecl liftMetaTactic liftTermElabM liftCommandElabM
    runFrontend processCommands elabCommand elabCommandTopLevel runCommandElabM saveModuleData
    readModuleData importModules withImportModules mkEmptyEnvironment finalizeImport
    """.split()
)


# -- tactic configurations --------------------------------------------------------------------------

#: Tactics that take configuration items right after their name (`simp (maxSteps := 10)`,
#: `decide (kernel := true)`, `aesop (simp_config := {...})`): an item `(field := value)` there is
#: a configuration value, evaluated as code, where elsewhere it would be a named argument.
#: `(config := value)` is a configuration wherever it appears. Trailing `?`/`!` are ignored.
CONFIG_TACTICS: frozenset[str] = frozenset(
    """
    simp simp_all dsimp simpa simp_arith simp_all_arith simp_wf norm_num norm_num1 decide omega
    linarith nlinarith positivity polyrith aesop field_simp ring_nf ring1 abel_nf abel noncomm_ring
    bound gcongr rw rwa erw rewrite rw_mod_cast nth_rewrite nth_rw unfold delta exact apply refine
    refine' hint grind bv_decide bv_omega split split_ifs congr convert ext funext fun_prop
    continuity measurability apply_rules solve_by_elim tauto cases induction rcases obtain
    constructor intro intros norm_cast push_cast exact_mod_cast apply_mod_cast
    assumption_mod_cast subst_vars fin_cases interval_cases mod_cases zify qify lift push_neg
    contrapose by_contra use exists trans calc conv compute_degree monicity linear_combination
    simp_rw extract_lets lift_lets apply_assumption convert_to rel rify cancel_denoms
    apply_fun filter_upwards peel choose set generalize unfold_let says observe order
    finiteness rw_search aesop_cat wlog bv_normalize ac_rfl symm injection subst
    simp_intro decide! norm_num! grind! itauto group clear_value with_reducible
    lia cutsat grobner try mvcgen mvcgen_no_trivial
    """.split()
)
# The last line: Lean core's `"lia"`/`"cutsat"`/`"grobner" optConfig` (the grind frontends),
# `"try?" optConfig` (read as `try`: trailing `?` is ignored) and `"mvcgen" optConfig`, whose
# configuration items are elaborated and evaluated like `grind`'s (issue 19).

#: Tactics whose `(disch := tac)`/`(discharger := tac)` item is tactic syntax, not a value: the
#: tactic is read by the other rules like any other. Elsewhere such a field is a value
#: (linarith's `discharger : TacticM Unit` is a program) and must be literal like every other.
DISCHARGER_TACTICS: frozenset[str] = frozenset(
    "simp simp_all simpa simp_arith simp_all_arith field_simp norm_num use".split()
)

#: Constants a configuration value may name: constructors of the enumerations that tactic
#: configurations use (`TransparencyMode`, `EtaStructMode`, `Occurrences`, simps' presets),
#: written `.reducible` or in full. They already exist, so a proof cannot redefine them.
CONFIG_CONSTANTS: frozenset[str] = frozenset(
    """
    all default reducible instances notClasses none pos neg asFn lemmasOnly
    """.split()
)
_CONFIG_NAMESPACES = (
    "TransparencyMode",
    "Lean.Meta.TransparencyMode",
    "EtaStructMode",
    "Lean.Meta.EtaStructMode",
    "Occurrences",
    "Lean.Meta.Occurrences",
    "Simps.Config",
)
#: The same constants written with their namespace (`Lean.Meta.TransparencyMode.reducible`).
CONFIG_QUALIFIED: frozenset[str] = frozenset(
    f"{ns}.{c}" for ns in _CONFIG_NAMESPACES for c in CONFIG_CONSTANTS
)
