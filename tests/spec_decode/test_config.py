"""--speculative-config / LLM(speculative_config=...): parsed once, errors name the key."""

from __future__ import annotations

import pytest

from octavo.config import ConfigError, EngineConfig
from octavo.config.speculative import SpeculativeConfig
from octavo.plugins import get_registries
from octavo.plugins.resolve import check_names


def test_json_text_and_dicts_parse_alike() -> None:
    text = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}'
    config = EngineConfig.from_kwargs(speculative_config=text).speculative
    assert config == SpeculativeConfig("ngram", 4, prompt_lookup_max=3)
    assert EngineConfig.from_kwargs(speculative_config={"method": "ngram",
                                                        "num_speculative_tokens": 4,
                                                        "prompt_lookup_max": 3},
                                    ).speculative == config
    assert EngineConfig().speculative is None
    assert EngineConfig.from_kwargs().num_speculative_tokens == 0
    assert EngineConfig.from_kwargs(speculative_config=text).num_speculative_tokens == 4


@pytest.mark.parametrize(("value", "named"), [
    ('{"method": "ngram", ', "not valid JSON"),
    ("[1, 2]", "JSON object"),
    ('{"num_speculative_tokens": 4}', "'method'"),
    ('{"method": "ngram"}', "'num_speculative_tokens'"),
    ('{"method": "ngram", "num_speculative_tokens": 0}', "num_speculative_tokens"),
    ('{"method": "ngram", "num_speculative_tokens": true}', "num_speculative_tokens"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, '
     '"prompt_lookup_max": 3}', "prompt_lookup_min"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "draft_tp": 1}', "'draft_tp'"),
    ('{"method": "eagle", "num_speculative_tokens": 2, "model": 3}', "model"),
])
def test_bad_values_are_named(value: str, named: str) -> None:
    with pytest.raises(ConfigError, match="speculative_config") as info:
        EngineConfig.from_kwargs(speculative_config=value)
    assert named in str(info.value)


@pytest.mark.parametrize(("value", "named"), [
    ('{"method": "lookahead", "num_speculative_tokens": 4}',
     "speculative_config: method: unknown proposer 'lookahead'; registered: ngram, "
     "draft_model, medusa, eagle"),
    ('{"method": "draft_model", "num_speculative_tokens": 2}',
     "speculative_config: method 'draft_model' needs \"model\" (a folder)"),
])
def test_methods_are_checked_against_the_registered_proposers(value: str, named: str) -> None:
    """Parsing loads no plugin: the method is checked when the engine (or the CLI) resolves
    the config's names."""
    config = EngineConfig.from_kwargs(speculative_config=value)
    with pytest.raises(ConfigError) as info:
        check_names(config, get_registries())
    assert named in str(info.value)
