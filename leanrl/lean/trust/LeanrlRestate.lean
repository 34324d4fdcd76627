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
use them alike. When the attempt uses the reference's very names, each name stands for itself.
Where the two orders do not pair up one to one (a parameter neither statement mentions,
different counts), the parameters are paired by position, as Lean lists them. Whatever the
pairing, the statement checks and the kernel's check of the proof against the reference's type
decide: a wrong pairing can only refuse. -/
def levelMap (attempt ref : ConstantInfo) : List Level := Id.run do
  let byPos := ref.levelParams.map Level.param
  -- The same names in another order (auto-bound universes are listed by first use): each name
  -- stands for itself.
  if attempt.levelParams.length == ref.levelParams.length &&
      attempt.levelParams.all (ref.levelParams.contains ·) then
    return attempt.levelParams.map Level.param
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

(Lean compares implicit and instance arguments at a higher transparency -- `.default` up to
v4.28, `.instances` after -- so two instance paths to the same operation still agree.)

Restated terms are evaluated here first (the elaborating process only elaborated them as a
type), so both checks are bounded. The Meta check and the kernel check each run under
`restateHeartbeats` on a thread of their own (`bounded`), and any exception either throws -- a
heartbeat or recursion limit included, which `try`/`catch` in `CoreM` lets through -- ends the
check with its own status instead of the report. A cheap first filter refuses literal arithmetic
on `ℕ` past `maxLiteralBits` before either check reduces anything (a kernel `Nat.shiftLeft` by
2^32 aborts the process on every pinned Lean, and before v4.11 neither the kernel nor `whnf`
bounds `Nat.pow`). What the judge process cannot bound itself -- a computation the filter does
not see (a helper definition, an instance), a GMP abort, memory -- is bounded by the pool around
it: the attempt gets `judge_limit` and is never retried. -/

/-- Past this many bits a literal computation in a restated statement is not evaluated. -/
def maxLiteralBits : Nat := 1048576

/-- Bits past which `natBits` stops counting (it only has to know the bound is exceeded). -/
def bitsCeiling : Nat := 1099511627776

/-- Nodes the literal bound looks at in one restated statement; past it the statement is too big
to bound (and refused), so the look is linear in the term however it shares its subterms. -/
def boundFuel : Nat := 100000

/-- Past this exponent (shift) the runtime's `Nat.pow` and `Nat.shiftLeft` abort the process
(`lean_internal_panic` in `lean_nat_pow`/`lean_nat_shiftl`), whatever the base. -/
def maxRuntimeExp : Nat := 4294967295

/-- Whether a type argument may be `ℕ`: only natural-number literals reach GMP in the kernel and
in `whnf`'s literal folding. `nonNat` says which constants are types known not to be `ℕ` (an
inductive type of the clean environment other than `Nat`: `ℝ`, `ℤ`, `ℚ`); anything else -- `id ℕ`,
an attempt's own `abbrev N := ℕ` -- might be `ℕ`, so it counts. -/
def isNatType (nonNat : Name → Bool) (e : Expr) : Bool :=
  match e.consumeMData with
  | .const n _ => !nonNat n
  | _ => true

/-- The head of `e` and its number of arguments when it has at most 6 (every form `natBinOp?`
reads has 2 to 6): constant time however long the spine, where `getAppFn` would walk it all at
every node of it. -/
def shortSpine? (e : Expr) : Option (Expr × Nat) := Id.run do
  let mut h := e
  let mut k := 0
  for _ in [0:6] do
    if let .app f _ := h then
      h := f
      k := k + 1
    else
      return some (h, k)
  return if h.isApp then none else some (h, k)

/-- The value of a natural-number literal (`5` raw, or `OfNat.ofNat ℕ 5 (instOfNatNat 5)`, the
core instance, with the same literal), if `e` is one. A numeral through another `OfNat ℕ`
instance is not read as its digits: an attempt's own instance could make `(5 : ℕ)` stand for
anything. -/
def natLit? (e : Expr) : Option Nat :=
  match e.consumeMData with
  | .lit (.natVal n) => some n
  | e' =>
    if e'.isAppOfArity ``OfNat.ofNat 3 && e'.appArg!.isAppOfArity ``instOfNatNat 1 then
      match e'.appFn!.appArg!.consumeMData, e'.appArg!.appArg!.consumeMData with
      | .lit (.natVal n), .lit (.natVal m) => if n == m then some n else none
      | _, _ => none
    else none

