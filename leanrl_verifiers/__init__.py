"""leanrl's verifiers plugin, resolved by id: ``vf-eval leanrl-verifiers ...``.

verifiers (0.4) imports a taskset or harness id as a top-level module (``leanrl-verifiers`` ->
``leanrl_verifiers``) and takes the one ``Taskset`` (and ``Harness``) subclass its ``__all__``
exports. This module is only that name; the code is :mod:`leanrl.interop.verifiers_plugin`.
It needs the extra: ``pip install 'leanrl[verifiers]'`` (Python 3.11+).
"""

from leanrl.interop.verifiers_plugin import (
    LeanrlChatHarness,
    LeanrlChatHarnessConfig,
    LeanrlEnv,
    LeanrlEnvConfig,
    LeanrlInfraError,
    LeanrlTask,
    LeanrlTaskData,
    LeanrlTaskset,
    LeanrlTasksetConfig,
)

# Exactly one Taskset, one Harness and one Env subclass (verifiers refuses two of any): the
# harness and the env make leanrl's one-turn chat, on the local host, the taskset's default.
__all__ = [
    "LeanrlChatHarness",
    "LeanrlChatHarnessConfig",
    "LeanrlEnv",
    "LeanrlEnvConfig",
    "LeanrlInfraError",
    "LeanrlTask",
    "LeanrlTaskData",
    "LeanrlTaskset",
    "LeanrlTasksetConfig",
]
