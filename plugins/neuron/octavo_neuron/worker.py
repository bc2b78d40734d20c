"""``NeuronWorker``: the core's worker (in emulation, the CPU device and the portable model
runner with the NKI layers and attention backend), which says at start which buckets a
device would compile - the one place a platform sees the engine config."""

from __future__ import annotations

import logging

from octavo.plugin_api import EngineConfig, ModelFiles, Platform, Worker, WorkerClasses
from octavo_neuron.buckets import Buckets

logger = logging.getLogger("octavo.neuron")  # under the core's logger: shown on stderr


class NeuronWorker(Worker):
    def __init__(self, config: EngineConfig, platform: type[Platform], files: ModelFiles,
                 classes: WorkerClasses) -> None:
        super().__init__(config, platform, files, classes)
        logger.info(Buckets.from_config(config).describe())
