"""Environments: gymnasium MuJoCo tasks and the workbench's robots behind SB3's VecEnv."""

from workbench.envs.vector import *  # noqa: F403  (the public API of the envs layer)
