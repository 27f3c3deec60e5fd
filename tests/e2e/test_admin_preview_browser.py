"""An operator tunes a history policy in the admin and sees the prompt change, in a real browser
(headless Chromium: `tests/e2e/browser.py`): after saving, and live on the preview page as they
edit a draft.
"""

from __future__ import annotations

import re

from django.contrib.auth import get_user_model
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from backend.dispatch.models import HistoryPolicy
from tests.dispatch.test_admin import long_task
from tests.e2e.browser import BROWSER_TEST, WAIT_SECONDS, click_and_wait, log_in, wait_for

ROLE_LABEL = re.compile(r"^(?:User|Assistant)(?:\[[^\]]*\])?:", re.MULTILINE)
OMISSION_NOTICE = re.compile(r"^\[omitted earlier messages: .*\]$", re.MULTILINE)

pytestmark = BROWSER_TEST


def shown_prompt(browser: WebDriver) -> str:
    # textContent is the exact text of the <pre>, with no layout applied.
    return wait_for(browser, "prompt-text").get_attribute("textContent")


def count_draft_requests(browser: WebDriver) -> None:
    """Count from now on each request this page starts to the live preview endpoint (an
    aborted one included: the resource timings list only those that completed)."""
    browser.execute_script(
        "window.batonDraftRequests = 0;"
        "const fetch = window.fetch;"
        "window.fetch = (url, options) => {"
        "  if (String(url).includes('/preview/draft/')) window.batonDraftRequests += 1;"
        "  return fetch(url, options);"
        "};"
    )


def draft_requests(browser: WebDriver) -> int:
    """How many requests to the live preview endpoint this page started since
    `count_draft_requests`."""
    return browser.execute_script("return window.batonDraftRequests")


def heading_holds(browser: WebDriver, heading: str) -> str:
    """The id of the element right after the `<h2>` that reads `heading`."""
    return browser.execute_script(
        "const h = [...document.querySelectorAll('#preview-result h2')]"
        ".find((h) => h.textContent === arguments[0]);"
        "return h && h.nextElementSibling ? h.nextElementSibling.id : null;",
        heading,
    )


def test_the_preview_follows_the_draft_without_reloading(live_server, browser, shipped_policies):
    get_user_model().objects.create_superuser(
        username="operator", password="operator-password", email="operator@example.com"
    )
    owner = get_user_model().objects.create_user(username="alice")
    task = long_task(owner=owner, rounds=6)
    log_in(browser, live_server.url, username="operator", password="operator-password")
    browser.get(f"{live_server.url}/admin/dispatch/historypolicy/preview/?task={task.pk}")
    before = shown_prompt(browser)
    assert len(ROLE_LABEL.findall(before)) == 13
    assert heading_holds(browser, "History turns") == "history-turns"
    # A marker that only survives if the page is never reloaded or left.
    browser.execute_script("window.batonPreviewMarker = 'same page';")
    count_draft_requests(browser)

    # The operator types a new max_messages, five keystrokes 50 ms apart ("333", then two
    # corrections): the preview follows after the typing stops, not after each keystroke (two
    # requests at most, should the loaded machine stall the typing past the debounce).
    max_messages = browser.find_element(By.ID, "id_max_messages")
    typing = ActionChains(browser).click(max_messages)
    typing.key_down(Keys.CONTROL).send_keys("a").key_up(Keys.CONTROL)
    for key in ("3", "3", "3", Keys.BACKSPACE, Keys.BACKSPACE):
        typing.send_keys(key).pause(0.05)
    typing.perform()
    WebDriverWait(browser, WAIT_SECONDS).until(
        lambda _: "9 omitted" in browser.find_element(By.ID, "preview-messages").text
    )
    after = shown_prompt(browser)
    assert len(ROLE_LABEL.findall(after)) == 4
    assert OMISSION_NOTICE.findall(after) == ["[omitted earlier messages: 9 (4 user, 5 assistant)]"]
    assert browser.execute_script("return window.batonPreviewMarker") == "same page"
    assert 1 <= draft_requests(browser) <= 2
    assert browser.find_element(By.ID, "id_policy").get_attribute("value") == "unsaved"
    assert "unsaved edit (based on code v1)" in browser.find_element(By.ID, "preview-policy").text
    # What the draft changes against the saved row, in the section and on the field.
    changes = browser.find_elements(By.CSS_SELECTOR, "#preview-changes tbody tr")
    assert [row.text for row in changes] == ["max_messages 20 3"]
    assert "draft-changed" in browser.find_element(
        By.CSS_SELECTOR, ".form-row.field-max_messages"
    ).get_attribute("class")
    # The budget bar and the turns table are still there, each under its heading.
    assert browser.find_element(By.ID, "budget-bar").find_elements(By.CLASS_NAME, "segment")
    assert heading_holds(browser, "History turns") == "history-turns"
    assert len(browser.find_elements(By.CSS_SELECTOR, "#history-turns tr.mark-omitted")) == 9
    # The address now says what is shown, so a reload shows the draft again.
    assert "max_messages=3" in browser.current_url

    # A value the builder refuses: the field says why, the last good preview stays.
    max_chars = browser.find_element(By.ID, "id_max_chars")
    max_chars.clear()
    max_chars.send_keys("-5")
    WebDriverWait(browser, WAIT_SECONDS).until(
        lambda _: browser.find_elements(By.CSS_SELECTOR, ".field-max_chars ul.live-errors")
    )
    assert (
        "greater than or equal to 0"
        in browser.find_element(By.CSS_SELECTOR, ".field-max_chars ul.live-errors").text
    )
    assert "max_chars" in browser.find_element(By.ID, "live-preview-status").text
    assert shown_prompt(browser) == after
    assert browser.execute_script("return window.batonPreviewMarker") == "same page"

    # Nothing was saved.
    code = HistoryPolicy.objects.get(task_type="code")
    assert (code.max_messages, code.max_chars, code.version) == (20, 40_000, 1)


def test_the_policy_list_shows_what_each_row_sets_within_1400_px(
    live_server, browser, shipped_policies
):
    get_user_model().objects.create_superuser(
        username="operator", password="operator-password", email="operator@example.com"
    )
    log_in(browser, live_server.url, username="operator", password="operator-password")
    browser.set_window_size(1400, 1000)
    browser.get(f"{live_server.url}/admin/dispatch/historypolicy/")
    cells = {
        row.find_element(By.CSS_SELECTOR, ".field-task_type_label").text: row.find_element(
            By.CSS_SELECTOR, ".field-sets_and_inherits_label"
        ).text
        for row in wait_for(browser, "result_list").find_elements(By.CSS_SELECTOR, "tbody tr")
    }
    assert cells == {
        "default": "sets: nothing · inherits: all 17",
        "chat": "sets: max_messages, max_chars · inherits: the other 15",
        "code": "sets: nothing · inherits: all 17",
    }
    # The list, with its new column, needs no sideways scroll in a 1,400 px window.
    overflow = browser.execute_script(
        "const results = document.querySelector('#changelist .results');"
        "return results.scrollWidth - results.clientWidth;"
    )
    assert overflow == 0


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
    assert heading_holds(browser, "History turns") == "history-turns"
