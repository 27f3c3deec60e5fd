"""An operator reads a task's conversation in the admin, in a real browser 1,400 px wide
(headless Chromium: `tests/e2e/browser.py`): one entry per turn, each long text as the preview
the model sees with its true sizes and the whole text a click away, what each assistant turn
was sent beside it, and nothing wider than the window."""

from __future__ import annotations

import re

from django.contrib.auth import get_user_model
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from backend.dispatch.claims import claim_turns
from backend.dispatch.workers import ensure_worker_account
from backend.tasks.models import Subtask
from tests.e2e.browser import BROWSER_TEST, WAIT_SECONDS, WINDOW_WIDTH, log_in, page_size
from tests.tasks.test_admin_conversation import LOG_CHARS, MARKER, TRACEBACK, long_log_task

pytestmark = BROWSER_TEST


def test_the_task_page_reads_as_its_conversation(live_server, browser):
    get_user_model().objects.create_superuser(
        username="operator", password="operator-password", email="operator@example.com"
    )
    owner = get_user_model().objects.create_user(username="alice")
    worker, _ = ensure_worker_account(username="browser-worker")
    # 8 turns: a 300,669-char log among them, the last assistant turn claimed by a worker.
    task = long_log_task(owner=owner, follow_ups=1)
    [claimed] = claim_turns(worker=worker, worker_id="w-1", kinds=["codex"], limit=1)
    log = Subtask.objects.get(task=task, message_id=3)

    log_in(browser, live_server.url, username="operator", password="operator-password")
    browser.get(f"{live_server.url}/admin/tasks/task/{task.pk}/change/")
    conversation = browser.find_element(By.ID, "conversation")

    # It fits the window: no horizontal scroll.
    width, height = page_size(browser)
    assert width <= WINDOW_WIDTH, (width, height)

    # One entry per turn, in order, each with its facts on one line.
    turns = conversation.find_elements(By.CSS_SELECTOR, ".turn")
    assert [turn.get_attribute("data-message-id") for turn in turns] == [
        str(n) for n in range(1, 9)
    ]
    for turn in turns:
        line = turn.find_element(By.CLASS_NAME, "turn-line")
        assert line.size["height"] < 40, line.text  # one line at 1,400 px
    assert "Assistant codex" in turns[1].find_element(By.CLASS_NAME, "turn-line").text

    # The long text: the stored preview the model sees, its traceback, markers counted
    # against the whole text, the true sizes, and the whole text behind a link.
    text_box = browser.find_element(By.CSS_SELECTOR, "#turn-3 pre.turn-text")
    shown = text_box.get_attribute("textContent")
    assert shown == log.history_text
    assert TRACEBACK in shown
    removed = [int(n) for n in MARKER.findall(shown)]
    assert len(MARKER.sub("", shown)) + sum(removed) == LOG_CHARS
    facts = browser.find_element(By.CSS_SELECTOR, "#turn-3 .turn-line").text
    assert f"{LOG_CHARS} chars" in facts
    assert f"preview shown: {len(log.history_text)} chars" in facts
    # The preview scrolls in its own box; the page does not grow with it.
    assert text_box.size["height"] < 400

    # Beside the claimed assistant turn: the prompt its dispatch built, and why.
    notes = browser.find_element(
        By.CSS_SELECTOR, f"#turn-{claimed.subtask.message_id} .turn-notes"
    ).text
    assert "full prompt offered" in notes
    assert "why: no_session" in notes
    # Its tokens against its budget (none when an earlier test's flush took the model table).
    assert re.search(r"\d+ of \d+ model tokens|\d+ tokens \(no token cap\)", notes)

    # The whole text, through the link (the artifact's content, for a signed-in operator).
    link = browser.find_element(By.CSS_SELECTOR, "#turn-3 a.whole-text")
    url = link.get_attribute("href")
    link.click()
    WebDriverWait(browser, WAIT_SECONDS).until(lambda _: browser.current_url == url)
    body = browser.find_element(By.TAG_NAME, "body").get_attribute("textContent")
    assert len(body) == LOG_CHARS and TRACEBACK in body

    # The turn's own page: the same stored preview and sizes first, raw fields folded.
    browser.get(f"{live_server.url}/admin/tasks/subtask/{log.pk}/change/")
    width, subtask_height = page_size(browser)
    assert width <= WINDOW_WIDTH
    page = browser.find_element(By.ID, "content").text
    assert f"{LOG_CHARS} chars" in page
    assert f"the preview below: {len(log.history_text)} chars" in page
    assert subtask_height < 5_000
