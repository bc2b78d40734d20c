"""``make_worker``: a platform's worker, with the parts the config names resolved in the
plugin registries of the process it runs in (the engine core's for ``uni``, its own for a
worker process: plugins load in every worker, so a plugin's model or attention backend
runs there too)."""

from __future__ import annotations

from octavo.config import EngineConfig
from octavo.models.loader import ModelFiles
from octavo.platforms import Platform
from octavo.plugins import get_registries
from octavo.plugins.resolve import attention_backend, kv_connector_cls, proposer_cls
from octavo.qualname import resolve_qualname
from octavo.worker.interface import WorkerClasses, WorkerInterface


def make_worker(config: EngineConfig, platform: type[Platform],
                files: ModelFiles) -> WorkerInterface:
    """Load the model onto this process's device as ``platform.worker_cls``."""
    registries = get_registries()
    classes = WorkerClasses(
        attn_backend=attention_backend(config, platform, registries),
        architectures=registries.models.as_dict(),
        proposer=proposer_cls(config, registries),
        kv_connector=kv_connector_cls(config, registries),
    )
    worker_cls: type[WorkerInterface] = resolve_qualname(platform.worker_cls)
    return worker_cls(config, platform, files, classes)
