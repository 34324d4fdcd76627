"""Policy backends: ``hf`` (transformers, the default), ``openai`` (HTTP) and ``vllm`` (GPU).

:func:`make_policy` builds the backend a :class:`~leanrl.PolicyConfig` names. Backends import
their heavy dependencies (torch, transformers, vllm) only in ``start()``, so importing this
package is cheap.
"""

from __future__ import annotations

from leanrl.errors import ConfigError
from leanrl.policy import Policy, PolicyConfig

__all__ = ["make_policy"]


def make_policy(config: PolicyConfig) -> Policy:
    """The policy backend ``config.backend`` names, configured but not started."""
    if not config.model:
        raise ConfigError(
            "no model given: pass --model PATH_OR_ID (a local model folder, a Hugging Face id, "
            "or the served model name for --backend openai)"
        )
    if config.backend == "hf":
        from leanrl.policies.hf import HFPolicy

        return HFPolicy(config)
    if config.backend == "openai":
        from leanrl.policies.openai import OpenAIPolicy

        return OpenAIPolicy(config)
    if config.backend == "vllm":
        from leanrl.policies.vllm import VLLMPolicy

        return VLLMPolicy(config)
    raise ConfigError(f"unknown policy backend {config.backend!r}; use hf, openai or vllm")
