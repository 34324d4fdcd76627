"""The exception tree. Every error leanrl raises on purpose derives from :class:`LeanrlError`.

A bad *proof* is never an exception (it is a :class:`~leanrl.Verdict`); these are for bad input,
bad configuration and missing infrastructure, and each message says how to fix the problem.

::

    LeanrlError
    ├── ConfigError          bad config values, unknown ids, files that do not exist
    ├── DatasetError         a taskset could not be loaded, or a row is malformed
    ├── LeanNotFoundError    no Lean toolchain / project / REPL where one is needed
    ├── PolicyError          the model could not be loaded or did not answer
    └── RuntimeUnavailable   a runtime could not start (Docker, Modal, service unreachable)
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "DatasetError",
    "LeanNotFoundError",
    "LeanrlError",
    "PolicyError",
    "RuntimeUnavailable",
]


class LeanrlError(Exception):
    """Base class of every error leanrl raises on purpose."""


class ConfigError(LeanrlError, ValueError):
    """A configuration value, id or path is wrong. The message says which and how to fix it."""


class DatasetError(LeanrlError, ValueError):
    """A taskset could not be loaded, or one of its rows is malformed (file, row and field)."""


class LeanNotFoundError(LeanrlError, FileNotFoundError):
    """Lean, lake, the REPL or a Lean project is missing where one is needed."""


class PolicyError(LeanrlError, RuntimeError):
    """The model could not be loaded, or its server did not answer."""


class RuntimeUnavailable(LeanrlError, RuntimeError):
    """A runtime could not start or lost its backend (Docker, Modal, the verification service)."""
