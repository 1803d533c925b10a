"""The page at `/` in a real browser: headless Chromium driven by Selenium types a question,
submits it, and reads both readers' rendered answers, highlighted in their passages.

Needs Debian's `chromium` and `chromium-driver` and the `selenium` package, which
tools/setup.sh installs (apt as root on a Debian machine; selenium is in the `test` extra); where
they are missing the test is skipped, and README's test command (`-rs`) prints the reason. Alone:
`python3 -m pytest -m browser tests/serve/test_serve_page.py`.
The server behind the page is the fake engine of tests/helpers/serving.py (the page is what is
tested; tests/serve/test_serve.py reads with the real readers), and the screenshot goes to the
test's temporary folder (or SERVE_PAGE_SCREENSHOT when set).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import free_port

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="module")
def page_url():
    import uvicorn

    from dil_jax.serve.app import AppSettings, create_app

    from tests.helpers.serving import FakeEngine

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(FakeEngine(), AppSettings()),
                                           host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    import httpx

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.1)
    yield url
    server.should_exit = True
    thread.join(30)


@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver")
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("needs Debian's chromium and chromium-driver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1280,900"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def test_the_page_shows_both_readers_answers_highlighted(page_url, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(page_url + "/")
    wait = WebDriverWait(browser, 30)
    wait.until(ready.presence_of_element_located((By.ID, "reader-delayed")))
    box = browser.find_element(By.ID, "question")
    box.send_keys("who wrote it?")
    browser.find_element(By.ID, "submit").click()
    wait.until(lambda driver: driver.find_element(By.TAG_NAME, "body")
               .get_attribute("data-answered") == "1")
    for name, k in (("full", 0), ("delayed", 4)):
        column = browser.find_element(By.ID, f"reader-{name}")
        assert f"{name} reader (k = {k} of 6)" in column.find_element(By.TAG_NAME, "h2").text
        # The fake reader answers the question upper-cased, at characters 14..18 of its passage.
        assert column.find_element(By.CLASS_NAME, "answer").text == "WHO WROTE IT?"
        assert column.find_element(By.TAG_NAME, "mark").text == "HERE"
        assert column.find_element(By.CLASS_NAME, "passage").text == "the answer is HERE"
        assert "read_pairs" in column.find_element(By.CLASS_NAME, "times").text
        assert "T0 (doc0-p0), BM25 rank 1" in column.text
        # The fake readers do not prune (/v1/info), and read 5 pairs a question.
        assert "reads every window" in column.text
        assert "5 question × window pairs read" in column.text
    # No resource from anywhere but the server itself.
    resources = browser.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)")
    assert resources and all(name.startswith(page_url) for name in resources), resources
    shot = Path(os.environ.get("SERVE_PAGE_SCREENSHOT", tmp_path / "page.png"))
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000


def test_the_page_asks_for_the_key_when_the_server_has_one(browser):
    """/v1/info needs the key (issue 59): the page shows the key box on its 401, reads the
    readers once a key is typed, and answers with it."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    from dil_jax.serve.app import AppSettings

    from tests.helpers.serving import FakeEngine, serving

    with serving(FakeEngine(), AppSettings(api_key="s3cret")) as url:
        browser.get(url + "/")
        wait = WebDriverWait(browser, 30)
        wait.until(ready.visibility_of_element_located((By.ID, "api-key")))
        assert "needs an API key" in browser.find_element(By.ID, "columns").text
        browser.find_element(By.ID, "api-key").send_keys("s3cret")
        browser.find_element(By.ID, "question").click()  # the key box's change event
        wait.until(ready.presence_of_element_located((By.ID, "reader-delayed")))
        browser.find_element(By.ID, "question").send_keys("who wrote it?")
        browser.find_element(By.ID, "submit").click()
        wait.until(lambda driver: driver.find_element(By.TAG_NAME, "body")
                   .get_attribute("data-answered") == "1")
        answers = browser.find_elements(By.CLASS_NAME, "answer")
        assert [a.text for a in answers] == ["WHO WROTE IT?"] * 2
