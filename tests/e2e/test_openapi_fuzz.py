"""Schemathesis against a real server: every operation of its OpenAPI document, fuzzed with
schema-valid and schema-violating requests, must answer as the document says (statuses,
content types, response and header schemas), never with a 5xx, and leave the engine alive.
The routes the document leaves out (the API documentation's, the playground's) are called
too, as the GET operations they are.

The context is 128 tokens (``--max-model-len``) so that a generated request asking for the
whole context stays cheap: most valid chat and Responses requests ask for it (no
max_tokens), and they are most of the run's time. The run is seeded, so a failure
reproduces (``st replay`` with the case id it prints).
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute

from octavo.entrypoints.openai.openapi_doc import docs_router
from octavo.entrypoints.openai.playground import MEDIA_TYPES, ROUTES, playground_router

from .conftest import TinyModel, start_tiny_server
from .server import API_KEY, Server

SEED = 20261201
MAX_EXAMPLES = 100
# positive_data_acceptance is left out: the schema cannot say everything the server checks
# (a prompt must fit the context, token ids the vocabulary, min_tokens <= max_tokens,
# top_logprobs needs logprobs, stream_options needs stream...), so schema-valid requests
# are rightly refused with 400; negative_data_rejection holds the other direction.
CHECKS = ("not_a_server_error", "status_code_conformance", "content_type_conformance",
          "response_schema_conformance", "response_headers_conformance",
          "negative_data_rejection")


@pytest.fixture(scope="module")
def fuzz_server(tiny_model: TinyModel, tmp_path_factory: pytest.TempPathFactory,
                ) -> Iterator[Server]:
    with start_tiny_server(tiny_model, tmp_path_factory.mktemp("fuzz-server"),
                           "--max-model-len", "128", "--api-key", API_KEY) as server:
        yield server


def run_schemathesis(server: Server, schema: Path, report_dir: Path,
                     ) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "schemathesis.cli", "run", str(schema),
               "--url", server.url, "--header", f"Authorization: Bearer {API_KEY}",
               "--checks", ",".join(CHECKS), "--max-examples", str(MAX_EXAMPLES),
               "--continue-on-failure", "--seed", str(SEED), "--workers", "1",
               "--generation-database", "none", "--request-timeout", "30", "--no-color",
               "--report", "ndjson", "--report-dir", str(report_dir)]
    return subprocess.run(command, capture_output=True, text=True, timeout=240,
                          cwd=report_dir)


def case_statuses(report_dir: Path) -> dict[str, collections.Counter[int]]:
    """Per operation, how many generated cases got each status (from the NDJSON report)."""
    statuses: dict[str, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    report = next(report_dir.glob("*.ndjson"))
    for line in report.read_text().splitlines():
        finished = json.loads(line).get("ScenarioFinished")
        if not finished:
            continue
        recorder = finished["recorder"]
        for interaction in recorder.get("interactions", {}).values():
            response = interaction.get("response")
            statuses[recorder["label"]][response["status_code"] if response else 0] += 1
    return statuses


def undocumented_operations() -> dict[str, dict[str, Any]]:
    """The routes the app serves outside its document (the API documentation's and the
    playground's, from their routers), as GET operations answering their media types, so
    that the fuzzer calls every route the server has."""
    media = {"/openapi.json": "application/json"}
    media.update({path: MEDIA_TYPES[name].split(";")[0] for path, name in ROUTES.items()})
    routes = [*docs_router(FastAPI(), []).routes, *playground_router().routes]
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        assert isinstance(route, APIRoute) and route.methods == {"GET"}, route
        content = media.get(route.path, "text/html")
        paths[route.path] = {"get": {"responses": {
            "200": {"description": "the page", "content": {content: {"schema": {}}}},
            "401": {"description": "the API key", "content": {"application/json": {}}}}}}
    return paths


def test_server_conforms_to_its_openapi_document(fuzz_server: Server, tmp_path: Path) -> None:
    status, _, document = fuzz_server.request("GET", "/openapi.json", api_key=API_KEY)
    assert status == 200, document
    hidden = undocumented_operations()
    assert not hidden.keys() & document["paths"].keys()
    for route in ("/tokenize", "/detokenize", "/v1/embeddings", "/v1/chat/completions",
                  "/v1/completions", "/v1/models", "/health", "/metrics", "/version"):
        assert route in document["paths"], route
    document["paths"].update(hidden)
    schema = tmp_path / "openapi.json"
    schema.write_text(json.dumps(document))
    run = run_schemathesis(fuzz_server, schema, tmp_path)
    statuses = case_statuses(tmp_path)
    summary = {operation: dict(counts) for operation, counts in sorted(statuses.items())}
    print(f"schemathesis cases per operation and status: {summary}")
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    operations = [(method, path) for path, item in document["paths"].items()
                  for method in item]
    assert len(statuses) == len(operations), summary
    for (method, path) in operations:
        counts = statuses[f"{method.upper()} {path}"]
        if method == "post":  # operations with inputs to vary
            assert sum(counts.values()) >= MAX_EXAMPLES, (path, counts)
        assert not [s for s in counts if s >= 500 or s == 0], (path, counts)
    assert fuzz_server.request("GET", "/health")[0] == 200
    status, _, answer = fuzz_server.request("POST", "/v1/completions",
                                            {"prompt": "hello", "max_tokens": 2},
                                            api_key=API_KEY)
    assert status == 200 and answer["usage"]["completion_tokens"] >= 1, answer
