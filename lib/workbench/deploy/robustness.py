"""``workbench eval``: a trained policy over a matrix of fixed perturbations, with verdicts.

Where does the policy break? A robustness profile (``conf/eval/<name>.yaml``,
:mod:`workbench.config.robustness`) lists perturbation factors and their values. Every value is
a *cell*: the policy drives seeded deterministic episodes in an environment with that one
factor changed (every other factor nominal); every pair of factors the profile names becomes
a grid of cells drawn as a heatmap; every backend it names runs the nominal cell on that
simulator (gymnasium vs EnvPool: sim-to-sim). Perturbations are the domain-randomization
wrappers of :mod:`workbench.envs.randomization` with ``[value, value]`` ranges, i.e. fixed
values, and ``frame_skip`` (the control frequency) is the task's own constructor argument.

The policy is what goes on the robot: the exported ONNX graph (normalization, actor,
deterministic action, clipping), built from a run's checkpoint, taken from a pulled Hub
bundle, or an exported ``.onnx``/TorchScript file. For a run the export check runs too: the
exported graph and the training policy (SB3) each drive the same seeded episode, and their
returns and action statistics are set side by side with the run's final evaluation.

A cell *holds* while its mean return is at least ``nominal - max(tolerance x |nominal|,
min_drop)``. Per
factor, a verdict line says how far from nominal the policy holds and where it fails
("friction holds from 0.7x to 1.3x (-30 % to +30 %); fails at 0.5x"). Everything is logged
to MLflow: one parent run (``workbench.kind=eval``) with the matrix, the verdicts, the
figures and the export check as artifacts, one nested run per cell, and, for a run source,
the verdict on the policy's own run (tags ``robustness.*``), where the report, the notebook
and the model card read it.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np

from workbench.config import ConfigError, RandomizationConfig, WorkbenchConfig
from workbench.config.robustness import FACTORS, PHYSICS_FACTORS, Factor, RobustnessProfile
from workbench.deploy.graph import (
    INPUT_NAME,
    deployed_policy,
    export_onnx,
    observation_dim,
    onnx_session,
)
from workbench.envs import envpool_vec, randomization
from workbench.envs.returns import TaskReference, task_reference
from workbench.envs.spec import EnvSpec
from workbench.envs.vector import make_env
from workbench.tracking.metric_keys import (
    EVAL_CELL_KIND,
    EVAL_KIND,
    ROBUSTNESS_LATEST_TAG,
    RUN_KIND_TAG,
    robustness_tag,
)
from workbench.training.model import PolicySource

EVAL_SEED_OFFSET = 40_000  # apart from training (seed + r), evaluation (+10000), export (+20000)
SEED_STRIDE = 1_000  # seed s, episode k: reset(seed=EVAL_SEED_OFFSET + s * SEED_STRIDE + k)
KIND_TAG, KIND, CELL_KIND = RUN_KIND_TAG, EVAL_KIND, EVAL_CELL_KIND
ARTIFACT_DIR = "robustness"
MAX_VERDICT_TAG = 5_000  # MLflow tag values hold 8,000 characters

Actor = Callable[[np.ndarray], np.ndarray]  # raw observation [1, obs_dim] -> action [1, act]


# --------------------------------------------------------------------------- the policy


@dataclass
class EvalPolicy:
    """A policy to evaluate: its deployable graph and the config that says which env."""

    config: WorkbenchConfig
    actor: Actor  # the exported graph (ONNX Runtime, or TorchScript for a .pt file)
    origin: str  # "run <id> (checkpoint step-N)", "bundle ORG/NAME@COMMIT", "file <path>"
    run_id: str | None = None  # the training run, when the policy comes from one
    experiment_id: str | None = None
    source: PolicySource | None = None  # the training policy (SB3), for the export check
    logged_eval: tuple[float | None, float | None] = (None, None)  # the run's final eval


def onnx_actor(path: Path) -> Actor:
    """An ONNX Runtime session as an :data:`Actor` (one thread: cells run one at a time)."""
    session = onnx_session(path, threads=1)

    def act(obs: np.ndarray) -> np.ndarray:
        return np.asarray(session.run(None, {INPUT_NAME: obs.astype(np.float32)})[0])

    return act


def torchscript_actor(path: Path) -> Actor:
    """A TorchScript file written by ``workbench export`` as an :data:`Actor`."""
    import torch

    module = torch.jit.load(str(path), map_location="cpu").eval()

    def act(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return np.asarray(module(torch.as_tensor(obs, dtype=torch.float32)).numpy())

    return act


def policy_from_source(source: PolicySource, workdir: Path, run_id: str | None = None,
                       experiment_id: str | None = None) -> EvalPolicy:
    """The ONNX graph ``workbench export`` would ship for ``source``, written to ``workdir``."""
    path = workdir / "policy.onnx"
    export_onnx(deployed_policy(source), path, observation_dim(source))
    return EvalPolicy(config=source.config, actor=onnx_actor(path), origin=source.origin,
                      run_id=run_id, experiment_id=experiment_id, source=source,
                      logged_eval=(source.eval_mean_reward, source.eval_std_reward))


def policy_from_file(path: Path, cfg: WorkbenchConfig) -> EvalPolicy:
    """An exported ``policy.onnx`` or ``policy.pt`` (TorchScript) for the task of ``cfg``."""
    actor = onnx_actor(path) if path.suffix == ".onnx" else torchscript_actor(path)
    return EvalPolicy(config=cfg, actor=actor, origin=f"file {path}")


# --------------------------------------------------------------------------- cells


@dataclass(frozen=True)
class Cell:
    """One environment setting: the factors that differ from nominal, on one backend."""

    settings: tuple[tuple[str, float], ...] = ()  # sorted (factor, value) pairs
    backend: str = "gymnasium"

    @property
    def label(self) -> str:
        parts = [f"{k}={format_value(v)}" for k, v in self.settings]
        if not parts:
            parts = ["nominal"]
        return ",".join(parts) + ("" if self.backend == "gymnasium" else f"@{self.backend}")

    def value(self, factor: str, nominal: float) -> float:
        return dict(self.settings).get(factor, nominal)


def format_value(value: float) -> str:
    """``0.5``, ``2``, ``0.05``: a factor value as written in profiles."""
    return f"{value:g}"


def make_cell(values: Mapping[str, float], nominal: Mapping[str, float],
              backend: str) -> Cell:
    """The cell of ``values``, leaving out factors at their nominal value."""
    return Cell(tuple(sorted((k, float(v)) for k, v in values.items() if v != nominal[k])),
                backend)


def plan_cells(profile: RobustnessProfile, nominal: Mapping[str, float]) -> list[Cell]:
    """Nominal first, then each factor's values alone, each pair's grid and each backend's
    nominal cell; each cell once."""
    base = profile.backend
    cells = [Cell((), base)]
    for factor, values in profile.factors.items():
        cells += [make_cell({factor: v}, nominal, base) for v in values]
    for a, b in profile.pairs:
        cells += [make_cell({a: va, b: vb}, nominal, base)
                  for va in profile.factors[a] for vb in profile.factors[b]]
    cells += [Cell((), backend) for backend in profile.backends]
    return list(dict.fromkeys(cells))


def nominal_values(cfg: WorkbenchConfig) -> dict[str, float]:
    """Every factor's nominal value for this task (``frame_skip``: the task's own)."""
    values = {name: f.nominal for name, f in FACTORS.items()}
    values["frame_skip"] = float(task_frame_skip(cfg) or 0)
    return values


def task_frame_skip(cfg: WorkbenchConfig) -> int | None:
    """The task's own ``frame_skip`` (simulator steps per control step); None: not MuJoCo."""
    env = make_env(EnvSpec.from_config(cfg))
    try:
        return getattr(env.unwrapped, "frame_skip", None)
    finally:
        env.close()


