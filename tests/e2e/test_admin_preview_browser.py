"""An operator tunes a history policy in the admin and sees the prompt change, in a real browser
(headless Chromium: `tests/e2e/browser.py`)."""

from __future__ import annotations

import re

from django.contrib.auth import get_user_model
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from backend.dispatch.models import HistoryPolicy
from tests.dispatch.test_admin import long_task
from tests.e2e.browser import BROWSER_TEST, click_and_wait, log_in, wait_for

ROLE_LABEL = re.compile(r"^(?:User|Assistant)(?:\[[^\]]*\])?:", re.MULTILINE)
OMISSION_NOTICE = re.compile(r"^\[omitted earlier messages: .*\]$", re.MULTILINE)

pytestmark = BROWSER_TEST


def shown_prompt(browser: WebDriver) -> str:
    # textContent is the exact text of the <pre>, with no layout applied.
    return wait_for(browser, "prompt-text").get_attribute("textContent")


def test_changing_max_messages_changes_the_previewed_prompt(live_server, browser, shipped_policies):
    get_user_model().objects.create_superuser(
        username="operator", password="operator-password", email="operator@example.com"
    )
    owner = get_user_model().objects.create_user(username="alice")
    # 12 history turns (6 questions and answers) and a 7th question waiting for its answer.
    task = long_task(owner=owner, rounds=6)

    log_in(browser, live_server.url, username="operator", password="operator-password")

    # Before: the task page's button previews the whole conversation under `code` v1.
    browser.get(f"{live_server.url}/admin/tasks/task/{task.pk}/change/")
    click_and_wait(browser, wait_for(browser, "prompt-preview-link"), "prompt-text")
    before = shown_prompt(browser)
    assert len(ROLE_LABEL.findall(before)) == 13  # 12 history turns + the current message
    assert not OMISSION_NOTICE.search(before)
    assert "code v1" in browser.find_element(By.ID, "preview-policy").text

    # Change the `code` policy's max_messages to 3 and save.
    browser.get(f"{live_server.url}/admin/dispatch/historypolicy/")
    code_link = browser.find_element(By.LINK_TEXT, "code")
    max_messages = click_and_wait(browser, code_link, "id_max_messages")
    max_messages.clear()
    max_messages.send_keys("3")
    click_and_wait(browser, browser.find_element(By.NAME, "_save"), "result_list")
    assert "was changed successfully" in browser.find_element(By.CSS_SELECTOR, ".messagelist").text
    code = HistoryPolicy.objects.get(task_type="code")
    assert (code.max_messages, code.version) == (3, 2)

    # After: from the policy's page, preview the same task under the saved row.
    browser.get(f"{live_server.url}/admin/dispatch/historypolicy/{code.pk}/change/")
    click_and_wait(browser, wait_for(browser, "prompt-preview-link"), "prompt-preview-form")
    browser.find_element(By.ID, "id_task").send_keys(str(task.pk))
    click_and_wait(browser, browser.find_element(By.ID, "preview-submit"), "prompt-text")
    after = shown_prompt(browser)
    assert "code v2" in browser.find_element(By.ID, "preview-policy").text
    # The pinned first question and the two newest turns, then the current message.
    assert len(ROLE_LABEL.findall(after)) == 4
    assert OMISSION_NOTICE.findall(after) == ["[omitted earlier messages: 9 (4 user, 5 assistant)]"]
    assert after.startswith("## Conversation History\n\n[omitted earlier messages: 9")
    assert after.endswith("## Current Message\n\nUser:\nLast question?\n")
    assert before.endswith("## Current Message\n\nUser:\nLast question?\n")
    assert "9 omitted (4 user, 5 assistant)" in browser.find_element(By.ID, "preview-messages").text
    omitted = browser.find_elements(By.CSS_SELECTOR, "#history-turns tr.mark-omitted")
    assert len(omitted) == 9
    assert browser.find_element(By.ID, "budget-bar").find_elements(By.CLASS_NAME, "segment")
