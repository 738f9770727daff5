"""The typed schema behind ``conf/``: one dataclass per config group, one comment per field.

Hydra composes ``conf/config.yaml`` on top of :class:`WorkbenchConfig` (its first defaults
entry is this schema, stored as ``workbench_schema``), so every key exists with its type
before a YAML file or an override is merged in; unknown keys and wrong types fail with the
key's name (:mod:`workbench.config.compose`). :mod:`workbench.config.checks` adds the range
and cross-field checks a type cannot express.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from typing import Any

from omegaconf import OmegaConf

VEC_ENV_CHOICES = ("dummy", "subproc", "envpool", "auto")
DEVICE_CHOICES = ("auto", "cpu", "cuda")
ACTIVATION_CHOICES = ("tanh", "relu", "elu")
LR_SCHEDULE_CHOICES = ("constant", "linear")


@dataclass
class RandomizationConfig:
    """Domain randomization for any MuJoCo task (wrappers in workbench/randomization.py).

    Physics ranges are ``[low, high]`` scale factors on the model's nominal values, each
    sampled uniformly once per episode (the sampled values are in ``info["randomization"]``);
    null leaves that quantity nominal. All-default values mean no wrapper at all.
    """

    obs_noise_std: float = 0.0  # std of Gaussian noise added to observations (obs units)
    action_noise_std: float = 0.0  # std of Gaussian action noise, fraction of half the range
    action_delay: int = 0  # actions reach the simulator this many env steps late
    friction: list[float] | None = None  # [low, high] scale of every geom's sliding friction
    mass_scale: list[float] | None = None  # [low, high] scale of every body's mass and inertia
    damping: list[float] | None = None  # [low, high] scale of every joint's damping
    actuator_gain: list[float] | None = None  # [low, high] scale of every actuator's gain


@dataclass
class EnvConfig:
    """Which simulator task to train on and how its copies are vectorized."""

    name: str = "halfcheetah"  # group option this came from (conf/env/<name>.yaml)
    id: str = "HalfCheetah-v5"  # gymnasium id
    num_envs: int = 1  # parallel environment copies; per-env seed = seed + rank
    # dummy (same process) | subproc (one process per env) | envpool (C++ threads, extra
    # ``fast``) | auto (a short, cached calibration picks one; logged as derived.vec_env)
    vec_env: str = "auto"
    normalize: bool = False  # wrap in SB3's VecNormalize (running obs/return statistics)
    norm_obs: bool = True  # with normalize: normalize observations
    norm_reward: bool = True  # with normalize: scale rewards by the return's running std
    clip_obs: float = 10.0  # with normalize: clip normalized observations to +-clip_obs
    max_episode_steps: int | None = None  # None keeps the task's own time limit
    kwargs: dict[str, Any] = field(default_factory=dict)  # passed to gymnasium.make
    randomization: RandomizationConfig = field(default_factory=RandomizationConfig)  # training


@dataclass
class PolicyConfig:
    """Actor-critic network (SB3 ``policy_kwargs``)."""

    pi: list[int] = field(default_factory=lambda: [64, 64])  # actor hidden layer sizes
    vf: list[int] = field(default_factory=lambda: [64, 64])  # critic hidden layer sizes
    activation: str = "tanh"  # tanh | relu | elu
    log_std_init: float = 0.0  # initial log std of the Gaussian action distribution
    ortho_init: bool = True  # orthogonal weight initialization (SB3 default)


@dataclass
class AlgoConfig:
    """PPO hyperparameters, named as in stable-baselines3."""

    name: str = "ppo"
    n_steps: int = 2048  # steps per environment per rollout; rollout = num_envs * n_steps
    batch_size: int = 64  # minibatch size
    n_epochs: int = 10  # passes over each rollout
    learning_rate: float = 3e-4
    lr_schedule: str = "constant"  # constant | linear (decays to 0 over total_timesteps)
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_range: float = 0.2
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    target_kl: float | None = None  # stop an update's epochs early above this KL
    normalize_advantage: bool = True
    policy: PolicyConfig = field(default_factory=PolicyConfig)


@dataclass
class TrackingConfig:
    """Where runs are recorded. ``MLFLOW_TRACKING_URI`` wins over ``uri`` (MLflow's convention)."""

    uri: str | None = None  # None: embedded SQLite store experiments/mlflow.db
    experiment: str = "workbench"  # MLflow experiment name
    run_name: str | None = None  # None: derived from env, num_envs, n_steps and seed
    system_metrics: bool = True  # MLflow's built-in CPU/memory/GPU sampler
    system_metrics_interval_s: float = 10.0  # seconds between samples (MLflow's default)
    tags: dict[str, str] = field(default_factory=dict)  # extra run tags


@dataclass
class EvalConfig:
    """Deterministic evaluation on a separate environment copy."""

    every_steps: int = 0  # evaluate during training every N env steps (0: only at the end)
    n_episodes: int = 5  # episodes per evaluation during training
    final_episodes: int = 10  # episodes of the final evaluation
    # Evaluation's own randomization, independent of env.randomization (default: the nominal
    # task), so a sweep can train under one setting and measure robustness under another.
    randomization: RandomizationConfig = field(default_factory=RandomizationConfig)


@dataclass
class ConsoleConfig:
    """What training prints."""

    progress_bar: bool = True  # tqdm bar over environment steps
    iteration_lines: bool = True  # one concise summary line per PPO iteration


@dataclass
class RayConfig:
    """The Ray cluster that ``sweep.executor=ray`` submits points to."""

    address: str | None = None  # HOST:PORT of the head; None: RAY_ADDRESS, else "auto"


@dataclass
class CheckpointConfig:
    """Checkpoints in the run's artifacts (``checkpoints/step-<N>/``), for ``resume=<run_id>``."""

    every_steps: int = 50_000  # write one every N env steps (0: only at the end, on stop/failure)
    keep_last: int = 3  # newest checkpoints kept in the run's artifacts (0: keep all)


@dataclass
class SweepConfig:
    """Grid for ``workbench sweep`` (see conf/sweep/)."""

    name: str = "default"
    id: str | None = None  # None: <name>-<hash of points and overrides>; set to extend a sweep
    num_envs: list[int] = field(default_factory=lambda: [1, 2])
    n_steps: list[int] = field(default_factory=lambda: [128, 256])
    seeds: list[int] = field(default_factory=lambda: [0])
    iso_batch: int | None = None  # keep num_envs * n_steps == iso_batch (n_steps derived)
    workers: int = 2  # concurrent points
    executor: str = "local"  # local | ray
    timeout: float | None = None  # seconds per point; None: no limit
    overrides: list[str] = field(default_factory=list)  # extra overrides for every point
    ray: RayConfig = field(default_factory=RayConfig)  # with executor=ray


@dataclass
class ReproConfig:
    """Reproducibility switches; seeding itself is always on (``seed``, env rank r: seed + r)."""

    # torch.use_deterministic_algorithms (+ CUBLAS_WORKSPACE_CONFIG where CUDA is present):
    # bit-identical reruns also on GPU, at a speed cost (README "Manifest and reproducibility").
    deterministic: bool = False


@dataclass
class InitConfig:
    """Start training from a policy bundle pulled from the Hugging Face Hub (deploy/hub.py)."""

    hub_repo_id: str | None = None  # e.g. my-org/halfcheetah-ppo; None: fresh initialization
    hub_revision: str | None = None  # commit sha or tag (required with hub_repo_id); logged


@dataclass
class WorkbenchConfig:
    """The whole, resolved configuration of one training run."""

    env: EnvConfig = field(default_factory=EnvConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    console: ConsoleConfig = field(default_factory=ConsoleConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    repro: ReproConfig = field(default_factory=ReproConfig)
    init: InitConfig = field(default_factory=InitConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    experiment_name: str | None = None  # the experiment= preset this came from, if any
    total_timesteps: int = 100_000  # environment steps to train for
    seed: int = 0  # base seed: torch, numpy, and env rank r gets seed + r
    device: str = "auto"  # auto | cpu | cuda (auto: CUDA when available)
    torch_threads: int = 0  # torch intra-op threads for the learner; 0: chosen from cores
    resume: str | None = None  # MLflow run id: continue that run from its last checkpoint


def to_dict(cfg: WorkbenchConfig) -> dict[str, Any]:
    """The config as plain nested dicts (for YAML dumps and MLflow params)."""
    container = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
    assert isinstance(container, dict)
    return container  # type: ignore[return-value]


def to_yaml(cfg: WorkbenchConfig) -> str:
    """The resolved config as YAML, as stored with every run."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mapping -> ``{"a.b.c": value}``; lists stay values."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, prefix=f"{name}."))
        else:
            flat[name] = value
    return flat


def _field_type(f: Any) -> Any:
    """The dataclass type of a nested field, or None for leaves."""
    if f.default_factory is not MISSING:
        sample = f.default_factory()
        return type(sample) if is_dataclass(sample) else None
    return None


def schema_type(dotted: str) -> str | None:
    """The declared type of a schema key (e.g. ``"int"`` for ``env.num_envs``), if any."""
    node: Any = WorkbenchConfig
    declared: str | None = None
    for part in dotted.split("."):
        if not (isinstance(node, type) and is_dataclass(node)):
            return None
        by_name = {f.name: f for f in fields(node)}
        if part not in by_name:
            return None
        declared = str(by_name[part].type)
        node = _field_type(by_name[part])
    return declared
