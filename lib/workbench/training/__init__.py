"""Training: ``train(cfg)``, the one path from a validated config to a recorded run."""

from workbench.training.trainer import TrainResult, train

__all__ = ["TrainResult", "train"]
