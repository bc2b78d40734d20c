"""``UniProcExecutor`` (``uni``): the one worker in the engine core's own process."""

from __future__ import annotations

from typing import Any

from octavo.config import EngineConfig
from octavo.executor.base import Executor
from octavo.executor.worker_factory import make_worker
from octavo.models.loader import ModelFiles
from octavo.outputs import ModelRunnerOutput, SchedulerOutput
from octavo.platforms import Platform


class UniProcExecutor(Executor):
    def __init__(self, config: EngineConfig, platform: type[Platform],
                 files: ModelFiles) -> None:
        super().__init__(config, platform, files)
        index, count = config.parallel.node_worker_index(0)
        if count > 1:  # data-parallel engines on this node: each keeps to its own cores
            platform.init_worker_process(index, count)
        self.worker = make_worker(config, platform, files)

    def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        return [getattr(self.worker, method)(*args)]

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.worker.execute_model(scheduler_output)

    def check_health(self) -> None:
        """The worker lives and dies with this process."""

    def shutdown(self) -> None:
        """Nothing runs beside this process."""