def check_applicable(profile: RobustnessProfile, cfg: WorkbenchConfig) -> None:
    """Refuse, before anything runs, what this policy's task cannot apply (one line)."""
    env_id = cfg.env.id
    physics = [f for f in profile.factors if f in PHYSICS_FACTORS]
    if profile.backend == "envpool":
        for factor in profile.factors:
            reason = ("its C++ tasks take no gymnasium wrappers" if factor != "frame_skip"
                      else envpool_vec.unsupported_reason(env_id, {"frame_skip": 1}))
            if factor != "frame_skip" or reason:
                raise ConfigError(f"factors.{factor}: cannot be applied on EnvPool ({reason}); "
                                  "evaluate factors with backend=gymnasium and compare "
                                  "simulators with backends=[gymnasium,envpool]")
    if physics and not randomization.is_mujoco_task(env_id):
        raise ConfigError(f"factors.{physics[0]}: a physics factor needs a MuJoCo task; "
                          f"env.id={env_id!r} is not a gymnasium MujocoEnv (drop "
                          f"{', '.join(physics)} from the profile)")
    if "frame_skip" in profile.factors:
        check_frame_skip(cfg, profile.factors["frame_skip"])
    for backend in {profile.backend, *profile.backends} - {"gymnasium"}:
        reason = envpool_vec.unsupported_reason(env_id, dict(cfg.env.kwargs))
        if reason:
            raise ConfigError(f"backends: {backend} cannot run this policy's task: {reason}; "
                              f"drop {backend} from the profile's backends")


