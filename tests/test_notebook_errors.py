"""papermill's own command line on a notebook stopped by bad input: the workbench's one line
(and where the executed notebook is), no papermill traceback, exit code 1; a real crash in a
cell keeps papermill's full report."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from papermill.exceptions import PapermillExecutionError
from papermill.execute import raise_for_execution_errors
from workbench import notebook_errors
from workbench.notebook_errors import OneLineHook, install, is_papermill_cli, workbench_line

from .conftest import ROOT

NOTEBOOK = ROOT / "notebooks" / "train.ipynb"
PAPERMILL = Path(sys.executable).parent / "papermill"
BAD_TYPE = ("workbench: error: notebook parameter num_envs='four': expected int, got str "
            "(papermill example: -p num_envs 4)")


def papermill_cli(source: Path, output: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The venv's ``papermill`` command, as a user runs it."""
    return subprocess.run([str(PAPERMILL), str(source), str(output), *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


def after_progress(stderr: str) -> list[str]:
    """stderr's lines after papermill's progress bar (its last ``Executing:`` update)."""
    return stderr.rsplit("Executing:", 1)[-1].partition("\n")[2].strip().splitlines()


def failed_cell_error(ename: str, evalue: str, traceback: list[str]) -> nbformat.NotebookNode:
    """A notebook whose one cell failed with the given error output, as the kernel left it."""
    cell = nbformat.v4.new_code_cell("x", execution_count=3)
    cell.outputs = [nbformat.v4.new_output("error", ename=ename, evalue=evalue,
                                           traceback=traceback)]
    return nbformat.v4.new_notebook(cells=[cell])


def raised(nb: nbformat.NotebookNode, output: Path) -> tuple[PapermillExecutionError, object]:
    """papermill's own raise for a failed notebook: the error and its traceback."""
    with pytest.raises(PapermillExecutionError) as info:
        raise_for_execution_errors(nb, str(output))
    return info.value, info.tb


# --------------------------------------------------------------------------- the real CLI


def test_a_bad_parameter_ends_on_the_workbench_line(bare_store: Path, tmp_path: Path) -> None:
    assert notebook_errors.installed_pth().is_file(), "no papermill hook here: make setup"
    output = tmp_path / "out.ipynb"
    done = papermill_cli(NOTEBOOK, output, "-p", "num_envs", "four")
    assert done.returncode == 1, done.stderr
    lines = after_progress(done.stderr)
    assert lines[-1] == f"{BAD_TYPE}; the executed notebook, error marked: {output}", done.stderr
    assert not any("Traceback" in line or "papermill.exceptions" in line for line in lines)
    nb = nbformat.read(output, as_version=4)
    failed = [c for c in nb.cells if c.get("metadata", {}).get("papermill", {}).get("exception")]
    assert [c.id for c in failed] == ["check-parameters"]
    (error,) = [o for o in failed[0].outputs if o.output_type == "error"]
    assert (error.ename, error.evalue) == ("ParameterError", BAD_TYPE.removeprefix(
        "workbench: error: "))
    assert not (bare_store / "mlflow.db").exists()  # stopped before any run


def test_a_crash_in_a_cell_keeps_papermills_traceback(tmp_path: Path) -> None:
    source, output = tmp_path / "crash.ipynb", tmp_path / "out.ipynb"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell('raise RuntimeError("boom")')])
    nb.metadata["kernelspec"] = {"name": "workbench", "language": "python",
                                 "display_name": "Python (workbench)"}
    nbformat.write(nb, source)
    done = papermill_cli(source, output)
    assert done.returncode == 1, done.stderr
    tail = "\n".join(after_progress(done.stderr))
    assert tail.startswith("Traceback (most recent call last):"), done.stderr
    assert "papermill.exceptions.PapermillExecutionError" in tail
    assert "RuntimeError: boom" in tail
    assert "workbench: error" not in tail
    assert "without encryption" not in done.stderr  # the kernel's transport is encrypted


# --------------------------------------------------------------------------- the hook


