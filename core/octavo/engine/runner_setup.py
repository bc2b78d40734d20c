"""Settling what a model is run for (``--runner``) and, for pooling, how - once its files
are read, before the workers are built (they read the settled config).

``runner=auto`` becomes ``pooling`` for an encoder-only architecture (BertModel) and
``generate`` for the others. A pooling engine's ``PoolerConfig`` takes every key the user
left out from the model: a sentence-transformers folder's modules
(``octavo.models.sentence_transformers``), else CLS for an encoder and LAST for a
decoder, normalised (vLLM's defaults). A prompt that an encoder reads, or that CLS or
MEAN pooling reads whole, is computed in one step (no chunked prefill, so the token budget
must hold ``max_model_len``) and never from the prefix cache (cached positions have no
hidden states to pool).
"""

from __future__ import annotations

import logging

from octavo.config import ConfigError, EngineConfig, PoolerConfig
from octavo.config.engine import check_pooling_combinations
from octavo.models.build import config_file_of, model_class_for
from octavo.models.loader import ModelFiles
from octavo.models.sentence_transformers import folder_pooler_config
from octavo.platforms import Platform
from octavo.plugins import get_registries
from octavo.pooling_params import check_dimensions
from octavo.qualname import resolve_qualname
from octavo.worker.worker import Worker

logger = logging.getLogger(__name__)


def setup_runner(config: EngineConfig, files: ModelFiles, max_model_len: int,
                 platform: type[Platform]) -> bool:
    """Settle ``config.model.runner`` and, for pooling, ``config.pooler`` and the
    scheduling it needs (``ConfigError`` for what cannot run, on ``platform`` too).
    Returns whether the model is encoder-only (it then has no KV cache)."""
    model_class = model_class_for(files.hf_config, config_file_of(files.source),
                                  get_registries().models.as_dict())
    encoder = model_class.encoder_only
    runner = config.model.runner
    if runner == "auto":
        runner = "pooling" if encoder else "generate"
    if runner == "generate" and encoder:
        raise ConfigError(f"{model_class.__name__} is an encoder: it computes embeddings, not "
                          "text; run it with --runner pooling")
    config.model.runner = runner
    if runner == "generate":
        if config.pooler != PoolerConfig():
            raise ConfigError("pooler_config applies to the pooling runner only "
                              "(--runner pooling)")
        return encoder
    _pooling_without_async_scheduling(config)
    check_pooling_combinations(config)
    if not issubclass(resolve_qualname(platform.worker_cls), Worker):
        raise ConfigError(f"the {platform.name} platform's worker ({platform.worker_cls}) has "
                          "no pooling runner (--runner pooling): only the core's Worker and "
                          "its subclasses do")
    config.pooler = _pooler_config(config.pooler, files, encoder)
    if encoder or config.pooler.pooling_type != "LAST":
        _whole_prompts(config, max_model_len)
    return encoder


def _pooling_without_async_scheduling(config: EngineConfig) -> None:
    """The pooling runner samples nothing for async scheduling to overlap: on by default it
    is turned off here, where ``runner=auto`` settled on pooling; asked for, it is refused
    (the config refused it already with ``runner=pooling`` given)."""
    scheduler = config.scheduler
    if not scheduler.async_scheduling:
        return
    if not scheduler.async_scheduling_by_default:
        raise ConfigError("async scheduling (async_scheduling) does not run with the pooling "
                          "runner (this model's: an encoder, or runner=pooling) yet")
    scheduler.async_scheduling = False


def _pooler_config(given: PoolerConfig, files: ModelFiles, encoder: bool) -> PoolerConfig:
    """``given`` with every key it leaves out taken from the model."""
    folder = files.source if files.source.is_dir() else None
    model = (folder_pooler_config(folder) if folder is not None else None) or PoolerConfig(
        pooling_type="CLS" if encoder else "LAST", use_activation=True)
    pooler = PoolerConfig(
        pooling_type=given.pooling_type or model.pooling_type,
        use_activation=(given.use_activation if given.use_activation is not None
                        else model.use_activation),
        dimensions=given.dimensions)
    if pooler.dimensions is not None:
        try:
            check_dimensions(pooler.dimensions, files.hf_config)
        except ValueError as exc:
            raise ConfigError(f"pooler_config: {exc}") from None
    logger.info("pooling runner: %s pooling, %snormalised%s", pooler.pooling_type,
                "" if pooler.use_activation else "not ",
                f", {pooler.dimensions} dimensions" if pooler.dimensions else "")
    return pooler


def _whole_prompts(config: EngineConfig, max_model_len: int) -> None:
    """Schedule every prompt whole in one step, never from the prefix cache."""
    budget = config.scheduler.max_num_batched_tokens
    if budget < max_model_len:
        raise ConfigError(f"max_num_batched_tokens={budget} is below max_model_len="
                          f"{max_model_len}: this pooling model computes each prompt whole "
                          "in one step; raise --max-num-batched-tokens or lower "
                          "--max-model-len")
    config.scheduler.enable_chunked_prefill = False
    if config.cache.enable_prefix_caching:
        logger.info("prefix caching off: this pooling model reads every prompt whole")
    config.cache.enable_prefix_caching = False
