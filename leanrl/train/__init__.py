"""Trainers: GRPO and evolution strategies, on any leanrl Environment, sharing one run folder."""

from leanrl.train.common import MetricsLogger, RunDir, TrainConfig, batch_for_step

__all__ = ["MetricsLogger", "RunDir", "TrainConfig", "batch_for_step"]