/-- `(operation, left, right)` for a binary operation on natural numbers, written with its
`Nat.*` function, its heterogeneous class (`HPow.hPow ℕ ℕ ℕ _ a b`), its homogeneous class
(`Pow.pow`, `Mul.mul`, ...), or `Monoid.npow n x` (`x ^ n`). `nonNat`: see `isNatType`. -/
def natBinOp? (nonNat : Name → Bool) (e : Expr) : Option (String × Expr × Expr) :=
  let two (op : String) := some (op, e.appFn!.appArg!, e.appArg!)
  let arg (i : Nat) : Expr := e.getArg! i
  match shortSpine? e with
  | some (.const n _, k) =>
    if k == 2 then
      if n == ``Nat.add then two "add" else if n == ``Nat.mul then two "mul"
      else if n == ``Nat.pow then two "pow" else if n == ``Nat.shiftLeft then two "shl"
      else if n == ``Nat.sub || n == ``Nat.div || n == ``Nat.mod || n == ``Nat.gcd ||
        n == ``Nat.shiftRight || n == ``Nat.land || n == ``Nat.lor || n == ``Nat.xor then
        two "small"
      else none
    else if k == 6 && isNatType nonNat (arg 0) then
      if n == ``HAdd.hAdd then two "add" else if n == ``HMul.hMul then two "mul"
      else if n == ``HPow.hPow then two "pow" else if n == ``HShiftLeft.hShiftLeft then two "shl"
      else if n == ``HSub.hSub || n == ``HDiv.hDiv || n == ``HMod.hMod ||
        n == ``HShiftRight.hShiftRight || n == ``HAnd.hAnd || n == ``HOr.hOr ||
        n == ``HXor.hXor then two "small"
      else none
    else if k == 5 && isNatType nonNat (arg 0) && n == ``Pow.pow then two "pow"
    else if k == 4 && isNatType nonNat (arg 0) then
      if n == ``Add.add then two "add" else if n == ``Mul.mul then two "mul"
      else if n == `NatPow.pow || n == `HomogeneousPow.pow then two "pow"
      else if n == ``ShiftLeft.shiftLeft then two "shl"
      else if n == `Monoid.npow then some ("pow", e.appArg!, e.appFn!.appArg!)
      else none
    else none
  | _ => none

/-- The exact value of a small literal computation on `ℕ` (every value below 2^64, at most
`depth` levels deep: at most 63 nodes looked at), if `e` is one: an exponent is then sized by its value, not by its bits (`2 ^ 2 ^ 16` is a
number of 65,537 bits, not of up to 2 · 2^17). -/
partial def smallVal? (nonNat : Name → Bool) (e : Expr) (depth : Nat := 5) : Option Nat := do
  let small (v : Nat) : Option Nat := if v < 18446744073709551616 then some v else none
  -- a leaf past 2^64 is not small either: nothing big is computed here
  if let some n := natLit? e then return (← small n)
  if depth == 0 then failure
  let (op, a, b) ← natBinOp? nonNat e
  let x ← smallVal? nonNat a (depth - 1)
  let y ← smallVal? nonNat b (depth - 1)
  match op with
  | "add" => small (x + y)
  | "mul" => small (x * y)
  | "pow" => if y ≤ 64 then small (x ^ y) else if x ≤ 1 then some x else none
  | "shl" => if y < 64 then small (x * 2 ^ y) else if x == 0 then some 0 else none
  | _ => none

/-- Whether `e` holds a `let` or a beta-redex: a bound variable there stands for a value both
checks substitute before they compute (`let k := 4294967296; 1 <<< k`, `have`). -/
def bindsValues (e : Expr) : Bool :=
  -- `appFn!`, not `getAppFn`: the innermost node of a redex's spine has the lambda as its
  -- function, and `find?` visits it (a long spine is not walked at each of its nodes); `have`
  -- elaborates to `letFun` on the Lean versions that have it
  (e.find? fun x => x.isLet || (x.isApp && x.appFn!.consumeMData.isLambda) ||
    x.isAppOfArity `letFun 4).isSome