def check_frame_skip(cfg: WorkbenchConfig, values: Sequence[float]) -> None:
    """``frame_skip`` needs a task that takes it as a constructor argument."""
    if task_frame_skip(cfg) is None:
        raise ConfigError(f"factors.frame_skip: env.id={cfg.env.id!r} has no frame_skip (not "
                          "a MuJoCo task); drop frame_skip from the profile")
    spec = EnvSpec.from_config(cfg)
    try:
        env = make_env(replace(spec, kwargs={**(spec.kwargs or {}),
                                             "frame_skip": int(values[0])}))
    except TypeError as exc:
        raise ConfigError(f"factors.frame_skip: env.id={cfg.env.id!r} takes no frame_skip "
                          f"argument ({exc}); drop frame_skip from the profile") from exc
    env.close()


# --------------------------------------------------------------------------- episodes


def cell_settings(cell: Cell, nominal: Mapping[str, float]) -> RandomizationConfig:
    """The randomization wrappers' settings for a cell: fixed values, as ``[v, v]`` ranges."""
    def scale(factor: str) -> list[float] | None:
        value = cell.value(factor, nominal[factor])
        return None if value == 1.0 else [value, value]

    return RandomizationConfig(
        obs_noise_std=cell.value("obs_noise", 0.0),
        action_noise_std=cell.value("action_noise", 0.0),
        action_delay=int(cell.value("action_delay", 0.0)),
        friction=scale("friction"), mass_scale=scale("mass"),
        damping=scale("damping"), actuator_gain=scale("actuator_gain"),
    )


def cell_spec(cfg: WorkbenchConfig, cell: Cell, nominal: Mapping[str, float],
              max_episode_steps: int | None) -> EnvSpec:
    """The env of a cell: the policy's task, its kwargs and the cell's ``frame_skip``."""
    spec = EnvSpec.from_config(cfg)
    kwargs = dict(spec.kwargs or {})
    frame_skip = cell.value("frame_skip", nominal["frame_skip"])
    if frame_skip != nominal["frame_skip"]:
        kwargs["frame_skip"] = int(frame_skip)
    return replace(spec, num_envs=1, kwargs=kwargs, randomization=None,
                   max_episode_steps=max_episode_steps or spec.max_episode_steps)


@dataclass
class Episodes:
    """What a policy did in one cell for one seed."""

    returns: list[float]
    lengths: list[int]
    actions: np.ndarray  # every action taken, [steps, action_dim]


def gymnasium_episodes(env: gymnasium.Env, actor: Actor, seed: int, episodes: int
                       ) -> Episodes:
    """``episodes`` episodes from ``reset(seed=...)`` seeds derived from ``seed``."""
    returns: list[float] = []
    lengths: list[int] = []
    actions: list[np.ndarray] = []
    for k in range(episodes):
        obs, _ = env.reset(seed=EVAL_SEED_OFFSET + seed * SEED_STRIDE + k)
        total, steps, done = 0.0, 0, False
        while not done:
            action = actor(np.asarray(obs, dtype=np.float32)[None])[0]
            actions.append(action)
            obs, reward, terminated, truncated, _ = env.step(action)
            total, steps, done = total + float(reward), steps + 1, terminated or truncated
        returns.append(total)
        lengths.append(steps)
    return Episodes(returns, lengths, np.asarray(actions, dtype=np.float64))


