"""The training core: ``train(cfg)`` runs one PPO training and records it in MLflow.

It reads top to bottom: validate, seed and threads, open the MLflow run, build envs, build
PPO, learn with callbacks, evaluate deterministically, save. The CLI, the notebooks and the
tests all call this function; nothing forks it.
"""

from __future__ import annotations

import dataclasses
import resource
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from mlflow.tracking import MlflowClient
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.utils import get_linear_fn
from stable_baselines3.common.vec_env import VecEnv, VecNormalize

from workbench import config, console, envs, tracking
from workbench.config import WorkbenchConfig
from workbench.deploy import hub
from workbench.envs import calibration, guards
from workbench.tracking import manifest, outbox, runs
from workbench.training import checkpoint, resume
from workbench.training.callbacks import IterationCallback, evaluate, reward_component_callbacks

ACTIVATIONS = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU, "elu": torch.nn.ELU}


@dataclass
class TrainResult:
    """What one training produced, for printing, notebooks and sweeps."""

    run_id: str
    run_name: str
    experiment_id: str
    tracking_uri: str
    status: str
    num_timesteps: int
    eval_mean_reward: float
    eval_std_reward: float
    fps: float
    wall_time_s: float
    peak_rss_mb: float
    artifact_uri: str


def train(
    cfg: WorkbenchConfig | Mapping[str, Any],
    *,
    tags: Mapping[str, str] | None = None,
    parent_run_id: str | None = None,
    run_info: Mapping[str, Any] | None = None,
    callbacks: Sequence[BaseCallback] = (),
) -> TrainResult:
    """Train PPO as configured and record the run; returns its summary.

    ``tags`` are added to the MLflow run; ``parent_run_id`` nests it under a sweep's run.
    ``run_info`` (command line, or notebook path and papermill parameters, overrides) goes
    into the manifest's ``run`` section; without it the manifest detects what it can.
    ``callbacks`` are extra SB3 callbacks run after the workbench's own (e.g. live plots).
    With ``cfg.resume`` the run continues from its last checkpoint (training/resume.py).
    The run ends FINISHED, FAILED (error message in the ``error`` tag) or KILLED; a
    checkpoint of the last good state is kept in every case.
    """
    cfg = config.validate(cfg)  # type: ignore[arg-type]
    derived = config.derive(cfg)
    uri = tracking.resolve_tracking_uri(cfg.tracking.uri)
    resumed = resume.prepare(cfg, uri) if cfg.resume else None  # bad input: nothing written yet
    # A Hub policy to start from is pulled, verified and checked against cfg before the run
    # exists, so a wrong repo or revision is bad input, not a failed run (workbench.deploy.hub).
    # A resumed run starts from its checkpoint instead.
    init_bundle = None if resumed else hub.pull_for_init(cfg)
    runs.check_experiments_writable()
    client = tracking.make_client(uri)
    experiment_id = (
        resumed.run.info.experiment_id if resumed
        else tracking.ensure_experiment(client, cfg.tracking.experiment, uri)
    )
    # env.vec_env=auto is resolved here, once, before the run exists (calibration.py)
    vec_choice = calibration.choose_vec_env(resume.same_backend(env_spec(cfg), resumed))
    threads = cfg.torch_threads or envs.auto_torch_threads(cfg.env.num_envs, vec_choice.name)
    torch.set_num_threads(threads)
    manifest.configure_determinism(cfg.repro.deterministic)

    run_name = cfg.tracking.run_name or default_run_name(cfg)
    run_tags = manifest.scrub({**run_tags_for(cfg), **cfg.tracking.tags, **(tags or {})})
    if parent_run_id:
        run_tags["mlflow.parentRunId"] = parent_run_id
    if resumed:  # the same run continues (see workbench.training.resume)
        run = resumed.run
        delivery = outbox.DeliveryClient(uri, run.info.run_id)
        delivery.skip_logged = resume.reopen(client, resumed)
    else:
        run = client.create_run(experiment_id, run_name=run_name, tags=run_tags)
        delivery = outbox.DeliveryClient(uri, run.info.run_id)
    client = delivery  # every write from here on goes through the run's outbox
    run_id = run.info.run_id
    monitor = start_system_metrics(cfg, run_id, uri, resume=resumed is not None)
    train_env: VecEnv | None = None
    eval_env: VecEnv | None = None
    model: PPO | None = None
    recovery: checkpoint.RecoveryCallback | None = None
    interruption = guards.Interruption()
    try:
        if init_bundle is not None:  # the pulled policy's pinned commit, in the manifest's run
            run_info = {**(run_info or {}), **hub.init_run_info(init_bundle)}
        run_manifest = manifest.record_manifest(
            client, run_id, run_info, seed=cfg.seed, keep_tags=list(run_tags)
        )
        if resumed is None:  # a resumed run keeps its params (MLflow's are write-once)
            params = {**run_params(cfg, derived, threads), **vec_choice.params()}
            tracking.log_params(client, run_id, manifest.scrub(params))
        client.log_text(run_id, manifest.scrub_yaml(config.to_dict(cfg)), "config.yaml")
        if init_bundle is not None:  # the commit a tag or branch resolved to, pinned
            tracking.log_params(client, run_id, {"init.hub_commit": init_bundle.commit})
        spec = dataclasses.replace(env_spec(cfg), vec_env=vec_choice.name)
        train_env = envs.make_envs(spec)
        eval_env = envs.make_eval_env(spec, randomization=cfg.eval.randomization)
        model = build_model(cfg, train_env)
        if init_bundle is not None:
            hub.initialize_model(model, train_env, init_bundle)
        console.print_header(
            header_lines(cfg, derived, model, threads, uri, run_id, run_name, vec_choice)
        )
        model.set_logger(build_logger(client, run_id, cfg, derived.iterations))
        recovery = checkpoint.RecoveryCallback(
            delivery, run_id, manifest.scrub_yaml(config.to_dict(cfg)), train_env, eval_env,
            every_steps=cfg.checkpoint.every_steps, keep_last=cfg.checkpoint.keep_last,
            interruption=interruption, existing_steps=resumed.stored_steps if resumed else (),
        )
        if resumed:
            checkpoint.restore(model, train_env, eval_env, resumed.state)
            resume.discard_incomplete(client, resumed)

        started = time.perf_counter()
        own = [
            guards.UpdateCheck(), *build_callbacks(cfg, eval_env),
            *reward_component_callbacks(train_env),
        ]
        with interruption.installed():  # first SIGINT/SIGTERM: stop after the current step
            model.learn(
                cfg.total_timesteps - model.num_timesteps,
                callback=[*own, *callbacks, recovery],
                log_interval=1,
                reset_num_timesteps=resumed is None,
            )
        if interruption.requested:
            raise interruption.error(f" at step {model.num_timesteps}")
        wall = time.perf_counter() - started

        mean, std = evaluate(model, train_env, eval_env, cfg.eval.final_episodes)
        summary = {
            "eval/mean_reward": mean,
            "eval/std_reward": std,
            "summary/eval_mean_reward": mean,
            "summary/eval_std_reward": std,
            "summary/fps": model.num_timesteps / wall,
            "summary/wall_time_s": wall,
            "summary/peak_rss_mb": peak_rss_mb(),
        }
        log_summary(client, run_id, summary, model.num_timesteps)
        save_model(client, run_id, cfg, model, train_env, run_manifest)
        client.set_terminated(run_id, "FINISHED")
    except KeyboardInterrupt as exc:
        saved = checkpoint.save_last_good(recovery, write=not interruption.forced)
        client.set_tag(run_id, "error", guards.interrupt_reason(exc))
        client.set_terminated(run_id, "KILLED")
        print_stopped(run_id, "KILLED", saved)
        raise
    except BaseException as exc:
        saved = checkpoint.save_last_good(recovery)
        error = manifest.scrub_command(f"{type(exc).__name__}: {exc}")
        client.set_tag(run_id, "error", tracking.truncate(error, 5000))
        client.set_terminated(run_id, "FAILED")
        print_stopped(run_id, "FAILED", saved)
        raise
    finally:
        close_envs(train_env, eval_env)
        guards.release_accelerator(model)
        stop_system_metrics(monitor)
        delivery.close()  # drains the outbox (see workbench.tracking.outbox)

    result = TrainResult(
        run_id=run_id,
        run_name=run_name,
        experiment_id=experiment_id,
        tracking_uri=uri,
        status="FINISHED",
        num_timesteps=model.num_timesteps,
        eval_mean_reward=mean,
        eval_std_reward=std,
        fps=summary["summary/fps"],
        wall_time_s=wall,
        peak_rss_mb=summary["summary/peak_rss_mb"],
        artifact_uri=run.info.artifact_uri,
    )
    print_result(result)
    return result


