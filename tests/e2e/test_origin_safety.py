"""What a web page in a browser can do to a server on its user's machine, against real
servers: a cross-site "simple" POST (text/plain or no Content-Type)
is refused with 415, a rebound host name with 400, CORS answers only the origins given, and
with an API key the API documentation needs the key too."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import TinyModel, start_tiny_server
from .server import API_KEY, Server

UI_ORIGIN = "http://ui.example.test"
EVIL_ORIGIN = "http://evil.example"
DOCS = ("/docs", "/redoc", "/docs/oauth2-redirect", "/openapi.json")
OPEN = ("/health", "/metrics", "/version")


def send(server: Server, method: str, path: str, body: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], Any]:
    """Exactly these headers, no Content-Type added."""
    return server.request(method, path, body, headers, content_type=None)


def assert_error(payload: Any, code: str) -> None:
    assert isinstance(payload, dict), payload
    assert set(payload["error"]) == {"message", "type", "param", "code"}, payload
    assert payload["error"]["code"] == code, payload


@pytest.fixture(scope="module")
def cors_server(tiny_model: TinyModel, tmp_path_factory: pytest.TempPathFactory,
                ) -> Iterator[Server]:
    """No API key, bound to 127.0.0.1 with the default Host check, CORS for UI_ORIGIN."""
    with start_tiny_server(tiny_model, tmp_path_factory.mktemp("cors-server"),
                           "--allowed-origins", UI_ORIGIN) as server:
        yield server


@pytest.fixture(scope="module")
def no_docs_server(tiny_model: TinyModel, tmp_path_factory: pytest.TempPathFactory,
                   ) -> Iterator[Server]:
    with start_tiny_server(tiny_model, tmp_path_factory.mktemp("no-docs-server"),
                           "--disable-docs", "--allowed-hosts",
                           "api.example.test,127.0.0.1") as server:
        yield server


@pytest.mark.parametrize("headers", [{}, {"Content-Type": "text/plain"},
                                     {"Content-Type": "application/x-www-form-urlencoded"}],
                         ids=["no-content-type", "text-plain", "form"])
def test_cross_site_simple_posts_are_refused(cors_server: Server,
                                             headers: dict[str, str]) -> None:
    """D13: a body-less POST /reset_prefix_cache worked from any web page."""
    headers = {**headers, "Origin": EVIL_ORIGIN}
    for path, body in (("/reset_prefix_cache", None), ("/reset_prefix_cache", b"{}"),
                       ("/v1/completions", b'{"prompt": "hi", "max_tokens": 1}')):
        status, answer_headers, payload = send(cors_server, "POST", path, body, headers)
        assert status == 415, (path, payload)
        assert_error(payload, "unsupported_media_type")
        assert "access-control-allow-origin" not in answer_headers


@pytest.mark.parametrize("body", [None, b"{}"], ids=["no-body", "empty-object"])
def test_reset_prefix_cache_with_json_content_type(cors_server: Server,
                                                   body: bytes | None) -> None:
    status, _, payload = send(cors_server, "POST", "/reset_prefix_cache", body,
                              {"Content-Type": "application/json"})
    assert status == 200, payload


def test_reset_prefix_cache_takes_no_fields(cors_server: Server) -> None:
    status, _, payload = send(cors_server, "POST", "/reset_prefix_cache", b'{"all": true}',
                              {"Content-Type": "application/json"})
    assert status == 400 and "all" in payload["error"]["message"], payload


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "127.0.0.1.evil.example",
                                  "localhost.", ""], ids=["name", "name-port", "suffix",
                                                          "trailing-dot", "empty"])
def test_foreign_host_header_is_refused(cors_server: Server, host: str) -> None:
    """D13: DNS rebinding: the page's own name, resolved to 127.0.0.1, reached the server."""
    for method, path, body in (("GET", "/health", None), ("GET", "/version", None),
                               ("POST", "/v1/completions", b'{"prompt": "hi"}')):
        status, _, payload = send(cors_server, method, path, body,
                                  {"Host": host, "Content-Type": "application/json"})
        assert status == 400, (host, path, payload)
        assert_error(payload, "invalid_host")
        assert payload["error"]["message"].startswith("invalid host"), payload


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "[::1]", "LOCALHOST"])
def test_own_host_names_work_on_any_port(cors_server: Server, host: str) -> None:
    for port in ("", f":{cors_server.port}", ":80"):
        status, _, payload = send(cors_server, "POST", "/v1/completions",
                                  b'{"prompt": "hi", "max_tokens": 2}',
                                  {"Host": host + port, "Content-Type": "application/json"})
        assert status == 200 and payload["usage"]["completion_tokens"] >= 1, (host, payload)


