"""Hostile values never hang, duplicate or crash: each answers in one line, fast.

Names past their documented length or holding control characters stop at the config
pre-check; secret masking stays linear in the length of what it masks; a failure while a
sweep or a study sets up closes its parent run; run data printed to a terminal has its control
characters escaped (docs/robustness.md, "Hostile input").
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from workbench import cli, config
from workbench.config import ConfigError

from .conftest import TINY, run_cli

GRID_SET = ("env.num_envs", "algo.n_steps")
POINT_TINY = [o for o in TINY if o.split("=")[0] not in GRID_SET] + [
    "tracking.system_metrics=false"]


# --------------------------------------------------------------------------- masking


# Shapes that made the old masking regex backtrack: one long run of name characters, a
# credential word repeated, assignments everywhere, URIs with colons.
MASKING_TIMES = """
import json, sys, time
from workbench.tracking.redaction import scrub, scrub_command
shapes = {"letters": "a", "words": "token", "assignments": "token=", "pairs": "a=b ",
          "uris": "://a:"}
times = {}
for name, unit in shapes.items():
    for size in (100_000, 1_000_000):
        text = unit * (size // len(unit))
        started = time.perf_counter()
        scrub_command(text, ["abcdefghij"])
        scrub({"run_name": text})
        times[f"{name}-{size}"] = time.perf_counter() - started
print(json.dumps(times))
"""


def test_masking_a_megabyte_is_linear() -> None:
    # A subprocess with a deadline: a quadratic masking takes minutes on 100 kB.
    proc = subprocess.run([sys.executable, "-c", MASKING_TIMES], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    times = json.loads(proc.stdout)
    for shape in ("letters", "words", "assignments", "pairs", "uris"):
        small, large = times[f"{shape}-100000"], times[f"{shape}-1000000"]
        # Linear: 10x the text, about 10x the time (quadratic would be 100x); the floor keeps
        # timer noise on tiny times from counting.
        assert large < 30 * max(small, 0.01), (shape, small, large)
        assert large < 10, (shape, large)


def test_masking_keeps_what_it_masked_before() -> None:
    from workbench.tracking.redaction import scrub_command

    cases = {
        "api_key=abc def": "api_key=*** def",
        "+db_password=x": "+db_password=***",
        "tokenizers==0.15": "tokenizers==0.15",
        "a=b,token=xyz": "a=b,token=***",
        "x HF_TOKEN=hf_abc y": "x HF_TOKEN=*** y",
        "a_token+x=val": "a_token+x=val",
        "k=token=3": "k=token=***",
        "pass 'password=ab'": "pass 'password=***'",
        "access-key=zz access_key=yy apikey=1": "access-key=zz access_key=*** apikey=***",
        "foo.secret.bar=1 a.b=c": "foo.secret.bar=*** a.b=c",
        "https://u:pw@host/x": "https://u:***@host/x",
    }
    assert {text: scrub_command(text, []) for text in cases} == cases


# --------------------------------------------------------------------------- names


LONG_NAMES = [
    ("tracking.run_name", "a" * 100_000),
    ("tracking.experiment", "e" * 600),
    ("sweep.id", "s" * 300),
    ("sweep.name", "n" * 300),
    ("tune.study", "t" * 300),
    ("+tracking.tags.team", "v" * 5000),
    ("+tracking.tags." + "k" * 200, "v"),
]


@pytest.mark.unit
@pytest.mark.parametrize(("key", "value"), LONG_NAMES, ids=[k[:30] for k, _ in LONG_NAMES])
def test_long_names_stop_at_the_precheck(key: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        config.precheck([f"{key}={value}"])
    line = str(info.value)
    assert "\n" not in line and len(line) < 300, line
    assert "allowed; shorten it" in line, line


@pytest.mark.unit
def test_names_with_control_characters_stop_at_the_check() -> None:
    cfg = config.load_config(["tracking.run_name=ok"])
    cfg.tracking.run_name = "ok\nworkbench: error: forged"
    with pytest.raises(ConfigError, match=r"^tracking.run_name='ok\\nworkbench: error: forg"):
        config.check_values(cfg)
    cfg.tracking.run_name = "ok"
    cfg.tracking.tags = {"x": "\x1b]52;c;aGk=\x07"}
    with pytest.raises(ConfigError, match="control or invisible character"):
        config.check_values(cfg)


@pytest.mark.parametrize("argv", [
    ["train", "tracking.run_name=" + "a" * 100_000],
    ["sweep", "sweep.id=" + "s" * 300],
    ["tune", "tune.study=" + "t" * 300],
], ids=["train", "sweep", "tune"])
def test_long_names_answer_in_one_line(argv: list[str]) -> None:
    proc = run_cli(*argv, timeout=60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("workbench: error: "), lines


@pytest.mark.unit
def test_a_sweep_id_with_a_trailing_newline_is_refused() -> None:
    from workbench.sweeps.request import check_sweep_settings

    with pytest.raises(ConfigError, match="sweep.id='abc\\\\n': use letters"):
        check_sweep_settings(config.SweepConfig(id="abc\n"))


# --------------------------------------------------------------------------- parents


@pytest.mark.unit
def test_a_sweep_that_fails_setting_up_closes_its_parent(
        store: object, monkeypatch: pytest.MonkeyPatch) -> None:
    from workbench.sweeps import sweep
    from workbench.sweeps.executors import LocalExecutor
    from workbench.sweeps.plan import plan_sweep

    plan = plan_sweep(["sweep.num_envs=[1]", "sweep.n_steps=[64]", *POINT_TINY])

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(36, "File name too long")

    monkeypatch.setattr(sweep, "reap_dead_points", refuse)
    with pytest.raises(OSError, match="File name too long"):
        sweep.sweep_with(plan, LocalExecutor(1))
    client = MlflowClient(plan.tracking_uri)
    experiment = client.get_experiment_by_name(plan.experiment)
    (parent,) = client.search_runs([experiment.experiment_id], "tags.`sweep.role` = 'parent'")
    assert parent.info.status == "FAILED"
    assert "File name too long" in parent.data.tags["error"]


# --------------------------------------------------------------------------- search spaces


SPACES = [
    ("search.params.n_steps.choices=[64,'a']", "'a' does not fit algo.n_steps"),
    ("search.params.n_steps.choices=[64,96.5]", "96.5 does not fit algo.n_steps"),
    ("search.params.gamma.choices=['x']", "'x' does not fit algo.gamma"),
    ("+search.params.activation={choices:[tanh,'$\\\\x$']}",
     "does not fit algo.policy.activation; each choice must be one of tanh"),
    ("+search.params.normalize={choices:[true,'1']}", "each choice must be true or false"),
]


@pytest.mark.unit
@pytest.mark.parametrize(("override", "named"), SPACES, ids=[s for s, _ in SPACES])
def test_choices_of_the_wrong_type_stop_before_a_study(override: str, named: str) -> None:
    from workbench.tuning.request import check_request

    with pytest.raises(ConfigError) as info:
        check_request([override])
    assert named in str(info.value)
    assert str(info.value).startswith("search.params.")


# --------------------------------------------------------------------------- stores


def sqlite_with_tables(path: Path, tables: tuple[str, ...], rows: int = 400) -> None:
    """A SQLite file of a few hundred pages holding ``tables`` (rows of 1 kB each)."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        for table in tables:
            db.execute(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, body TEXT)")
            db.executemany(f"INSERT INTO {table} (body) VALUES (?)",
                           [("x" * 1000,) for _ in range(rows)])
        db.commit()


def truncated_store(root: Path) -> Path:
    """An MLflow-shaped SQLite store cut to the first half of its bytes."""
    root.mkdir(parents=True, exist_ok=True)
    db = root / "mlflow.db"
    sqlite_with_tables(db, ("alembic_version", "experiments", "runs", "params"))
    os.truncate(db, db.stat().st_size // 2)
    return db


RUN_A, RUN_B = "0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210"
STORE_COMMANDS = [
    ["report"],
    ["runs", "reap"],
    ["runs", "copy", "--from", "STORE", "--to", "sqlite:///OUT/copy.db"],
    ["manifest", "diff", RUN_A, RUN_B],
    ["manifest", "lock", RUN_A],
    ["train", *TINY],
    ["sweep", "sweep.num_envs=[1]", "sweep.n_steps=[64]", *POINT_TINY],
    ["tune", *TINY, "total_timesteps=10000"],
]


@pytest.mark.parametrize("argv", STORE_COMMANDS, ids=[" ".join(a[:2]) for a in STORE_COMMANDS])
def test_a_truncated_store_is_one_line(argv: list[str], bare_store: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    from workbench.cli import main

    db = truncated_store(bare_store)
    uri = f"sqlite:///{db}"
    before = sorted(p.name for p in bare_store.iterdir())
    argv = [a.replace("STORE", uri).replace("OUT", str(bare_store.parent / "out")) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"workbench: error: tracking store {uri}: mlflow.db is corrupt "
                             "or truncated"), err
    assert "restore it from a backup" in err[0]
    assert sorted(p.name for p in bare_store.iterdir()) == before  # no optuna.db, lock, folder


@pytest.mark.unit
def test_another_applications_sqlite_file_is_refused_untouched(tmp_path: Path) -> None:
    from workbench.tracking.store import make_client

    db = tmp_path / "app.db"
    sqlite_with_tables(db, ("users", "orders"), rows=3)
    content = db.read_bytes()
    with pytest.raises(ConfigError, match=r"app.db holds another application's tables "
                                          r"\(orders, users\), not MLflow's"):
        make_client(f"sqlite:///{db}")
    assert db.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]


# --------------------------------------------------------------------------- run data printed


def test_printable_escapes_controls_and_keeps_text() -> None:
    from workbench.console import printable, printable_lines

    assert printable("a\nb\x1b]52;c;aGk=\x07 \u202e\x9b é 中") == (
        "a\\nb\\x1b]52;c;aGk=\\x07 \\u202e\\x9b é 中")
    assert printable_lines("one\x1b[31m\ntwo") == "one\\x1b[31m\ntwo"


def test_a_forged_sweep_id_prints_as_one_escaped_line(
        store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from mlflow.entities import Metric
    from workbench.cli import main

    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    experiment = client.create_experiment("workbench")
    sweep_id = "demo\nworkbench: error: forged \x1b]52;c;aGk=\x07"
    parent = client.create_run(experiment, run_name="p",
                               tags={"sweep_id": sweep_id, "sweep.role": "parent"})
    for i in range(2):
        run = client.create_run(experiment, run_name=f"pt{i}\x1b[31m", tags={
            "sweep_id": sweep_id, "sweep.role": "child", "sweep.point": f"p{i}",
            "mlflow.parentRunId": parent.info.run_id})
        client.log_batch(run.info.run_id, metrics=[Metric("rollout/ep_rew_mean", i, 0, 64)])
        client.set_terminated(run.info.run_id)
    client.set_terminated(parent.info.run_id)
    assert main(["report", "--out", str(tmp_path / "reports")]) == 0
    captured = capsys.readouterr()
    text = captured.err + captured.out
    assert "\x1b" not in text and "\x07" not in text
    assert not any(line.startswith("workbench: error") for line in text.splitlines()), text
    assert "(sweep demo\\nworkbench: error: forged \\x1b]52;c;aGk=\\x07)" in captured.err


def test_deeply_nested_and_escaped_manifests_are_handled(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from workbench.cli import main
    from workbench.tracking.manifest import collect_manifest

    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    nested = tmp_path / "nested.json"
    nested.write_text(json.dumps({"python": {"a": json.loads("[" * 50 + "]" * 50)}}))
    for path in (deep, nested):
        assert main(["manifest", "diff", str(path), str(path)]) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and "nested" in err[0], err
    manifest = collect_manifest()
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(manifest))
    manifest["git"]["commit"] = "\x1b]52;c;aGk=\x07\x1b[2J"
    b.write_text(json.dumps(manifest))
    assert main(["manifest", "diff", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\\x1b]52;c;aGk=\\x07\\x1b[2J" in out


def test_a_manifest_whose_pip_freeze_holds_no_text_is_compared_as_data(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from workbench.cli import main
    from workbench.tracking.manifest import collect_manifest

    manifest = collect_manifest()
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(manifest))
    b.write_text(json.dumps({**manifest, "pip_freeze": [{"x": 1}, 5, None,
                                                         *manifest["pip_freeze"]],
                             "run": ["\x1b[2J"]}))
    assert main(["manifest", "diff", str(a), str(b)]) == 1
    captured = capsys.readouterr()
    rows = [line.split() for line in captured.out.splitlines()]
    assert ["pip_freeze", "#0", "-", '{"x":', "1}"] in rows
    assert ["pip_freeze", "#1", "-", "5"] in rows and ["pip_freeze", "#2", "-", "null"] in rows
    assert ["run", "hostname", manifest["run"]["hostname"], '["\\u001b[2J"]'] in rows
    assert captured.err == "" and "\x1b" not in captured.out


def test_a_mathtext_choice_draws_the_study_figures() -> None:
    import optuna
    from workbench.review.study import study_figures

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="s$\\undefined{$")
    study.optimize(lambda t: float(len(t.suggest_categorical("env.id", ["$\\undefined{$",
                                                                        "ok"]))),
                   n_trials=4)
    names = [f.filename for f in study_figures(study)]
    assert "study-history.png" in names and "study-slice.png" in names


def test_runs_copy_of_refused_data_is_one_line_and_leaves_no_half_copy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from mlflow.exceptions import MlflowException
    from workbench.cli import main

    source_uri = f"sqlite:///{tmp_path / 'source.db'}"
    dest_uri = f"sqlite:///{tmp_path / 'dest' / 'mlflow.db'}"
    source = MlflowClient(source_uri)
    experiment = source.create_experiment("workbench",
                                          artifact_location=(tmp_path / "art").as_uri())
    run = source.create_run(experiment, run_name="r\x1b[31m")
    source.log_text(run.info.run_id, "x", "bad\x1b[2Jname.txt")
    source.set_terminated(run.info.run_id)

    def refuse(*args: object, **kwargs: object) -> None:
        raise MlflowException("Invalid artifact path: 'bad\x1b[2Jname.txt'\nmore lines")

    monkeypatch.setattr(MlflowClient, "log_artifacts", refuse)
    assert main(["runs", "copy", "--from", source_uri, "--to", dest_uri]) == 2
    captured = capsys.readouterr()
    assert "\x1b" not in captured.out + captured.err
    assert "not copied r\\x1b[31m" in captured.out
    err = captured.err.splitlines()
    assert len(err) == 1 and err[0].startswith("workbench: error: runs copy: 1 run(s) not "
                                               "copied"), err
    dest = MlflowClient(dest_uri)
    copied = dest.search_runs([dest.get_experiment_by_name("workbench").experiment_id])
    assert copied == []


# --------------------------------------------------------------------------- sweep claims


@pytest.mark.unit
def test_a_point_is_claimed_by_one_sweep_at_a_time(tmp_path: Path) -> None:
    from workbench.sweeps.claim import claim_holder, point_claim

    claim = tmp_path / "sweeps" / "demo" / "p.claim"
    with point_claim(claim) as first:
        with point_claim(claim) as second:
            assert (first, second) == (True, False)
        assert claim_holder(claim) == str(os.getpid())
    with point_claim(claim) as again:  # released when the point ends
        assert again


HOLD_CLAIM = """
import sys, time
from pathlib import Path
from workbench.sweeps.claim import point_claim
with point_claim(Path(sys.argv[1])) as held:
    print(held, flush=True)
    time.sleep(60)
"""


def test_a_dead_sweeps_claim_is_taken_over(tmp_path: Path) -> None:
    from workbench.sweeps.claim import point_claim

    claim = tmp_path / "p.claim"
    owner = subprocess.Popen([sys.executable, "-c", HOLD_CLAIM, str(claim)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == "True"
        with point_claim(claim) as held:
            assert not held
    finally:
        owner.kill()  # SIGKILL: no cleanup of its own
        owner.wait(timeout=10)
    with point_claim(claim) as held:
        assert held


@pytest.mark.unit
def test_a_point_held_by_another_sweep_is_skipped_not_run(tmp_path: Path) -> None:
    from workbench.sweeps.claim import point_claim
    from workbench.sweeps.point import SKIPPED, PointSpec, execute_point

    spec = PointSpec(sweep_id="demo-1", point="p", parent_run_id="0" * 32, experiment_id="0",
                     tracking_uri="sqlite:///nowhere/never-opened.db", parameters={}, tags={},
                     env_vars={}, timeout=None)
    output = tmp_path / "p.ipynb"
    with point_claim(output.with_suffix(".claim")):
        outcome = execute_point(spec, output)
    assert outcome.status == SKIPPED and outcome.ok
    assert outcome.note is not None and "another `workbench sweep` of demo-1" in outcome.note
    assert not (tmp_path / "nowhere").exists()  # the store was not even asked


def test_an_error_quoting_a_huge_value_stays_a_readable_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A 120,000-character override that does not parse: the line names the input at its
    start and the fix at its end, with the middle of the value left out."""
    hostile = "tracking.run_name=" + "token=" * 20000
    assert cli.main(["train", hostile]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) <= cli.MAX_ERROR_LENGTH + len("workbench: error: \n")
    assert err.startswith("workbench: error: override 'tracking.run_name=token=token")
    assert "characters left out ...]" in err and err.rstrip().endswith("e.g. seed=3")
