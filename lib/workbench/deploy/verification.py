"""``workbench deploy verify``: the exported policy's runner against the simulator, in real time.

    workbench deploy verify --run RUN_ID [--episodes N] [--allow-module MODULE]...

Before a policy drives a robot, the robot's side of the deployment is rehearsed with MuJoCo in
the robot's place. The standalone runner (:mod:`workbench.deploy.runner`, the ``runner.py``
``workbench export`` wrote) runs as a separate process and connects to this process over a
local TCP socket, exactly as it would to a robot's driver; this process is the driver, with
the simulator on its side. First the contract inside the run's ``policy.onnx`` is checked
against the one the run and its env give now (:func:`workbench.deploy.contract.mismatch`),
and the robot description against the one the run trained on (its manifest); a difference is
one line naming the field. Then three stages, each with a fresh runner process:

1. *static*: the export's logged observations (``samples.npz``) in, the actions out compared
   with the logged ones (SB3's, within the export's parity tolerance);
2. *single step*: a fresh simulator's first observation in, the action compared with the
   training policy's and applied for one control step, the next observation checked against
   the contract;
3. *continuous*: closed-loop episodes in real time, the runner pacing the loop at the
   contract's control rate; the return set next to the run's final evaluation and the
   training policy's on the same seeds, the action statistics compared, and the runner's
   maximum latency after warm-up held against the control period.

The runner is always this workbench's own file, started with ``python -I``; a run's stored
``runner.py`` is compared with it byte for byte, never executed (a store is data). The runner
process is stopped on every way out: a failure, Ctrl-C, the end.
"""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from workbench.config import ConfigError
from workbench.config.robustness import RobustnessProfile
from workbench.console import printable
from workbench.deploy import contract, export, hub, robustness, runner
from workbench.deploy.robustness import EvalPolicy
from workbench.envs.spec import EnvSpec
from workbench.envs.vector import make_env
from workbench.training.model import PolicySource

DEFAULT_EPISODES = 3
VERIFY_SEED = 0  # the continuous stage's seed for robustness.gymnasium_episodes
SINGLE_STEP_SEED = 50_000  # reset seed of the single-step stage, apart from every other
START_TIMEOUT_S = 60.0  # a runner connects once numpy and onnxruntime are imported
REPLY_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0
EXPORT_FILES = ("policy.onnx", "samples.npz", contract.RUNNER_FILE, export.REPORT_NAME)


class VerificationFailed(Exception):
    """A verification that cannot pass: one line naming what (the CLI exits 1)."""


class RunnerFailed(VerificationFailed):
    """The runner stopped with its own line (a violated contract, a crash)."""


# --------------------------------------------------------------------------- the runner process


@dataclass(frozen=True)
class RunnerCommand:
    """How to start the runner: the interpreter and its flags, the runner file, its
    environment (None: this process's) and runner flags added to every start (``--record
    FILE``)."""

    runner: Path
    python: tuple[str, ...] = (sys.executable, "-I")
    env: Mapping[str, str] | None = None
    flags: tuple[str, ...] = ()


