"""Whatever fails inside the server reaches the client as an OpenAI-shaped error: a 500 that
names the exception's class and no traceback, address or path (the traceback goes to the
log), or a 400 when the request's own content is to blame."""

from __future__ import annotations

import http.client
import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI

from octavo.entrypoints.openai.errors import install_error_handlers, internal_error

from ..helpers import Records
from .server import API_KEY, HOST, Server, free_port

SECRET_PATH = "/srv/octavo/secret/weights.bin"


class Opaque:
    """An object whose repr shows a memory address."""


def failing_app() -> FastAPI:
    """The server's error handling around routes that fail as a bug would: no octavo route
    can be made to fail for real, so these stand in for one."""
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/bug")
    async def bug() -> None:
        raise RuntimeError(f"lost {Opaque()!r} reading {SECRET_PATH}\nline two")

    @app.get("/deep")
    async def deep() -> None:
        raise RecursionError("maximum recursion depth exceeded")

    @app.get("/bad-text")
    async def bad_text() -> None:
        "\ud800".encode()

    return app


@pytest.fixture(scope="module")
def failing_server() -> Iterator[int]:
    """``failing_app`` behind a real uvicorn on a loopback port."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(failing_app(), host=HOST, port=port,
                                           log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    yield port
    server.should_exit = True
    thread.join(timeout=30)


def get(port: int, path: str) -> tuple[int, str, Any]:
    connection = http.client.HTTPConnection(HOST, port, timeout=30)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.getheader("content-type", ""), json.loads(
            response.read())
    finally:
        connection.close()


def test_a_bug_is_a_json_500_without_internals(failing_server: int) -> None:
    log = Records()
    uvicorn_log = logging.getLogger("uvicorn.error")  # it does not propagate to the root
    uvicorn_log.addHandler(log)
    try:
        status, content_type, body = get(failing_server, "/bug")
        deadline = time.monotonic() + 10  # uvicorn logs once the answer is sent
        while not any(r.exc_info for r in log.records) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        uvicorn_log.removeHandler(log)
    assert status == 500 and content_type == "application/json", body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "server_error" and error["code"] == "internal_error"
    message = error["message"]
    assert "RuntimeError" in message and "lost" in message, message
    for leak in ("0x", SECRET_PATH, "secret", "line two", "Traceback"):
        assert leak not in message, message
    logged = [r.exc_info[1] for r in log.records if r.exc_info]
    assert len(logged) == 1 and SECRET_PATH in str(logged[0]), log.records  # all of it


@pytest.mark.parametrize(("path", "text"), [("/deep", "nested too deeply"),
                                            ("/bad-text", "not valid Unicode")])
def test_failures_from_request_content_are_400(failing_server: int, path: str,
                                               text: str) -> None:
    status, _, body = get(failing_server, path)
    assert status == 400 and body["error"]["type"] == "invalid_request_error", body
    assert text in body["error"]["message"], body


def test_internal_error_message() -> None:
    message = internal_error(KeyError("x")).message
    assert message == "internal server error (KeyError: 'x')"
    assert internal_error(ValueError()).message == "internal server error (ValueError)"
    long = internal_error(ValueError("y" * 1000)).message
    assert len(long) < 300 and long.endswith("...)")
    path_only = internal_error(OSError(2, "No such file", "C:\\models\\m.gguf")).message
    assert "models" not in path_only and "<path>" in path_only, path_only


def test_guided_json_text_nested_too_deep_is_400(tiny_server: Server) -> None:
    """D9: guided_json as JSON text nested 100k deep raised RecursionError: a plain 500."""
    deep = "[" * 100_000 + "]" * 100_000
    status, _, body = tiny_server.request("POST", "/v1/completions", {
        "prompt": "hi", "max_tokens": 2, "guided_json": deep}, api_key=API_KEY)
    assert status == 400 and "nested too deeply" in body["error"]["message"], body
    status, _, body = tiny_server.request("POST", "/v1/completions", {
        "prompt": "hi", "max_tokens": 2}, api_key=API_KEY)
    assert status == 200, body