def envpool_episodes(spec: EnvSpec, actor: Actor, seed: int, episodes: int) -> Episodes:
    """The same on EnvPool's C++ task: one env seeded like the gymnasium cell's first episode,
    its episodes one after the other (EnvPool draws each reset from that seed's stream)."""
    venv = envpool_vec.EnvPoolVecEnv(spec.env_id, 1, EVAL_SEED_OFFSET + seed * SEED_STRIDE,
                                     spec.max_episode_steps, spec.kwargs)
    returns: list[float] = []
    lengths: list[int] = []
    actions: list[np.ndarray] = []
    try:
        obs = venv.reset()
        total, steps = 0.0, 0
        while len(returns) < episodes:
            action = actor(np.asarray(obs, dtype=np.float32))
            actions.append(action[0])
            obs, reward, done, _ = venv.step(action)
            total, steps = total + float(reward[0]), steps + 1
            if done[0]:
                returns.append(total)
                lengths.append(steps)
                total, steps = 0.0, 0
    finally:
        venv.close()
    return Episodes(returns, lengths, np.asarray(actions, dtype=np.float64))


def run_cell(policy: EvalPolicy, cell: Cell, profile: RobustnessProfile,
             nominal: Mapping[str, float]) -> list[Episodes]:
    """Every seed of the profile in one cell."""
    spec = cell_spec(policy.config, cell, nominal, profile.max_episode_steps)
    if cell.backend == "envpool":
        return [envpool_episodes(spec, policy.actor, s, profile.episodes)
                for s in profile.seeds]
    env = randomization.wrap(make_env(spec), cell_settings(cell, nominal))
    try:
        return [gymnasium_episodes(env, policy.actor, s, profile.episodes)
                for s in profile.seeds]
    finally:
        env.close()


# --------------------------------------------------------------------------- results


@dataclass
class CellResult:
    """A cell's returns over its seeds and whether it holds."""

    cell: Cell
    seed_returns: list[float]  # mean return per seed
    returns: list[float]  # every episode
    mean_length: float
    seconds: float
    holds: bool = True

    @property
    def mean(self) -> float:
        return float(np.mean(self.returns))

    @property
    def std(self) -> float:
        return float(np.std(self.returns))


def summarize(cell: Cell, runs: Sequence[Episodes], seconds: float) -> CellResult:
    """One :class:`CellResult` from a cell's episodes."""
    returns = [r for run in runs for r in run.returns]
    lengths = [n for run in runs for n in run.lengths]
    return CellResult(cell, [float(np.mean(run.returns)) for run in runs], returns,
                      float(np.mean(lengths)), seconds)


def threshold(nominal_return: float, tolerance: float, min_drop: float = 0.0,
              min_return: float | None = None) -> float:
    """The lowest mean return a cell may have and still hold: relative to the nominal return,
    and never below the profile's absolute floor ``min_return``."""
    relative = nominal_return - max(tolerance * abs(nominal_return), min_drop)
    return relative if min_return is None else max(relative, min_return)


@dataclass
class Matrix:
    """A finished robustness matrix."""

    profile_name: str
    profile: RobustnessProfile
    origin: str
    env_id: str
    nominal_values: dict[str, float]
    results: list[CellResult]
    control_hz: dict[str, float] = field(default_factory=dict)  # frame_skip value -> Hz
    export_check: dict[str, Any] | None = None
    reference: TaskReference | None = None  # the task's maximum or published return
    inert: dict[str, str] = field(default_factory=dict)  # factor -> why it changes nothing

    @property
    def nominal(self) -> CellResult:
        return self.results[0]

    @property
    def threshold(self) -> float:
        profile = self.profile
        return threshold(self.nominal.mean, profile.tolerance, profile.min_drop,
                         profile.min_return)

    def nominal_text(self) -> str:
        """``95.0 of 1,000 (the maximum: ...)``, or the nominal return alone."""
        mean = self.nominal.mean
        return self.reference.text(mean) if self.reference else f"{mean:,.1f}"

    @property
    def failing(self) -> list[CellResult]:
        return [r for r in self.results if not r.holds]

    @property
    def passed(self) -> bool:
        return not self.failing

    def result(self, cell: Cell) -> CellResult | None:
        return next((r for r in self.results if r.cell == cell), None)

    def factor_results(self, factor: str) -> list[tuple[float, CellResult]]:
        """(value, result) for the factor alone, nominal included, by value."""
        pairs = []
        for value in sorted({*self.profile.factors[factor], self.nominal_values[factor]}):
            cell = make_cell({factor: value}, self.nominal_values, self.profile.backend)
            found = self.result(cell)
            if found is not None:
                pairs.append((value, found))
        return pairs

    def verdicts(self) -> list[str]:
        """One line per factor and per compared backend."""
        lines = [factor_verdict(self, factor) for factor in self.profile.factors]
        for backend in self.profile.backends:
            if backend != self.profile.backend:
                lines.append(backend_verdict(self, backend))
        return lines


