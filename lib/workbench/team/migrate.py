"""Migration of runs between MLflow stores: an individual's local runs to the team server.

``workbench runs copy --from sqlite:///experiments/mlflow.db --to http://127.0.0.1:5050``
recreates each selected run on the destination, in an experiment of the same name, with its
run name, status, start and end time, every param, every tag, the full history of every
metric (each point's step, value and timestamp) and every artifact file (``manifest.json``,
``config.yaml``, ``model/`` ...). Only MLflow's public client API is used, so any two
tracking URIs work (SQLite, PostgreSQL, HTTP servers with authentication).

Why not MLflow's export tooling: ``mlflow-export-import`` is a separate project that goes
through an intermediate directory, lags behind MLflow releases and adds its own tags; the
few client calls below copy store to store directly and add what a migration needs here:

- idempotence: each copy carries the tag ``workbench.copied_from=<source run id>``; running
  the command again skips runs that are already there, so an interrupted migration is
  simply repeated, never duplicated;
- no half copies: a failure deletes the unfinished destination run; a copy killed outright
  (SIGKILL) is left RUNNING and is replaced by the next attempt;
- sweeps stay sweeps: parents are copied before their children (a selected child brings its
  parent) and ``mlflow.parentRunId`` points to the parent's copy.

Runs still RUNNING at the source are skipped (their copy would be incomplete and would claim
a status the destination cannot keep up to date). Credentials for the destination come from
``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD`` (MLflow's client reads them) and
are never printed or stored.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench import paths
from workbench.config import ConfigError
from workbench.console import printable
from workbench.processes import http_status
from workbench.tracking.redaction import redact_uri
from workbench.tracking.store import check_sqlite_file, ensure_experiment

if TYPE_CHECKING:
    from mlflow.entities import Run
    from mlflow.tracking import MlflowClient

COPY_HELP = ("copy runs with params, tags, full metric histories and artifacts (manifest "
             "included) from one MLflow store to another, e.g. local runs to the team server")
SOURCE_TAG = "workbench.copied_from"  # on the copy: the source run's id
PARENT_TAG = "mlflow.parentRunId"
# MLflow's per-request limits of log_batch (mlflow.utils.validation).
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_PER_BATCH = 100
PAGE_SIZE = 1000


@dataclass(frozen=True)
class CopyResult:
    """One run's outcome: copied now, or already on the destination."""

    source_run_id: str
    dest_run_id: str
    run_name: str
    experiment: str
    copied: bool  # False: an earlier copy was found and kept
    params: int = 0
    tags: int = 0
    metric_points: int = 0
    artifact_files: int = 0


# --------------------------------------------------------------------------- checks


def _redact(uri: str) -> str:
    """``uri`` without a password; imported late because workbench.tracking loads torch
    (through SB3) and the CLI builds its parser from this module."""
    return redact_uri(uri)


def check_source(uri: str) -> MlflowClient:
    """A client for the source store; a missing SQLite file is bad input, not a new store."""
    from mlflow.tracking import MlflowClient

    if uri.startswith("sqlite:///"):
        db = Path(uri.removeprefix("sqlite:///"))
        if not db.is_file():
            raise ConfigError(f"--from {uri}: no such SQLite store ({db} does not exist); "
                              "give the store that holds the runs, e.g. "
                              f"{paths.default_tracking_uri()}")
        check_sqlite_file(uri, db)
    return MlflowClient(tracking_uri=uri)


def check_destination(uri: str) -> MlflowClient:
    """A client for the destination, after checking that it answers and accepts us; an
    existing SQLite file must be an intact MLflow database (never another application's)."""
    from mlflow.tracking import MlflowClient

    if uri.startswith(("http://", "https://")):
        check_server(uri.rstrip("/"))
    elif uri.startswith("sqlite:///"):
        db = Path(uri.removeprefix("sqlite:///"))
        check_sqlite_file(uri, db)
        db.parent.mkdir(parents=True, exist_ok=True)
    return MlflowClient(tracking_uri=uri)


def check_server(url: str) -> None:
    """Fail in one line when no server answers or it refuses our credentials.

    MLflow's REST client would retry a refused connection for minutes and report a 401 as
    a long traceback; one quick request answers both questions first.
    """
    if http_status(f"{url}/health") == 0:
        raise ConfigError(f"--to {_redact(url)}: no MLflow server answers; start it "
                          "(workbench server start) or check the address")
    user = os.environ.get("MLFLOW_TRACKING_USERNAME")
    password = os.environ.get("MLFLOW_TRACKING_PASSWORD")
    auth = (user, password) if user and password else None
    code = http_status(f"{url}/api/2.0/mlflow/experiments/search?max_results=1", auth=auth,
                       timeout=30.0)
    if code == 401:
        hint = ("wrong user name or password" if auth
                else "MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD are not set")
        raise ConfigError(f"--to {_redact(url)}: the server requires a login "
                          f"(401: {hint}); export your account's credentials")
    if code not in (200,):
        raise ConfigError(f"--to {_redact(url)}: unexpected HTTP {code} from the "
                          "tracking API; is this an MLflow server?")


