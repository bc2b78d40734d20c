"""The playground's HTTP side, without a browser: the page and its files with their
security headers, open without the API key while the API stays closed, and off with
--disable-playground (the browser tests are in test_playground_browser.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ..core.tiny_models import TinyModel
from .conftest import start_tiny_server
from .server import API_KEY, Server


def test_the_page_and_its_files_are_served_with_a_strict_policy(tiny_server: Server) -> None:
    for path, media_type in (("/", "text/html"), ("/playground", "text/html"),
                             ("/playground/app.js", "text/javascript"),
                             ("/playground/style.css", "text/css")):
        status, headers, body = tiny_server.request("GET", path)  # no API key
        assert status == 200, (path, body)
        assert headers["content-type"].startswith(media_type), headers
        policy = headers["content-security-policy"]
        assert "default-src 'none'" in policy and "script-src 'self'" in policy
        assert "connect-src 'self'" in policy and "frame-ancestors 'none'" in policy
        assert headers["x-content-type-options"] == "nosniff"
        assert "access-control-allow-origin" not in headers
    status, _, page = tiny_server.request("GET", "/")
    assert '<script src="/playground/app.js" defer></script>' in page
    assert "<script>" not in page and "style=" not in page  # nothing inline for CSP to allow
    assert tiny_server.request("GET", "/v1/models")[0] == 401  # the API itself stays closed


def test_the_script_puts_no_text_in_the_page_as_html() -> None:
    script = (Path(__file__).parents[2] / "core/octavo/entrypoints/openai/playground/app.js")
    text = script.read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in text.replace("never innerHTML", ""), sink
    assert "localStorage" not in text and "sessionStorage" not in text  # the key stays in memory


@pytest.fixture(scope="module")
def no_playground(tiny_model: TinyModel, tmp_path_factory: pytest.TempPathFactory,
                  ) -> Iterator[Server]:
    with start_tiny_server(tiny_model, tmp_path_factory.mktemp("no-playground"),
                           "--disable-playground") as server:
        yield server


def test_disable_playground_serves_no_page(no_playground: Server) -> None:
    for path in ("/", "/playground", "/playground/app.js"):
        assert no_playground.request("GET", path)[0] == 404, path
    assert "playground:" not in no_playground.log()
    status, _, models = no_playground.request("GET", "/v1/models", api_key=API_KEY)
    assert status == 200, models


def test_serve_prints_the_playground_url(tiny_server: Server) -> None:
    assert f"playground: http://127.0.0.1:{tiny_server.port}/" in tiny_server.log()
