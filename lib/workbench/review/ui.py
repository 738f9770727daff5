"""``workbench ui``: MLflow's own UI on the configured store, bound to 127.0.0.1.

The UI runs as a child in its own session, its output in ``<experiments>/logs/ui.log``; the
URL is printed once the server answers. Ctrl-C or SIGTERM stops the whole group (uvicorn, its
workers, MLflow's job runner) quietly, so the port is free when the command returns.

``--meeting`` prints a link to a view of the runs table made for a projector: the latest
sweep's finished runs (or ``--filter``), best reward first, the reward and the grid
(num_envs, n_steps, seed, env) as columns, the run names wide enough to tell apart. MLflow's
URL carries the filter and the sort but not the columns, so the view is stored the way
MLflow's own "Share" button stores one: as an experiment tag
``mlflow.sharedViewState.<key>`` that ``?viewStateShareKey=<key>`` names.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlencode

from workbench import paths, processes
from workbench.config import ConfigError, load_config
from workbench.review.selection import SWEEP_ID, latest_sweep_id, tag_filter
from workbench.tracking.redaction import redact_uri
from workbench.tracking.store import (
    get_experiment_or_explain,
    make_client,
    resolve_tracking_uri,
    ui_link,
)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 5000
DEFAULT_WORKERS = 1  # one user, one machine: one worker starts fast (mlflow defaults to four)
START_TIMEOUT_S = 240.0  # MLflow's first start migrates the store; slow on a busy machine
STOP_TIMEOUT_S = 20.0

MEETING_FILTER = "attributes.status = 'FINISHED'"
MEETING_VIEW_KEY = "workbench-meeting"
SHARED_VIEW_TAG = "mlflow.sharedViewState."  # + key: MLflow's UI reads a shared view from it
REWARD_METRIC = "summary/eval_mean_reward"  # the final deterministic evaluation
GRID_TAGS = ("num_envs", "n_steps", "seed")  # then the env: the run names carry it too
RUN_NAME_COLUMN = "attributes.`Run Name`"
CREATED_COLUMN, DURATION_COLUMN = "runDateAndNestInfo", "duration"
# The run name column: wide enough for the longest name shown (MLflow's default, 190 px, cuts
# a grid on inverted_pendulum to identical "inverted_pendul..."), within bounds.
NAME_PX_PER_CHAR, NAME_PADDING_PX, NAME_WIDTH_PX = 6.2, 50, (190, 400)
MEETING_RUNS_MEASURED = 1000  # names measured for the width: the first runs the view shows


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the UI listens, and what the link it prints opens."""
    parser.add_argument("--host", default=DEFAULT_HOST,
                        help=f"interface to bind (default {DEFAULT_HOST})")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"port (default {DEFAULT_PORT})")
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS,
                        help=f"MLflow server worker processes (default {DEFAULT_WORKERS})")
    parser.add_argument("--meeting", action="store_true",
                        help="print a link to the runs table for a review: best reward first, "
                             "reward and grid columns, full run names")
    parser.add_argument("--filter", metavar="EXPR", default=None,
                        help=f"the --meeting view's MLflow search filter (implies --meeting; "
                             f"default: {MEETING_FILTER} and the latest sweep's runs), e.g. "
                             "\"tags.sweep_id = 'ID'\"")


def column(kind: str, name: str) -> str:
    """A runs-table column as MLflow's UI names it: ``metrics.`eval/mean_reward```."""
    return f"{kind}.`{name}`"


def name_width_px(names: Sequence[str]) -> int:
    """The run name column's width for whole ``names`` in MLflow's table (12 px font; the
    padding holds the run's color dot)."""
    longest = max((len(name) for name in names), default=0)
    low, high = NAME_WIDTH_PX
    return int(min(high, max(low, NAME_PADDING_PX + NAME_PX_PER_CHAR * longest)))


def meeting_view(search_filter: str, names: Sequence[str] = ()) -> dict[str, Any]:
    """MLflow's runs-table view state for a review on a projector.

    The search facets (filter, sort) and the table's columns, their order and widths, in the
    form MLflow's UI saves a shared view in; ``names`` are the run names it shows.
    """
    reward = column("metrics", REWARD_METRIC)
    grid = [column("tags", tag) for tag in GRID_TAGS]
    columns = [reward, *grid, column("tags", "env"), column("metrics", "summary/fps"),
               column("metrics", "summary/wall_time_s")]
    return {
        "searchFilter": search_filter, "orderByKey": reward, "orderByAsc": False,
        "startTime": "ALL", "lifecycleFilter": "Active", "modelVersionFilter": "All Runs",
        "datasetsFilter": [],
        "selectedColumns": columns,
        # "Created" stays pinned next to the name; "Duration" moves after the chosen columns.
        "columnOrder": [RUN_NAME_COLUMN, CREATED_COLUMN, *columns, DURATION_COLUMN],
        "columnWidths": {RUN_NAME_COLUMN: name_width_px(names), reward: 200,
                         **{name: 100 for name in grid}},
    }