class RunnerProcess:
    """A runner in its own process, connected to this one as to a robot's driver.

    Use it as a context manager: the process is started and its connection accepted on
    entry, and it is stopped on exit whatever happened (terminated, then killed).
    """

    def __init__(self, command: RunnerCommand, policy: Path, *, paced: bool,
                 warmup: int = runner.DEFAULT_WARMUP) -> None:
        self.command, self.policy, self.paced, self.warmup = command, policy, paced, warmup
        self.process: subprocess.Popen[bytes] | None = None
        self.connection: runner.Connection | None = None
        self.hello: dict[str, Any] = {}

    def __enter__(self) -> RunnerProcess:
        listener = socket.create_server(("127.0.0.1", 0))
        self.stderr = tempfile.TemporaryFile()
        try:
            listener.settimeout(0.2)
            port = listener.getsockname()[1]
            argv = [*self.command.python, str(self.command.runner), str(self.policy),
                    "--connect", f"127.0.0.1:{port}", "--warmup", str(self.warmup),
                    *([] if self.paced else ["--unpaced"]), *self.command.flags]
            self.process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.stderr,
                env=None if self.command.env is None else dict(self.command.env))
            sock = self.accept(listener)
            sock.settimeout(REPLY_TIMEOUT_S)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.connection = runner.Connection(sock)
            self.hello = self.receive()
        except BaseException:
            self.close()
            raise
        finally:
            listener.close()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def accept(self, listener: socket.socket) -> socket.socket:
        """The runner's connection, or the line it stopped with."""
        assert self.process is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                return listener.accept()[0]
            except TimeoutError:
                if self.process.poll() is not None:
                    raise RunnerFailed(self.error_line()) from None
        raise RunnerFailed(f"the runner did not connect within {START_TIMEOUT_S:g} s")

    def receive(self) -> dict[str, Any]:
        assert self.connection is not None
        try:
            message = self.connection.receive()
        except (OSError, runner.ObservationError) as exc:
            raise RunnerFailed(f"the runner's connection failed: {exc}") from exc
        if message is None:
            raise RunnerFailed(self.error_line())
        if "error" in message:
            raise RunnerFailed(f"runner: {printable(str(message['error']))}")
        return message

    def send(self, message: dict[str, Any]) -> None:
        assert self.connection is not None
        try:
            self.connection.send(message)
        except OSError as exc:
            raise RunnerFailed(self.error_line()) from exc

    def act(self, obs: np.ndarray) -> np.ndarray:
        """The runner's action for one observation (as a driver sends it: a list)."""
        self.send({"obs": np.asarray(obs, dtype=np.float64).tolist()})
        return np.asarray(self.receive()["action"], dtype=np.float32)

    def stop(self) -> dict[str, Any]:
        """End the session: the runner's timing summary, once the runner exited cleanly."""
        assert self.process is not None
        self.send({"stop": True})
        timing: dict[str, Any] = self.receive()["timing"]
        try:
            code = self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise RunnerFailed("the runner did not exit after stop") from None
        if code != 0:
            raise RunnerFailed(self.error_line())
        return timing

    def error_line(self) -> str:
        """What the runner said on its way out (its last stderr line) and its exit code."""
        assert self.process is not None
        try:
            code = self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return "the runner stopped answering"
        self.stderr.seek(0)
        lines = [line for line in self.stderr.read().decode(errors="replace").splitlines()
                 if line.strip()]
        said = printable(lines[-1]) if lines else "nothing on stderr"
        return f"{said} (runner exit code {code})"

    def close(self) -> None:
        """Close the connection and stop the process: terminate, then kill."""
        if self.connection is not None:
            self.connection.close()
            self.connection = None
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.stderr.close()


# --------------------------------------------------------------------------- the stages


@dataclass
class Stage:
    """One stage's verdict, its line and the runner's timing summary."""

    name: str
    passed: bool
    line: str
    timing: dict[str, Any] | None = None


def run_stage(name: str, work: Any) -> Stage:
    """``work()`` -> Stage; a runner that stopped fails the stage with its line."""
    try:
        result: Stage = work()
    except RunnerFailed as exc:
        return Stage(name, False, str(exc))
    return result


def static_stage(command: RunnerCommand, policy: Path, observations: np.ndarray,
                 logged: np.ndarray) -> Stage:
    """The export's logged observations in, the actions compared with the logged ones."""
    with RunnerProcess(command, policy, paced=False) as process:
        actions = np.stack([process.act(obs) for obs in observations])
        timing = process.stop()
    diff = float(np.max(np.abs(actions - logged)))
    passed = diff <= export.PARITY_TOLERANCE
    return Stage("static", passed, f"{len(observations)} logged observations (samples.npz) in: "
                 f"max |action - logged action| {diff:.1e} (tolerance "
                 f"{export.PARITY_TOLERANCE:.0e})", timing)


