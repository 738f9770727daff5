"""Which runs a report shows: a sweep, an experiment, explicit run ids, narrowed by tags.

:func:`find_runs` turns a :class:`Selection` into runs of the store (the latest sweep when
nothing is selected); nothing matching is one :class:`ConfigError` line saying what was looked
for and what the store has instead.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from workbench.config import ConfigError
from workbench.tracking.metric_keys import EVAL_CELL_KIND, EVAL_KIND, RUN_KIND_TAG

if TYPE_CHECKING:  # mlflow and matplotlib load on use: `workbench --help` stays fast
    from mlflow.entities import Run
    from mlflow.tracking import MlflowClient

SWEEP_ID, SWEEP_ROLE, SWEEP_POINT = "sweep_id", "sweep.role", "sweep.point"  # sweep run tags
# Where a point of a Ray sweep ran (tags set by workbench.sweeps.ray_cluster).
RAY_NODE_ID, RAY_NODE_IP, RAY_HOSTNAME = "ray.node_id", "ray.node_ip", "ray.hostname"


# How each part of a selection is spelled: the CLI's flag, the compare notebook's parameter.
FLAGS = {"sweep_id": "--sweep", "experiment": "--experiment", "run_ids": "--runs"}


class SelectionError(ConfigError):
    """Nothing in the store matches one part of a selection.

    ``str()`` is the CLI's line (``--sweep x: ...; sweeps (latest first): a, b``);
    :meth:`notebook_line` says the same with the compare notebook's parameter names
    (``sweep_id='x': ...; set sweep_id to one of a, b``).
    """

    def __init__(self, field: str, value: str, problem: str, choices: Sequence[str],
                 kind: str, *, cli_problem: str | None = None) -> None:
        self.field, self.value, self.problem = field, value, problem
        self.choices, self.kind = tuple(choices), kind
        if self.choices:
            hint = f"{kind}: {', '.join(self.choices)}"
        else:
            hint = f"no {kind.split()[0]} there"
        super().__init__(f"{FLAGS[field]} {value}: {cli_problem or problem}; {hint}")

    def notebook_line(self) -> str:
        """The same problem, naming the notebook's parameter and what to set it to."""
        fix = (f"set {self.field} to one of {', '.join(self.choices)}" if self.choices
               else f"the store has no {self.kind.split()[0]}")
        return f"{self.field}={self.value!r}: {self.problem}; {fix}"


@dataclass(frozen=True)
class Selection:
    """Which runs a report shows: one sweep, one experiment, explicit ids, and/or tags."""

    sweep_id: str | None = None
    experiment: str | None = None
    run_ids: tuple[str, ...] = ()
    tags: Mapping[str, str] = field(default_factory=dict)  # every tag must match

    def __post_init__(self) -> None:
        given = [k for k, v in (("--sweep", self.sweep_id), ("--experiment", self.experiment),
                                ("--runs", self.run_ids)) if v]
        if len(given) > 1:
            raise ConfigError(f"{' and '.join(given)}: give only one of --sweep, --experiment, "
                              "--runs (add --tag KEY=VALUE to narrow any of them)")

    def required_tags(self) -> dict[str, str]:
        """Every tag a selected run must carry (the sweep id included)."""
        return {**({SWEEP_ID: self.sweep_id} if self.sweep_id else {}), **self.tags}

    @property
    def is_empty(self) -> bool:
        return not (self.sweep_id or self.experiment or self.run_ids or self.tags)

    def describe(self) -> str:
        """What was selected, in words."""
        parts = []
        if self.sweep_id:
            parts.append(f"sweep {self.sweep_id}")
        if self.experiment:
            parts.append(f"experiment {self.experiment!r}")
        if self.run_ids:
            parts.append(f"{len(self.run_ids)} run id(s)")
        parts += [f"tag {k}={v}" for k, v in self.tags.items()]
        return ", ".join(parts) or "the latest sweep"

    def default_name(self) -> str:
        """The folder name under reports/ (``sweep-<id>``, ``experiment-<name>``, ...)."""
        if self.sweep_id:
            base = f"sweep-{self.sweep_id}"
        elif self.experiment:
            base = f"experiment-{self.experiment}"
        elif self.run_ids:
            digest = hashlib.sha1(",".join(sorted(self.run_ids)).encode()).hexdigest()[:8]
            base = f"runs-{len(self.run_ids)}-{digest}"
        else:
            base = "tags"
        if self.tags:
            base += "-" + "-".join(f"{k}-{v}" for k, v in sorted(self.tags.items()))
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", base)


def search_all(client: MlflowClient, experiment_ids: Sequence[str], filter_string: str = "",
               order_by: Sequence[str] | None = None, limit: int | None = None) -> list[Run]:
    """Every run matching ``filter_string`` (follows MLflow's page tokens)."""
    runs: list[Run] = []
    token: str | None = None
    while True:
        page = client.search_runs(list(experiment_ids), filter_string, max_results=1000,
                                  order_by=list(order_by or []), page_token=token)
        runs.extend(page)
        token = page.token
        if not token or (limit and len(runs) >= limit):
            return runs[:limit] if limit else runs


def all_experiment_ids(client: MlflowClient) -> list[str]:
    """Ids of every active experiment in the store."""
    return [e.experiment_id for e in client.search_experiments()]


