"""--speculative-config / LLM(speculative_config=...): parsed once, errors name the key."""

from __future__ import annotations

import pytest

from octavo.config import ConfigError, EngineConfig
from octavo.spec.config import SpeculativeConfig


def test_json_text_and_dicts_parse_alike() -> None:
    text = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}'
    config = EngineConfig.from_kwargs(speculative_config=text).speculative_config
    assert config == SpeculativeConfig("ngram", 4, prompt_lookup_max=3)
    assert EngineConfig.from_kwargs(speculative_config={"method": "ngram",
                                                        "num_speculative_tokens": 4,
                                                        "prompt_lookup_max": 3},
                                    ).speculative_config == config
    assert EngineConfig().speculative_config is None
    assert EngineConfig.from_kwargs().scheduler_config(64, 128).num_speculative_tokens == 0
    on = EngineConfig.from_kwargs(speculative_config=text)
    assert on.scheduler_config(64, 128).num_speculative_tokens == 4


@pytest.mark.parametrize(("value", "named"), [
    ('{"method": "ngram", ', "not valid JSON"),
    ("[1, 2]", "JSON object"),
    ('{"num_speculative_tokens": 4}', "'method'"),
    ('{"method": "ngram"}', "'num_speculative_tokens'"),
    ('{"method": "lookahead", "num_speculative_tokens": 4}', "method"),
    ('{"method": "ngram", "num_speculative_tokens": 0}', "num_speculative_tokens"),
    ('{"method": "ngram", "num_speculative_tokens": true}', "num_speculative_tokens"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, '
     '"prompt_lookup_max": 3}', "prompt_lookup_min"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "draft_tp": 1}', "'draft_tp'"),
    ('{"method": "draft_model", "num_speculative_tokens": 2}', '"model"'),
    ('{"method": "eagle", "num_speculative_tokens": 2, "model": 3}', "model"),
])
def test_bad_values_are_named(value: str, named: str) -> None:
    with pytest.raises(ConfigError, match="speculative_config") as info:
        EngineConfig.from_kwargs(speculative_config=value)
    assert named in str(info.value)
