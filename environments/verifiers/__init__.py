"""verifiers (v1) tasksets as a leanrl environment: ``--env verifiers`` (docs/interop.md).

Nothing here imports verifiers until the environment is used: ``leanrl envs`` lists it on an
install without the ``verifiers`` extra, and using it then says which extra to install.
"""

from __future__ import annotations

from .env import VerifiersEnvironment, VerifiersHarness, VerifiersScorer, VerifiersTaskset

__all__ = ["VerifiersEnvironment", "VerifiersHarness", "VerifiersScorer", "VerifiersTaskset"]
