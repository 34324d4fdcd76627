"""Moved to :mod:`leanrl.train.sft.expert_iteration`; this old path re-exports it."""

from leanrl.train.sft.expert_iteration import *  # noqa: F403
from leanrl.train.sft.expert_iteration import __all__ as __all__
