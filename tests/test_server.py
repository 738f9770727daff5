"""Team mode: the shared MLflow server on PostgreSQL with basic auth, on loopback.

Fast tests check the bad-input paths (nothing may start). Slow tests use the session's real
server (tests/teamserver.py): login required, PostgreSQL as the store, concurrent clients
logging complete runs, and, last, that no credential reached any file, store row, param,
tag or output.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from workbench import cli, processes
from workbench.team import postgres, server
from workbench.team.layout import Layout, default_layout
from workbench.training import load_config

from tests.conftest import TINY
from tests.support.ports import free_port
from tests.teamserver import ALICE, TeamServer, logged_in

from .support.runs import psql


@pytest.mark.unit
def test_tracking_server_option_points_at_the_default_port() -> None:
    cfg = load_config(["tracking=server"])
    assert cfg.tracking.uri == f"http://127.0.0.1:{server.DEFAULT_PORT}"
    assert cfg.tracking.experiment == "workbench"


@pytest.mark.unit
@pytest.mark.parametrize(
    ("password", "message"),
    [
        (None, "workbench: error: MLFLOW_AUTH_ADMIN_PASSWORD is not set: export the server's "
         "admin password (at least 12 characters; there is no default) before "
         "`workbench server start`\n"),
        ("short", "workbench: error: MLFLOW_AUTH_ADMIN_PASSWORD: too short (5 characters); "
         "MLflow's auth app needs at least 12\n"),
    ],
)
def test_start_without_a_usable_admin_password_is_bad_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    password: str | None, message: str,
) -> None:
    monkeypatch.delenv(server.ADMIN_PASSWORD_ENV, raising=False)
    if password is not None:
        monkeypatch.setenv(server.ADMIN_PASSWORD_ENV, password)
    monkeypatch.setenv("WORKBENCH_EXPERIMENTS", str(tmp_path / "experiments"))
    assert cli.main(["server", "start", "--port", str(free_port())]) == 2
    assert capsys.readouterr().err == message
    assert not (tmp_path / "experiments").exists()  # nothing created, nothing started


@pytest.mark.unit
def test_start_on_a_busy_port_is_bad_input(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(server.ADMIN_PASSWORD_ENV, "a-long-enough-password")
    # A short folder: PostgreSQL's socket path under it must fit in 107 characters, and the
    # temporary folders of pytest-xdist's workers are longer.
    folder = Path(tempfile.mkdtemp(prefix="wbport", dir="/tmp"))
    monkeypatch.setenv("WORKBENCH_EXPERIMENTS", str(folder / "experiments"))
    try:
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            port = busy.getsockname()[1]
            assert cli.main(["server", "start", "--port", str(port)]) == 2
        assert capsys.readouterr().err == (
            f"workbench: error: --port {port}: 127.0.0.1:{port} is already in use; stop what "
            "listens there or choose another --port\n")
        assert not (folder / "experiments").exists()
    finally:
        shutil.rmtree(folder)


@pytest.mark.unit
def test_status_and_stop_when_nothing_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WORKBENCH_EXPERIMENTS", str(tmp_path / "experiments"))
    assert cli.main(["server", "status"]) == 1
    assert capsys.readouterr().out == f"not running; files {tmp_path / 'experiments' / 'server'}\n"
    assert cli.main(["server", "stop"]) == 0
    assert capsys.readouterr().out == "not running\n"


@pytest.mark.unit
def test_a_recycled_pid_in_server_json_is_never_signalled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """After a reboot the recorded pid may be another program's: here, pytest's own."""
    monkeypatch.setenv("WORKBENCH_EXPERIMENTS", str(tmp_path / "experiments"))
    layout = default_layout()
    layout.root.mkdir(parents=True)
    layout.state_file.write_text(json.dumps({
        "url": "http://127.0.0.1:5050", "host": "127.0.0.1", "port": 5050, "pg_port": 5433,
        "pid": os.getpid(), "started_at": "2026-01-01T00:00:00+0000"}))
    assert cli.main(["server", "status"]) == 1
    assert capsys.readouterr().out.startswith("not running;")
    assert cli.main(["server", "stop"]) == 0  # we are still here: nothing was signalled
    assert capsys.readouterr().out == "not running\n"
    assert not layout.state_file.exists()


def run_cli_prefix() -> list[str]:
    """``python -m workbench`` with this interpreter."""
    return [sys.executable, "-m", "workbench"]


# --------------------------------------------------------------------------- the real server


@pytest.mark.slow
def test_server_requires_a_login_and_stores_runs_in_postgresql(team_server: TeamServer) -> None:
    url = team_server.url
    assert processes.http_status(f"{url}/health") == 200
    search = f"{url}/api/2.0/mlflow/experiments/search?max_results=1"
    assert processes.http_status(search) == 401
    assert processes.http_status(search, auth=(ALICE, "wrong-password-123")) == 401
    assert processes.http_status(search, auth=(ALICE, team_server.alice_password)) == 200
    assert processes.http_status(search, auth=("admin", team_server.admin_password)) == 200

    state = json.loads((team_server.root / "server" / "server.json").read_text())
    assert state["host"] == "127.0.0.1" and state["url"] == url
    # PostgreSQL: the tracking and auth databases exist; it listens on no TCP address.
    rows = psql(team_server, "postgres", "SELECT datname FROM pg_database ORDER BY datname")
    assert {"mlflow", "mlflow_auth"} <= set(rows)
    assert psql(team_server, "postgres", "SHOW listen_addresses") == [""]
    assert ALICE in psql(team_server, "mlflow_auth", "SELECT username FROM users")

    again = team_server.cli("server", "start", user=None, extra_env={
        "WORKBENCH_EXPERIMENTS": str(team_server.root),
        server.ADMIN_PASSWORD_ENV: team_server.admin_password})
    assert again.returncode == 0, again.stderr
    assert f"(pid {team_server.pid};" in again.stdout  # the running server, not a second one
    status = team_server.cli("server", "status", user=None,
                             extra_env={"WORKBENCH_EXPERIMENTS": str(team_server.root)})
    assert status.returncode == 0
    assert status.stdout.startswith(f"running: {url} (pid {team_server.pid}, healthy); "
                                    "postgresql running;")


@pytest.mark.slow
def test_training_without_a_login_is_refused_before_anything_starts(
    team_server: TeamServer,
) -> None:
    done = team_server.cli("train", *TINY, "tracking=server", f"tracking.uri={team_server.url}",
                           "tracking.experiment=team-refused", user=None)
    assert done.returncode == 2
    assert done.stderr == (f"workbench: error: tracking server {team_server.url}: the login is "
                           "missing (401); export MLFLOW_TRACKING_USERNAME and "
                           "MLFLOW_TRACKING_PASSWORD of your account\n")
    assert psql(team_server, "mlflow",
                "SELECT name FROM experiments WHERE name = 'team-refused'") == []


@pytest.mark.slow
def test_concurrent_trainings_log_complete_runs(team_server: TeamServer) -> None:
    """Two clients at once (what a 2-worker sweep does): two complete runs, no duplicates."""
    experiment = "team-concurrent"
    processes = [
        subprocess.Popen(
            [*run_cli_prefix(), "train", *TINY, f"seed={seed}", "tracking=server",
             f"tracking.uri={team_server.url}", f"tracking.experiment={experiment}"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=team_server.env(),
            cwd=Path(__file__).resolve().parents[1],
        )
        for seed in (0, 1)
    ]
    run_ids = []
    for process in processes:
        out, err = process.communicate(timeout=600)
        team_server.outputs += [out, err]
        assert process.returncode == 0, err
        run_ids.append(out.strip().splitlines()[-1])

    with logged_in(ALICE, team_server.alice_password):
        client = MlflowClient(team_server.url)
        exp = client.get_experiment_by_name(experiment)
        assert exp is not None
        runs = client.search_runs([exp.experiment_id])
        assert sorted(r.info.run_id for r in runs) == sorted(run_ids)
        expected_params = set(runs[0].data.params)
        for run in runs:
            assert run.info.status == "FINISHED"
            assert set(run.data.params) == expected_params
            assert run.data.params["total_timesteps"] == "384"
            history = client.get_metric_history(run.info.run_id, "rollout/ep_rew_mean")
            assert [m.step for m in history] == [128, 256, 384]
            assert "summary/eval_mean_reward" in run.data.metrics
            files = {f.path for f in client.list_artifacts(run.info.run_id)}
            assert {"manifest.json", "config.yaml", "model"} <= files
            assert {f.path for f in client.list_artifacts(run.info.run_id, "model")} == {
                "model/config.yaml", "model/manifest.json", "model/model.zip",
                "model/vecnormalize.pkl"}  # env.normalize is on by default
        assert sorted(r.data.tags["seed"] for r in runs) == ["0", "1"]
    # The rows really are in PostgreSQL.
    assert sorted(psql(team_server, "mlflow", "SELECT run_uuid FROM runs WHERE experiment_id = "
                       f"{int(exp.experiment_id)}")) == sorted(run_ids)


@pytest.mark.slow
def test_two_point_sweep_with_two_workers_logs_complete_runs(team_server: TeamServer) -> None:
    """`workbench sweep` against the server: a parent and two children, all complete."""
    experiment = "team-sweep"
    point_tiny = [o for o in TINY if o.split("=")[0] not in ("env.num_envs", "algo.n_steps")]
    done = team_server.cli(
        "sweep", "sweep.num_envs=[1,2]", "sweep.n_steps=[64]", "sweep.workers=2", *point_tiny,
        "tracking=server", f"tracking.uri={team_server.url}", f"tracking.experiment={experiment}",
        extra_env={"WORKBENCH_CPU_BUDGET": "2"}, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]

    with logged_in(ALICE, team_server.alice_password):
        client = MlflowClient(team_server.url)
        exp = client.get_experiment_by_name(experiment)
        assert exp is not None
        runs = client.search_runs([exp.experiment_id])
        (parent,) = [r for r in runs if r.data.tags.get("sweep.role") == "parent"]
        children = [r for r in runs if r.data.tags.get("sweep.role") == "child"]
        assert parent.info.status == "FINISHED"
        assert sorted(r.info.run_name for r in children) == [
            "halfcheetah-ne1-ns64-s0", "halfcheetah-ne2-ns64-s0"]
        for run in children:
            assert run.info.status == "FINISHED"
            assert run.data.tags["sweep_id"] == parent.data.tags["sweep_id"]
            assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
            rollout = int(run.data.params["derived.rollout_size"])  # 64 or 128
            history = client.get_metric_history(run.info.run_id, "rollout/ep_rew_mean")
            assert [m.step for m in history] == list(range(rollout, 384 + 1, rollout))
            assert "summary/eval_mean_reward" in run.data.metrics
            assert {f.path for f in client.list_artifacts(run.info.run_id, "model")} >= {
                "model/config.yaml", "model/model.zip"}
    rows = psql(team_server, "mlflow", "SELECT run_uuid FROM runs WHERE experiment_id = "
                f"{int(exp.experiment_id)}")
    assert sorted(rows) == sorted(r.info.run_id for r in runs)  # 3 rows: no duplicates


@pytest.mark.slow
def test_no_credential_reaches_a_file_row_param_tag_or_output(team_server: TeamServer) -> None:
    """Runs last in this module: everything the team tests produced so far is searched."""
    secrets_ = [team_server.admin_password, team_server.alice_password]
    # The search works: the server's environment is where the admin password must be.
    environ = Path(f"/proc/{team_server.pid}/environ").read_bytes()
    assert team_server.admin_password.encode() in environ
    assert team_server.admin_password.encode() not in Path(
        f"/proc/{team_server.pid}/cmdline").read_bytes()

    files = [p for p in team_server.root.rglob("*") if p.is_file()]
    names = {p.name for p in files}
    assert {"mlflow.log", "postgres.log", "model.zip", "basic_auth.ini"} <= names
    assert any(p.suffix == ".ipynb" for p in files)  # the sweep's executed notebooks
    for path in files:
        data = path.read_bytes()
        for secret in secrets_:
            assert secret.encode() not in data, f"credential found in {path}"

    dumps = [pg_dump(team_server, db) for db in ("mlflow", "mlflow_auth")]
    assert "halfcheetah" in dumps[0]  # the dump holds the runs
    with logged_in("admin", team_server.admin_password):
        client = MlflowClient(team_server.url)
        runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) >= 2
    values = [v for r in runs for v in [*r.data.params.values(), *r.data.tags.values()]]
    texts = [*dumps, *values, *team_server.outputs]
    for secret in secrets_:
        assert not [t for t in texts if secret in t]


def pg_dump(team: TeamServer, database: str) -> str:
    """A plain-SQL dump of ``database`` (the whole store, as an administrator would see it)."""
    layout = Layout(team.root / "server")
    state = server.read_state(layout)
    assert state is not None
    done = subprocess.run(
        [str(postgres.postgres_bin_dir() / "pg_dump"), "-h", str(layout.socket_dir),
         "-p", str(state.pg_port), "-U", postgres.DB_ROLE, database],
        capture_output=True, text=True, check=True, timeout=120,
    )
    return done.stdout


@pytest.mark.slow
def test_training_into_someone_elses_experiment_is_one_line(team_server: TeamServer) -> None:
    """The team server refuses the run (403): exit 2 in one line, no run, no traceback."""
    from mlflow.tracking import MlflowClient

    from tests.teamserver import logged_in

    with logged_in("admin", team_server.admin_password):
        MlflowClient(team_server.url).create_experiment("team-admin-only")
    done = team_server.cli("train", *TINY, "tracking=server", f"tracking.uri={team_server.url}",
                           "tracking.experiment=team-admin-only")
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.splitlines()[-1] == (
        f"workbench: error: tracking server {team_server.url}: your login may not create runs "
        "in experiment 'team-admin-only' (403); ask its owner for EDIT permission, or train "
        "into your own experiment (tracking.experiment=NAME)")
    assert "Traceback" not in done.stderr
    assert psql(team_server, "mlflow", "SELECT r.run_uuid FROM runs r JOIN experiments e ON "
                "r.experiment_id = e.experiment_id WHERE e.name = 'team-admin-only'") == []
