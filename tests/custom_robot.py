"""A user's own robot, as the docs describe bringing one: an importable module that registers
its gymnasium id, used as ``env.id=tests.custom_robot:Custom/Cheetah-v0`` (gymnasium imports the
module first, in the trainer and in every ``SubprocVecEnv`` worker)."""

from __future__ import annotations

import gymnasium
from gymnasium.envs.mujoco.half_cheetah_v5 import HalfCheetahEnv

ENV_ID = "Custom/Cheetah-v0"


class CustomCheetah(HalfCheetahEnv):
    """A MuJoCo robot of the user's: physics randomization applies to it."""


if ENV_ID not in gymnasium.registry:
    gymnasium.register(ENV_ID, entry_point=f"{__name__}:CustomCheetah", max_episode_steps=1000)
