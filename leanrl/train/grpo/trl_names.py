"""TRL's ``GRPOConfig`` field names, read as leanrl's.

People arrive from TRL with configs that say ``learning_rate`` and ``num_generations``. Where a TRL
field means the same as a leanrl one it is accepted under the TRL name (in Python, TOML and on the
command line's error messages); where it means something else, the error says which leanrl field
to use instead, rather than pydantic's bare "extra inputs are not permitted".
"""

from __future__ import annotations

from typing import Any

__all__ = ["TRL_DIFFERENT", "TRL_RENAMED", "TRL_SAME", "translate_trl"]

TRL_SAME: dict[str, str] = {
    # TRL name: leanrl field (dotted for a nested one); the meaning is the same.
    "learning_rate": "lr",
    "num_generations": "group_size",
    "max_completion_length": "sampling.max_tokens",
    "temperature": "sampling.temperature",
    "top_p": "sampling.top_p",
    "epsilon": "eps_low",
    "epsilon_high": "eps_high",
    "num_iterations": "ppo_epochs",
    "loss_type": "loss_agg",
    "max_steps": "steps",
    "output_dir": "out",
    "save_steps": "save_every",
    "save_total_limit": "keep_checkpoints",
    "report_to": "log_to",
    "lr_scheduler_type": "lr_schedule",
    "mask_truncated_completions": "mask_truncated",
    "vllm_importance_sampling_cap": "is_cap",
}
"""TRL fields accepted as aliases of leanrl fields. (``beta``, ``weight_decay``,
``max_grad_norm``, ``warmup_steps``, ``seed``, ``run_name``, ``scale_rewards``,
``importance_sampling_level`` and ``gradient_checkpointing`` have the same name in both.
``vllm_importance_sampling_correction``/``_mode`` become ``is_correction``, and
``loss_type = "cispo"`` becomes ``loss = "cispo"`` with ``loss_agg = "dapo"``: see
:func:`translate_trl`.)"""

TRL_DIFFERENT: dict[str, str] = {
    "per_device_train_batch_size": (
        "TRL counts completions per device; leanrl counts tasks: `tasks_per_step` tasks per "
        "step, each with `group_size` completions, and `micro_batch_size` sequences per "
        "forward/backward pass"
    ),
    "gradient_accumulation_steps": (
        "leanrl has no accumulation count: each step's batch is split into `minibatches` "
        "optimizer updates of `micro_batch_size` sequences per pass"
    ),
    "generation_batch_size": (
        "each step generates `tasks_per_step` x `group_size` completions and makes "
        "`minibatches` updates from them"
    ),
    "steps_per_generation": "each step generates once and makes `minibatches` updates",
    "max_prompt_length": "leanrl does not cut prompts; the harness builds them (`env.harness`)",
    "adam_beta1": "set both with `adam_betas = [beta1, beta2]`",
    "adam_beta2": "set both with `adam_betas = [beta1, beta2]`",
    "bf16": "use `precision` (`bf16-mixed`, `bf16` or `fp32`)",
    "fp16": "use `precision` (`bf16-mixed`, `bf16` or `fp32`)",
    "num_train_epochs": "use `steps` (tasks are drawn `tasks_per_step` at a time, reshuffled "
    "every epoch)",
    "logging_steps": "every step is logged (metrics.jsonl and one log line)",
    "use_vllm": 'use `policy.backend = "vllm"`',
    "reward_funcs": "rewards come from the environment's taskset (`Taskset.reward`, "
    "`shortest_proof_bonus`)",
    "reward_weights": "rewards come from the environment's taskset (`Taskset.group_rewards`)",
    "model_name_or_path": "use `policy.model` (`--model`)",
}
"""TRL fields whose meaning differs: what to use in leanrl instead."""


def translate_trl(data: Any) -> Any:
    """``data`` (the raw input of a ``GRPOConfig``) with TRL names moved to leanrl's; a TRL
    name with another meaning raises ``ValueError`` naming the leanrl field to use."""
    if not isinstance(data, dict):
        return data
    different = sorted(k for k in data if k in TRL_DIFFERENT)
    if different:
        raise ValueError(
            "; ".join(
                f"{k!r} is TRL's GRPOConfig field, not leanrl's: {TRL_DIFFERENT[k]}"
                for k in different
            )
        )
    out = _objective_names(dict(data))
    for trl, ours in TRL_SAME.items():
        if trl not in out:
            continue
        value = out.pop(trl)
        if trl == "report_to":  # TRL takes "wandb", "none", "all" or a list
            value = [] if value in ("none", None) else [value] if isinstance(value, str) else value
        if trl == "loss_type" and value == "bnpo":
            raise ValueError("TRL's loss_type 'bnpo' has no leanrl counterpart; loss_agg is "
                             "'grpo', 'dr_grpo' or 'dapo'")  # fmt: skip
        node = out
        *parents, leaf = ours.split(".")
        for p in parents:
            child = node.get(p)
            if child is None:
                child = {}
            elif not isinstance(child, dict):
                child = child.model_dump(exclude_unset=True)  # a model passed in Python
            node[p] = child = dict(child)
            node = child
        if leaf in node:
            raise ValueError(
                f"both {trl!r} (TRL's name) and {ours!r} (leanrl's) are given; keep one"
            )
        node[leaf] = value
    if isinstance(out.get("scale_rewards"), bool):  # TRL's old boolean form
        out["scale_rewards"] = "group" if out["scale_rewards"] else "none"
    return out


TRL_RENAMED: dict[str, str] = {
    "vllm_importance_sampling_correction": "--is-correction",
    "vllm_importance_sampling_mode": "--is-correction",
}
"""TRL fields that :func:`translate_trl` folds into another leanrl field (for the CLI's "did you
mean": a command-line flag must use leanrl's name)."""

#: TRL's default ``vllm_importance_sampling_mode`` (TRL applies it whenever vLLM generates).
TRL_IS_MODE = "sequence_mask"


def _objective_names(out: dict[str, Any]) -> dict[str, Any]:
    """TRL's names for the objective variants (issue 25) as leanrl's, in place of ``out``:

    - ``vllm_importance_sampling_correction`` (bool) and ``vllm_importance_sampling_mode``
      become ``is_correction``: ``"off"`` when the correction is false, else the mode (TRL's
      default mode ``sequence_mask`` when only the flag is given);
    - ``loss_type = "cispo"`` is TRL's CISPO with its token-mean normalisation: ``loss =
      "cispo"`` and ``loss_agg = "dapo"``; TRL's ``epsilon_high`` is then CISPO's weight cap
      (``cispo_max``; TRL recommends 5), not the clip bound.
    """
    flag = out.pop("vllm_importance_sampling_correction", None)
    mode = out.pop("vllm_importance_sampling_mode", None)
    if flag is not None or mode is not None:
        if "is_correction" in out:
            raise ValueError(
                "both TRL's vllm_importance_sampling_correction/_mode and leanrl's "
                "is_correction are given; keep one"
            )
        out["is_correction"] = "off" if flag is False else (mode or TRL_IS_MODE)
    if out.get("loss_type") == "cispo":
        if "loss" in out or "loss_agg" in out:
            raise ValueError(
                "both TRL's loss_type 'cispo' and leanrl's loss/loss_agg are given; keep one"
            )
        del out["loss_type"]
        out["loss"], out["loss_agg"] = "cispo", "dapo"
        if "epsilon_high" in out:
            if "cispo_max" in out:
                raise ValueError(
                    "both 'epsilon_high' (TRL's CISPO cap) and 'cispo_max' are given; keep one"
                )
            out["cispo_max"] = out.pop("epsilon_high")
    return out
