"""The model architectures the core ships, by their HF ``architectures`` name. The built-in
plugin registers these; plugins add more through ``octavo_register_models``."""

from __future__ import annotations

from octavo.models.base import CausalLM
from octavo.models.bert import BertModel
from octavo.models.deepseek_v2 import DeepseekV2ForCausalLM
from octavo.models.gemma2 import Gemma2ForCausalLM
from octavo.models.gemma3 import Gemma3ForCausalLM
from octavo.models.jamba import JambaForCausalLM
from octavo.models.llama import (
    LlamaForCausalLM,
    MistralForCausalLM,
    Qwen2ForCausalLM,
    Qwen3ForCausalLM,
)
from octavo.models.mixtral import MixtralForCausalLM
from octavo.models.phi3 import Phi3ForCausalLM
from octavo.models.qwen_moe import Qwen2MoeForCausalLM, Qwen3MoeForCausalLM

BUILTIN_ARCHITECTURES: dict[str, type[CausalLM]] = {
    model.__name__: model for model in (LlamaForCausalLM, MistralForCausalLM,
                                         Qwen2ForCausalLM, Qwen3ForCausalLM,
                                         MixtralForCausalLM, Gemma3ForCausalLM,
                                         Gemma2ForCausalLM, Phi3ForCausalLM,
                                         Qwen2MoeForCausalLM, Qwen3MoeForCausalLM,
                                         DeepseekV2ForCausalLM, JambaForCausalLM, BertModel)
}
