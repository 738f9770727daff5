"""How a run presents itself: its name, tags, description, params and the header it prints.

Derived values are computed once (:func:`workbench.config.derive`), logged as ``derived.*``
params and printed at start, so the run table, the run page and the console agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

import workbench.training.algorithms as algorithms
from workbench import config, paths
from workbench.config import Derived, OffPolicyConfig, PPOConfig, WorkbenchConfig
from workbench.envs.calibration import VecEnvChoice
from workbench.tracking.redaction import redact_uri
from workbench.tracking.store import source_tags

# Tasks whose shipped defaults were measured (docs/benchmarks.md): side by side with
# rl-baselines3-zoo's tuned PPO on HalfCheetah (where the `ppo` defaults were chosen), Hopper,
# Swimmer and Walker2d (each of these four with its conf/tuning/ppo_<task>.yaml),
# InvertedDoublePendulum, Reacher, Ant and Humanoid (untuned); on InvertedPendulum with its
# tuning file, as notebooks/train.ipynb runs it by default (tests/test_demo.py).
MEASURED_TASKS = ("halfcheetah", "hopper", "swimmer", "inverted_double_pendulum", "reacher",
                  "ant", "humanoid", "inverted_pendulum", "walker2d")
# Tasks where the same measurement found the shipped defaults behind the zoo: the header says
# so and names the zoo's preset (none now: Walker2d was one until it got its tuning file).
# Every task in neither tuple runs them untested, and the header says that instead.
TRAILING_TASKS: tuple[str, ...] = ()


def untested_defaults_note(cfg: WorkbenchConfig) -> str | None:
    """The header's warning for a task the shipped defaults were not measured on, or were
    measured and lost on (none for a preset, e.g. ``experiment=zoo_<task>``, whose values come
    from elsewhere)."""
    if cfg.experiment_name or cfg.algo.name != "ppo" and not zoo_preset(cfg):
        return None
    if cfg.algo.name != "ppo":
        return (f"algo={cfg.algo.name} runs its library's defaults; rl-baselines3-zoo's tuned "
                f"values: experiment={zoo_preset(cfg)}")
    if cfg.env.name in MEASURED_TASKS:
        return None
    if cfg.env.name in TRAILING_TASKS:
        note = (f"the shipped defaults trail rl-baselines3-zoo on {cfg.env.name} "
                "(docs/benchmarks.md#at-a-glance)")
    else:
        measured = (*MEASURED_TASKS, *TRAILING_TASKS)
        note = (f"the shipped defaults are untested on {cfg.env.name} (measured on "
                f"{', '.join(measured[:-1])} and {measured[-1]} only, docs/benchmarks.md)")
    if zoo := zoo_preset(cfg):
        note += f"; rl-baselines3-zoo's tuned values: experiment={zoo}"
    return note


def zoo_preset(cfg: WorkbenchConfig) -> str | None:
    """The ``experiment=zoo_[<algo>_]<task>`` preset of the run's algorithm and task, if any."""
    algo = "" if cfg.algo.name == "ppo" else f"{cfg.algo.name}_"
    zoo = f"zoo_{algo}{cfg.env.name}"
    return zoo if (paths.project_root() / "conf" / "experiment" / f"{zoo}.yaml").is_file() \
        else None


def checkpoint_plan(cfg: WorkbenchConfig) -> str:
    """When checkpoints are written and how many are kept, under the run's artifacts."""
    every = cfg.checkpoint.every_steps
    when = f"every {every} steps, at the end" if every else "at the end"
    kept = f"newest {cfg.checkpoint.keep_last} kept" if cfg.checkpoint.keep_last else "all kept"
    return f"{when} and on a stop -> artifacts/checkpoints/step-<N>/ ({kept})"


def default_run_name(cfg: WorkbenchConfig) -> str:
    """``<env>-ne<num_envs>-ns<n_steps>-s<seed>``, e.g. ``halfcheetah-ne8-ns256-s0``; other
    algorithms than PPO lead with their name and give train_freq, not n_steps:
    ``halfcheetah-sac-ne1-tf1-s0``, ``hopper-a2c-ne8-ns5-s0``."""
    a = cfg.algo
    algo = "" if a.name == "ppo" else f"-{a.name}"
    rollout = f"tf{a.steps_per_update()}" if a.off_policy else f"ns{a.steps_per_update()}"
    return f"{cfg.env.name}{algo}-ne{cfg.env.num_envs}-{rollout}-s{cfg.seed}"


def run_tags_for(cfg: WorkbenchConfig) -> dict[str, str]:
    """Tags that make MLflow's own run table useful (filter and group by them)."""
    tags = {
        "env": cfg.env.name,
        "env_id": cfg.env.id,
        "algo": cfg.algo.name,
        "num_envs": str(cfg.env.num_envs),
        # steps per env between updates (PPO/A2C: n_steps, off-policy: train_freq)
        "n_steps": str(cfg.algo.steps_per_update()),
        "seed": str(cfg.seed),
        # the seed-free configuration id: MLflow groups the seeds of one config by it
        config.CONFIG_ID_TAG: config.config_id(cfg),
    }
    if cfg.experiment_name:
        tags["preset"] = cfg.experiment_name
    tags["mlflow.note.content"] = run_description(cfg)  # the run's description in MLflow's UI
    return tags


def run_source_tags(run_info: Mapping[str, Any] | None) -> dict[str, str]:
    """"Source" and "Created by" in MLflow's run table: the notebook that ran the training
    (a sweep point's executed copy, JupyterLab's notebook) or the ``workbench`` command."""
    info = run_info or {}
    if info.get("notebook"):
        return source_tags(str(info["notebook"]), "NOTEBOOK")
    return source_tags(str(info.get("command") or "workbench (Python API)"))


