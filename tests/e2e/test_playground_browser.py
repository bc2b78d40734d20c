"""The playground in a real browser: Debian's Chromium, headless, driven through its
chromedriver by Selenium, against a real ``octavo serve`` of the default model.

The browser may reach 127.0.0.1 alone (``--host-resolver-rules``; its background services
are off). ``OCTAVO_PLAYGROUND_SCREENSHOT=PATH`` keeps the screenshot taken after a chat
(docs/images/playground.png was taken so)."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
from openai import OpenAI

from ..core.tiny_models import TinyModel
from .conftest import start_tiny_server
from .server import API_KEY, Server

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
# What the injection test makes the model write (forced by a regex): HTML that would run
# script if the page ever parsed model output as HTML.
INJECTION = '<script>window.pwned=1</script><img src=x onerror="window.pwned=2">'


def browser() -> WebDriver:
    options = Options()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,1000",
                 "--no-first-run", "--no-default-browser-check", "--disable-sync",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-default-apps", "--disable-extensions",
                 "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"):
        options.add_argument(flag)
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager: fetch no driver
    return webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))


@pytest.fixture(scope="module")
def smol_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with Server(["--max-model-len", "2048"],
                tmp_path_factory.mktemp("playground") / "server.log") as server:
        yield server


@pytest.fixture(scope="module")
def page(smol_server: Server) -> Iterator[WebDriver]:
    driver = browser()
    try:
        driver.get(smol_server.url + "/")
        wait(driver, 30).until(lambda d: d.find_element(By.ID, "model").text)
        yield driver
    finally:
        driver.quit()


def wait(driver: WebDriver, seconds: float) -> WebDriverWait:
    return WebDriverWait(driver, seconds, poll_frequency=0.05)


def set_field(driver: WebDriver, element_id: str, value: str) -> None:
    element = driver.find_element(By.ID, element_id)
    element.clear()
    if value:
        element.send_keys(value)


def settings(driver: WebDriver, *, temperature: str = "0", max_tokens: str = "32",
             guided: str = "none", guided_text: str = "") -> None:
    set_field(driver, "temperature", temperature)
    set_field(driver, "max-tokens", max_tokens)
    set_field(driver, "seed", "0")
    Select(driver.find_element(By.ID, "guided-mode")).select_by_value(guided)
    set_field(driver, "guided", guided_text)


def send_chat(driver: WebDriver, text: str) -> None:
    driver.find_element(By.ID, "clear").click()
    set_field(driver, "prompt", text)
    driver.find_element(By.ID, "send").click()


def last_answer(driver: WebDriver) -> tuple[str, str]:
    """The last assistant message's text and its finish reason ('' while streaming)."""
    return driver.execute_script("""
        const boxes = document.querySelectorAll('#messages .message.assistant');
        const box = boxes[boxes.length - 1];
        if (!box) return ['', ''];
        return [box.querySelector('.text').textContent,
                box.querySelector('.stats').dataset.finish || ''];""")


def finished_answer(driver: WebDriver, seconds: float = 60) -> str:
    wait(driver, seconds).until(lambda d: last_answer(d)[1])
    assert driver.find_element(By.ID, "error").get_attribute("hidden"), \
        driver.find_element(By.ID, "error").text
    return last_answer(driver)[0]


def test_chat_streams_text_that_grows_then_finishes(page: WebDriver) -> None:
    settings(page, max_tokens="48")
    send_chat(page, "Name three colours.")
    lengths = set()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not last_answer(page)[1]:
        lengths.add(len(last_answer(page)[0]))
        time.sleep(0.02)
    text, finish = last_answer(page)
    assert finish in ("length", "stop"), finish
    assert len({n for n in lengths if 0 < n < len(text)}) >= 2, lengths  # seen growing
    stats = page.execute_script(
        "const s = document.querySelectorAll('#messages .stats'); return s[s.length-1].textContent")
    assert "TTFT" in stats and "tok/s" in stats and "prompt" in stats and "output" in stats
    if path := os.environ.get("OCTAVO_PLAYGROUND_SCREENSHOT"):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        page.save_screenshot(path)


def test_stop_aborts_the_request_and_frees_the_engine(page: WebDriver,
                                                      smol_server: Server) -> None:
    settings(page, temperature="0.8", max_tokens="1500")
    send_chat(page, "Write a very long story about a lighthouse keeper.")
    wait(page, 60).until(lambda d: len(last_answer(d)[0]) > 20)
    assert smol_server.metrics()["vllm:num_requests_running"] == 1
    page.find_element(By.ID, "stop").click()
    stopped = time.monotonic()
    while smol_server.metrics()["vllm:num_requests_running"] != 0:
        assert time.monotonic() - stopped < 1.0, "the engine still runs the stopped request"
        time.sleep(0.05)
    wait(page, 5).until(lambda d: last_answer(d)[1] == "stopped")
    assert len(last_answer(page)[0]) < 1500 * 2


def test_a_json_schema_gives_valid_json(page: WebDriver) -> None:
    settings(page, max_tokens="80", guided="json", guided_text=json.dumps(SCHEMA))
    send_chat(page, "Give me a person as JSON.")
    jsonschema.validate(json.loads(finished_answer(page)), SCHEMA)


