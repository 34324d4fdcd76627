"""``--dry-run``: what a launch would start and what an iteration would cost, before anything
starts.

The plan lists the Functions (image, GPU, how many containers), the Lean sandboxes (cores,
memory, batch size, batches per iteration; none for an environment that checks without Lean,
such as Countdown) and the work per iteration, then estimates one iteration's wall time,
GPU-seconds, sandbox core-seconds and dollars from ``launcher.estimate`` (per-attempt GPU and
Lean time) and ``launcher.prices``. The estimate is arithmetic on stated
assumptions, printed with them; the metrics of a real run (``cost/...``) are what to trust.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from leanrl.launch.config import LauncherConfig

__all__ = ["Plan", "plan_for"]


@dataclass
class Plan:
    """A launch plan: lines to print and the estimate behind them."""

    kind: str
    lines: list[str] = field(default_factory=list)
    estimate: dict[str, float] = field(default_factory=dict)
    """Per iteration (ES), step (GRPO) or run (eval): ``wall_s``, ``gpu_s``,
    ``sandbox_core_s`` (checking), ``sandbox_billed_core_s`` (checking, start-ups and idle
    sandboxes, what is priced), ``usd``."""
    lean: bool = True
    """Whether the environment checks with Lean (False: Countdown; no Lean figures shown)."""

    def render(self) -> str:
        est = self.estimate
        unit = {"es": "iteration", "grpo": "step (generation only)", "eval": "run"}[self.kind]
        lean = f"Lean {est['sandbox_core_s']:.0f} sandbox core-s, " if self.lean else ""
        if self.lean and est.get("sandbox_billed_core_s", 0.0) > est["sandbox_core_s"]:
            lean = (
                f"Lean {est['sandbox_billed_core_s']:.0f} sandbox core-s billed "
                f"({est['sandbox_core_s']:.0f} checking), "
            )
        tail = [
            f"estimated per {unit}: wall {est['wall_s']:.0f} s, GPU {est['gpu_s']:.0f} GPU-s, "
            f"{lean}${est['usd']:.2f}",
        ]
        if "usd_run" in est:
            tail.append(f"estimated for the whole run: ${est['usd_run']:.2f}")
        return "\n".join([*self.lines, *tail])


def _sandbox(config: Any) -> tuple[str, float, float, int]:
    """(runtime name, cores per sandbox, GiB per sandbox, batch size) of the environment."""
    rt = config.env.runtime
    if rt.name == "modal":
        return "modal", rt.modal.cpu, rt.modal.memory_mb / 1024, rt.modal.batch_size
    if rt.name == "docker":
        return "docker", rt.docker.cpus, rt.docker.memory_mb / 1024, rt.docker.batch_size
    return rt.name, 0.0, 0.0, 0


@dataclass(frozen=True)
class _SandboxBill:
    """Sandbox-seconds one iteration, step or run bills, both ways a pool may use sandboxes."""

    one_use_s: float
    """One batch per sandbox: checking, a start-up per batch, the warm ones idling."""
    reused_s: float
    """Sandboxes serving many batches: those alive at once for the whole time (or the checking,
    if more), plus their first start-ups and replacements by age or ``max_uses``."""
    starts_one: float
    starts_reused: float
    alive: int
    """Sandboxes alive at once with reuse."""
    reused: bool
    """Which of the two the estimate prices."""
    why: str


def _sandbox_bill(
    config: Any, rt: str, busy_s: float, batches: int, in_flight: int, wall_s: float, units: int
) -> _SandboxBill:
    """What the sandboxes of ``batches`` batches (``in_flight`` at once, ``busy_s`` of checking)
    over ``wall_s`` bill, from the runtime's own pool settings and ``launcher.estimate``;
    ``units`` iterations or steps share the first start-ups."""
    est = config.launcher.estimate
    if rt == "modal":
        from leanrl.runtimes.modal import ModalRuntime

        pool = ModalRuntime(config.env.runtime).settings().pool  # max_age_s as the run has it
    else:
        from leanrl.runtimes.docker import DockerRuntime

        pool = DockerRuntime(config.env.runtime).settings().pool
    warm = pool.target_ready if isinstance(pool.target_ready, int) else pool.auto_min_ready
    alive = max(warm, min(pool.max_sandboxes, in_flight))
    one_use_s = busy_s + batches * est.sandbox_start_s + warm * wall_s
    replaced = alive * wall_s / pool.max_age_s
    if pool.max_uses:
        replaced = max(replaced, batches / pool.max_uses)
    starts_reused = min(float(batches), alive / max(units, 1) + replaced)
    reused_s = max(busy_s, alive * wall_s) + starts_reused * est.sandbox_start_s
    if pool.max_uses == 1:
        reused, why = False, "max_uses = 1"
    elif est.sandbox_reuse != "auto":
        reused, why = est.sandbox_reuse == "reused", f"estimate.sandbox_reuse = {est.sandbox_reuse}"
    elif pool.reuse == "always":
        reused, why = True, 'pool.reuse = "always"'
    else:
        reused = False
        why = (
            "reuse needs isolated Lean processes, which only running sandboxes report; "
            "launcher.estimate.sandbox_reuse = reused assumes them"
        )
    return _SandboxBill(one_use_s, reused_s, float(batches), starts_reused, alive, reused, why)


def _bill_line(bill: _SandboxBill, cores: float, start_s: float) -> str:
    """The plan's line on sandbox start-ups and billing, both ways."""
    one, two = bill.one_use_s * cores, bill.reused_s * cores
    if bill.reused:
        return (f"  sandbox billing: reused ({bill.why}), up to {bill.alive} alive: "
                f"{bill.starts_reused:.1f} start-ups x {start_s:g} s, {two:.0f} core-s "
                f"(one batch per sandbox: {bill.starts_one:.0f} start-ups, {one:.0f} core-s)")  # fmt: skip
    line = (f"  sandbox billing: one batch per sandbox ({bill.why}): {bill.starts_one:.0f} "
            f"start-ups x {start_s:g} s, {one:.0f} core-s")  # fmt: skip
    if bill.why != "max_uses = 1":
        line += f" (reused: {bill.starts_reused:.1f} start-ups, {two:.0f} core-s)"
    return line