# --------------------------------------------------------------------------- building blocks


def env_spec(cfg: WorkbenchConfig) -> envs.EnvSpec:
    """Plain environment values from the config."""
    e = cfg.env
    return envs.EnvSpec(
        env_id=e.id,
        num_envs=e.num_envs,
        vec_env=e.vec_env,
        seed=cfg.seed,
        max_episode_steps=e.max_episode_steps,
        kwargs=dict(e.kwargs),
        normalize=e.normalize,
        norm_obs=e.norm_obs,
        norm_reward=e.norm_reward,
        clip_obs=e.clip_obs,
        randomization=e.randomization,
    )


def build_model(cfg: WorkbenchConfig, train_env: VecEnv) -> PPO:
    """SB3 PPO with the configured hyperparameters and network."""
    a = cfg.algo
    lr: Any = a.learning_rate
    if a.lr_schedule == "linear":
        lr = get_linear_fn(a.learning_rate, 0.0, 1.0)
    policy_kwargs = {
        "net_arch": {"pi": list(a.policy.pi), "vf": list(a.policy.vf)},
        "activation_fn": ACTIVATIONS[a.policy.activation],
        "log_std_init": a.policy.log_std_init,
        "ortho_init": a.policy.ortho_init,
    }
    return PPO(
        "MlpPolicy",
        train_env,
        learning_rate=lr,
        n_steps=a.n_steps,
        batch_size=a.batch_size,
        n_epochs=a.n_epochs,
        gamma=a.gamma,
        gae_lambda=a.gae_lambda,
        clip_range=a.clip_range,
        ent_coef=a.ent_coef,
        vf_coef=a.vf_coef,
        max_grad_norm=a.max_grad_norm,
        target_kl=a.target_kl,
        normalize_advantage=a.normalize_advantage,
        policy_kwargs=policy_kwargs,
        seed=cfg.seed,
        device=cfg.device,
        verbose=0,
    )


