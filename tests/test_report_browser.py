"""The report page in a real headless browser (Debian's chromium through Selenium).

Opened from disk (file://) with networking off: every figure must load, the console must stay
free of errors, and a full-page screenshot is saved next to the report for a human to look at.
CI installs chromium and chromium-driver (.ci/run) and sets WORKBENCH_REQUIRE_BROWSER=1, so
there a missing browser is a failure; elsewhere the test is skipped with the install line.
Set WORKBENCH_SCREENSHOT_DIR to keep a copy of the screenshot (pytest's tmp dirs rotate).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from workbench.review import figures, records, render
from workbench.review.selection import Selection

from . import reportdata
from .browser import save_screenshot


@pytest.fixture(scope="module")
def sweep(report_sweep: reportdata.Sweep) -> reportdata.Sweep:
    """The session's shared sweep (tests/reportdata.py)."""
    return report_sweep


def test_report_page_loads_every_figure_without_errors(
        sweep: reportdata.Sweep, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
        browser: object) -> None:
    from selenium.webdriver.remote.webdriver import WebDriver

    assert isinstance(browser, WebDriver)
    proc, folder = reportdata.written_report(tmp_path_factory.getbasetemp())
    assert proc.returncode == 0, proc.stderr
    index = folder / "index.html"
    content = records.build_report(reportdata.client_for(sweep),
                                  Selection(sweep_id=sweep.sweep_id), store=sweep.uri,
                                  with_figures=False)

    browser.get(index.as_uri())
    assert browser.title == "Report: sweep tiny-grid"
    images = browser.execute_script(
        "return Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth, "
        "i.naturalHeight]);")
    assert [alt for alt, *_ in images] == [
        "Reward vs environment steps", "Return vs training seconds",
        "Entropy, clip fraction and approx KL", "Final reward, fps and training time over the grid",
        "Time to target return 4800 over the grid, halfcheetah",
        "IQM of the final return with 95 % intervals", "Time split per iteration"]
    for alt, complete, width, height in images:
        assert complete and width > 0 and height > 0, alt
    # Every embedded video decodes in the browser at the size it was recorded (debug=tiny:
    # 96x64); metadata loads asynchronously, so wait for it (bounded).
    videos = browser.execute_script("return document.querySelectorAll('video').length;")
    assert videos == len(content.videos) == 4
    from selenium.webdriver.support.ui import WebDriverWait
    WebDriverWait(browser, 30).until(lambda b: b.execute_script(
        "return Array.from(document.querySelectorAll('video')).every(v => v.readyState >= 1 "
        "|| v.error);"))
    decoded = browser.execute_script(
        "return Array.from(document.querySelectorAll('video')).map(v => "
        "[v.error ? v.error.code : 0, v.videoWidth, v.videoHeight, v.duration > 0]);")
    assert decoded == [[0, 96, 64, True]] * 4
    resources = browser.execute_script(
        "return performance.getEntriesByType('resource').map(r => r.name);")
    assert resources == []  # nothing fetched: the page is self-contained
    tables = browser.execute_script("return document.querySelectorAll('table').length;")
    assert tables == sum(1 for b in render.report_blocks(content)
                                                if b.kind in ("table", "card"))
    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert errors == []

    # On a 1280-px-wide screen every figure's tick labels read at 16 px or more: the PNG's
    # tick size (figures.STYLE, at figures.DPI) times the scale the page shows it at.
    browser.set_window_size(1280, 900)
    shown = browser.execute_script(
        "return Array.from(document.images).map(i => [i.alt, i.clientWidth / i.naturalWidth]);")
    tick_px = figures.STYLE["xtick.labelsize"] * figures.DPI / 72
    assert {alt: round(tick_px * scale, 1) for alt, scale in shown
            if tick_px * scale < 16} == {}
    scales = [scale for _, scale in shown]  # one scale for every figure (the widest may be
    assert max(scales) / min(scales) < 1.05  # narrowed a little further to the page)

    height = browser.execute_script("return document.documentElement.scrollHeight;")
    browser.set_window_size(1400, min(int(height) + 100, 16000))
    # Not into the shared report folder; $WORKBENCH_SCREENSHOT_DIR keeps it (CI artifacts).
    screenshot = save_screenshot(browser, tmp_path, "report-screenshot.png")
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ranking_is_on_the_first_screen_of_a_projector(
        sweep: reportdata.Sweep, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
        browser: object) -> None:
    """At 1280x720 the whole ranking of the four points shows before any scrolling: the table
    follows its heading, how it is ranked comes after it."""
    from selenium.webdriver.remote.webdriver import WebDriver

    assert isinstance(browser, WebDriver)
    proc, folder = reportdata.written_report(tmp_path_factory.getbasetemp())
    assert proc.returncode == 0, proc.stderr
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": 1280, "height": 720, "deviceScaleFactor": 1, "mobile": False})
    browser.get((folder / "index.html").as_uri())
    heading, following, top, bottom = browser.execute_script(
        "const h = [...document.querySelectorAll('h2')].find(h => h.textContent === 'Ranking');"
        "const t = h.nextElementSibling; const r = t.getBoundingClientRect();"
        "return [h.textContent, t.tagName, r.top, r.bottom];")
    assert (heading, following) == ("Ranking", "TABLE")
    assert 0 < top < bottom < 720, (top, bottom)
    save_screenshot(browser, tmp_path, "report-first-screen.png")
