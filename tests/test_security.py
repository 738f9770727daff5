"""Hostile and unlucky input at the trust boundaries: run data in reports, credentials.

What SECURITY.md promises, case by case: values that come from runs (names, tags, params,
descriptions: anyone who can write to a shared store chooses them) never become markup in
``report.md`` or ``index.html``, never break the figures and never block the team's default
``workbench report``; a password in the tracking URI or a secret in the environment is never
printed or stored. Pulled bundles and checkpoints are in tests/test_security_bundles.py; the
outbox and interruption guarantees in tests/test_failures.py and tests/test_interrupt.py.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest
from markdown_it import MarkdownIt
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient
from workbench.cli import main
from workbench.config import ConfigError
from workbench.review import records, render
from workbench.review.selection import Selection

from .conftest import TINY, run_cli
from .mlflowserver import MlflowServer

# Run data as a careless or hostile teammate could write it into a shared store.
SCRIPT = "<script>alert(1)</script>"
IMAGE = "<img src=x onerror=alert(2)>"
JS_LINK = "[click](javascript:alert(3))"
MATH = "$\\undefinedcommand{$"


def hostile_store(root: Path) -> tuple[MlflowClient, str, list[str]]:
    """A store with two finished runs whose names, tags, params and notes carry markup."""
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("hostile", artifact_location=(root / "art").as_uri())
    ids = []
    for i, name in enumerate([SCRIPT, f"{MATH} {JS_LINK}"]):
        run = client.create_run(exp, start_time=1000 + i, run_name=name, tags={
            "mlflow.note.content": f"{IMAGE} {JS_LINK}", "preset": IMAGE,
            "sweep.point": name})
        client.log_batch(run.info.run_id, params=[Param("algo.note", f"{MATH} {SCRIPT}"),
                                                  Param("seed", str(i))],
                         metrics=[Metric("summary/eval_mean_reward", 10.0 * i, 1000, 100)]
                         + [Metric("rollout/ep_rew_mean", float(s), 1000, s)
                            for s in (10, 20, 30)])
        client.set_terminated(run.info.run_id, "FINISHED", end_time=2000 + i)
        ids.append(run.info.run_id)
    return client, uri, ids


def test_run_data_never_becomes_markup_in_a_report(tmp_path: Path) -> None:
    client, uri, ids = hostile_store(tmp_path)
    report = records.build_report(client, Selection(run_ids=tuple(ids)), store=uri,
                                  name="hostile")  # the figures too: mathtext stays off
    index = render.write_report(report, tmp_path / "reports" / "hostile")
    markdown = (index.parent / "report.md").read_text()
    page = index.read_text()
    # Rendered as a wiki or a pull request would (raw HTML passed through), nothing is live.
    rendered = MarkdownIt("commonmark", {"html": True}).enable("table").render(markdown)
    for text in (rendered, page):
        assert "<script" not in text and "<img src=x" not in text
        assert not re.search(r"""href=["']?\s*javascript:""", text, re.I)
    # The values are still there, as text a reader can see.
    assert html.escape(SCRIPT) in rendered and html.escape(SCRIPT) in page
    assert "[click](javascript:alert(3))" in html.unescape(re.sub(r"<[^>]+>", "", rendered))
    assert {f.filename for f in report.figures} >= {"reward_curves.png", "time_split.png"}


@pytest.mark.unit
@pytest.mark.parametrize("text", [SCRIPT, IMAGE, JS_LINK, "- item", "1. item", "a | b",
                                  "`code`", "*em* _em_ ~~s~~", MATH, "# heading", "&amp;"])
def test_markdown_escaping_shows_text_as_written(text: str) -> None:
    rendered = MarkdownIt("commonmark", {"html": True}).enable(
        ["table", "strikethrough"]).render(render.md_escape(text))
    assert rendered.startswith("<p>") and rendered.count("<") == 2, rendered  # one <p>, no tag
    assert html.unescape(rendered.removeprefix("<p>").removesuffix("</p>\n")) == text


@pytest.mark.unit
def test_links_cannot_be_broken_out_of() -> None:
    cell = render.Link("run", "http://ui/#/experiments/1/runs/x) [y](javascript:alert(1)")
    rendered = MarkdownIt("commonmark").render(render.md_cell(cell))
    for text in (rendered, render.html_cell(cell)):
        assert re.findall(r'href="([^"]*)"', text) == [
            "http://ui/#/experiments/1/runs/x%29%20%5By%5D%28javascript:alert%281%29"]


