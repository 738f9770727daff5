"""Resuming a run from its last checkpoint: ``workbench train resume=<run_id>``.

Run identity: **the same MLflow run is reopened** (status back to RUNNING, tags
``resume.count`` and ``resume.from_step``; the previous ``error`` tag moves to
``resume.previous_error``). One run keeps one curve, one row in the run table, and its sweep
tags. Metric steps continue from the checkpoint's ``num_timesteps``; iterations between the
checkpoint and the interruption are computed again, and the values the store already holds
for them are not logged a second time (:class:`workbench.tracking.outbox.RunWriter`'s
``skip_logged``), so every key's steps stay strictly increasing.

Configuration: a resumed run keeps the configuration it was trained with (the checkpoint's
``config.yaml``). Only keys that do not change what is computed may be given with
``resume=``: :data:`MAY_CHANGE` (``total_timesteps`` extends or shortens the budget). Every
problem (unknown run, no or a corrupt checkpoint, a run still alive, a forbidden override,
nothing left to train) is a :class:`ConfigError`: exit code 2 before anything starts.

Trust: the store is data. A checkpoint's ``config.yaml`` whose ``env.id`` is ``module:Id``
would make gymnasium import ``module``, so it is refused unless the command line names that
same ``env.id`` itself (the one key outside :data:`MAY_CHANGE` that may be given, and only
with the run's own value): the user, not the store, then chooses to import the module, as
with a Hub bundle's (:func:`workbench.training.bundle.pull_for_init`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow.entities import Run, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf

from workbench import config, paths
from workbench.claims import claim_holder, exclusive_claim
from workbench.config import ConfigError, WorkbenchConfig
from workbench.envs.checks import check_data_env_id, split_env_id
from workbench.tracking import outbox, permissions, runs
from workbench.tracking.redaction import redact_uri
from workbench.tracking.store import is_embedded, make_client, resolve_tracking_uri
from workbench.training.checkpoint import (
    CorruptCheckpoint,
    download,
    misfit,
    stored_checkpoints,
)

# Keys a resume may set (prefixes end at a dot boundary). Everything else must match the run.
MAY_CHANGE = (
    "resume", "total_timesteps", "console", "checkpoint", "tracking.uri", "tracking.tags",
    "tracking.run_name", "tracking.system_metrics", "tracking.system_metrics_interval_s",
    "torch_threads", "device",
)
# May be given with resume= only to repeat the run's own value (to allow its module:Id).
CONFIRMS = "env.id"
RESUME_TRUST_HINT = ("add env.id={env_id} to the command line if you trust that module; "
                     "it then imports as your own env.id would")


@dataclass
class ResumePoint:
    """A run to continue and the checkpoint it continues from."""

    run: Run
    step: int
    artifact_path: str
    state: dict[str, Any]
    config: WorkbenchConfig
    config_yaml: str
    stored_steps: list[int]
    incomplete: list[str]
    uri: str = ""  # the store the run was found in

    @property
    def run_id(self) -> str:
        return self.run.info.run_id


def may_change(key: str) -> bool:
    """True for config keys a resume may set."""
    return any(key == p or key.startswith(p + ".") for p in MAY_CHANGE)


def override_keys(overrides: Sequence[str]) -> list[str]:
    """The keys (or group names) of Hydra overrides, e.g. ``["resume", "total_timesteps"]``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    return [parser.parse_override(o).key_or_group for o in overrides]


def resume_config(composed: DictConfig, overrides: Sequence[str]) -> WorkbenchConfig:
    """The config of ``resume=<id>``: the run's own, plus the command's allowed overrides."""
    run_id = str(composed.resume)
    keys = override_keys(overrides)
    for key in keys:
        if not may_change(key) and key != CONFIRMS:
            raise ConfigError(
                f"{key}: cannot be changed when resuming run {run_id} (a resumed run keeps its "
                f"configuration); only {', '.join(k for k in MAY_CHANGE if k != 'resume')} may "
                "be given with resume="
            )
    uri = resolve_tracking_uri(composed.tracking.uri)
    point = find(run_id, uri)
    given = OmegaConf.select(composed, CONFIRMS) if CONFIRMS in keys else None
    check_stored_env_id(run_id, point.config.env.id, given)
    merged = OmegaConf.create(config.to_dict(point.config))
    # The store the run was found in is where it continues (the saved URI has its password
    # masked, see workbench.tracking.manifest.scrub).
    for key in {*keys, "tracking.uri"}:
        OmegaConf.update(merged, key, OmegaConf.select(composed, key), merge=False)
    return config.validate(merged)


