"""A model that does not split over the configured ranks is refused before any worker
starts, with the dimension that does not divide."""

from __future__ import annotations

from pathlib import Path

import pytest

from octavo.config import ConfigError, EngineConfig
from octavo.cpu.platform import CpuPlatform
from octavo.executor.fits import check_model_features, check_model_fits, check_weights_fit
from octavo.models.loader import ModelFiles

SMOLLM2 = {"architectures": ["LlamaForCausalLM"], "vocab_size": 49152, "hidden_size": 576,
           "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
           "num_key_value_heads": 3, "max_position_embeddings": 8192}
MIXTRAL = {**SMOLLM2, "architectures": ["MixtralForCausalLM"], "num_attention_heads": 8,
           "num_key_value_heads": 2, "intermediate_size": 98, "num_local_experts": 6,
           "num_experts_per_tok": 2}


@pytest.mark.parametrize(("hf", "kwargs"), [
    (SMOLLM2, {"tensor_parallel_size": 3}),
    (SMOLLM2, {"pipeline_parallel_size": 30}),
    (SMOLLM2, {"tensor_parallel_size": 3, "pipeline_parallel_size": 2}),
    (MIXTRAL, {"tensor_parallel_size": 2}),  # 98 features and 6 experts halve
    (MIXTRAL, {"tensor_parallel_size": 2, "enable_expert_parallel": True}),
    (SMOLLM2, {"sequence_parallel_size": 3}),  # 3 query heads and 1 KV head per rank
    ({**SMOLLM2, "num_attention_heads": 8, "num_key_value_heads": 4},
     {"tensor_parallel_size": 2, "sequence_parallel_size": 2}),
])
def test_splits_that_fit(hf: dict, kwargs: dict) -> None:
    check_model_fits(EngineConfig.from_kwargs(**kwargs), hf, "m")


def test_expert_parallel_needs_whole_experts_not_sliced_features() -> None:
    sliced = EngineConfig.from_kwargs(tensor_parallel_size=4)
    with pytest.raises(ConfigError, match="98 expert MLP features do not divide"):
        check_model_fits(sliced, MIXTRAL, "m")
    whole = EngineConfig.from_kwargs(tensor_parallel_size=4, enable_expert_parallel=True)
    with pytest.raises(ConfigError, match="6 experts do not divide") as refused:
        check_model_fits(whole, MIXTRAL, "m")
    assert "MLP features" not in str(refused.value)


def test_experts_across_engines_split_over_dp_times_tp() -> None:
    """-dp 2 -tp 2 --enable-expert-parallel: 6 experts over 4 workers are refused with the
    numbers; -dp 2 alone (one worker per engine, 3 experts each) fits."""
    check_model_fits(EngineConfig.from_kwargs(data_parallel_size=2,
                                              enable_expert_parallel=True), MIXTRAL, "m")
    config = EngineConfig.from_kwargs(data_parallel_size=2, tensor_parallel_size=2,
                                      enable_expert_parallel=True)
    with pytest.raises(ConfigError, match=r"6 experts do not divide by data_parallel_size x "
                                          r"tensor_parallel_size = 2 x 2 = 4"):
        check_model_fits(config, MIXTRAL, "m")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"tensor_parallel_size": 2}, "9 attention heads do not divide by tensor_parallel_size=2"),
    ({"tensor_parallel_size": 2}, "3 key/value heads neither divide nor are a multiple"),
    ({"pipeline_parallel_size": 31}, "30 layers are fewer than pipeline_parallel_size=31"),
    ({"sequence_parallel_size": 2}, "its 9 attention heads do not divide by "
     "tensor_parallel_size x sequence_parallel_size = 1 x 2 = 2; its 3 key/value heads do "
     "not divide by tensor_parallel_size x sequence_parallel_size = 1 x 2 = 2"),
    ({"tensor_parallel_size": 3, "sequence_parallel_size": 3}, "its 3 key/value heads do not "
     "divide by tensor_parallel_size x sequence_parallel_size = 3 x 3 = 9"),
])
def test_splits_that_do_not_fit_are_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=f"cannot be split over the workers: .*{message}"):
        check_model_fits(EngineConfig.from_kwargs(**kwargs), SMOLLM2, "model.gguf")


def test_length_dependent_rope_refuses_speculative_decoding() -> None:
    longrope = {"type": "longrope", "short_factor": [1.0] * 32, "long_factor": [2.0] * 32}
    phi3 = {**SMOLLM2, "architectures": ["Phi3ForCausalLM"],
            "original_max_position_embeddings": 4096, "rope_scaling": longrope}
    check_model_features(EngineConfig.from_kwargs(), phi3, "m")
    spec = EngineConfig.from_kwargs(speculative_config={"method": "ngram",
                                                        "num_speculative_tokens": 2})
    check_model_features(spec, SMOLLM2, "m")
    with pytest.raises(ConfigError, match="speculative decoding .* does not support the "
                                          "longrope RoPE scaling"):
        check_model_features(spec, phi3, "m")


def test_latent_attention_refuses_drafts_and_connectors() -> None:
    deepseek = {**SMOLLM2, "architectures": ["DeepseekV2ForCausalLM"], "kv_lora_rank": 32,
                "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16}
    check_model_features(EngineConfig.from_kwargs(), deepseek, "m")
    for kwargs in ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 2}},
                   {"kv_transfer_config": {"kv_connector": "SharedStorageConnector",
                                           "kv_role": "kv_both"}}):
        with pytest.raises(ConfigError, match="multi-head latent attention .* does not "
                                              "support"):
            check_model_features(EngineConfig.from_kwargs(**kwargs), deepseek, "m")


def test_weights_larger_than_memory_are_refused_before_allocation() -> None:
    """A 16 Mi vocabulary of 64 Ki-wide embeddings (every number in range, ~4 TiB in
    fp32): refused with the numbers from the declared sizes alone, before the model is built
    even on the meta device; SmolLM2's own sizes pass (counted on the meta device)."""
    def files(hf: dict) -> ModelFiles:
        return ModelFiles(Path("model.gguf"), hf, tokenizer=None, weights=[])  # type: ignore[arg-type]

    config = EngineConfig.from_kwargs(dtype="float32")
    check_weights_fit(config, files(SMOLLM2), CpuPlatform)
    message = (r"the weights take at least \d+\.\d GiB in torch.float32 \(at least "
               r"[\d,]+ parameters: vocabulary 16777216, hidden size 65536, 30 layers\), "
               r"more than")
    huge = {**SMOLLM2, "vocab_size": 2**24, "hidden_size": 2**16, "head_dim": 64}
    with pytest.raises(ConfigError, match=message):
        check_weights_fit(config, files(huge), CpuPlatform)