def test_model_output_is_rendered_as_text(page: WebDriver) -> None:
    regex = INJECTION.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")
    settings(page, max_tokens="60", guided="regex", guided_text=regex)
    send_chat(page, "Say anything.")
    assert finished_answer(page) == INJECTION
    assert page.execute_script("return window.pwned") is None
    assert page.find_elements(By.CSS_SELECTOR, "#messages img, #messages script") == []
    settings(page)


def test_completions_show_logprobs_on_hover(page: WebDriver) -> None:
    page.find_element(By.CSS_SELECTOR, "button[data-tab=complete]").click()
    settings(page, max_tokens="8")
    set_field(page, "raw-prompt", "The capital of France is")
    page.find_element(By.ID, "raw-send").click()
    wait(page, 60).until(lambda d: d.find_element(By.ID, "raw-stats").get_attribute(
        "data-finish"))
    tokens = page.find_elements(By.CSS_SELECTOR, "#raw-output .token:not(.prompt)")
    assert len(tokens) == 8
    title = tokens[0].get_attribute("title")
    assert "logprob" in title and title.count("\n") >= 1, title  # the top alternatives
    page.find_element(By.CSS_SELECTOR, "button[data-tab=chat]").click()


def test_the_dashboard_follows_a_burst(page: WebDriver, smol_server: Server) -> None:
    client = OpenAI(base_url=smol_server.url + "/v1", api_key="none", max_retries=0)

    def one() -> None:
        client.completions.create(model="SmolLM2-135M-Instruct", prompt="Once upon a time",
                                  max_tokens=96, temperature=0.8)

    def read() -> tuple[int, float]:
        running = page.find_element(By.ID, "m-running").text
        output = page.find_element(By.ID, "m-gen-tps").text
        return (int(running) if running.isdigit() else -1,
                float(output) if output not in ("-", "") else -1.0)

    wait(page, 10).until(lambda d: read()[0] == 0)
    threads = [threading.Thread(target=one) for _ in range(6)]
    for thread in threads:
        thread.start()
    seen = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(t.is_alive() for t in threads):
        seen.append(read())
        time.sleep(0.2)
    for thread in threads:
        thread.join()
    assert max(running for running, _ in seen) >= 2, seen
    assert max(output for _, output in seen) > 0, seen
    wait(page, 10).until(lambda d: read()[0] == 0)
    assert page.find_element(By.ID, "m-kv").text.endswith("%")


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with Server(["--api-key", API_KEY, "--max-model-len", "1024"],
                tmp_path_factory.mktemp("playground-key") / "server.log") as server:
        yield server


def test_with_an_api_key_the_page_asks_for_it(keyed_server: Server) -> None:
    driver = browser()
    try:
        driver.get(keyed_server.url + "/")
        wait(driver, 30).until(lambda d: d.find_element(By.ID, "auth").is_displayed())
        message = driver.find_element(By.ID, "auth-message").text
        assert "401" in message and "API key" in message, message
        assert driver.find_element(By.ID, "model").text == ""
        set_field(driver, "api-key", API_KEY)
        driver.find_element(By.CSS_SELECTOR, "#auth button").click()
        wait(driver, 30).until(lambda d: d.find_element(By.ID, "model").text)
        assert API_KEY not in driver.current_url
        assert driver.execute_script(
            "return localStorage.length + sessionStorage.length + document.cookie.length") == 0
        settings(driver, max_tokens="8")
        send_chat(driver, "Hello!")
        assert finished_answer(driver)
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def two_engines(tmp_path_factory: pytest.TempPathFactory, tiny_model: TinyModel,
                ) -> Iterator[Server]:
    """The tiny model on two data-parallel engines, with n-gram speculation."""
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": 3})
    with start_tiny_server(tiny_model, tmp_path_factory.mktemp("playground-dp"), "-dp", "2",
                           "--speculative-config", spec) as server:
        yield server


def test_the_dashboard_shows_each_engine_and_speculation(two_engines: Server,
                                                         tiny_model: TinyModel) -> None:
    client = OpenAI(base_url=two_engines.url + "/v1", api_key="none", max_retries=0)
    driver = browser()
    try:
        driver.get(two_engines.url + "/")
        wait(driver, 30).until(lambda d: d.find_element(By.ID, "engines").is_displayed())
        rows = driver.find_elements(By.CSS_SELECTOR, "#engines tbody tr")
        assert [row.find_element(By.TAG_NAME, "td").text for row in rows] == ["0", "1"]
        for _ in range(4):  # repetitive text, which the n-gram proposer drafts from
            # ignore_eos: a random model may end at once, leaving nothing to draft for.
            client.completions.create(model=str(tiny_model.folder), prompt="a b c a b c a b",
                                      max_tokens=32, temperature=0.0,
                                      extra_body={"ignore_eos": True})
        wait(driver, 10).until(lambda d: d.find_element(By.ID, "spec-card").is_displayed())
        assert driver.find_element(By.ID, "m-spec").text.endswith("%")
    finally:
        driver.quit()
