"""A run's checkpoints as MLflow logged models, and the run's record of its best checkpoint.

Every checkpoint a training writes (``checkpoints/step-<N>/``, workbench.training.checkpoint)
becomes an MLflow 3 ``LoggedModel`` of the run's experiment: ``source_run_id`` the run, params
``checkpoint.path`` and ``checkpoint.step``, its deterministic evaluation as model metrics
(``checkpoint/eval_mean_reward``, ``checkpoint/eval_std_reward`` at the checkpoint's step,
linked to the run too), the run's output at that step, status READY. Its tags say whether the
checkpoint is still in the run's artifacts (``checkpoint.stored``, false once retention deleted
it: the model stays as the record of how that checkpoint evaluated) and which one is the run's
best (``checkpoint.best=true``, moved when a better one arrives). Find them with
``MlflowClient().search_logged_models([experiment_id], filter_string="source_run_id = '<id>'")``.

The evaluations are not logged under ``eval/*``: MLflow writes a model-linked metric into the
run as well, and the run's ``eval/mean_reward`` curve (reports, tuning objectives) holds the
periodic evaluations only.

Both records go through the run's writer (workbench.tracking.outbox), journaled like every
other write of a training, so both survive a store that is down (at start or later) and are
delivered by ``workbench runs sync`` after a crash:

- **the run's own record**: each evaluation as the run metrics above, and the best one as tag
  ``checkpoint.best_step`` and metric ``checkpoint/best_eval_mean_reward`` (at the best
  checkpoint's step). It is what ``workbench export --checkpoint best`` and the reports read;
- **the logged models**: :class:`CheckpointModels` publishes the whole state they should be
  in after every checkpoint (which exist, their evaluations, the best, which are still
  stored), and :func:`sync_logged_models` brings the store in line, idempotently (it finds
  the models already made by their ``source_run_id`` and step). Only the newest state not yet
  delivered counts. Their metric rows carry the journaled rows' timestamps, so the run gets
  each value once whichever write arrives first.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from mlflow.entities import LoggedModel, LoggedModelOutput, LoggedModelStatus, Metric
from mlflow.tracking import MlflowClient

EVAL_MEAN_KEY = "checkpoint/eval_mean_reward"
EVAL_STD_KEY = "checkpoint/eval_std_reward"
BEST_VALUE_KEY = "checkpoint/best_eval_mean_reward"  # run metric, at the best one's step
BEST_STEP_TAG = "checkpoint.best_step"  # run tag
PATH_PARAM = "checkpoint.path"  # logged model params
STEP_PARAM = "checkpoint.step"
BEST_TAG = "checkpoint.best"  # logged model tags
STORED_TAG = "checkpoint.stored"
REUSED_TAG = "checkpoint.eval_reused"  # the periodic evaluation of the same weights was reused
MODEL_TYPE = "workbench-checkpoint"


@dataclass(frozen=True)
class CheckpointEvaluation:
    """The deterministic evaluation of one checkpoint's policy."""

    step: int
    mean: float
    std: float
    timestamp_ms: int
    reused: bool = False  # taken from the periodic evaluation of the same weights

    def metrics(self, model_id: str | None = None) -> list[Metric]:
        """The run's (and, with ``model_id``, the logged model's) metric rows."""
        return [Metric(key, float(value), self.timestamp_ms, self.step, model_id=model_id)
                for key, value in ((EVAL_MEAN_KEY, self.mean), (EVAL_STD_KEY, self.std))]


@dataclass(frozen=True)
class BestCheckpoint:
    """A run's best-evaluated checkpoint, as its record says."""

    step: int
    value: float  # mean deterministic return

    def line(self) -> str:
        """``step 4096: 123.4 (deterministic eval)``."""
        return f"step {self.step}: {self.value:.1f} (deterministic eval)"


def best_checkpoint(tags: Mapping[str, str], metrics: Mapping[str, float]
                    ) -> BestCheckpoint | None:
    """The run's best checkpoint from its tags and latest metrics (``run.data``), if any."""
    raw, value = tags.get(BEST_STEP_TAG), metrics.get(BEST_VALUE_KEY)
    if raw is None or value is None or not raw.isdigit():
        return None
    return BestCheckpoint(int(raw), float(value))


def is_better(value: float, best: float | None) -> bool:
    """``value`` beats ``best`` (strictly: a tie keeps the earlier checkpoint); NaN never."""
    return math.isfinite(value) and (best is None or value > best)


def checkpoint_models(client: MlflowClient, experiment_id: str, run_id: str
                      ) -> dict[int, LoggedModel]:
    """The run's checkpoint logged models by step (the newest model of a step, if several)."""
    found: dict[int, LoggedModel] = {}
    token = None
    while True:
        page = client.search_logged_models(
            [experiment_id], filter_string=f"source_run_id = '{run_id}'", page_token=token)
        for model in page:
            raw = model.params.get(STEP_PARAM, "")
            if model.model_type != MODEL_TYPE or not raw.isdigit():
                continue
            step = int(raw)
            if step not in found or (model.creation_timestamp or 0) >= (
                    found[step].creation_timestamp or 0):
                found[step] = model
        token = page.token
        if not token:
            return found


