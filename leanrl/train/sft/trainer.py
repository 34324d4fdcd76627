"""Supervised fine-tuning on verified proofs, on transformers' ``Trainer``.

``SFTTrainer`` turns (statement, proof) pairs (``proofs.jsonl`` files, or a dataset's proof
column; see :mod:`leanrl.train.sft.data`) into examples in the configured harness prompt format,
with loss on the answer's tokens only, and trains with the maintained ``transformers.Trainer``
(AdamW, the schedule, gradient accumulation, bf16, gradient checkpointing, checkpoint
save/resume). It writes the run folder every leanrl trainer writes: ``config.json``,
``metrics.jsonl`` (one row per optimizer step: loss, grad norm, learning rate, tokens/s, and the
in-run evaluation's ``eval/pass@k`` when it ran), ``checkpoint-N/`` Hugging Face model folders
(``leanrl eval --model`` loads them; the Trainer's optimizer, scheduler and RNG state sit next to
the weights, with its own ``trainer_state.json``; with ``lora.rank > 0`` the adapters in the peft
layout, and the merged model in ``merged/`` with ``lora.save_merged``), and ``loss_curve.png``.
Rerunning the same command resumes from the newest complete checkpoint, with the same data
order: a run resumed in the middle of an epoch ends with the weights of one that never stopped
(bit for bit on the CPU).

Examples are batched by length (``group_by_length``) to spend less compute on padding; the
benchmark ``benchmarks/sft_vs_trl.py`` compares the throughput with TRL's ``SFTTrainer``.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import shutil
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from leanrl._dist import install_hint
from leanrl.environment import Environment, load_environment
from leanrl.errors import ConfigError, PolicyError, disk_errors
from leanrl.policy import PolicyConfig, SamplingConfig
from leanrl.rollout import Rollout
from leanrl.runtime import run_sync
from leanrl.train.common import (
    MetricsLogger,
    RunDir,
    TrainConfig,
    check_model_path,
    check_runtimes,
    resume_line,
    write_checksums,
)
from leanrl.train.lora import LoRAConfig, check_peft
from leanrl.train.sft.data import Pair, SFTDataConfig

__all__ = [
    "SFTConfig",
    "SFTOptions",
    "SFTTrainer",
    "answer_loss",
    "device_and_precision",
    "load_model",
    "train_sft",
]

log = logging.getLogger("leanrl.train.sft")


class SFTOptions(BaseModel):
    """How SFT optimises (shared by ``leanrl train sft`` and expert iteration's SFT phase)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    epochs: float | None = Field(default=None, gt=0)
    """Passes over the examples (unset, with ``steps`` unset too: 1). Give ``epochs`` or
    ``steps``, not both."""
    steps: int | None = Field(default=None, ge=1)
    """Train exactly this many optimizer steps instead of a number of epochs."""
    batch_size: int = Field(default=16, ge=1)
    """Examples per optimizer step (``micro_batch_size`` × gradient accumulation)."""
    micro_batch_size: int | None = Field(default=None, ge=1)
    """Examples per forward/backward; must divide ``batch_size``. Unset: 4, or ``batch_size``
    when that is smaller (the largest divisor of ``batch_size`` up to 4 in general)."""
    lr: float = Field(default=1e-5, gt=0)
    """AdamW learning rate (DeepSeek-Prover-V1.5's SFT used 1e-4 at 512 batch; small models and
    batches want less)."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "cosine"
    """Learning rate after warm-up: ``constant``, or decayed to 0 at the last step."""
    warmup_steps: int = Field(default=0, ge=0)
    """Linear warm-up over this many optimizer steps."""
    weight_decay: float = Field(default=0.0, ge=0)
    """AdamW weight decay."""
    adam_betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    max_grad_norm: float = Field(default=1.0, gt=0)
    """Clip the global gradient norm at this value."""
    precision: Literal["auto", "fp32", "bf16-mixed", "bf16"] = "auto"
    """``fp32``; ``bf16-mixed`` (CUDA): fp32 weights, bf16 autocast; ``bf16``: bf16 weights.
    ``auto``: bf16-mixed on a GPU, fp32 on the CPU."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, ~30% slower)."""
    group_by_length: bool = True
    """Batch examples of similar length together (less padding; the order is still shuffled,
    from the seed and the epoch alone, so a resumed run sees the batches it would have seen)."""

    @model_validator(mode="after")
    def _batches(self) -> SFTOptions:
        if self.epochs is not None and self.steps is not None:
            # Either could be meant: refuse rather than let one silently win.
            raise ValueError(
                f"epochs = {self.epochs} and steps = {self.steps} are both set, but SFT trains "
                "either for a number of passes over the examples (epochs) or for a number of "
                "optimizer steps (steps): remove one of them (from the config file too)"
            )
        if self.micro_batch_size is None:
            # follows the batch: `--batch-size 2` alone is a valid run, not an error
            self.micro_batch_size = max(d for d in range(1, 5) if self.batch_size % d == 0)
        if self.batch_size % self.micro_batch_size:
            raise ValueError(
                f"batch_size = {self.batch_size} is not a multiple of micro_batch_size = "
                f"{self.micro_batch_size}: gradient accumulation needs whole micro-batches"
            )
        return self


class SFTConfig(SFTOptions, TrainConfig):
    """Supervised fine-tuning on (statement, proof) pairs, loss on the proof only."""

    data: SFTDataConfig = Field(default_factory=SFTDataConfig)
    """Where the pairs come from (``--data.proofs runs/x/proofs.jsonl``, or the dataset of
    ``env`` with ``--data.from_env``), and how they become examples."""
    # SFTOptions' optional steps, not TrainConfig's required int (mypy: the bases disagree).
    steps: int | None = Field(default=None, ge=1)  # type: ignore[assignment]
    """Train exactly this many optimizer steps instead of a number of epochs."""
    tasks_per_step: int = Field(default=8, ge=1)
    """Not used by SFT (a step is ``batch_size`` examples)."""
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    """Not used by SFT itself (the in-run evaluation has its own, ``eval.sampling``)."""
    lora: LoRAConfig = Field(default_factory=LoRAConfig)
    """Train low-rank adapters (``peft``) instead of every weight: ``--lora.rank 16``.
    Checkpoints then hold the adapters in the peft layout (``merged/`` too with
    ``lora.save_merged``)."""


class SFTTrainer:
    """Fine-tune ``config.policy.model`` on proof pairs. ``__init__`` only stores; :meth:`train`
    (or :meth:`train_sync`) checks, loads, resumes if the run folder holds a checkpoint, and
    trains. ``pairs`` given here are used instead of ``config.data`` (expert iteration), and
    ``episodes`` (by task id and proof digest) instead of those ``data.turns = "all"`` reads
    beside ``data.proofs``."""

    #: Fields that may change between a run and its resume (they do not change the weights).
    RESUMABLE = ("steps", "out", "log_to", "run_name", "keep_checkpoints", "save_every", "eval")

    def __init__(
        self,
        config: SFTConfig,
        env: Environment | None = None,
        pairs: Sequence[Pair] | None = None,
        episodes: Mapping[tuple[str, str], Rollout] | None = None,
    ) -> None:
        self.config = config
        self.env = env
        self.pairs = list(pairs) if pairs is not None else None
        self.episodes = episodes
        self.run = RunDir(config.out)
        self.model: Any = None
        self.tokenizer: Any = None

    def check(self) -> None:
        """Cheap checks before anything is loaded (clear :class:`ConfigError` s)."""
        cfg = self.config
        check_model_path(cfg.policy.model)
        if importlib.util.find_spec("accelerate") is None:
            raise ConfigError(
                "leanrl train sft runs on transformers' Trainer, which needs accelerate: "
                f"{install_hint('sft')} (or pip install accelerate)"
            )
        if cfg.env.harness.name == "tactic-loop" and cfg.data.turns != "all":
            raise ConfigError(
                "SFT trains whole-proof answers; the tactic-loop harness prompts for tactics. "
                "Use --env.harness.name whole-proof (or self-correction, whose first turn is the "
                "same prompt), or train whole tactic-loop episodes with --data.turns all"
            )
        if cfg.policy.backend != "hf":
            raise ConfigError("SFT trains a transformers model: use --policy.backend hf")
        if cfg.budget.active:  # it would be ignored: say so rather than train past it
            raise ConfigError(
                "budget.tokens / budget.gpu_s are set, but SFT does not stop on a budget (it "
                "generates no tokens): give its length as --steps N or --epochs E instead"
            )
        check_peft(cfg.lora)
        device_and_precision(cfg.policy.device, cfg.precision)

    def train_sync(self) -> list[dict[str, Any]]:
        """Train; returns the metrics rows this call wrote. On a run that is finished already
        nothing is trained or loaded (:meth:`load_trained` loads its final weights)."""
        self.check()
        cfg = self.config
        env = self.env or load_environment(cfg.env)
        pairs = self.pairs
        if pairs is None:
            from leanrl.train.sft.data import load_pairs

            env_tasks = env.tasks() if cfg.data.from_env else None
            pairs = load_pairs(cfg.data, env_tasks)
        if not pairs:
            raise ConfigError(
                "no training pairs: give proofs files (--data.proofs runs/x/proofs.jsonl) or a "
                "dataset with a proof column (--data.from_env, --data.proof_column formal_proof)"
            )
        cfg.eval.check_held_out(p.task.name for p in pairs)
        # SFT checks no attempts; its in-run evaluation does: no Lean for it fails now
        check_runtimes(None, cfg.eval)
        self.run.lock("SFT run")  # before anything is written: one run per folder
        resumed = self.run.bind_config(cfg, ignore=self.RESUMABLE)
        from leanrl.decontam import save_taskset_report

        save_taskset_report(env.taskset, self.run.path)  # what decontamination dropped
        latest = self._resume_point() if resumed else None
        if latest is not None:
            log.info(resume_line(latest, int(latest.name.split("-", 1)[1])))
            finished = self._finished(latest)
            if finished is not None:
                log.info(finished)
                self._end()
                return []
        elif resumed:
            log.info(self.run.no_checkpoint_line())  # none yet, or every one damaged (why)
        self._load()
        from leanrl.train.sft.data import encode_pairs

        episodes = self.episodes
        if episodes is None and cfg.data.turns == "all":
            from leanrl.train.sft.data import episodes_from_results

            episodes = episodes_from_results(cfg.data.proofs)
        examples = encode_pairs(
            pairs,
            env.harness,  # the prompt the model is sampled with (Countdown's is its own)
            self.tokenizer,
            chat=cfg.policy.chat,
            target=cfg.data.target,
            max_length=cfg.data.max_length,
            episodes=episodes if cfg.data.turns == "all" else None,
        )
        if not examples:
            raise ConfigError(
                f"none of the {len(pairs)} pairs makes an example: longer than "
                f"data.max_length = {cfg.data.max_length} tokens (raise it)"
                + (
                    ", or no verified multi-turn episode of it in the results.jsonl beside its "
                    "proofs.jsonl (data.turns = 'all')"
                    if cfg.data.turns == "all"
                    else ""
                )
            )
        logger = MetricsLogger(self.run, cfg.log_to, cfg.run_name, cfg.model_dump(mode="json"))
        logger.start()
        rows: list[dict[str, Any]] = []
        try:
            if latest is None and cfg.eval.baseline_due(self.run.metrics()):
                row = {"step": 0, **self._evaluate(0)}
                logger.log(row)
                rows.append(row)
            trainer = self._hf_trainer(examples, logger, rows)
            trainer.train(resume_from_checkpoint=str(latest) if latest else None)
        finally:
            logger.close()
            self._end()
        return rows

    def _end(self) -> None:
        """The plots (again, for a run killed before it drew them), then the lock goes."""
        self.run.plot("loss", f"SFT loss ({self.run.path.name})", "loss_curve.png")
        from leanrl.train.inrun_eval import plot_eval

        plot_eval(self.run)
        self.run.unlock()  # after the last write (the plots above)

    def load_trained(self) -> None:
        """Set :attr:`model` and :attr:`tokenizer` to the run's final weights when
        :meth:`train_sync` found the run finished and so loaded nothing (expert iteration
        publishes the model of a round whose SFT had finished before a kill). A no-op when a
        model is loaded already."""
        if self.model is not None:
            return
        latest = self.run.latest_checkpoint()
        if latest is None:
            raise ConfigError(f"{self.run.path} holds no checkpoint to load the trained model from")
        self._load()  # the base model (and fresh adapters with LoRA), as a resume starts
        if self.config.lora.enabled:
            from leanrl.train.lora import load_adapter

            load_adapter(self.model, latest[1])
        else:
            _, precision = device_and_precision(self.config.policy.device, self.config.precision)
            policy = self.config.policy.model_copy(update={"model": str(latest[1])})
            self.model, self.tokenizer = load_model(policy, precision)

    async def train(self) -> list[dict[str, Any]]:
        """:meth:`train_sync` off the event loop."""
        import asyncio

        return await asyncio.to_thread(self.train_sync)

    # -- parts ------------------------------------------------------------------------------------

    def _resume_point(self) -> Any:
        """The newest complete checkpoint whose files are what was written; half-written ones
        (no ``trainer_state.json``, left by a kill mid-save) are removed so the Trainer cannot
        pick them, and damaged ones (a checksum or structure that does not match) are moved
        to ``quarantined/``, out of the Trainer's sight and of ``keep_checkpoints``."""
        complete = {p for _, p in self.run.checkpoints()}
        for p in self.run.path.glob("checkpoint-*"):
            if p.is_dir() and p not in complete:
                shutil.rmtree(p, ignore_errors=True)
        latest = next(self.run.resumable_checkpoints(), None)
        self.run.truncate_metrics(latest[0] if latest else 0)
        return latest[1] if latest else None

    def _finished(self, checkpoint: Any) -> str | None:
        """The line to log when ``checkpoint`` already ends the run (None when steps remain).

        transformers' Trainer, resumed from the checkpoint of its last step when that step ends
        mid-epoch, trains one step more (``step 7/6``): a finished run rerun must do nothing.
        The end is ``steps`` when given (it may be raised to train on), else the number of
        optimizer steps the run's epochs came to (recorded by the Trainer; ``epochs`` cannot
        change on resume)."""
        done = int(checkpoint.name.split("-", 1)[1])
        end = self.config.steps
        if end is None:
            try:
                state = json.loads((checkpoint / "trainer_state.json").read_text("utf-8"))
                end = int(state["max_steps"])
            except (OSError, ValueError, KeyError, TypeError):
                return None  # the Trainer decides (its state file was checked as JSON)
        if done < end:
            return None
        more = (
            f"raise --steps above {done} and rerun"
            if self.config.steps is not None
            else f"start a new run from it (--model {checkpoint} --out NEW_FOLDER)"
        )
        return (
            f"{self.run.path} is finished ({checkpoint.name} is step {done} of {end}): nothing "
            f"to train. To train on, {more}."
        )

    def _load(self) -> None:
        cfg = self.config
        _, precision = device_and_precision(cfg.policy.device, cfg.precision)
        self.model, self.tokenizer = load_model(cfg.policy, precision)
        if cfg.lora.enabled:
            from leanrl.train.lora import apply_lora

            # Fresh adapters (B = 0: step 0 is the base model). On resume the Trainer loads the
            # checkpoint's adapters into them (it knows peft models).
            self.model = apply_lora(self.model, cfg.lora, cfg.seed)
            if cfg.gradient_checkpointing:  # frozen embeddings: checkpointed inputs need grad
                self.model.enable_input_require_grads()

    def _hf_trainer(self, examples: list[dict[str, list[int]]], logger: Any, rows: list) -> Any:
        from transformers import PrinterCallback, Trainer, TrainingArguments

        cfg = self.config
        device, precision = device_and_precision(cfg.policy.device, cfg.precision)
        micro = cfg.micro_batch_size
        assert micro is not None  # the config's validator sets it
        accum = cfg.batch_size // micro
        schedule = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}
        length: dict[str, Any] = (
            {"max_steps": cfg.steps}
            if cfg.steps is not None
            else {"num_train_epochs": cfg.epochs or 1.0, "max_steps": -1}
        )
        args = TrainingArguments(
            output_dir=str(self.run.path),
            per_device_train_batch_size=micro,
            gradient_accumulation_steps=accum,
            learning_rate=cfg.lr,
            lr_scheduler_type=schedule[cfg.lr_schedule],
            warmup_steps=cfg.warmup_steps,
            weight_decay=cfg.weight_decay,
            adam_beta1=cfg.adam_betas[0],
            adam_beta2=cfg.adam_betas[1],
            max_grad_norm=cfg.max_grad_norm,
            logging_strategy="steps",
            logging_steps=1,
            save_strategy="steps",
            save_steps=cfg.save_every,
            save_total_limit=cfg.keep_checkpoints,
            seed=cfg.seed,
            data_seed=cfg.seed,
            report_to="none",
            use_cpu=device == "cpu",
            bf16=precision == "bf16-mixed",
            remove_unused_columns=False,
            dataloader_num_workers=0,
            train_sampling_strategy="group_by_length" if cfg.group_by_length else "random",
            disable_tqdm=True,
            **length,
            **_checkpointing(cfg.gradient_checkpointing),
        )
        counter = _TokenCounter()
        run = self.run

        class CountingTrainer(Trainer):  # type: ignore[misc]
            # Counted where the batch is trained on: the data loader fetches a batch ahead.
            def training_step(self, model: Any, inputs: Any, *a: Any, **kw: Any) -> Any:
                counter.tokens += int(inputs["attention_mask"].sum())
                return super().training_step(model, inputs, *a, **kw)

            def _get_train_sampler(self, train_dataset: Any = None) -> Any:
                # transformers' LengthGroupedSampler shuffles with the global torch RNG, whose
                # state a resume mid-epoch does not restore until after the epoch's order is
                # drawn: the rest of that epoch came in another order (and the weights drifted).
                if cfg.group_by_length:
                    batch = self.args.train_batch_size * self.args.gradient_accumulation_steps
                    return _length_sampler(examples, batch, cfg.seed)
                return super()._get_train_sampler(train_dataset)

            def _save_checkpoint(self, model: Any, trial: Any) -> Any:
                # The Trainer's own writes (weights, optimizer, RNG, state) report a full disk as
                # a bare "[Errno 28] No space left on device" or a torch error: name the folder.
                step = self.state.global_step
                with disk_errors(run.checkpoint_path(step), f"SFT checkpoint {step}"):
                    return super()._save_checkpoint(model, trial)

            def _issue_warnings_after_load(self, load_result: Any) -> None:
                # A tied lm_head is not saved (it is the embedding), so a resume reports it
                # "missing" although loading the embedding loaded it.
                super()._issue_warnings_after_load(_without_tied(self.model, load_result))

        pad = int(self.tokenizer.pad_token_id)
        trainer = CountingTrainer(
            model=self.model,
            args=args,
            train_dataset=examples,
            data_collator=lambda features: _collate(features, pad),
            processing_class=self.tokenizer,
            callbacks=[_callback(self, logger, counter, rows)],
        )
        trainer.remove_callback(PrinterCallback)  # our callback logs every step already
        return trainer

    def _evaluate(self, step: int) -> dict[str, Any]:
        from leanrl.train.inrun_eval import evaluate

        cfg = self.config
        return dict(
            run_sync(evaluate(cfg.eval, step, self.run, self.model, self.tokenizer, cfg.policy))
        )


