"""Run an exported policy at its contract's control rate: the standalone runner.

``workbench export`` writes this file as ``runner.py`` next to ``policy.onnx``. It needs
Python 3.10+, ``numpy`` and ``onnxruntime``, nothing else: no torch, no MuJoCo, no workbench.

    python runner.py policy.onnx --show-contract          # what the policy expects, as a table
    python runner.py policy.onnx --connect HOST:PORT      # serve a robot's driver at the rate

The contract (:data:`CONTRACT_KEY` in the ONNX file's ``metadata_props``, JSON, format
:data:`CONTRACT_FORMAT`) says what every observation and action entry is, the normalization
inside the graph, the control rate, the robot description's hash and where the policy came
from. It is read as data: parsed, checked field by field, never executed.

With ``--connect`` the runner connects to the driver (a robot's, or ``workbench deploy
verify``'s simulator) and speaks newline-delimited JSON objects over TCP:

- runner -> driver, once: ``{"runner": PROTOCOL, "contract": FORMAT, "observation_size": n,
  "action_size": m, "period_s": p, "paced": true, "first_call_ms": t}``;
- driver -> runner: ``{"obs": [n numbers]}``; runner -> driver: ``{"action": [m numbers],
  "step": k}``, or ``{"error": "one line"}`` before it exits;
- driver -> runner: ``{"stop": true}``; runner -> driver: ``{"timing": {...}}``, then it exits.

Every observation is checked against the contract (its length, every value finite, each entry
within its declared range) and every action against the declared clip; a violation is one line
naming the entry, sent to the driver and printed, and the runner stops. Paced (the default),
step k's action goes out no earlier than ``k`` periods after the first observation: the loop
runs at the contract's rate and sleeps the rest of each period. Each step is timed: *latency*
from the observation's arrival to the action sent (checks, inference, encoding), *cycle* from
the step's tick to the action sent; an *overrun* is a cycle longer than the period. The timing
summary (p50, p99, max after ``--warmup`` untimed calls, the first call apart, overruns) goes
to the driver at the end, and with ``--record FILE`` every step's times into FILE.

Exit codes: 0 a session that ended with ``stop``; 2 bad input (a contract that cannot be read,
an observation that breaks it, a bad argument), one line, nothing written; 1 anything else (an
action outside the declared clip, the driver gone); 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

CONTRACT_KEY = "workbench.contract"  # the ONNX metadata_props key holding the contract
CONTRACT_NAME = "workbench-policy-contract"
CONTRACT_VERSION = 1
CONTRACT_FORMAT = f"{CONTRACT_NAME}/{CONTRACT_VERSION}"
PROTOCOL = "workbench-policy-runner/1"
INPUT_NAME = "obs"  # the graph's input
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
DEFAULT_WARMUP = 20
MAX_LINE_BYTES = 1 << 20  # one message
MAX_ENTRIES = 100_000  # observation or action elements a contract may declare
CONNECT_TIMEOUT_S = 10.0


class ContractError(ValueError):
    """A contract that cannot be read or used: one line naming the field (exit code 2)."""


class ObservationError(ValueError):
    """An observation that breaks the contract: one line naming the entry (exit code 2)."""


class ActionError(RuntimeError):
    """An action outside the contract's clip: the graph and its contract disagree (exit 1)."""


# --------------------------------------------------------------------------- the contract


@dataclass(frozen=True)
class Contract:
    """A checked contract: the raw JSON object and what the runner uses of it."""

    raw: dict[str, Any]
    observation_names: tuple[str, ...]  # one per observation element
    observation_low: np.ndarray  # float64 per element, -inf where not bounded
    observation_high: np.ndarray
    action_names: tuple[str, ...]
    action_low: np.ndarray
    action_high: np.ndarray
    period_s: float | None

    @property
    def observation_size(self) -> int:
        return len(self.observation_names)

    @property
    def action_size(self) -> int:
        return len(self.action_names)


NUMBER = (int, float)