def model_tags(best: bool, stored: bool, evaluation: Mapping[str, Any] | None
               ) -> dict[str, str]:
    """A checkpoint model's tags: best, still stored, its evaluation reused."""
    tags = {BEST_TAG: str(best).lower(), STORED_TAG: str(stored).lower()}
    if evaluation is not None:
        tags[REUSED_TAG] = str(bool(evaluation["reused"])).lower()
    return tags


def sync_logged_models(store: MlflowClient, run_id: str, state: Mapping[str, Any]) -> None:
    """Bring the run's checkpoint logged models in line with ``state`` (what
    :class:`CheckpointModels` publishes); idempotent, so the run's writer can deliver it
    again after a failure, an outage or a crash (``workbench runs sync``).

    Each checkpoint of ``state["checkpoints"]`` gets its model (created if missing, its
    evaluation logged as model metrics, finalized READY), tagged best or not and stored or
    not (``state["stored"]``); models of checkpoints it does not list (an earlier process's,
    on resume) keep their record, their tags brought in line.
    """
    experiment_id = store.get_run(run_id).info.experiment_id
    existing = checkpoint_models(store, experiment_id, run_id)
    stored = {int(step) for step in state.get("stored", ())}
    wanted = {int(step): value for step, value in state.get("checkpoints", {}).items()}
    for step in sorted(set(existing) | set(wanted)):
        want = wanted.get(step)
        evaluation = want["evaluation"] if want else None
        tags = model_tags(bool(want and want["best"]), step in stored, evaluation)
        model = existing.get(step)
        if model is None and want is None:
            continue
        if model is None:
            assert want is not None
            model = store.create_logged_model(
                experiment_id=experiment_id, name=f"checkpoint-step-{step}",
                source_run_id=run_id, model_type=MODEL_TYPE, tags=tags,
                params={PATH_PARAM: want["path"], STEP_PARAM: str(step)})
            store.log_outputs(run_id, [LoggedModelOutput(model.model_id, step)])
        if model.status != LoggedModelStatus.READY:
            if evaluation is not None:
                store.log_batch(run_id, metrics=evaluation_metrics(step, evaluation,
                                                                   model.model_id))
            store.finalize_logged_model(model.model_id, LoggedModelStatus.READY)
        if {k: model.tags.get(k) for k in tags} != tags:
            store.set_logged_model_tags(model.model_id, tags)


def evaluation_metrics(step: int, evaluation: Mapping[str, Any], model_id: str
                       ) -> list[Metric]:
    """A checkpoint's evaluation as model-linked metric rows (the journaled run rows'
    timestamps, so the run holds each value once)."""
    return CheckpointEvaluation(step, float(evaluation["mean"]), float(evaluation["std"]),
                                int(evaluation["timestamp_ms"])).metrics(model_id)


class CheckpointModels:
    """The state a run's checkpoint logged models should be in, published whole through the
    run's writer (journaled and delivered by :func:`sync_logged_models`): each checkpoint
    with its path, its evaluation and whether it is the best, and which checkpoints are still
    in the run's artifacts."""

    def __init__(self, publish: Callable[[dict[str, Any]], None],
                 stored_steps: Collection[int] = ()) -> None:
        self.publish_state = publish
        self.checkpoints: dict[int, dict[str, Any]] = {}
        self.stored = set(stored_steps)  # a resumed run's checkpoints are in its artifacts

    def add(self, step: int, path: str, evaluation: CheckpointEvaluation | None) -> None:
        """A checkpoint was written."""
        self.checkpoints[step] = {"path": path, "best": False, "evaluation": None if
                                  evaluation is None else {
                                      "mean": evaluation.mean, "std": evaluation.std,
                                      "timestamp_ms": evaluation.timestamp_ms,
                                      "reused": evaluation.reused}}
        self.stored.add(step)

    def set_best(self, step: int) -> None:
        """The checkpoint of ``step`` is the run's best; no other one is."""
        for each_step, checkpoint in self.checkpoints.items():
            checkpoint["best"] = each_step == step

    def set_deleted(self, step: int) -> None:
        """Retention deleted the checkpoint of ``step`` from the run's artifacts."""
        self.stored.discard(step)

    def publish(self) -> None:
        """Hand the whole state to the run's writer."""
        self.publish_state({"checkpoints": {str(k): v for k, v in self.checkpoints.items()},
                            "stored": sorted(self.stored)})


def now_ms() -> int:
    """MLflow's timestamps: milliseconds since the epoch."""
    return int(time.time() * 1000)
