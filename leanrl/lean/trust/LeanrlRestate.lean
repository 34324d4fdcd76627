/-
leanrl's trusted checker, part 1 of 2 (see docs/verification.md): deciding a restated statement.

`checker_source()` (leanrl/lean/trust/report.py) sends this file, then `LeanrlCheck.lean`, to a
judge process as one text; both are in the namespace `LeanrlCheck`. This part holds what decides
whether an attempt that restated its theorem stated the reference statement: the universe
parameters paired by what they bind, and two independent, bounded checks of definitional
equality. It is used by `replay` and `run` in `LeanrlCheck.lean`. Only APIs that exist from
Lean v4.8 on are used (`collectLevelParams`, `Core.CoreM.toIO`, `EIO.toBaseIO`,
`Meta.withTransparency`, `Meta.isDefEq`, `MetaM.run'`, `addDecl`); names that may be missing are
written with one backtick.
-/
namespace LeanrlCheck
open Lean

/-- The universe parameters `e` mentions, in the order it first mentions them. -/
def levelOrder (e : Expr) : Array Name :=
  (collectLevelParams {} e).params

/-- The reference's universe for each of the attempt's universe parameters (in the attempt's
`levelParams` order), matched by what they bind, not by where they stand in the list: the
attempt's parameters in the order its statement first mentions them are paired with the
reference's in the order the reference's statement first mentions them. `universe u v` then
`{α : Type v} {β : Type u}` lists `[u, v]` in one file and `[v, u]` in another (Lean orders a
declaration's universes by the `universe` commands, then by first use), while the statements
use them alike. Where the two orders do not pair up one to one (a parameter neither statement
mentions, different counts), the parameters are paired by position, as Lean lists them; the
statement check then decides. -/
def levelMap (attempt ref : ConstantInfo) : List Level := Id.run do
  let byPos := ref.levelParams.map Level.param
  let a := levelOrder attempt.type
  let r := levelOrder ref.type
  if a.size != attempt.levelParams.length || r.size != ref.levelParams.length ||
      a.size != r.size then
    return byPos
  let mut out : Array Level := #[]
  for p in attempt.levelParams do
    let mut hit := Level.param p  -- (replaced below: `a` holds every parameter)
    for i in [0:a.size] do
      if a[i]! == p then hit := Level.param r[i]!
    out := out.push hit
  return out.toList

/-! ## A restated statement: two independent checks, each bounded

A restated target (its type is not the reference's up to universe names) is accepted only when
two independent procedures both say it is the reference statement: the elaborator's `isDefEq` at
**reducible** transparency, under a heartbeat bound, and then the kernel's definitional equality.
Either alone would make the reward only as sound as that one procedure: a kernel
definitional-equality bug in a pinned toolchain would otherwise be a reward with no elaborator
hole at all (an attempt restates the theorem as something that bug makes "equal" to anything,
proves that, and is checked against the reference). At reducible transparency only reducible
definitions unfold (`GT.gt`, `GE.ge`, `Ne`, instances), which is all an honest restatement needs
(`x > 0` for `0 < x`, other binder names and annotations, renamed universes); a statement that
matches the reference only after unfolding ordinary definitions -- the attempt's own helpers
included, which carry no reducibility attribute here -- is refused.

Restated terms are evaluated here first (the elaborating process only elaborated them as a
type), so both checks are bounded: literal arithmetic past `maxLiteralBits` is refused before
either check reduces anything (a kernel `Nat.shiftLeft` by 2^32 aborts the process on every
pinned Lean, and before v4.11 neither the kernel nor `whnf` bounds `Nat.pow`), the Meta check
and the kernel check run under `restateHeartbeats`, and any exception either throws -- a
heartbeat or recursion limit included, which `try`/`catch` in `CoreM` lets through -- ends the
check with its own status instead of the report. What the judge process cannot bound itself (a
GMP abort, memory) is bounded by the pool around it: the attempt gets `judge_limit` and is never
retried. -/

/-- Past this many bits a literal computation in a restated statement is not evaluated. -/
def maxLiteralBits : Nat := 1048576

/-- Bits past which `natBits` stops counting (it only has to know the bound is exceeded). -/
def bitsCeiling : Nat := 1099511627776

/-- `(operation, left, right)` for a binary operation on natural numbers written with its
`Nat.*` function or its notation class (`HPow.hPow`, ...; `Monoid.npow n x` is `x ^ n`). -/
def natBinOp? (e : Expr) : Option (String × Expr × Expr) :=
  let two (op : String) := some (op, e.appFn!.appArg!, e.appArg!)
  match e.getAppFn with
  | .const n _ =>
    let k := e.getAppNumArgs
    if k == 2 then
      if n == ``Nat.add then two "add" else if n == ``Nat.mul then two "mul"
      else if n == ``Nat.pow then two "pow" else if n == ``Nat.shiftLeft then two "shl"
      else if n == ``Nat.sub || n == ``Nat.div || n == ``Nat.mod || n == ``Nat.gcd ||
        n == ``Nat.shiftRight || n == ``Nat.land || n == ``Nat.lor || n == ``Nat.xor then
        two "small"
      else none
    else if k == 6 then
      if n == ``HAdd.hAdd then two "add" else if n == ``HMul.hMul then two "mul"
      else if n == ``HPow.hPow then two "pow" else if n == ``HShiftLeft.hShiftLeft then two "shl"
      else if n == ``HSub.hSub || n == ``HDiv.hDiv || n == ``HMod.hMod ||
        n == ``HShiftRight.hShiftRight || n == ``HAnd.hAnd || n == ``HOr.hOr ||
        n == ``HXor.hXor then two "small"
      else none
    else if k == 4 && n == `Monoid.npow then
      some ("pow", e.appArg!, e.appFn!.appArg!)
    else none
  | _ => none

/-- An upper bound on the bits of the number a closed literal computation denotes
(`2 ^ (2 ^ 40)`, `1 <<< 4294967296`), capped at `bitsCeiling`; `none` when `e` is not one. -/
partial def natBits (e : Expr) : Option Nat :=
  let cap (b : Nat) := Nat.min b bitsCeiling
  match e with
  | .lit (.natVal n) => some (Nat.log2 n + 1)
  | .mdata _ b => natBits b
  | _ =>
    if e.isAppOfArity ``OfNat.ofNat 3 then natBits e.appFn!.appArg!
    else if e.isAppOfArity ``Nat.succ 1 then (natBits e.appArg!).map (· + 1)
    else match natBinOp? e with
      | some (op, a, b) => do
        let x ← natBits a
        let y ← natBits b
        match op with
        | "add" => some (cap (Nat.max x y + 1))
        | "mul" => some (cap (x + y))
        -- `a ^ b` has at most `x * b` bits, and `b < 2 ^ y`
        | "pow" => some (if y ≥ 40 then bitsCeiling else cap (x * 2 ^ y))
        | "shl" => some (if y ≥ 40 then bitsCeiling else cap (x + 2 ^ y))
        | _ => some (Nat.max x y)
      | none => none

/-- A literal computation in `e` whose value may exceed `maxLiteralBits` bits, as text. -/
def bigComputation? (e : Expr) : Option String :=
  (e.find? fun x => match natBinOp? x with
    | some _ => (natBits x).any (· > maxLiteralBits)
    | none => false).map fun x =>
      s!"a number of up to {(natBits x).getD 0} bits ({x.getAppFn.constName!} ...)"

/-- Runs `x` in a context of its own, bounded by `heartbeats` (thousands, as the option counts
them; the kernel reads the option, the elaborator the context), and returns what it threw as
text instead of throwing. Catching at the level of `IO` sees every exception, the runtime ones
(heartbeats, recursion depth) included, in every Lean version this file supports
(`Core.tryCatchRuntimeEx` is not in v4.8). The state `x` leaves is dropped. -/
def bounded {α : Type} (x : CoreM α) (heartbeats : Nat) : CoreM (Except String α) := do
  let ctx ← read
  let opts := ctx.options.insert `maxHeartbeats (DataValue.ofNat heartbeats)
  let ctx' := { ctx with options := opts, maxHeartbeats := heartbeats * 1000 }
  match ← EIO.toBaseIO (Core.CoreM.toIO x ctx' (← get)) with
  | .ok (a, _) => return .ok a
  | .error e => return .error (toString e)

/-- Whether an error of `bounded` is one of its bounds (not a refusal). -/
def isLimit (why : String) : Bool :=
  let has (s : String) : Bool := (why.splitOn s).length > 1
  has "heartbeats" || has "maximum recursion depth" || has "deep recursion" ||
    has "deterministic" || has "stack overflow"

/-- Decide whether a restated target's type `stated` is the reference statement `refType`:
`none` when both checks say so, else `(status, detail)`, the detail saying which check refused.
The kernel's check adds `@Eq.refl Prop ref : @Eq Prop ref stated` as a throwaway theorem (only
`addDecl`: the kernel's own `isDefEq` changed its signature across versions), and only for
propositions: the target of a proof task is a theorem. -/
def sameStatement (refType stated : Expr) (lps : List Name) (name : Name) (heartbeats : Nat) :
    CoreM (Option (String × String)) := do
  if let some what := bigComputation? stated then
    return some ("judge_limit", s!"the restated statement computes {what}; the judge evaluates " ++
      s!"no literal arithmetic past {maxLiteralBits} bits")
  -- 1. the elaborator, at reducible transparency
  let viaMeta : CoreM Bool :=
    (Meta.withTransparency .reducible (Meta.isDefEq refType stated)).run'
  match ← bounded viaMeta heartbeats with
  | .error why =>
    if isLimit why then
      return some ("judge_limit", s!"the elaborator's reducible isDefEq went past its bound " ++
        s!"({heartbeats} heartbeats): {why}")
    return some ("type_mismatch", s!"the elaborator's reducible isDefEq failed: {why}")
  | .ok false =>
    return some ("type_mismatch", "the elaborator's isDefEq at reducible transparency says " ++
      "it is not the reference statement (only reducible definitions are unfolded)")
  | .ok true => pure ()
  -- 2. the kernel, which must agree
  let one := Level.succ .zero
  let ty := mkApp3 (.const ``Eq [one]) (.sort .zero) refType stated
  let val := mkApp2 (.const ``Eq.refl [one]) (.sort .zero) refType
  let viaKernel : CoreM Unit :=
    addDecl (.thmDecl { name := name, levelParams := lps, type := ty, value := val, all := [name] })
  match ← bounded viaKernel heartbeats with
  | .ok () => return none
  | .error why =>
    if isLimit why then
      return some ("judge_limit", s!"the kernel's check went past its bound ({heartbeats} " ++
        s!"heartbeats): {why}")
    return some ("type_mismatch", s!"the elaborator's reducible isDefEq accepted it, the " ++
      s!"kernel did not: {why}")

end LeanrlCheck
