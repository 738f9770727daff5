"""Mini duck walking where it is told: a velocity command in, a gait out.

The same robot as :mod:`workbench.envs.robots.duck` (its MJCF, servos, 50 Hz control and
action mapping), with a different task. Each episode samples a command, forward speed (m/s,
in the heading frame) and yaw rate (rad/s), re-sampled every ``resample_s`` seconds; the
policy sees it, and a gait clock, after the standing task's observation:

    [joint positions (8), joint velocities (8), torso quaternion (4), gyro (3),
     previous action (8), command: forward speed and yaw rate (2), gait clock: sin, cos (2)]

The reward is the sum of named, weighted terms (``info["reward_components"]``, logged as
``reward/<name>``), the usual terms of legged locomotion with a velocity command:

- ``track_speed``, ``track_yaw``: ``max(0, 1 - |error| / sigma)`` of the forward speed and of
  the yaw rate against the command: the full weight at the command, linearly less away from
  it (a kernel with a slope everywhere within sigma, so a standing duck learns which way to
  go);
- ``gait``: the clock's swing foot in the air (the right foot in the first half of a cycle,
  the left in the second; both feet down at a standstill command), so the duck steps instead
  of shuffling or sliding;
- ``lateral``: penalty on sideways speed; ``height``: penalty on the torso leaving its
  standing height (no walking on the knees); ``upright``: the torso level;
- ``energy``, ``action_rate``, ``joint_limits``: mechanical power, jerky servo commands,
  joints at the ends of their ranges; ``alive``: per step without falling.

``info["tracked"]`` holds the commanded and achieved speed and yaw rate, their errors and the
feet's contacts (logged as ``track/<name>``, the curves a run shows), and the duck's
``workbench_contract`` names the command inputs for an exported policy.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import mujoco
import numpy as np
from gymnasium import spaces
from numpy.typing import NDArray

from workbench.envs.robots.duck import MiniDuckEnv, checked_weights, unit_clip

FEET = ("left_foot", "right_foot")
# The swing leg's hip pitch, knee and ankle at the top of a step, added to the standing crouch
# (rad): the thigh forward, the foot lifted about 4 cm, the sole kept level.
SWING_STRIDE = (-0.3, 0.6, -0.3)
COMMANDS = (("command.forward_speed", "m/s"), ("command.yaw_rate", "rad/s"))


@dataclass(frozen=True)
class WalkRewardWeights:
    """Weight of each term of the walking reward (the reward is their plain sum)."""

    track_speed: float = 2.0  # max(0, 1 - |v - v_cmd| / speed_sigma), v forward in the heading
    track_yaw: float = 1.0  # max(0, 1 - |w - w_cmd| / yaw_sigma), w the yaw rate
    gait: float = 1.0  # the clock's swing foot in the air (at a standstill: both feet down)
    imitation: float = 1.0  # exp(-|q - q_ref|^2 / 0.5): joints near the clock's stepping pose
    lateral: float = 2.0  # penalty on the sideways speed squared (m/s)^2
    height: float = 50.0  # penalty on (torso height - standing height)^2 (m^2)
    upright: float = 0.3  # torso z-axis . world z
    energy: float = 0.002  # penalty per watt of mechanical power
    action_rate: float = 0.02  # penalty on sum (a_t - a_{t-1})^2
    joint_limits: float = 0.5  # penalty per joint within 5 % of an end of its range
    alive: float = 0.2  # per step without falling

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> WalkRewardWeights:
        """Weights from a config mapping; unknown names or non-numbers raise ``ValueError``."""
        return checked_weights(cls, values)


class MiniDuckWalkEnv(MiniDuckEnv):
    """Walk the mini duck at a commanded forward speed and yaw rate (module docstring)."""

    reward_component_names = tuple(  # type: ignore[assignment]  # other names than the base's
        f.name for f in dataclasses.fields(WalkRewardWeights))
    # Read by the workbench (callbacks.info_mean_callbacks) to log ``track/<name>``.
    tracked_quantities = ("command_speed", "speed", "speed_error", "command_yaw_rate",
                          "yaw_rate", "yaw_rate_error", "left_contact", "right_contact",
                          "height")

    def __init__(
        self,
        reward_weights: Mapping[str, float] | None = None,
        speed_range: Sequence[float] = (0.0, 0.3),
        yaw_rate_range: Sequence[float] = (-0.6, 0.6),
        standstill_share: float = 0.1,
        resample_s: float = 5.0,
        gait_hz: float = 1.6,
        speed_sigma: float = 0.25,
        yaw_sigma: float = 0.6,
        stand_height: float = 0.195,
        min_height: float = 0.12,
        min_upright: float = 0.5,
        reset_noise_scale: float = 0.02,
        frame_skip: int = 5,
        render_mode: str | None = None,
        width: int = 480,
        height: int = 480,
    ) -> None:
        self.check_kwargs({
            "reward_weights": reward_weights, "speed_range": speed_range,
            "yaw_rate_range": yaw_rate_range, "standstill_share": standstill_share,
            "resample_s": resample_s, "gait_hz": gait_hz, "speed_sigma": speed_sigma,
            "yaw_sigma": yaw_sigma, "stand_height": stand_height})
        self.walk_weights = WalkRewardWeights.from_mapping(reward_weights)
        self.speed_range = (float(speed_range[0]), float(speed_range[1]))
        self.yaw_rate_range = (float(yaw_rate_range[0]), float(yaw_rate_range[1]))
        self.standstill_share = float(standstill_share)
        self.resample_s = float(resample_s)
        self.gait_hz = float(gait_hz)
        self.speed_sigma = float(speed_sigma)
        self.yaw_sigma = float(yaw_sigma)
        self.stand_height = float(stand_height)
        self.command = np.zeros(2)  # forward speed (m/s), yaw rate (rad/s)
        self.elapsed = 0.0  # seconds into the episode
        self.next_resample = 0.0
        super().__init__(min_height=min_height, min_upright=min_upright,
                         reset_noise_scale=reset_noise_scale, frame_skip=frame_skip,
                         render_mode=render_mode, width=width, height=height)
        size = 2 * (self.model.nq - 7) + 4 + 3 + self.model.nu + 4  # the standing task's + 4
        self.observation_space = spaces.Box(-np.inf, np.inf, shape=(size,), dtype=np.float64)
        floor = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_GEOM, "floor")
        self.floor = int(floor)
        self.feet = [int(mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_GEOM, name))
                     for name in FEET]
        low, high = self.model.jnt_range[1:].T  # the hinge joints (the free joint's is 0)
        margin = 0.05 * (high - low)
        self.soft_low, self.soft_high = low + margin, high - margin

    @staticmethod
    def check_kwargs(kwargs: Mapping[str, Any]) -> None:
        """Validate the walking task's keyword arguments without building it (``ValueError``):
        a name it does not take, a weight, an inverted range, a value that must be positive."""
        known = set(inspect.signature(MiniDuckWalkEnv.__init__).parameters) - {"self"}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(f"{unknown[0]}: not a setting of the walking duck; valid: "
                             f"{', '.join(sorted(known))}")
        WalkRewardWeights.from_mapping(kwargs.get("reward_weights"))
        MiniDuckEnv.check_kwargs({k: v for k, v in kwargs.items()
                                  if k in ("frame_skip", "reset_noise_scale")})
        for key in ("speed_range", "yaw_rate_range"):
            if key in kwargs:
                low, high = (float(v) for v in kwargs[key])
                if low > high:
                    raise ValueError(f"{key}=[{low:g}, {high:g}]: the lower bound exceeds the "
                                     f"upper; e.g. {key}=[{high:g}, {low:g}]")
        for key in ("resample_s", "gait_hz", "speed_sigma", "yaw_sigma", "stand_height"):
            if key in kwargs and not float(kwargs[key]) > 0:
                raise ValueError(f"{key}={kwargs[key]}: must be > 0")
        share = float(kwargs.get("standstill_share", 0.0))
        if not 0 <= share <= 1:
            raise ValueError(f"standstill_share={share}: a fraction of the commands, 0..1")

    # ------------------------------------------------------------------ gymnasium API

    def step(  # type: ignore[override]  # gymnasium annotates info as dict[str, float64]
        self, action: NDArray[Any]
    ) -> tuple[NDArray[np.float64], float, bool, bool, dict[str, Any]]:
        action = unit_clip(action)
        self.do_simulation(self.workbench_control(action), self.frame_skip)
        self.elapsed += self.dt
        speed, lateral, yaw_rate = self.heading_velocity()
        upright = self.upright()
        height = float(self.data.qpos[2])
        fell = bool(height < self.min_height or upright < self.min_upright)
        contacts = self.foot_contacts()
        components = self.walk_components(action, speed, lateral, yaw_rate, upright, height,
                                          contacts, fell)
        reward = sum(components.values())
        self.previous_action = action
        command_speed, command_yaw = self.command.tolist()
        info = {
            "reward_components": components,
            "tracked": {"command_speed": command_speed, "speed": speed,
                        "speed_error": abs(speed - command_speed),
                        "command_yaw_rate": command_yaw, "yaw_rate": yaw_rate,
                        "yaw_rate_error": abs(yaw_rate - command_yaw),
                        "left_contact": float(contacts[0]), "right_contact": float(contacts[1]),
                        "height": height},
            "x_position": float(self.data.qpos[0]),
            "fell": fell,
        }
        if self.elapsed + 1e-9 >= self.next_resample:
            self.sample_command()
        if self.render_mode == "human":
            self.render()
        return self._get_obs(), float(reward), fell, False, info

    def reset_model(self) -> NDArray[np.float64]:
        self.elapsed = 0.0
        self.next_resample = 0.0
        self.sample_command()
        return super().reset_model()

    # ------------------------------------------------------------------ the task

    def sample_command(self) -> None:
        """A new command from the task's own random stream: a standstill with probability
        ``standstill_share``, else speed and yaw rate uniform in their ranges."""
        if self.np_random.uniform() < self.standstill_share:
            self.command = np.zeros(2)
        else:
            self.command = np.array([self.np_random.uniform(*self.speed_range),
                                     self.np_random.uniform(*self.yaw_rate_range)])
        self.next_resample = self.elapsed + self.resample_s

    def heading_velocity(self) -> tuple[float, float, float]:
        """Forward and sideways speed in the heading frame (m/s) and the yaw rate (rad/s)."""
        w, x, y, z = self.data.qpos[3:7].tolist()
        vx, vy, _, wx, wy, wz = self.data.qvel[:6].tolist()  # world linear, body angular
        yaw = math.atan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))
        forward = math.cos(yaw) * vx + math.sin(yaw) * vy
        sideways = -math.sin(yaw) * vx + math.cos(yaw) * vy
        # The world z row of the torso's rotation matrix, times its body-frame angular velocity.
        yaw_rate = (2 * (x * z - w * y) * wx + 2 * (y * z + w * x) * wy
                    + (1 - 2 * (x * x + y * y)) * wz)
        return forward, sideways, yaw_rate

    def foot_contacts(self) -> tuple[bool, bool]:
        """Whether each foot touches the floor: some pair of geoms in this step's contacts is
        the floor and the foot. The pairs are read as one ``(ncon, 2)`` array of ints (~7 us);
        indexing ``data.contact`` struct by struct cost ~80 us, more than the step's physics."""
        on_floor = set()
        for first, second in self.data.contact.geom.tolist():
            if first == self.floor:
                on_floor.add(second)
            elif second == self.floor:
                on_floor.add(first)
        return self.feet[0] in on_floor, self.feet[1] in on_floor

    def gait_schedule(self) -> tuple[bool, bool]:
        """The feet that should be on the ground now: both at a standstill command, else the
        left in the first half of the clock's cycle and the right in the second."""
        if self.command[0] == 0 and self.command[1] == 0:
            return True, True
        first_half = (self.elapsed * self.gait_hz) % 1.0 < 0.5
        return first_half, not first_half

    def reference_pose(self) -> NDArray[np.float64]:
        """The joints of a stepping pose at the clock's phase (a guide the ``imitation`` term
        pulls toward, not a command the servos get): the standing crouch, the swing leg's
        hip brought forward, knee lifted and ankle kept level over a half cycle; the crouch
        itself at a standstill command."""
        pose = self.stand_qpos[7:].copy()  # per leg: hip roll, hip pitch, knee, ankle
        schedule = self.gait_schedule()
        if all(schedule):
            return pose
        swing = schedule.index(False)
        lift = math.sin(math.pi * ((self.elapsed * self.gait_hz) % 0.5) * 2.0)
        pose[4 * swing + 1:4 * swing + 4] += np.array(SWING_STRIDE) * lift
        return pose

    def gait_score(self, contacts: tuple[bool, bool]) -> float:
        """1 when the feet do what the clock says: the swing foot in the air (the stance
        foot's contact is what keeps the duck up anyway), or both down at a standstill; 0
        otherwise. Standing with both feet down scores 0 while a step is due."""
        schedule = self.gait_schedule()
        if all(schedule):
            return float(all(contacts))
        swing = schedule.index(False)
        return float(not contacts[swing])

    def walk_components(self, action: NDArray[np.float64], speed: float, lateral: float,
                        yaw_rate: float, upright: float, height: float,
                        contacts: tuple[bool, bool], fell: bool) -> dict[str, float]:
        """The weighted reward terms of one step, keyed as ``reward_component_names``."""
        w = self.walk_weights
        command_speed, command_yaw = self.command.tolist()
        power = float(np.abs(self.data.actuator_force * self.data.actuator_velocity).sum())
        joints = self.data.qpos[7:]
        at_limits = np.count_nonzero((joints < self.soft_low) | (joints > self.soft_high))
        off_pose = joints - self.reference_pose()
        change = action - self.previous_action
        return {
            "track_speed": w.track_speed * max(
                0.0, 1.0 - abs(speed - command_speed) / self.speed_sigma),
            "track_yaw": w.track_yaw * max(
                0.0, 1.0 - abs(yaw_rate - command_yaw) / self.yaw_sigma),
            "gait": w.gait * self.gait_score(contacts),
            "imitation": w.imitation * math.exp(-float(off_pose @ off_pose) / 0.5),
            "lateral": -w.lateral * lateral**2,
            "height": -w.height * (height - self.stand_height) ** 2,
            "upright": w.upright * upright,
            "energy": -w.energy * power,
            "action_rate": -w.action_rate * float(change @ change),
            "joint_limits": -w.joint_limits * float(at_limits),
            "alive": 0.0 if fell else w.alive,
        }

    def _get_obs(self) -> NDArray[np.float64]:
        phase = 2 * math.pi * self.elapsed * self.gait_hz
        return np.concatenate([super()._get_obs(), self.command,
                               [math.sin(phase), math.cos(phase)]]).astype(np.float64)

    def workbench_state(self) -> dict[str, Any]:
        """The task's state outside MuJoCo's: the previous action, the command, the clock."""
        return {**super().workbench_state(), "command": self.command.tolist(),
                "elapsed": self.elapsed, "next_resample": self.next_resample}

    def workbench_restore(self, state: dict[str, Any]) -> None:
        super().workbench_restore(state)
        self.command = np.array(state["command"], dtype=np.float64)
        self.elapsed = float(state["elapsed"])
        self.next_resample = float(state["next_resample"])

    def workbench_contract(self) -> dict[str, Any]:
        """The standing task's contract with the command inputs and the clock appended."""
        contract = super().workbench_contract()
        ranges = (self.speed_range, self.yaw_rate_range)
        commands = [{"name": name, "unit": unit, "low": low, "high": high}
                    for (name, unit), (low, high) in zip(COMMANDS, ranges, strict=True)]
        clock = [{"name": "gait_clock.sin", "unit": None, "low": -1.0, "high": 1.0},
                 {"name": "gait_clock.cos", "unit": None, "low": -1.0, "high": 1.0}]
        contract["observation"] = [*contract["observation"], *commands, *clock]
        contract["commands"] = commands
        return contract