class _TokenCounter:
    """Real (non-pad) tokens trained on so far."""

    def __init__(self) -> None:
        self.tokens = 0


def _length_sampler(examples: Sequence[dict[str, list[int]]], batch: int, seed: int) -> Any:
    """transformers' length-grouped order (batches of similar length, shuffled), drawn from
    (seed, epoch) alone: the Trainer calls ``set_epoch`` before every epoch, also the epoch a
    resume starts in the middle of, so a resumed run sees the batches an uninterrupted one saw
    (and in-run evaluations, which draw from the global RNG, do not change the order)."""
    import torch
    from transformers.trainer_pt_utils import LengthGroupedSampler, get_length_grouped_indices

    class EpochSeededSampler(LengthGroupedSampler):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(batch, lengths=[len(e["input_ids"]) for e in examples])
            self.epoch = 0

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

        def __iter__(self) -> Any:
            gen = torch.Generator().manual_seed(seed * 1_000_003 + self.epoch)
            return iter(get_length_grouped_indices(self.lengths, self.batch_size, generator=gen))

    return EpochSeededSampler()


def _without_tied(model: Any, load_result: Any) -> Any:
    """``load_result`` (missing and unexpected keys of a ``load_state_dict``) without the missing
    keys that name the same tensor as a key that was loaded (a tied ``lm_head.weight``)."""
    params: dict[str, Any] = dict(model.named_parameters(remove_duplicate=False))
    missing = set(load_result.missing_keys)
    loaded_ids = {id(p) for name, p in params.items() if name not in missing}
    keep = [
        k for k in load_result.missing_keys if k not in params or id(params[k]) not in loaded_ids
    ]
    return load_result._replace(missing_keys=keep)