def need(value: Any, where: str, types: tuple[type, ...], nullable: bool = False) -> Any:
    """``value`` checked to be one of ``types`` (bool is no number here); numbers finite."""
    if value is None and nullable:
        return None
    if isinstance(value, bool) != (bool in types) or not isinstance(value, types):
        names = "/".join(t.__name__ for t in types) + (" or null" if nullable else "")
        raise ContractError(f"{where}: expected {names}, got {short(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ContractError(f"{where}: {value} is not a finite number")
    return value


def short(value: Any) -> str:
    """A JSON value in a few characters, for a message."""
    if isinstance(value, list) and len(value) <= 4 and not any(
            isinstance(v, dict | list) for v in value):
        return json.dumps(value)[:60]
    if isinstance(value, dict | list):
        return f"{'an object' if isinstance(value, dict) else 'a list'} of {len(value)}"
    return json.dumps(value)[:60]


def keys(obj: Any, where: str, required: Sequence[str]) -> dict[str, Any]:
    """A JSON object with exactly ``required`` keys."""
    need(obj, where, (dict,))
    missing = [k for k in required if k not in obj]
    unknown = sorted(set(obj) - set(required))
    if missing or unknown:
        what = f"missing {missing[0]!r}" if missing else f"unknown key {unknown[0]!r}"
        raise ContractError(f"{where}: {what}")
    return dict(obj)


def no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_contract(text: str) -> Contract:
    """The contract JSON, checked: the format version first, then every field's type and
    the sections against each other (entries cover the observation, names unique, the
    normalization's hash, the period against the rate)."""
    try:
        raw = json.loads(text, parse_constant=no_constants)
    except (ValueError, RecursionError) as exc:
        raise ContractError(f"metadata {CONTRACT_KEY} is not valid JSON ({exc}); export the "
                            "policy again with `workbench export`") from exc
    need(raw, "contract", (dict,))
    check_format(raw.get("format"))
    raw = keys(raw, "contract", ("format", "env_id", "observation", "action", "commands",
                                 "normalization", "control", "robot", "source", "versions"))
    need(raw["env_id"], "env_id", (str,))
    names, low, high = observation_section(raw["observation"])
    action_names, action_low, action_high = action_section(raw["action"])
    commands = need(raw["commands"], "commands", (list,))
    for i, command in enumerate(commands):
        if need(command, f"commands[{i}]", (str,)) not in {e["name"] for e in
                                                          raw["observation"]["entries"]}:
            raise ContractError(f"commands[{i}]: {command!r} is not an observation entry")
    check_normalization(raw["normalization"], len(names))
    period = control_section(raw["control"])
    robot = need(raw["robot"], "robot", (dict,), nullable=True)
    if robot is not None:
        keys(robot, "robot", ("model", "sha256"))
        need(robot["model"], "robot.model", (str,))
        need(robot["sha256"], "robot.sha256", (str,))
    source = keys(raw["source"], "source", ("run_id", "checkpoint_step", "checkpoint",
                                            "origin"))
    for key, types in (("run_id", (str,)), ("checkpoint_step", (int,)), ("checkpoint", (str,)),
                       ("origin", (str,))):
        need(source[key], f"source.{key}", types, nullable=key != "origin")
    versions = need(raw["versions"], "versions", (dict,))
    for name, version in versions.items():
        need(version, f"versions.{name}", (str,))
    return Contract(raw, names, low, high, action_names, action_low, action_high, period)


def check_format(value: Any) -> None:
    """``workbench-policy-contract/<version>``: this runner reads version 1."""
    if not isinstance(value, str) or not value.startswith(CONTRACT_NAME + "/"):
        raise ContractError(f"format: {short(value)} is not a {CONTRACT_NAME} format")
    version = value.removeprefix(CONTRACT_NAME + "/")
    if not version.isdigit():
        raise ContractError(f"format: {value!r} has no version number")
    if int(version) > CONTRACT_VERSION:
        raise ContractError(f"format: {value} is newer than this reader's {CONTRACT_FORMAT}; "
                            "use the runner.py exported with the policy, or update the "
                            "workbench")
    if int(version) != CONTRACT_VERSION:
        raise ContractError(f"format: {value} is not {CONTRACT_FORMAT}; export the policy "
                            "again with `workbench export`")


def observation_section(obj: Any) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
    """Observation entries laid end to end over ``size`` elements: per-element names and
    bounds."""
    section = keys(obj, "observation", ("size", "entries"))
    size = need(section["size"], "observation.size", (int,))
    entries = need(section["entries"], "observation.entries", (list,))
    if not 0 < size <= MAX_ENTRIES:
        raise ContractError(f"observation.size: {size} is out of range (1..{MAX_ENTRIES})")
    names: list[str] = []
    low = np.full(size, -np.inf)
    high = np.full(size, np.inf)
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        where = f"observation.entries[{i}]"
        entry = keys(entry, where, ("name", "index", "unit", "low", "high"))
        name = unique(need(entry["name"], f"{where}.name", (str,)), seen, where)
        need(entry["unit"], f"{where}.unit", (str,), nullable=True)
        index = need(entry["index"], f"{where}.index", (list,))
        if (len(index) != 2 or not all(isinstance(k, int) and not isinstance(k, bool)
                                       for k in index) or index[0] != len(names)
                or not index[0] < index[1] <= size):
            raise ContractError(f"{where}.index: {short(index)} does not continue the entries "
                                f"before it ([{len(names)}, stop] with stop <= {size})")
        start, stop = index
        names += [name] if stop - start == 1 else [f"{name}[{k}]" for k in range(stop - start)]
        bounds = [need(entry[k], f"{where}.{k}", NUMBER, nullable=True) for k in ("low", "high")]
        if None not in bounds and bounds[0] > bounds[1]:
            raise ContractError(f"{where}: low {bounds[0]} is above high {bounds[1]}")
        low[start:stop] = -np.inf if bounds[0] is None else bounds[0]
        high[start:stop] = np.inf if bounds[1] is None else bounds[1]
    if len(names) != size:
        raise ContractError(f"observation.size: {size}, but the entries cover {len(names)}")
    return tuple(names), low, high


def action_section(obj: Any) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
    """Action entries, one per element in index order: names and clip."""
    section = keys(obj, "action", ("size", "entries"))
    size = need(section["size"], "action.size", (int,))
    entries = need(section["entries"], "action.entries", (list,))
    if not 0 < size <= MAX_ENTRIES or len(entries) != size:
        raise ContractError(f"action.size: {size}, but there are {len(entries)} entries")
    names: list[str] = []
    clip = np.zeros((2, size))
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        where = f"action.entries[{i}]"
        entry = keys(entry, where, ("name", "index", "unit", "scale", "offset", "low", "high"))
        names.append(unique(need(entry["name"], f"{where}.name", (str,)), seen, where))
        if need(entry["index"], f"{where}.index", (int,)) != i:
            raise ContractError(f"{where}.index: {entry['index']}, expected {i} (entries in "
                                "action order)")
        need(entry["unit"], f"{where}.unit", (str,), nullable=True)
        for key in ("scale", "offset"):
            need(entry[key], f"{where}.{key}", NUMBER)
        clip[:, i] = [need(entry[k], f"{where}.{k}", NUMBER) for k in ("low", "high")]
        if clip[0, i] > clip[1, i]:
            raise ContractError(f"{where}: low {clip[0, i]} is above high {clip[1, i]}")
    return tuple(names), clip[0], clip[1]


def unique(name: str, seen: set[str], where: str) -> str:
    if name in seen:
        raise ContractError(f"{where}.name: {name!r} names two entries")
    seen.add(name)
    return name


def normalization_sha256(stats: dict[str, Any]) -> str:
    """The hash of the normalization statistics: SHA-256 of their canonical JSON (keys
    sorted, no spaces) with ``clip``, ``epsilon``, ``mean`` and ``var``."""
    canonical = {k: stats[k] for k in ("clip", "epsilon", "mean", "var")}
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def check_normalization(obj: Any, size: int) -> None:
    """``{"in_graph": false, ...nulls}`` or the statistics the graph applies, with their
    hash."""
    section = keys(obj, "normalization", ("in_graph", "clip", "epsilon", "mean", "var",
                                          "sha256"))
    if not need(section["in_graph"], "normalization.in_graph", (bool,)):
        for key in ("clip", "epsilon", "mean", "var", "sha256"):
            if section[key] is not None:
                raise ContractError(f"normalization.{key}: must be null without "
                                    "normalization in the graph")
        return
    for key in ("clip", "epsilon"):
        need(section[key], f"normalization.{key}", NUMBER)
    for key in ("mean", "var"):
        values = need(section[key], f"normalization.{key}", (list,))
        if len(values) != size:
            raise ContractError(f"normalization.{key}: {len(values)} values for {size} "
                                "observation values")
        for k, value in enumerate(values):
            need(value, f"normalization.{key}[{k}]", NUMBER)
    if need(section["sha256"], "normalization.sha256", (str,)) != normalization_sha256(section):
        raise ContractError("normalization.sha256: does not match the statistics it hashes")


def control_section(obj: Any) -> float | None:
    """The control rate and period (consistent with each other), frame skip, timestep."""
    section = keys(obj, "control", ("rate_hz", "period_s", "frame_skip", "timestep_s"))
    rate = need(section["rate_hz"], "control.rate_hz", NUMBER, nullable=True)
    period = need(section["period_s"], "control.period_s", NUMBER, nullable=True)
    need(section["frame_skip"], "control.frame_skip", (int,), nullable=True)
    need(section["timestep_s"], "control.timestep_s", NUMBER, nullable=True)
    if (rate is None) != (period is None) or (period is not None and (
            period <= 0 or not math.isclose(rate * period, 1.0, rel_tol=1e-9))):
        raise ContractError(f"control.period_s: {period} is not 1 / rate_hz ({rate})")
    return None if period is None else float(period)


# --------------------------------------------------------------------------- checks


def check_observation(contract: Contract, values: Any) -> np.ndarray:
    """An observation as float64, checked: a list of exactly the contract's number of
    finite numbers, each within its entry's declared range."""
    size = contract.observation_size
    if not isinstance(values, list) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        raise ObservationError(f"observation: expected a list of {size} numbers, got "
                               f"{short(values)}")
    obs = np.asarray(values, dtype=np.float64)
    if len(obs) != size:
        raise ObservationError(f"observation: {len(obs)} values, the contract declares {size} "
                               f"({contract.observation_names[0]} ... "
                               f"{contract.observation_names[-1]}); send exactly those")
    bad = np.flatnonzero(~np.isfinite(obs))
    if len(bad):
        i = int(bad[0])
        raise ObservationError(f"observation[{i}] ({contract.observation_names[i]}): "
                               f"{obs[i]} is not a finite number")
    outside = np.flatnonzero((obs < contract.observation_low) | (obs > contract.observation_high))
    if len(outside):
        i = int(outside[0])
        raise ObservationError(
            f"observation[{i}] ({contract.observation_names[i]}): {obs[i]:.6g} is outside its "
            f"declared range [{contract.observation_low[i]:g}, "
            f"{contract.observation_high[i]:g}]")
    return obs


def check_action(contract: Contract, action: np.ndarray) -> np.ndarray:
    """The policy's action, checked to be finite and within every entry's declared clip."""
    outside = np.flatnonzero(~np.isfinite(action) | (action < contract.action_low)
                             | (action > contract.action_high))
    if len(outside):
        i = int(outside[0])
        raise ActionError(
            f"action[{i}] ({contract.action_names[i]}): {action[i]:.6g} is outside the declared "
            f"clip [{contract.action_low[i]:g}, {contract.action_high[i]:g}]: the graph and its "
            "contract disagree; do not drive a robot with this policy")
    return action


# --------------------------------------------------------------------------- the policy


@dataclass
class Policy:
    """An ONNX Runtime session with its checked contract."""

    session: Any
    contract: Contract

    def act(self, obs: np.ndarray) -> np.ndarray:
        """The action for one checked observation, checked against the clip."""
        out = self.session.run(None, {INPUT_NAME: obs.astype(np.float32)[None]})[0][0]
        return check_action(self.contract, np.asarray(out, dtype=np.float64))


def load_policy(path: Path, threads: int = 1) -> Policy:
    """``policy.onnx`` in ONNX Runtime (``threads`` for its operators) with its contract,
    checked against the graph's input and output sizes."""
    import onnxruntime as ort

    if not path.is_file():
        raise ContractError(f"{path}: no such file; give the policy.onnx `workbench export` "
                            "wrote")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = threads
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime's own error types; the file is not a usable graph
        first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise ContractError(f"{path.name}: not a policy ONNX Runtime can load ({first})"
                            ) from exc
    text = session.get_modelmeta().custom_metadata_map.get(CONTRACT_KEY)
    if text is None:
        raise ContractError(f"{path.name}: no contract in its metadata ({CONTRACT_KEY}); "
                            "export the policy again with `workbench export`")
    contract = parse_contract(text)
    check_graph(session, contract)
    return Policy(session, contract)


def check_graph(session: Any, contract: Contract) -> None:
    """The graph takes ``obs`` of the contract's observation size and gives its action size."""
    inputs, outputs = session.get_inputs(), session.get_outputs()
    sizes = {"observation.size": (inputs[0].shape[-1] if inputs else None,
                                  contract.observation_size),
             "action.size": (outputs[0].shape[-1] if outputs else None, contract.action_size)}
    if not inputs or inputs[0].name != INPUT_NAME:
        raise ContractError(f"the graph's input is not {INPUT_NAME!r}")
    for field_name, (graph, declared) in sizes.items():
        if graph != declared:
            raise ContractError(f"{field_name}: the contract declares {declared}, the graph "
                                f"has {graph}")


def read_contract(path: Path) -> Contract:
    """The checked contract of an exported ``policy.onnx``."""
    return load_policy(path).contract


# --------------------------------------------------------------------------- timing


def percentiles(values_s: Sequence[float]) -> dict[str, float | None]:
    """p50, p99 and max of times in seconds, in milliseconds (None without samples)."""
    if not values_s:
        return {"p50": None, "p99": None, "max": None}
    ms = np.asarray(values_s) * 1e3
    return {"p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99)),
            "max": float(np.max(ms))}


@dataclass
class Timing:
    """Every step's latency and cycle, in seconds, and the warm-up before them."""

    period_s: float | None
    paced: bool
    warmup: int
    first_call_s: float
    latency_s: list[float] = field(default_factory=list)
    cycle_s: list[float] = field(default_factory=list)

    def add(self, latency: float, cycle: float) -> None:
        self.latency_s.append(latency)
        self.cycle_s.append(cycle)

    @property
    def overruns(self) -> int:
        """Steps whose action went out more than one period after their tick."""
        if self.period_s is None:
            return 0
        return sum(cycle > self.period_s for cycle in self.cycle_s)

    def summary(self) -> dict[str, Any]:
        return {
            "steps": len(self.latency_s), "paced": self.paced, "warmup": self.warmup,
            "period_ms": None if self.period_s is None else self.period_s * 1e3,
            "first_call_ms": self.first_call_s * 1e3,
            "latency_ms": percentiles(self.latency_s), "cycle_ms": percentiles(self.cycle_s),
            "overruns": self.overruns,
        }

    def record(self) -> dict[str, Any]:
        """The summary and every step's times (``--record``)."""
        return {**self.summary(), "steps_ms": [
            {"latency": lat * 1e3, "cycle": cyc * 1e3}
            for lat, cyc in zip(self.latency_s, self.cycle_s, strict=True)]}


def warm_up(policy: Policy, calls: int) -> float:
    """``calls`` inferences on a zero observation (the first one timed: returned, seconds)."""
    zeros = np.zeros(policy.contract.observation_size, dtype=np.float32)[None]
    started = time.perf_counter()
    policy.session.run(None, {INPUT_NAME: zeros})
    first = time.perf_counter() - started
    for _ in range(max(calls - 1, 0)):
        policy.session.run(None, {INPUT_NAME: zeros})
    return first


# --------------------------------------------------------------------------- the driver loop


class Connection:
    """Newline-delimited JSON objects over a connected socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader = sock.makefile("rb")

    def send(self, message: dict[str, Any]) -> None:
        self.sock.sendall(json.dumps(message).encode() + b"\n")

    def receive(self) -> dict[str, Any] | None:
        """The next message; None when the other side closed the connection."""
        line = self.reader.readline(MAX_LINE_BYTES + 1)
        if not line:
            return None
        if len(line) > MAX_LINE_BYTES or not line.endswith(b"\n"):
            raise ObservationError(f"message longer than {MAX_LINE_BYTES} bytes")
        try:
            message = json.loads(line, parse_constant=lambda name: float(name))
        except ValueError as exc:
            raise ObservationError(f"message is not JSON ({exc})") from exc
        if not isinstance(message, dict):
            raise ObservationError(f"message is {short(message)}, not a JSON object")
        return message

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


def serve(policy: Policy, connection: Connection, *, paced: bool, warmup: int,
          first_call_s: float, clock: Callable[[], float] = time.perf_counter) -> Timing:
    """Answer the driver's observations with actions until it says stop; paced at the
    contract's period when ``paced``. Violations raise (the caller reports them)."""
    contract = policy.contract
    period = contract.period_s if paced else None
    if paced and period is None:
        raise ContractError("control.period_s: the contract declares no control rate; run "
                            "with --unpaced")
    timing = Timing(period, paced, warmup, first_call_s)
    connection.send({"runner": PROTOCOL, "contract": contract.raw["format"],
                     "observation_size": contract.observation_size,
                     "action_size": contract.action_size, "period_s": period,
                     "paced": paced, "first_call_ms": first_call_s * 1e3})
    tick: float | None = None
    while True:
        message = connection.receive()
        received = clock()
        if message is None:
            raise ConnectionError(f"the driver closed the connection after {len(timing.cycle_s)}"
                                  " steps without a stop")
        if message.get("stop") is True:
            connection.send({"timing": timing.summary()})
            return timing
        if "obs" not in message:
            raise ObservationError("message has neither 'obs' nor 'stop'")
        tick = received if tick is None or period is None else tick
        obs = check_observation(contract, message["obs"])
        action = policy.act(obs)
        connection.send({"action": action.tolist(), "step": len(timing.cycle_s)})
        sent = clock()
        timing.add(sent - received, sent - tick)
        if period is not None:
            tick += period
            wait = tick - clock()
            if wait > 0:
                time.sleep(wait)
            else:  # late: the next tick is now, not a burst to catch up
                tick = clock()


def address(text: str) -> tuple[str, int]:
    """``HOST:PORT``."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ContractError(f"--connect {text!r}: give HOST:PORT, e.g. 127.0.0.1:5555")
    return host, int(port)


# --------------------------------------------------------------------------- the table


def contract_table(contract: Contract) -> str:
    """The contract as a console table: provenance, control, normalization, robot, then one
    row per observation entry and per action."""
    raw = contract.raw
    control, norm, robot, source = (raw["control"], raw["normalization"], raw["robot"],
                                    raw["source"])
    rate = (f"{control['rate_hz']:g} Hz (period {control['period_s'] * 1e3:g} ms)"
            if control["period_s"] is not None else "not declared")
    if control["frame_skip"] is not None and control["timestep_s"] is not None:
        rate += f", frame skip {control['frame_skip']} x {control['timestep_s'] * 1e3:g} ms"
    checkpoint = (f", checkpoint step {source['checkpoint_step']}"
                  if source["checkpoint_step"] is not None else "")
    lines = [
        f"Contract {raw['format']}: {raw['env_id']}",
        "=" * 78,
        f"{'source':<15}{source['origin']}{checkpoint}",
        f"{'control':<15}{rate}",
        f"{'normalization':<15}" + (
            f"in the graph: mean/var of {len(norm['mean'])} values, clip {norm['clip']:g}, "
            f"epsilon {norm['epsilon']:g}, sha256 {norm['sha256'][:16]}"
            if norm["in_graph"] else "none (raw observations into the actor)"),
        f"{'robot':<15}" + (f"{robot['model']} sha256 {robot['sha256'][:16]}" if robot
                            else "no robot description (not a MuJoCo env)"),
        f"{'commands':<15}{', '.join(raw['commands']) or 'none'}",
        f"{'versions':<15}" + ", ".join(f"{k} {v}" for k, v in raw["versions"].items()),
        "-" * 78,
        f"observation ({contract.observation_size} values)",
        f"  {'index':<10}{'name':<40}{'unit':<10}range",
    ]
    for entry in raw["observation"]["entries"]:
        start, stop = entry["index"]
        index = str(start) if stop - start == 1 else f"{start}-{stop - 1}"
        low = "" if entry["low"] is None else f"{entry['low']:g}"
        high = "" if entry["high"] is None else f"{entry['high']:g}"
        span = f"[{low or '-inf'}, {high or 'inf'}]" if low or high else ""
        lines.append(f"  {index:<10}{entry['name']:<40}{entry['unit'] or '':<10}{span}")
    lines += [f"action ({contract.action_size} values): command = offset + scale x action",
              f"  {'index':<10}{'name':<30}{'unit':<8}{'scale':>10}{'offset':>10}  clip"]
    for entry in raw["action"]["entries"]:
        lines.append(f"  {entry['index']:<10}{entry['name']:<30}{entry['unit'] or '':<8}"
                     f"{entry['scale']:>10.4g}{entry['offset']:>10.4g}  "
                     f"[{entry['low']:g}, {entry['high']:g}]")
    lines.append("=" * 78)
    return "\n".join(lines)


# --------------------------------------------------------------------------- command line


class BadArguments(Exception):
    """A command-line argument that is not usable: one line, exit code 2."""


class Parser(argparse.ArgumentParser):
    """argparse whose errors are :class:`BadArguments` (one line) instead of a usage block."""

    def error(self, message: str) -> Any:
        raise BadArguments(message)


def arguments() -> Parser:
    parser = Parser(
        prog="runner.py", description="Run an exported policy at its contract's control rate "
        "(needs only numpy and onnxruntime).")
    parser.add_argument("policy", type=Path, help="the exported policy.onnx")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--show-contract", action="store_true",
                      help="print the contract as a table and exit")
    what.add_argument("--connect", metavar="HOST:PORT",
                      help="serve the driver listening there (newline-delimited JSON)")
    parser.add_argument("--unpaced", action="store_true",
                        help="answer each observation at once instead of at the contract's rate")
    parser.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, metavar="N",
                        help=f"untimed inferences before serving (default {DEFAULT_WARMUP})")
    parser.add_argument("--threads", type=int, default=1, metavar="N",
                        help="ONNX Runtime threads (default 1: one observation at a time)")
    parser.add_argument("--record", type=Path, metavar="FILE",
                        help="write every step's latency and cycle (JSON) at the end")
    return parser


def run(argv: Sequence[str]) -> int:
    """The command line's work; raises the errors :func:`main` turns into exit codes."""
    args = arguments().parse_args(argv)
    if args.warmup < 1 or args.threads < 1:
        raise BadArguments("--warmup and --threads must be >= 1")
    target = address(args.connect) if args.connect else None
    if args.record is not None and not args.record.parent.is_dir():
        raise BadArguments(f"--record {args.record}: its folder does not exist")
    policy = load_policy(args.policy, args.threads)
    if args.show_contract:
        print(contract_table(policy.contract))
        return EXIT_OK
    assert target is not None
    first = warm_up(policy, args.warmup)
    try:
        sock = socket.create_connection(target, timeout=CONNECT_TIMEOUT_S)
    except OSError as exc:
        raise ConnectionError(f"cannot connect to the driver at {args.connect}: {exc}") from exc
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    connection = Connection(sock)
    try:
        try:
            timing = serve(policy, connection, paced=not args.unpaced, warmup=args.warmup,
                           first_call_s=first)
        except (ContractError, ObservationError, ActionError) as exc:
            tell(connection, str(exc))
            raise
    finally:
        connection.close()
    if args.record is not None:
        args.record.write_text(json.dumps(timing.record(), indent=1) + "\n")
    return EXIT_OK


def tell(connection: Connection, line: str) -> None:
    """The error line to the driver too, when it still listens."""
    with contextlib.suppress(OSError):
        connection.send({"error": line})


def main(argv: Sequence[str] | None = None) -> int:
    """Exit 0, 2 (bad input: one line), 1 (a failure: one line) or 130 (Ctrl-C)."""
    try:
        return run(sys.argv[1:] if argv is None else argv)
    except (ContractError, ObservationError, BadArguments) as exc:
        print(f"runner: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (ActionError, ConnectionError, OSError) as exc:
        print(f"runner: failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("runner: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
