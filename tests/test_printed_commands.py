"""Every command the workbench prints for a user to copy is one its parser accepts.

Each text is produced by the real function that prints or writes it (the model card of a Hub
bundle, the resume hints of a stopped or reaped run, the end of a study, the best-trial
preset, the header of ``workbench train --help``), its placeholders are replaced by realistic
values, and each ``workbench ...`` command in it is split as a shell would split it and parsed
by ``workbench.cli.parse``, the parser ``workbench`` itself runs. A ``train`` command's
overrides are composed too (``workbench.config.load_config``): the parser alone accepts any
``key=value``. Commands named in the code's messages between backticks are checked the same
way (a bare command name, e.g. "the directory printed by `workbench hub pull`", must at least
name a real command).
"""

from __future__ import annotations

import argparse
import ast
import re
import shlex
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from workbench import cli, config
from workbench.config import ConfigError
from workbench.deploy import hub

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "lib" / "workbench"

RUN_ID = "4f1c2b7d9e0a4c6b8d2e1f3a5b7c9d0e"  # an MLflow run id: 32 hex digits
COMMIT = "3b2f0c9d8e7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c"  # a Hub commit: 40 hex digits
REPO = "my-org/ppo-hopper"
STUDY = "hopper-ttt"

pytestmark = pytest.mark.unit


# --------------------------------------------------------------------------- helpers


