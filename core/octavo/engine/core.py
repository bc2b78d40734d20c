"""``EngineCore``: the inner loop - schedule, execute, update - around one model.

It knows nothing of text: requests arrive as token ids with sampling params, and each
``step()`` returns per-request ``EngineCoreOutput``s (new token ids, finish reasons). The
offline ``LLM`` drives it in-process; the server drives it in its own process.
"""

from __future__ import annotations

import logging

from octavo.config import ConfigError, EngineConfig
from octavo.models.config import eos_token_ids
from octavo.models.loader import ModelFiles
from octavo.outputs import EngineCoreOutput
from octavo.platforms import Platform
from octavo.plugins import get_registries
from octavo.request import Request, RequestStatus
from octavo.structured.manager import StructuredOutputManager

logger = logging.getLogger(__name__)


class EngineCore:
    def __init__(self, config: EngineConfig, platform: type[Platform], files: ModelFiles,
                 max_model_len: int) -> None:
        self.config = config
        self.worker = platform.worker_class()(config, platform, files, max_model_len)
        num_blocks = self.worker.determine_num_blocks()
        self.worker.initialize_kv_cache(num_blocks)
        try:
            sched_config = config.scheduler_config(num_blocks, max_model_len)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        scheduler_cls = get_registries().schedulers.get("default")
        self.structured_output = StructuredOutputManager(
            files.tokenizer, int(files.hf_config["vocab_size"]), eos_token_ids(files.hf_config))
        self.scheduler = scheduler_cls(sched_config, structured_output=self.structured_output)
        block_tokens = num_blocks * config.cache.block_size
        logger.info("KV cache: %d blocks of %d tokens (%d tokens); max concurrency at "
                    "max_model_len=%d: %.2fx", num_blocks, config.cache.block_size,
                    block_tokens, max_model_len, block_tokens / max_model_len)
        self.num_blocks = num_blocks

    def add_request(self, request: Request) -> None:
        self.scheduler.add_request(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def reset_prefix_cache(self) -> None:
        """Forget every cached block not held by a request (e.g. after new weights)."""
        self.scheduler.reset_prefix_cache()

    def step(self) -> list[EngineCoreOutput]:
        scheduler_output = self.scheduler.schedule()
        runner_output = self.worker.execute_model(scheduler_output)
        return self.scheduler.update_from_output(scheduler_output, runner_output)