def _collate(features: Sequence[dict[str, list[int]]], pad: int) -> dict[str, Any]:
    from leanrl.train.sft.data import collate

    return collate(features, pad)


def _checkpointing(on: bool) -> dict[str, Any]:
    """The TrainingArguments flag for activation checkpointing (renamed in transformers 5)."""
    if not on:
        return {}
    from transformers import TrainingArguments

    fields = TrainingArguments.__dataclass_fields__
    return {
        "activation_checkpointing"
        if "activation_checkpointing" in fields
        else "gradient_checkpointing": True
    }


def _callback(sft: SFTTrainer, logger: Any, counter: _TokenCounter, rows: list) -> Any:
    from transformers import TrainerCallback

    class LeanrlCallback(TrainerCallback):  # type: ignore[misc]
        """Writes one metrics row per optimizer step and runs the in-run evaluation."""

        def __init__(self) -> None:
            self.pending: dict[str, Any] = {}
            self.t_last = time.perf_counter()
            self.tok_last = 0

        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
            lora = sft.config.lora
            if lora.enabled and lora.save_merged:
                from leanrl.train.lora import MERGED_DIR, save_merged

                # The Trainer has just written checkpoint-N (the adapters); the merged model is
                # written beside them and renamed into place whole.
                folder = sft.run.checkpoint_path(state.global_step)
                tmp = folder / f".{MERGED_DIR}.tmp"
                shutil.rmtree(tmp, ignore_errors=True)
                save_merged(sft.model, sft.tokenizer, tmp, lora.scale)
                shutil.rmtree(folder / MERGED_DIR, ignore_errors=True)
                tmp.rename(folder / MERGED_DIR)
            folder = sft.run.checkpoint_path(state.global_step)
            if state.is_world_process_zero and folder.is_dir():
                # last, over every file the Trainer (and the merge above) wrote: what a resume
                # and every command that loads the checkpoint check its content against
                write_checksums(folder)
            return control

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
            if sft.config.eval.due(state.global_step, state.max_steps):
                self.pending = sft._evaluate(state.global_step)
                self.t_last = time.perf_counter()  # the evaluation's time is not training's
            return control

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> Any:
            logs = logs or {}
            if "loss" not in logs:  # the end-of-training summary, not a step
                return control
            now = time.perf_counter()
            tokens = counter.tokens - self.tok_last
            row = {
                "step": state.global_step,
                "loss": logs.get("loss"),
                "grad_norm": logs.get("grad_norm"),
                "lr": logs.get("learning_rate"),
                "epoch": logs.get("epoch"),
                "tokens": tokens,
                "tokens_per_s": tokens / max(now - self.t_last, 1e-9),
                **self.pending,
            }
            self.pending = {}
            self.t_last, self.tok_last = now, counter.tokens
            logger.log(row)
            rows.append(row)
            log.info("step %d/%d: loss %.4g", state.global_step, state.max_steps, row["loss"])
            return control

    return LeanrlCallback()


