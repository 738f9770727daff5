"""Workbench: experiment management for deep RL on robots.

Data flow: ``conf/*.yaml`` --Hydra compose--> :func:`workbench.config.load_config`
--> :func:`workbench.training.trainer.train` (envs + SB3 PPO + callbacks) --> an MLflow run
(params, per-iteration metrics, artifacts).
"""

__version__ = "0.1.0"
