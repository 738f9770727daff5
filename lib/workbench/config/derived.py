"""Quantities derived once from a validated config: rollout size, minibatches, iterations.

For the off-policy algorithms an "iteration" is one collection of ``num_envs * train_freq``
transitions followed by ``gradient_steps`` gradient steps of ``batch_size`` transitions.

Computed in one place, logged as ``derived.*`` params and printed in the run's header.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.config.algorithms import OffPolicyConfig
from workbench.config.schema import WorkbenchConfig

# The config keys each logged ``derived.*`` param follows from (training.describe's run_params;
# derived.vec_env is env.vec_env=auto's choice, workbench.envs.calibration), so a comparison
# can say which of its differences were set and which follow from them.
DERIVED_FROM: dict[str, tuple[str, ...]] = {
    "derived.rollout_size": ("env.num_envs", "algo.n_steps", "algo.train_freq"),
    "derived.minibatches_per_epoch": ("derived.rollout_size", "algo.batch_size"),
    "derived.gradient_steps_per_iteration": ("derived.minibatches_per_epoch", "algo.n_epochs",
                                             "algo.gradient_steps"),
    "derived.iterations": ("total_timesteps", "derived.log_every_steps"),
    "derived.log_every_steps": ("derived.rollout_size", "total_timesteps"),
    "derived.env_seeds": ("seed", "env.num_envs"),
    "derived.torch_threads": ("torch_threads", "env.num_envs", "env.vec_env"),
    "derived.vec_env": ("env.vec_env", "env.num_envs", "env.id", "env.randomization"),
}


@dataclass(frozen=True)
class Derived:
    """Quantities computed once from the config, logged as params and printed at start."""

    rollout_size: int  # samples per update = num_envs * n_steps (off-policy: * train_freq)
    minibatches_per_epoch: int  # off-policy: 1 (one batch per gradient step)
    gradient_steps_per_iteration: int
    # logged iterations to reach total_timesteps: PPO/A2C's updates; off-policy, the points
    # logged every log_every_steps
    iterations: int
    env_seeds: list[int]
    log_every_steps: int  # env steps between logged points (PPO/A2C: a rollout)


def derive(cfg: WorkbenchConfig) -> Derived:
    """Compute the derived quantities of a validated config."""
    a = cfg.algo
    rollout = cfg.env.num_envs * a.steps_per_update()
    minibatches, steps = a.minibatches(rollout), a.update_steps(rollout)  # the schema's own
    log_every = rollout
    if isinstance(a, OffPolicyConfig):  # about every 1,000 steps, at least 10 points a run
        log_every = -(-max(rollout, min(1000, cfg.total_timesteps // 10)) // rollout) * rollout
    return Derived(
        rollout_size=rollout,
        minibatches_per_epoch=minibatches,
        gradient_steps_per_iteration=steps,
        iterations=-(-cfg.total_timesteps // log_every),
        env_seeds=[cfg.seed + rank for rank in range(cfg.env.num_envs)],
        log_every_steps=log_every,
    )
