"""What a task's episode return can be set against: the most it returns by definition, and
the figures rl-baselines3-zoo publishes.

A return means little alone: 95 is a pendulum that falls after ~95 of 1000 steps, 3,000 a
Hopper that hops. :func:`task_reference` gives the scale a command prints beside a return
(``workbench eval``, ``workbench promote``): the task's maximum where its rewards are bounded
(:data:`RETURN_BOUNDS`), else the zoo's published PPO return (:data:`PUBLISHED_PPO`). The
report's normalized scores (:mod:`workbench.review.references`) and ``workbench tune``'s
target check read the same tables.
"""

from __future__ import annotations

from dataclasses import dataclass

# The most a task returns per step by definition (reward bounded above), for the target check;
# tasks not listed (locomotion: forward velocity) have no such bound. id -> (per step, bonus).
RETURN_BOUNDS: dict[str, tuple[float, float]] = {
    "InvertedPendulum-v5": (1.0, 0.0),  # +1 per step the pole stays up
    "InvertedDoublePendulum-v5": (10.0, 0.0),  # alive bonus 10 minus penalties
    "CartPole-v1": (1.0, 0.0),
    "Pendulum-v1": (0.0, 0.0),  # a cost: -(angle^2 + ...) <= 0
    "Acrobot-v1": (0.0, 0.0),  # -1 per step until the goal
    "MountainCar-v0": (0.0, 0.0),  # -1 per step until the goal
    "MountainCarContinuous-v0": (0.0, 100.0),  # +100 at the goal minus action costs
    "Reacher-v5": (0.0, 0.0),  # distance and control costs
}

# env name (conf/env/<name>.yaml, the runs' ``env`` tag) -> published PPO return at 1M steps
PUBLISHED_PPO: dict[str, float] = {
    "halfcheetah": 5819.0,
    "hopper": 2410.0,
    "walker2d": 3479.0,
    "ant": 1327.0,
    "swimmer": 282.0,
}
# ... and its spread (std over its evaluation) where the benchmarks hold a default to it
PUBLISHED_PPO_STD: dict[str, float] = {"halfcheetah": 664.0, "hopper": 10.0}
PUBLISHED_SOURCE = "rl-baselines3-zoo's published PPO return at 1M steps (benchmark.md)"


def return_bound(env_id: str, max_episode_steps: int | None) -> tuple[float, str] | None:
    """The most one episode of ``env_id`` can return by the task's definition, with the
    reason, or None (``max_episode_steps`` None: the registered time limit)."""
    if env_id not in RETURN_BOUNDS:
        return None
    per_step, bonus = RETURN_BOUNDS[env_id]
    if per_step == 0:
        return bonus, (f"its rewards are costs, plus at most {bonus:g} at the goal" if bonus
                       else "every reward is a cost <= 0")
    steps = max_episode_steps or registered_episode_steps(env_id)
    if steps is None:
        return None
    return per_step * steps + bonus, f"at most {per_step:g} per step x {steps} steps"


def registered_episode_steps(env_id: str) -> int | None:
    """The time limit gymnasium registers for ``env_id``."""
    import gymnasium

    try:
        return gymnasium.spec(env_id).max_episode_steps
    except gymnasium.error.Error:
        return None


@dataclass(frozen=True)
class TaskReference:
    """A return to set a task's returns against, and what it is."""

    value: float
    source: str  # "the maximum: at most 1 per step x 1000 steps", "rl-baselines3-zoo's ..."

    def text(self, mean: float) -> str:
        """``95.0 of 1,000 (the maximum: ...)``: a return beside the reference."""
        return f"{mean:,.1f} of {self.value:,.0f} ({self.source})"


def task_reference(env_name: str, env_id: str, max_episode_steps: int | None
                   ) -> TaskReference | None:
    """The task's maximum return where its rewards are bounded above and it is above 0, else
    rl-baselines3-zoo's published PPO return for the task, else None."""
    bound = return_bound(env_id, max_episode_steps)
    if bound is not None and bound[0] > 0:
        return TaskReference(bound[0], f"the maximum: {bound[1]}")
    if env_name in PUBLISHED_PPO:
        return TaskReference(PUBLISHED_PPO[env_name], PUBLISHED_SOURCE)
    return None
