"""Moved to :mod:`leanrl.train.es.workers`; this old path re-exports it."""

from leanrl.train.es.workers import *  # noqa: F403
from leanrl.train.es.workers import __all__ as __all__