def build_logger(
    client: MlflowClient, run_id: str, cfg: WorkbenchConfig, iterations: int
) -> Logger:
    """SB3 logger whose writers are MLflow (always) and the console line (optional)."""
    writers: list[Any] = [tracking.MlflowWriter(client, run_id)]
    if cfg.console.iteration_lines:
        writers.append(console.ConsoleWriter(iterations))
    return Logger(folder=None, output_formats=writers)


def build_callbacks(cfg: WorkbenchConfig, eval_env: VecEnv) -> list[Any]:
    """Timing, entropy and periodic evaluation; the progress bar when enabled."""
    callbacks: list[Any] = [
        IterationCallback(eval_env, cfg.eval.every_steps, cfg.eval.n_episodes, cfg.total_timesteps)
    ]
    if cfg.console.progress_bar:
        callbacks.append(console.ProgressBarCallback(cfg.total_timesteps))
    return callbacks


def save_model(
    client: MlflowClient, run_id: str, cfg: WorkbenchConfig, model: PPO, train_env: VecEnv,
    run_manifest: Mapping[str, Any] | None = None,
) -> None:
    """Log ``model/``: weights (model.zip), normalization stats, resolved config, manifest."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        folder.mkdir()
        model.save(folder / "model.zip")
        if isinstance(train_env, VecNormalize):
            train_env.save(str(folder / "vecnormalize.pkl"))
        (folder / "config.yaml").write_text(manifest.scrub_yaml(config.to_dict(cfg)))
        if run_manifest is not None:
            (folder / manifest.MANIFEST_FILE).write_text(manifest.to_json(run_manifest))
        client.log_artifacts(run_id, str(folder), artifact_path="model")


def close_envs(*venvs: VecEnv | None) -> None:
    """Close environments (reaps subprocess workers); a crashed worker must not mask errors."""
    for venv in venvs:
        if venv is None:
            continue
        try:
            venv.close()
        except Exception as exc:  # a dead worker's pipe; the original error matters more
            print(f"warning: closing environments failed: {exc}", file=sys.stderr)


def start_system_metrics(cfg: WorkbenchConfig, run_id: str, uri: str, resume: bool = False
                         ) -> Any:
    """MLflow's built-in system metrics sampler (CPU, memory, GPU when present) for the run.

    On resume it continues the run's ``system/*`` steps (MLflow's ``resume_logging``).
    """
    if not cfg.tracking.system_metrics:
        return None
    import mlflow
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    mlflow.set_tracking_uri(uri)  # the monitor logs through the fluent client
    monitor = SystemMetricsMonitor(
        run_id,
        sampling_interval=cfg.tracking.system_metrics_interval_s,
        samples_before_logging=1,
        resume_logging=resume,
    )
    monitor.start()
    return monitor


def stop_system_metrics(monitor: Any) -> None:
    """Stop the sampler and log its last, partial interval.

    MLflow's monitor drops the samples collected since its last publish when it is stopped,
    so a run shorter than one sampling interval would otherwise have no ``system/*`` at all.
    """
    if monitor is None:
        return
    monitor.finish()
    try:
        pending = monitor.aggregate_metrics()
        if pending:
            monitor.publish_metrics(pending)
            monitor.mlflow_logger.flush()
    except Exception as exc:  # system metrics never fail a run
        print(f"warning: last system metrics sample not logged: {exc}", file=sys.stderr)


def print_stopped(run_id: str, status: str, saved: str | None) -> None:
    """Where a stopped run's state is and how to continue it."""
    where = f"checkpoint {saved}; resume with: workbench train resume={run_id}" if saved else (
        "no checkpoint written")
    print(f"workbench: run {run_id} {status}; {where}", file=sys.stderr, flush=True)


def log_summary(client: MlflowClient, run_id: str, values: Mapping[str, float], step: int) -> None:
    """Log the final evaluation and summary figures in one batch."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(k, float(v), now, step) for k, v in values.items()])


def peak_rss_mb() -> float:
    """Peak resident memory of this process and its (reaped) children, in MiB."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return (own + children) / 1024.0  # ru_maxrss is in KiB on Linux


# --------------------------------------------------------------------------- names and params


def default_run_name(cfg: WorkbenchConfig) -> str:
    """``<env>-ne<num_envs>-ns<n_steps>-s<seed>``, e.g. ``halfcheetah-ne8-ns256-s0``."""
    return f"{cfg.env.name}-ne{cfg.env.num_envs}-ns{cfg.algo.n_steps}-s{cfg.seed}"


def run_tags_for(cfg: WorkbenchConfig) -> dict[str, str]:
    """Tags that make MLflow's own run table useful (filter and group by them)."""
    tags = {
        "env": cfg.env.name,
        "env_id": cfg.env.id,
        "algo": cfg.algo.name,
        "num_envs": str(cfg.env.num_envs),
        "n_steps": str(cfg.algo.n_steps),
        "seed": str(cfg.seed),
    }
    if cfg.experiment_name:
        tags["preset"] = cfg.experiment_name
    tags["mlflow.note.content"] = run_description(cfg)  # the run's description in MLflow's UI
    return tags


def run_description(cfg: WorkbenchConfig) -> str:
    """One sentence saying what the run trains, shown as its description in MLflow's UI."""
    a, e = cfg.algo, cfg.env
    preset = f"; preset {cfg.experiment_name}" if cfg.experiment_name else ""
    return (
        f"PPO on {e.id}: {e.num_envs} envs x {a.n_steps} steps = {e.num_envs * a.n_steps} "
        f"samples per update (minibatch {a.batch_size}, {a.n_epochs} epochs, lr "
        f"{a.learning_rate:g}), {cfg.total_timesteps} env steps, seed {cfg.seed}{preset}."
    )


def run_params(cfg: WorkbenchConfig, derived: config.Derived, threads: int) -> dict[str, Any]:
    """The flattened resolved config plus the derived quantities (``derived.*``)."""
    params = config.flatten(config.to_dict(cfg))
    params.update(
        {
            "derived.rollout_size": derived.rollout_size,
            "derived.minibatches_per_epoch": derived.minibatches_per_epoch,
            "derived.gradient_steps_per_iteration": derived.gradient_steps_per_iteration,
            "derived.iterations": derived.iterations,
            "derived.env_seeds": derived.env_seeds,
            "derived.torch_threads": threads,
        }
    )
    return params


def header_lines(
    cfg: WorkbenchConfig,
    derived: config.Derived,
    model: PPO,
    threads: int,
    uri: str,
    run_id: str,
    run_name: str,
    vec_choice: calibration.VecEnvChoice | None = None,
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
        "rollout": f"{derived.rollout_size} samples = {cfg.env.num_envs} envs x "
        f"{cfg.algo.n_steps} steps; {derived.minibatches_per_epoch} minibatches of "
        f"{cfg.algo.batch_size} x {cfg.algo.n_epochs} epochs",
        "budget": f"{cfg.total_timesteps} steps = {derived.iterations} iterations",
        "device": f"{model.device} (torch threads {threads}; GPU: {cuda})",
        "tracking": f"{tracking.redact_uri(uri)}  experiment {cfg.tracking.experiment!r}",
        "run": f"{run_name}  ({run_id})",
    }


def print_result(result: TrainResult) -> None:
    """The final summary table."""
    console.print_table(
        [
            ("run id", result.run_id),
            ("run name", result.run_name),
            ("status", result.status),
            ("steps", result.num_timesteps),
            (
                "final eval reward",
                f"{result.eval_mean_reward:.1f} +- {result.eval_std_reward:.1f} "
                "(deterministic)",
            ),
            ("fps", f"{result.fps:.0f} steps/s"),
            ("wall time", f"{result.wall_time_s:.1f} s"),
            ("peak RSS", f"{result.peak_rss_mb:.0f} MiB"),
            ("artifacts", result.artifact_uri),
            ("tracking", tracking.redact_uri(result.tracking_uri)),
        ],
        title="Training summary",
    )
