"""The policy contract: derived from the env (the duck's hook, gymnasium's MuJoCo tasks from
their MJCF, indexed names otherwise), read strictly by the runner, compared field by field.

Every name is checked against the value it names: the simulator's state is read where the
name says (``qpos.<joint>`` at that joint's address) and compared with the observation.
"""

from __future__ import annotations

import json
from typing import Any

import gymnasium
import numpy as np
import pytest
from workbench.config import ConfigError
from workbench.deploy import contract, runner
from workbench.envs.contract import describe, env_contract
from workbench.envs.robot_files import robot_files
from workbench.envs.robots import MINI_DUCK_ID
from workbench.envs.robots.duck import MiniDuckEnv
from workbench.envs.spec import EnvSpec
from workbench.envs.vector import make_env

pytestmark = pytest.mark.unit


def entries(record: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """Observation entry name -> [start, stop)."""
    return {e["name"]: tuple(e["index"]) for e in record["observation"]["entries"]}


# MuJoCo's component order of the per-body arrays (spatial vectors: rotation first)
BODY_COMPONENTS = {"cvel": ["wx", "wy", "wz", "vx", "vy", "vz"],
                   "cfrc_ext": ["tx", "ty", "tz", "fx", "fy", "fz"],
                   "cinert": [f"i{k}" for k in range(10)]}


def state_value(model: Any, data: Any, name: str) -> float:
    """The simulator value a scalar entry names (``qpos.<joint>[.part]``, ``qvel.<joint>``,
    ``qfrc_actuator.<joint>``, ``<per-body array>.<body>.<component>``), read from where its
    name says."""
    kind, _, rest = name.partition(".")
    if kind in ("qpos", "qvel", "qfrc_actuator"):
        joint, _, part = rest.partition(".")
        j = model.joint(joint).id
        parts = {"qpos": ["x", "y", "z", "qw", "qx", "qy", "qz"]}.get(
            kind, ["vx", "vy", "vz", "wx", "wy", "wz"])
        offset = parts.index(part) if part else 0
        if kind == "qpos":
            return float(data.qpos[model.jnt_qposadr[j] + offset])
        return float(getattr(data, kind)[model.jnt_dofadr[j] + offset])
    body, _, part = rest.partition(".")
    # an unnamed body is named by its id (body<i>)
    b = int(body[4:]) if body.startswith("body") and body[4:].isdigit() else model.body(body).id
    return float(getattr(data, kind)[b][BODY_COMPONENTS[kind].index(part)])


@pytest.mark.parametrize("env_id", [MINI_DUCK_ID, "HalfCheetah-v5", "Ant-v5", "Humanoid-v5"])
def test_every_named_entry_is_the_value_its_name_says(env_id: str) -> None:
    env = make_env(EnvSpec(env_id, num_envs=1))
    try:
        record = describe(env, env_id).record()
        obs, _ = env.reset(seed=3)
        for _ in range(5):
            obs, *_ = env.step(env.action_space.sample() * 0 + 0.3)
        model, data = env.unwrapped.model, env.unwrapped.data
        named = entries(record)
        assert record["observation"]["size"] == len(obs) == max(s for _, s in named.values())
        checked = 0
        for name, (start, stop) in named.items():
            if name.split(".")[0] in ("qpos", "qvel", "qfrc_actuator", *BODY_COMPONENTS):
                assert stop - start == 1, name
                value = state_value(model, data, name)
                if env_id == "Ant-v5" and name.startswith("cfrc_ext."):  # clipped by the Ant
                    value = float(np.clip(value, *env.unwrapped._contact_force_range))
                assert obs[start] == pytest.approx(value, abs=1e-12), name
                checked += 1
        assert checked == {MINI_DUCK_ID: 23, "HalfCheetah-v5": 17, "Ant-v5": 105,
                           "Humanoid-v5": 348}[env_id]
        actions = [e["name"] for e in record["action"]["entries"]]
        # named in the MJCF, or (the Ant's) after the joint each drives
        assert actions == [model.actuator(i).name or model.joint(model.actuator_trnid[i][0]).name
                           for i in range(model.nu)]
        assert len(set(actions)) == model.nu
    finally:
        env.close()


def test_the_duck_declares_units_ranges_servo_scales_and_its_rate() -> None:
    env = make_env(EnvSpec(MINI_DUCK_ID, num_envs=1))
    try:
        duck = env.unwrapped
        assert isinstance(duck, MiniDuckEnv)
        record = describe(env, MINI_DUCK_ID).record()
        obs, _ = env.reset(seed=0)
        action = np.linspace(-1, 1, duck.model.nu)
        obs, *_ = env.step(action)
    finally:
        env.close()
    named = {e["name"]: e for e in record["observation"]["entries"]}
    assert named["qpos.left_knee"]["unit"] == "rad" and named["qvel.left_knee"]["unit"] == "rad/s"
    assert named["qvel.root.wx"]["unit"] == "rad/s"  # the IMU's gyro
    previous = [e for e in record["observation"]["entries"]
                if e["name"].startswith("previous_action.")]
    assert [(e["low"], e["high"]) for e in previous] == [(-1.0, 1.0)] * 8
    np.testing.assert_array_equal(obs[[e["index"][0] for e in previous]], action)
    servos = record["action"]["entries"]
    assert [e["unit"] for e in servos] == ["rad"] * 8
    low, high = duck.model.actuator_ctrlrange.T
    np.testing.assert_allclose([e["offset"] + e["scale"] * 1.0 for e in servos], high)
    np.testing.assert_allclose([e["offset"] - e["scale"] * 1.0 for e in servos], low)
    assert record["control"] == {"rate_hz": 50.0, "period_s": 0.02, "frame_skip": 5,
                                 "timestep_s": 0.004}
    assert record["commands"] == []
    robot = robot_files(EnvSpec(MINI_DUCK_ID, num_envs=1))
    assert robot is not None
    assert record["robot"] == {"model": "workbench/envs/robots/assets/mini_duck.xml",
                               "sha256": robot.sha256}


def test_tasks_without_a_structure_get_indexed_names() -> None:
    reacher = env_contract(EnvSpec("Reacher-v5", num_envs=1)).record()
    assert [e["name"] for e in reacher["observation"]["entries"]] == \
        [f"obs[{i}]" for i in range(10)]
    assert reacher["control"]["rate_hz"] == 50.0 and reacher["robot"]["model"].endswith(
        "reacher.xml")
    pendulum = env_contract(EnvSpec("Pendulum-v1", num_envs=1)).record()
    assert [e["name"] for e in pendulum["action"]["entries"]] == ["action[0]"]
    assert (pendulum["action"]["entries"][0]["low"], pendulum["action"]["entries"][0]["high"]) \
        == (-2.0, 2.0)
    assert pendulum["robot"] is None and pendulum["control"]["period_s"] == 0.05
    assert pendulum["control"]["frame_skip"] is None


class CommandedDuck(MiniDuckEnv):
    """A user's robot whose hook marks an entry as an operator's command, or gets it wrong."""

    mistake: str | None = None

    def workbench_contract(self) -> dict[str, Any]:
        declared = super().workbench_contract()
        declared["commands"] = ["previous_action.left_knee"]
        if self.mistake == "short":
            declared["observation"] = declared["observation"][:-1]
        elif self.mistake == "command":
            declared["commands"] = ["joystick.vx"]
        elif self.mistake == "actions":
            declared["action"] = declared["action"][:-1]
        return declared


@pytest.mark.parametrize(("mistake", "message"), [
    (None, None),
    ("short", "the observation entries cover 30 of the 31 observation values"),
    ("command", "command 'joystick.vx' is not an observation entry"),
    ("actions", "7 action entries for the 8 values of the action space"),
])
def test_a_robots_hook_is_checked(mistake: str | None, message: str | None) -> None:
    env = gymnasium.wrappers.TimeLimit(CommandedDuck(), 10)
    env.unwrapped.mistake = mistake
    try:
        if message is None:
            assert describe(env, "Custom/Duck-v0").commands == ("previous_action.left_knee",)
        else:
            with pytest.raises(ConfigError, match=rf"^Custom/Duck-v0: workbench_contract\(\): "
                               rf"{message}$"):
                describe(env, "Custom/Duck-v0")
    finally:
        env.close()


# --------------------------------------------------------------------------- reading, comparing


@pytest.fixture(scope="module")
def duck_contract() -> dict[str, Any]:
    """A duck contract as export builds it: the env's sections, normalization, provenance."""
    record = env_contract(EnvSpec(MINI_DUCK_ID, num_envs=1)).record()
    stats = {"in_graph": True, "clip": 10.0, "epsilon": 1e-8, "mean": [0.5] * 31,
             "var": [2.0] * 31}
    return {"format": runner.CONTRACT_FORMAT, **record,
            "normalization": {**stats, "sha256": runner.normalization_sha256(stats)},
            "source": contract.Provenance("run abc", "abc", 2048, "checkpoints/x").record(),
            "versions": {"onnxruntime": "1"}}


def parsed(raw: dict[str, Any], change: Any = None) -> runner.Contract:
    data = json.loads(json.dumps(raw))
    if change:
        change(data)
    return runner.parse_contract(json.dumps(data))


def test_a_contract_reads_back_with_every_element_named(duck_contract: dict[str, Any]) -> None:
    checked = parsed(duck_contract)
    assert checked.observation_size == 31 and checked.action_size == 8
    assert checked.observation_names[16] == "qpos.root.qw"
    assert checked.period_s == 0.02
    assert list(checked.observation_low[23:]) == [-1.0] * 8
    assert np.isinf(checked.observation_low[:23]).all()


def set_format(version: str) -> Any:
    return lambda c: c.update(format=f"workbench-policy-contract/{version}")


def shorten_observation(c: dict[str, Any]) -> None:
    c["observation"]["size"] = 30


@pytest.mark.parametrize(("change", "message"), [
    (set_format("2"), "format: workbench-policy-contract/2 is newer than this reader's "
     "workbench-policy-contract/1"),
    (set_format("0"), "format: workbench-policy-contract/0 is not workbench-policy-contract/1"),
    (lambda c: c.pop("robot"), "contract: missing 'robot'"),
    (lambda c: c.update(extra=1), "contract: unknown key 'extra'"),
    (shorten_observation, "observation.entries[30].index: [30, 31] does not continue"),
    (lambda c: c["observation"]["entries"][1].update(index=[2, 3]),
     "observation.entries[1].index: [2, 3] does not continue"),
    (lambda c: c["action"]["entries"][0].update(name="left_knee"),
     "action.entries[2].name: 'left_knee' names two entries"),
    (lambda c: c["action"]["entries"][3].update(low=True), "action.entries[3].low: expected "
     "int/float, got true"),
    (lambda c: c["normalization"]["mean"].__setitem__(4, 0.25),
     "normalization.sha256: does not match the statistics it hashes"),
    (lambda c: c["control"].update(rate_hz=60.0), "control.period_s: 0.02 is not 1 / rate_hz"),
    (lambda c: c.update(commands=["joystick"]), "commands[0]: 'joystick' is not an observation "
     "entry"),
])
def test_a_bad_contract_is_one_line_naming_the_field(
        duck_contract: dict[str, Any], change: Any, message: str) -> None:
    with pytest.raises(runner.ContractError) as raised:
        parsed(duck_contract, change)
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)