/-- A term's address: the key of the maps below. Structural hashing would let an attempt choose
colliding subterms (a literal's hash is its value mod 2^64) and make each look-up linear; an
address cannot be chosen. The terms stay alive while they are looked at, so an address names
one node. -/
unsafe def addrImpl (e : Expr) : USize := ptrAddrUnsafe e

@[implemented_by addrImpl]
opaque addr (e : Expr) : USize

/-- What the literal bound remembers while it looks at one statement. -/
structure BitsState where
  /-- `natBits` of every node seen, by address (terms share subterms: each is looked at once). -/
  memo : PersistentHashMap USize (Option Nat) := {}
  /-- Nodes the scan has entered, by address. -/
  seen : PersistentHashMap USize Unit := {}
  /-- Nodes left to look at (`boundFuel`). -/
  fuel : Nat := boundFuel
  /-- The statement binds values (`bindsValues`): a bound variable may be a number. -/
  valued : Bool := false
  /-- Types known not to be `ℕ` (`isNatType`). -/
  nonNat : Name → Bool := fun n => n != ``Nat

abbrev BitsM := StateM BitsState

/-- Take one unit of fuel; false when there is none left. -/
def burn : BitsM Bool := do
  let st ← get
  if st.fuel == 0 then return false
  set { st with fuel := st.fuel - 1 }
  return true

/-- The bits of `op a b` from bounds `x?`, `y?` on the bits of `a` and `b`, capped at
`bitsCeiling`. A power or shift whose exponent is past `maxRuntimeExp` is unbounded whatever the
base (the runtime aborts); one whose exponent is closed -- no bound variable, or the statement
binds values (`valued`) -- but cannot be sized (`2 ^ (id 1099511627776)`, a helper constant) is
unbounded too, since both checks would reduce it to a literal of unknown size; so is a closed
base that cannot be sized under an exponent past `maxLiteralBits`. -/
def combineBits (op : String) (a b : Expr) (x? y? : Option Nat) (valued : Bool)
    (nonNat : Name → Bool) : Option Nat :=
  let cap (v : Nat) := Nat.min v bitsCeiling
  let closed (t : Expr) : Bool := !t.hasFVar && (valued || !t.hasLooseBVars)
  -- an upper bound on the exponent (shift) `b`: its value when it is small, else from its bits
  let e? : Option Nat := match smallVal? nonNat b, y? with
    | some n, _ => some n
    | none, some y => if y ≥ 40 then none else some (2 ^ y)
    | none, none => none
  match op with
  | "pow" | "shl" =>
    match e? with
    | none => if closed b then some bitsCeiling else none
    | some n =>
      if n > maxRuntimeExp then some bitsCeiling
      else match x? with
        | some x =>
          if op == "shl" then some (cap (x + n))
          else if x ≤ 1 then some 1  -- `0 ^ n`, `1 ^ n` (`n` below 2^32)
          else some (Nat.max 1 (cap (x * n)))  -- `a ^ n` has at most `x * n` bits
        | none => if closed a && n > maxLiteralBits then some bitsCeiling else none
  | _ =>
    match op, x?, y? with
    | "add", some x, some y => some (cap (Nat.max x y + 1))
    | "mul", some x, some y => some (cap (x + y))
    | _, some x, some y => some (Nat.max x y)
    | _, _, _ => none

/-- An upper bound on the bits of the number a closed literal computation on `ℕ` denotes
(`2 ^ (2 ^ 40)`, `1 <<< 4294967296`), capped at `bitsCeiling`; `none` when `e` is not one
(see `combineBits`). Each node is looked at once (`memo`); out of fuel, a term is unbounded. -/
partial def natBits (e : Expr) : BitsM (Option Nat) := do
  if let some r := (← get).memo.find? (addr e) then return r
  if !(← burn) then return some bitsCeiling
  let mut r : Option Nat := none
  if let some n := natLit? e then
    r := some (Nat.log2 n + 1)
  else if e.isAppOfArity ``Nat.succ 1 then
    r := (← natBits e.appArg!).map (· + 1)
  else if let some (op, a, b) := natBinOp? (← get).nonNat e then
    let x? ← natBits a
    let y? ← natBits b
    let st ← get
    r := combineBits op a b x? y? st.valued st.nonNat
  modify fun st => { st with memo := st.memo.insert (addr e) r }
  return r

/-- The first literal computation in `e` whose value may exceed `maxLiteralBits` bits and that
`ref` does not hold verbatim (both checks compare equal subterms without reducing them), as
text; or `e` too big to look at within `boundFuel` nodes. Each shared node is entered once. -/
partial def bigIn (ref e : Expr) : BitsM (Option String) := do
  if (← get).seen.contains (addr e) then return none
  modify fun st => { st with seen := st.seen.insert (addr e) () }
  if !(← burn) then
    return some s!"a statement too big to bound (over {boundFuel} nodes)"
  if (natBinOp? (← get).nonNat e).isSome then
    if let some b := (← natBits e) then
      if b > maxLiteralBits && (ref.find? (· == e)).isNone then
        if (← get).fuel == 0 then
          return some s!"a statement too big to bound (over {boundFuel} nodes)"
        return some s!"a number of up to {b} bits ({e.getAppFn.constName!} ...)"
  let kids : Array Expr := match e with
    | .app f a => #[f, a]
    | .lam _ t b _ => #[t, b]
    | .forallE _ t b _ => #[t, b]
    | .letE _ t v b _ => #[t, v, b]
    | .mdata _ b => #[b]
    | .proj _ _ b => #[b]
    | _ => #[]
  for k in kids do
    if let some why := (← bigIn ref k) then return some why
  return none

/-- A literal computation in the restated statement `stated` past the bound (see `bigIn`): a
cheap first filter, so that the commonest ways to stall or kill the judge (`1 <<< 4294967296`,
`2 ^ (2 ^ 40)`, `let k := 4294967296; 1 <<< k`) cost a clear refusal instead of a judge; what
it cannot see -- a helper definition or an instance that computes -- is bounded by the pool
around the judge (`judge_limit`). -/
def bigComputation? (ref stated : Expr) (nonNat : Name → Bool) : Option String :=
  Id.run ((bigIn ref stated).run' { valued := bindsValues stated, nonNat := nonNat })

/-- Runs `x` bounded by `heartbeats` (thousands, as the option counts them; the kernel reads the
option, the elaborator the context) and `maxRecDepth` 512 (the elaborator's default), and returns
what it threw as text instead of throwing. Catching at the level of `IO` sees every exception,
the runtime ones (heartbeats, recursion depth) included, in every Lean version this file supports
(`Core.tryCatchRuntimeEx` is not in v4.8). It runs on a thread of its own: the kernel compares
its bound with a per-thread count of its steps that `addDecl` never resets, which on the judge's
one long-lived thread would hold every kernel check the judge ever ran; a new thread starts the
kernel's count at zero (the elaborator's bound is taken from the count when `x` starts,
`CoreM.toIO`). The state `x` leaves is dropped. -/
def bounded {α : Type} (x : CoreM α) (heartbeats : Nat) : CoreM (Except String α) := do
  let ctx ← read
  let opts := (ctx.options.insert `maxHeartbeats (DataValue.ofNat heartbeats)).insert
    `maxRecDepth (DataValue.ofNat 512)
  let ctx' := { ctx with options := opts, maxHeartbeats := heartbeats * 1000, maxRecDepth := 512 }
  let s ← get
  let t ← BaseIO.asTask (EIO.toBaseIO (Core.CoreM.toIO x ctx' s)) Task.Priority.dedicated
  match ← IO.wait t with
  | .ok (a, _) => return .ok a
  | .error e => return .error (toString e)

/-- Whether an error of `bounded` is one of its bounds, not a refusal. Read from the start of the
message, where Lean puts the limit's own words (the rest can quote the attempt's names). -/
def isLimit (why : String) : Bool :=
  ["(deterministic) timeout", "maximum recursion depth has been reached",
   "(kernel) deterministic timeout", "(kernel) deep recursion", "(kernel) excessive memory",
   "(kernel) interrupted"].any fun p => why.startsWith p

/-- Decide whether a restated target's type `stated` is the reference statement `refType`:
`none` when both checks say so, else `(status, detail)`, the detail saying which check refused.
The kernel's check adds `@Eq.refl Prop ref : @Eq Prop ref stated` as a throwaway theorem (only
`addDecl`: the kernel's own `isDefEq` changed its signature across versions), and only for
propositions: the target of a proof task is a theorem. -/
def sameStatement (refType stated : Expr) (lps : List Name) (name : Name) (heartbeats : Nat) :
    CoreM (Option (String × String)) := do
  let env ← getEnv
  -- a type the environment holds as an inductive other than `Nat` is not `ℕ` (it holds the
  -- attempt's replayed constants here too: its own inductive is not `ℕ` either, and an
  -- `abbrev N := ℕ` of its own is no inductive, so it counts as `ℕ`)
  let nonNat : Name → Bool := fun n =>
    n != ``Nat && (match env.find? n with | some (.inductInfo _) => true | _ => false)
  if let some what := bigComputation? refType stated nonNat then
    return some ("judge_limit", s!"the restated statement holds {what}; the judge evaluates " ++
      s!"no literal arithmetic on ℕ past {maxLiteralBits} bits")
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