def _checks_with_lean(config: Any) -> bool:
    """Whether the environment checks answers with Lean. One that does not (Countdown) is
    loaded here and its settings checked as the run would check them: a plan of a run that
    would be refused (``--runtime modal`` on Countdown) is no plan."""
    from leanrl import registry
    from leanrl.environment import load_environment
    from leanrl.errors import LeanrlError

    try:
        cls = registry.resolve("environments", config.env.id)
    except (LeanrlError, ImportError):  # a plan is printed for one that cannot load here too
        return True
    if getattr(cls, "needs_lean", True):
        return True
    load_environment(config.env).check_config()
    return False


def _prices(launcher: LauncherConfig) -> tuple[str | None, float]:
    if launcher.name == "modal":
        return launcher.modal.gpu, launcher.prices.gpu(launcher.modal.gpu)
    kind = None if launcher.gpu in ("auto", "none") else launcher.gpu
    return kind, launcher.prices.gpu(kind)


def plan_for(kind: str, config: Any) -> Plan:
    """The plan of ``leanrl train es|grpo`` or ``leanrl eval`` with ``config``."""
    launcher: LauncherConfig = config.launcher
    m, est, prices = launcher.modal, launcher.estimate, launcher.prices
    lean = _checks_with_lean(config)
    plan = Plan(kind, lean=lean)
    add = plan.lines.append
    gpu_kind, gpu_price = _prices(launcher)
    # no Lean: the environment's own checker runs where the answers are, costing nothing here
    rt, cores, gib, batch = _sandbox(config) if lean else ("", 0.0, 0.0, 0)
    own_checker = f"  checking: {config.env.id}'s answers are checked in Python where they are made"
    where = (
        f"Modal app {m.app_name!r} ({m.backend} backend)"
        if launcher.name == "modal"
        else "this machine"
    )
    add(
        f"leanrl {'eval' if kind == 'eval' else 'train ' + kind}: launcher {launcher.name}, on {where}"
    )
    if launcher.name == "modal":
        add(
            f"  images: gpu (torch, transformers, {', '.join(m.gpu_packages) or 'no vLLM'}), "
            "orchestrator (CPU torch)"
            + (f", lean (sandboxes: {_sandbox_lean(config)})" if lean else "")
        )
        add(f"  volume {m.volume!r} at {m.volume_mount} (run folders, checkpoints, HF cache)"
            + (f"; secret {m.secret!r}" if m.secret else ""))  # fmt: skip

    if kind == "es":
        pop, tasks, samples = config.population, config.tasks_per_step, config.samples_per_task
        per_member = tasks * samples
        attempts = pop * per_member
        if launcher.name == "modal":
            setting = m.members_per_container
            depth = m.first_members_per_container  # "auto": set from the estimate below
            containers = min(m.member_containers, math.ceil(pop / depth))
            where_line = len(plan.lines)
            orch = (
                f"orchestrate: CPU Function ({m.orchestrator_cpu:g} cores, "
                f"{m.orchestrator_memory_mb} MiB)"
                if m.orchestrator == "function"
                else "orchestrator: this machine (run folder mirrored to the Volume)"
            )

            def functions_line(containers: int, each: str) -> str:
                return (f"  functions: es_member x{containers} containers on {m.gpu} ({each} "
                        f"members each at once), es_checkpoint on {m.gpu} every "
                        f"{config.save_every} iterations; {orch}")  # fmt: skip

            add(functions_line(containers, str(depth)))
        else:
            setting = config.scorer.pipeline
            containers, depth = 1, 2 if setting == "auto" else setting  # "auto": set below
            where_line = len(plan.lines)
            add(f"  scorer: {config.scorer.backend} on this machine, {depth} members in flight")
        add(
            f"  per iteration: {pop} members x {tasks} tasks x {samples} samples = {attempts} attempts"
        )
        gen = per_member * est.gpu_s_per_attempt
        if batch:
            batches = math.ceil(per_member / batch)
            check = min(batch, per_member) * est.sandbox_core_s_per_attempt / max(cores, 1e-9)
            add(f"  lean: {rt} sandboxes of {cores:g} cores / {gib:g} GiB, batches of {batch}: "
                f"{batches} per member, {batches * pop} per iteration")  # fmt: skip
        elif lean:
            check = per_member * est.sandbox_core_s_per_attempt / 8  # a local pool: no sandboxes
            add(f"  lean: {rt} runtime on the machine that scores (no sandboxes billed)")
        else:
            check = 0.0  # microseconds an answer: nothing next to generation
            add(own_checker)
        from leanrl.train.es.pipeline import depth_for

        # the rule an "auto" run applies to its measurements after the first iteration
        rule = depth_for(check, gen, None, pop)
        ratio = f"estimated checking/generation {check / max(gen, 1e-9):.2f}"
        if setting == "auto":
            depth = rule
            if launcher.name == "modal":
                containers = min(m.member_containers, math.ceil(pop / depth))
                plan.lines[where_line] = functions_line(
                    containers,
                    f"auto: 2 in the first iteration, then measured; {depth} from the {ratio},",
                )
            else:
                plan.lines[where_line] = (
                    f"  scorer: {config.scorer.backend} on this machine, auto depth (2 in the "
                    f"first iteration, then measured; {depth} from the {ratio}) members in flight"
                )
        elif rule != depth:
            knob = "members_per_container" if launcher.name == "modal" else "scorer.pipeline"
            add(f"  ({ratio}: {knob} = {rule} (or auto) would keep each engine busy; "
                "docs/training-es.md)")  # fmt: skip
        per_container = math.ceil(pop / containers)
        if depth > 1:
            wall = per_container * max(gen, check / (depth - 1)) + min(gen, check)
        else:
            wall = per_container * (gen + check)
        gpu_s = containers * wall * (m.gpu_count if launcher.name == "modal" else 1)
        core_s = attempts * est.sandbox_core_s_per_attempt if batch else 0.0
        billed = core_s
        if batch:  # members checking at once: about one per container beyond the generating one
            in_flight = containers * max(1, depth - 1) * batches
            bill = _sandbox_bill(
                config, rt, core_s / cores, batches * pop, in_flight, wall, config.steps
            )
            billed = (bill.reused_s if bill.reused else bill.one_use_s) * cores
            add(_bill_line(bill, cores, est.sandbox_start_s))
        usd = gpu_s * gpu_price + billed * (
            prices.sandbox_cpu_core_per_s + prices.sandbox_memory_gib_per_s * gib / max(cores, 1e-9)
        )
        if launcher.name == "modal" and m.orchestrator == "function":
            usd += wall * (m.orchestrator_cpu * prices.cpu_core_per_s
                           + m.orchestrator_memory_mb / 1024 * prices.memory_gib_per_s)  # fmt: skip
        checking = f" and {est.sandbox_core_s_per_attempt:g} sandbox core-s" if lean else ""
        start = f"; a sandbox starts in {est.sandbox_start_s:g} s" if batch else ""
        add(f"  assumptions: {est.gpu_s_per_attempt:.4f} GPU-s{checking} per attempt{start}; GPU "
            f"{gpu_kind or 'none'} at ${gpu_price:.6f}/s")  # fmt: skip
        plan.estimate = {
            "wall_s": wall
            + (est.container_start_s if launcher.name == "modal" else 0.0) / config.steps,
            "gpu_s": gpu_s,
            "sandbox_core_s": core_s,
            "sandbox_billed_core_s": billed,
            "usd": usd,
            "usd_run": usd * config.steps,
        }
        return plan

    if kind == "grpo":
        attempts = config.tasks_per_step * config.group_size
        gpus = m.gpu_count if launcher.name == "modal" else 1
        add(f"  functions: train_grpo on {gpus} x {gpu_kind or 'local GPU'}"
            if launcher.name == "modal" else "  training here")  # fmt: skip
        add(
            f"  per step: {config.tasks_per_step} tasks x {config.group_size} samples = {attempts} attempts"
        )
    else:
        n_tasks = config.env.taskset.limit or 0
        attempts = n_tasks * config.samples
        gpus = m.gpu_count if launcher.name == "modal" else 1
        add(f"  functions: evaluate on {gpus} x {gpu_kind or 'local GPU'}" if launcher.name == "modal"
            else "  evaluation here")  # fmt: skip
        add(f"  attempts: {n_tasks or '(all tasks)'} tasks x {config.samples} samples"
            + ("" if n_tasks else " (set --limit for a number)"))  # fmt: skip
    gen = attempts * est.gpu_s_per_attempt
    core_s = attempts * est.sandbox_core_s_per_attempt if batch else 0.0
    billed = core_s
    if batch:
        add(f"  lean: {rt} sandboxes of {cores:g} cores, batches of {batch}: "
            f"{math.ceil(attempts / batch) if attempts else '?'} batches")  # fmt: skip
        if attempts:  # every batch of a step (or the run) is sent at once
            n = math.ceil(attempts / batch)
            units = config.steps if kind == "grpo" else 1
            bill = _sandbox_bill(config, rt, core_s / cores, n, n, gen, units)
            billed = (bill.reused_s if bill.reused else bill.one_use_s) * cores
            add(_bill_line(bill, cores, est.sandbox_start_s))
    if not lean:
        add(own_checker)
    usd = gen * gpus * gpu_price + billed * prices.sandbox_cpu_core_per_s
    plan.estimate = {"wall_s": gen, "gpu_s": gen * gpus, "sandbox_core_s": core_s, "usd": usd}
    plan.estimate["sandbox_billed_core_s"] = billed
    if kind == "grpo":
        plan.estimate["usd_run"] = usd * config.steps
    return plan


def _sandbox_lean(config: Any) -> str:
    """The Lean the sandboxes get: the one set for the Modal runtime, else the taskset's own
    (what the image is built for when none is set)."""
    pinned: str | None = config.env.runtime.modal.lean_toolchain
    if pinned:
        return pinned
    from leanrl.environment import load_environment
    from leanrl.errors import LeanrlError

    try:
        toolchain = load_environment(config.env).taskset.lean_toolchain
    except (LeanrlError, ImportError):  # a plan is printed for one that cannot load here too
        toolchain = None
    return toolchain or "the taskset's Lean (it declares none)"
