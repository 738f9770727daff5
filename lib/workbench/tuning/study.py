"""``workbench tune``: an Optuna study whose trials are executions of ``notebooks/train.ipynb``.

Data flow::

    overrides --plan_tune--> TunePlan (validated; nothing computed or written yet)
      --> the study in its RDB storage (created or joined) + one MLflow parent run
      --> while trials are left (tune.n_trials in total, every worker counted):
            claim (under the storage's lock): ask Optuna, sample the space
            --> backend: papermill -> fresh kernel -> train() as a child run, the kernel
                reporting evaluations to its Optuna trial (pruning)
            --> tell: COMPLETE with the objective, PRUNED, or FAIL
      --> the best trial as experiment=tuned/<study>, the parent closed, the result table

Properties (the sweep's, see :mod:`workbench.sweeps.sweep`): parallel within the cores,
failure isolation (a crashing trial is FAIL and the study goes on), Ctrl-C stops the running
kernels (their runs and the parent KILLED, their trials FAIL, not counted, so a resume
replaces them), resumable (the same command joins its study; ``tune.n_trials`` is the total),
several workers on one study through its storage.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient

from workbench import console
from workbench.config import ConfigError, PPOConfig
from workbench.config.compose import hydra_value
from workbench.sweeps.point import (
    FAILED,
    FINISHED,
    KILLED,
    SKIPPED,
    ClusterLost,
    PointOutcome,
    PointSpec,
)
from workbench.sweeps.request import rollout_steps
from workbench.sweeps.store import (
    child_filter,
    command_source_tags,
    parent_closed_on_error,
    prepare_store,
    reopen_parent,
    search_all,
)
from workbench.tracking import runs
from workbench.tracking.journal import REAP_ERROR_PREFIX
from workbench.tracking.redaction import redact_uri
from workbench.tracking.store import MAX_TAG_VALUE_LENGTH, is_embedded, log_params, truncate
from workbench.tuning.best import best_config_text, write_best_config
from workbench.tuning.executors import TrialBackend, make_backend
from workbench.tuning.methods import PRUNER_ATTR, build_pruner, build_sampler, pruner_settings
from workbench.tuning.objectives import UNITS, aggregate_seeds, curve_from_metrics
from workbench.tuning.plan import TunePlan, plan_tune, trial_config
from workbench.tuning.recheck import (
    CANDIDATE_TAG,
    Judge,
    Recheck,
    run_recheck,
    seed_range,
    tag_study,
    trial_name,
)
from workbench.tuning.request import TuneRequest
from workbench.tuning.storage import (
    COUNTED,
    OWNER,
    PRUNED_AT,
    RUN_ID,
    Heartbeat,
    counts,
    fail_orphaned_trials,
    open_storage,
    owner_record,
    quiet_optuna,
    study_lock,
)
from workbench.tuning.trial import (
    CHECK_ENV,
    OBJECTIVE_ATTR,
    SEEDS_ATTR,
    STORAGE_ENV,
    format_value,
)

PARENT_ATTR = "workbench.parent_run_id"
COMPLETE, PRUNED, FAIL = "COMPLETE", "PRUNED", "FAIL"


@dataclass
class TrialRecord:
    """What became of one trial of this invocation."""

    number: int
    state: str  # COMPLETE | PRUNED | FAIL
    values: dict[str, Any]
    value: float | None = None
    run_id: str | None = None
    run_status: str | None = None
    wall_s: float | None = None
    error: str | None = None
    pruned_at: dict[str, Any] | None = None


@dataclass
class TuneResult:
    """What ``workbench tune`` did."""

    study: str
    parent_run_id: str
    status: str
    records: list[TrialRecord]
    best: dict[str, Any] | None
    best_config: Path | None
    wall_s: float
    trials_in_study: int = 0
    recheck: Recheck | None = None  # a study over seeds: its best trials against the defaults

    @property
    def failures(self) -> list[TrialRecord]:
        return [r for r in self.records if r.state == FAIL]


@dataclass
class Ticket:
    """A claimed trial on its way through a backend."""

    trial: Any
    trial_id: int
    values: dict[str, Any]
    spec: PointSpec
    adjusted: dict[str, Any] = field(default_factory=dict)
    seeds: tuple[int, ...] = ()  # a study over seeds: the trial trains on each, in turn
    scores: list[float] = field(default_factory=list)  # the value of each seed trained
    run_ids: list[str] = field(default_factory=list)  # the run of each seed trained
    wall_s: float = 0.0  # every seed's point, kernel starts included


def run_tune(overrides: Sequence[str] | TuneRequest, n_trials: int | None = None,
             judge: Judge | None = None) -> TuneResult:
    """Plan, open the study and the parent run, run trials until the total, report.

    A study over seeds (``tune.seeds``) then checks its best trials against the defaults on
    fresh seeds, judged by ``judge`` (:mod:`workbench.tuning.recheck`); without one, that
    check is skipped and no preset is written.

    ``overrides`` may be checked already (:func:`workbench.tuning.request.check_request`,
    ``n_trials`` then unused). Raises :class:`ConfigError` for a bad request (before
    anything is written), ``KeyboardInterrupt`` when stopped (running trials stopped, runs
    and parent KILLED) and
    :class:`ClusterLost` when the Ray head stops answering (the running trials' runs closed
    KILLED, not counted; the parent FAILED; the same command resumes the study).
    """
    quiet_optuna()
    plan = plan_tune(overrides, n_trials)
    backend = make_backend(str(plan.settings.executor), plan.settings.workers, plan.ray_address,
                           plan.settings.ray.gpus_per_point)
    try:
        return tune_with(plan, backend, judge)
    finally:
        backend.close()


def tune_with(plan: TunePlan, backend: TrialBackend, judge: Judge | None = None) -> TuneResult:
    """The study proper, on a connected backend."""
    started = time.perf_counter()
    # The tracking store is checked before the study's storage and folder are made.
    client, experiment_id = prepare_store(plan.tracking_uri, plan.experiment)
    plan.out_dir.mkdir(parents=True, exist_ok=True)  # before any run exists
    storage = open_storage(plan.storage)
    with study_lock(plan.storage, plan.study):
        study = open_study(plan, storage)
        parent_id = parent_run(client, experiment_id, plan, study)
    with parent_closed_on_error(client, parent_id):
        return study_trials(plan, backend, study, storage, client, experiment_id, parent_id,
                            started, judge)


def study_trials(plan: TunePlan, backend: TrialBackend, study: Any, storage: Any,
                 client: MlflowClient, experiment_id: str, parent_id: str,
                 started: float, judge: Judge | None = None) -> TuneResult:
    """The trials of a study whose parent run exists, then the parent closed."""
    import optuna

    close_orphaned_trials(plan, study, client, experiment_id)
    optuna.storages.fail_stale_trials(study)  # trials of workers that died: FAIL, not counted
    runs.reap_stale_runs(plan.tracking_uri, experiment_names=[plan.experiment],
                         filter_string=child_filter(plan.study))
    done_before = sum(counts(t) for t in study.get_trials(deepcopy=False))
    print_plan(plan, backend, parent_id, done_before)
    records, status, lost = run_trials(plan, study, storage, backend, client, parent_id,
                                       experiment_id)
    best = best_trial(study)
    recheck = None
    if best and status is None and plan.rechecks and judge is not None and all_in(plan, study):
        recheck = run_recheck(
            plan, study, backend, client, score=lambda run_id: score_run(plan, client, run_id),
            judge=judge, specs=lambda name, values, seed: trial_spec(
                plan, -1, values, parent_id, experiment_id, backend.cpus_per_trial, seed,
                candidate=name)[0])
        if recheck is not None:
            best = best_trial(study, recheck.trial)
            tag_study(client, parent_id, recheck)
    path = write_best(plan, best, recheck) if best and (recheck or not plan.rechecks) else None
    wall = time.perf_counter() - started
    status = finish_parent(client, parent_id, study, records, wall, status, best,
                           error=str(lost) if lost else None)
    result = TuneResult(plan.study, parent_id, status, records, best, path, wall,
                        len(study.get_trials(deepcopy=False)), recheck)
    print_results(result, plan)
    if status == KILLED:
        raise KeyboardInterrupt
    if lost is not None:
        complete = sum(counts(t) for t in study.get_trials(deepcopy=False))
        raise ClusterLost(
            f"{lost}: {complete} of {plan.n_trials} trials done (trials in flight closed "
            "KILLED, not counted); restart the cluster and run the same command again to "
            "resume the study") from lost
    return result


def close_orphaned_trials(plan: TunePlan, study: Any, client: MlflowClient,
                          experiment_id: str) -> None:
    """Trials whose ``workbench tune`` process on this machine died: FAIL at once (not
    counted, :func:`fail_orphaned_trials`) and their runs KILLED.

    The trial's kernel went with its driver (ipykernel exits within a second of its parent,
    the ``JPY_PARENT_PID`` it was started with) without closing its run, whose heartbeat is
    still fresh: ``runs reap`` would leave it alone for minutes. A kernel found alive after
    all (a Ray task's) takes its run back with its next heartbeat.
    """
    for number in fail_orphaned_trials(study):
        found = search_all(client, experiment_id, f"{child_filter(plan.study)} and "
                           f"tags.`tune.trial` = '{number}' and attributes.status = 'RUNNING'")
        for run in found:
            runs.mark_killed(client, run.info.run_id, (
                f"{REAP_ERROR_PREFIX}the workbench tune process running trial {number} of "
                f"study {plan.study} died (killed); the study runs another trial in its "
                "place"), end_s=runs.last_sign_of_life(run))


def open_study(plan: TunePlan, storage: Any) -> Any:
    """Create the study or join it; a study of the same name optimizing something else is
    bad input. Its user attrs tell the trials' kernels the objective and the pruner."""
    import optuna

    sampler = build_sampler(plan.settings, plan.space)
    pruner = build_pruner(pruner_settings(plan.settings))
    study = optuna.create_study(study_name=plan.study, storage=storage, sampler=sampler,
                                pruner=pruner, direction=direction(plan),
                                load_if_exists=True)
    stored = study.user_attrs.get(OBJECTIVE_ATTR)
    if stored is not None and stored != plan.objective.as_dict():
        raise ConfigError(
            f"tune.study={plan.study}: this study optimizes {stored.get('name')} "
            f"(target {stored.get('target')}, budget {stored.get('budget_s')} s), not "
            f"{plan.objective.describe()}; keep its settings or choose another tune.study"
        )
    seeds = study.user_attrs.get(SEEDS_ATTR) or []
    if stored is not None and seeds != list(plan.seeds):
        raise ConfigError(
            f"tune.study={plan.study}: this study's trials train on seeds {seeds or 'seed'}, "
            f"not {list(plan.seeds) or 'seed'}; keep its tune.seeds or choose another "
            "tune.study")
    for values in plan.enqueue:  # once: a resumed study finds them already there
        study.enqueue_trial(values, skip_if_exists=True)
    study.set_user_attr(OBJECTIVE_ATTR, plan.objective.as_dict())
    study.set_user_attr(SEEDS_ATTR, list(plan.seeds))
    study.set_user_attr(PRUNER_ATTR, pruner_settings(plan.settings))
    study.set_user_attr("workbench.space", plan.space.as_dict())
    study.set_user_attr("workbench.overrides", plan.point_overrides)
    return study


def direction(plan: TunePlan) -> Any:
    """The study's direction as Optuna's enum."""
    from optuna.study import StudyDirection

    return StudyDirection[plan.objective.direction.upper()]


def parent_run(client: MlflowClient, experiment_id: str, plan: TunePlan, study: Any) -> str:
    """The study's parent run in this store: found again (set RUNNING), else created."""
    found = search_all(client, experiment_id,
                       f"tags.sweep_id = '{plan.study}' and tags.`tune.role` = 'study'")
    if found:
        run_id = found[0].info.run_id
        reopen_parent(client, found[0])
    else:
        tags = {**command_source_tags(), "sweep_id": plan.study, "sweep.role": "parent",
                "tune.study": plan.study, "tune.role": "study", "env": plan.env,
                "mlflow.note.content": study_description(plan)}
        run = client.create_run(experiment_id, run_name=plan.study, tags=tags)
        run_id = run.info.run_id
        log_params(client, run_id, plan.study_params())
    study.set_user_attr(PARENT_ATTR, run_id)
    return run_id


def study_description(plan: TunePlan) -> str:
    """The parent run's description: what the study searches and optimizes."""
    t = plan.settings
    return (f"Study {plan.study} on {plan.env}: {plan.objective.describe()} "
            f"({plan.objective.direction}), {plan.n_trials} trials, sampler {t.sampler}, "
            f"pruner {t.pruner}; searching {plan.space.describe()}.")


# --------------------------------------------------------------------------- the trial loop


def run_trials(plan: TunePlan, study: Any, storage: Any, backend: TrialBackend,
               client: MlflowClient, parent_id: str, experiment_id: str
               ) -> tuple[list[TrialRecord], str | None, ClusterLost | None]:
    """Claim, submit and settle trials until the study has its total; Ctrl-C: KILLED; a lost
    Ray head: FAILED, with the :class:`ClusterLost` to report."""
    heartbeat = Heartbeat(storage)
    records: list[TrialRecord] = []
    inflight: dict[Any, Ticket] = {}
    status: str | None = None
    lost: ClusterLost | None = None
    with progress_bar(plan) as report:
        try:
            while True:
                while len(inflight) < backend.workers:
                    ticket = claim_trial(plan, study, storage, parent_id, experiment_id,
                                         backend.cpus_per_trial)
                    if ticket is None:
                        break
                    heartbeat.add(ticket.trial_id)
                    output = plan.out_dir / f"{ticket.spec.point}.ipynb"
                    inflight[backend.submit(ticket.spec, output)] = ticket
                if not inflight:
                    break
                for handle in backend.wait(list(inflight)):
                    ticket = inflight.pop(handle)
                    outcome = backend.result(handle)
                    following = next_seed(plan, client, ticket, outcome, parent_id,
                                          experiment_id, backend.cpus_per_trial)
                    if following is not None:
                        ticket.spec = following
                        output = plan.out_dir / f"{following.point}.ipynb"
                        inflight[backend.submit(following, output)] = ticket
                        continue
                    record = settle_trial(plan, study, storage, client, ticket, outcome)
                    heartbeat.discard(ticket.trial_id)
                    records.append(record)
                    report(record)
        except KeyboardInterrupt:
            status = KILLED
            backend.interrupt()
            for handle, ticket in inflight.items():
                outcome = interrupted_outcome(backend, handle, ticket)
                records.append(settle_trial(plan, study, storage, client, ticket, outcome))
        except ClusterLost as exc:
            status, lost = FAILED, exc
            error = f"{exc}; rerun the study to resume"
            outcomes = backend.abandon(list(inflight), error)
            for handle, ticket in inflight.items():
                outcome = outcomes.get(handle) or PointOutcome(ticket.spec.point, KILLED,
                                                               error=error)
                if not outcome.ok:  # the trial did not fail: its machines went away
                    outcome.status = KILLED
                records.append(settle_trial(plan, study, storage, client, ticket, outcome))
        finally:
            heartbeat.stop()
    return records, status, lost


def interrupted_outcome(backend: TrialBackend, handle: Any, ticket: Ticket) -> PointOutcome:
    """The outcome of a trial stopped by Ctrl-C (a stopped kernel reports KILLED)."""
    try:
        outcome = backend.result(handle)
    except Exception as exc:  # the kernel did not answer in time: record it as killed
        outcome = PointOutcome(ticket.spec.point, KILLED, error=f"interrupted ({exc})")
    if outcome.status not in (KILLED, FAILED):
        return outcome  # it finished just before the interrupt
    outcome.status = KILLED
    return outcome


def claim_trial(plan: TunePlan, study: Any, storage: Any, parent_id: str, experiment_id: str,
                cpus: int) -> Ticket | None:
    """The next trial, sampled, or None when the study has its total (every worker's
    trials counted, under the storage's lock)."""
    with study_lock(plan.storage, plan.study):
        if sum(counts(t) for t in study.get_trials(deepcopy=False)) >= plan.n_trials:
            return None
        trial = study.ask()
        trial.set_user_attr(OWNER, owner_record())  # a dead owner's trial fails at once
        values = {d.name: d.suggest(trial) for d in plan.space.dimensions}
    trial_id = storage.get_trial_id_from_study_id_trial_number(
        storage.get_study_id_from_name(plan.study), trial.number)
    seed = plan.seeds[0] if plan.seeds else None
    spec, adjusted = trial_spec(plan, trial.number, values, parent_id, experiment_id, cpus,
                                seed)
    if adjusted:
        trial.set_user_attr("workbench.adjusted", adjusted)
    return Ticket(trial, trial_id, values, spec, adjusted, seeds=plan.seeds)


def next_seed(plan: TunePlan, client: MlflowClient, ticket: Ticket, outcome: PointOutcome,
              parent_id: str, experiment_id: str, cpus: int) -> PointSpec | None:
    """A study over seeds: the seed that ended scored and reported to the pruner (its value
    with tune.pruner=wilcoxon, the seeds' running aggregate otherwise); the point of the
    trial's next seed, or None when the trial is done (its last seed, pruned, or failed)."""
    if not ticket.seeds:
        return None
    ticket.wall_s += outcome.wall_s or 0.0
    if outcome.status not in (FINISHED, SKIPPED) or not outcome.run_id:
        return None
    value = score_run(plan, client, outcome.run_id)
    ticket.scores.append(value)
    ticket.run_ids.append(outcome.run_id)
    with contextlib.suppress(Exception):  # a run deleted meanwhile: the study still knows
        # repr keeps every digit: the trial's value is recomputable from its runs' tags
        client.set_tag(outcome.run_id, "tune.seed_value", repr(float(value)))
    if not math.isfinite(value):
        return None
    step = len(ticket.scores) - 1
    reported = (value if str(plan.settings.pruner) == "wilcoxon"
                else aggregate_seeds(ticket.scores, str(plan.settings.aggregate)))
    ticket.trial.report(reported, step)
    if ticket.trial.should_prune():
        ticket.trial.set_user_attr(PRUNED_AT, {"report": step, "value": reported,
                                               "seed": ticket.seeds[step]})
        return None
    if len(ticket.scores) == len(ticket.seeds):
        return None
    return trial_spec(plan, ticket.trial.number, ticket.values, parent_id, experiment_id, cpus,
                      ticket.seeds[len(ticket.scores)])[0]


def trial_spec(plan: TunePlan, number: int, values: dict[str, Any], parent_id: str,
               experiment_id: str, cpus: int, seed: int | None = None,
               candidate: str | None = None) -> tuple[PointSpec, dict[str, Any]]:
    """Trial ``number`` as a sweep point (one of its seeds in a study over seeds): notebook
    parameters, kernel environment, tags; with ``candidate`` (``defaults`` or ``trial-003``),
    a point of the check against the defaults, which no Optuna trial follows.

    A sampled ``batch_size`` larger than the trial's rollout is lowered to the rollout (as
    rl-baselines3-zoo does), and the adjustment recorded in the trial.
    """
    base = plan.base
    num_envs = int(values.get("num_envs", base.env.num_envs))
    n_steps = int(values.get("n_steps", rollout_steps(base)))  # 0: off-policy, none
    adjusted: dict[str, Any] = {}
    if isinstance(base.algo, PPOConfig) and int(values.get("batch_size", 0)) > num_envs * n_steps:
        adjusted["batch_size"] = num_envs * n_steps
    effective = {k: v for k, v in {**values, **adjusted}.items()
                 if k not in ("num_envs", "n_steps")}
    name = f"recheck-{candidate}" if candidate else trial_name(number)
    point = name + ("" if seed is None else f"-seed{seed}")
    seed = base.seed if seed is None else seed
    sampled = plan.space.overrides(effective)
    overrides = [*plan.point_overrides, *sampled, f"tracking.run_name={hydra_value(point)}"]
    budget = str(cpus)
    role = {"tune.role": "recheck", CANDIDATE_TAG: candidate} if candidate else {
        "tune.role": "trial", "tune.trial": str(number)}
    spec = PointSpec(
        sweep_id=plan.study, point=point, parent_run_id=parent_id, experiment_id=experiment_id,
        tracking_uri=plan.tracking_uri,
        parameters={"env": base.env.name, "num_envs": num_envs, "n_steps": n_steps,
                    "total_timesteps": base.total_timesteps, "seed": seed,
                    "overrides": overrides, "sweep_id": plan.study, "parent_run_id": parent_id,
                    "point": point, "study": "" if candidate else plan.study, "trial": number},
        tags={"env": base.env.name, "num_envs": str(num_envs), "n_steps": str(n_steps),
              "seed": str(seed), "tune.study": plan.study, **role},
        env_vars={"MLFLOW_TRACKING_URI": plan.tracking_uri, "WORKBENCH_CPU_BUDGET": budget,
                  "OMP_NUM_THREADS": budget, "MKL_NUM_THREADS": budget,
                  "WORKBENCH_NOTEBOOK": str(plan.out_dir / f"{point}.ipynb"),
                  STORAGE_ENV: plan.storage, **({CHECK_ENV: plan.study} if candidate else {})},
        timeout=plan.settings.timeout,
    )
    return spec, adjusted


def settle_trial(plan: TunePlan, study: Any, storage: Any, client: MlflowClient,
                 ticket: Ticket, outcome: PointOutcome) -> TrialRecord:
    """Tell Optuna what the trial came to and tag its run with it."""
    from optuna.trial import TrialState

    number = ticket.trial.number
    record = TrialRecord(number, FAIL, ticket.values, run_id=outcome.run_id,
                         run_status=outcome.status, error=outcome.error,
                         wall_s=ticket.wall_s if ticket.seeds else outcome.wall_s)
    frozen = storage.get_trial(ticket.trial_id)
    if frozen.state.is_finished():  # failed as stale by another worker meanwhile
        record.error = record.error or f"the study already recorded it {frozen.state.name}"
        return record
    if outcome.run_id:
        storage.set_trial_user_attr(ticket.trial_id, RUN_ID, outcome.run_id)
    if outcome.status in (FINISHED, SKIPPED) and outcome.run_id:
        pruned = frozen.user_attrs.get(PRUNED_AT)
        if pruned is not None:
            study.tell(number, state=TrialState.PRUNED)
            record.state, record.pruned_at = PRUNED, pruned
            record.value = pruned.get("value")
        else:
            record.value = (aggregate_seeds(ticket.scores, str(plan.settings.aggregate))
                            if ticket.seeds else score_run(plan, client, outcome.run_id))
            if math.isfinite(record.value):
                study.tell(number, record.value)
                record.state = COMPLETE
            else:
                record.error = ("no final evaluation to score (eval.final_episodes=0?)"
                                if plan.objective.name == "final_return" else
                                "no evaluation within the budget: lower tune.eval_every_steps "
                                "or raise tune.budget_s")
    if record.state == FAIL:
        if outcome.status != KILLED:  # a failure of the trial itself counts; an interrupt not
            storage.set_trial_user_attr(ticket.trial_id, COUNTED,
                                        truncate(record.error or "failed", 500))
        study.tell(number, state=TrialState.FAIL)
    for run_id in dict.fromkeys([*ticket.run_ids, outcome.run_id]):
        if run_id:
            tag_run(client, run_id, record, plan)
    return record


def score_run(plan: TunePlan, client: MlflowClient, run_id: str) -> float:
    """The objective of a finished trial from its run: the final evaluation, or the curve
    of ``trial/eval_train_s`` and ``eval/mean_reward``."""
    run = client.get_run(run_id)
    final = run.data.metrics.get("summary/eval_mean_reward")
    curve = []
    if plan.objective.timed:
        def history(key: str) -> dict[int, float]:
            return {m.step: m.value for m in client.get_metric_history(run_id, key)}
        curve = curve_from_metrics(history("trial/eval_train_s"), history("eval/mean_reward"))
    return plan.objective.score(curve, final)


def tag_run(client: MlflowClient, run_id: str, record: TrialRecord, plan: TunePlan) -> None:
    """The trial's end on its run: ``tune.state``, the value, where it was pruned."""
    with contextlib.suppress(Exception):  # a run deleted meanwhile: the study still knows
        client.set_tag(run_id, "tune.state", record.state)
        for key, value in record.values.items():
            client.set_tag(run_id, f"tune.param.{key}", format_value(value))
        if record.value is not None and math.isfinite(record.value):
            client.set_tag(run_id, "tune.value", f"{record.value:.6g}")
            client.log_metric(run_id, "tune/objective", float(record.value))
        if record.pruned_at is not None:
            at = record.pruned_at
            seeds = "seed" in at  # a study over seeds prunes between seeds
            client.set_tag(run_id, "tune.pruned_at", f"seed {at['seed']}" if seeds else
                           f"report {at.get('report')} ({at.get('train_s')} s, "
                           f"{at.get('steps')} steps)")
            stopped = ("the trial's other seeds were not trained" if seeds else
                       "training stopped early")
            note = client.get_run(run_id).data.tags.get("mlflow.note.content", "")
            client.set_tag(run_id, "mlflow.note.content", truncate(
                f"{note} PRUNED by the {plan.settings.pruner} pruner at report "
                f"{at.get('report')} (value {at.get('value'):.4g}): {stopped}, "
                "the run itself finished normally.", MAX_TAG_VALUE_LENGTH))


# --------------------------------------------------------------------------- the end


def all_in(plan: TunePlan, study: Any) -> bool:
    """Every trial of the study's total settled, none running (another worker's included)."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    return (sum(counts(t) for t in trials) >= plan.n_trials
            and not any(t.state == TrialState.RUNNING for t in trials))


def best_trial(study: Any, number: int | None = None) -> dict[str, Any] | None:
    """The study's best COMPLETE trial (of every worker), or trial ``number``, as plain
    values."""
    try:
        best = study.best_trial if number is None else study.trials[number]
    except ValueError:  # no completed trial yet
        return None
    return {"number": best.number, "value": best.value, "params": dict(best.params),
            "run_id": best.user_attrs.get(RUN_ID),
            "adjusted": best.user_attrs.get("workbench.adjusted", {})}


def write_best(plan: TunePlan, best: dict[str, Any], recheck: Recheck | None = None) -> Path:
    """``experiment=tuned/<study>`` from the best trial's values (in a study over seeds, the
    best of the check on fresh seeds, with its verdict)."""
    values = {**best["params"], **best["adjusted"]}
    cfg = trial_config(plan, values)
    text = best_config_text(plan.study, plan.objective, best["number"], best["value"],
                            best["run_id"], cfg, best["params"],
                            verdict=recheck.verdict if recheck else None,
                            seeds=seed_range(plan.seeds) if plan.seeds else None)
    return write_best_config(plan.study, text)


def finish_parent(client: MlflowClient, parent_id: str, study: Any,
                  records: Sequence[TrialRecord], wall_s: float, status: str | None,
                  best: dict[str, Any] | None, error: str | None = None) -> str:
    """Close the parent run unless other workers' trials still run (the last one closes it):
    FINISHED, FAILED when a trial of this invocation failed (or ``error``: the cluster was
    lost), KILLED on Ctrl-C."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    states = [t.state for t in trials]
    metrics = {"tune/trials_complete": states.count(TrialState.COMPLETE),
               "tune/trials_pruned": states.count(TrialState.PRUNED),
               "tune/trials_failed": states.count(TrialState.FAIL),
               "tune/wall_time_s": wall_s}
    if best is not None:
        metrics["tune/best_value"] = best["value"]
        client.set_tag(parent_id, "tune.best_trial", str(best["number"]))
        if best["run_id"]:
            client.set_tag(parent_id, "tune.best_run_id", best["run_id"])
    for key, value in metrics.items():
        client.log_metric(parent_id, key, float(value))
    client.log_dict(parent_id, {"trials": [trial_row(t) for t in trials]}, "study_results.json")
    failed = [r for r in records if r.state == FAIL and r.run_status != KILLED]
    status = status or (FAILED if failed else FINISHED)
    if status == FAILED:
        client.set_tag(parent_id, "error", truncate(
            error or f"{len(failed)} trial(s) failed: " + ", ".join(str(r.number) for r in failed),
            MAX_TAG_VALUE_LENGTH))
    if status != KILLED and TrialState.RUNNING in states:
        return "RUNNING"  # another worker's trials: it closes the parent
    client.set_terminated(parent_id, status)
    return status