def single_step_stage(command: RunnerCommand, policy: Path, source: PolicySource,
                      checked: runner.Contract) -> Stage:
    """A fresh simulator's first observation in; the action against the training policy's,
    applied for one control step; the next observation against the contract."""
    env = make_env(EnvSpec.from_config(source.config))
    try:
        obs, _ = env.reset(seed=SINGLE_STEP_SEED)
        with RunnerProcess(command, policy, paced=True) as process:
            started = time.perf_counter()
            action = process.act(np.asarray(obs, dtype=np.float32))
            round_trip = time.perf_counter() - started
            timing = process.stop()
        expected = source.deterministic_actions(np.asarray(obs, dtype=np.float32)[None])[0]
        next_obs, _, _, _, _ = env.step(action)
    finally:
        env.close()
    diff = float(np.max(np.abs(action - expected)))
    try:
        runner.check_observation(checked, np.asarray(next_obs, dtype=np.float64).tolist())
        fits = "the next observation fits the contract"
    except runner.ObservationError as exc:
        return Stage("single step", False, f"after one step: {exc}", timing)
    period = checked.period_s
    budget = f" of the {period * 1e3:g} ms period" if period else ""
    return Stage("single step", diff <= export.PARITY_TOLERANCE,
                 f"reset(seed={SINGLE_STEP_SEED}) in: action within {diff:.1e} of the training "
                 f"policy's, inside the clip; one control step later {fits}; round trip "
                 f"{round_trip * 1e3:.2f} ms{budget}", timing)


def continuous_stage(command: RunnerCommand, policy: Path, source: PolicySource,
                     checked: runner.Contract, episodes: int) -> Stage:
    """Closed-loop episodes in real time through the runner, next to the training policy
    on the same seeds (:func:`workbench.deploy.robustness.export_check`) and the run's final
    evaluation; the runner's maximum latency against the period."""
    profile = RobustnessProfile(seeds=[VERIFY_SEED], episodes=episodes)
    nominal = robustness.nominal_values(source.config)
    clock: list[float] = []
    with RunnerProcess(command, policy, paced=True) as process:
        def act(obs: np.ndarray) -> np.ndarray:
            clock.append(time.perf_counter())
            return process.act(obs[0])[None]

        evaluated = EvalPolicy(config=source.config, actor=act, origin="runner",
                               source=source,
                               logged_eval=(source.eval_mean_reward, source.eval_std_reward))
        check = robustness.export_check(evaluated, profile, nominal)
        timing = process.stop()
    assert check is not None
    period, latency = checked.period_s, timing["latency_ms"]["max"]
    in_time = period is None or latency <= period * 1e3
    consistent = check["consistent_with_training_log"] is not False
    simulated = len(clock) * (period or 0.0)
    line = (f"{episodes} episodes closed-loop in real time ({len(clock)} steps: "
            f"{simulated:.2f} s simulated in {clock[-1] - clock[0] + (period or 0):.2f} s): "
            f"return {check['exported_return']:.2f}")
    if check["logged_eval_mean"] is not None:
        line += (f" vs the run's final evaluation {check['logged_eval_mean']:.2f} "
                 f"({'consistent' if consistent else 'INCONSISTENT'})")
    line += (f"; training policy {check['training_return']:.2f}, action mean/std gaps "
             f"{check['action_mean_max_gap']:.1e}/{check['action_std_max_gap']:.1e} "
             f"({'same behaviour' if check['same_behaviour'] else 'DIFFERENT behaviour'})")
    if period is not None:
        line += (f"; latency max {latency:.3f} ms {'within' if in_time else 'OVER'} the "
                 f"{period * 1e3:g} ms period")
    return Stage("continuous", bool(check["same_behaviour"]) and consistent and in_time, line,
                 timing)


# --------------------------------------------------------------------------- one verification


@dataclass
class Verification:
    """What ``workbench deploy verify`` found."""

    run_id: str
    env_id: str
    contract: dict[str, Any]
    robot_line: str
    stages: list[Stage] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.stages) and all(stage.passed for stage in self.stages)