# --------------------------------------------------------------------------- selection


def select_runs(
    client: MlflowClient, experiments: Sequence[str] = (), run_ids: Sequence[str] = ()
) -> list[Run]:
    """The runs to copy, parents before children (a selected child brings its parent)."""
    if run_ids:
        runs = [_get_run(client, run_id) for run_id in run_ids]
    else:
        experiment_ids = [e.experiment_id for e in _experiments(client, experiments)]
        runs = list(_search_runs(client, experiment_ids)) if experiment_ids else []
    by_id = {run.info.run_id: run for run in runs}
    for run in runs:  # bring missing parents along so the hierarchy survives
        parent_id = run.data.tags.get(PARENT_TAG)
        if parent_id and parent_id not in by_id:
            by_id[parent_id] = _get_run(client, parent_id)
    return sorted(by_id.values(), key=lambda r: (_depth(r, by_id), r.info.start_time))


def _depth(run: Run, by_id: dict[str, Run]) -> int:
    """How many ancestors of ``run`` are in the selection (0: a top-level run)."""
    depth, parent_id = 0, run.data.tags.get(PARENT_TAG)
    while parent_id in by_id and depth < len(by_id):
        depth, parent_id = depth + 1, by_id[parent_id].data.tags.get(PARENT_TAG)
    return depth


def _get_run(client: MlflowClient, run_id: str) -> Run:
    from mlflow.exceptions import MlflowException

    try:
        return client.get_run(run_id)
    except MlflowException as exc:
        raise ConfigError(f"--run-id {run_id}: no such run in the source store") from exc


def _experiments(client: MlflowClient, names: Sequence[str]) -> list[Any]:
    """The named experiments (all active ones when no name is given)."""
    if not names:
        return list(client.search_experiments())
    found = []
    for name in names:
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            known = ", ".join(sorted(e.name for e in client.search_experiments()))
            raise ConfigError(f"--experiment {name}: not in the source store; "
                              f"its experiments: {known or 'none'}")
        found.append(experiment)
    return found


def _search_runs(client: MlflowClient, experiment_ids: list[str]) -> Iterator[Run]:
    """Every active run of the experiments, page by page."""
    from mlflow.entities import ViewType

    token = None
    while True:
        page = client.search_runs(experiment_ids, run_view_type=ViewType.ACTIVE_ONLY,
                                  max_results=PAGE_SIZE, page_token=token)
        yield from page
        token = page.token
        if not token:
            return


# --------------------------------------------------------------------------- copying


def copy_runs(
    source_uri: str,
    dest_uri: str,
    *,
    experiments: Sequence[str] = (),
    run_ids: Sequence[str] = (),
    report: Callable[[str], None] = print,
) -> list[CopyResult]:
    """Copy the selected runs from ``source_uri`` to ``dest_uri``; see the module docstring."""
    if source_uri.rstrip("/") == dest_uri.rstrip("/"):
        raise ConfigError(f"--from and --to are the same store ({_redact(dest_uri)})"
                          "; give the destination store as --to")
    source = check_source(source_uri)
    runs = select_runs(source, experiments, run_ids)
    dest = check_destination(dest_uri)
    from mlflow.exceptions import MlflowException

    results: list[CopyResult] = []
    refused: list[str] = []
    copies: dict[str, str] = {}  # source run id -> destination run id
    for run in runs:
        if run.info.status == "RUNNING":
            report(printable(f"skipped {run.info.run_name} ({run.info.run_id}): still RUNNING "
                             "at the source; copy it once it has ended"))
            continue
        try:
            result = copy_run(source, dest, dest_uri, run, copies)
        except MlflowException as exc:  # the half copy is deleted already (copy_run)
            reason = (str(exc.message).strip().splitlines() or [exc.error_code])[0]
            report(printable(f"not copied {run.info.run_name} ({run.info.run_id}): the "
                             f"destination refused its data ({reason[:300]})"))
            refused.append(run.info.run_id)
            continue
        copies[result.source_run_id] = result.dest_run_id
        results.append(result)
        report(printable(describe(result)))
    done = sum(r.copied for r in results)
    report(f"{done} run(s) copied, {len(results) - done} already there "
           f"-> {_redact(dest_uri)}")
    if refused:
        raise ConfigError(f"runs copy: {len(refused)} run(s) not copied because the destination "
                          f"refused their data (listed above, e.g. {refused[0]}); rename what "
                          "it refused at the source, or leave those runs out with --run-id")
    return results


def describe(result: CopyResult) -> str:
    """One line per run for the console."""
    if not result.copied:
        return (f"already there: {result.run_name} ({result.source_run_id} -> "
                f"{result.dest_run_id})")
    return (f"copied {result.run_name} ({result.source_run_id} -> {result.dest_run_id}) "
            f"into {result.experiment!r}: {result.params} params, {result.tags} tags, "
            f"{result.metric_points} metric points, {result.artifact_files} artifact files")