def trial_row(trial: Any) -> dict[str, Any]:
    """One trial for ``study_results.json``."""
    return {"number": trial.number, "state": trial.state.name, "value": trial.value,
            "params": trial.params, "run_id": trial.user_attrs.get(RUN_ID),
            "pruned": trial.user_attrs.get(PRUNED_AT)}


@contextlib.contextmanager
def progress_bar(plan: TunePlan) -> Any:
    """A tqdm bar over this invocation's trials; one line per settled trial."""
    bar = console.progress(None, f"study {plan.study}", "trial")

    def report(record: TrialRecord) -> None:
        bar.update(1)
        bar.write(f"{record.state:<8} trial {record.number}  {record_figures(record, plan)}"
                  + (f"  error: {record.error}" if record.error else ""), file=sys.stderr)

    try:
        yield report
    finally:
        bar.close()


def record_figures(record: TrialRecord, plan: TunePlan) -> str:
    """``value 123.4 return | wall 31 s | lr=...``."""
    parts = []
    if record.value is not None and math.isfinite(record.value):
        unit = UNITS[plan.objective.name] if record.state == COMPLETE else "(last report)"
        parts.append(f"value {record.value:.4g} {unit}")
    if record.wall_s is not None:
        parts.append(f"wall {record.wall_s:.0f} s")
    parts.append(", ".join(f"{k}={format_value(v)}" for k, v in record.values.items()))
    return " | ".join(parts)


