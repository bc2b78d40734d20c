"""``--kv-transfer-config`` / ``LLM(kv_transfer_config=...)``: parsing and clear errors."""

from __future__ import annotations

import pytest

from octavo import LLM
from octavo.config import ConfigError, EngineConfig, KVTransferConfig
from octavo.plugins import get_registries
from octavo.plugins.resolve import check_names

from ..helpers import run_octavo
from .conftest import TinyModel


def test_parse_json_dict_and_vllm_spellings() -> None:
    parsed = KVTransferConfig.parse('{"connector": "shared_storage", "role": "producer", '
                                    '"path": "/tmp/x"}')
    assert parsed == KVTransferConfig("shared_storage", "producer", {"path": "/tmp/x"})
    assert (parsed.is_producer, parsed.is_consumer) == (True, False)
    vllm = KVTransferConfig.parse({"kv_connector": "mooncake", "kv_role": "kv_both"})
    assert (vllm.connector, vllm.role, vllm.is_consumer) == ("mooncake", "both", True)
    config = EngineConfig.from_kwargs(kv_transfer_config={"connector": "shared_storage",
                                                          "role": "consumer", "path": "/x"})
    assert config.kv_transfer == KVTransferConfig("shared_storage", "consumer", {"path": "/x"})


@pytest.mark.parametrize("value, message", [
    ('{"connector": ', "not valid JSON"),
    ('["shared_storage"]', "must be a JSON object"),
    ('{"connector": "shared_storage", "role": "sender"}', "role must be one of"),
    ('{"role": "producer"}', '"connector" must name a connector'),
])
def test_bad_config_names_the_problem(value: str, message: str) -> None:
    with pytest.raises(ConfigError, match="kv_transfer_config") as error:
        KVTransferConfig.parse(value)
    assert message in str(error.value)


def test_unknown_connector_is_refused_with_the_registered_ones() -> None:
    """Parsing loads no plugin; the name is checked against the registry when the engine
    (or the CLI, before any model load) resolves it."""
    config = EngineConfig.from_kwargs(kv_transfer_config='{"connector": "nfs"}')
    with pytest.raises(ConfigError, match="kv_transfer_config: unknown KV connector 'nfs'; "
                                          "registered: shared_storage, mooncake"):
        check_names(config, get_registries())


def test_cli_rejects_bad_config_before_loading_a_model() -> None:
    result = run_octavo("generate", "hi", "--kv-transfer-config", '{"connector": "nfs"}')
    assert result.returncode == 2, result.stderr
    assert "unknown KV connector 'nfs'" in result.stderr


def test_shared_storage_needs_a_path(tiny_model: TinyModel) -> None:
    with pytest.raises(ConfigError, match='shared_storage connector needs "path"'):
        LLM(model=str(tiny_model.folder), dtype="float32", kv_cache_memory=8 * 2**20,
            kv_transfer_config={"connector": "shared_storage", "role": "producer"})
