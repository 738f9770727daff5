"""A real headless browser for the page tests: Debian's chromium through Selenium.

CI installs chromium and chromium-driver (.ci/run) and sets WORKBENCH_REQUIRE_BROWSER=1, so
there a missing browser is a failure; elsewhere a test that needs it is skipped with the
install line.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
INSTALL = "apt-get update && apt-get install -y chromium chromium-driver"


@pytest.fixture()
def browser(tmp_path: Path) -> Iterator[object]:
    """Headless chromium with a fresh profile, no network services, console logs captured."""
    if not (CHROMIUM and CHROMEDRIVER):
        if os.environ.get("WORKBENCH_REQUIRE_BROWSER") == "1":
            pytest.fail(f"chromium/chromedriver not found; install them: {INSTALL}")
        pytest.skip(f"chromium/chromedriver not installed ({INSTALL})")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                 f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,900"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def save_screenshot(browser: object, tmp_path: Path, name: str) -> Path:
    """The page as shown now, as ``tmp_path/name``; also copied into
    ``$WORKBENCH_SCREENSHOT_DIR`` when set, to look at after the run."""
    screenshot = tmp_path / name
    assert browser.save_screenshot(str(screenshot))  # type: ignore[attr-defined]
    keep = os.environ.get("WORKBENCH_SCREENSHOT_DIR")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(screenshot, Path(keep) / name)
    print(f"screenshot: {screenshot}")
    return screenshot
