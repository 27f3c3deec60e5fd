"""Headless Chromium for the admin's browser tests, and the steps they share.

Chromium from Debian's `chromium` and `chromium-driver` packages (`.ci/install-browser`
installs them), driven by Selenium with both paths given, so Selenium Manager never downloads a
browser or a driver. The browser talks to pytest-django's live server over HTTP; the database is
transactional because the server answers from another thread. The window is 1,400 px wide, as
an operator's is.
"""

from __future__ import annotations

import importlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.apps import apps
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
WINDOW_WIDTH = 1400
CHROMIUM_OPTIONS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    f"--window-size={WINDOW_WIDTH},1000",
)
WAIT_SECONDS = 20

# The marks of a module of browser tests.
BROWSER_TEST = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("shipped_bots"),
    pytest.mark.skipif(
        not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()),
        reason=(
            f"headless browser test needs {CHROMIUM} and {CHROMEDRIVER} "
            "(Debian packages chromium and chromium-driver; run .ci/install-browser)"
        ),
    ),
]


@pytest.fixture
def shipped_policies(transactional_db) -> None:
    """The shipped policy rows as the migrations leave them (with the fields each sets), which an
    earlier transactional test's flush may have removed."""
    shipped = importlib.import_module("backend.dispatch.migrations.0002_shipped_policies")
    shipped.create_shipped_policies(apps, None)
    overrides = importlib.import_module("backend.dispatch.migrations.0005_policy_overrides")
    overrides.set_overrides(apps, None)


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    with tempfile.TemporaryDirectory(prefix="baton-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for argument in (*CHROMIUM_OPTIONS, f"--user-data-dir={profile}"):
            options.add_argument(argument)
        driver = webdriver.Chrome(
            service=Service(executable_path=str(CHROMEDRIVER)), options=options
        )
        driver.set_page_load_timeout(WAIT_SECONDS)
        try:
            yield driver
        finally:
            driver.quit()


def wait_for(browser: WebDriver, element_id: str):
    return WebDriverWait(browser, WAIT_SECONDS).until(
        expected_conditions.presence_of_element_located((By.ID, element_id))
    )


def click_and_wait(browser: WebDriver, element, element_id: str):
    """Click something that loads a new page, then wait for an element of that page."""
    old_page = browser.find_element(By.TAG_NAME, "html")
    element.click()
    WebDriverWait(browser, WAIT_SECONDS).until(lambda _: _left_the_document(old_page))
    return wait_for(browser, element_id)


def _left_the_document(element) -> bool:
    """`expected_conditions.staleness_of`, and also Chrome's other answer when asked about an
    element of a page it is leaving at that moment ("does not belong to the document")."""
    try:
        element.is_enabled()
    except StaleElementReferenceException:
        return True
    except WebDriverException as error:
        if "does not belong to the document" in str(error):
            return True
        raise
    return False


def log_in(browser: WebDriver, live_server_url: str, *, username: str, password: str) -> None:
    """Log in through the admin's login form."""
    browser.get(f"{live_server_url}/admin/login/?next=/admin/")
    browser.find_element(By.ID, "id_username").send_keys(username)
    browser.find_element(By.ID, "id_password").send_keys(password)
    click_and_wait(browser, browser.find_element(By.CSS_SELECTOR, "input[type=submit]"), "content")
    assert "/admin/login/" not in browser.current_url


def page_size(browser: WebDriver) -> tuple[int, int]:
    """The document's scroll width and height, in CSS pixels."""
    return browser.execute_script(
        "return [document.documentElement.scrollWidth, document.documentElement.scrollHeight]"
    )