def print_plan(plan: TunePlan, backend: TrialBackend, parent_id: str, done: int) -> None:
    """What the study is about to do, printed once."""
    t = plan.settings
    rows = {
        "study": f"{plan.study}  (parent run {parent_id})",
        "objective": f"{plan.objective.describe()}, {plan.objective.direction}",
        "search": f"{plan.space.name}: {plan.space.describe()}",
        "trials": f"{plan.n_trials} in total, {done} done earlier, "
                  f"{max(0, plan.n_trials - done)} to run",
        "seeds": (f"each trial on seeds {seed_range(plan.seeds)} ({t.aggregate}); the best "
                  f"{t.recheck_top} then against the defaults on seeds "
                  f"{seed_range(plan.recheck_seeds)}" if plan.seeds else f"seed {plan.base.seed}"),
        "sampler": f"{t.sampler}" + (f" (seed {t.seed})" if t.seed is not None else ""),
        "pruner": f"{t.pruner}" + (f" (after {t.startup_trials} trials, warm-up "
                                   f"{t.warmup_steps} reports)" if str(t.pruner) == "median"
                                   else ""),
        "budget": f"{plan.base.total_timesteps} steps per trial"
                  + (f", {plan.objective.budget_s:g} training s" if plan.objective.budget_s
                     else "") + f", evaluation every {plan.objective.eval_every_steps} steps",
        "executor": backend.describe(),
        "overrides": " ".join(plan.point_overrides),
        "tracking": f"{redact_uri(plan.tracking_uri)}  experiment {plan.experiment!r}",
        "storage": redact_uri(plan.storage),
        "notebooks": str(plan.out_dir),
    }
    width = max(len(k) for k in rows)
    print("-" * 72)
    for key, value in rows.items():
        print(f"{key:<{width}} : {value}")
    if str(t.executor) == "ray" and (is_embedded(plan.tracking_uri)
                                     or plan.storage.startswith("sqlite")):
        print("warning: a Ray study across machines needs a tracking server and a database "
              "server for the study (tune.storage=postgresql+psycopg2://...); SQLite files only "
              "work on one machine")
    print("-" * 72, flush=True)


