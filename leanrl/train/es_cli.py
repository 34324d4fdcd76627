"""Moved to :mod:`leanrl.train.es.cli`; this old path re-exports it."""

from leanrl.train.es.cli import *  # noqa: F403
from leanrl.train.es.cli import __all__ as __all__
