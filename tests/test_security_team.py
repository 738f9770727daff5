"""Team-server refusals are asked for first and answered in one line.

On the session's real team server (tests/teamserver.py: PostgreSQL, basic auth), alice trains
a run in her experiment; bob, another user, has the server's default READ permission on it.
What bob's commands would have the server refuse (resume, promote) is asked before any work
and answered in one line, exit 2, with alice's run as it was; what bob may do (evaluate her
policy) writes into his own experiment, linked to her run. A non-admin's ``runs sync`` of a
run the server lost re-creates it where the login may write, and says whom to ask where it
may not.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from workbench import cli
from workbench.tracking import journal

from tests.conftest import TINY
from tests.teamserver import ALICE, TeamServer, logged_in

BOB = "bob"


@dataclass(frozen=True)
class Team:
    """The server, alice's finished run and bob's password."""

    server: TeamServer
    run_id: str
    bob_password: str

    def use(self, monkeypatch: pytest.MonkeyPatch, user: str, experiments: Path) -> None:
        """This process as a client of the server, logged in as ``user``."""
        password = self.bob_password if user == BOB else self.server.alice_password
        monkeypatch.setenv("MLFLOW_TRACKING_URI", self.server.url)
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", user)
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
        monkeypatch.setenv("WORKBENCH_EXPERIMENTS", str(experiments))

    def admin(self) -> MlflowClient:
        return MlflowClient(self.server.url)


@pytest.fixture(scope="module")
def team(team_server: TeamServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Team]:
    """Bob's account, and a tiny run of alice's with checkpoints in her own experiment."""
    from mlflow.server import get_app_client
    from workbench.training import load_config, train

    bob_password = "bob-" + secrets.token_urlsafe(18)
    with logged_in("admin", team_server.admin_password):
        get_app_client("basic-auth", tracking_uri=team_server.url).create_user(BOB, bob_password)
    found = Team(team_server, "", bob_password)
    with pytest.MonkeyPatch.context() as patch:
        found.use(patch, ALICE, tmp_path_factory.mktemp("alice"))
        result = train(load_config([*TINY, "tracking.system_metrics=false",
                                    "console.iteration_lines=false", "tracking=server",
                                    f"tracking.uri={team_server.url}",
                                    "tracking.experiment=alice-runs",
                                    "checkpoint.every_steps=128"]))
    yield Team(team_server, result.run_id, bob_password)


@pytest.fixture()
def bob(team: Team, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Team:
    """This process as bob, with its experiments folder under ``tmp_path``."""
    team.use(monkeypatch, BOB, tmp_path / "experiments")
    return team


def run_state(team: Team) -> tuple[str, dict[str, str], set[str]]:
    """Alice's run as the admin sees it: status, tags, top-level artifacts."""
    with logged_in("admin", team.server.admin_password):
        client = team.admin()
        run = client.get_run(team.run_id)
        return (run.info.status, dict(run.data.tags),
                {a.path for a in client.list_artifacts(team.run_id)})


@pytest.mark.slow
def test_what_a_read_only_login_may_not_write_is_refused_in_one_line(
    bob: Team, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    team = bob
    before = run_state(team)
    refusal = (f"your login bob has READ on experiment 'alice-runs', so the team server "
               f"refuses any write to run {team.run_id} (403); ask its owner or an admin for "
               "EDIT permission on experiment 'alice-runs', or ")
    for argv, line in [
        (["train", f"resume={team.run_id}", "total_timesteps=512"],
         f"resume={team.run_id}: {refusal}train a new run in your own experiment"),
        (["promote", "--run", team.run_id, "--alias", "candidate"],
         f"--run {team.run_id}: {refusal.removesuffix(', or ')} (promote logs the export to "
         "the run), or promote a run of your own"),
    ]:
        assert cli.main(argv) == 2, argv
        captured = capsys.readouterr()
        assert captured.err == f"workbench: error: {line}\n", argv
    assert run_state(team) == before  # status, tags and artifacts as alice left them
    assert not (tmp_path / "experiments").exists()


@pytest.mark.slow
def test_eval_of_a_teammates_run_goes_into_the_callers_own_experiment(
    bob: Team, capsys: pytest.CaptureFixture[str],
) -> None:
    team = bob
    before = run_state(team)
    assert cli.main(["eval", "--run", team.run_id, "--profile", "gate", "seeds=[0]",
                     "episodes=1", "factors={obs_noise:[0.01]}"]) == 0
    printed = capsys.readouterr().out
    assert (f"note: your login bob has READ on the experiment of run {team.run_id}: the "
            "eval run goes into your experiment "
            "'workbench-bob', linked to it by tag robustness.source_run; the source run's "
            "tags are left as they are\n") in printed
    eval_id = printed.split("MLflow run: ")[1].split()[0]
    with logged_in(BOB, team.bob_password):
        client = MlflowClient(team.server.url)
        run = client.get_run(eval_id)
        assert client.get_experiment(run.info.experiment_id).name == "workbench-bob"
        assert run.data.tags["robustness.source_run"] == team.run_id
        assert run.info.status == "FINISHED"
        assert f"files: {run.info.artifact_uri}/robustness\n" in printed
    assert run_state(team) == before


def lost_run_outbox(experiments: Path, uri: str, experiment: str) -> str:
    """An outbox of bob's for a run the server does not have (a server set up anew), made
    in ``experiment``: its id."""
    run_id = uuid.uuid4().hex
    folder = experiments / "outbox" / run_id
    folder.mkdir(parents=True)
    record = journal.encode_batch([], [], [])
    record.update(seq=1, metrics=[["loss", 1.0, 1_700_000_000_000, 64]])
    journal.Journal(folder).append(record)
    journal.write_info(folder, {"tracking_uri": uri, "run_id": run_id, "user": BOB, "origin": {
        "experiment": experiment, "run_name": "lost", "start_time": 1_700_000_000_000,
        "tags": {}, "params": {}, "resumed_from_step": None}})
    return run_id


@pytest.mark.slow
def test_a_non_admins_sync_of_a_run_the_server_lost_recreates_it_where_it_may(
    bob: Team, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    experiments, url = tmp_path / "experiments", bob.server.url
    # In an experiment bob may write (his own, gone with the server): re-created.
    mine = lost_run_outbox(experiments, url, "bob-runs")
    assert cli.main(["runs", "sync"]) == 0
    out = capsys.readouterr().out
    assert f"synced {mine}: 1 write(s) delivered" in out and "re-created as" in out
    assert not (experiments / "outbox" / mine).exists()
    # In alice's experiment, which bob may only read: one line saying whom to ask.
    theirs = lost_run_outbox(experiments, url, "alice-runs")
    folder = experiments / "outbox" / theirs
    assert cli.main(["runs", "sync"]) == 2
    assert capsys.readouterr().err == (
        f"workbench: error: tracking server {url}: the login bob may not write run {theirs} "
        f"(403): it has READ on experiment 'alice-runs'; its writes are kept in {folder}: ask "
        "the experiment's owner or an admin for EDIT permission and rerun `workbench runs "
        "sync`\n")
    assert journal.Journal(folder).pending()  # kept