def test_allowed_hosts_replace_the_default(no_docs_server: Server) -> None:
    for host, expected in (("api.example.test:443", 200), ("127.0.0.1", 200),
                           ("localhost", 400)):
        status, _, payload = send(no_docs_server, "GET", "/health", headers={"Host": host})
        assert status == expected, (host, payload)


def test_cors_preflight_for_the_allowed_origin(cors_server: Server) -> None:
    status, headers, _ = send(cors_server, "OPTIONS", "/v1/completions", headers={
        "Origin": UI_ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type, authorization"})
    assert status == 200 and headers["access-control-allow-origin"] == UI_ORIGIN, headers
    status, headers, payload = send(cors_server, "POST", "/v1/completions",
                                    b'{"prompt": "hi", "max_tokens": 1}',
                                    {"Origin": UI_ORIGIN, "Content-Type": "application/json"})
    assert status == 200 and headers["access-control-allow-origin"] == UI_ORIGIN, payload


def test_cors_refuses_other_origins(cors_server: Server) -> None:
    status, headers, payload = send(cors_server, "OPTIONS", "/v1/completions", headers={
        "Origin": EVIL_ORIGIN, "Access-Control-Request-Method": "POST"})
    assert status == 400, payload
    assert_error(payload, "cors_refused")
    assert "access-control-allow-origin" not in headers
    status, headers, _ = send(cors_server, "GET", "/v1/models", headers={"Origin": EVIL_ORIGIN})
    assert status == 200 and "access-control-allow-origin" not in headers


def test_cors_is_off_by_default(tiny_server: Server) -> None:
    status, headers, _ = send(tiny_server, "OPTIONS", "/v1/completions", headers={
        "Origin": UI_ORIGIN, "Access-Control-Request-Method": "POST"})
    assert status == 405 and not any(h.startswith("access-control-") for h in headers)
    status, headers, _ = send(tiny_server, "GET", "/health", headers={"Origin": UI_ORIGIN})
    assert status == 200 and not any(h.startswith("access-control-") for h in headers)


@pytest.mark.parametrize("path", DOCS)
def test_docs_need_the_api_key(tiny_server: Server, path: str) -> None:
    """D15: /docs and /openapi.json stayed open with --api-key."""
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        status, _, payload = send(tiny_server, "GET", path, headers=headers)
        assert status == 401, (path, payload)
        assert_error(payload, "invalid_api_key")
    status, headers, payload = send(tiny_server, "GET", path,
                                    headers={"Authorization": f"Bearer {API_KEY}"})
    assert status == 200, (path, payload)
    if path == "/openapi.json":
        assert "/v1/completions" in payload["paths"]
    else:
        assert headers["content-type"].startswith("text/html")


def test_probe_routes_stay_open_with_a_key(tiny_server: Server) -> None:
    for path in OPEN:
        assert send(tiny_server, "GET", path)[0] == 200, path


def test_docs_are_open_without_a_key(cors_server: Server) -> None:
    for path in DOCS:
        assert send(cors_server, "GET", path)[0] == 200, path


def test_disable_docs(no_docs_server: Server) -> None:
    for path in DOCS:
        status, _, payload = send(no_docs_server, "GET", path)
        assert status == 404, (path, payload)
    for path in OPEN:
        assert send(no_docs_server, "GET", path)[0] == 200, path
