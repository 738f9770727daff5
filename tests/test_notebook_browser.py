"""An executed training notebook in a real JupyterLab, read in headless chromium at 1280x720.

The notebook is a point of the session's shared sweep (tests/reportdata.py: papermill
executions of notebooks/train.ipynb), so nothing trains here. JupyterLab runs from the venv on
its own port, without a token, with its runtime, config, settings and workspace folders under
tmp_path, and is stopped with every process it started, the kernel included, even when the
test fails. Set WORKBENCH_SCREENSHOT_DIR to keep a copy of the screenshot.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
import psutil
import pytest
from workbench import processes

from . import reportdata
from .browser import save_screenshot
from .conftest import ROOT
from .support.ports import free_port

JUPYTER = Path(sys.executable).parent / "jupyter"
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0
WIDTH, HEIGHT = 1280, 720
MIN_FONT_PX = 12.0
# JupyterLab's user settings: every cell laid out, so the outputs below the screen can be
# measured too (by default JupyterLab skips laying out cells out of view: CSS
# content-visibility). News and update checks are off by make lab's own config.
SETTINGS = {"@jupyterlab/notebook-extension/tracker.jupyterlab-settings":
            {"windowingMode": "none"}}
LAB_CONFIG = ROOT / "conf" / "jupyter_lab_config.json"  # what make lab starts JupyterLab with
LAB_SETTINGS = ROOT / "conf" / "jupyterlab"  # and its settings defaults (overrides.json)


@contextlib.contextmanager
def jupyter_lab(root: Path, home: Path) -> Iterator[str]:
    """``jupyter lab`` serving ``root`` on 127.0.0.1 (its own port, no token); yields its URL.

    Stopped on exit, even after a failure: its ``/api/shutdown`` (kernels first), then SIGTERM
    and SIGKILL to its process group; a kernel runs in a session of its own, so it is waited
    for (and killed) by pid.
    """
    settings = home / "settings"
    for name, values in SETTINGS.items():
        path = settings / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(home / "config"),
           "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
           "JUPYTERLAB_SETTINGS_DIR": str(settings),
           "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces")}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = home / "lab.log"
    with log.open("w") as handle:
        proc = subprocess.Popen(
            [str(JUPYTER), "lab", "--no-browser", "--allow-root", "--ip=127.0.0.1",
             f"--port={port}", "--ServerApp.port_retries=0", "--IdentityProvider.token=",
             "--ServerApp.password=", "--ServerApp.disable_check_xsrf=True",
             f"--ServerApp.root_dir={root}", f"--config={LAB_CONFIG}",
             f"--LabApp.app_settings_dir={LAB_SETTINGS}"],
            env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
    started: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while processes.http_status(f"{url}/api/status") != 200:
            assert proc.poll() is None, f"jupyter lab exited:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"jupyter lab silent:\n{log.read_text()[-3000:]}"
            time.sleep(0.5)
        yield url
    finally:
        with contextlib.suppress(psutil.Error):
            started = psutil.Process(proc.pid).children(recursive=True)
        with contextlib.suppress(OSError):
            import urllib.request

            urllib.request.urlopen(urllib.request.Request(
                f"{url}/api/shutdown", method="POST"), timeout=10)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(STOP_TIMEOUT_S)
        processes.terminate_group(proc.pid, STOP_TIMEOUT_S)
        proc.wait()
        _, alive = psutil.wait_procs(started, timeout=STOP_TIMEOUT_S)
        for leftover in alive:
            with contextlib.suppress(psutil.Error):
                leftover.kill()
        assert not alive, f"left running after jupyter lab stopped: {alive}"


def executed_point(sweep: reportdata.Sweep) -> Path:
    """One of the sweep's executed notebooks (the first point, by name)."""
    return sorted((sweep.experiments / "sweeps" / sweep.sweep_id).glob("*.ipynb"))[0]


@pytest.mark.slow  # the server, the kernel and the page: ~14 s on top of the shared sweep
def test_an_executed_notebook_is_legible_at_1280x720(
        report_sweep: reportdata.Sweep, tmp_path: Path, browser: object) -> None:
    source = executed_point(report_sweep)
    root = tmp_path / "lab"
    root.mkdir()
    notebook = Path(shutil.copy(source, root / source.name))  # the shared file stays as it is
    with jupyter_lab(root, tmp_path / "jupyter") as url:
        read_in_lab(browser, url, notebook, tmp_path)


