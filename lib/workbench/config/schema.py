"""The typed schema behind ``conf/``: one dataclass per config group, one comment per field.

Hydra composes ``conf/config.yaml`` on top of :class:`WorkbenchConfig` (its first defaults
entry is this schema, stored as ``workbench_schema``), so every key exists with its type
before a YAML file or an override is merged in; unknown keys, wrong types and values outside
an ``Enum`` fail with the key's name (:mod:`workbench.config.compose`).
:mod:`workbench.config.checks` adds the range and cross-field checks a type cannot express.

Each default is written once: here, or (for ``???`` fields) in the group option that sets it.
The ``algo`` group has one schema per algorithm (:mod:`workbench.config.algorithms`) with the
library's own defaults, so ``algo=ppo_sb3`` is PPO's schema as it is and
``conf/algo/ppo.yaml`` lists only what the workbench changes (``tests/test_defaults.py``
checks that no YAML file of ``conf/`` repeats a default).
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, is_dataclass
from enum import StrEnum
from typing import Any

from omegaconf import MISSING, OmegaConf

from workbench.config.algorithms import ALGORITHMS, AlgoConfig, PPOConfig, algo_schema
from workbench.config.fields import Activation, Range, Schedule, ranged, sizes

__all__ = ["Activation", "Range", "Schedule", "ranged", "sizes"]  # re-exported


class VecEnvBackend(StrEnum):
    """How the environment copies are stepped (``env.vec_env``)."""

    dummy = "dummy"  # one after the other in the learner's process
    subproc = "subproc"  # one process per env copy
    envpool = "envpool"  # EnvPool's C++ threads (extra ``fast``)
    # one process; every MuJoCo copy's physics stepped in native threads (envs/batched.py)
    batched = "batched"
    # envpool where it runs the task, else batched for MuJoCo tasks, else dummy
    # (envs/calibration.py)
    auto = "auto"


class Device(StrEnum):
    """Where the policy trains (``device``)."""

    auto = "auto"  # CUDA when available, else the CPU
    cpu = "cpu"
    cuda = "cuda"


class SweepExecutor(StrEnum):
    """Where sweep points (and tuning trials, ``tune.executor``) run (``sweep.executor``)."""

    local = "local"  # threads on this machine, one kernel per point
    ray = "ray"  # tasks on an existing Ray cluster


class TuneObjective(StrEnum):
    """What a tuning study optimizes (``tune.objective``; docs/tuning.md)."""

    final_return = "final_return"  # the final deterministic evaluation's mean return (maximize)
    # training seconds until an evaluation reaches tune.target (minimize); never: more than
    # tune.budget_s, by the best evaluation's shortfall
    time_to_target = "time_to_target"
    # area under the evaluation return vs training seconds over tune.budget_s, divided by it:
    # the mean return over the budget (maximize)
    auc = "auc"


class TuneSampler(StrEnum):
    """How a study picks the next trial's values (Optuna's samplers, ``tune.sampler``)."""

    tpe = "tpe"  # Tree-structured Parzen Estimator
    random = "random"
    grid = "grid"  # every combination of ``choices`` (all params need choices)
    cmaes = "cmaes"  # CMA-ES over the numeric ranges (choices are sampled at random)


class TunePruner(StrEnum):
    """Which trials stop early (Optuna's pruners, ``tune.pruner``)."""

    median = "median"  # below the median of completed trials at the same report
    halving = "halving"  # asynchronous successive halving
    hyperband = "hyperband"
    # with tune.seeds: after each seed, a Wilcoxon signed-rank test of the trial's per-seed
    # values against the best trial's on the same seeds
    wilcoxon = "wilcoxon"
    none = "none"


class TuneAggregate(StrEnum):
    """How a trial's per-seed values make its value (``tune.aggregate``, with tune.seeds)."""

    median = "median"
    mean = "mean"
    iqm = "iqm"  # interquartile mean: the mean of the middle half of the seeds


# numpy's seeds are 32-bit; evaluation and export seed their envs at seed + 10000 .. 30000
# (envs/vector.py, deploy/export.py), so the base seed keeps that much headroom.
SEED_MAX = 2**32 - 1 - 40_000


@dataclass
class RandomizationConfig:
    """Domain randomization for any MuJoCo task (wrappers in envs/randomization.py).

    Physics ranges are ``[low, high]`` scale factors on the model's nominal values, each
    sampled uniformly once per episode (the sampled values are in ``info["randomization"]``);
    null leaves that quantity nominal. All-default values mean no wrapper at all.
    """

    # std of Gaussian noise added to observations (obs units)
    obs_noise_std: float = ranged(0.0, 0, example=0.05)
    # std of Gaussian action noise, fraction of half the action range
    action_noise_std: float = ranged(0.0, 0, example=0.1)
    action_delay: int = ranged(0, 0, example=1)  # actions reach the simulator N steps late
    friction: list[float] | None = None  # [low, high] scale of every geom's sliding friction
    mass_scale: list[float] | None = None  # [low, high] scale of every body's mass and inertia
    damping: list[float] | None = None  # [low, high] scale of every joint's damping
    actuator_gain: list[float] | None = None  # [low, high] scale of every actuator's gain


@dataclass
class EnvConfig:
    """Which simulator task to train on and how its copies are vectorized."""

    name: str = MISSING  # group option this came from (conf/env/<name>.yaml)
    id: str = MISSING  # gymnasium id, or "module:Id" for an id that module registers
    # parallel environment copies; per-env seed = seed + rank
    num_envs: int = ranged(16, 1, example=16)
    vec_env: VecEnvBackend = VecEnvBackend.auto  # the choice is logged as derived.vec_env
    # threads stepping the copies with vec_env=batched or envpool (auto too); None: one per
    # core of the run's budget (WORKBENCH_CPU_BUDGET or the physical cores), at most num_envs
    num_threads: int | None = ranged(None, 1, example=2)
    normalize: bool = True  # wrap in SB3's VecNormalize (running obs/return statistics)
    norm_obs: bool = True  # with normalize: normalize observations
    norm_reward: bool = True  # with normalize: scale rewards by the return's running std
    # with norm_reward: that return's discount (SB3's VecNormalize gamma; rl-baselines3-zoo
    # sets the algorithm's own gamma here, and so do its presets, conf/experiment/zoo_*)
    norm_gamma: float = ranged(0.99, 0, 1, example=0.99)
    # with normalize: clip normalized observations to +-clip_obs
    clip_obs: float = ranged(10.0, 0, above=True, example=10.0)
    # None keeps the task's own time limit
    max_episode_steps: int | None = ranged(None, 1, example=1000)
    kwargs: dict[str, Any] = field(default_factory=dict)  # passed to gymnasium.make
    randomization: RandomizationConfig = field(default_factory=RandomizationConfig)  # training


@dataclass
class TrackingConfig:
    """Where runs are recorded. ``MLFLOW_TRACKING_URI`` wins over ``uri`` (MLflow's convention)."""

    uri: str | None = None  # None: embedded SQLite store experiments/mlflow.db
    experiment: str = "workbench"  # MLflow experiment name (not empty)
    run_name: str | None = None  # None: derived from env, num_envs, n_steps and seed
    system_metrics: bool = True  # MLflow's built-in CPU/memory/GPU sampler
    # seconds between samples (MLflow's default); also the process tree's memory samples
    system_metrics_interval_s: float = ranged(10.0, 0, above=True, example=10)
    tags: dict[str, str] = field(default_factory=dict)  # extra run tags


@dataclass
class EvalConfig:
    """Deterministic evaluation on a separate environment copy."""

    # evaluate during training every N env steps (0: only at the end)
    every_steps: int = ranged(0, 0, example=10000)
    n_episodes: int = ranged(5, 1, example=5)  # episodes per evaluation during training
    final_episodes: int = ranged(10, 0, example=10)  # episodes of the final evaluation
    # Evaluation's own randomization, independent of env.randomization (default: the nominal
    # task), so a sweep can train under one setting and measure robustness under another.
    randomization: RandomizationConfig = field(default_factory=RandomizationConfig)


@dataclass
class VideoConfig:
    """Rollout videos of the deterministic policy (envs/video.py, docs/videos.md).

    Rendered off-screen (MuJoCo through ``MUJOCO_GL=egl`` or ``osmesa``) in the evaluation
    env only, never in the training envs; an MP4 (H.264) and a small GIF preview are logged
    under the run's ``video/`` artifacts. Without an OpenGL backend the run warns once and goes
    on without video. The time it takes is the metric ``video/render_seconds``.
    """

    enabled: bool = True  # record videos: after the final evaluation (video/replay.mp4)
    # also record during training every N env steps (video/step-<N>.mp4; 0: only at the end)
    every_steps: int = ranged(0, 0, example=50000)
    episodes: int = ranged(1, 1, 10, example=1)  # episodes per video, one after the other
    # env steps rendered per episode, where the episode stops; None: the whole episode
    max_steps: int | None = ranged(500, 1, example=500)
    # frames per second of the MP4; None: the task's real time (its render_fps)
    fps: int | None = ranged(None, 1, 240, example=30)
    width: int = ranged(320, 16, 1920, example=320)  # frame width in pixels (even: H.264)
    height: int = ranged(240, 16, 1080, example=240)  # frame height in pixels (even: H.264)
    # shadows and reflections: nicer, and several times the render time without a GPU
    shadows: bool = False
    # the final video stops once recording it took this share of the training time (but
    # never before 2 s): on a short run a video costs more than the training; None: whole
    # episodes, whatever they cost
    max_share: float | None = ranged(0.25, 0.0, example=0.25)


@dataclass
class ConsoleConfig:
    """What training prints."""

    progress_bar: bool = True  # tqdm bar over environment steps
    iteration_lines: bool = True  # one concise summary line per PPO iteration
    summary: bool = True  # the "Training summary" table at the end


@dataclass
class RayConfig:
    """The Ray cluster that ``sweep.executor=ray`` submits points to."""

    address: str | None = None  # HOST:PORT of the head; None: RAY_ADDRESS, else "auto"
    gpus_per_point: float = 0.0  # GPUs Ray gives each point (0.5: two share one); 0: none


class CheckpointKeep(StrEnum):
    """Which checkpoints a run keeps (``checkpoint.keep``; docs/robustness.md)."""

    last = "last"  # the newest checkpoint.keep_last
    # those and the best-evaluated one: each checkpoint written every checkpoint.every_steps
    # gets a deterministic evaluation (eval.n_episodes episodes on the evaluation env)
    best = "best"


@dataclass
class CheckpointConfig:
    """Checkpoints in the run's artifacts (``checkpoints/step-<N>/``), for ``resume=<run_id>``."""

    # write one every N env steps (0: only at the end, on stop/failure)
    every_steps: int = ranged(50_000, 0, example=50000)
    keep_last: int = ranged(3, 0, example=3)  # newest checkpoints kept in the run (0: all)
    keep: CheckpointKeep = CheckpointKeep.last  # last | best (keep the best-evaluated too)
    # off-policy algorithms: checkpoints carry the replay buffer (its filled part) while it
    # is at most this many MiB in memory; a larger one is left out and a resume refills it
    # with algo.learning_starts steps of fresh experience (the header says which applies)
    replay_buffer_max_mb: int = ranged(2048, 0, example=2048)


@dataclass
class VerifyConfig:
    """A verification sweep (``sweep=verify``; docs/reports.md#verifying-a-change): the two
    configurations of the grid, A first, trained in stages of seeds until B is decided not
    worse than A by more than the margin, or worse, or every side has ``max_seeds``."""

    # how much worse B may be: a share of A's IQM ("5%") or a return ("50"); None: a plain sweep
    margin: str | None = None
    add_seeds: int = ranged(3, 1, example=3)  # seeds each stage adds a side (stage 1: seeds)
    max_seeds: int = ranged(12, 2, example=12)  # the cap: seeds a side, the first stage's at least
    target: float | None = None  # a return: also judge B's training seconds to reach it
    time_margin: str = "5%"  # how much slower than A B may be to reach target
    allow_different_tasks: bool = False  # A and B may train on different tasks


@dataclass
class SweepConfig:
    """Grid for ``workbench sweep`` (see conf/sweep/)."""

    name: str = "default"  # the sweep id's prefix
    id: str | None = None  # None: <name>-<hash of points and overrides>; set to extend a sweep
    # Any config keys, group choices included, each with its values: crossed with each other,
    # with num_envs / n_steps when set, and with seeds, e.g. {algo.learning_rate: [1e-4, 3e-4],
    # env: [hopper, walker2d]} (workbench.sweeps.grid, docs/sweeps.md)
    grid: dict[str, Any] = field(default_factory=dict)
    # env.num_envs / algo.n_steps values (shorthand for those grid keys); None: [1, 2] and
    # [128, 256] when sweep.grid is empty, else the config's own value (not an axis)
    num_envs: list[int] | None = None
    n_steps: list[int] | None = None
    seeds: list[int] = field(default_factory=lambda: [0])
    iso_batch: int | None = None  # keep num_envs * n_steps == iso_batch (n_steps derived)
    workers: int = ranged(2, 1, example=2)  # concurrent points; each gets cores / workers CPUs
    executor: SweepExecutor = SweepExecutor.local
    # seconds per point (kernel start included); None: no limit
    timeout: float | None = ranged(None, 0, above=True, example=3600)
    overrides: list[str] = field(default_factory=list)  # extra overrides for every point
    # a grid of more points than this needs `workbench sweep --yes` (a typo like [1,2,4,8,16]
    # x five seeds x four rates is 100 trainings)
    max_points: int = ranged(64, 1, example=64)
    ray: RayConfig = field(default_factory=RayConfig)  # with executor=ray
    # the Jupyter kernel every point runs in (papermill's kernel_name): another virtualenv
    # registered as a kernel runs the points in its software stack; as a grid axis
    # (sweep.grid={sweep.kernel:[workbench,candidate]}) each point runs in its own
    kernel: str = "workbench"
    verify: VerifyConfig = field(default_factory=VerifyConfig)  # with sweep=verify


@dataclass
class SearchConfig:
    """A search space for ``workbench tune`` (see conf/search/): the name, the dimensions."""

    name: str = "none"  # the conf/search/ option this came from
    # search key (learning_rate, n_steps, ..., docs/tuning.md) -> {low, high, log, step} or
    # {choices: [...]}; checked by workbench.tuning.space (free-form here, so overrides can add
    # a key: '+search.params.clip_range={low:0.1,high:0.4}')
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class TuneConfig:
    """A tuning study for ``workbench tune`` (Optuna; docs/tuning.md)."""

    study: str | None = None  # None: <env>-<objective>-<hash of space, overrides, objective>
    n_trials: int = ranged(20, 1, example=20)  # trials of the study in total (resume: the rest)
    objective: TuneObjective = TuneObjective.final_return
    target: float | None = None  # return to reach (tune.objective=time_to_target)
    # training seconds per trial (evaluations excluded); None: total_timesteps only
    budget_s: float | None = ranged(None, 0, above=True, example=120)
    # deterministic evaluation every N env steps in every trial (sets eval.every_steps)
    eval_every_steps: int = ranged(10_000, 1, example=10000)
    # time objectives report to the pruner every N training seconds; None: budget_s / 10
    report_every_s: float | None = ranged(None, 0, above=True, example=10)
    sampler: TuneSampler = TuneSampler.tpe
    seed: int | None = ranged(None, 0, example=0)  # the sampler's seed; None: random
    pruner: TunePruner = TunePruner.median
    startup_trials: int = ranged(5, 0, example=5)  # median: no pruning before N completed trials
    warmup_steps: int = ranged(0, 0, example=0)  # median: no pruning before this report step
    workers: int = ranged(1, 1, example=2)  # concurrent trials; each gets cores / workers CPUs
    # every trial trains once per seed, its value their tune.aggregate (pruned between seeds);
    # None: one training on `seed`, pruned mid-training (docs/tuning.md)
    seeds: list[int] | None = None
    aggregate: TuneAggregate = TuneAggregate.median
    # with tune.seeds: the best N trials train again on tune.recheck_seeds next to the shipped
    # defaults, and the preset says whether the best of them beats the defaults (0: no check)
    recheck_top: int = ranged(2, 0, example=2)
    # seeds of that check, none of tune.seeds; None: as many as tune.seeds, after the largest
    recheck_seeds: list[int] | None = None
    # more seeds than this in tune.seeds or tune.recheck_seeds need `workbench tune --yes`
    # (each seed is a training of every trial: 10000 seeds are 10000 trainings per trial)
    max_seeds: int = ranged(20, 1, example=20)
    # trials to run first with these values (search keys; a key left out is sampled), e.g.
    # rl-baselines3-zoo's entry for the task, so the sampler starts from a known setting
    enqueue: list[dict[str, Any]] = field(default_factory=list)
    executor: SweepExecutor = SweepExecutor.local
    # seconds per trial (kernel start included); None: no limit
    timeout: float | None = ranged(None, 0, above=True, example=3600)
    # Optuna RDB storage URL; None: optuna.db beside the MLflow store, or the team server's
    storage: str | None = None
    ray: RayConfig = field(default_factory=RayConfig)  # with executor=ray


@dataclass
class ReproConfig:
    """Reproducibility switches; seeding itself is always on (``seed``, env rank r: seed + r)."""

    # torch.use_deterministic_algorithms (+ CUBLAS_WORKSPACE_CONFIG where CUDA is present):
    # bit-identical reruns also on GPU, at a speed cost (docs/tracking.md).
    deterministic: bool = False


@dataclass
class InitConfig:
    """Start training from a policy bundle pulled from the Hugging Face Hub (deploy/hub.py),
    and with a Hub dataset pulled at a pinned commit (``dataset``)."""

    hub_repo_id: str | None = None  # e.g. my-org/halfcheetah-ppo; None: fresh initialization
    hub_revision: str | None = None  # commit sha or tag (required with hub_repo_id); logged
    # resolved to its commit as the param init.hub_commit
    # ORG/NAME@<40-hex commit>: a Hub dataset pulled before training (training/dataset.py);
    # its folder is WORKBENCH_DATASET_DIR while the run trains
    dataset: str | None = None


@dataclass
class WorkbenchConfig:
    """The whole, resolved configuration of one training run."""

    env: EnvConfig = field(default_factory=EnvConfig)
    # the algorithm and its hyperparameters (conf/algo/, config/algorithms.py)
    algo: AlgoConfig = field(default_factory=PPOConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    console: ConsoleConfig = field(default_factory=ConsoleConfig)
    video: VideoConfig = field(default_factory=VideoConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    tune: TuneConfig = field(default_factory=TuneConfig)
    repro: ReproConfig = field(default_factory=ReproConfig)
    init: InitConfig = field(default_factory=InitConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    experiment_name: str | None = None  # the experiment= preset this came from, if any
    total_timesteps: int = ranged(100_000, 1, example=100000)  # environment steps to train
    # base seed: torch, numpy, and env rank r gets seed + r
    seed: int = ranged(0, 0, SEED_MAX, example=0)
    device: Device = Device.auto  # cuda only where torch sees a CUDA device
    # torch intra-op threads for the learner; 0: chosen from the cores
    torch_threads: int = ranged(0, 0, example=1)
    resume: str | None = None  # MLflow run id: continue that run from its last checkpoint


def to_dict(cfg: WorkbenchConfig) -> dict[str, Any]:
    """The config as plain nested dicts (for YAML dumps and MLflow params)."""
    container = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True, enum_to_str=True)
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


def schema_field(dotted: str, algo: str | None = None) -> Any:
    """The resolved type of a schema key (``int`` for ``env.num_envs``), or None if unknown.

    ``algo.*`` keys are looked up in the schema of ``algo`` (an ``algo.name``); without it,
    in the first algorithm whose schema has the key.
    """
    if algo is None and dotted.startswith("algo."):
        found = (schema_field(dotted, name) for name in ALGORITHMS)
        return next((declared for declared in found if declared is not None), None)
    node: Any = WorkbenchConfig
    declared: Any = None
    for part in dotted.split("."):
        if not (isinstance(node, type) and is_dataclass(node)):
            return None
        hints = typing.get_type_hints(node)
        if part not in hints:
            return None
        declared = algo_schema(algo) if node is WorkbenchConfig and part == "algo" and algo \
            else hints[part]
        node = declared if isinstance(declared, type) and is_dataclass(declared) else None
    return declared


def schema_type(dotted: str) -> str | None:
    """The declared type of a schema key as written (``"int"`` for ``env.num_envs``), if any."""
    declared = schema_field(dotted)
    if declared is None:
        return None
    return declared.__name__ if isinstance(declared, type) else str(declared).replace(
        "typing.", "")


def choices(dotted: str) -> list[str] | None:
    """The valid values of an ``Enum`` key (``env.vec_env``), or None for other keys."""
    declared = schema_field(dotted)
    if isinstance(declared, type) and issubclass(declared, StrEnum):
        return [member.value for member in declared]
    return None