def copy_run(
    source: MlflowClient, dest: MlflowClient, dest_uri: str, run: Run, copies: dict[str, str]
) -> CopyResult:
    """Copy one finished run unless an earlier, complete copy exists."""
    experiment = source.get_experiment(run.info.experiment_id).name

    experiment_id = ensure_experiment(dest, experiment, dest_uri)
    existing = find_copy(dest, experiment_id, run.info.run_id)
    if existing is not None:
        if existing.info.status != "RUNNING":
            return CopyResult(run.info.run_id, existing.info.run_id, run.info.run_name,
                              experiment, copied=False)
        dest.delete_run(existing.info.run_id)  # a copy killed half-way: replace it

    tags = dict(run.data.tags)
    tags[SOURCE_TAG] = run.info.run_id
    if PARENT_TAG in tags:
        tags[PARENT_TAG] = copies.get(tags[PARENT_TAG], tags[PARENT_TAG])
    created = dest.create_run(experiment_id, start_time=run.info.start_time, tags=tags,
                              run_name=run.info.run_name)
    new_id = created.info.run_id
    try:
        params = copy_params(dest, new_id, run.data.params)
        points = copy_metrics(source, dest, run.info.run_id, new_id, run.data.metrics)
        files = copy_artifacts(source, dest, run.info.run_id, new_id)
        dest.set_terminated(new_id, status=run.info.status, end_time=run.info.end_time)
    except BaseException:
        dest.delete_run(new_id)  # never leave a half copy that looks like the real thing
        raise
    return CopyResult(run.info.run_id, new_id, run.info.run_name, experiment, copied=True,
                      params=params, tags=len(tags), metric_points=points,
                      artifact_files=files)


def find_copy(dest: MlflowClient, experiment_id: str, source_run_id: str) -> Run | None:
    """The destination's earlier copy of ``source_run_id``, if any."""
    found = dest.search_runs(
        [experiment_id], filter_string=f"tags.`{SOURCE_TAG}` = '{source_run_id}'",
        max_results=1,
    )
    return found[0] if found else None


def copy_params(dest: MlflowClient, run_id: str, params: dict[str, str]) -> int:
    """All params, in batches of MLflow's maximum size; values are copied verbatim."""
    from mlflow.entities import Param

    items = [Param(key, value) for key, value in sorted(params.items())]
    for batch in chunks(items, MAX_PARAMS_PER_BATCH):
        dest.log_batch(run_id, params=batch)
    return len(items)


def copy_metrics(
    source: MlflowClient, dest: MlflowClient, source_id: str, dest_id: str, latest: dict[str, Any]
) -> int:
    """Every point of every metric (step, value, timestamp), in batches of 1000."""
    points = [point for key in sorted(latest) for point in source.get_metric_history(source_id,
                                                                                      key)]
    for batch in chunks(points, MAX_METRICS_PER_BATCH):
        dest.log_batch(dest_id, metrics=batch)
    return len(points)


def copy_artifacts(source: MlflowClient, dest: MlflowClient, source_id: str, dest_id: str) -> int:
    """Download the whole artifact tree and upload it at the copy's artifact root."""
    if not source.list_artifacts(source_id):
        return 0
    with tempfile.TemporaryDirectory(prefix="workbench-copy-") as tmp:
        local = Path(source.download_artifacts(source_id, "", tmp))
        files = sum(1 for path in local.rglob("*") if path.is_file())
        dest.log_artifacts(dest_id, str(local))
    return files


def chunks(items: Sequence[Any], size: int) -> Iterable[list[Any]]:
    """Consecutive slices of at most ``size`` items."""
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


# --------------------------------------------------------------------------- command line


def add_cli_arguments(parser: Any) -> None:
    """Flags of ``workbench runs copy``."""
    parser.add_argument("--from", dest="source", default=None, metavar="URI",
                        help="source tracking URI (default: the embedded store "
                        "sqlite:///<experiments>/mlflow.db)")
    parser.add_argument("--to", dest="dest", required=True, metavar="URI",
                        help="destination tracking URI, e.g. http://127.0.0.1:5050")
    parser.add_argument("--experiment", action="append", default=[], metavar="NAME",
                        help="copy only this experiment's runs (repeatable; default: all)")
    parser.add_argument("--run-id", action="append", default=[], metavar="ID",
                        help="copy only this run (repeatable; its parent comes along)")


def run_command(args: Any) -> int:
    """Carry out ``workbench runs copy``; returns the exit code."""
    # The per-run lines below say what happened; MLflow's own progress bars and "View run"
    # links would only interleave with them.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    source = args.source or paths.default_tracking_uri()
    copy_runs(source, args.dest, experiments=args.experiment, run_ids=args.run_id)
    return 0
