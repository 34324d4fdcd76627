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
    ``sandbox_core_s``, ``usd``."""
    lean: bool = True
    """Whether the environment checks with Lean (False: Countdown; no Lean figures shown)."""

    def render(self) -> str:
        est = self.estimate
        unit = {"es": "iteration", "grpo": "step (generation only)", "eval": "run"}[self.kind]
        lean = f"Lean {est['sandbox_core_s']:.0f} sandbox core-s, " if self.lean else ""
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
            containers = min(m.member_containers, math.ceil(pop / m.members_per_container))
            depth = m.members_per_container
            orch = (
                f"orchestrate: CPU Function ({m.orchestrator_cpu:g} cores, "
                f"{m.orchestrator_memory_mb} MiB)"
                if m.orchestrator == "function"
                else "orchestrator: this machine (run folder mirrored to the Volume)"
            )
            add(f"  functions: es_member x{containers} containers on {m.gpu} ({depth} members "
                f"each at once), es_checkpoint on {m.gpu} every {config.save_every} iterations; {orch}")  # fmt: skip
        else:
            containers, depth = 1, config.scorer.pipeline
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
        per_container = math.ceil(pop / containers)
        if depth > 1:
            wall = per_container * max(gen, check / (depth - 1)) + min(gen, check)
        else:
            wall = per_container * (gen + check)
        gpu_s = containers * wall * (m.gpu_count if launcher.name == "modal" else 1)
        core_s = attempts * est.sandbox_core_s_per_attempt if batch else 0.0
        usd = gpu_s * gpu_price + core_s * (
            prices.sandbox_cpu_core_per_s + prices.sandbox_memory_gib_per_s * gib / max(cores, 1e-9)
        )
        if launcher.name == "modal" and m.orchestrator == "function":
            usd += wall * (m.orchestrator_cpu * prices.cpu_core_per_s
                           + m.orchestrator_memory_mb / 1024 * prices.memory_gib_per_s)  # fmt: skip
        checking = f" and {est.sandbox_core_s_per_attempt:g} sandbox core-s" if lean else ""
        add(f"  assumptions: {est.gpu_s_per_attempt:.4f} GPU-s{checking} per attempt; GPU "
            f"{gpu_kind or 'none'} at ${gpu_price:.6f}/s")  # fmt: skip
        plan.estimate = {
            "wall_s": wall
            + (est.container_start_s if launcher.name == "modal" else 0.0) / config.steps,
            "gpu_s": gpu_s,
            "sandbox_core_s": core_s,
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
    if batch:
        add(f"  lean: {rt} sandboxes of {cores:g} cores, batches of {batch}: "
            f"{math.ceil(attempts / batch) if attempts else '?'} batches")  # fmt: skip
    if not lean:
        add(own_checker)
    usd = gen * gpus * gpu_price + core_s * prices.sandbox_cpu_core_per_s
    plan.estimate = {"wall_s": gen, "gpu_s": gen * gpus, "sandbox_core_s": core_s, "usd": usd}
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