def mark_holding(results: Sequence[CellResult], profile: RobustnessProfile) -> None:
    """Set ``holds`` on every cell against the first (nominal) cell's mean return (and the
    profile's absolute floor, which the nominal cell must reach too)."""
    floor = threshold(results[0].mean, profile.tolerance, profile.min_drop, profile.min_return)
    for result in results:
        result.holds = bool(result.mean >= floor or math.isclose(result.mean, floor))


def value_text(factor: Factor, value: float, hz: Mapping[str, float]) -> str:
    """A value as a verdict writes it: ``0.7x``, ``2 steps``, ``std 0.05``, ``4 (125 Hz)``."""
    if factor.unit == "x":
        return f"{value:g}x"
    if factor.unit == "steps":
        return f"{value:g} step{'s' if value != 1 else ''}"
    if factor.unit == "std":
        return f"std {value:g}"
    rate = hz.get(format_value(value))
    return f"{value:g}" + (f" ({rate:.0f} Hz)" if rate else "")


def factor_verdict(matrix: Matrix, factor: str) -> str:
    """"friction holds from 0.7x to 1.3x (-30 % to +30 %); fails at 0.5x", or "friction: no
    effect on this task (...)" for a factor that cannot change its model."""
    if factor in matrix.inert:
        return f"{factor}: no effect on this task ({matrix.inert[factor]})"
    spec, nominal = FACTORS[factor], matrix.nominal_values[factor]
    results = matrix.factor_results(factor)
    values = [v for v, _ in results]
    at = values.index(nominal)
    low = high = at
    while low > 0 and results[low - 1][1].holds:
        low -= 1
    while high < len(results) - 1 and results[high + 1][1].holds:
        high += 1
    failing = [v for v, r in results if not r.holds]
    text = lambda v: value_text(spec, v, matrix.control_hz)  # noqa: E731
    if low == high:
        held = f"holds only at nominal ({text(nominal)})"
    elif low == at:
        held = f"holds to {text(values[high])}"
    elif high == at:
        held = f"holds down to {text(values[low])}"
    else:
        held = f"holds from {text(values[low])} to {text(values[high])}"
    if spec.unit == "x" and low != high:
        change = [f"{(values[i] - 1) * 100:+.0f} %" for i in (low, high) if i != at]
        held += f" ({' to '.join(change)})"
    if not failing:
        return f"{factor} {held}: every tested value holds"
    above = [v for v in failing if v > nominal]
    below = [v for v in failing if v < nominal]
    fails = []
    if below:
        fails.append(f"at {text(max(below))}" if len(below) == 1 or spec.unit != "x"
                     else f"from {text(max(below))} down")
    if above:
        fails.append(f"from {text(min(above))}")
    return f"{factor} {held}; fails {' and '.join(fails)}"


def backend_verdict(matrix: Matrix, backend: str) -> str:
    """"sim-to-sim: envpool 2,981 vs gymnasium 3,010 (-1.0 %): holds"."""
    other = matrix.result(Cell((), backend))
    base = matrix.nominal
    if other is None:
        return f"sim-to-sim: {backend} was not evaluated"
    change = (other.mean - base.mean) / abs(base.mean) * 100 if base.mean else math.nan
    return (f"sim-to-sim: {backend} {other.mean:,.1f} vs {base.cell.backend} {base.mean:,.1f} "
            f"({change:+.1f} %): {'holds' if other.holds else 'fails'}")


