/-
leanrl's trusted checker (see docs/verification.md).

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

/-- Depth-first walk over everything `n` depends on: collects axioms, missing constants, and a
dependency order (dependencies first). Bodies of `typeOnly` constants are not entered. -/
partial def walk (look : Name → Option ConstantInfo) (typeOnly : Name → Bool) (n : Name) :
    StateM Walk Unit := do
  if (← get).seen.contains n then return
  modify fun s => { s with seen := s.seen.insert n }
  match look n with
  | none => modify fun s => { s with missing := s.missing.push n }
  | some ci =>
    if kindOf ci == "axiom" then
      modify fun s => { s with axioms := s.axioms.push n }
    for d in depsOf ci (!typeOnly n) do
      walk look typeOnly d
    -- The kernel checks an inductive block together with its constructors, so what their types
    -- mention must come first in `order`, also when the walk reached the block from a constructor
    -- (whose own frame has not finished yet: `node : T → D → T` would put `T` before `D`).
    if let .inductInfo v := ci then
      for i in v.all do
        if let some (.inductInfo iv) := look i then
          for c in iv.ctors do
            if let some cc := look c then
              for d in cc.type.getUsedConstants do
                walk look typeOnly d
    modify fun s => { s with order := s.order.push n }

/-- `e` with every reference to `target` pointing at `fresh` instead. The judge's environment
holds the reference statement under `target` (proved with `sorry`); an attempt's constant that
mentioned `target` would otherwise be checked against that reference -- a cycle `cheat := target`,
`target := cheat` would pass. Renamed, such a reference is to a constant not yet added, and the
kernel refuses it. -/
def retarget (target fresh : Name) (e : Expr) : Expr :=
  e.replace fun x => match x with
    | .const n ls => if n == target then some (.const fresh ls) else none
    | _ => none

def toDecl (ci : ConstantInfo) (name : Name) (ren : Expr → Expr) : Option Declaration :=
  match ci with
  | .axiomInfo v => some (.axiomDecl { v with name := name, type := ren v.type })
  | .defnInfo v => some (.defnDecl { v with name := name, type := ren v.type, value := ren v.value })
  | .thmInfo v => some (.thmDecl { v with name := name, type := ren v.type, value := ren v.value })
  | .opaqueInfo v =>
    some (.opaqueDecl { v with name := name, type := ren v.type, value := ren v.value })
  | _ => none

/-- Re-add the attempt's own constants through the kernel (dependencies first); the target is
added under a fresh name because the reference already owns its name here, and every reference
to the target is renamed with it (`retarget`). -/
def replay (look : Name → Option ConstantInfo) (isNew : Name → Bool) (order : Array Name)
    (target fresh : Name) : CoreM String := do
  let ren := retarget target fresh
  let mut added : NameSet := {}
  for n in order do
    unless isNew n do continue
    if added.contains n then continue
    let some ci := look n | return s!"missing {n}"
    match ci with
    | .inductInfo v =>
      let mut types : List InductiveType := []
      for i in v.all do
        let some (.inductInfo iv) := look i | return s!"inductive block of {n} incomplete"
        let mut ctors : List Constructor := []
        for c in iv.ctors do
          let some cc := look c | return s!"constructor {c} missing"
          ctors := ctors ++ [{ name := c, type := ren cc.type }]
        types := types ++ [{ name := i, type := ren iv.type, ctors := ctors }]
        added := added.insert i
      try addDecl (.inductDecl v.levelParams v.numParams types false)
      catch e => return s!"kernel rejected inductive {n}: {← e.toMessageData.toString}"
    | .ctorInfo _ => pure ()
    | .recInfo _ => pure ()
    | .quotInfo _ => return s!"{n} is a quotient primitive, which no proof may add"
    | _ =>
      let some d := toDecl ci (if n == target then fresh else n) ren
        | return s!"cannot replay {n}"
      try addDecl d
      catch e => return s!"kernel rejected {n}: {← e.toMessageData.toString}"
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
    if same == some false then return s!"{n} differs from what the kernel generates"
  return ""

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

/-- The check. `path`: the attempt's constants (REPL pickle, or `.olean` when `olean`);
`target`: the theorem name; `nonce`: echoed back; `kernelReplay`: also replay through the
kernel. The reference declaration `target` must already exist in the current environment.

