"""Quantities derived once from a validated config: rollout size, minibatches, iterations.

Computed in one place, logged as ``derived.*`` params and printed in the run's header.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.config.schema import WorkbenchConfig


@dataclass(frozen=True)
class Derived:
    """Quantities computed once from the config, logged as params and printed at start."""

    rollout_size: int  # samples per PPO update = num_envs * n_steps
    minibatches_per_epoch: int
    gradient_steps_per_iteration: int
    iterations: int  # PPO iterations needed to reach total_timesteps
    env_seeds: list[int]


def derive(cfg: WorkbenchConfig) -> Derived:
    """Compute the derived quantities of a validated config."""
    rollout = cfg.env.num_envs * cfg.algo.n_steps
    minibatches = -(-rollout // cfg.algo.batch_size)
    return Derived(
        rollout_size=rollout,
        minibatches_per_epoch=minibatches,
        gradient_steps_per_iteration=minibatches * cfg.algo.n_epochs,
        iterations=-(-cfg.total_timesteps // rollout),
        env_seeds=[cfg.seed + rank for rank in range(cfg.env.num_envs)],
    )