def meeting_link(client: Any, base: str, experiment_id: str, search_filter: str,
                 names: Sequence[str] = ()) -> str:
    """The link to the meeting view of the experiment's runs table.

    The view is stored as the experiment's shared-view tag; where the store refuses it (a
    team experiment without MANAGE), the link carries the filter and the sort only.
    """
    view = meeting_view(search_filter, names)
    query = {"searchFilter": search_filter, "orderByKey": view["orderByKey"],
             "orderByAsc": "false"}
    with contextlib.suppress(Exception):
        client.set_experiment_tag(experiment_id, SHARED_VIEW_TAG + MEETING_VIEW_KEY,
                                  json.dumps(view))
        query = {"viewStateShareKey": MEETING_VIEW_KEY}
    return f"{ui_link(base, experiment_id)}&{urlencode(query)}"


def default_meeting_filter(client: Any, experiment_id: str) -> str:
    """The meeting view's filter without ``--filter``: the finished runs of the experiment's
    most recently active sweep, as ``workbench report`` picks it (after a day of notebook work
    the table then opens on the sweep under review, not on notebook runs); the experiment's
    finished runs when it holds no sweep."""
    sweep_id = latest_sweep_id(client, [experiment_id])
    clauses = tag_filter({SWEEP_ID: sweep_id}) if sweep_id else []
    return " and ".join([MEETING_FILTER, *clauses])


def meeting_run_names(client: Any, experiment_id: str, search_filter: str) -> list[str]:
    """The names of the runs the meeting view shows first; a filter MLflow cannot parse is bad
    input, reported before the server starts."""
    from mlflow.exceptions import MlflowException

    try:
        runs = client.search_runs([experiment_id], search_filter,
                                  max_results=MEETING_RUNS_MEASURED)
    except MlflowException as exc:
        problem = str(exc.message).splitlines()[0]
        raise ConfigError(f"--filter {search_filter!r}: {problem}; give an MLflow search "
                          f"filter, e.g. \"tags.sweep_id = 'ID'\"") from None
    return [run.info.run_name or "" for run in runs]


def ui_command(uri: str, args: argparse.Namespace) -> list[str]:
    """The ``mlflow ui`` command line."""
    return [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
            "--host", args.host, "--port", str(args.port), "--workers", str(args.workers)]


def ui_environment() -> dict[str, str]:
    """The UI's environment: MLflow's job runner off (it serves GenAI jobs, not run tables, and
    starts seven more processes)."""
    return {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def run_command(args: argparse.Namespace) -> int:
    """Start the MLflow UI against the configured store; serve until Ctrl-C or SIGTERM."""
    if not 0 < args.port < 65536:
        raise ConfigError(f"--port {args.port}: not a TCP port; give 1-65535, e.g. 5000")
    if args.workers < 1:
        raise ConfigError(f"--workers {args.workers}: must be at least 1")
    cfg = load_config(args.overrides)
    uri = resolve_tracking_uri(cfg.tracking.uri)
    client = make_client(uri)  # creates the embedded store's folder if needed
    experiment = get_experiment_or_explain(client, cfg.tracking.experiment, uri)
    experiment_id = experiment.experiment_id if experiment else None
    meeting = args.meeting or args.filter is not None
    url = f"http://{args.host}:{args.port}"
    if meeting and experiment_id is not None:
        search_filter = args.filter if args.filter is not None else default_meeting_filter(
            client, experiment_id)
        names = meeting_run_names(client, experiment_id, search_filter)
        page = meeting_link(client, url, experiment_id, search_filter, names)
    else:
        page = ui_link(url, experiment_id)
    log = paths.experiments_dir() / "logs" / "ui.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"starting the MLflow UI on {url} (store {redact_uri(uri)}, log {log}) ...",
          file=sys.stderr, flush=True)
    with log.open("ab") as output:
        server = subprocess.Popen(ui_command(uri, args), stdout=output, stderr=output,
                                  env=ui_environment(), start_new_session=True)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        problem = processes.wait_until_healthy(url, server, START_TIMEOUT_S)
        if problem is not None:
            print(f"workbench: error: the MLflow UI {problem}: {last_line(log)} (log {log})",
                  file=sys.stderr)
            return 1
        print(f"MLflow UI on {page}  (Ctrl-C stops it)", flush=True)
        return server.wait()
    except KeyboardInterrupt:
        print("stopping the MLflow UI ...", file=sys.stderr, flush=True)
        return 0
    finally:
        processes.terminate_group(server.pid, STOP_TIMEOUT_S)
        server.wait()
        signal.signal(signal.SIGTERM, previous)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM ends ``workbench ui`` the way Ctrl-C does."""
    raise KeyboardInterrupt


def last_line(log: Path) -> str:
    """The last non-empty line of the UI's log."""
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"