def download_export(client: Any, run_id: str, folder: Path) -> Path:
    """The run's exported files this verification reads; bad input (exit 2) when the run
    has no export with a contract."""
    listed = {a.path.rsplit("/", 1)[-1] for a in client.list_artifacts(run_id,
                                                                       export.ARTIFACT_DIR)}
    if "policy.onnx" not in listed:
        raise ConfigError(f"run {run_id}: has no exported model (export/policy.onnx); export "
                          f"it first: workbench export --run {run_id}")
    missing = [name for name in EXPORT_FILES if name not in listed]
    if missing:
        raise ConfigError(f"run {run_id}: its export has no {missing[0]} (exported before "
                          f"contracts and runners); export it again: workbench export --run "
                          f"{run_id}")
    folder.mkdir(parents=True)
    for name in EXPORT_FILES:
        path = Path(client.download_artifacts(run_id, f"{export.ARTIFACT_DIR}/{name}",
                                              str(folder / "artifacts")))
        path.replace(folder / name)
    return folder


def read_report(path: Path, run_id: str) -> dict[str, Any]:
    """The export's report (a stored file: data), as a JSON object."""
    try:
        report = json.loads(path.read_text())
    except (ValueError, OSError) as exc:
        raise ConfigError(f"run {run_id}: export/{path.name} is not readable JSON ({exc}); "
                          f"export it again: workbench export --run {run_id}") from exc
    if not isinstance(report, dict):
        raise ConfigError(f"run {run_id}: export/{path.name} does not hold a JSON object")
    return report


def trained_robot(client: Any, run_id: str, work: Path) -> str | None:
    """The robot description's hash the run trained on (its manifest's ``inputs.robot``)."""
    manifest = hub.run_manifest(client, run_id, work)
    inputs = (manifest or {}).get("inputs") or {}
    robot = inputs.get("robot") if isinstance(inputs, Mapping) else None
    return robot.get("sha256") if isinstance(robot, Mapping) else None


def contract_problem(found: Mapping[str, Any], expected: Mapping[str, Any],
                     trained_sha256: str | None) -> str | None:
    """Why ``found`` cannot drive the run's robot: the first field that differs from the
    run's and its env's contract, or a robot description changed since training."""
    difference = contract.mismatch(found, expected)
    if difference is not None:
        return f"contract field {difference}"
    robot = expected.get("robot")
    if trained_sha256 is not None and robot is not None and robot["sha256"] != trained_sha256:
        return (f"contract field robot.sha256: the env loads {robot['sha256'][:16]} now, the "
                f"run trained on {trained_sha256[:16]} (its manifest): the robot description "
                "changed since training")
    return None


def expected_contract(source: PolicySource, found: Mapping[str, Any]) -> dict[str, Any]:
    """The contract the run and its env give now, for the checkpoint ``found`` names."""
    origin = found["source"]
    provenance = contract.Provenance(origin=source.origin, run_id=origin["run_id"],
                                     checkpoint_step=origin["checkpoint_step"],
                                     checkpoint=origin["checkpoint"])
    return contract.build_contract(source, provenance, found["versions"])


def checkpoint_of(report: Mapping[str, Any]) -> str | None:
    """The ``--checkpoint`` that reproduces the export's choice (None: the final policy)."""
    chosen = report.get("checkpoint")
    if not isinstance(chosen, Mapping) or chosen.get("choice", "final") == "final":
        return None
    step = chosen.get("step")  # a step the contract's source names too (compared below)
    return str(step) if isinstance(step, int) and not isinstance(step, bool) else None


