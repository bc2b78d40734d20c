"""``octavo bench throughput --json-schema FILE``: every request guided by the schema (the
benchmark's schema file included), and a bad file named in a usage error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.core.tiny_models import save_tiny_model
from tests.helpers import run_octavo

SCHEMA_FILE = Path(__file__).parents[2] / "benchmarks" / "schemas" / "records.json"
ARGS = ["--dtype", "float32", "--kv-cache-memory", "16MiB", "--num-prompts", "4",
        "--random-input-len", "12", "--random-output-len", "24"]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("tiny-bench")
    save_tiny_model("llama", folder, seed=0)
    return str(folder)


def test_throughput_with_a_json_schema(model: str, tmp_path: Path) -> None:
    out = tmp_path / "tp.json"
    result = run_octavo("bench", "throughput", "--model", model, *ARGS,
                        "--json-schema", str(SCHEMA_FILE), "--output-json", str(out))
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    assert data["json_schema"] == str(SCHEMA_FILE) and data["num_requests"] == 4
    assert 0 < data["output_tokens"] <= 4 * 24


def test_bad_schema_file_is_a_usage_error(model: str, tmp_path: Path) -> None:
    """Found before the model loads."""
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    result = run_octavo("bench", "throughput", "--model", model, *ARGS, "--json-schema",
                        str(bad))
    assert result.returncode == 2
    assert f"--json-schema {bad}: structured json is not valid JSON" in result.stderr
    bad.write_text('{"type": "nope"}')
    result = run_octavo("bench", "throughput", "--model", model, *ARGS, "--json-schema",
                        str(bad))
    assert result.returncode == 2
    assert f'--json-schema {bad}: structured json: Unsupported type "nope"' in result.stderr
