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

Two records, two paths:

- **The run's own record goes through its outbox** (workbench.tracking.outbox), like every
  other write of a training: each evaluation as the run metrics above, and the best one as tag
  ``checkpoint.best_step`` and metric ``checkpoint/best_eval_mean_reward`` (at the best
  checkpoint's step). It survives an unreachable store and is what ``workbench export
  --checkpoint best`` and the reports read.
- **The logged models are written straight to the store, best effort**, by
  :class:`CheckpointModels`: the outbox journal has no logged-model operations, and a model id
  only exists once the store made it. While the outbox reports the store unreachable nothing
  is attempted (a training never waits on a down store); a failed call is kept and the whole
  state is brought up to date at the next checkpoint and at the end of training
  (:meth:`CheckpointModels.sync` is idempotent: it creates what is missing, fixes tags).
  Training never fails for it: what is still missing at the end is named in one warning, and
  the run's metrics above keep every evaluation. Its metric rows carry the journaled rows'
  timestamps, so the run gets each value once whichever write arrives first.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from mlflow.entities import LoggedModelOutput, LoggedModelStatus, Metric
from mlflow.tracking import MlflowClient

from workbench.tracking.store import truncate

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
                      ) -> dict[int, tuple[str, str]]:
    """The run's checkpoint logged models: step -> (model id, checkpoint path); the newest
    model of a step, if several."""
    found: dict[int, tuple[int, str, str]] = {}
    token = None
    while True:
        page = client.search_logged_models(
            [experiment_id], filter_string=f"source_run_id = '{run_id}'", page_token=token)
        for model in page:
            raw = model.params.get(STEP_PARAM, "")
            if model.model_type == MODEL_TYPE and raw.isdigit():
                step, created = int(raw), int(model.creation_timestamp or 0)
                if step not in found or created >= found[step][0]:
                    found[step] = (created, model.model_id, model.params.get(PATH_PARAM, ""))
        token = page.token
        if not token:
            return {step: (model_id, path) for step, (_, model_id, path) in found.items()}


@dataclass
class Wanted:
    """What the store should hold for one checkpoint, and how far it got."""

    path: str
    evaluation: CheckpointEvaluation | None
    best: bool = False
    stored: bool = True
    model_id: str | None = None
    metrics_logged: bool = False
    ready: bool = False
    tags_sent: dict[str, str] = field(default_factory=dict)

    def tags(self) -> dict[str, str]:
        return {BEST_TAG: str(self.best).lower(), STORED_TAG: str(self.stored).lower(),
                **({REUSED_TAG: str(self.evaluation.reused).lower()} if self.evaluation else {})}


