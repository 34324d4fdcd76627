"""The torch side of GRPO: the model, the optimizer, one optimisation step, checkpoints.

:class:`GRPOEngine` owns everything with weights in it. :mod:`leanrl.train.grpo.trainer` drives it:
``load`` -> ``make_generation_policy`` -> per step ``sync_generation_weights``, ``make_samples``,
``train_step``, ``save_checkpoint``. The loss itself is the pure functions of
:mod:`leanrl.train.grpo.loss`; see :mod:`leanrl.train.grpo.trainer` for the objective.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import math
import random
import threading
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from leanrl.errors import ConfigError, PolicyError
from leanrl.policy import Policy
from leanrl.rollout import Rollout
from leanrl.train.common import RunDir, resume_line
from leanrl.train.distill.objective import advantage_tensor
from leanrl.train.distributed import (
    World,
    full_named_parameters,
    load_optimizer_state,
    resolve_strategy,
    shard_model,
    unwrap,
)
from leanrl.train.grpo.advantages import (
    mean_sampler_logp,
    pass_at_k_advantages,
    unlikeliness_rewards,
)
from leanrl.train.grpo.data import _Batch, _Sample, ends_truncated
from leanrl.train.grpo.loss import (
    aggregate,
    group_advantages,
    kl_k3,
    loss_denominator,
    policy_loss,
    token_logprobs,
)
from leanrl.train.grpo.model_io import (
    _load_pretrained,
    _Null,
    _python_rng_state,
    _right_aligned,
    _split,
    _turns_per_attempt,
    device_and_precision,
    disable_dropout,
    load_optimizer_file,
    save_engine_checkpoint,
)
from leanrl.train.grpo.streamed import StepSums
from leanrl.train.grpo.tiled import HeadTiles, full_entropy
from leanrl.train.hf_policy import TrainPolicy
from leanrl.train.optim import adamw, kernel_of, set_kernel

if TYPE_CHECKING:
    from leanrl.train.grpo.config import GRPOConfig

__all__ = ["GRPOEngine", "device_and_precision", "disable_dropout", "load_optimizer_file"]

log = logging.getLogger("leanrl.train")

OPTIMIZER_FILE = "optimizer.pt"
#: GPU memory share of the vLLM engine when the config does not set one: the engine shares the
#: GPU with the model being trained, its gradients and AdamW state.
VLLM_SHARE = 0.3


class GRPOEngine:
    """Model + optimizer + schedule. ``step`` counts finished trainer steps (= weights version)."""

    def __init__(self, config: GRPOConfig, run: RunDir, world: World | None = None) -> None:
        self.config = config
        self.run = run
        self.world = world or World()
        self.strategy = "single"  # or "ddp" / "fsdp" with several ranks
        self.module: Any = None  # what the loss runs through: the model, DDP, or FSDP-sharded
        self.gen_model: Any = None  # a separate full copy that generates (async mode, FSDP)
        self.server: Any = None  # vllm_server.WeightSync (rank 0, server mode)
        self.step = 0
        self.gen_version = 0
        self.weights_lock = threading.Lock()
        self.model: Any = None
        self.ref_model: Any = None
        self.tokenizer: Any = None
        self.optimizer: Any = None
        self.scheduler: Any = None
        self.device = torch.device("cpu")
        self.autocast: torch.dtype | None = None
        self.source = config.policy.model
        self.gen_policy: Policy | None = None
        self._tiles: dict[int, HeadTiles | None] = {}  # logprob_chunk: per model, checked once

    @property
    def _old_inline(self) -> bool:
        """Whether π_old is the loss forward's own log-probs. π_old is the weights at the step's
        start; with one pass of one mini-batch every sample's loss forward comes before the
        step's only update, so its detached log-probs are π_old (dropout off: the forward the
        sampler's policy is), and no separate forward is needed."""
        cfg = self.config
        return (
            cfg.is_mode != "off" and cfg.ppo_epochs == 1 and cfg.minibatches == 1
            and cfg.disable_dropout
        )  # fmt: skip

    # -- loading --------------------------------------------------------------------------------

    def load(self, resumed: bool) -> None:
        """Load the model (from the newest intact checkpoint when resuming), wrap it for the ranks
        (LoRA, FSDP/DDP) and load the optimizer state. Every rank loads the same files."""
        from transformers import AutoModelForCausalLM

        cfg = self.config
        world = self.world
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        self.device, precision = device_and_precision(cfg, world)
        self.autocast = torch.bfloat16 if precision == "bf16-mixed" else None
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32

        opts = dict(cfg.policy.options)
        resume = self._resume_point(dtype, opts) if resumed else None
        if resumed and resume is None and world.is_main:
            self.run.truncate_metrics(0)  # killed before the first checkpoint: start over
            log.info(self.run.no_checkpoint_line())  # none yet, or every one damaged (why)
        if resume is not None and world.is_main:
            log.info(resume_line(resume[1], resume[0]))
        ckpt = (resume[0], resume[1]) if resume is not None else None
        self.source = str(ckpt[1]) if ckpt else cfg.policy.model
        model: Any
        blob: dict[str, Any] = {}
        if resume is None:
            self.tokenizer, model = _load_pretrained(self.source, self.source, dtype, opts)
        else:
            _, _, self.tokenizer, model, blob = resume
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if cfg.disable_dropout:
            disable_dropout(model)  # before LoRA: lora.dropout is the user's explicit choice
        if cfg.lora.enabled:
            from leanrl.train.lora import apply_lora, load_adapter

            model = apply_lora(model, cfg.lora, cfg.seed)
            if ckpt is not None:
                load_adapter(model, ckpt[1])
        model.to(self.device)
        model.train()  # train mode: gradient checkpointing needs it (dropout is off above)
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable()
            if cfg.lora.enabled:  # frozen embeddings: make the checkpointed inputs need grad
                model.enable_input_require_grads()
        if world.distributed:
            self.strategy = resolve_strategy(cfg.distributed, self.device.type)
        # A full copy generates when the trained weights cannot: mid-update (async) or sharded.
        if cfg.policy.backend == "hf" and (cfg.async_mode or self.strategy == "fsdp"):
            self.gen_model = copy.deepcopy(model).eval().requires_grad_(False)
        if cfg.beta > 0 and not cfg.lora.enabled:
            # the reference is always the starting model, also on resume (with LoRA it is the
            # same model with its adapters switched off: no second copy)
            ref: Any = AutoModelForCausalLM.from_pretrained(cfg.policy.model, dtype=dtype, **opts)
            ref = ref.to(self.device).eval().requires_grad_(False)
            self.ref_model = shard_model(ref, "fsdp", world) if self.strategy == "fsdp" else ref
        self.model = model
        param_dtype = torch.bfloat16 if precision == "bf16-mixed" else None
        self.module = shard_model(model, self.strategy, world, param_dtype=param_dtype)

        trained = [p for p in self.module.parameters() if p.requires_grad]
        kernel = kernel_of(trained, sharded=self.strategy == "fsdp")
        self.optimizer = adamw(
            trained,
            lr=cfg.lr,
            betas=cfg.adam_betas,
            weight_decay=cfg.weight_decay,
            sharded=self.strategy == "fsdp",
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        if ckpt is not None:
            _, path = ckpt
            if blob.get("format") == "named":
                load_optimizer_state(self.module, self.optimizer, blob["optimizer"])
            elif world.distributed:
                raise ConfigError(
                    f"{path} was saved by an older leanrl, whose optimizer state only a single "
                    "process can load: resume it once without torchrun (one step), then "
                    "relaunch with several ranks"
                )
            else:
                self.optimizer.load_state_dict(blob["optimizer"])
            set_kernel(self.optimizer, kernel)  # not the saving optimizer's (an older loop's)
            self.scheduler.load_state_dict(blob["scheduler"])
            torch.set_rng_state(blob["torch_rng"])
            random.setstate(_python_rng_state(blob["python_rng"]))
            self.step = ckpt[0]
            if world.is_main:
                self.run.truncate_metrics(self.step)
        self.gen_version = self.step

    def _resume_point(
        self, dtype: torch.dtype, opts: dict[str, Any]
    ) -> tuple[int, Path, Any, Any, dict[str, Any]] | None:
        """The newest checkpoint that loads whole: ``(step, folder, tokenizer, model, optimizer
        blob)``, or None when the run has no checkpoint yet. With LoRA a checkpoint holds only
        adapters, so the model's weights come from the base model (adapters are loaded later).

        A damaged checkpoint (truncated weights or optimizer state, unreadable JSON, an
        optimizer file holding anything but tensors and plain data) is skipped with a warning
        for the next older one. When checkpoints exist but none loads, resuming would silently
        restart from the base model, so that is an error listing what is wrong with each.
        """
        cfg = self.config
        for step, path in self.run.resumable_checkpoints():
            weights_from = cfg.policy.model if cfg.lora.enabled else str(path)
            try:
                state = RunDir.load_state(path)
                if int(state.get("step", -1)) != step:
                    raise ConfigError(f"trainer_state.json says step {state.get('step')!r}")
                blob = load_optimizer_file(path / OPTIMIZER_FILE, torch.device("cpu"))
                tokenizer, model = _load_pretrained(str(path), weights_from, dtype, opts)
            except (ConfigError, PolicyError) as e:
                self.run.damaged.append((path, str(e)))
                log.warning("%s cannot be resumed from: %s. Trying an older checkpoint.", path, e)
                continue
            return step, path, tokenizer, model, blob
        if self.run.damaged:
            lines = "\n".join(f"  - {p}: {why}" for p, why in self.run.damaged)
            raise ConfigError(
                f"no checkpoint of {self.run.path} can be resumed from:\n{lines}\nRestore one "
                "from a backup, or delete them (or use a new --out) to start the run over."
            )
        return None

    def _lr_factor(self, step: int) -> float:
        """LR multiplier at trainer step ``step``: linear warm-up, then the schedule."""
        cfg = self.config
        if cfg.warmup_steps and step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.lr_schedule == "constant":
            return 1.0
        span = max(cfg.steps - cfg.warmup_steps, 1)
        frac = min(max(step - cfg.warmup_steps, 0) / span, 1.0)
        if cfg.lr_schedule == "linear":
            return 1.0 - frac
        return 0.5 * (1.0 + math.cos(math.pi * frac))

    async def make_generation_policy(self) -> Policy:
        """The policy that samples rollouts, over the weights being trained (every rank has one)."""
        cfg = self.config
        backend = cfg.policy.backend
        if backend == "hf":
            model = self.gen_model if self.gen_model is not None else self.model
            self.gen_policy = TrainPolicy(
                cfg.policy,
                model,
                self.tokenizer,
                autocast_dtype=self.autocast,
                seed_salt=self.world.rank,
            )
        elif backend == "vllm":
            from leanrl.train.vllm_sync import VLLMTrainPolicy

            update: dict[str, Any] = {"model": self.source}
            if cfg.lora.enabled:  # the engine serves merged weights of the base architecture
                update["model"] = cfg.policy.model
            if "gpu_memory_utilization" not in cfg.policy.model_fields_set:
                update["gpu_memory_utilization"] = VLLM_SHARE  # training needs the rest
            pol = VLLMTrainPolicy(cfg.policy.model_copy(update=update))
            await pol.start()
            self.gen_policy = pol
            if cfg.lora.enabled and self.step > 0:
                self.gen_version = -1  # resumed adapters: the base weights need the merge now
        elif backend == "openai" and cfg.vllm_server.enabled:
            from leanrl.train.vllm_server import VLLMServerPolicy, WeightSync

            server = VLLMServerPolicy(cfg.policy)
            await server.start()
            self.gen_policy = server
            if self.world.is_main:
                self.server = WeightSync(cfg.vllm_server, cfg.policy.base_url)
                await asyncio.to_thread(self.server.connect)
            self.world.barrier()
            # The server starts from policy.model; a resumed run's weights must reach it first.
            if self.step > 0:
                self.gen_version = -1
        else:
            raise ConfigError(
                f"GRPO cannot train through the {backend!r} backend (it cannot receive new "
                "weights); use --policy.backend hf or vllm, or a vLLM server (--policy.backend "
                "openai with --vllm_server.transport nccl, gloo or disk)"
            )
        return self.gen_policy

    def close(self) -> None:
        """Release the weight-sync connection (server mode)."""
        if self.server is not None:
            self.server.close()
            self.server = None

    def _push_stream(self) -> Any:
        """``(Hugging Face name, full tensor)`` of the weights generation needs, one at a time:
        with LoRA the merged weights. A collective under FSDP (every rank iterates it)."""
        named = full_named_parameters(self.module)
        if self.config.lora.enabled:
            from leanrl.train.lora import merge_stream

            return merge_stream(named, self.config.lora.scale)
        return named

    def sync_generation_weights(self) -> None:
        """Bring the generation weights up to the trained ones (no-op when they are shared).

        Every rank calls it at the same point of the step (FSDP gathers are collectives)."""
        if self.gen_version == self.step or self.gen_policy is None:
            return
        version = self.step
        pol = self.gen_policy
        if isinstance(pol, TrainPolicy):
            if self.gen_model is not None:
                # only what trains can have changed (with LoRA: the adapters)
                trainable = {
                    n for n, p in unwrap(self.module).named_parameters() if p.requires_grad
                }
                dst = dict(pol.model.named_parameters())
                with self.weights_lock, pol.lock, torch.no_grad():
                    for name, full in full_named_parameters(self.module):
                        if name in trainable:
                            dst[name].copy_(full)
        elif self.server is not None or self.config.vllm_server.enabled:
            with self.weights_lock, torch.no_grad():
                if self.server is not None:  # rank 0
                    self.server.push(self._push_stream(), version)
                elif self.strategy == "fsdp":
                    for _ in self._push_stream():  # take part in the gathers
                        pass
            self.world.barrier()  # no rank generates before the server has the new weights
        else:
            with self.weights_lock, torch.no_grad():
                pol.push_weights(self._push_stream())  # type: ignore[attr-defined]
        self.gen_version = version

    # -- data -----------------------------------------------------------------------------------

    def make_samples(
        self,
        groups: Sequence[Sequence[Rollout]],
        batch_rewards: Sequence[float] | None = None,
    ) -> list[_Sample]:
        """Sequences with advantages for the kept groups (advantage per group, step 3).

        ``batch_rewards``: every reward sampled this step (dropped groups included), whose std
        ``scale_rewards = "batch"`` divides by; default: the kept groups' rewards. A rollout the
        checker could not judge (``infra``) is no outcome of the model: it is left out of its
        group's statistics and gets no sequence (no weight in the loss)."""
        cfg = self.config
        if not groups:
            return []
        # an infra rollout's reward is no outcome: 0 (a NaN there would still poison the sums,
        # NaN * 0 being NaN)
        rewards = torch.tensor([[0.0 if r.infra else r.reward for r in g] for g in groups])
        counted = torch.tensor([[not r.infra for r in g] for g in groups])  # [B, G]
        pool = torch.tensor(list(batch_rewards)) if batch_rewards is not None else None
        if cfg.advantage == "pass_at_k":  # issue 25: PKPO's pass@k transform
            adv = pass_at_k_advantages(
                rewards, cfg.pass_k, cfg.pass_k_baseline, cfg.reward_scale, counted=counted
            )
        else:
            if cfg.advantage == "unlikeliness":
                logp = torch.tensor([[mean_sampler_logp(r) for r in g] for g in groups])
                rewards = unlikeliness_rewards(rewards, logp, cfg.unlikeliness_beta, counted)
            adv = group_advantages(rewards, cfg.reward_scale, batch_rewards=pool, counted=counted)
        out: list[_Sample] = []
        for g, row in zip(groups, adv.tolist(), strict=True):
            for r, a in zip(g, row, strict=True):
                if r.infra:
                    continue
                ids, mask, lps = r.token_ids_and_mask()
                if not ids:
                    if any(t.completion for t in r.turns):
                        raise PolicyError(
                            f"a rollout of task {r.task_id!r} has text but no token ids: GRPO "
                            "trains on token ids, so the harness must copy Completion.token_ids "
                            "into Turn.completion_ids"
                        )
                    continue  # nothing generated at all: nothing to train on
                prompt = list(r.prompt_ids) or self._prompt_ids(r)
                if cfg.mask_truncated and ends_truncated(r):
                    mask = [0] * len(mask)
                old = [lp if lp is not None else math.nan for lp in lps]
                out.append(_Sample(prompt=prompt, resp=list(ids), mask=mask, old=old, adv=a,
                                   task_id=r.task_id))  # fmt: skip
        return out

    def _prompt_ids(self, r: Rollout) -> list[int]:
        pol = TrainPolicy(self.config.policy, self.model, self.tokenizer)
        return pol.prompt_ids(r.prompt)

    # -- one optimisation step ------------------------------------------------------------------

    def train_step(self, batch: _Batch) -> dict[str, Any]:
        """ppo_epochs × minibatches optimizer steps on one batch; returns the step's metrics.
        A streamed batch (``batch.streamed``) has its gradient accumulated already: only the
        update is left (:meth:`finish_streamed`)."""
        if batch.streamed is not None:
            return self.finish_streamed(batch.streamed)
        cfg = self.config
        samples = [s for s in batch.samples if any(s.mask)]
        lr = self.optimizer.param_groups[0]["lr"]
        if not samples:  # every group equal (or masked): nothing to learn, but time moves on
            return self._skipped_step(lr)
        self._prepare(samples)
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + batch.step)
        norm_len = self._norm_len
        acc = self._new_acc()
        grad_norms: list[float] = []
        updates = 0
        for epoch in range(cfg.ppo_epochs):
            order = torch.randperm(len(samples), generator=gen).tolist()
            for mb_idx in _split(order, cfg.minibatches):
                mb = [samples[i] for i in mb_idx]
                if not mb:
                    continue
                n_tokens = sum(sum(s.mask) for s in mb)
                n_seqs = len(mb)
                mb_loss = 0.0
                # This rank's share of the mini-batch, in equal numbers of micro-steps on every
                # rank (each backward is a collective); the denominators stay the whole
                # mini-batch's, so the ranks' gradients sum to the single-process gradient.
                for micro, real in self._my_micro_batches(mb):
                    got = self._micro_step(micro, epoch == 0, n_seqs, n_tokens, norm_len, acc, real)
                    mb_loss += got
                grad_norms.append(self._update())
                acc["loss"] += mb_loss
                updates += 1
        return self._stepped(acc, grad_norms, updates, lr)

    # -- streamed steps (stream_training; leanrl.train.grpo.streamed) --------------------------

    def accumulate(self, sums: StepSums, samples: list[_Sample]) -> None:
        """Forward and backward of one group's ``samples`` before the step's update, with the
        unnormalised sums (denominators 1); :meth:`finish_streamed` divides the gradient by
        the batch's denominator once every group is in. Runs in a worker thread while the
        sampler may be generating on the same weights (nothing writes them until the update)."""
        samples = [s for s in samples if any(s.mask)]
        if not samples:
            return
        t0 = time.perf_counter()
        if not sums.acc:  # the step's first group: nothing left over from a failed step
            sums.acc = self._new_acc()
            self.optimizer.zero_grad(set_to_none=True)
        self._prepare(samples)
        for micro, _ in self._my_micro_batches(samples):  # one rank: all of them, real
            sums.loss += self._micro_step(micro, True, 1, 1, 1, sums.acc)
        sums.n_seqs += len(samples)
        sums.n_tokens += sum(sum(s.mask) for s in samples)
        sums.seconds += time.perf_counter() - t0

    def finish_streamed(self, sums: StepSums) -> dict[str, Any]:
        """The update of a streamed step: gradient ÷ the batch's denominator, clip, AdamW."""
        cfg = self.config
        lr = self.optimizer.param_groups[0]["lr"]
        if sums.n_seqs == 0:
            return self._skipped_step(lr)
        scale = 1.0 / loss_denominator(
            cfg.loss_agg, n_seqs=sums.n_seqs, n_tokens=sums.n_tokens, norm_len=self._norm_len
        )
        with torch.no_grad():
            for p in self.module.parameters():
                if p.grad is not None:
                    p.grad.mul_(scale)
        gn = self._update()
        # the hf sampler switched the shared model to eval mode and back during the passes; in
        # some interleavings with _fill_logprobs "back" is eval: train mode, as load() set it
        self.model.train()
        sums.acc["loss"] = sums.loss * scale
        row = self._stepped(sums.acc, [gn], 1, lr)
        row["time_train_streamed"] = sums.seconds
        return row

    # -- shared by both ---------------------------------------------------------------------------

    @property
    def _norm_len(self) -> int:
        cfg = self.config
        return cfg.norm_len or cfg.sampling.max_tokens * _turns_per_attempt(cfg.env.harness)

    def _new_acc(self) -> dict[str, float]:
        acc = {"loss": 0.0, "kl": 0.0, "kl_mu": 0.0, "ent": 0.0, "ent_n": 0.0, "clip": 0.0}
        acc["tok"] = 0.0
        if self.config.is_mode != "off":
            acc["is_hit"] = acc["is_w"] = 0.0
        return acc

    def _prepare(self, samples: list[_Sample]) -> None:
        """What the loss needs beyond the samples: π_old (the sampler's log-probs, or recomputed),
        the sampler's kept apart for ``is_correction``, the reference's for the KL term."""
        cfg = self.config
        need_old = cfg.old_logprobs == "recompute" or any(
            math.isnan(o) for s in samples for o, m in zip(s.old, s.mask, strict=True) if m
        )
        is_mode = cfg.is_mode
        if is_mode != "off":
            # issue 25: the sampler's log-probs become the IS weights' denominator and the
            # current weights' are π_old (ρ's denominator): decoupled PPO in async mode
            for s in samples:
                if any(math.isnan(o) for o, m in zip(s.old, s.mask, strict=True) if m):
                    raise PolicyError(
                        f"is_correction = {cfg.is_correction!r} corrects the sampler's "
                        "log-probs, but the policy returned none; use a backend that reports "
                        "them (hf, vllm) or is_correction = 'off'"
                    )
                s.sampler = list(s.old)
            if not self._old_inline:
                self._fill_logprobs(samples, "old")
        elif need_old:
            if cfg.async_mode:
                raise PolicyError(
                    "async GRPO needs the sampler's log-probs, but the policy returned none"
                )
            self._fill_logprobs(samples, "old")
        if cfg.beta > 0:
            self._fill_logprobs(samples, "ref")

    def _update(self) -> float:
        """Clip the accumulated gradient, take the optimizer step, clear it; the norm."""
        gn = torch.nn.utils.clip_grad_norm_(
            [p for p in self.module.parameters() if p.requires_grad], self.config.max_grad_norm
        )
        with self.weights_lock:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(gn)

    def _skipped_step(self, lr: float) -> dict[str, Any]:
        with warnings.catch_warnings():  # "scheduler before optimizer": intended here
            warnings.simplefilter("ignore", UserWarning)
            self.scheduler.step()
        self.step += 1
        return {"loss": None, "kl": None, "kl_behaviour": None, "entropy": None,
                "clip_frac": None, "lr": lr, "grad_norm": None, "optimizer_steps": 0,
                "skipped": True, **self._is_metrics(None)}  # fmt: skip

    def _stepped(
        self,
        acc: dict[str, float],
        grad_norms: list[float],
        updates: int,
        lr: float,
    ) -> dict[str, Any]:
        """End the step (schedule, counter) and its metrics from the loss's sums."""
        cfg = self.config
        self.scheduler.step()
        self.step += 1
        keys = sorted(acc)
        acc = dict(zip(keys, self.world.sum([acc[k] for k in keys]), strict=True))
        tok = max(acc["tok"], 1.0)
        return {
            "loss": acc["loss"] / max(updates, 1),
            "kl": acc["kl"] / tok if cfg.beta > 0 else None,
            "kl_behaviour": acc["kl_mu"] / tok,
            "entropy": acc["ent"] / max(acc["ent_n"], 1.0),
            "clip_frac": acc["clip"] / tok,
            "grad_norm": sum(grad_norms) / len(grad_norms) if grad_norms else None,
            "lr": lr,
            "optimizer_steps": updates,
            "skipped": False,
            **self._is_metrics(acc),
        }

    def _is_metrics(self, acc: dict[str, float] | None) -> dict[str, Any]:
        """The ``is_correction`` metrics of a step (none when it is off): ``is_capped_frac``,
        the share of loss tokens whose weight π_old/μ was truncated or masked, and
        ``is_weight_mean``, the mean weight over loss tokens after the cap (None when skipped).
        """
        if self.config.is_mode == "off":
            return {}
        if acc is None:
            return {"is_capped_frac": None, "is_weight_mean": None}
        tok = max(acc["tok"], 1.0)
        return {"is_capped_frac": acc["is_hit"] / tok, "is_weight_mean": acc["is_w"] / tok}

    def _micro_step(
        self,
        micro: list[_Sample],
        want_entropy: bool,
        n_seqs: int,
        n_tokens: int,
        norm_len: int,
        acc: dict[str, float],
        real: bool = True,
    ) -> float:
        """Forward + backward of one micro-batch; returns its share of the mini-batch loss.

        ``real`` False: a stand-in micro-batch of a rank that has run out of sequences; its
        backward (of a zero loss) only keeps the collectives in step, and nothing is counted."""
        cfg = self.config
        logp, ent = self._logprobs(micro, self.module, want_entropy and real)  # [n, R] each
        mask = _right_aligned([s.mask for s in micro], logp.shape[1], 0.0, logp.device)
        if self._old_inline:  # π_old: this very forward, before the step's update (above)
            old = logp.detach()
            if real:  # kept on the samples, as the recomputing forward keeps it
                rows = old.cpu()
                for k, s in enumerate(micro):
                    s.old = rows[k, rows.shape[1] - len(s.resp) :].tolist()
        else:
            old = _right_aligned([s.old for s in micro], logp.shape[1], 0.0, logp.device)
            old = torch.where(mask > 0, old, logp.detach())  # unmasked slots: ratio 1, no NaN
        # [n], or [n, R] once a teacher has scored the tokens (issue 40: on-policy distillation)
        adv = advantage_tensor(micro, logp.shape[1], logp.device)
        per_tok, clipped = self._policy_loss(logp, old, adv, mask, micro, acc if real else None)
        if cfg.beta > 0:
            ref = _right_aligned([s.ref or [] for s in micro], logp.shape[1], 0.0, logp.device)
            kl = kl_k3(logp, torch.where(mask > 0, ref, logp.detach()))
            per_tok = per_tok + cfg.beta * kl
            if real:
                acc["kl"] += float((kl.detach() * mask).sum())
        loss = aggregate(
            per_tok, mask, cfg.loss_agg, n_seqs=n_seqs, n_tokens=n_tokens, norm_len=norm_len
        )
        # DDP and FSDP average gradients over ranks; the sum is wanted (see above).
        (loss * (self.world.size if real else 0.0)).backward()
        if not real:
            return 0.0
        with torch.no_grad():  # how far the update moved from the sampler (0 at ρ = 1)
            acc["kl_mu"] += float((kl_k3(logp.detach(), old) * mask).sum())
        acc["clip"] += float((clipped * mask).sum())
        acc["tok"] += float(mask.sum())
        if ent is not None:
            acc["ent"] += float((ent.detach() * mask).sum())
            acc["ent_n"] += float(mask.sum())
        return float(loss.detach())

    def _policy_loss(
        self,
        logp: torch.Tensor,
        old: torch.Tensor,
        adv: torch.Tensor,
        mask: torch.Tensor,
        micro: list[_Sample],
        acc: dict[str, float] | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The per-token policy loss [n, R] and its clip mask (:func:`policy_loss`, the objective
        in :mod:`leanrl.train.grpo.trainer`). ``acc`` (None for a stand-in micro-batch) collects
        the ``is_correction`` counts."""
        cfg = self.config
        mu = None
        is_mode = cfg.is_mode
        if is_mode != "off":
            mu = _right_aligned([s.sampler or [] for s in micro], logp.shape[1], 0.0, logp.device)
            mu = torch.where(mask > 0, mu, old)  # unmasked slots: weight 1
        per_tok, clipped, w, hit = policy_loss(
            logp, old, adv, mask, level=cfg.importance_sampling_level, loss=cfg.loss,
            eps_low=cfg.eps_low, eps_high=cfg.eps_high, dual_clip=cfg.dual_clip_c,
            cispo_min=cfg.cispo_min, cispo_max=cfg.cispo_max, sampler_logp=mu,
            is_mode=is_mode, is_cap=cfg.is_cap, is_floor=cfg.is_floor,
        )  # fmt: skip
        if acc is not None and w is not None and hit is not None:
            acc["is_hit"] += float((hit * mask).sum())
            acc["is_w"] += float((w * mask).sum())
        return per_tok, clipped

    def _logprobs(
        self, micro: list[_Sample], model: Any, entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs [n, R] of the response tokens under ``model`` and, with ``entropy``, their
        entropies [n, R] (for the log). With ``logprob_chunk`` set: through vocabulary tiles of
        the model's own head (:mod:`leanrl.train.grpo.tiled`), never [n, R, V] logits."""
        tiles = self._head_tiles(model, micro[0])
        if tiles is not None:
            logp, ent = self._forward(micro, model, tiles)
            return logp, ent.detach() if entropy else None
        temp = self.config.sampling.temperature or 1.0
        logits, targets = self._forward(micro, model)  # [n, R, V], [n, R]
        ent_full = full_entropy(logits, temp) if entropy else None  # no grad, row by row
        return token_logprobs(logits, targets, temp), ent_full

    def _head_tiles(self, model: Any, s: _Sample) -> HeadTiles | None:
        """``model``'s tiled head when ``logprob_chunk`` is set and its logits are its head's
        output (checked once per model on a short piece of ``s``, at the same point on every
        rank: FSDP's gathers are collectives); else None (full logits)."""
        cfg, inner = self.config, unwrap(model)
        if cfg.logprob_chunk is not None and id(inner) not in self._tiles:
            temp = cfg.sampling.temperature or 1.0
            short = [_Sample(prompt=s.prompt[-4:], resp=s.resp[:4], mask=[], old=[], adv=0.0)]
            tiles, why = HeadTiles.checked(
                inner, temp, cfg.logprob_chunk, cfg.logprob_vocab_tile,
                lambda t: self._forward(short, inner, t),
            )  # fmt: skip
            if why:
                log.warning("logprob_chunk: %s keeps full logits: %s", type(inner).__name__, why)
            self._tiles[id(inner)] = tiles
        return self._tiles.get(id(inner))

    def _forward(
        self, micro: list[_Sample], model: Any, tiles: HeadTiles | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits predicting each response token, and the tokens: ``([n, R, V], [n, R])``.
        Left padding puts every response at the right edge, so only the last R+1 positions
        need logits (``logits_to_keep``). With ``tiles``: ``(log-probs, entropies)`` [n, R]
        from the head's tiles instead (no logits)."""
        pad = self.tokenizer.pad_token_id or 0
        seqs = [s.prompt + s.resp for s in micro]
        width = max(len(x) for x in seqs)  # L
        r_max = max(len(s.resp) for s in micro)  # R
        ids = torch.full((len(seqs), width), pad, dtype=torch.long)
        attn = torch.zeros((len(seqs), width), dtype=torch.long)
        for k, x in enumerate(seqs):
            ids[k, width - len(x) :] = torch.tensor(x, dtype=torch.long)
            attn[k, width - len(x) :] = 1
        ids, attn = ids.to(self.device), attn.to(self.device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)  # same convention as generation
        ctx: Any = (
            torch.autocast(device_type="cuda", dtype=self.autocast)
            if self.autocast is not None
            else _Null()
        )
        targets = ids[:, width - r_max :]
        with ctx, tiles.bound(targets) if tiles is not None else _Null() as got:
            out = model(
                input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=r_max + 1
            )
        if tiles is not None:  # head input j predicts token j+1; the last kept one is dropped
            assert got is not None  # bound() yields the dict the tiled head fills
            return tiles.result(out.logits, got)
        logits = out.logits[:, :-1, :]  # [n, R, V]: position j predicts token j+1
        return logits, targets

    def _my_micro_batches(self, seqs: list[_Sample]) -> list[tuple[list[_Sample], bool]]:
        """This rank's contiguous share of ``seqs`` cut into micro-batches, padded with stand-in
        micro-batches (``False``) to the count of the rank with the most. One rank: ``seqs`` cut
        into micro-batches, exactly as without distribution."""
        world, mbs = self.world, self.config.micro_batch_size
        shares = _split(list(range(len(seqs))), world.size)
        mine = [seqs[i] for i in shares[world.rank]]
        if self.config.sort_micro_batches:  # like lengths together: less padding, same sums
            mine.sort(key=lambda s: (len(s.prompt) + len(s.resp), len(s.resp)))
        n_micro = max(math.ceil(len(sh) / mbs) for sh in shares)
        out: list[tuple[list[_Sample], bool]] = []
        for k in range(n_micro):
            micro = mine[k * mbs : (k + 1) * mbs]
            out.append((micro, True) if micro else ([seqs[0]], False))
        return out

    @torch.no_grad()
    def _fill_logprobs(self, samples: list[_Sample], which: str) -> None:
        """No-grad log-probs of every response token under the current weights (``old``) or the
        reference (``ref``: the starting model, or with LoRA the model with adapters off).
        Each rank computes its share; the shares are gathered so every rank has them all."""
        ctx: Any = _Null()
        if which == "ref" and self.ref_model is not None:
            model = self.ref_model
        else:
            model = unwrap(self.module)  # DDP: the replica itself, no collective needed
            if which == "ref":
                ctx = model.disable_adapter()  # LoRA: the base model is the reference
        shares = _split(list(range(len(samples))), self.world.size)
        mine = shares[self.world.rank]
        got: dict[int, list[float]] = {}
        was = model.training
        model.eval()
        try:
            with ctx:
                for micro, real in self._my_micro_batches(samples):
                    lp, _ = self._logprobs(micro, model)  # [n, R]
                    if not real:
                        continue
                    lp = lp.cpu()
                    for k, s in enumerate(micro):
                        got[id(s)] = lp[k, lp.shape[1] - len(s.resp) :].tolist()
        finally:
            model.train(was)
        local = [got[id(samples[i])] for i in mine]
        for share, vals in zip(shares, self.world.all_gather(local), strict=True):
            for i, v in zip(share, vals, strict=True):
                if which == "old":
                    samples[i].old = v
                else:
                    samples[i].ref = v

    # -- checkpoints ----------------------------------------------------------------------------

    def save_checkpoint(self, row: dict[str, Any]) -> Path | None:
        """HF model folder (with LoRA: the adapters, peft layout) + trainer_state.json +
        optimizer.pt (:func:`~leanrl.train.grpo.model_io.save_engine_checkpoint`); rank 0 gets
        the folder, the other ranks (which take part in the gathers) None."""
        return save_engine_checkpoint(self, row, OPTIMIZER_FILE)