def run_description(cfg: WorkbenchConfig) -> str:
    """One sentence saying what the run trains, shown as its description in MLflow's UI."""
    a, e = cfg.algo, cfg.env
    preset = f"; preset {cfg.experiment_name}" if cfg.experiment_name else ""
    label = algorithms.algorithm(a).label
    return (f"{label} on {e.id}: {update_plan(cfg)}, lr {a.learning_rate:g}; "
            f"{cfg.total_timesteps} env steps, seed {cfg.seed}{preset}.")


def update_plan(cfg: WorkbenchConfig) -> str:
    """What one update sees: PPO's rollout and minibatches, A2C's rollout, an off-policy
    algorithm's collection, gradient steps and replay buffer."""
    a, n = cfg.algo, cfg.env.num_envs
    rollout = n * a.steps_per_update()
    if isinstance(a, PPOConfig):
        return (f"{n} envs x {a.n_steps} steps = {rollout} samples per update (minibatch "
                f"{a.batch_size}, {a.n_epochs} epochs)")
    if isinstance(a, OffPolicyConfig):
        steps = f"{a.gradient_steps} gradient step{'s' if a.gradient_steps != 1 else ''}"
        return (f"{n} envs x {a.train_freq} steps = {rollout} transitions, then {steps} of "
                f"{a.batch_size} from a replay buffer of {a.buffer_size} (updates from step "
                f"{a.learning_starts})")
    return f"{n} envs x {a.steps_per_update()} steps = {rollout} samples per gradient step"


def run_params(cfg: WorkbenchConfig, derived: Derived, threads: int) -> dict[str, Any]:
    """The flattened resolved config plus the derived quantities (``derived.*``)."""
    params = config.flatten(config.to_dict(cfg))
    params.update(
        {
            "derived.rollout_size": derived.rollout_size,
            "derived.minibatches_per_epoch": derived.minibatches_per_epoch,
            "derived.gradient_steps_per_iteration": derived.gradient_steps_per_iteration,
            "derived.iterations": derived.iterations,
            "derived.log_every_steps": derived.log_every_steps,
            "derived.env_seeds": derived.env_seeds,
            "derived.torch_threads": threads,
        }
    )
    return params


def header_lines(
    cfg: WorkbenchConfig,
    derived: Derived,
    model: Any,
    threads: int,
    uri: str,
    run_id: str,
    run_name: str,
    vec_choice: VecEnvChoice | None = None,
    artifact_uri: str | None = None,
) -> dict[str, Any]:
    """What the run is about to do, printed once before training."""
    cuda = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    normalize = " + VecNormalize" if cfg.env.normalize else ""
    return {
        "task": f"{cfg.env.id}  obs {model.observation_space.shape}  "
        f"act {model.action_space.shape}",
        "envs": f"{cfg.env.num_envs} x {vec_choice.name if vec_choice else cfg.env.vec_env}"
        f"{normalize}, seeds {derived.env_seeds[0]}"
        f"..{derived.env_seeds[-1]}"
        + (f" ({vec_choice.reason})" if vec_choice and cfg.env.vec_env == "auto" else ""),
        "rollout": f"{algorithms.algorithm(cfg.algo).label}: {update_plan(cfg)}",
        **({"replay buffer": buffer_line(cfg, model)}
           if isinstance(cfg.algo, OffPolicyConfig) else {}),
        "budget": f"{cfg.total_timesteps} steps = {derived.iterations} iterations"
        + (f" of {derived.log_every_steps} steps" if cfg.algo.off_policy else ""),
        "device": f"{model.device} (torch threads {threads}; GPU: {cuda})",
        "tracking": f"{redact_uri(uri)}  experiment {cfg.tracking.experiment!r}",
        "run": f"{run_name}  ({run_id})",
        **({"artifacts": redact_uri(artifact_uri)} if artifact_uri else {}),
        "checkpoints": checkpoint_plan(cfg),
        **({"note": note} if (note := untested_defaults_note(cfg)) else {}),
        **({"replay ratio": ratio} if (ratio := replay_ratio_note(cfg)) else {}),
    }


def replay_ratio_note(cfg: WorkbenchConfig) -> str | None:
    """An off-policy run with several envs makes fewer gradient steps per transition than the
    library's one-env defaults assume; the header says so, with the two ways back."""
    a, n = cfg.algo, cfg.env.num_envs
    if not isinstance(a, OffPolicyConfig) or n * a.train_freq <= a.gradient_steps:
        return None
    per = n * a.train_freq / a.gradient_steps
    return (f"{per:g} transitions per gradient step (the library's defaults assume 1 env: "
            f"{a.train_freq / a.gradient_steps:g}); for its ratio set env.num_envs=1 or "
            f"algo.gradient_steps={n * a.gradient_steps}")


def buffer_line(cfg: WorkbenchConfig, model: Any) -> str:
    """The replay buffer's size in memory, and whether each checkpoint carries it (on disk:
    up to the same size, its filled part)."""
    a = cfg.algo
    assert isinstance(a, OffPolicyConfig)
    size = algorithms.replay_buffer_bytes(a, model.observation_space, model.action_space)
    limit = cfg.checkpoint.replay_buffer_max_mb
    kept = (f"in each checkpoint, up to {size / 2**20:.0f} MiB on disk" if size <= limit * 2**20
            else f"not in checkpoints (over checkpoint.replay_buffer_max_mb={limit}): a "
                 "resume refills it")
    return f"{a.buffer_size} transitions, {size / 2**20:.0f} MiB in memory; {kept}"
