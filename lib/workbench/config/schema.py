"""Typed configuration: the dataclass schema behind ``conf/``, Hydra composition, validation.

Config enters the workbench once, here. ``load_config(overrides)`` composes ``conf/config.yaml``
with Hydra's compose API (so it works the same from the CLI, a notebook and the tests), merges
it into the dataclass schema (unknown keys and wrong types fail with the key's name) and runs
the cross-field checks that a schema cannot express. Everything downstream receives a
validated :class:`WorkbenchConfig`.

Every failure is a :class:`ConfigError` whose message is one line naming the key, the problem
and the fix; the CLI turns it into exit code 2 before any environment or MLflow run exists.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from workbench import paths

VEC_ENV_CHOICES = ("dummy", "subproc", "envpool", "auto")
DEVICE_CHOICES = ("auto", "cpu", "cuda")
ACTIVATION_CHOICES = ("tanh", "relu", "elu")
LR_SCHEDULE_CHOICES = ("constant", "linear")
SCHEMA_NAME = "workbench_schema"
GROUPS = ("env", "algo", "tuning", "experiment", "sweep", "tracking")


def minibatch(num_envs: int, n_steps: int, minibatches: int) -> int:
    """``${minibatch:${env.num_envs},${algo.n_steps},k}``: a k-th of the rollout (at least 2).

    conf/algo/ppo.yaml sizes its minibatch this way, so overriding ``env.num_envs`` or
    ``algo.n_steps`` keeps the same number of gradient steps per update (README "Performance").
    """
    return max(2, int(num_envs) * int(n_steps) // int(minibatches))


# OmegaConf's extension point for computed values; replace=True makes re-imports harmless.
OmegaConf.register_new_resolver("minibatch", minibatch, replace=True)


class ConfigError(ValueError):
    """Bad configuration or arguments: one line naming the input, the problem and the fix."""


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
    # resolved to its commit as the param init.hub_commit


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


# --------------------------------------------------------------------------- composition


def conf_dir() -> Path:
    """The directory holding ``config.yaml`` and the config groups."""
    return paths.project_root() / "conf"


def group_options(group: str) -> list[str]:
    """Names of the options of a config group, from the YAML files in ``conf/<group>/``."""
    return sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))


def compose(overrides: Sequence[str] = ()) -> DictConfig:
    """Compose ``conf/config.yaml`` with Hydra overrides, without validating the result.

    Hydra's compose API keeps global state; clearing it first means re-running a notebook
    cell never fails with "GlobalHydra is already initialized".
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.core.global_hydra import GlobalHydra

    check_overrides(overrides)
    # The schema is the first entry of config.yaml's defaults list: every key exists with its
    # type before the YAML files and overrides are merged in (Hydra's structured configs).
    ConfigStore.instance().store(name=SCHEMA_NAME, node=WorkbenchConfig)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            return hydra_compose(config_name="config", overrides=list(overrides))
    except ConfigError:
        raise
    except Exception as exc:  # Hydra wraps OmegaConf errors in several exception types
        raise ConfigError(describe_hydra_error(exc)) from exc


def load_config(overrides: Sequence[str] = ()) -> WorkbenchConfig:
    """Compose, type-check and validate: the single entry point for configuration.

    With ``resume=<run_id>`` the result is that run's own config plus the allowed overrides
    (see :mod:`workbench.training.resume`).
    """
    composed = compose(overrides)
    if composed.get("resume"):
        from workbench.training import resume

        return resume.resume_config(composed, overrides)
    return validate(composed)


def validate(cfg: DictConfig | Mapping[str, Any] | WorkbenchConfig) -> WorkbenchConfig:
    """Merge ``cfg`` into the schema (types, unknown keys) and run the cross-field checks."""
    if isinstance(cfg, WorkbenchConfig):
        typed = cfg
    else:
        schema = OmegaConf.structured(WorkbenchConfig)
        try:
            merged = OmegaConf.merge(schema, cfg)
            typed = OmegaConf.to_object(merged)  # type: ignore[assignment]
        except OmegaConfBaseException as exc:
            raise ConfigError(describe_omegaconf_error(exc)) from exc
    check_values(typed)
    return typed


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


# --------------------------------------------------------------------------- derived values


@dataclass(frozen=True)
class Derived:
    """Quantities computed once from the config, logged as params and printed at start."""

    rollout_size: int  # samples per PPO update = num_envs * n_steps
    minibatches_per_epoch: int
    gradient_steps_per_iteration: int
    iterations: int  # PPO iterations needed to reach total_timesteps
    env_seeds: list[int]