def load_model(policy: PolicyConfig, precision: str) -> tuple[Any, Any]:
    """The causal LM of ``policy.model`` (bf16 weights for ``precision = "bf16"``, else fp32)
    and its tokenizer, with a pad token."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    try:
        tokenizer = AutoTokenizer.from_pretrained(policy.model)
        model = AutoModelForCausalLM.from_pretrained(policy.model, dtype=dtype, **policy.options)
    except (OSError, ValueError) as e:
        raise PolicyError(f"cannot load model {policy.model!r}: {e}") from e
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def device_and_precision(device: str, precision: str) -> tuple[str, str]:
    """The training device (``policy.device``, ``auto`` resolved) and the precision (``auto``
    resolved: bf16-mixed on a GPU, fp32 on the CPU); a :class:`ConfigError` if they clash."""
    import torch

    dev = device
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"policy.device is {dev!r} but no CUDA device is available")
    if precision == "auto":
        precision = "bf16-mixed" if dev.startswith("cuda") else "fp32"
    if precision == "bf16-mixed" and not dev.startswith("cuda"):
        raise ConfigError("precision 'bf16-mixed' needs a CUDA device; use 'fp32' on the CPU")
    return dev, precision


def answer_loss(
    model: Any, examples: Sequence[dict[str, list[int]]], pad_id: int, batch: int = 8
) -> float:
    """Mean loss per answer token of ``model`` on ``examples`` (no gradients)."""
    import torch

    from leanrl.train.sft.data import IGNORE, collate

    total, count = 0.0, 0
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            for lo in range(0, len(examples), batch):
                b = collate(examples[lo : lo + batch], pad_id)
                device = next(model.parameters()).device
                logits = model(
                    input_ids=b["input_ids"].to(device),
                    attention_mask=b["attention_mask"].to(device),
                ).logits[:, :-1, :]
                labels = b["labels"][:, 1:].to(device)
                lp = torch.nn.functional.cross_entropy(
                    logits.float().reshape(-1, logits.shape[-1]),
                    labels.reshape(-1),
                    ignore_index=IGNORE,
                    reduction="sum",
                )
                total += float(lp)
                count += int((labels != IGNORE).sum())
    finally:
        model.train(was)
    return total / count if count else math.nan


def train_sft(config: SFTConfig, env: Environment | None = None) -> list[dict[str, Any]]:
    """Train with SFT (blocking); returns the metrics rows. ``SFTTrainer(...).train_sync()``."""
    return SFTTrainer(config, env).train_sync()