@pytest.mark.unit
@pytest.mark.parametrize(("argv", "orig_argv", "expected"), [
    (["/venv/bin/papermill", "a.ipynb"], ["/venv/bin/python", "/venv/bin/papermill"], True),
    (["-m"], ["python", "-X", "frozen_modules=off", "-m", "papermill", "a.ipynb"], True),
    (["-m"], ["python", "-m", "ipykernel_launcher", "-f", "papermill.json"], False),
    (["/work/papermill/run.py"], ["python", "/work/papermill/run.py"], False),
    ([], [], False),
])
def test_only_papermills_command_line_gets_the_hook(argv: list[str], orig_argv: list[str],
                                                    expected: bool) -> None:
    assert is_papermill_cli(argv, orig_argv) is expected


@pytest.mark.unit
@pytest.mark.parametrize(("ename", "evalue", "traceback", "line"), [
    # notebook.short_errors: the cell's whole traceback is the workbench's line.
    ("ConfigError", "env.num_envs=0: must be >= 1",
     ["workbench: error: env.num_envs=0: must be >= 1"],
     "workbench: error: env.num_envs=0: must be >= 1"),
    # The parameter check without that hook: a full IPython traceback, the message is the line.
    ("ParameterError", "unknown notebook parameter 'num_env'",
     ["\x1b[0;31m----\x1b[0m", "ParameterError: ..."],
     "workbench: error: unknown notebook parameter 'num_env'"),
    ("SystemExit", "workbench: error: sweep_id='x': no such sweep", ["SystemExit: ..."],
     "workbench: error: sweep_id='x': no such sweep"),
    ("RuntimeError", "boom", ["Traceback", "RuntimeError: boom"], None),
    ("ValueError", "workbench: error: a\nsecond line", ["Traceback", "ValueError: ..."], None),
])
def test_which_errors_are_the_workbench_line(tmp_path: Path, ename: str, evalue: str,
                                             traceback: list[str], line: str | None) -> None:
    error, _ = raised(failed_cell_error(ename, evalue, traceback), tmp_path / "out.ipynb")
    assert workbench_line(error) == line
    assert workbench_line(RuntimeError(line or "x")) is None  # only papermill's cell errors


@pytest.mark.unit
def test_the_hook_prints_one_line_or_hands_over(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    handed: list[BaseException] = []
    hook = OneLineHook(lambda etype, value, tb: handed.append(value))
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    output = tmp_path / "out.ipynb"
    error, tb = raised(failed_cell_error("ParameterError", "x", [f"{BAD_TYPE}"]), output)
    hook(type(error), error, tb)
    assert stderr.getvalue() == f"{BAD_TYPE}; the executed notebook, error marked: {output}\n"
    assert handed == []
    crash, tb = raised(failed_cell_error("RuntimeError", "boom", ["Traceback"]), output)
    hook(type(crash), crash, tb)
    assert handed == [crash]
    assert stderr.getvalue().count("\n") == 1


@pytest.mark.unit
def test_install_is_idempotent_and_papermill_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(notebook_errors, "encrypt_kernel_transport", lambda: None)
    original = sys.excepthook
    monkeypatch.setattr(sys, "excepthook", original)
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "pytest"])
    monkeypatch.setattr(sys, "argv", ["pytest"])
    install()
    assert sys.excepthook is original
    monkeypatch.setattr(sys, "argv", ["/venv/bin/papermill", "in.ipynb", "out.ipynb"])
    install()
    install()  # site may read the same site-packages twice (a lib64 link)
    assert isinstance(sys.excepthook, OneLineHook) and sys.excepthook.previous is original


@pytest.mark.unit
def test_the_pth_line_is_silent_without_the_package(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    line = notebook_errors.install_pth(tmp_path).read_text()
    assert line.startswith("import ") and line.count("\n") == 1  # site executes it
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    monkeypatch.setattr(sys, "orig_argv", ["python", "/venv/bin/papermill"])
    monkeypatch.setattr(sys, "argv", ["/venv/bin/papermill"])
    monkeypatch.setitem(sys.modules, "workbench.notebook_errors", None)  # not installed
    exec(line, {})
    assert not isinstance(sys.excepthook, OneLineHook)
    monkeypatch.setitem(sys.modules, "workbench.notebook_errors", notebook_errors)
    exec(line, {})
    assert isinstance(sys.excepthook, OneLineHook)
