"""A training run's lifecycle, in one place: what is decided before the run exists, and the
run itself from its creation to a truthful final status.

:func:`setup_run` decides everything that needs no run: the store (checked first, so an
unusable one fails before any compute), the vectorization backend, the learner's threads,
the run's name and tags. :func:`open_run` creates (or, on resume, reopens) the MLflow run and
owns it until it ends: every write goes through the run's outbox, MLflow's system metrics
sampler runs alongside, and whatever happens inside the ``with`` block the run ends

- FINISHED when the block completes,
- KILLED on Ctrl-C / SIGTERM (:class:`KeyboardInterrupt`), the reason in its ``error`` tag,
- FAILED on any other exception, the error in its ``error`` tag,

with the last good checkpoint written in the last two cases, the environments closed, the
GPU memory released and the outbox drained. The pattern is lightning-hydra-template's
``task_wrapper``: the training function itself has no ``try``.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from mlflow.entities import Run
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import VecEnv

from workbench import config
from workbench.config import ConfigError, Derived, WorkbenchConfig
from workbench.envs.calibration import VecEnvChoice, choose_vec_env
from workbench.envs.cores import auto_torch_threads
from workbench.envs.spec import EnvSpec
from workbench.tracking import manifest
from workbench.tracking.inputs import log_run_inputs
from workbench.tracking.outbox import RunWriter
from workbench.tracking.redaction import redact_uri, scrub, scrub_command, scrub_yaml
from workbench.tracking.rejection import origin_of
from workbench.tracking.runs import check_experiments_writable
from workbench.tracking.store import (
    ensure_experiment,
    log_params,
    make_client,
    resolve_tracking_uri,
    truncate,
)
from workbench.tracking.system_metrics import start_system_metrics, stop_system_metrics
from workbench.training.callbacks import CallbackChain
from workbench.training.checkpoint import RecoveryCallback, save_last_good
from workbench.training.describe import default_run_name, run_params, run_tags_for
from workbench.training.faults import (
    HeldSignals,
    Interruption,
    TrainingInterrupted,
    interrupt_reason,
    release_accelerator,
)
from workbench.training.resume import reopen
from workbench.training.start import Start

ERROR_TAG_LIMIT = 5000  # characters of an exception kept in the run's ``error`` tag


@dataclass(frozen=True)
class RunSetup:
    """Everything decided before the run exists."""

    cfg: WorkbenchConfig
    derived: Derived
    uri: str
    client: MlflowClient  # the store itself; the run's writes go through its outbox
    experiment_id: str
    experiment_name: str  # for a run the store loses: re-created in an experiment of this name
    env_spec: EnvSpec  # ``vec_env=auto`` resolved
    vec_choice: VecEnvChoice
    torch_threads: int
    run_name: str
    tags: dict[str, str]


def setup_run(cfg: WorkbenchConfig, start: Start, *, tags: Mapping[str, str] | None = None,
              parent_run_id: str | None = None) -> RunSetup:
    """Open the store, choose the backend and threads, name and tag the run.

    Also configures this process for the run: torch's thread count and its deterministic
    algorithms (``repro.deterministic``, set for every run so that a notebook does not keep
    an earlier run's setting).
    """
    uri = resolve_tracking_uri(cfg.tracking.uri)
    check_experiments_writable()
    client = make_client(uri)
    experiment_id = (start.resumed.run.info.experiment_id if start.resumed
                     else ensure_experiment(client, cfg.tracking.experiment, uri))
    experiment_name = (client.get_experiment(experiment_id).name if start.resumed
                       else cfg.tracking.experiment)
    # env.vec_env=auto is resolved here, once, before the run exists (envs/calibration.py)
    vec_choice = choose_vec_env(start.env_spec(EnvSpec.from_config(cfg)))
    threads = cfg.torch_threads or auto_torch_threads(cfg.env.num_envs, vec_choice.name)
    torch.set_num_threads(threads)
    configure_determinism(cfg.repro.deterministic)
    run_tags = scrub({**run_tags_for(cfg), **cfg.tracking.tags, **(tags or {})})
    if parent_run_id:
        run_tags["mlflow.parentRunId"] = parent_run_id
    return RunSetup(
        cfg=cfg, derived=config.derive(cfg), uri=uri, client=client,
        experiment_id=experiment_id, experiment_name=experiment_name,
        env_spec=replace(EnvSpec.from_config(cfg), vec_env=vec_choice.name),
        vec_choice=vec_choice, torch_threads=threads,
        run_name=scrub(cfg.tracking.run_name or default_run_name(cfg)), tags=run_tags,
    )


def configure_determinism(deterministic: bool) -> None:
    """Switch torch's deterministic algorithms on or off for this process (``repro.*``).

    On CUDA, cuBLAS needs a fixed workspace to be deterministic; it reads
    ``CUBLAS_WORKSPACE_CONFIG`` when its handle is created, so this runs before the model
    exists (https://docs.pytorch.org/docs/stable/notes/randomness.html). Called for every run
    so a notebook that ran a deterministic run does not silently keep the setting.
    """
    if deterministic and torch.cuda.is_available():
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # Only when it changes: every call imports torch._inductor.
    current = (torch.are_deterministic_algorithms_enabled(),
               torch.is_deterministic_algorithms_warn_only_enabled())
    if current != (deterministic, False):
        torch.use_deterministic_algorithms(deterministic)


@dataclass
class TrainingRun:
    """The MLflow run being trained, and what must be released when it ends."""

    run: Run
    client: RunWriter  # every write of the run goes through its outbox
    config_yaml: str  # the resolved config, secrets masked, as stored with the run
    interruption: Interruption = field(default_factory=Interruption)
    recovery: RecoveryCallback | None = None
    manifest: dict[str, Any] | None = None
    envs: list[VecEnv] = field(default_factory=list)
    model: Any = None

    @property
    def run_id(self) -> str:
        return str(self.run.info.run_id)

    def record(self, setup: RunSetup, start: Start, run_info: Mapping[str, Any] | None) -> None:
        """Manifest (with the run's inputs, also logged as MLflow run inputs), params (a
        resumed run keeps its own: MLflow's are write-once), config."""
        cfg = setup.cfg
        self.manifest = manifest.record_manifest(
            self.client, self.run_id, start.run_info(run_info), seed=cfg.seed,
            keep_tags=list(setup.tags), inputs=start.inputs(),
        )
        log_run_inputs(self.client, self.run_id, self.manifest["inputs"],
                       start.robot.location if start.robot else None)
        if start.resumed is None:
            params = {**run_params(cfg, setup.derived, setup.torch_threads),
                      **setup.vec_choice.params(), **start.params()}
            log_params(self.client, self.run_id, scrub(params))
        self.client.log_text(self.run_id, self.config_yaml, "config.yaml")

    def own(self, venv: VecEnv) -> VecEnv:
        """``venv``, closed when the run ends (subprocess workers reaped)."""
        self.envs.append(venv)
        return venv

    def own_model(self, model: Any) -> Any:
        """``model``, whose GPU memory is released when the run ends (failed runs too)."""
        self.model = model
        return model

    def checkpoints(self, cfg: WorkbenchConfig, train_env: VecEnv, eval_env: VecEnv,
                    existing_steps: Sequence[int] = (), *, capture_every: int = 0,
                    keep_buffer: bool = True) -> RecoveryCallback:
        """The callback that snapshots, checkpoints, heartbeats and stops on request
        (off-policy: a snapshot every ``capture_every`` steps, the replay buffer in the
        checkpoints with ``keep_buffer``), evaluates them with ``checkpoint.keep=best`` and
        makes them the run's logged models."""
        self.recovery = RecoveryCallback(
            self.client, self.run_id, self.config_yaml, train_env, eval_env,
            every_steps=cfg.checkpoint.every_steps, keep_last=cfg.checkpoint.keep_last,
            interruption=self.interruption, existing_steps=existing_steps,
            capture_every=capture_every, keep_buffer=keep_buffer, keep=cfg.checkpoint.keep,
            eval_episodes=cfg.eval.n_episodes, experiment_id=self.run.info.experiment_id,
        )
        return self.recovery

    def learn(self, model: Any, total_timesteps: int, callbacks: Sequence[BaseCallback],
              *, resumed: bool, off_policy: bool = False) -> None:
        """``model.learn`` up to ``total_timesteps``; the first SIGINT/SIGTERM stops it after
        the current step (then :class:`TrainingInterrupted` is raised), a second at once.
        PPO and A2C dump their logs every iteration; the off-policy algorithms' logged points
        are the callbacks' (:class:`workbench.training.callbacks.OffPolicyIterationCallback`)."""
        with self.interruption.installed():
            model.learn(total_timesteps - model.num_timesteps,
                        callback=CallbackChain(list(callbacks)),
                        log_interval=None if off_policy else 1,
                        reset_num_timesteps=not resumed)
        if self.interruption.requested:
            raise self.interruption.error(f" at step {model.num_timesteps}")


@contextlib.contextmanager
def open_run(setup: RunSetup, start: Start) -> Iterator[TrainingRun]:
    """Create (or reopen) the run, own it, and end it with a truthful status.

    Every instant from the run's creation to its status being stored is covered: SIGINT and
    SIGTERM are held while the run is created and opened (outbox, resume, system metrics)
    and while its status is written and the outbox drained, and raised where the ``try``
    that marks the run KILLED owns them (:class:`workbench.training.faults.HeldSignals`).
    """
    store = setup.client
    held = HeldSignals().hold()  # a signal from here on waits for the try below
    try:
        # a resumed run continues as itself (workbench/training/resume.py)
        run = start.resumed.run if start.resumed else create_run(setup)
    except BaseException:
        held.release()  # no run exists: a held signal is raised now
        raise
    run_id = run.info.run_id
    writer: MlflowClient | RunWriter = store  # until the outbox exists: straight to the store
    training: TrainingRun | None = None
    monitor = None
    stopping = False
    try:
        training = open_outbox(setup, start, run)
        writer = training.client
        if setup.cfg.tracking.system_metrics:
            monitor = start_system_metrics(run_id, setup.uri,
                                           setup.cfg.tracking.system_metrics_interval_s,
                                           resume=start.resumed is not None)
        held.release()  # a signal that came while the run was opened is raised here
        yield training
        held.hold()
        writer.set_terminated(run_id, "FINISHED")
    except KeyboardInterrupt as exc:
        held.hold()
        stopping = True
        forced = training is not None and training.interruption.forced
        saved = save_last_good(training.recovery if training else None, write=not forced)
        writer.set_tag(run_id, "error", interrupt_reason(exc))
        writer.set_terminated(run_id, "KILLED")
        line = stopped_line(store_id(writer, run_id), "KILLED", saved,
                            notebook=from_notebook(setup))
        if from_notebook(setup) and isinstance(exc, TrainingInterrupted):
            # The notebook's one line: workbench.notebook.short_errors shows the exception's
            # message where a traceback would be, so it says where to resume from too.
            exc.args = (f"{exc}; {line}",)
        else:
            print(f"workbench: {line}", file=sys.stderr, flush=True)
        raise
    except BaseException as exc:
        held.hold()
        saved = save_last_good(training.recovery if training else None)
        error = scrub_command(f"{type(exc).__name__}: {exc}")
        writer.set_tag(run_id, "error", truncate(error, ERROR_TAG_LIMIT))
        writer.set_terminated(run_id, "FAILED")
        print("workbench: " + stopped_line(store_id(writer, run_id), "FAILED", saved,
                                           notebook=from_notebook(setup)),
              file=sys.stderr, flush=True)
        raise
    finally:
        try:
            if training is not None:
                close_envs(*training.envs)
                release_accelerator(training.model)
                if training.recovery is not None:
                    # Its last snapshot (policy and Adam state, cloned on the model's device) is
                    # written by now; a notebook's kept traceback would otherwise pin it on the
                    # GPU.
                    training.recovery.snapshot = None
            stop_system_metrics(monitor)
            if isinstance(writer, RunWriter):
                writer.close()  # drains the outbox (workbench/tracking/outbox.py)
        finally:
            held.release(deliver=not stopping)  # already stopping: a second signal adds nothing


def open_outbox(setup: RunSetup, start: Start, run: Run) -> TrainingRun:
    """The run's outbox (recording how the run was created), reopened on resume."""
    if start.resumed:
        skip_logged = reopen(setup.client, start.resumed)
        run = setup.client.get_run(run.info.run_id)  # as reopened: RUNNING, no old error
        origin = origin_of(run, setup.experiment_name, resumed_from_step=start.resumed.step)
    else:
        skip_logged, origin = {}, origin_of(run, setup.experiment_name)
    delivery = RunWriter(setup.uri, run.info.run_id, origin=origin, skip_logged=skip_logged)
    return TrainingRun(run, delivery, scrub_yaml(config.to_dict(setup.cfg)))


def store_id(writer: MlflowClient | RunWriter, run_id: str) -> str:
    """The run's id in the store (a run the store lost was re-created under a new id)."""
    return writer.store_run_id if isinstance(writer, RunWriter) else run_id


def create_run(setup: RunSetup) -> Run:
    """The new MLflow run; a store that refuses it (403) is bad input: nothing was created."""
    try:
        return setup.client.create_run(setup.experiment_id, run_name=setup.run_name,
                                       tags=setup.tags)
    except MlflowException as exc:
        if exc.error_code != "PERMISSION_DENIED":
            raise
        raise ConfigError(
            f"tracking server {redact_uri(setup.uri)}: your login may not create runs in "
            f"experiment {setup.cfg.tracking.experiment!r} (403); ask its owner for EDIT "
            "permission, or train into your own experiment (tracking.experiment=NAME)"
        ) from None


def from_notebook(setup: RunSetup) -> bool:
    """Whether a notebook started the run (its source tag, training/describe.py)."""
    return setup.tags.get("mlflow.source.type") == "NOTEBOOK"


def close_envs(*venvs: VecEnv | None) -> None:
    """Close environments (reaps subprocess workers); a crashed worker must not mask errors."""
    for venv in venvs:
        if venv is None:
            continue
        try:
            venv.close()
        except Exception as exc:  # a dead worker's pipe; the original error matters more
            print(f"warning: closing environments failed: {exc}", file=sys.stderr)


def stopped_line(run_id: str, status: str, saved: str | None, *, notebook: bool = False
                 ) -> str:
    """Where a stopped run's state is and how to continue it, in the form of what started it
    (the ``workbench train`` command, or the notebook's ``overrides`` parameter)."""
    how = (f'overrides = ["resume={run_id}"] in the notebook\'s parameters (papermill: '
           f'-y "overrides: [resume={run_id}]")' if notebook
           else f"workbench train resume={run_id}")
    where = f"checkpoint {saved}; resume with: {how}" if saved else "no checkpoint written"
    return f"run {run_id} {status}; {where}"