@pytest.mark.parametrize("text", ["{not json", '{"format": NaN}', "[1, 2]"])
def test_metadata_that_is_not_a_json_object_is_refused(text: str) -> None:
    with pytest.raises(runner.ContractError, match=r"^(metadata workbench.contract is not "
                       r"valid JSON|contract: expected dict)"):
        runner.parse_contract(text)


def test_observations_are_checked_for_length_finiteness_and_ranges(
        duck_contract: dict[str, Any]) -> None:
    checked = parsed(duck_contract)
    good = [0.0] * 31
    assert runner.check_observation(checked, good).shape == (31,)
    for values, message in [
        ([0.0] * 30, "observation: 30 values, the contract declares 31"),
        ([0.0] * 2 + [float("nan")] + [0.0] * 28,
         "observation[2] (qpos.left_knee): nan is not a finite number"),
        ([0.0] * 30 + [1.5], "observation[30] (previous_action.right_ankle): 1.5 is outside its "
         "declared range [-1, 1]"),
        ("31 zeros", "observation: expected a list of 31 numbers"),
    ]:
        with pytest.raises(runner.ObservationError) as raised:
            runner.check_observation(checked, values)
        assert str(raised.value).startswith(message), raised.value


def test_actions_outside_the_clip_are_refused(duck_contract: dict[str, Any]) -> None:
    checked = parsed(duck_contract)
    with pytest.raises(runner.ActionError, match=r"^action\[3\] \(left_ankle\): 1.2 is outside "
                       r"the declared clip \[-1, 1\]"):
        runner.check_action(checked, np.array([0, 0, 0, 1.2, 0, 0, 0, 0.0]))


