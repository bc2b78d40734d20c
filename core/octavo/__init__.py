"""Octavo: an LLM inference and serving engine - minimal core plus plugins.

``from octavo import LLM, SamplingParams`` is the offline API, as in vLLM. The packages read
bottom-up (docs/architecture.md has the table; ``lint-imports`` checks it): plain data
(``request``, ``outputs``, ``sampling_params``, ``stats``, ``block_hash``) and ``config`` at
the bottom, then the features, the scheduler and the worker, the plugin system, the engine,
the entrypoints, and on top ``plugin_api``, the one module plugins import.
"""

from typing import TYPE_CHECKING, Any

from octavo.logger import init_logger
from octavo.lora_request import LoRARequest
from octavo.pooling_params import PoolingParams
from octavo.sampling_params import SamplingParams
from octavo.version import __version__

init_logger()

if TYPE_CHECKING:
    from octavo.engine.llm import LLM
    from octavo.engine.outputs import CompletionOutput, EmbeddingRequestOutput, RequestOutput

__all__ = ["LLM", "CompletionOutput", "EmbeddingRequestOutput", "LoRARequest", "PoolingParams",
           "RequestOutput", "SamplingParams", "__version__"]


def __getattr__(name: str) -> Any:
    # The engine pulls in torch and the models; import it only when asked for, so
    # `octavo plugins` and `octavo --help` start fast.
    if name == "LLM":
        from octavo.engine.llm import LLM

        return LLM
    if name in ("CompletionOutput", "EmbeddingRequestOutput", "RequestOutput"):
        from octavo.engine import outputs

        return getattr(outputs, name)
    raise AttributeError(f"module 'octavo' has no attribute {name!r}")