def shell_operators(command: str) -> list[str]:
    """Redirections, pipes and separators a shell would see in ``command`` (``<id>`` is one)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    return [token for token in lexer if token and set(token) <= set("();<>|&")]


def parse_command(command: str) -> argparse.Namespace:
    """``command`` parsed by the workbench's own parser; a train command's overrides composed."""
    assert not shell_operators(command), f"{command!r}: a shell reads {shell_operators(command)}"
    argv = shlex.split(command)
    assert argv[:1] == ["workbench"], command
    try:
        args, _ = cli.parse(argv[1:])
    except cli.BadInput as exc:
        pytest.fail(f"{command!r} does not parse: {exc}")
    if args.command == "train":
        try:
            config.load_config(args.overrides)
        except ConfigError as exc:
            pytest.fail(f"{command!r}: the config does not accept its overrides: {exc}")
    return args


def command_lines(text: str) -> list[str]:
    """Every line of ``text`` that is a ``workbench`` command."""
    return [line.strip() for line in text.splitlines() if line.strip().startswith("workbench ")]


def after(marker: str, text: str) -> str:
    """The rest of the line after ``marker`` (a command printed inline)."""
    found = re.search(re.escape(marker) + r"(.*)$", text, re.MULTILINE)
    assert found, f"{marker!r} not in {text!r}"
    return found.group(1).strip()


# --------------------------------------------------------------------------- the model card


def card(repo_id: str | None, **index: object) -> str:
    """A model card from ``hub.model_card`` for a small Hopper run (no store, no export)."""
    cfg = config.load_config(["env=hopper", "env.num_envs=4", "seed=3", "total_timesteps=50000"])
    fields = {
        "env_id": cfg.env.id, "run_id": RUN_ID, "run_name": "hopper-ne4-s3",
        "eval_mean_reward": 2412.5, "eval_std_reward": 12.25, "eval_episodes": 10,
        "num_timesteps": 50176, "init_hub_commit": None, "algo": "PPO", **index,
    }
    report = {
        "replay": {"mean_return": 2400.0, "std_return": 10.0, "episodes": 3},
        "parity": {"observations": 256, "onnx_max_abs_diff": 1e-6,
                   "torchscript_max_abs_diff": 0.0},
    }
    return hub.model_card(fields, cfg, report, None, repo_id=repo_id)


def test_model_card_pull_command_names_the_pushed_repository() -> None:
    text = card(REPO)
    pulls = [line for line in command_lines(text) if line.startswith("workbench hub ")]
    assert len(pulls) == 1, text
    args = parse_command(pulls[0].replace(hub.COMMIT_PLACEHOLDER, COMMIT))
    assert (args.command, args.hub_action, args.repo_id, args.revision) == (
        "hub", "pull", REPO, COMMIT)
    assert hub.COMMIT_PLACEHOLDER in text.split(pulls[0])[0].splitlines()[-1]  # explained


def test_model_card_commands_parse_without_a_known_repository() -> None:
    text = card(None)
    lines = command_lines(text)
    assert {line.split()[1] for line in lines} == {"hub", "train"}, text
    for line in lines:
        filled = line.replace(hub.REPO_PLACEHOLDER, REPO).replace(hub.COMMIT_PLACEHOLDER, COMMIT)
        args = parse_command(filled)
        if args.command == "train":
            assert args.overrides, line  # the run's differences to its defaults
    assert "<" not in "".join(lines)  # no <placeholder> left for a shell to read as a file


def test_model_card_reproduce_command_of_a_run_started_from_a_bundle() -> None:
    cfg_overrides = [f"init.hub_repo_id={REPO}", "init.hub_revision=v1"]
    cfg = config.load_config(["env=hopper", *cfg_overrides])
    report = {"replay": {"mean_return": 1.0, "std_return": 0.0, "episodes": 1},
              "parity": {"observations": 1, "onnx_max_abs_diff": 0.0,
                         "torchscript_max_abs_diff": 0.0}}
    index = {"env_id": cfg.env.id, "run_id": RUN_ID, "run_name": "r", "eval_mean_reward": 1.0,
             "eval_std_reward": 0.0, "eval_episodes": 1, "num_timesteps": 2048,
             "init_hub_commit": COMMIT, "algo": "PPO"}
    text = hub.model_card(index, cfg, report, None, repo_id=REPO)
    (train,) = [line for line in command_lines(text) if line.startswith("workbench train ")]
    args = parse_command(train)
    composed = config.load_config(args.overrides)
    assert composed.init.hub_revision == COMMIT  # the commit, not the tag, which may move


# --------------------------------------------------------------------------- resume hints


def test_stopped_run_hint_resumes_it() -> None:
    from workbench.training.lifecycle import stopped_line

    hint = after("resume with: ", stopped_line(RUN_ID, "KILLED", "checkpoints/step-000000004096"))
    args = parse_command(hint)
    assert args.overrides == [f"resume={RUN_ID}"]


def test_stopped_notebook_run_hint_resumes_it() -> None:
    from workbench.training.lifecycle import stopped_line

    err = stopped_line(RUN_ID, "KILLED", "checkpoints/step-000000004096", notebook=True)
    papermill = re.search(r"-y \"([^\"]+)\"", err)
    assert papermill, err
    overrides = yaml.safe_load(papermill.group(1))["overrides"]
    assert overrides == [f"resume={RUN_ID}"]
    config.load_config(overrides)


def test_reaped_run_error_tag_resumes_it() -> None:
    from workbench.tracking import runs

    logged: dict[str, object] = {}
    client = SimpleNamespace(
        log_batch=lambda run_id, tags: logged.update({t.key: t.value for t in tags}),
        set_terminated=lambda run_id, status, end_time: logged.update(status=status),
    )
    run = SimpleNamespace(info=SimpleNamespace(run_id=RUN_ID, start_time=1_700_000_000_000),
                          data=SimpleNamespace(tags={}))
    runs.mark_reaped(client, run, age=900.0, now=1_700_000_900.0)
    args = parse_command(after("resume with: ", str(logged["error"])))
    assert args.overrides == [f"resume={RUN_ID}"]


def test_resume_of_a_live_run_names_a_reap_that_parses() -> None:
    from workbench.tracking import runs
    from workbench.training.resume import check_not_alive

    beat = f"{time.time() - 120:.0f}"  # alive: younger than runs.DEFAULT_STALE_AFTER_S
    run = SimpleNamespace(
        info=SimpleNamespace(run_id=RUN_ID, status="RUNNING", start_time=0),
        data=SimpleNamespace(tags={runs.HEARTBEAT_TAG: beat}),
    )
    with pytest.raises(ConfigError) as refused:
        check_not_alive(run)
    command = re.search(r"`(workbench runs reap[^`]*)`", str(refused.value))
    assert command, refused.value
    args = parse_command(command.group(1))
    assert args.older_than >= 100


# --------------------------------------------------------------------------- tuning


def test_study_end_and_best_preset_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from workbench.tuning import best, study
    from workbench.tuning.objectives import Objective

    monkeypatch.setenv("WORKBENCH_EXPERIMENTS", str(tmp_path / "experiments"))
    objective = Objective("time_to_target", target=2000.0, budget_s=120.0)
    cfg = config.load_config(["env=hopper"])
    text = best.best_config_text(STUDY, objective, 3, 61.0, RUN_ID, cfg, {"n_epochs": 5})
    path = best.write_best_config(STUDY, text)

    result = SimpleNamespace(
        study=STUDY, status="FINISHED", wall_s=600.0, records=[], trials_in_study=6,
        best=None, best_config=str(path), parent_run_id=RUN_ID, recheck=None,
    )
    plan = SimpleNamespace(out_dir=tmp_path / "trials", objective=objective, seeds=(),
                           storage="sqlite:///optuna.db", experiment="workbench",
                           tracking_uri="sqlite:///mlflow.db")
    study.print_results(result, plan)
    out = capsys.readouterr().out
    commands = [after("->  ", out), after("report             : ", out),
                after("# Train it: ", text).split("  ")[0]]
    parsed = [parse_command(command) for command in commands]  # composes experiment=tuned/...
    assert [a.command for a in parsed] == ["train", "report", "train"]
    assert parsed[0].overrides == parsed[2].overrides == [f"experiment=tuned/{STUDY}"]
    assert parsed[1].study == STUDY


# --------------------------------------------------------------------------- the CLI's help


def test_train_help_names_a_command_that_parses() -> None:
    epilog = cli.config_epilog()
    command = after("without training: ", epilog).replace("[OVERRIDES]", "env=hopper")
    assert parse_command(command).cfg == "job"


# --------------------------------------------------------------------------- messages


DOCUMENTED = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef


def backticked_commands() -> list[tuple[str, str]]:
    """``(where, command)`` for every `workbench ...` between single backticks in a string of
    lib/workbench (docstrings left out: they describe, the messages are copied); an f-string's
    fields read ``{}``."""
    found = []
    for path in sorted(LIB.rglob("*.py")):
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, DOCUMENTED) and node.body
                      and isinstance(node.body[0], ast.Expr)}
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                text = "".join(v.value if isinstance(v, ast.Constant) else "{}"
                               for v in node.values)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                if id(node) in docstrings:
                    continue
                text = node.value
            else:
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            found += [(where, m.group(1)) for m in re.finditer(r"(?<!`)`(workbench [^`]+)`", text)]
    return found


# What an f-string's field stands for in a message's command, by the flag before it.
FIELDS = {"--older-than {}": "--older-than 900", "experiment=tuned/{}": f"experiment=tuned/{STUDY}",
          "sweep {}": "sweep algo.gamma=0.9,0.99",
          "resume={}": "resume=0a1b2c3d4e5f40718293a4b5c6d7e8f9"}


def test_commands_in_messages_parse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    found = backticked_commands()
    assert len(found) >= 15, found  # the scan finds the messages' commands
    monkeypatch.setenv("WORKBENCH_EXPERIMENTS", str(tmp_path / "experiments"))
    tuned = tmp_path / "experiments" / "conf" / "experiment" / "tuned" / f"{STUDY}.yaml"
    tuned.parent.mkdir(parents=True)
    tuned.write_text("# @package _global_\nexperiment_name: tuned\n")
    for where, command in found:
        for field, value in FIELDS.items():
            command = command.replace(field, value)
        assert "{}" not in command, f"{where}: no realistic value for a field of {command!r}"
        argv = shlex.split(command)
        words = [w for w in argv[1:] if not w.startswith("-") and "=" not in w]
        if len(words) == len(argv) - 1:  # a command's name: it must exist (its --help works)
            with pytest.raises(SystemExit) as shown:
                cli.parse([*argv[1:], "--help"])
            assert shown.value.code == 0, f"{where}: {command!r} is not a workbench command"
        elif "--help" in argv:
            with pytest.raises(SystemExit) as shown:
                cli.parse(argv[1:])
            assert shown.value.code == 0, f"{where}: {command!r}"
        else:
            parse_command(command)
