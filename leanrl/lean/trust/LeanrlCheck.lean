/-
leanrl's trusted checker, part 2 of 2 (see docs/verification.md; part 1, `LeanrlRestate.lean`,
decides restated statements and is elaborated first, in the same text).

It is elaborated once per judge process, a Lean process that never elaborates model text (only
the header's imports, this file, the header's options and the taskset's reference statements).
For each attempt it reads the attempt's new constants from a file -- a REPL `pickleTo` of the
attempt's environment, or the `.olean` that `lean -o` wrote for it -- and compares them with the
reference statement, which was elaborated (with `sorry`) in this clean environment. Nothing the
attempt declared (syntax, macros, notation, options, instances, attributes, compiled code) exists
here: only the attempt's constants are looked at, as data, and every new one the theorem depends
on is replayed through the kernel.

It logs one info message `LEANRL-CHECK <json>`; the json echoes a per-check nonce. Python
(leanrl/lean/trust/rules.py) turns the facts into a verdict. Only APIs that exist from Lean v4.9
on are used: `readModuleData`, `ConstantInfo`, `Expr.getUsedConstants`, `addDecl`,
`withoutModifyingEnv`, `Lean.Json`. Names that newer Lean removed (`Lean.reduceBool`, ...) are
written with one backtick, so this file elaborates whether they exist or not.
-/
namespace LeanrlCheck
open Lean

/-- The constants of a REPL pickle. The REPL stores the tuple
`(imports, env.constants.map₂, commandState, commandContext)`; only the first two are read. -/
unsafe def readReplPickleImpl (path : String) : IO (Array (Name × ConstantInfo)) := do
  let (data, _) ← readModuleData (System.FilePath.mk path)
  let p : Array Import × PersistentHashMap Name ConstantInfo × Unit := unsafeCast data
  return p.2.1.toList.toArray

@[implemented_by readReplPickleImpl]
opaque readReplPickle (path : String) : IO (Array (Name × ConstantInfo))

/-- The constants of a module compiled with `lean -o`. -/
def readOlean (path : String) : IO (Array (Name × ConstantInfo)) := do
  let (m, _) ← readModuleData (System.FilePath.mk path)
  return m.constNames.zip m.constants

/-! ## Rebuilding the attempt's data

The file was written by the attempt's own process, so every object in it is hostile data. Lean
computes a `Name`'s hash, a `Level`'s and an `Expr`'s hash and flags (loose bound variable range,
has free variables, ...) once, when the object is built, and then trusts the stored value: a
`Name` spelled `propext` with a wrong stored hash is not found by `env.find?` and would pass for a
new constant, and an `Expr` whose flags claim no loose bound variables is skipped by
`instantiate`. So every constant is rebuilt through the constructors, which recompute each hash
and flag from the structure, before anything looks at it. Shared nodes are rebuilt once: the memo
is keyed by the address of the file's object, which forged data cannot influence (the file's
objects are never freed while the process lives). The layout itself (constructor tags, sizes,
UTF-8) is still read as the runtime finds it, and a term nested deeper than the stack allows
crashes the judge (the attempt then fails as a crash); see docs/verification.md.
-/

/-- Past these sizes Lean before v4.21 silently zeroes an object's cached data (lean4#8554:
`Expr.mkData` asserts a loose bound variable range under 2^20 and `Level.mkData` a depth under
2^24, and a failed assertion returns the default), so every flag the kernel reads -- free
variables, metavariables, universe parameters -- would say "none". No honest term comes near:
the rebuild builds nothing past 2^16 and the check refuses the attempt (`too_deep`). Below the
caps the rebuilt flags are exact, which is what `badShape` relies on. (A level is still
traversed to its full depth first: one deep enough to exhaust the stack crashes the judge, which
costs the attempt as a crash.) -/
def maxBVarIndex : Nat := 65536
def maxLevelDepth : Nat := 65536

structure Rebuilt where
  names : PersistentHashMap USize Name := {}
  levels : PersistentHashMap USize (Level × Nat) := {}
  exprs : PersistentHashMap USize Expr := {}
  /-- Why the file's data is past a cap above, if it is. -/
  limit : Option String := none

abbrev RebuildM := StateM Rebuilt

/-- A string copied character by character: its cached length is recomputed too. -/
def rbString (s : String) : String := String.foldl String.push "" s

/-- `n` in the runtime's canonical form. A file can hold a big-number object whose value is
small; the runtime compares such a number unequal to the same small number (`Nat.beq` in the
kernel included), and subtraction turns it back into the small one, which proves `true = false`.
Printed and read back, every number is built by arithmetic, which always normalises. -/
def rbNat (n : Nat) : Nat := (toString n).foldl (fun acc c => acc * 10 + (c.toNat - 48)) 0

unsafe def rbName (n : Name) : RebuildM Name := do
  match n with
  | .anonymous => return .anonymous
  | _ =>
    if let some r := (← get).names.find? (ptrAddrUnsafe n) then return r
    let r ← match n with
      | .str p s => do pure (Name.str (← rbName p) (rbString s))
      | .num p i => do pure (Name.num (← rbName p) (rbNat i))
      | .anonymous => pure Name.anonymous
    modify fun st => { st with names := st.names.insert (ptrAddrUnsafe n) r }
    return r