def results_table(records: Sequence[TrialRecord]) -> str:
    """trial, state, value, wall time, sampled values."""
    header = ("trial", "state", "value", "wall time", "sampled")
    rows = [header] + [(
        str(r.number), r.state,
        "-" if r.value is None or not math.isfinite(r.value) else f"{r.value:.4g}",
        "-" if r.wall_s is None else f"{r.wall_s:.0f} s",
        ", ".join(f"{k}={format_value(v)}" for k, v in r.values.items()),
    ) for r in sorted(records, key=lambda r: r.number)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    lines.insert(1, "-" * max(len(line) for line in lines))
    return "\n".join(lines)


def print_results(result: TuneResult, plan: TunePlan) -> None:
    """The table of this invocation's trials, the best trial, where to look."""
    print(f"\nStudy {result.study}: {result.status} in {result.wall_s:.0f} s "
          f"({len(result.records)} trial(s) now, {result.trials_in_study} in the study)")
    print("=" * 72)
    print(results_table(result.records))
    print("=" * 72)
    if result.best:
        b = result.best
        print(f"best trial {b['number']}: {b['value']:.4g} {UNITS[plan.objective.name]} "
              f"(run {b['run_id']}) " + ", ".join(f"{k}={format_value(v)}"
                                                   for k, v in b["params"].items()))
        unreached = plan.objective.unreached_note(b["value"])
        if unreached:
            print(f"  {unreached}")
    if result.recheck:
        print(f"re-check           : trial {result.recheck.trial} is "
              f"{result.recheck.verdict}")
    if result.best_config:
        print(f"best config        : {result.best_config}  ->  workbench train "
              f"experiment=tuned/{result.study}")
    names = "trial-<n>-seed<s>.ipynb, recheck-*.ipynb" if plan.seeds else "trial-<n>.ipynb"
    print(f"executed notebooks : {plan.out_dir}/{names}")
    print(f"report             : workbench report --study {result.study}")
    print(f"dashboard          : optuna-dashboard {redact_uri(plan.storage)}")
    print(f"MLflow             : parent run {result.parent_run_id} in experiment "
          f"{plan.experiment!r} ({redact_uri(plan.tracking_uri)})", flush=True)
