"""One trial, seen from its kernel: the Optuna trial that ``notebooks/train.ipynb`` trains
for, the reporter its :class:`~workbench.training.callbacks.TrialCallback` talks to, and the
run tags that say what was sampled.

The study's storage URL comes through the kernel's environment (``WORKBENCH_TUNE_STORAGE``,
never a notebook parameter: a URL may hold a password); the objective and the pruner come
from the study itself (its user attributes, written by the driver), so a trial reports and
is pruned exactly as its study says.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from workbench.config import ConfigError
from workbench.training.callbacks import CONTINUE, PRUNE, STOP, TrialCallback
from workbench.tuning.methods import PRUNER_ATTR, build_pruner
from workbench.tuning.objectives import Evaluation, Objective
from workbench.tuning.storage import PRUNED_AT, open_storage, quiet_optuna

STORAGE_ENV = "WORKBENCH_TUNE_STORAGE"
OBJECTIVE_ATTR = "workbench.objective"  # study user attr: Objective.as_dict()
# study user attr: tune.seeds; a study over seeds is pruned by its driver between seeds, so
# its trials' kernels train on the study's clock without reporting
SEEDS_ATTR = "workbench.seeds"
# a re-check run's kernel environment: its study, whose clock and budget the run trains on
CHECK_ENV = "WORKBENCH_TUNE_CHECK"


@dataclass
class TrialSession:
    """What a notebook execution adds to ``train``: run tags and callbacks (none outside a
    study)."""

    tags: dict[str, str] = field(default_factory=dict)
    callbacks: list[Any] = field(default_factory=list)


class ClockReporter:
    """A :class:`~workbench.training.callbacks.TrialReporter` that reports to no one: the
    study's clock and budget for a run no Optuna trial follows step by step (one seed of a
    trial in a study over seeds, pruned by its driver between seeds; a run of the re-check).
    Training stops at the budget or once the objective is settled, and records the curve
    (``trial/eval_train_s``) that the driver scores it from."""

    def __init__(self, objective: Objective) -> None:
        self.objective = objective
        self.budget_s = objective.budget_s
        self.curve: list[Evaluation] = []

    def progress(self, train_s: float, steps: int, mean_return: float | None) -> str:
        if mean_return is not None:
            self.curve.append(Evaluation(train_s, steps, mean_return))
        if self.pruned(train_s, steps):
            return PRUNE
        return STOP if self.objective.settled(self.curve) else CONTINUE

    def pruned(self, train_s: float, steps: int) -> bool:
        """Report what is due and say whether the trial is pruned: nothing to report here."""
        return False


class OptunaReporter(ClockReporter):
    """The :class:`~workbench.training.callbacks.TrialReporter` of an Optuna trial: reports
    each due value to it and answers PRUNE when its pruner says so."""

    def __init__(self, trial: Any, objective: Objective) -> None:
        super().__init__(objective)
        self.trial = trial
        self.done = 0  # the last report made

    def pruned(self, train_s: float, steps: int) -> bool:
        for k, value in self.objective.reports(self.curve, train_s, self.done):
            self.trial.report(value, k)
            self.done = k
            if self.trial.should_prune():
                self.trial.set_user_attr(PRUNED_AT, {"report": k, "value": value,
                                                     "train_s": round(train_s, 3),
                                                     "steps": steps})
                return True
        return False


def study_storage(study_name: str, what: str) -> Any:
    """The storage of the study the kernel's environment names (``what``: the parameter or
    variable that named the study, for the error)."""
    quiet_optuna()
    url = os.environ.get(STORAGE_ENV)
    if not url:
        raise ConfigError(f"{what}={study_name!r}: {STORAGE_ENV} is not set; "
                          "trials are started by `workbench tune`, which sets it")
    return open_storage(url, heartbeat=False)


def open_check(study_name: str) -> TrialSession:
    """A run of ``study_name``'s re-check: its clock and budget, no trial to report to (its
    tags come with the run's sweep point)."""
    storage = study_storage(study_name, CHECK_ENV)
    try:
        study_id = storage.get_study_id_from_name(study_name)
    except KeyError as exc:
        raise ConfigError(f"{CHECK_ENV}={study_name!r}: no such study in the storage") from exc
    objective = Objective.from_dict(storage.get_study_user_attrs(study_id)[OBJECTIVE_ATTR])
    return TrialSession(callbacks=[TrialCallback(ClockReporter(objective))])


def open_trial(study_name: str, number: int) -> TrialSession:
    """The session of trial ``number`` of ``study_name``; bad settings: :class:`ConfigError`."""
    import optuna

    storage = study_storage(study_name, "notebook parameter study")
    try:
        study_id = storage.get_study_id_from_name(study_name)
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, number)
    except KeyError as exc:
        raise ConfigError(f"notebook parameters study={study_name!r} trial={number}: no such "
                          "trial in the study's storage") from exc
    attrs = storage.get_study_user_attrs(study_id)
    objective = Objective.from_dict(attrs[OBJECTIVE_ATTR])
    study = optuna.load_study(study_name=study_name, storage=storage,
                              sampler=optuna.samplers.RandomSampler(),  # kernels never sample
                              pruner=build_pruner(attrs.get(PRUNER_ATTR, {"name": "none"})))
    trial = optuna.trial.Trial(study, trial_id)
    frozen = storage.get_trial(trial_id)
    tags = trial_tags(study_name, number, frozen.params, objective)
    if attrs.get(SEEDS_ATTR):  # pruned between seeds by the driver: the clock only
        return TrialSession(tags=tags, callbacks=[TrialCallback(ClockReporter(objective))])
    return TrialSession(tags=tags, callbacks=[TrialCallback(OptunaReporter(trial, objective))])


def trial_tags(study: str, number: int, values: dict[str, Any], objective: Objective
               ) -> dict[str, str]:
    """The trial's run tags: study, trial number, one ``tune.param.<key>`` per sampled value,
    and the description MLflow's UI shows."""
    sampled = ", ".join(f"{k}={format_value(v)}" for k, v in values.items())
    tags = {"tune.study": study, "tune.trial": str(number), "tune.role": "trial",
            "mlflow.note.content": f"Trial {number} of study {study}: sampled {sampled}; "
                                   f"objective {objective.describe()}."}
    tags.update({f"tune.param.{k}": format_value(v) for k, v in values.items()})
    return tags


def format_value(value: Any) -> str:
    """``0.000312`` as ``0.000312``, floats with 4 significant digits."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)
