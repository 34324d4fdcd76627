"""The on-policy distillation options: the ``distill`` section of a GRPO run.

Its own small module (no torch): :class:`leanrl.train.grpo.GRPOConfig` holds one, and configs
are imported at CLI start-up. The objective they configure is in :mod:`leanrl.train.grpo.trainer`
(step 3) and :mod:`leanrl.train.distill.objective`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["DistillConfig", "is_server"]


def is_server(teacher: str) -> bool:
    """Whether a teacher spec names an OpenAI-compatible server (``http://host:port/v1``)."""
    return teacher.startswith(("http://", "https://"))


class DistillConfig(BaseModel):
    """On-policy distillation (OPD): the student samples, a teacher scores every sampled model
    token, and each token's advantage becomes ``A_j - coef · (log π_student(o_t) - log
    π_teacher(o_t))``. Off while no teacher is named."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    teacher: str | None = None
    """The teacher that scores the student's tokens: a model folder, a Hugging Face id (from
    the local cache), a leanrl run folder (its newest checkpoint) or checkpoint, or the URL of
    an OpenAI-compatible server that returns prompt log-probs (``http://127.0.0.1:8000/v1``:
    vLLM's ``prompt_logprobs``, or ``echo`` with ``logprobs``). It must share the student's
    tokenizer (checked before any model loads). Unset: no distillation."""
    experts: dict[str, str] = Field(default_factory=dict)
    """One teacher per environment of a mixed run (``envs``): environment name → teacher, in
    any form ``teacher`` takes (``--distill.experts '{"countdown": "runs/cd"}'``, or a TOML
    table). An environment without an expert is scored by ``teacher``; with neither, its
    tokens carry no distillation term."""
    coef: float = Field(default=1.0, ge=0.0)
    """λ, the weight of the per-token reverse KL in the advantage: ``A_t = A_j - λ · (log
    π_s(o_t) - log π_t(o_t))``. 1 is what the tinker cookbook and slime use by default."""
    only: bool = False
    """Train on the reverse KL alone (``A_t = -λ · (log π_s - log π_t)``): the verifier's
    reward is logged but does not enter the objective, so any environment works, Countdown
    included. Every group then carries signal, so ``dynamic_sampling`` defaults to ``off`` and
    ``mask_truncated`` to false (a cut-off attempt's tokens are still scored)."""
    temperature: float = Field(default=1.0, gt=0.0)
    """The teacher's softmax temperature (1: its own distribution). A server teacher's prompt
    log-probs are of its raw logits, so only 1 is allowed there."""
    revisions: dict[str, str] = Field(default_factory=dict)
    """The teachers' revisions (teacher → revision: a hub commit, the digest of a checkpoint's
    ``checksums.sha256`` or of a folder's files, a server's model id), filled in when the run
    starts and recorded in ``config.json``; a resumed run whose teacher has changed is
    refused. Set one to pin it: a teacher found at another revision is refused."""
    server_model: str | None = None
    """A server teacher: the model name to ask for (default: the one model the server lists)."""
    tokenizer: str | None = None
    """A server teacher without a ``/tokenize`` endpoint: the folder or hub id of its
    tokenizer, compared with the student's before the run starts (vLLM's ``/tokenize`` is
    used when the server has one)."""
    micro_batch_size: int = Field(default=8, ge=1)
    """Sequences per forward pass of an in-process teacher (no gradients are kept)."""
    logprob_chunk: int = Field(default=1024, ge=1)
    """An in-process teacher's log-probs go through tiles of this many tokens ×
    ``vocab_tile`` vocabulary entries of its output head (never the [tokens, V] logits; the
    tiled path of ``logprob_chunk`` in GRPO)."""
    vocab_tile: int = Field(default=8192, ge=1)
    """Vocabulary entries per tile of the teacher's head."""
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """An in-process teacher's weights: ``auto`` is bf16 on a GPU and fp32 on the CPU."""
    device: str = "auto"
    """Where an in-process teacher runs (``cuda:1``, ``cpu``); ``auto``: the student's device."""
    max_concurrency: int = Field(default=8, ge=1)
    """A server teacher: requests in flight at once (one sequence each)."""
    request_timeout_s: float = Field(default=300.0, gt=0.0)
    """A server teacher: seconds before one scoring request is given up on (retried twice)."""

    @field_validator("teacher", "server_model", "tokenizer")
    @classmethod
    def _not_blank(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("must not be empty (leave it unset instead)")
        return v.strip() if v is not None else None

    @model_validator(mode="after")
    def _consistent(self) -> DistillConfig:
        if self.only and not self.enabled:
            raise ValueError(
                "distill.only trains on the teacher's reverse KL alone, but no teacher is named: "
                "pass --distill.teacher MODEL (or distill.experts for a mixed run)"
            )
        servers = [t for t in self.teachers() if is_server(t)]
        if servers and self.temperature != 1.0:
            raise ValueError(
                f"distill.temperature = {self.temperature} with a server teacher ({servers[0]}): "
                "a server's prompt log-probs are of its raw logits (temperature 1); use 1.0 or "
                "an in-process teacher"
            )
        return self

    @property
    def enabled(self) -> bool:
        """Whether any teacher is named (distillation is on)."""
        return self.teacher is not None or bool(self.experts)

    def teachers(self) -> list[str]:
        """Every distinct teacher named, ``teacher`` first."""
        names = ([self.teacher] if self.teacher else []) + list(self.experts.values())
        return list(dict.fromkeys(names))

    def teacher_for(self, env: str | None) -> str | None:
        """The teacher of an environment's tokens: its expert, else ``teacher``."""
        if env is not None and env in self.experts:
            return self.experts[env]
        return self.teacher