class CheckpointModels:
    """The logged models of one run's checkpoints, kept in line with what training decided.

    ``run_id`` and ``unreachable`` are read at each sync: the run's id in the store and
    whether the outbox currently finds the store unreachable (then nothing is attempted). A
    run the store lost is re-created by the outbox under a new id, in that store's experiment
    of the same name: its logged models are then made anew there (those of an earlier
    process, adopted on resume, without their evaluation).
    """

    def __init__(self, store: MlflowClient, experiment_id: str, run_id: Callable[[], str],
                 unreachable: Callable[[], bool] = lambda: False) -> None:
        self.store = store
        self.experiment_id = experiment_id
        self.run_id = run_id
        self.unreachable = unreachable
        self.wanted: dict[int, Wanted] = {}
        self.last_error: str | None = None
        self.made_for = run_id()  # the run id the model ids in ``wanted`` belong to

    def adopt(self, stored_steps: Collection[int]) -> None:
        """A resumed run: take over the logged models its earlier processes made, so that
        the best tag can move off them and retention can mark them deleted (their tags are
        brought in line at the next sync). Best effort, as every store call here."""
        if self.unreachable():
            return
        try:
            existing = checkpoint_models(self.store, self.experiment_id, self.run_id())
        except Exception as exc:  # the store is away or refuses: the models stay as they are
            self.last_error = truncate(f"{type(exc).__name__}: {exc}".splitlines()[0], 200)
            return
        for step, (model_id, path) in existing.items():
            self.wanted.setdefault(step, Wanted(
                path=path, evaluation=None, stored=step in stored_steps, model_id=model_id,
                metrics_logged=True, ready=True))

    def add(self, step: int, path: str, evaluation: CheckpointEvaluation | None) -> None:
        """A checkpoint was written (its logged model is made at the next sync)."""
        self.wanted[step] = Wanted(path, evaluation)

    def set_best(self, step: int) -> None:
        """The checkpoint of ``step`` is the run's best; no other one is."""
        for each_step, wanted in self.wanted.items():
            wanted.best = each_step == step

    def set_deleted(self, step: int) -> None:
        """Retention deleted the checkpoint of ``step`` from the run's artifacts."""
        if step in self.wanted:
            self.wanted[step].stored = False

    def missing(self) -> list[int]:
        """Steps whose logged model is not (fully) in the store yet."""
        return sorted(step for step, w in self.wanted.items()
                      if not w.ready or w.tags_sent != w.tags())

    def sync(self) -> bool:
        """Bring the store in line (create, log metrics, finalize, tag); True when it is.

        Never raises: a failure stops this sync and is retried at the next.
        """
        if self.unreachable():
            self.last_error = "the tracking store is unreachable"
            return False
        try:
            self._follow_recreated_run()
            for step in sorted(self.wanted):
                self._sync_one(step, self.wanted[step])
        except Exception as exc:  # the store is away or refused a write: retried next time
            self.last_error = truncate(f"{type(exc).__name__}: {exc}".splitlines()[0], 200)
            return False
        self.last_error = None
        return True

    def _follow_recreated_run(self) -> None:
        """The outbox re-created the run under a new id: its experiment, and no model yet."""
        run_id = self.run_id()
        if run_id == self.made_for:
            return
        self.experiment_id = self.store.get_run(run_id).info.experiment_id
        for wanted in self.wanted.values():
            wanted.model_id, wanted.metrics_logged, wanted.ready = None, False, False
            wanted.tags_sent = {}
        self.made_for = run_id

    def _sync_one(self, step: int, wanted: Wanted) -> None:
        run_id = self.run_id()
        if wanted.model_id is None:
            if not wanted.path:
                return
            model = self.store.create_logged_model(
                experiment_id=self.experiment_id, name=f"checkpoint-step-{step}",
                source_run_id=run_id, model_type=MODEL_TYPE, tags=wanted.tags(),
                params={PATH_PARAM: wanted.path, STEP_PARAM: str(step)})
            wanted.model_id, wanted.tags_sent = model.model_id, wanted.tags()
            self.store.log_outputs(run_id, [LoggedModelOutput(model.model_id, step)])
        if not wanted.metrics_logged:
            if wanted.evaluation is not None:
                self.store.log_batch(run_id, metrics=wanted.evaluation.metrics(wanted.model_id))
            wanted.metrics_logged = True
        if not wanted.ready:
            self.store.finalize_logged_model(wanted.model_id, LoggedModelStatus.READY)
            wanted.ready = True
        if wanted.tags_sent != wanted.tags():
            self.store.set_logged_model_tags(wanted.model_id, wanted.tags())
            wanted.tags_sent = wanted.tags()

    def close(self) -> None:
        """The last sync (end of training); one warning naming what is still missing."""
        if self.sync() or not self.missing():
            return
        steps = ", ".join(str(s) for s in self.missing())
        print(f"workbench: warning: the logged models of checkpoints at step(s) {steps} are "
              f"not (fully) in the tracking store ({self.last_error}); their evaluations are "
              f"kept in the run's metrics {EVAL_MEAN_KEY} and {EVAL_STD_KEY}",
              file=sys.stderr, flush=True)


def now_ms() -> int:
    """MLflow's timestamps: milliseconds since the epoch."""
    return int(time.time() * 1000)