# --------------------------------------------------------------------------- the export check


def export_check(policy: EvalPolicy, profile: RobustnessProfile,
                 nominal: Mapping[str, float]) -> dict[str, Any] | None:
    """The exported graph and the training policy, each driving the same seeded episodes at
    nominal settings: their returns and action statistics, and the run's final evaluation."""
    if policy.source is None:
        return None
    source = policy.source
    spec = cell_spec(policy.config, Cell(), nominal, profile.max_episode_steps)
    seed, episodes = profile.seeds[0], profile.episodes

    def torch_actor(obs: np.ndarray) -> np.ndarray:
        return source.deterministic_actions(obs)

    runs = {}
    for name, actor in (("exported", policy.actor), ("training", torch_actor)):
        env = make_env(spec)
        try:
            runs[name] = gymnasium_episodes(env, actor, seed, episodes)
        finally:
            env.close()
    exported, training = runs["exported"], runs["training"]
    mean_gap = np.abs(exported.actions.mean(0) - training.actions.mean(0)).max()
    std_gap = np.abs(exported.actions.std(0) - training.actions.std(0)).max()
    logged_mean, logged_std = policy.logged_eval
    check = {
        "seed": seed,
        "episodes": episodes,
        "exported_return": float(np.mean(exported.returns)),
        "training_return": float(np.mean(training.returns)),
        "exported_action_mean": exported.actions.mean(0).tolist(),
        "exported_action_std": exported.actions.std(0).tolist(),
        "training_action_mean": training.actions.mean(0).tolist(),
        "training_action_std": training.actions.std(0).tolist(),
        "action_mean_max_gap": float(mean_gap),
        "action_std_max_gap": float(std_gap),
        "logged_eval_mean": logged_mean,
        "logged_eval_std": logged_std,
    }
    spread = max(float(np.std(exported.returns)),
                 logged_std if logged_std is not None and math.isfinite(logged_std) else 0.0)
    tolerance = max(2 * spread, 0.05 * abs(logged_mean)) if logged_mean is not None else None
    check["consistent_with_training_log"] = (
        None if logged_mean is None or tolerance is None
        else bool(abs(check["exported_return"] - logged_mean) <= tolerance))
    check["same_behaviour"] = bool(
        math.isclose(check["exported_return"], check["training_return"],
                     rel_tol=0.01, abs_tol=1e-6) and mean_gap <= 1e-3 and std_gap <= 1e-3)
    return check


def export_check_line(check: Mapping[str, Any]) -> str:
    """The export check in one line."""
    line = (f"export check: exported {check['exported_return']:,.1f} vs training policy "
            f"{check['training_return']:,.1f}, action mean/std gaps "
            f"{check['action_mean_max_gap']:.1e}/{check['action_std_max_gap']:.1e}: "
            f"{'same behaviour' if check['same_behaviour'] else 'DIFFERENT behaviour'}")
    if check["logged_eval_mean"] is not None:
        line += (f"; the run's final evaluation {check['logged_eval_mean']:,.1f} "
                 f"({'consistent' if check['consistent_with_training_log'] else 'INCONSISTENT'})")
    return line


# --------------------------------------------------------------------------- the matrix


def control_rates(cfg: WorkbenchConfig, profile: RobustnessProfile,
                  nominal: Mapping[str, float]) -> dict[str, float]:
    """frame_skip value -> control frequency (Hz) for the values the profile tries."""
    if "frame_skip" not in profile.factors:
        return {}
    env = make_env(EnvSpec.from_config(cfg))
    try:
        timestep = float(env.unwrapped.model.opt.timestep)
    finally:
        env.close()
    values = {*profile.factors["frame_skip"], nominal["frame_skip"]}
    return {format_value(v): 1.0 / (timestep * v) for v in values}


