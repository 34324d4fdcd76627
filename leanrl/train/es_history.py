"""Moved to :mod:`leanrl.train.es.history`; this old path re-exports it."""

from leanrl.train.es.history import *  # noqa: F403
from leanrl.train.es.history import __all__ as __all__