def derive(cfg: WorkbenchConfig) -> Derived:
    """Compute the derived quantities of a validated config."""
    rollout = cfg.env.num_envs * cfg.algo.n_steps
    minibatches = -(-rollout // cfg.algo.batch_size)
    return Derived(
        rollout_size=rollout,
        minibatches_per_epoch=minibatches,
        gradient_steps_per_iteration=minibatches * cfg.algo.n_epochs,
        iterations=-(-cfg.total_timesteps // rollout),
        env_seeds=[cfg.seed + rank for rank in range(cfg.env.num_envs)],
    )


# --------------------------------------------------------------------------- checks


def check_values(cfg: WorkbenchConfig) -> None:
    """Cross-field and range checks a schema cannot express; raises :class:`ConfigError`."""
    _check_choice("env.vec_env", cfg.env.vec_env, VEC_ENV_CHOICES)
    _check_choice("device", cfg.device, DEVICE_CHOICES)
    _check_choice("algo.policy.activation", cfg.algo.policy.activation, ACTIVATION_CHOICES)
    _check_choice("algo.lr_schedule", cfg.algo.lr_schedule, LR_SCHEDULE_CHOICES)
    _check_choice("sweep.executor", cfg.sweep.executor, ("local", "ray"))
    _check_min("env.num_envs", cfg.env.num_envs, 1)
    _check_min("algo.n_steps", cfg.algo.n_steps, 2)
    _check_min("algo.batch_size", cfg.algo.batch_size, 2)
    _check_min("algo.n_epochs", cfg.algo.n_epochs, 1)
    _check_min("total_timesteps", cfg.total_timesteps, 1)
    _check_min("eval.n_episodes", cfg.eval.n_episodes, 1)
    _check_min("eval.final_episodes", cfg.eval.final_episodes, 0)
    _check_min("eval.every_steps", cfg.eval.every_steps, 0)
    _check_min("torch_threads", cfg.torch_threads, 0)
    _check_min("checkpoint.every_steps", cfg.checkpoint.every_steps, 0)
    _check_min("checkpoint.keep_last", cfg.checkpoint.keep_last, 0)
    if cfg.algo.learning_rate <= 0:
        raise ConfigError(
            f"algo.learning_rate={cfg.algo.learning_rate}: must be > 0 "
            "(e.g. algo.learning_rate=3e-4)"
        )
    rollout = cfg.env.num_envs * cfg.algo.n_steps
    if cfg.algo.batch_size > rollout:
        raise ConfigError(
            f"algo.batch_size={cfg.algo.batch_size} is larger than one rollout "
            f"(env.num_envs * algo.n_steps = {cfg.env.num_envs} * {cfg.algo.n_steps} = {rollout}): "
            f"lower algo.batch_size to at most {rollout} or raise env.num_envs/algo.n_steps"
        )
    if cfg.total_timesteps < rollout:
        raise ConfigError(
            f"total_timesteps={cfg.total_timesteps} is smaller than one rollout "
            f"(env.num_envs * algo.n_steps = {rollout}): raise total_timesteps to at least "
            f"{rollout} or shrink the rollout"
        )
    check_env_id(cfg.env.id)
    check_env_kwargs(cfg.env.id, cfg.env.kwargs)
    from workbench.envs import randomization  # wrappers import gymnasium: only when validating

    randomization.check_settings("env.randomization", cfg.env.randomization, cfg.env.id)
    randomization.check_settings("eval.randomization", cfg.eval.randomization, cfg.env.id)
    check_init(cfg.init)
    if cfg.env.vec_env == "envpool":
        from workbench.envs.envpool_vec import check_support

        check_support(cfg.env.id, cfg.env.kwargs, cfg.env.randomization)


def check_init(init: InitConfig) -> None:
    """A Hub initialization names both the repository and a revision (never a moving default)."""
    if init.hub_repo_id and not init.hub_revision:
        raise ConfigError(
            f"init.hub_revision: missing for init.hub_repo_id={init.hub_repo_id}; pin it, e.g. "
            "init.hub_revision=<commit sha or tag> (workbench hub push prints the commit)"
        )
    if init.hub_revision and not init.hub_repo_id:
        raise ConfigError(
            f"init.hub_revision={init.hub_revision}: set without init.hub_repo_id; add "
            "init.hub_repo_id=<org/name> or drop the revision"
        )


def check_env_id(env_id: str) -> None:
    """Fail early, with suggestions, on an id gymnasium does not know (no env is created)."""
    import gymnasium

    import workbench.envs  # noqa: F401  (registers the workbench's own environments)

    registry = gymnasium.envs.registry
    if ":" in env_id:  # gymnasium's "module:id" form imports the module that registers the id
        import importlib

        module, _, env_id = env_id.partition(":")
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigError(f"env.id: cannot import module {module!r} ({exc})") from exc
    if env_id in registry:
        return
    close = difflib.get_close_matches(env_id, list(registry), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}?" if close else "see gymnasium.envs.registry"
    raise ConfigError(f"env.id={env_id!r}: not a registered gymnasium id ({hint})")


def check_env_kwargs(env_id: str, kwargs: Mapping[str, Any]) -> None:
    """Let an env class validate ``env.kwargs`` before anything runs.

    An environment class may define ``check_kwargs(kwargs)`` (raising ``ValueError``); the
    workbench's robots do, so a misspelt reward weight fails here with exit code 2.
    """
    import gymnasium

    # "module:id" (gymnasium's form, see check_env_id): the registry knows the bare id.
    entry_point: Any = gymnasium.envs.registry[env_id.rpartition(":")[2]].entry_point
    if isinstance(entry_point, str):
        entry_point = gymnasium.envs.registration.load_env_creator(entry_point)
    check = getattr(entry_point, "check_kwargs", None)
    if check is None:
        return
    try:
        check(dict(kwargs))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"env.kwargs for {env_id}: {exc}") from exc


def _check_choice(key: str, value: str, choices: Iterable[str]) -> None:
    choices = tuple(choices)
    if value not in choices:
        raise ConfigError(
            f"{key}={value!r}: not a valid choice; choose one of {', '.join(choices)}"
        )


def _check_min(key: str, value: int, minimum: int) -> None:
    if value < minimum:
        raise ConfigError(f"{key}={value}: must be >= {minimum}")


# --------------------------------------------------------------------------- overrides


def check_overrides(overrides: Sequence[str]) -> None:
    """Check override keys against the schema and group options before Hydra composes.

    Hydra would reject most of these too, but with multi-line messages and without the list
    of valid choices; this gives one actionable line (and "did you mean" suggestions).
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for text in overrides:
        try:
            override = parser.parse_override(text)
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(
                f"override {text!r}: cannot parse ({first}); write key=value, e.g. seed=3"
            ) from exc
        key = override.key_or_group
        if override.is_add() or override.is_force_add() or override.is_delete():
            continue  # the user asked for Hydra's explicit append/delete semantics
        if key == "tuning" and override.value() is None:
            raise ConfigError(
                f"override {text!r}: the tuning group is chosen from algo and env "
                "(conf/tuning/<algo>_<env>.yaml); write ~tuning to compose without it"
            )
        if key in GROUPS:
            _check_group_option(key, override.value())
        else:
            _check_schema_key(key)


def _check_group_option(group: str, value: Any) -> None:
    options = group_options(group)
    values = value if isinstance(value, list) else [value]
    for option in values:
        if option is None or str(option) in options:
            continue
        close = difflib.get_close_matches(str(option), options, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(
            f"{group}={option}: unknown {group} option{hint}; choose one of {', '.join(options)}"
        )


def _check_schema_key(dotted: str) -> None:
    node: Any = WorkbenchConfig
    walked: list[str] = []
    for part in dotted.split("."):
        if not (isinstance(node, type) and is_dataclass(node)):
            return  # inside a free-form dict (env.kwargs, tracking.tags): anything goes
        by_name = {f.name: f for f in fields(node)}
        if part not in by_name:
            where = ".".join(walked) or "the top level"
            close = difflib.get_close_matches(part, list(by_name), n=1)
            hint = f"did you mean {'.'.join([*walked, close[0]])}? " if close else ""
            raise ConfigError(
                f"{dotted}: unknown config key; {hint}valid keys of {where}: "
                f"{', '.join(sorted(by_name))}"
            )
        walked.append(part)
        node = _field_type(by_name[part])


def _field_type(f: Any) -> Any:
    """The dataclass type of a nested field, or None for leaves."""
    if f.default_factory is not MISSING:
        sample = f.default_factory()
        return type(sample) if is_dataclass(sample) else None
    return None


# --------------------------------------------------------------------------- error messages


def describe_omegaconf_error(exc: OmegaConfBaseException) -> str:
    """One line from an OmegaConf validation error: key, problem, expected type."""
    key = getattr(exc, "full_key", None) or "config"
    msg = getattr(exc, "msg", None) or str(exc)
    problem = msg.strip().splitlines()[0]
    value = getattr(exc, "value", None)
    shown = f"{key}={value}" if value is not None else key
    expected = schema_type(key)
    fix = f"; expected {expected}" if expected else ""
    return f"{shown}: {problem}{fix}"


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


def describe_hydra_error(exc: BaseException) -> str:
    """One line from a Hydra composition error, keeping its most specific cause."""
    text = str(exc)
    if "To append to your config use" in text:
        # A key the composed config lacks (e.g. inside env.kwargs): Hydra wants a leading '+'.
        suggestion = text.split("To append to your config use", 1)[1].strip().splitlines()[0]
        target = text.split("'")[1] if "'" in text else "override"
        return f"{target}: not in the composed config; to add it write {suggestion}"
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, OmegaConfBaseException) and getattr(cause, "full_key", None):
            return describe_omegaconf_error(cause)
        cause = cause.__cause__ or cause.__context__
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return " ".join(lines[:3]) if lines else type(exc).__name__