def verify_run(run_id: str, *, episodes: int = DEFAULT_EPISODES,
               allowed_modules: Sequence[str] = (), tracking_uri: str | None = None,
               command: RunnerCommand | None = None) -> Verification:
    """Verify run ``run_id``'s export (see the module docstring); writes nothing anywhere.

    Raises :class:`ConfigError` for bad input (exit 2) and :class:`VerificationFailed` for
    a contract that does not fit (exit 1); a failing stage is in the result.
    """
    client = export.open_store(tracking_uri)
    export.get_run(client, run_id)
    command = command or RunnerCommand(Path(runner.__file__))
    with tempfile.TemporaryDirectory(prefix="workbench-verify-") as tmp:
        work = Path(tmp)
        folder = download_export(client, run_id, work / "download")
        checked = contract.read_contract(folder / "policy.onnx", f"run {run_id} export/"
                                         "policy.onnx")
        report = read_report(folder / export.REPORT_NAME, run_id)
        if (folder / contract.RUNNER_FILE).read_bytes() != command.runner.read_bytes():
            raise VerificationFailed(
                f"runner.py: the run's export/runner.py differs from this workbench's runner "
                f"(another version wrote it, or it was edited); export again to verify what "
                f"ships: workbench export --run {run_id}")
        source = export.load_run(client, run_id, work / "model", allowed_modules,
                                 checkpoint_of(report))
        expected = expected_contract(source, checked.raw)
        trained = trained_robot(client, run_id, work / "manifest")
        problem = contract_problem(checked.raw, expected, trained)
        if problem is not None:
            raise VerificationFailed(problem)
        robot = checked.raw["robot"]
        result = Verification(run_id, source.config.env.id, checked.raw, robot_line(
            robot, trained))
        samples = np.load(folder / "samples.npz", allow_pickle=False)
        policy = folder / "policy.onnx"
        result.stages = [
            run_stage("static", lambda: static_stage(command, policy, samples["observations"],
                                                     samples["actions"])),
            run_stage("single step", lambda: single_step_stage(command, policy, source,
                                                               checked)),
            run_stage("continuous", lambda: continuous_stage(command, policy, source, checked,
                                                             episodes)),
        ]
    return result


def robot_line(robot: Mapping[str, Any] | None, trained: str | None) -> str:
    if robot is None:
        return "no robot description (not a MuJoCo env)"
    as_trained = ("as trained (the run's manifest)" if trained is not None
                  else "the run's manifest records none to compare")
    return f"{robot['model']} sha256 {robot['sha256'][:16]}: {as_trained}"


# --------------------------------------------------------------------------- the promotion gate


@dataclass(frozen=True)
class DeploymentCheck:
    """What ``workbench promote`` checks of an export besides its parity: why it cannot go on
    the robot (None: it can), and the figures for the model version's tags."""

    problem: str | None
    tags: dict[str, str]


def deployment_check(client: Any, run_id: str, report: Mapping[str, Any],
                     source: PolicySource) -> DeploymentCheck:
    """The export's contract against the run, its env and the robot it trained on, and the
    export's measured maximum ONNX Runtime latency after warm-up against the contract's
    control period."""
    found = report["contract"]
    with tempfile.TemporaryDirectory(prefix="workbench-deployment-") as tmp:
        trained = trained_robot(client, run_id, Path(tmp))
    problem = (contract_problem(found, expected_contract(source, found), trained)
               or latency_problem(report["latency"], found))
    return DeploymentCheck(problem, deployment_tags(report["latency"], found))


def onnx_latency(latency: Mapping[str, Any]) -> Mapping[str, float]:
    """ONNX Runtime's end-to-end figures (ms) of an export report's latency section: the
    path ``runner.py`` takes, numpy observation to numpy action."""
    figures: Mapping[str, float] = latency["backends"]["onnxruntime"]["end_to_end_ms"]
    return figures


def latency_problem(latency: Mapping[str, Any], found: Mapping[str, Any]) -> str | None:
    """Why the measured maximum latency after warm-up does not fit the control period."""
    period = found["control"]["period_s"]
    worst = onnx_latency(latency)["max"]
    if period is None or worst <= period * 1e3:
        return None
    return (f"latency: ONNX Runtime's maximum {worst:.3f} ms (over {latency['calls']} calls "
            f"after {latency['warmup']} warm-up calls) exceeds the {period * 1e3:g} ms control "
            f"period ({found['control']['rate_hz']:g} Hz)")