/-- `l` rebuilt, with its depth counted here (not read from its cached data). A level deeper
than `maxLevelDepth` is replaced by `Level.zero`, so nothing deeper is ever built, and the check
refuses the attempt; the file's level is still traversed to its full depth. -/
unsafe def rbLevelD (l : Level) : RebuildM (Level × Nat) := do
  if let some r := (← get).levels.find? (ptrAddrUnsafe l) then return r
  let r : Level × Nat ← match l with
    | .zero => pure (Level.zero, 0)
    | .succ a => do
      let (a', d) ← rbLevelD a
      pure (Level.succ a', d + 1)
    | .max a b => do
      let (a', da) ← rbLevelD a
      let (b', db) ← rbLevelD b
      pure (Level.max a' b', Nat.max da db + 1)
    | .imax a b => do
      let (a', da) ← rbLevelD a
      let (b', db) ← rbLevelD b
      pure (Level.imax a' b', Nat.max da db + 1)
    | .param n => do pure (Level.param (← rbName n), 0)
    | .mvar m => do pure (Level.mvar ⟨← rbName m.name⟩, 0)
  let r ← if r.2 > maxLevelDepth then do
      modify fun st => { st with limit := some s!"a universe level nested over {maxLevelDepth} deep" }
      pure (Level.zero, 0)
    else pure r
  modify fun st => { st with levels := st.levels.insert (ptrAddrUnsafe l) r }
  return r

unsafe def rbLevel (l : Level) : RebuildM Level := do
  return (← rbLevelD l).1

unsafe def rbExpr (e : Expr) : RebuildM Expr := do
  if let some r := (← get).exprs.find? (ptrAddrUnsafe e) then return r
  let r ← match e with
    | .bvar i => do
      let k := rbNat i
      if k ≥ maxBVarIndex then
        modify fun st => { st with limit := some s!"a bound variable index of {k} (the cap is {maxBVarIndex})" }
        pure (Expr.bvar 0)
      else pure (Expr.bvar k)
    | .fvar f => do pure (Expr.fvar ⟨← rbName f.name⟩)
    | .mvar m => do pure (Expr.mvar ⟨← rbName m.name⟩)
    | .sort l => do pure (Expr.sort (← rbLevel l))
    | .const n ls => do pure (Expr.const (← rbName n) (← ls.mapM rbLevel))
    | .app f a => do pure (Expr.app (← rbExpr f) (← rbExpr a))
    | .lam n t b bi => do pure (Expr.lam (← rbName n) (← rbExpr t) (← rbExpr b) bi)
    | .forallE n t b bi => do
      pure (Expr.forallE (← rbName n) (← rbExpr t) (← rbExpr b) bi)
    | .letE n t v b nd => do
      pure (Expr.letE (← rbName n) (← rbExpr t) (← rbExpr v) (← rbExpr b) nd)
    | .lit (.natVal k) => pure (Expr.lit (.natVal (rbNat k)))
    | .lit (.strVal s) => pure (Expr.lit (.strVal (rbString s)))
    | .mdata m b => do
      let entries ← m.entries.mapM fun (k, v) => do
        let v' ← match v with
          | .ofName x => do pure (DataValue.ofName (← rbName x))
          | .ofNat x => pure (DataValue.ofNat (rbNat x))
          | other => pure other
        let k' ← rbName k
        return (k', v')
      pure (Expr.mdata ⟨entries⟩ (← rbExpr b))
    | .proj s i b => do pure (Expr.proj (← rbName s) (rbNat i) (← rbExpr b))
  modify fun st => { st with exprs := st.exprs.insert (ptrAddrUnsafe e) r }
  return r

unsafe def rbConst (ci : ConstantInfo) : RebuildM ConstantInfo := do
  let nm ← rbName ci.name
  let lps ← ci.levelParams.mapM rbName
  let ty ← rbExpr ci.type
  match ci with
  | .axiomInfo v => return .axiomInfo { v with name := nm, levelParams := lps, type := ty }
  | .defnInfo v =>
    return .defnInfo { v with name := nm, levelParams := lps, type := ty,
                              value := (← rbExpr v.value), all := (← v.all.mapM rbName) }
  | .thmInfo v =>
    return .thmInfo { v with name := nm, levelParams := lps, type := ty,
                             value := (← rbExpr v.value), all := (← v.all.mapM rbName) }
  | .opaqueInfo v =>
    return .opaqueInfo { v with name := nm, levelParams := lps, type := ty,
                                value := (← rbExpr v.value), all := (← v.all.mapM rbName) }
  | .quotInfo v => return .quotInfo { v with name := nm, levelParams := lps, type := ty }
  | .inductInfo v =>
    return .inductInfo { v with name := nm, levelParams := lps, type := ty,
                                numParams := rbNat v.numParams, numIndices := rbNat v.numIndices,
                                all := (← v.all.mapM rbName), ctors := (← v.ctors.mapM rbName) }
  | .ctorInfo v =>
    return .ctorInfo { v with name := nm, levelParams := lps, type := ty,
                              induct := (← rbName v.induct), cidx := rbNat v.cidx,
                              numParams := rbNat v.numParams, numFields := rbNat v.numFields }
  | .recInfo v =>
    let rules ← v.rules.mapM fun r => do
      return { r with ctor := (← rbName r.ctor), nfields := rbNat r.nfields,
                      rhs := (← rbExpr r.rhs) }
    return .recInfo { v with name := nm, levelParams := lps, type := ty,
                             all := (← v.all.mapM rbName), rules := rules,
                             numParams := rbNat v.numParams, numIndices := rbNat v.numIndices,
                             numMotives := rbNat v.numMotives,
                             numMinors := rbNat v.numMinors }

unsafe def rebuildImpl (cs : Array (Name × ConstantInfo)) :
    Array (Name × ConstantInfo) × Option String :=
  let act : RebuildM (Array (Name × ConstantInfo)) := cs.mapM fun (n, ci) => do
    let n' ← rbName n
    let ci' ← rbConst ci
    return (n', ci')
  let (out, st) := Id.run (StateT.run act {})
  (out, st.limit)

/-- `cs` with every `Name`, `Level` and `Expr` rebuilt from its structure (see above), and why
its data is past a cap (`maxBVarIndex`, `maxLevelDepth`), if it is. -/
@[implemented_by rebuildImpl]
opaque rebuild (cs : Array (Name × ConstantInfo)) : Array (Name × ConstantInfo) × Option String

def kindOf : ConstantInfo → String
  | .axiomInfo _ => "axiom"
  | .defnInfo _ => "def"
  | .thmInfo _ => "theorem"
  | .opaqueInfo _ => "opaque"
  | .quotInfo _ => "quot"
  | .inductInfo _ => "inductive"
  | .ctorInfo _ => "constructor"
  | .recInfo _ => "recursor"

/-- A definition body that is just `sorry` (an answer placeholder such as PutnamBench's
`abbrev solution : T := sorry`). Newer Lean labels each `sorry` with its source position, so two
elaborations of the same placeholder at different lines differ only in that label. -/
def isSorryBody (e : Expr) : Bool := e.isAppOf ``sorryAx

/-- Two declarations say the same thing (kind, universes, type, and body for definitions). -/
def sameDecl (a b : ConstantInfo) : Bool :=
  kindOf a == kindOf b && a.levelParams == b.levelParams && a.type == b.type &&
    (match a, b with
     | .defnInfo x, .defnInfo y =>
       x.value == y.value || (isSorryBody x.value && isSorryBody y.value)
     | .opaqueInfo x, .opaqueInfo y => x.value == y.value
     | .inductInfo x, .inductInfo y => x.ctors == y.ctors && x.numParams == y.numParams
     | _, _ => true)

/-- Constants a declaration refers to (type, body, constructors, parent inductive). -/
def depsOf (ci : ConstantInfo) (withValue : Bool) : Array Name := Id.run do
  let mut out := ci.type.getUsedConstants
  if withValue then
    match ci with
    | .defnInfo v => out := out ++ v.value.getUsedConstants
    | .thmInfo v => out := out ++ v.value.getUsedConstants
    | .opaqueInfo v => out := out ++ v.value.getUsedConstants
    | _ => pure ()
  match ci with
  | .inductInfo v => out := out ++ v.ctors.toArray
  | .ctorInfo v => out := out.push v.induct
  | .recInfo v => out := out ++ v.all.toArray
  | _ => pure ()
  return out

structure Walk where
  seen : NameSet := {}
  axioms : Array Name := #[]
  missing : Array Name := #[]
  order : Array Name := #[]

/-- A step of `walk`'s explicit stack: visit a constant, or record it once its dependencies are. -/
inductive Step where
  | enter (n : Name)
  | exit (n : Name)

/-- Depth-first walk over everything `roots` depend on: collects axioms, missing constants, and a
dependency order (dependencies first). Bodies of `typeOnly` constants are not entered. The stack
is explicit, so a dependency chain as long as the attempt likes cannot overflow the judge's. -/
def walk (look : Name → Option ConstantInfo) (typeOnly : Name → Bool) (roots : Array Name) :
    Walk := Id.run do
  let mut s : Walk := {}
  let mut stack : Array Step := roots.reverse.map Step.enter
  -- Each constant is entered once and pushes at most its dependencies, so this terminates.
  repeat
    let some top := stack.back? | break
    stack := stack.pop
    match top with
    | .exit n => s := { s with order := s.order.push n }
    | .enter n =>
      if s.seen.contains n then continue
      s := { s with seen := s.seen.insert n }
      match look n with
      | none => s := { s with missing := s.missing.push n }
      | some ci =>
        if kindOf ci == "axiom" then s := { s with axioms := s.axioms.push n }
        -- Visited in this order: the dependencies, then (for an inductive type) what its block's
        -- constructor types mention -- the kernel checks a block together with its
        -- constructors, so those must come first in `order` also when the walk reached the block
        -- from a constructor (`node : T → D → T` would otherwise put `T` before `D`).
        let mut next : Array Name := depsOf ci (!typeOnly n)
        if let .inductInfo v := ci then
          for i in v.all do
            -- every member of the block, also one without constructors (which nothing else
            -- names): the replay adds the whole block, so each must be walked and checked
            next := next.push i
            if let some (.inductInfo iv) := look i then
              for c in iv.ctors do
                if let some cc := look c then next := next ++ cc.type.getUsedConstants
        stack := stack.push (.exit n)
        stack := stack ++ next.reverse.map Step.enter
  return s

/-- `e` with every reference to `target` pointing at `fresh` instead. The judge's environment
holds the reference statement under `target` (proved with `sorry`); an attempt's constant that
mentioned `target` would otherwise be checked against that reference -- a cycle `cheat := target`,
`target := cheat` would pass. Renamed, such a reference is to a constant not yet added, and the
kernel refuses it. -/
def retarget (target fresh : Name) (e : Expr) : Expr :=
  e.replace fun x => match x with
    | .const n ls => if n == target then some (.const fresh ls) else none
    | _ => none

def toDecl (ci : ConstantInfo) (ren : Expr → Expr) : Option Declaration :=
  match ci with
  | .axiomInfo v => some (.axiomDecl { v with type := ren v.type })
  | .defnInfo v => some (.defnDecl { v with type := ren v.type, value := ren v.value })
  | .thmInfo v => some (.thmDecl { v with type := ren v.type, value := ren v.value })
  | .opaqueInfo v => some (.opaqueDecl { v with type := ren v.type, value := ren v.value })
  | _ => none

/-! ## Which copy of each constant the judge reads

Every name the check looks up is read from one of two places: the clean environment (`env`,
where the header was imported and the reference statement elaborated with `sorry`) or the
attempt's file (`lookNew`, rebuilt). The choice, name by name:

* **The target.** The attempt's copy, always: its value is the attempt's proof, and its type is
  only compared with the reference's. The kernel is given `fresh : <reference's type> :=
  <attempt's value>` (`targetDecl`), so the kernel itself decides that the attempt's term proves
  the reference statement. The clean environment's `target` is the reference, proved with `sorry`:
  it is read for its statement and kind only, and never replayed (`lookW` hides it from the walk
  and the replay; a structural test in tests/test_trust_checker_source.py keeps it so).
* **A constant the attempt shares with the clean environment** (the header's and the reference
  file's declarations, the statement's own helper definitions): the clean copy, after `sameDecl`
  found the attempt's identical. It is trusted, not replayed; for a shared theorem `sameDecl`
  compares statements only, so the clean copy's body is the one the axiom walk enters.
* **An answer placeholder** (`abbrev solution : T := sorry` in both): the clean copy, walked by
  type only, since its body is the statement's own `sorry`.
* **Every other constant** (the attempt's helpers, new inductive types, auxiliary definitions the
  elaborator made): the attempt's copy, walked for axioms and replayed through the kernel,
  dependencies first, before the target.
-/

/-- The target as the kernel must check it: the attempt's own value (never the clean
environment's, which is the reference's `sorry`), with the attempt's universe names renamed to
the reference's (`levelMap`), declared with the reference's statement, kind and universes. -/
def targetDecl (attempt ref : ConstantInfo) (fresh : Name) (ren : Expr → Expr) :
    Except String Declaration := do
  if attempt.levelParams.length != ref.levelParams.length then
    throw (s!"the attempt's {attempt.name} has {attempt.levelParams.length} universe " ++
      s!"parameters, the reference {ref.levelParams.length}")
  let us := levelMap attempt ref
  let inst (e : Expr) : Expr := ren (e.instantiateLevelParams attempt.levelParams us)
  match attempt, ref with
  | .thmInfo a, .thmInfo _ =>
    return .thmDecl { name := fresh, levelParams := ref.levelParams, type := ref.type,
                      value := inst a.value, all := [fresh] }
  | .defnInfo a, .defnInfo r =>
    return .defnDecl { name := fresh, levelParams := ref.levelParams, type := ref.type,
                       value := inst a.value, hints := r.hints, safety := r.safety,
                       all := [fresh] }
  | .opaqueInfo a, .opaqueInfo r =>
    return .opaqueDecl { name := fresh, levelParams := ref.levelParams, type := ref.type,
                         value := inst a.value, isUnsafe := r.isUnsafe, all := [fresh] }
  | _, _ => throw s!"{attempt.name} is a {kindOf attempt}, which the check cannot replay"

/-- The attempt's stated type of the target, in the reference's universe names (`levelMap`). -/
def statedType (attempt ref : ConstantInfo) (ren : Expr → Expr) : Expr :=
  ren (attempt.type.instantiateLevelParams attempt.levelParams (levelMap attempt ref))

/-- Re-add the attempt's own constants through the kernel, dependencies first, then the target
(`tgtDecl`, under a fresh name because the reference owns the target's name here). `look` must
not resolve the target (it is `lookW` in `run`): the target's copy is `tgtDecl`, built from the
attempt's constant. Every reference to the target is renamed to the fresh name (`retarget`).
When the attempt restated the statement (`restated`), `sameStatement` first decides, by two
bounded checks, whether it is the reference statement. Returns `(status, detail)`; `("", "")` when all passed. -/
def replay (look : Name → Option ConstantInfo) (isNew : Name → Bool) (order : Array Name)
    (target fresh : Name) (tgtDecl? : Option Declaration)
    (restated : Option (Expr × Expr × List Name)) (heartbeats : Nat) :
    CoreM (String × String) := do
  let ren := retarget target fresh
  let mut added : NameSet := {}
  for n in order do
    if n == target then
      if let some (refType, stated, lps) := restated then
        let differs ← sameStatement refType stated lps (Name.mkStr fresh "_statement") heartbeats
        if let some (st, why) := differs then
          return (st, s!"the restated statement of {target} was refused: {why}")
      let some tgtDecl := tgtDecl? | continue  -- (`runFile`: no target)
      try addDecl tgtDecl
      catch e =>
        let why ← e.toMessageData.toString
        return ("replay_failed", s!"kernel rejected {target}'s proof of the reference " ++
          s!"statement: {why}")
      continue
    unless isNew n do continue
    if added.contains n then continue
    let some ci := look n | return ("replay_failed", s!"missing {n}")
    match ci with
    | .inductInfo v =>
      let mut types : List InductiveType := []
      for i in v.all do
        let some (.inductInfo iv) := look i
          | return ("replay_failed", s!"inductive block of {n} incomplete")
        let mut ctors : List Constructor := []
        for c in iv.ctors do
          let some cc := look c | return ("replay_failed", s!"constructor {c} missing")
          ctors := ctors ++ [{ name := c, type := ren cc.type }]
        types := types ++ [{ name := i, type := ren iv.type, ctors := ctors }]
        added := added.insert i
      try addDecl (.inductDecl v.levelParams v.numParams types false)
      catch e =>
        return ("replay_failed", s!"kernel rejected inductive {n}: {← e.toMessageData.toString}")
    | .ctorInfo _ => pure ()
    | .recInfo _ => pure ()
    | .quotInfo _ => return ("replay_failed", s!"{n} is a quotient primitive, which no proof may add")
    | _ =>
      let some d := toDecl ci ren | return ("replay_failed", s!"cannot replay {n}")
      try addDecl d
      catch e => return ("replay_failed", s!"kernel rejected {n}: {← e.toMessageData.toString}")
      added := added.insert n
  -- Constructors and recursors are generated by the kernel: the attempt's must be exactly
  -- what the kernel generated (whole records, as lean4checker compares them).
  let env ← getEnv
  for n in order do
    unless isNew n do continue
    let some ci := look n | continue
    let same : Option Bool := match ci, env.find? n with
      | .ctorInfo a, some (.ctorInfo b) => some (a == b)
      | .recInfo a, some (.recInfo b) => some (a == b)
      | .ctorInfo _, _ => some false
      | .recInfo _, _ => some false
      | _, _ => none
    if same == some false then return ("replay_failed", s!"{n} differs from what the kernel generates")
  return ("", "")

/-! ## Shapes that reach known kernel bugs

Refused before `addDecl` sees them, whatever the kernel of the running version would do. A
closed declaration never needs a free variable, a metavariable or a loose bound variable (the
kernel's checks of these have had holes: lean4#14484), and a projection must name a
structure-like type with more than that many fields (oversized indices were aliased or
accepted: lean4#12746, #13602, #13618, #14631; a projection of a value of *another* structure,
lean4#14576, is not caught here: it needs a new inductive type, refused by default). The flags
read here were recomputed by `rebuild`. -/

/-- A projection `.proj s i _` whose `s` is a structure-like inductive type (one constructor, no
indices) whose constructor has more than `i` fields. -/
def projOk (look : Name → Option ConstantInfo) : Expr → Bool
  | .proj s i _ =>
    match look s with
    | some (.inductInfo v) =>
      v.numIndices == 0 && (match v.ctors with
        | [c] => (match look c with
          | some (.ctorInfo cv) => i < cv.numFields
          | _ => false)
        | _ => false)
    | _ => false
  | _ => true

/-- The terms of a constant that reach the kernel. -/
def termsOf : ConstantInfo → Array Expr
  | .defnInfo v => #[v.type, v.value]
  | .thmInfo v => #[v.type, v.value]
  | .opaqueInfo v => #[v.type, v.value]
  | .recInfo v => #[v.type] ++ (v.rules.map (·.rhs)).toArray
  | ci => #[ci.type]

/-- A constant that is not safe (`unsafe`, `partial`): a theorem never needs one (the kernel
refuses a safe declaration that uses it), and the kernel's checks of such declarations have had
holes (lean4#14608, lean4#14609). -/
def notSafe : ConstantInfo → Bool
  | .defnInfo v => match v.safety with
    | .safe => false
    | _ => true
  | .opaqueInfo v => v.isUnsafe
  | .inductInfo v => v.isUnsafe
  | .ctorInfo v => v.isUnsafe
  | .recInfo v => v.isUnsafe
  | .axiomInfo v => v.isUnsafe
  | _ => false

/-- The first bad shape in `ci`, as `(status, what)`, or `none`. -/
def badShape (look : Name → Option ConstantInfo) (ci : ConstantInfo) : Option (String × String) :=
  Id.run do
    -- The kernel's own auxiliary types of nested inductives are named `..._nested...`; a
    -- declaration that names one gives `False` without an axiom (lean4#14616).
    if ci.name.components.any (· == `_nested) then
      return some ("kernel_internal_name", "a name the kernel keeps for its own auxiliary types")
    if notSafe ci then return some ("not_safe", "an unsafe or partial declaration")
    for e in termsOf ci do
      if e.hasFVar then return some ("free_variable", "a free variable")
      if e.hasExprMVar || e.hasLevelMVar then return some ("metavariable", "a metavariable")
      if e.hasLooseBVars then return some ("loose_bvar", "a loose bound variable")
      if let some (.proj s i _) := e.find? (fun x => !projOk look x) then
        return some ("bad_projection",
          s!"the projection .{i} of {s}, which is not a structure with more than {i} fields")
    return none

def strs (xs : Array Name) : Json := Json.arr (xs.map fun n => Json.str n.toString)

/-- An axiom that `native_decide`/`bv_decide` leave on Lean v4.29+ (`nativeEqTrue`): named
`<decl>._native.<tactic>.ax_<i>_<j>` and of type `@Eq Bool e true`. The evaluation it stands
for happened in the process that elaborated the attempt; the policy decides whether to trust it.
Anything else with such a name is an ordinary (rejected) axiom. -/
def isNativeAxiom : ConstantInfo → Bool
  | .axiomInfo v =>
    v.name.components.any (· == `_native) && v.type.isAppOfArity ``Eq 3 &&
      v.type.appFn!.appFn!.appArg!.isConstOf ``Bool && v.type.appArg!.isConstOf ``Bool.true
  | _ => false

/-- What both checks read first (`run`, `runFile`): the attempt's constants, rebuilt, and which
of them the clean environment holds too. -/
structure Prepared where
  consts : Array (Name × ConstantInfo)
  byName : PersistentHashMap Name ConstantInfo
  /-- Constants the attempt shares, identically (`sameDecl`), with the clean environment: read
  from there, never replayed. -/
  trusted : NameSet
  /-- Answer placeholders among them (`abbrev solution : T := sorry` in both). -/
  placeholders : NameSet
  status : String
  detail : String

/-- Reads the attempt's file, rebuilds every constant before anything looks at it (`rebuild`),
and finds which constants the clean environment shares. `skip`: the target, which the clean
environment holds as the reference and is compared apart (`run`; `runFile` has none). -/
def prepare (path : String) (olean : Bool) (skip : Name) : CoreM Prepared := do
  let env ← getEnv
  -- Nothing of the file is looked at before it is rebuilt (see `rebuild`).
  let (consts, limit) := rebuild (← if olean then readOlean path else readReplPickle path)
  let byName : PersistentHashMap Name ConstantInfo :=
    consts.foldl (fun m (n, ci) => m.insert n ci) {}
  let mut status := "ok"
  let mut detail := ""
  if let some why := limit then
    status := "too_deep"
    detail := s!"the attempt's file holds {why}"
  -- The checker's own names are not the attempt's to declare: a constant under `LeanrlCheck`
  -- would be compared with (or shadow a lookup of) this file's declarations. Refused, whatever
  -- it is, with its own status.
  for (n, _) in consts do
    if n.getRoot == `LeanrlCheck && status == "ok" then
      status := "reserved_name"
      detail := s!"{n} is under `LeanrlCheck`, the namespace of leanrl's trusted checker"
  -- A hand-built constant map could file a constant under another name than its own, or under
  -- no name at all (which the replay's target slot would then never reach).
  for (n, ci) in consts do
    if (n != ci.name || n.isAnonymous) && status == "ok" then
      status := "replay_failed"
      detail := s!"the constant filed as {n} is named {ci.name}"
  -- Constants of the attempt that the clean environment also has (the statement's own helper
  -- definitions, the header's declarations) must be identical; they are then not replayed.
  let mut trusted : NameSet := {}
  let mut placeholders : NameSet := {}
  for (n, ci) in consts do
    if n == skip then continue
    if let some r := env.find? n then
      if sameDecl ci r then
        trusted := trusted.insert n
        if let .defnInfo v := r then
          if isSorryBody v.value then placeholders := placeholders.insert n
      else if status == "ok" then
        status := "helper_mismatch"
        detail := s!"{n} is declared differently from the clean environment's {n}"
  return { consts, byName, trusted, placeholders, status, detail }

/-- Logs the one `LEANRL-CHECK` report of a check: the facts Python's policy reads. Axioms the
attempt declares itself (not ones it shares, identically, with the clean environment) are
listed apart: Python refuses every one of them whatever its name, except `native` ones under
`allow_native_decide` (a name is only a spelling). -/
def logReport (nonce status detail kind refKind : String) (w : Walk)
    (lookNew : Name → Option ConstantInfo) (trusted : NameSet) (inductives : Array Name)
    (consts : Array (Name × ConstantInfo)) (restated replayed : Bool) : CoreM Unit := do
  let declared := w.axioms.filter fun n => (lookNew n).isSome && !trusted.contains n
  let native := declared.filter fun n => match lookNew n with
    | some ci => isNativeAxiom ci
    | none => false
  let j := Json.mkObj [
    ("nonce", Json.str nonce), ("status", Json.str status), ("detail", Json.str detail),
    ("kind", Json.str kind), ("ref_kind", Json.str refKind), ("axioms", strs w.axioms),
    -- `Lean.reduceBool`/`reduceNat` (one backtick: lean4#14953 removed them) make the kernel run
    -- compiled code, which it cannot do here: such a replay fails, and Python says why.
    ("new_axioms", strs declared), ("native", strs native), ("uses_reduce", Json.bool (w.seen.contains `Lean.reduceBool ||
      w.seen.contains `Lean.reduceNat)), ("inductives", strs inductives),
    ("constants", strs (consts.map (·.1))), ("restated", Json.bool restated),
    ("replayed", Json.bool replayed)]
  logInfo m!"LEANRL-CHECK {j.compress}"

/-- The options the kernel replay runs under: no heartbeat limit (the attempt may have
elaborated under `maxHeartbeats 0`), synchronous checking, and never skipped. `insert` with a
`DataValue`, not `setNat`: Lean made `Options` its own structure (lean4#12001) and kept only
part of the `KVMap` API on it; `insert` is in every version. -/
def replayOptions (o : Options) : Options :=
  (((o.setBool `debug.skipKernelTC false).setBool `Elab.async false).insert
    `maxHeartbeats (DataValue.ofNat 0)).insert `maxRecDepth (DataValue.ofNat 16384)

/-- The check. `path`: the attempt's constants (REPL pickle, or `.olean` when `olean`);
`target`: the theorem name; `nonce`: echoed back; `kernelReplay`: also replay through the
kernel; `restateHeartbeats`: the bound (thousands of heartbeats) on each of the two checks of a
restated statement (`sameStatement`). The reference declaration `target` must already exist in
the current environment.

Run it as `#eval LeanrlCheck.run ... |> Lean.Elab.Command.liftCoreM`: before Lean's `#eval`
rewrite (lean4#5627, after v4.9), `#eval` of a `CoreM` action ran it through
`MetaEval (CoreM α)` on a fresh `Core.State` and dropped the messages it logged, so the report
would be lost; a `CommandElabM` action logs into the command's own messages in every version. -/
def run (path target nonce : String) (olean kernelReplay : Bool)
    (restateHeartbeats : Nat := 20000) : CoreM Unit := do
  let tgt := target.toName
  let env ← getEnv
  let p ← prepare path olean tgt
  let consts := p.consts
  let lookNew : Name → Option ConstantInfo := fun n => p.byName.find? n
  -- The clean environment's copy wins: a constant the attempt shares with it is checked to be
  -- declared the same (`sameDecl`), but for a theorem that compares only its statement, and the
  -- attempt's body could then hide `sorryAx` or `Classical.choice` from the axiom walk.
  let look : Name → Option ConstantInfo := fun n =>
    match env.find? n with
    | some c => some c
    | none => lookNew n
  let mut status := p.status
  let mut detail := p.detail
  let trusted := p.trusted
  let placeholders := p.placeholders
  let attempt? := lookNew tgt
  let mut kind := "missing"
  let mut refKind := "missing"
  let mut restated := false
  let mut w : Walk := {}
  let mut inductives : Array Name := #[]
  -- The walk and the replay never resolve the target's name: the only constant of that name
  -- here is the reference, proved with `sorry`. A constant of the attempt that refers back to
  -- the target is then a missing dependency, and the target itself reaches the kernel only as
  -- `targetDecl` builds it from the attempt's own constant.
  let lookW : Name → Option ConstantInfo := fun n => if n == tgt then none else look n
  match env.find? tgt with
  | none =>
    if status == "ok" then
      status := "no_reference"
      detail := s!"reference {tgt} is not in the clean environment"
  | some ref =>
    refKind := kindOf ref
    match attempt? with
    | none =>
      if status == "ok" then
        status := "missing"
        let similar := consts.filter fun (n, _) =>
          n.toString.endsWith ("." ++ target) || n.toString.endsWith target
        detail := s!"no declaration named {tgt}; similar: {similar.map (·.1)}"
    | some ci =>
      kind := kindOf ci
      -- Only answer placeholders (`abbrev ..._solution := sorry`) are walked by type alone:
      -- every other constant's body is entered, shared with the reference or not.
      w := walk lookW (fun n => placeholders.contains n) (depsOf ci true)
      w := { w with order := w.order.push tgt }
      let sameLevels := ci.levelParams.length == ref.levelParams.length
      -- Equal up to the names of universes (matched by what they bind: `levelMap`): the fast
      -- answer. A restatement that differs goes to `sameStatement`: the elaborator's reducible
      -- isDefEq and the kernel must both accept it.
      restated := sameLevels && !(statedType ci ref id == ref.type)
      if status == "ok" then
        if kind != refKind then
          status := "wrong_kind"
          detail := s!"{tgt} is a {kind}, the reference is a {refKind}"
        else if !sameLevels then
          status := "type_mismatch"
          detail := s!"{tgt} has {ci.levelParams.length} universe parameters, the reference " ++
            s!"statement {ref.levelParams.length}"
        else if restated && !(kernelReplay && kind == "theorem") then
          status := "type_mismatch"
          detail := s!"the type of {tgt} differs from the reference statement's (only the " ++
            "two checks of the kernel replay can accept a restatement)"
        else if !w.missing.isEmpty then
          status := "missing_dependency"
          detail := s!"depends on unknown constants {w.missing}"
      let isNew : Name → Bool := fun n => (lookNew n).isSome && !trusted.contains n
      for n in w.order do
        if isNew n then
          if let some (.inductInfo _) := look n then inductives := inductives.push n
      -- Shapes that reach known kernel bugs, in the attempt's own copies (the target's
      -- included), before any of them is given to `addDecl`.
      for n in w.order do
        if status != "ok" then break
        let own? := if n == tgt then some ci else if isNew n then lookNew n else none
        if let some own := own? then
          if let some (st, what) := badShape lookW own then
            status := st
            detail := s!"{n} contains {what}"
      if status == "ok" && kernelReplay then
        let fresh := Name.mkStr tgt ("_leanrl_replay_" ++ nonce)
        let ren := retarget tgt fresh
        match targetDecl ci ref fresh ren with
        | .error why =>
          status := "replay_failed"
          detail := why
        | .ok tgtDecl =>
          let stated := if restated then some (ref.type, statedType ci ref ren, ref.levelParams)
            else none
          -- The kernel's own limits come from options (`replayOptions`).
          let (st, msg) ← withoutModifyingEnv <| withTheReader Core.Context
            (fun c => { c with options := replayOptions c.options, maxHeartbeats := 0 })
            (replay lookW isNew w.order tgt fresh (some tgtDecl) stated restateHeartbeats)
          if st != "" then
            status := st
            detail := msg
  logReport nonce status detail kind refKind w lookNew trusted inductives consts restated
    (kernelReplay && status == "ok")

/-- The check of a whole file (`Attempt.check == "file"`: a Kimina snippet that is not one
theorem against a reference, such as a `#check`, a `def` then a lemma, several theorems). There
is no target and no reference statement: every constant the file adds is a root. The same rules
as `run` hold for each of them: the rebuild and its caps, the reserved namespace, constants
shared with the clean environment declared identically, the kernel-bug shapes, the axiom walk,
and with `kernelReplay` the kernel replay of every new constant, dependencies first. The report
is `run`'s, with `kind` and `ref_kind` `file`; Python's policy decides from it as for a proof
(docs/verification.md, "file" checks). -/
def runFile (path nonce : String) (olean kernelReplay : Bool) : CoreM Unit := do
  let env ← getEnv
  let p ← prepare path olean .anonymous
  let consts := p.consts
  let lookNew : Name → Option ConstantInfo := fun n => p.byName.find? n
  let look : Name → Option ConstantInfo := fun n =>
    match env.find? n with
    | some c => some c
    | none => lookNew n
  let mut status := p.status
  let mut detail := p.detail
  let isNew : Name → Bool := fun n => (lookNew n).isSome && !p.trusted.contains n
  -- Roots: every new constant a proof can use. An unsafe or partial one (the old code
  -- generator's `_cstage1`/`_cstage2` of every compiled definition, the `_unsafe_rec` of a
  -- recursive or `partial` one, an `unsafe def`) is compiled code, not logic: the kernel refuses
  -- a safe declaration that uses it, and one a root does reach is still walked and refused
  -- below (`badShape`: `not_safe`). lean4checker skips them for the same reason.
  let roots := (consts.filter fun (n, ci) => isNew n && !notSafe ci).map (·.1)
  let w := walk look (fun n => p.placeholders.contains n) roots
  if status == "ok" && !w.missing.isEmpty then
    status := "missing_dependency"
    detail := s!"depends on unknown constants {w.missing}"
  let mut inductives : Array Name := #[]
  for n in w.order do
    if isNew n then
      if let some (.inductInfo _) := look n then inductives := inductives.push n
  for n in w.order do
    if status != "ok" then break
    if isNew n then
      if let some own := lookNew n then
        if let some (st, what) := badShape look own then
          status := st
          detail := s!"{n} contains {what}"
  if status == "ok" && kernelReplay then
    -- No target: the replay's target slot is the anonymous name, which `prepare` refused as a
    -- constant's name, so every constant goes through the kernel as itself.
    let (st, msg) ← withoutModifyingEnv <| withTheReader Core.Context
      (fun c => { c with options := replayOptions c.options, maxHeartbeats := 0 })
      (replay look isNew w.order .anonymous .anonymous none none 0)
    if st != "" then
      status := st
      detail := msg
  logReport nonce status detail "file" "file" w lookNew p.trusted inductives consts false
    (kernelReplay && status == "ok")

end LeanrlCheck
