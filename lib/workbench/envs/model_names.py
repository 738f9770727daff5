"""Names and units of a MuJoCo model's state entries, read from the model itself.

A policy's observation vector is built from arrays of the simulator's state (``qpos``,
``qvel``, per-body quantities such as ``cfrc_ext``); what each element means is in the MJCF:
which joint or body it belongs to, and the joint's type gives its unit. These functions name
every element from the compiled model (``mujoco.MjModel``), so that the contract of an
exported policy (:mod:`workbench.envs.contract`) is derived from the robot description and
never typed by hand.

Each function returns one :class:`Element` per array element, in the array's order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# mujoco.mjtJoint: free, ball, slide, hinge
FREE, BALL, SLIDE, HINGE = 0, 1, 2, 3
JOINT_TRANSMISSION = 0  # mujoco.mjtTrn.mjTRN_JOINT: an actuator that drives one joint
QPOS_PARTS = {FREE: (("x", "m"), ("y", "m"), ("z", "m"), ("qw", None), ("qx", None),
                     ("qy", None), ("qz", None)),
              BALL: (("qw", None), ("qx", None), ("qy", None), ("qz", None)),
              SLIDE: (("", "m"),), HINGE: (("", "rad"),)}
QVEL_PARTS = {FREE: (("vx", "m/s"), ("vy", "m/s"), ("vz", "m/s"), ("wx", "rad/s"),
                     ("wy", "rad/s"), ("wz", "rad/s")),
              BALL: (("wx", "rad/s"), ("wy", "rad/s"), ("wz", "rad/s")),
              SLIDE: (("", "m/s"),), HINGE: (("", "rad/s"),)}
GENERALIZED_FORCE_UNIT = {SLIDE: "N", HINGE: "N m"}
# Per-body quantities: MuJoCo's component order (spatial vectors: rotation first).
BODY_PARTS = {
    "cinert": tuple((f"i{k}", None) for k in range(10)),  # inertia in the com frame
    "cvel": (("wx", "rad/s"), ("wy", "rad/s"), ("wz", "rad/s"), ("vx", "m/s"), ("vy", "m/s"),
             ("vz", "m/s")),
    "cfrc_ext": (("tx", "N m"), ("ty", "N m"), ("tz", "N m"), ("fx", "N"), ("fy", "N"),
                 ("fz", "N")),
}


@dataclass(frozen=True)
class Element:
    """One element of a state array: its name and unit (None where it has none or is not
    known)."""

    name: str
    unit: str | None


def joint_name(model: Any, joint: int) -> str:
    """The joint's MJCF name, or ``joint<i>`` for an unnamed one."""
    return str(model.joint(joint).name) or f"joint{joint}"


def body_name(model: Any, body: int) -> str:
    """The body's MJCF name, or ``body<i>`` for an unnamed one."""
    return str(model.body(body).name) or f"body{body}"


def actuator_name(model: Any, actuator: int) -> str:
    """The actuator's MJCF name; an unnamed one is named after the joint it drives, else
    ``actuator<i>``."""
    name = str(model.actuator(actuator).name)
    if name:
        return name
    if int(model.actuator_trntype[actuator]) == JOINT_TRANSMISSION:
        return joint_name(model, int(model.actuator_trnid[actuator][0]))
    return f"actuator{actuator}"


def dotted(name: str, part: str) -> str:
    return f"{name}.{part}" if part else name


def qpos_elements(model: Any) -> list[Element]:
    """``data.qpos``: one element per generalized position, named after its joint."""
    elements: list[Element] = []
    for joint in range(model.njnt):
        name = joint_name(model, joint)
        elements += [Element(f"qpos.{dotted(name, part)}", unit)
                     for part, unit in QPOS_PARTS[int(model.jnt_type[joint])]]
    return elements


def qvel_elements(model: Any) -> list[Element]:
    """``data.qvel``: one element per degree of freedom, named after its joint."""
    return dof_elements(model, "qvel")


def dof_elements(model: Any, prefix: str, force: bool = False) -> list[Element]:
    """A per-dof array named ``prefix``: its elements named as ``qvel``'s; with ``force`` a
    generalized force (``qfrc_actuator``: N for slides, N m for hinges)."""
    elements: list[Element] = []
    for joint in range(model.njnt):
        kind = int(model.jnt_type[joint])
        name = joint_name(model, joint)
        elements += [Element(f"{prefix}.{dotted(name, part)}",
                             GENERALIZED_FORCE_UNIT.get(kind) if force else unit)
                     for part, unit in QVEL_PARTS[kind]]
    return elements


def body_elements(model: Any, quantity: str, first_body: int = 1) -> list[Element]:
    """A per-body array (``cinert``, ``cvel``, ``cfrc_ext``) from ``first_body`` on (the
    world body, 0, is usually left out of observations)."""
    parts = BODY_PARTS[quantity]
    return [Element(f"{quantity}.{body_name(model, body)}.{part}", unit)
            for body in range(first_body, model.nbody) for part, unit in parts]


def actuator_target_unit(model: Any, actuator: int) -> str | None:
    """The unit of a position actuator's target: that of the joint it drives (rad for a
    hinge, m for a slide); None for other transmissions."""
    if int(model.actuator_trntype[actuator]) != JOINT_TRANSMISSION:
        return None
    kind = int(model.jnt_type[int(model.actuator_trnid[actuator][0])])
    return QPOS_PARTS[kind][0][1] if kind in (SLIDE, HINGE) else None
