"""Moved to :mod:`leanrl.train.es.fanout`; this old path re-exports it."""

from leanrl.train.es.fanout import *  # noqa: F403
from leanrl.train.es.fanout import __all__ as __all__