def tag_filter(tags: Mapping[str, str]) -> list[str]:
    """MLflow filter clauses for the exact tag matches MLflow's filter syntax can express.

    Tag names are quoted with backticks and values with single quotes, or double quotes when
    the value holds a single quote; MLflow has no escape for the rest (a backtick in a name, a
    value with both quotes), so those matches are left to :func:`has_tags` on the results:
    tags come from runs, and one odd value must neither break the query nor block a report.
    """
    clauses = []
    for key, value in tags.items():
        quote = next((q for q in "'\"" if q not in value), None)
        if "`" not in key and quote is not None:
            clauses.append(f"tags.`{key}` = {quote}{value}{quote}")
    return clauses


def has_tags(run: Run, tags: Mapping[str, str]) -> bool:
    """True when ``run`` carries every tag of ``tags`` with exactly that value."""
    return all(run.data.tags.get(k) == v for k, v in tags.items())


def sweep_parents(client: MlflowClient, experiment_ids: Sequence[str]) -> list[Run]:
    """Sweep parent runs, most recently active first.

    Activity is the later of start and end: a sweep resumed today (its parent is set RUNNING
    again and re-terminated) counts as today's, so ``make demo`` reports the sweep it just ran.
    """
    parents = search_all(client, experiment_ids, f"tags.`{SWEEP_ROLE}` = 'parent'")
    parents = [r for r in parents if r.data.tags.get(SWEEP_ID)]
    return sorted(parents, key=lambda r: max(r.info.start_time or 0, r.info.end_time or 0),
                  reverse=True)


def latest_sweep_id(client: MlflowClient, experiment_ids: Sequence[str]) -> str | None:
    """The sweep_id of the most recently active sweep (parent run, else any sweep run)."""
    parents = sweep_parents(client, experiment_ids)
    if parents:
        return parents[0].data.tags[SWEEP_ID]
    runs = search_all(client, experiment_ids, f"tags.`{SWEEP_ID}` LIKE '%'",
                      ["attributes.start_time DESC"], 1)
    return runs[0].data.tags[SWEEP_ID] if runs else None


def known_sweeps(client: MlflowClient, experiment_ids: Sequence[str], n: int = 5) -> list[str]:
    """Up to ``n`` sweep ids, most recently active first (for error messages)."""
    return [r.data.tags[SWEEP_ID] for r in sweep_parents(client, experiment_ids)[:n]]


def find_runs(client: MlflowClient, selection: Selection, store: str
              ) -> tuple[Selection, list[Run], Run | None]:
    """The selected runs (sweep children, never sweep parents), oldest first.

    Returns the selection (with the latest sweep filled in when none was given), the runs
    and the sweep's parent run when there is one. Nothing matching is a :class:`ConfigError`
    naming what was looked for and what exists.
    """
    experiment_ids = all_experiment_ids(client)
    if selection.is_empty:
        sweep_id = latest_sweep_id(client, experiment_ids)
        if sweep_id is None:
            raise ConfigError(
                f"no sweep found in {store}: run `workbench sweep` first, or choose runs with "
                "--experiment NAME or --runs ID,ID"
            )
        selection = Selection(sweep_id=sweep_id)
    required = selection.required_tags()
    parent: Run | None = None
    if selection.experiment:
        found = client.get_experiment_by_name(selection.experiment)
        if found is None:
            names = sorted(e.name for e in client.search_experiments())
            raise SelectionError("experiment", selection.experiment,
                                 f"no such experiment in {store}", names, "experiments")
        experiment_ids = [found.experiment_id]
    if selection.run_ids:
        runs = [get_run(client, run_id, store) for run_id in selection.run_ids]
    else:
        runs = search_all(client, experiment_ids, " and ".join(tag_filter(required)),
                          ["attributes.start_time ASC"])
        # workbench eval's matrices are not trainings: their verdicts show on the policy's run
        runs = [r for r in runs if r.data.tags.get(RUN_KIND_TAG) not in (EVAL_KIND,
                                                                         EVAL_CELL_KIND)]
    runs = [r for r in runs if has_tags(r, required)]
    parents = [r for r in runs if r.data.tags.get(SWEEP_ROLE) == "parent"]
    parent = parents[0] if parents and selection.sweep_id else None
    runs = [r for r in runs if r.data.tags.get(SWEEP_ROLE) != "parent"]
    if not runs and selection.sweep_id and not selection.tags:
        raise SelectionError(
            "sweep_id", selection.sweep_id, f"no such sweep in {store}",
            known_sweeps(client, experiment_ids), "sweeps (latest first)",
            cli_problem=f"no runs with tag sweep_id={selection.sweep_id} in {store}")
    if not runs:
        raise ConfigError(no_runs_message(client, selection, experiment_ids, store))
    return selection, runs, parent


def get_run(client: MlflowClient, run_id: str, store: str) -> Run:
    """One run by id; an unknown id is a :class:`ConfigError`."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_run(run_id)
    except MlflowException as exc:
        raise ConfigError(f"--runs {run_id}: no such run in {store}; copy run ids from "
                          "`workbench train` output or the MLflow UI") from exc


def no_runs_message(client: MlflowClient, selection: Selection, experiment_ids: Sequence[str],
                    store: str) -> str:
    """One line saying what matched nothing, and what the store has instead."""
    if selection.sweep_id:
        sweeps = known_sweeps(client, experiment_ids)
        hint = f"sweeps (latest first): {', '.join(sweeps)}" if sweeps else "no sweeps there"
        return (f"--sweep {selection.sweep_id}: no runs with tag sweep_id={selection.sweep_id} "
                f"in {store}; {hint}")
    return f"{selection.describe()}: no runs match in {store}"