def check_stored_env_id(run_id: str, stored: str, given: str | None) -> None:
    """The checkpoint's ``env.id`` imports nothing unless ``given`` (the command line's
    ``env.id``) repeats it; ``given`` may not change it either."""
    if given is not None and given != stored:
        raise ConfigError(
            f"env.id: cannot be changed when resuming run {run_id} (a resumed run keeps its "
            f"configuration: env.id={stored!r}); drop env.id= or start a new run"
        )
    module, _ = split_env_id(stored) if stored.count(":") == 1 else (None, stored)
    try:
        check_data_env_id(stored, [module] if module and given else [],
                          RESUME_TRUST_HINT.format(env_id=stored))
    except ConfigError as exc:
        raise ConfigError(f"resume={run_id}: the checkpoint's {exc}") from exc


def find(run_id: str, uri: str) -> ResumePoint:
    """The run ``run_id`` in store ``uri`` and its newest complete checkpoint.

    Reads only; raises :class:`ConfigError` naming the problem and the fix.
    """
    if is_embedded(uri) and not Path(uri.removeprefix("sqlite:///")).exists():
        raise not_found(run_id, uri)
    client = make_client(uri)
    try:
        run = client.get_run(run_id)
    except MlflowException as exc:
        raise not_found(run_id, uri) from exc
    if run.info.lifecycle_stage == "deleted":
        raise ConfigError(f"resume={run_id}: the run is deleted; restore it in MLflow first")
    check_may_write(client, run, uri)
    check_not_alive(run)
    if outbox.outboxes(run_id):  # deliver what the store did not get yet (checkpoints too)
        for result in runs.sync_outboxes(uri, run_id):
            if result.left:
                raise ConfigError(
                    f"resume={run_id}: the run's outbox {outbox.outbox_root() / run_id} still "
                    f"holds writes the store did not accept ({result.note}); run `workbench "
                    "runs sync` once the store is reachable, then resume"
                )
    stored = stored_checkpoints(client, run_id)
    complete = [c for c in stored if c.complete]
    if not complete:
        raise ConfigError(
            f"resume={run_id}: the run has no complete checkpoint (checkpoint.every_steps was "
            f"{run.data.params.get('checkpoint.every_steps', 'not set')}); start a new run"
        )
    latest = complete[-1]
    with tempfile.TemporaryDirectory(prefix="workbench-resume-") as tmp:
        try:
            state, config_yaml = download(client, run_id, latest, Path(tmp))
        except CorruptCheckpoint as exc:
            raise ConfigError(
                f"resume={run_id}: checkpoint {latest.path} is corrupt: {exc}; delete that "
                "folder from the run's artifacts to resume from the one before, or start a "
                "new run"
            ) from exc
    try:
        saved = config.from_yaml(config_yaml)
    except ConfigError as exc:
        raise ConfigError(
            f"resume={run_id}: the checkpoint's config.yaml no longer fits the schema ({exc})"
        ) from exc
    return ResumePoint(
        run=run, step=latest.step, artifact_path=latest.path, state=state, config=saved,
        config_yaml=config_yaml, stored_steps=[c.step for c in complete],
        incomplete=[c.path for c in stored if not c.complete], uri=uri,
    )


def not_found(run_id: str, uri: str) -> ConfigError:
    """The error for a resume id the store does not know."""
    return ConfigError(
        f"resume={run_id}: no such run in the tracking store {redact_uri(uri)}; "
        "copy the id from `workbench train`'s last line or the MLflow UI, and check "
        "MLFLOW_TRACKING_URI / tracking.uri"
    )


def check_may_write(client: MlflowClient, run: Run, uri: str) -> None:
    """A team server that would refuse the resume's writes (this login has READ on the run's
    experiment) is asked first: one line, before anything is written or downloaded."""
    access = permissions.experiment_access(uri, run.info.experiment_id)
    if access is None or access.can_write:
        return
    name = client.get_experiment(run.info.experiment_id).name
    raise ConfigError(
        f"resume={run.info.run_id}: " + permissions.write_refusal(
            access, f"run {run.info.run_id}", f"experiment {name!r}")
        + f" on experiment {name!r}, or train a new run in your own experiment"
    )


def check_not_alive(run: Run) -> None:
    """Refuse to resume a run whose process may still be training it."""
    if run.info.status != "RUNNING":
        return
    age = runs.heartbeat_age_s(run)
    if age <= runs.DEFAULT_STALE_AFTER_S:
        raise ConfigError(
            f"resume={run.info.run_id}: the run is RUNNING with a heartbeat {int(age)} s old "
            "(its training may still be alive); if its process is gone, mark it KILLED with "
            f"`workbench runs reap --older-than {int(age)}` once the heartbeat is over "
            f"{runs.LIVE_WINDOW_S:g} s old (younger ones are live and never reaped), then resume"
        )


