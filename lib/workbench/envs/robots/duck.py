"""Mini duck: a small biped in MJCF (``assets/mini_duck.xml``) behind the Gymnasium API.

The pattern a user follows to bring their own robot: an MJCF file shipped as package data, a
``MujocoEnv`` subclass that turns normalized actions into servo targets, a dense reward made
of named, weighted components reported in ``info["reward_components"]`` (the workbench logs
each one's per-iteration mean as ``reward/<name>``), and ``check_kwargs`` so that a typo in a
reward weight fails at config composition instead of inside a running training.

Observation (31 values): joint positions (8, rad), joint velocities (8, rad/s), torso
orientation quaternion (4, w x y z), torso angular velocity in the torso frame (3, what the
IMU's gyro reads), previous action (8). Action (8, in [-1, 1]): each servo's position
target, normalized to its joint range (-1 the lower limit, 0 the middle, 1 the upper); control
runs at 50 Hz (5 physics steps of 4 ms). The middle of every range is *not* a stable pose
(the feet tilt toes-up and the duck tips backwards): standing is learned, not given, so a
short training has something to show against an untrained policy.

Episodes end (``terminated``) when the duck falls (torso below ``min_height`` or tilted
beyond ``arccos(min_upright)``) or reaches ``goal_distance`` metres forward (``is_success``);
the registered time limit truncates them at 1000 steps (20 s).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, TypeVar

import numpy as np
from gymnasium import spaces
from gymnasium.envs.mujoco import MujocoEnv
from numpy.typing import NDArray

from workbench.envs import model_names
from workbench.envs.robots import rendering

MODEL_FILE = "mini_duck.xml"
FRAME_SKIP = 5  # 5 x 4 ms physics steps: 50 Hz control, like the real robot's loop
STAND_KEYFRAME = "stand"
# The observation, in order: (state array, its slice). ``_get_obs`` concatenates these and
# ``workbench_contract`` names them, so the two cannot disagree.
OBSERVATION_LAYOUT: tuple[tuple[str, slice], ...] = (
    ("qpos", slice(7, None)),  # joint positions (the free joint's 7 left out)
    ("qvel", slice(6, None)),  # joint velocities
    ("qpos", slice(3, 7)),  # torso orientation quaternion (w x y z)
    ("qvel", slice(3, 6)),  # torso angular velocity in the torso frame: the IMU's gyro
    ("previous_action", slice(None)),  # the last action, in [-1, 1]
)


@dataclass(frozen=True)
class RewardWeights:
    """Weight of each reward component; the reward is the plain sum of the weighted terms.

    The forward term is the signed velocity, so below the cap it telescopes to the net
    distance covered: jittering back and forth earns nothing (rewarding only positive
    deltas would pay for exactly that hack). The symmetric cap (``max_speed``) keeps the
    other classic hack, throwing the body forward and falling, from paying more than
    walking at a mini duck's pace.
    """

    forward: float = 2.0  # x velocity (m/s) of the torso, signed, capped at +-max_speed
    upright: float = 0.5  # torso z-axis . world z (1 when level)
    energy: float = 0.002  # penalty on mechanical power sum |torque * joint speed| (W)
    action_rate: float = 0.01  # penalty on sum (a_t - a_{t-1})^2: smooth servo commands
    alive: float = 0.5  # bonus per step without falling
    success: float = 100.0  # one-off bonus on reaching goal_distance

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> RewardWeights:
        """Weights from a config mapping; unknown names or non-numbers raise ``ValueError``."""
        return checked_weights(cls, values)


Weights = TypeVar("Weights")


def unit_clip(action: Any) -> NDArray[np.float64]:
    """``action`` as float64, clipped to [-1, 1] (NaN stays NaN, as with ``np.clip``, which
    costs ~3 us on eight numbers where these two ufuncs cost ~1)."""
    return np.minimum(np.maximum(np.asarray(action, dtype=np.float64), -1.0), 1.0)


def checked_weights(cls: type[Weights], values: Mapping[str, Any] | None) -> Weights:
    """An instance of the weights dataclass ``cls`` from a config mapping: its fields by name,
    each a number (``ValueError`` naming the key otherwise)."""
    values = dict(values or {})
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    for key, value in values.items():
        if key not in names:
            raise ValueError(
                f"reward_weights.{key}: unknown reward component; valid: {', '.join(names)}"
            )
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"reward_weights.{key}={value!r}: must be a number")
    return cls(**{k: float(v) for k, v in values.items()})


class MiniDuckEnv(MujocoEnv):
    """Walk the mini duck forward without falling (see the module docstring)."""

    metadata = {"render_modes": ["human", "rgb_array", "depth_array"], "render_fps": 50}
    # Read by the workbench (``callbacks.reward_component_names``) to log ``reward/<name>``.
    reward_component_names = ("forward", "upright", "energy", "action_rate", "alive", "success")

    def __init__(
        self,
        reward_weights: Mapping[str, float] | None = None,
        goal_distance: float = 3.0,
        max_speed: float = 0.3,
        min_height: float = 0.12,
        min_upright: float = 0.5,
        reset_noise_scale: float = 0.02,
        frame_skip: int = FRAME_SKIP,
        render_mode: str | None = None,
        width: int = 480,
        height: int = 480,
    ) -> None:
        MiniDuckEnv.check_kwargs(  # the standing task's own (a subclass checks its own)
            {"reward_weights": reward_weights, "goal_distance": goal_distance,
             "max_speed": max_speed, "reset_noise_scale": reset_noise_scale,
             "frame_skip": frame_skip}
        )
        self.weights = RewardWeights.from_mapping(reward_weights)
        self.goal_distance = float(goal_distance)
        self.max_speed = float(max_speed)
        self.min_height = float(min_height)
        self.min_upright = float(min_upright)
        self.reset_noise_scale = float(reset_noise_scale)
        if render_mode in ("rgb_array", "depth_array"):
            rendering.prefer_offscreen_backend()
        # MujocoEnv checks render_fps against 1 / dt; with another frame_skip (a control rate
        # other than 50 Hz) the rate is set from the model once it is loaded, as gymnasium's
        # own v5 tasks do.
        self.metadata = {k: v for k, v in type(self).metadata.items() if k != "render_fps"}
        super().__init__(
            str(resources.files("workbench.envs.robots").joinpath("assets", MODEL_FILE)),
            int(frame_skip),
            observation_space=None,
            render_mode=render_mode,
            width=width,
            height=height,
            camera_name="track",
        )
        self.metadata = {**type(self).metadata, "render_fps": int(np.round(1.0 / self.dt))}
        stand = self.model.key(STAND_KEYFRAME)
        self.stand_qpos, self.stand_ctrl = stand.qpos.copy(), stand.ctrl.copy()
        low, high = self.model.actuator_ctrlrange.T
        self.ctrl_center, self.ctrl_half_range = (high + low) / 2.0, (high - low) / 2.0
        nu = self.model.nu
        # MujocoEnv sets the action space to the servos' ctrlrange; the policy acts in [-1, 1].
        self.action_space = spaces.Box(-1.0, 1.0, shape=(nu,), dtype=np.float32)
        obs_size = 2 * (self.model.nq - 7) + 4 + 3 + nu
        self.observation_space = spaces.Box(-np.inf, np.inf, shape=(obs_size,), dtype=np.float64)
        self.previous_action = np.zeros(nu)

    @staticmethod
    def check_kwargs(kwargs: Mapping[str, Any]) -> None:
        """Validate constructor keyword arguments without building the env (``ValueError``)."""
        RewardWeights.from_mapping(kwargs.get("reward_weights"))
        for key in ("goal_distance", "max_speed"):
            if key in kwargs and not float(kwargs[key]) > 0:
                raise ValueError(f"{key}={kwargs[key]}: must be > 0")
        if int(kwargs.get("frame_skip", FRAME_SKIP)) < 1:
            raise ValueError(f"frame_skip={kwargs['frame_skip']}: must be >= 1 (physics steps "
                             "per control step)")
        if float(kwargs.get("reset_noise_scale", 0.0)) < 0:
            raise ValueError(f"reset_noise_scale={kwargs['reset_noise_scale']}: must be >= 0")

    # ------------------------------------------------------------------ gymnasium API

    def step(  # type: ignore[override]  # gymnasium annotates info as dict[str, float64]
        self, action: NDArray[Any]
    ) -> tuple[NDArray[np.float64], float, bool, bool, dict[str, Any]]:
        action = unit_clip(action)
        x_before = float(self.data.qpos[0])
        self.do_simulation(self.workbench_control(action), self.frame_skip)
        x_after = float(self.data.qpos[0])

        upright = self.upright()
        fell = bool(self.data.qpos[2] < self.min_height or upright < self.min_upright)
        reached = bool(not fell and x_after >= self.goal_distance)
        components = self.reward_components(action, (x_after - x_before) / self.dt, upright,
                                            fell, reached)
        reward = sum(components.values())  # the test checks this exact sum
        self.previous_action = action
        info = {
            "reward_components": components,
            "x_position": x_after,
            "x_velocity": (x_after - x_before) / self.dt,
            "upright": upright,
            "fell": fell,
            "is_success": reached,
        }
        if self.render_mode == "human":
            self.render()
        return self._get_obs(), float(reward), fell or reached, False, info

    def reset_model(self) -> NDArray[np.float64]:
        noise = self.reset_noise_scale
        qpos = self.stand_qpos.copy()
        qpos[7:] += self.np_random.uniform(-noise, noise, size=self.model.nq - 7)
        qvel = self.np_random.uniform(-noise, noise, size=self.model.nv)
        self.data.act[:] = self.stand_ctrl  # the servos' filtered targets start at the pose
        self.set_state(qpos, qvel)
        self.previous_action = np.zeros(self.model.nu)
        return self._get_obs()

    def render(self) -> Any:
        """A frame (``rgb_array``/``depth_array``) or a window (``human``); see ``rendering``.

        A ``human`` env builds, resets and steps on a headless machine too (gymnasium's
        ``check_env`` passes): without a display there is no window, which one warning says.
        """
        if self.render_mode == "human" and not rendering.has_display():
            rendering.warn_no_display()
            return None
        return rendering.render_or_explain(lambda: super(MiniDuckEnv, self).render())

    # ------------------------------------------------------------------ model quantities

    def servo_targets(self, action: NDArray[np.float64]) -> NDArray[np.float64]:
        """Servo position targets (rad): normalized actions mapped onto the joint ranges."""
        return self.ctrl_center + self.ctrl_half_range * action

    def stand_action(self) -> NDArray[np.float64]:
        """The action whose servo targets are the standing pose (a policy that stands)."""
        return np.asarray((self.stand_ctrl - self.ctrl_center) / self.ctrl_half_range)

    def workbench_control(self, action: NDArray[Any]) -> NDArray[np.float64]:
        """The controls :meth:`step` gives MuJoCo for ``action``: clipped to [-1, 1], then
        servo targets. ``env.vec_env=batched`` (:mod:`workbench.envs.batched`) steps the
        physics of every copy ahead with it."""
        return self.servo_targets(unit_clip(action))

    def workbench_state(self) -> dict[str, Any]:
        """The previous action, the one state of the task outside MuJoCo's (for a resumed
        run: :mod:`workbench.envs.simstate`'s protocol)."""
        return {"previous_action": self.previous_action.copy()}

    def workbench_restore(self, state: dict[str, Any]) -> None:
        self.previous_action = np.array(state["previous_action"], dtype=np.float64)

    def upright(self) -> float:
        """World-z component of the torso's z axis (1 level, 0 lying on its side)."""
        _, qx, qy, _ = self.data.qpos[3:7]
        return float(1.0 - 2.0 * (qx * qx + qy * qy))

    def reward_components(
        self, action: NDArray[np.float64], x_velocity: float, upright: float, fell: bool,
        reached: bool,
    ) -> dict[str, float]:
        """The weighted reward terms of one step, keyed as ``reward_component_names``."""
        w = self.weights
        power = np.abs(self.data.actuator_force * self.data.actuator_velocity).sum()
        rate = np.square(action - self.previous_action).sum()
        return {
            "forward": w.forward * min(max(x_velocity, -self.max_speed), self.max_speed),
            "upright": w.upright * upright,
            "energy": -w.energy * float(power),
            "action_rate": -w.action_rate * float(rate),
            "alive": 0.0 if fell else w.alive,
            "success": w.success if reached else 0.0,
        }

    def _get_obs(self) -> NDArray[np.float64]:
        arrays = {"qpos": self.data.qpos, "qvel": self.data.qvel,
                  "previous_action": self.previous_action}
        return np.concatenate([arrays[name][part] for name, part in OBSERVATION_LAYOUT]
                              ).astype(np.float64)

    def workbench_contract(self) -> dict[str, Any]:
        """What each observation and action entry is, for an exported policy's contract
        (:mod:`workbench.envs.contract`): named from the MJCF's joints and actuators in the
        order of :data:`OBSERVATION_LAYOUT`; each action is a servo's position target,
        ``ctrl_center + ctrl_half_range * action`` in the unit of the joint it drives."""
        model = self.model
        actuators = [model_names.actuator_name(model, i) for i in range(model.nu)]
        elements = {
            "qpos": model_names.qpos_elements(model),
            "qvel": model_names.qvel_elements(model),
            "previous_action": [model_names.Element(f"previous_action.{name}", None)
                                for name in actuators],
        }
        observation: list[dict[str, Any]] = [
            {"name": e.name, "unit": e.unit}
            for name, part in OBSERVATION_LAYOUT for e in elements[name][part]]
        for entry in observation[-model.nu:]:  # step() clips every action to [-1, 1]
            entry.update(low=-1.0, high=1.0)
        action = [{"name": name, "unit": model_names.actuator_target_unit(model, i),
                   "scale": float(self.ctrl_half_range[i]), "offset": float(self.ctrl_center[i])}
                  for i, name in enumerate(actuators)]
        return {"observation": observation, "action": action, "commands": []}

    def _get_reset_info(self) -> dict[str, Any]:
        return {"x_position": float(self.data.qpos[0])}