def swap_actions(c: dict[str, Any]) -> None:
    first, second = c["action"]["entries"][:2]
    first["name"], second["name"] = second["name"], first["name"]


@pytest.mark.parametrize(("change", "field"), [
    (swap_actions, "action.entries[0].name: the contract says \"left_hip_pitch\", the run and "
     "its env say \"left_hip_roll\""),
    (lambda c: c["normalization"]["mean"].__setitem__(7, 0.0), "normalization.mean[7]"),
    (lambda c: c["robot"].update(sha256="0" * 64), "robot.sha256"),
    (lambda c: c["control"].update(rate_hz=25.0), "control.rate_hz"),
    (lambda c: c["observation"]["entries"][0].update(unit="deg"),
     "observation.entries[0].unit"),
    (lambda c: c["source"].update(run_id="other"), "source.run_id"),
])
def test_a_mismatch_names_the_first_field_that_differs(
        duck_contract: dict[str, Any], change: Any, field: str) -> None:
    assert contract.mismatch(duck_contract, duck_contract) is None
    changed = json.loads(json.dumps(duck_contract))
    change(changed)
    found = contract.mismatch(changed, duck_contract)
    assert found is not None and found.startswith(field), found
    # versions and the origin's wording may differ between machines
    other_machine = json.loads(json.dumps(duck_contract)) | {"versions": {"onnxruntime": "2"}}
    other_machine["source"]["origin"] = "run abc (elsewhere)"
    assert contract.mismatch(other_machine, duck_contract) is None