def read_in_lab(browser: object, url: str, notebook: Path, tmp_path: Path) -> None:
    """Open ``notebook`` in JupyterLab at 1280x720 (its default layout, file browser open)
    and check what a reader must see in the outputs; the screenshot shows the summary."""
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.support.ui import WebDriverWait

    assert isinstance(browser, WebDriver)
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False})
    browser.get(f"{url}/lab/tree/{notebook.name}")
    WebDriverWait(browser, 120).until(lambda b: b.execute_script(
        "return document.querySelector('.jp-Notebook .workbench-summary') !== null "
        "&& Array.from(document.querySelectorAll('.jp-Notebook img')).every(i => i.complete "
        "&& i.naturalWidth > 0);"))
    # Nothing in front of the notebook: no toast (the news question, an update), no tab beside
    # it (make lab's config and settings).
    toasts = browser.execute_script(
        "return Array.from(document.querySelectorAll('.Toastify__toast'))"
        ".map(t => t.innerText.trim());")
    assert toasts == [], toasts
    tabs = browser.execute_script(
        "return Array.from(document.querySelectorAll('.lm-DockPanel-tabBar .lm-TabBar-tab'))"
        ".map(t => t.innerText.trim());")
    assert tabs == [notebook.name], tabs
    run_id = executed_run_id(notebook)
    shown = browser.execute_script(
        "return Array.from(document.querySelectorAll('.jp-Notebook .jp-OutputArea-output'))"
        ".map(o => o.innerText).join('\\n');")
    assert f"MLflow run id: {run_id}" in shown
    for line in ("rollout     : ", "budget      : ", "final eval reward",
                 f"workbench export --run {run_id} for ONNX)",  # the summary's values in full
                 f"resume={run_id} total_timesteps=<more> continues it)"):
        assert line in shown, line
    # The figure shows the iterations and the table the summary: no line repeats them.
    assert "it 1/" not in shown and "Training summary" not in shown
    # Nothing scrolls or is cut sideways: the notebook, each output, its text and tables.
    overflowing = browser.execute_script(
        "const n = document.querySelector('.jp-WindowedPanel-outer');"
        "const outputs = Array.from(document.querySelectorAll('.jp-Notebook "
        ".jp-OutputArea-output'));"
        "const parts = [n, ...outputs, ...outputs.flatMap(o => Array.from("
        "o.querySelectorAll('pre, table, img, video')))];"
        "return parts.filter(e => e.scrollWidth > e.clientWidth || e.getBoundingClientRect()"
        ".right > n.getBoundingClientRect().right).map(e => e.outerHTML.slice(0, 120));")
    assert overflowing == []
    # The live figure at its own size (not scaled down), the text at a readable size.
    images = browser.execute_script(
        "return Array.from(document.querySelectorAll('.jp-Notebook .jp-OutputArea-output img'))"
        ".map(i => [i.width, i.naturalWidth]);")
    assert images and all(width >= natural for width, natural in images), images
    sizes = browser.execute_script(
        "return Array.from(document.querySelectorAll('.jp-Notebook .jp-OutputArea-output'))"
        ".flatMap(o => Array.from(o.querySelectorAll('pre, td, th')))"
        ".map(e => parseFloat(getComputedStyle(e).fontSize));")
    assert sizes and min(sizes) >= MIN_FONT_PX, sizes
    browser.execute_script(
        "document.querySelector('.jp-Notebook .workbench-summary').closest('.jp-Cell')"
        ".scrollIntoView(true);")
    time.sleep(1)  # the scroll settles (JupyterLab renders cells coming into view)
    screenshot = save_screenshot(browser, tmp_path, "notebook-1280x720.png")
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def executed_run_id(notebook: Path) -> str:
    """The MLflow run the executed notebook printed (its summary cell's first line)."""
    nb = nbformat.read(notebook, as_version=4)
    (cell,) = [c for c in nb.cells if c.get("id") == "summary"]
    return cell.outputs[0].text.removeprefix("MLflow run id: ").strip()