def evaluate(policy: EvalPolicy, profile_name: str, profile: RobustnessProfile,
             on_cell: Callable[[int, int, CellResult], None] | None = None) -> Matrix:
    """Run every cell (nominal first); ``on_cell(index, total, result)`` after each."""
    nominal = nominal_values(policy.config)
    cells = plan_cells(profile, nominal)
    results: list[CellResult] = []
    for index, cell in enumerate(cells):
        start = time.perf_counter()
        result = summarize(cell, run_cell(policy, cell, profile, nominal),
                           time.perf_counter() - start)
        results.append(result)
        mark_holding(results, profile)
        if on_cell is not None:
            on_cell(index, len(cells), result)
    cfg = policy.config
    return Matrix(profile_name, profile, policy.origin, cfg.env.id, nominal, results,
                  control_rates(cfg, profile, nominal), export_check(policy, profile, nominal),
                  task_reference(cfg.env.name, cfg.env.id,
                                 profile.max_episode_steps or cfg.env.max_episode_steps),
                  inert_factors(cfg, profile))


def inert_factors(cfg: WorkbenchConfig, profile: RobustnessProfile) -> dict[str, str]:
    """The profile's physics factors that cannot change this task's dynamics, with why:
    friction without any pair of geoms that can touch, damping of joints that have none, an
    actuator gain without actuators. Their cells equal the nominal one by construction."""
    if not any(f in PHYSICS_FACTORS for f in profile.factors):
        return {}
    env = make_env(EnvSpec.from_config(cfg))
    try:
        model = getattr(env.unwrapped, "model", None)
        return {} if model is None else {
            factor: why for factor in profile.factors
            if (why := inert_reason(model, factor)) is not None}
    finally:
        env.close()


def inert_reason(model: Any, factor: str) -> str | None:
    """Why scaling ``factor`` leaves the MuJoCo ``model``'s dynamics as they are, or None."""
    if factor == "friction" and not can_touch(model):
        return "no two of its geoms can touch, and friction acts only in contacts"
    if factor == "damping" and not np.any(model.dof_damping):
        return "none of its joints has damping to scale"
    if factor == "actuator_gain" and model.nu == 0:
        return "it has no actuators"
    return None


def can_touch(model: Any) -> bool:
    """Whether any two geoms of ``model`` may collide (MuJoCo's contype/conaffinity rule)
    with contacts enabled; True when in doubt (same-body pairs are not excluded)."""
    import mujoco

    if model.opt.disableflags & mujoco.mjtDisableBit.mjDSBL_CONTACT:
        return False
    if model.npair > 0:  # explicit <contact><pair> elements collide whatever the masks say
        return True
    contype, affinity = model.geom_contype, model.geom_conaffinity
    return bool(np.any((contype[:, None] & affinity[None, :]) != 0))


def progress_line(index: int, total: int, result: CellResult) -> str:
    """``[3/21] friction=0.5: 2,310.4 +- 120.3 (holds, 1.2 s)``; the first cell is nominal."""
    state = "nominal" if index == 0 else ("holds" if result.holds else "FAILS")
    return (f"[{index + 1}/{total}] {result.cell.label}: {result.mean:,.1f} +- "
            f"{result.std:,.1f} ({state}, {result.seconds:.1f} s)")


def matrix_record(matrix: Matrix) -> dict[str, Any]:
    """The matrix as JSON-ready data (``robustness.json``)."""
    return {
        "profile": matrix.profile_name,
        "policy": matrix.origin,
        "env_id": matrix.env_id,
        "seeds": list(matrix.profile.seeds),
        "episodes": matrix.profile.episodes,
        "tolerance": matrix.profile.tolerance,
        "min_drop": matrix.profile.min_drop,
        "min_return": matrix.profile.min_return,
        "nominal_return": matrix.nominal.mean,
        "reference": (None if matrix.reference is None else
                      {"return": matrix.reference.value, "source": matrix.reference.source}),
        "threshold": matrix.threshold,
        "no_effect": matrix.inert,
        "passed": matrix.passed,
        "verdicts": matrix.verdicts(),
        "nominal_values": matrix.nominal_values,
        "control_hz": matrix.control_hz,
        "cells": [{
            "cell": r.cell.label, "backend": r.cell.backend,
            "settings": dict(r.cell.settings), "mean_return": r.mean, "std_return": r.std,
            "seed_returns": r.seed_returns, "returns": r.returns,
            "mean_length": r.mean_length, "holds": r.holds, "seconds": r.seconds,
        } for r in matrix.results],
        "export_check": matrix.export_check,
    }