Run it as `#eval LeanrlCheck.run ... |> Lean.Elab.Command.liftCoreM`: before Lean's `#eval`
rewrite (lean4#5627, after v4.9), `#eval` of a `CoreM` action ran it through
`MetaEval (CoreM α)` on a fresh `Core.State` and dropped the messages it logged, so the report
would be lost; a `CommandElabM` action logs into the command's own messages in every version. -/
def run (path target nonce : String) (olean kernelReplay : Bool) : CoreM Unit := do
  let tgt := target.toName
  let env ← getEnv
  let consts ← if olean then readOlean path else readReplPickle path
  let byName : PersistentHashMap Name ConstantInfo :=
    consts.foldl (fun m (n, ci) => m.insert n ci) {}
  let lookNew : Name → Option ConstantInfo := fun n => byName.find? n
  let look : Name → Option ConstantInfo := fun n =>
    match lookNew n with
    | some c => some c
    | none => env.find? n
  -- Constants of the attempt that the clean environment also has (the statement's own helper
  -- definitions, the header's declarations) must be identical; they are then not replayed.
  let mut status := "ok"
  let mut detail := ""
  let mut trusted : NameSet := {}
  -- A hand-built constant map could file a constant under another name than its own.
  for (n, ci) in consts do
    if n != ci.name && status == "ok" then
      status := "replay_failed"
      detail := s!"the constant filed as {n} is named {ci.name}"
  let mut placeholders : NameSet := {}
  for (n, ci) in consts do
    if n == tgt then continue
    if let some r := env.find? n then
      if sameDecl ci r then
        trusted := trusted.insert n
        if let .defnInfo v := r then
          if isSorryBody v.value then placeholders := placeholders.insert n
      else if status == "ok" then
        status := "helper_mismatch"
        detail := s!"{n} is declared differently from the reference statement's {n}"
  let attempt? := lookNew tgt
  let mut kind := "missing"
  let mut refKind := "missing"
  let mut w : Walk := {}
  let mut inductives : Array Name := #[]
  match env.find? tgt with
  | none =>
    status := "no_reference"
    detail := s!"reference {tgt} is not in the clean environment"
  | some ref =>
    refKind := kindOf ref
    match attempt? with
    | none =>
      status := "missing"
      let similar := consts.filter fun (n, _) =>
        n.toString.endsWith ("." ++ target) || n.toString.endsWith target
      detail := s!"no declaration named {tgt}; similar: {similar.map (·.1)}"
    | some ci =>
      kind := kindOf ci
      -- Walked from the target's dependencies, with the target itself unresolvable: a
      -- constant of the attempt that refers back to the target is a missing dependency (the
      -- only constant of that name here is the reference, proved with `sorry`).
      let lookW : Name → Option ConstantInfo := fun n => if n == tgt then none else look n
      let rootWalk : StateM Walk Unit := do
        -- Only answer placeholders (`abbrev ..._solution := sorry`) are walked by type alone:
        -- every other constant's body is entered, shared with the reference or not.
        for d in depsOf ci true do walk lookW (fun n => placeholders.contains n) d
        modify fun (s : Walk) => { s with order := s.order.push tgt }
      w := (Id.run (rootWalk.run {})).2
      if status == "ok" then
        if kind != refKind then
          status := "wrong_kind"
          detail := s!"{tgt} is a {kind}, the reference is a {refKind}"
        else if ci.levelParams != ref.levelParams || !(ci.type == ref.type) then
          status := "type_mismatch"
          detail := s!"the type of {tgt} differs from the reference statement's"
        else if !w.missing.isEmpty then
          status := "missing_dependency"
          detail := s!"depends on unknown constants {w.missing}"
      let isNew : Name → Bool := fun n => (lookNew n).isSome && !trusted.contains n
      for n in w.order do
        if isNew n then
          if let some (.inductInfo _) := look n then inductives := inductives.push n
      if status == "ok" && kernelReplay then
        let fresh := Name.mkStr tgt ("_leanrl_replay_" ++ nonce)
        -- The kernel's own limits come from options: no heartbeat limit (the attempt may have
        -- elaborated under `maxHeartbeats 0`), synchronous checking, and never skipped.
        let opts (o : Options) : Options :=
          ((((o.setBool `debug.skipKernelTC false).setBool `Elab.async false).setNat
            `maxHeartbeats 0).setNat `maxRecDepth 16384)
        let msg ← withoutModifyingEnv <| withTheReader Core.Context
          (fun c => { c with options := opts c.options, maxHeartbeats := 0 })
          (replay look isNew w.order tgt fresh)
        if msg != "" then
          status := "replay_failed"
          detail := msg
  let native := w.axioms.filter fun n => match lookNew n with
    | some ci => isNativeAxiom ci && !trusted.contains n
    | none => false
  let j := Json.mkObj [
    ("nonce", Json.str nonce), ("status", Json.str status), ("detail", Json.str detail),
    ("kind", Json.str kind), ("ref_kind", Json.str refKind), ("axioms", strs w.axioms),
    -- `Lean.reduceBool`/`reduceNat` (one backtick: lean4#14953 removed them) make the kernel run
    -- compiled code, which it cannot do here: such a replay fails, and Python says why.
    ("native", strs native), ("uses_reduce", Json.bool (w.seen.contains `Lean.reduceBool ||
      w.seen.contains `Lean.reduceNat)), ("inductives", strs inductives),
    ("constants", strs (consts.map (·.1))), ("replayed", Json.bool (kernelReplay && status == "ok"))]
  logInfo m!"LEANRL-CHECK {j.compress}"

end LeanrlCheck
