"""Envs the tests register: importable, so worker processes can load them."""

from __future__ import annotations

import gymnasium


class ExplodingEnv(gymnasium.Env):
    """A MuJoCo-free env whose step raises after a few calls (importable for workers)."""

    observation_space = gymnasium.spaces.Box(-1.0, 1.0, shape=(3,))
    action_space = gymnasium.spaces.Box(-1.0, 1.0, shape=(1,))

    def __init__(self) -> None:
        self.calls = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        self.calls += 1
        if self.calls > 20:
            raise RuntimeError("simulator exploded at step 21")
        return self.observation_space.sample(), 0.0, False, False, {}
