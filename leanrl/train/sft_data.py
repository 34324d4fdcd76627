"""Moved to :mod:`leanrl.train.sft.data`; this old path re-exports it."""

from leanrl.train.sft.data import *  # noqa: F403
from leanrl.train.sft.data import __all__ as __all__
