"""``make_executor``: the executor ``--distributed-executor-backend`` names."""

from __future__ import annotations

from collections.abc import Callable

from octavo.config import ConfigError, EngineConfig
from octavo.executor.base import Executor
from octavo.executor.fits import check_model_features, check_model_fits, check_weights_fit
from octavo.models.loader import ModelFiles
from octavo.platforms import Platform


def make_executor(config: EngineConfig, platform: type[Platform], files: ModelFiles,
                  on_failure: Callable[[str], None] | None = None) -> Executor:
    """Start the workers; ``on_failure`` runs (on a monitor thread) when a worker process
    (or Ray actor) dies, with the reason."""
    check_model_fits(config, files.hf_config, files.source)
    check_model_features(config, files.hf_config, files.source)
    check_weights_fit(config, files, platform)
    backend = config.parallel.distributed_executor_backend
    if platform.single_controller:  # its one worker drives every rank's device
        if backend == "ray":
            raise ConfigError(f"the {platform.name!r} backend runs one worker process for "
                              "all its devices; distributed_executor_backend='ray' places "
                              "one per rank: leave it at its default")
        backend = "uni"
    if backend == "mp":
        from octavo.executor.multiproc import MultiprocExecutor

        return MultiprocExecutor(config, platform, files, on_failure)
    if backend == "ray":
        from octavo.executor.ray_executor import RayExecutor

        return RayExecutor(config, platform, files, on_failure)
    assert backend == "uni", f"executor backend {backend!r} is not built"
    from octavo.executor.uniproc import UniProcExecutor

    return UniProcExecutor(config, platform, files)