def deployment_tags(latency: Mapping[str, Any], found: Mapping[str, Any]) -> dict[str, str]:
    """The contract's identity and the measured latency against the period, as tags."""
    figures, control, robot = onnx_latency(latency), found["control"], found["robot"]
    tags = {
        "contract.format": found["format"],
        "contract.observation_size": str(found["observation"]["size"]),
        "contract.action_size": str(found["action"]["size"]),
        "contract.robot_sha256": robot["sha256"] if robot else "",
        "contract.normalization_sha256": found["normalization"]["sha256"] or "",
        "latency.onnxruntime_p50_ms": f"{figures['p50']:.4g}",
        "latency.onnxruntime_p99_ms": f"{figures['p99']:.4g}",
        "latency.onnxruntime_max_ms": f"{figures['max']:.4g}",
        "latency.warmup_calls": str(latency["warmup"]),
    }
    if control["period_s"] is not None:
        tags["contract.control_hz"] = f"{control['rate_hz']:g}"
        tags["latency.period_ms"] = f"{control['period_s'] * 1e3:g}"
    return tags


# --------------------------------------------------------------------------- presentation


def format_verification(result: Verification) -> str:
    """The verdict per stage, then the runner's latency against the period."""
    raw = result.contract
    period = raw["control"]["period_s"]
    lines = [
        f"Sim-in-the-loop verification of run {result.run_id} ({result.env_id})",
        "=" * 78,
        f"{'runner':<14}runner.py (this workbench's, identical to the run's) in its own "
        "process, over a 127.0.0.1 socket",
        f"{'contract':<14}matches the run and its env: {contract.summary_line(raw)}",
        f"{'robot':<14}{result.robot_line}",
        *[f"{stage.name:<14}{'PASS' if stage.passed else 'FAIL'}  {stage.line}"
          for stage in result.stages],
        "-" * 78,
        *latency_table(result.stages, period),
        "=" * 78,
        f"verification {'PASS' if result.passed else 'FAIL'}: "
        f"{sum(s.passed for s in result.stages)} of {len(result.stages)} stages pass",
    ]
    return "\n".join(lines)


def latency_table(stages: Sequence[Stage], period_s: float | None) -> list[str]:
    """One row per stage: the runner's steps, first call, latency p50/p99/max and cycle max
    after warm-up, and overruns of the period (paced stages)."""
    rate = (f"period {period_s * 1e3:g} ms ({1 / period_s:g} Hz)" if period_s
            else "no control period")
    lines = [f"runner latency (ms) after {runner.DEFAULT_WARMUP} warm-up calls, 1 ONNX Runtime "
             f"thread; {rate}",
             f"{'stage':<14}{'steps':>6}{'first':>9}{'p50':>9}{'p99':>9}{'max':>9}"
             f"{'cycle max':>11}{'overruns':>10}"]
    for stage in stages:
        t = stage.timing
        if t is None:
            lines.append(f"{stage.name:<14}{'(the runner stopped: no timing)':>63}")
            continue
        latency, cycle = t["latency_ms"], t["cycle_ms"]
        lines.append(f"{stage.name:<14}{t['steps']:>6}{t['first_call_ms']:>9.3f}"
                     f"{ms(latency['p50'])}{ms(latency['p99'])}{ms(latency['max'])}"
                     f"{ms(cycle['max'], 11)}"
                     f"{(str(t['overruns']) if t['paced'] else 'unpaced'):>10}")
    return lines


def ms(value: float | None, width: int = 9) -> str:
    return f"{'-':>{width}}" if value is None or not math.isfinite(value) else \
        f"{value:>{width}.3f}"


def verify_command(run_id: str, episodes: int, allowed_modules: Sequence[str]) -> int:
    """Verify and print; 0 when every stage passes, 1 otherwise (one line on stderr)."""
    try:
        result = verify_run(run_id, episodes=episodes, allowed_modules=allowed_modules)
    except VerificationFailed as exc:
        print(f"workbench: verification failed: {exc}", file=sys.stderr)
        return 1
    print(format_verification(result))
    if not result.passed:
        failing = ", ".join(s.name for s in result.stages if not s.passed)
        print(f"workbench: verification failed: {failing} (see above)", file=sys.stderr)
        return 1
    return 0