def matrix_markdown(matrix: Matrix, figures: Sequence[str]) -> str:
    """``robustness.md``: verdicts, the cells table and the figures."""
    lines = [f"# Robustness: {matrix.profile_name}", "",
             f"Policy: {matrix.origin} on {matrix.env_id}. Nominal return "
             f"{matrix.nominal_text()} over seeds {list(matrix.profile.seeds)} x "
             f"{matrix.profile.episodes} episodes; a cell holds at >= {matrix.threshold:,.1f} "
             f"(tolerance {matrix.profile.tolerance:g}). "
             f"{'Every cell holds.' if matrix.passed else f'{len(matrix.failing)} cell(s) fail.'}",
             "", "## Verdicts", ""]
    lines += [f"- {line}" for line in matrix.verdicts()]
    if matrix.export_check:
        lines += [f"- {export_check_line(matrix.export_check)}"]
    lines += ["", "## Cells", "", "| cell | mean return | std | per seed | holds |",
              "|---|---:|---:|---|---|"]
    for r in matrix.results:
        per_seed = ", ".join(f"{v:,.1f}" for v in r.seed_returns)
        lines.append(f"| {r.cell.label} | {r.mean:,.1f} | {r.std:,.1f} | {per_seed} | "
                     f"{'yes' if r.holds else '**no**'} |")
    lines += ["", *[f"![{name}]({name})" for name in figures]]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- MLflow


@contextmanager
def closed_on_failure(client: Any, run_ids: list[str]) -> Iterator[None]:
    """Runs opened inside end FAILED (KILLED on Ctrl-C) when the block raises: no run is
    left RUNNING by a fault."""
    try:
        yield
    except BaseException as exc:
        status = "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"
        for run_id in run_ids:
            try:
                client.set_terminated(run_id, status)
            except Exception as close_error:  # the store may be the fault
                print(f"workbench: could not close run {run_id}: {close_error}",
                      file=sys.stderr)
        raise


def log_cell(client: Any, experiment_id: str, parent_id: str, result: CellResult,
             profile_name: str) -> str:
    """One nested run for one cell (FAILED, never left RUNNING, if logging it fails)."""
    run = client.create_run(experiment_id, run_name=result.cell.label, tags={
        "mlflow.parentRunId": parent_id, KIND_TAG: CELL_KIND,
        "robustness.profile": profile_name})
    with closed_on_failure(client, [str(run.info.run_id)]):
        log_cell_values(client, str(run.info.run_id), result)
    return str(run.info.run_id)


def log_cell_values(client: Any, run_id: str, result: CellResult) -> None:
    """A cell run's settings as params and its returns as metrics; then it is FINISHED."""
    from mlflow.entities import Metric, Param, RunTag

    now = int(time.time() * 1000)
    params = [Param(k, format_value(v)) for k, v in result.cell.settings]
    params.append(Param("backend", result.cell.backend))
    metrics = [Metric("robustness/mean_return", result.mean, now, 0),
               Metric("robustness/std_return", result.std, now, 0),
               Metric("robustness/mean_length", result.mean_length, now, 0),
               Metric("robustness/holds", float(result.holds), now, 0),
               Metric("robustness/seconds", result.seconds, now, 0)]
    metrics += [Metric("robustness/seed_return", v, now, i)
                for i, v in enumerate(result.seed_returns)]
    client.log_batch(run_id, metrics=metrics, params=params,
                     tags=[RunTag("robustness.holds", str(result.holds).lower())])
    client.set_terminated(run_id, "FINISHED")


def verdict_text(matrix: Matrix) -> str:
    """The verdict lines joined for a tag, within MLflow's tag length."""
    text = "\n".join(matrix.verdicts())
    return text if len(text) <= MAX_VERDICT_TAG else text[:MAX_VERDICT_TAG - 1] + "…"


def source_tags(matrix: Matrix, eval_run_id: str) -> dict[str, str]:
    """The tags written on the policy's own run: where the report and the card read them."""
    name = matrix.profile_name
    return {robustness_tag(name, "eval_run"): eval_run_id,
            robustness_tag(name, "passed"): str(matrix.passed).lower(),
            robustness_tag(name, "verdicts"): verdict_text(matrix),
            ROBUSTNESS_LATEST_TAG: name}