def prepare(cfg: WorkbenchConfig, uri: str) -> ResumePoint:
    """Find the checkpoint for ``cfg.resume`` and check ``cfg`` against the run's config."""
    assert cfg.resume
    point = find(cfg.resume, uri)
    given = config.flatten(config.to_dict(cfg))
    saved = config.flatten(config.to_dict(point.config))
    for key in sorted(set(given) | set(saved)):
        if not may_change(key) and given.get(key) != saved.get(key):
            raise ConfigError(
                f"resume={cfg.resume}: {key}={given.get(key)!r} differs from the run's "
                f"{saved.get(key)!r}; a resumed run keeps its configuration (compose it with "
                "load_config(['resume=<id>', ...]) or start a new run)"
            )
    if point.step >= cfg.total_timesteps:
        raise ConfigError(
            f"resume={cfg.resume}: the last checkpoint is at step {point.step}, which reaches "
            f"total_timesteps={cfg.total_timesteps}; raise total_timesteps to train further"
        )
    check_fits(point, cfg)
    return point


def check_fits(point: ResumePoint, cfg: WorkbenchConfig) -> None:
    """The checkpoint's arrays have the shapes the run's network and environments take.

    Matching hashes only say the files are the ones ``state.json`` lists, and a checkpoint
    is data: one written for another network or task, or forged with its hashes recomputed,
    is refused here, before the run is reopened, instead of failing inside torch once the run
    is RUNNING (which would mark a FINISHED run FAILED).
    """
    problem = misfit(point.state, cfg)
    if problem:
        raise ConfigError(
            f"resume={point.run_id}: checkpoint {point.artifact_path} does not fit the "
            f"run's model: {problem}; delete that folder from the run's artifacts to resume "
            "from the one before, or start a new run"
        )


def claim_path(run_id: str) -> Path:
    """The claim of a run being resumed on this machine: ``experiments/resume/<id>.claim``."""
    return paths.experiments_dir() / "resume" / f"{run_id}.claim"


@contextlib.contextmanager
def resume_claim(point: ResumePoint) -> Iterator[None]:
    """This process alone continues the run, on this machine, for the block.

    Two ``workbench train resume=<id>`` of one run at once would both reopen it: one dies,
    leaving its error on the run the other finishes, and metric steps repeat. The claim
    (:func:`workbench.claims.exclusive_claim`, removed when released) is taken once the
    checkpoint is checked and before anything is written; the second resume is refused in one
    line. The run is read again under the claim: a resume that finished while this one was
    being prepared changed it, and this one's checkpoint is no longer the newest.
    """
    path = claim_path(point.run_id)
    with exclusive_claim(path, remove=True) as held:
        if not held:
            raise ConfigError(
                f"resume={point.run_id}: another `workbench train resume={point.run_id}` on "
                f"this machine (pid {claim_holder(path)}) is continuing this run; wait for it "
                "to end (or stop it), then resume again if it has steps left"
            )
        now = make_client(point.uri).get_run(point.run_id).info
        then = point.run.info
        if (now.status, now.end_time) != (then.status, then.end_time):
            raise ConfigError(
                f"resume={point.run_id}: the run changed while this resume was prepared "
                f"(another resume of it ran meanwhile; it is {now.status} now); resume again "
                "to continue from its newest checkpoint"
            )
        yield


def reopen(client: MlflowClient, point: ResumePoint) -> dict[str, int]:
    """Mark the run RUNNING again; returns the last logged step of each metric key."""
    run_id = point.run_id
    tags = point.run.data.tags
    count = int(tags.get("resume.count", "0")) + 1
    new_tags = [RunTag("resume.count", str(count)), RunTag("resume.from_step", str(point.step)),
                RunTag("resume.exact", str(bool(point.state["exact"])).lower())]
    if "error" in tags:
        new_tags.append(RunTag("resume.previous_error", tags["error"]))
    client.log_batch(run_id, tags=new_tags)
    for key in ("error", runs.REAPED_TAG):
        if key in tags:
            client.delete_tag(run_id, key)
    client.update_run(run_id, status="RUNNING")
    logged = {}
    for key in point.run.data.metrics:
        history = client.get_metric_history(run_id, key)
        if history:
            logged[key] = max(m.step for m in history)
    return logged


def discard_incomplete(client: outbox.RunWriter, point: ResumePoint) -> None:
    """Remove checkpoint folders the interrupted process left without their state.json."""
    for path in point.incomplete:
        client.delete_artifacts(point.run_id, path)


def same_backend(spec: Any, point: ResumePoint | None) -> Any:
    """``spec`` with ``vec_env=auto`` pinned to the backend the run was trained with.

    ``auto`` measures the machine (workbench.envs.calibration) and could pick another backend
    now; continuing on the same one is what keeps a resume exact.
    """
    chosen = point.run.data.params.get("derived.vec_env") if point else None
    if spec.vec_env != "auto" or not chosen:
        return spec
    return dataclasses.replace(spec, vec_env=chosen)