@pytest.mark.parametrize("url, problem", [
    ("javascript:alert(1)", "not an http(s) URL"),
    ("file:///etc/passwd", "not an http(s) URL"),
    ("http://alice:hunter2hunter2@ui:5000", "holds a user name or password"),
])
@pytest.mark.unit
def test_ui_url_is_http_without_credentials(url: str, problem: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "--ui-url", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("workbench: error: report: argument --ui-url: ") and problem in err
    assert err.count("\n") == 1 and "hunter2" not in err
    with pytest.raises(ConfigError, match=re.escape(problem)):
        records.check_ui_url(url)


@pytest.mark.parametrize("sweep_id", ["q'x", 'd"q', "both'\"quotes"])
def test_an_odd_sweep_id_never_blocks_the_default_report(tmp_path: Path, sweep_id: str) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("odd", artifact_location=(tmp_path / "art").as_uri())
    for role, start in (("parent", 1000), ("child", 1001)):
        run = client.create_run(exp, start_time=start, run_name=f"{role}-{sweep_id}",
                                tags={"sweep_id": sweep_id, "sweep.role": role})
        client.set_terminated(run.info.run_id, "FINISHED", end_time=start + 10)
    other = client.create_run(exp, start_time=10, run_name="older",
                              tags={"sweep_id": "plain", "sweep.role": "child"})
    client.set_terminated(other.info.run_id, "FINISHED", end_time=20)
    for selection in (Selection(), Selection(sweep_id=sweep_id)):  # default and explicit
        report = records.build_report(client, selection, store=uri, with_figures=False)
        assert [r.name for r in report.runs] == [f"child-{sweep_id}"]
        assert report.selection == f"sweep {sweep_id}"
    tagged = records.build_report(client, Selection(tags={"sweep_id": sweep_id}), store=uri,
                                  with_figures=False)
    assert [r.name for r in tagged.runs] == [f"child-{sweep_id}"]


def test_no_credential_printed_by_a_run_on_a_server(mlflow_server: MlflowServer,
                                                    tmp_path: Path) -> None:
    password = "pw-s3cret-0123456789"
    token = "tok-abcdef-987654321"
    uri = mlflow_server.url.replace("http://", f"http://alice:{password}@")
    env = {"MLFLOW_TRACKING_URI": uri, "WORKBENCH_EXPERIMENTS": str(tmp_path / "experiments"),
           "MY_API_TOKEN": token}
    done = run_cli("train", *TINY, "tracking.system_metrics=false",
                   f"tracking.run_name=run-{token}", env=env)
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.strip().splitlines()[-1]
    assert "View run" not in done.stdout  # MLflow's line carries the URI's password
    assert "http://alice:***@" in done.stdout
    run = MlflowClient(mlflow_server.url).get_run(run_id)
    assert run.info.run_name == "run-***" and run.data.tags["mlflow.runName"] == "run-***"
    outputs = [done.stdout, done.stderr]
    for argv in (["--sweep", "nope"], ["--experiment", "nope"], ["--runs", "0123abcd"]):
        failed = run_cli("report", *argv, env=env)
        assert failed.returncode == 2 and "http://alice:***@" in failed.stderr, failed.stderr
        outputs += [failed.stdout, failed.stderr]
    text = "\n".join(outputs)
    assert password not in text and token not in text


OSC52 = "\x1b]52;c;cm0gLXJmIH4=\x07"  # a terminal's clipboard write (base64 of a command)
ANSI = "\x1b[31m"


def test_terminal_escapes_from_run_data_stay_out_of_report_files(tmp_path: Path) -> None:
    # A sweep id with ANSI codes and a run name with an OSC 52 clipboard write, as a store
    # can hold them (the config checks refuse both on a command line, not in data).
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("escapes", artifact_location=(tmp_path / "art").as_uri())
    sweep_id = f"s{ANSI}red"
    for role, name in (("parent", "parent"), ("child", f"run{OSC52}x")):
        run = client.create_run(exp, start_time=1000, run_name=name,
                                tags={"sweep_id": sweep_id, "sweep.role": role})
        client.log_metric(run.info.run_id, "summary/eval_mean_reward", 1.0)
        client.set_terminated(run.info.run_id, "FINISHED", end_time=1010)
    report = records.build_report(client, Selection(), store=uri, with_figures=False)
    index = render.write_report(report, tmp_path / "reports" / "escapes")
    markdown, page = (index.parent / "report.md").read_text(), index.read_text()
    for text in (markdown, page):
        assert not any(c in text for c in "\x1b\x07"), "a terminal escape reached the file"
    assert markdown.startswith("# Report: sweep s\\\\x1b\\[31mred\n")
    assert "run\\x1b]52;c;cm0gLXJmIH4=\\x07x" in page  # visible, as the console shows it
